import fc from 'fast-check';
import { describe, expect, it, vi } from 'vitest';
import { canonicalJson } from './canonical.js';
import { ContractError } from './errors.js';
import {
  appendJsonPath,
  checkJsonValue,
  decodeStrictJson,
  decodeStrictJsonByParser,
  type StrictJsonOptions,
} from './json.js';
import { COMMAND_MAX_DEPTH, JSON_MAX_DEPTH } from './limits.js';
import { isWellFormedText } from './text.js';

const MiB = 1024 * 1024;
const LIMIT: StrictJsonOptions = { maxBytes: MiB };
const MAX = 9007199254740991;

function bytes(...values: number[]): Uint8Array {
  return Uint8Array.from(values);
}

function utf8(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

function errorOf(run: () => unknown): ContractError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ContractError);
    return error as ContractError;
  }
  throw new Error('expected a ContractError, but nothing was thrown');
}

function decodeError(
  input: Uint8Array | string,
  options: StrictJsonOptions = LIMIT,
): ContractError {
  return errorOf(() => decodeStrictJson(input, options));
}

interface Malformed {
  /** What the case shows. */
  name: string;
  input: string | Uint8Array;
  reason: string;
  code?: 'invalid_input' | 'payload_too_large';
  path?: string;
  maxBytes?: number;
  maxDepth?: number;
}

const nested = (open: string, close: string, depth: number, inner = ''): string =>
  open.repeat(depth) + inner + close.repeat(depth);
const arrayPath = (depth: number): string => `$${'[0]'.repeat(depth)}`;

const MALFORMED: Malformed[] = [
  // Empty input.
  { name: 'empty string', input: '', reason: 'empty', path: '$' },
  { name: 'empty bytes', input: bytes(), reason: 'empty', path: '$' },
  { name: 'one space', input: ' ', reason: 'empty', path: '$' },
  { name: 'whitespace only', input: ' \t\n\r ', reason: 'empty', path: '$' },
  { name: 'whitespace-only bytes', input: bytes(0x0a, 0x0a), reason: 'empty' },

  // Byte order marks.
  { name: 'BOM before an object', input: '\ufeff{}', reason: 'bom', path: '$' },
  { name: 'BOM bytes before a number', input: bytes(0xef, 0xbb, 0xbf, 0x31), reason: 'bom' },
  { name: 'BOM alone', input: '\ufeff', reason: 'bom' },
  { name: 'BOM after whitespace', input: ' \ufeff1', reason: 'syntax' },

  // Invalid UTF-8.
  { name: 'byte 0xff', input: bytes(0xff), reason: 'invalid_utf8', path: '$' },
  { name: 'byte 0xfe', input: bytes(0xfe), reason: 'invalid_utf8' },
  { name: '0xff inside a string', input: bytes(0x22, 0xff, 0x22), reason: 'invalid_utf8' },
  { name: 'overlong slash c0 af', input: bytes(0x22, 0xc0, 0xaf, 0x22), reason: 'invalid_utf8' },
  { name: 'overlong c0 af alone', input: bytes(0xc0, 0xaf), reason: 'invalid_utf8' },
  {
    name: 'overlong three-byte e0 80 af',
    input: bytes(0x22, 0xe0, 0x80, 0xaf, 0x22),
    reason: 'invalid_utf8',
  },
  { name: 'lone continuation byte', input: bytes(0x22, 0x80, 0x22), reason: 'invalid_utf8' },
  {
    name: 'truncated two-of-three bytes',
    input: bytes(0x22, 0xe2, 0x82, 0x22),
    reason: 'invalid_utf8',
  },
  { name: 'truncated multi-byte at end', input: bytes(0x22, 0xe2, 0x82), reason: 'invalid_utf8' },
  {
    name: 'truncated four-byte sequence',
    input: bytes(0x22, 0xf0, 0x9f, 0x98, 0x22),
    reason: 'invalid_utf8',
  },
  {
    name: 'high surrogate encoded ed a0 80',
    input: bytes(0x22, 0xed, 0xa0, 0x80, 0x22),
    reason: 'invalid_utf8',
  },
  { name: 'bare ed a0 80', input: bytes(0xed, 0xa0, 0x80), reason: 'invalid_utf8' },
  {
    name: 'low surrogate encoded ed b0 80',
    input: bytes(0x22, 0xed, 0xb0, 0x80, 0x22),
    reason: 'invalid_utf8',
  },
  {
    name: 'code point above U+10FFFF',
    input: bytes(0x22, 0xf4, 0x90, 0x80, 0x80, 0x22),
    reason: 'invalid_utf8',
  },
  {
    name: 'invalid UTF-8 inside a key',
    input: bytes(0x7b, 0x22, 0xc3, 0x22, 0x3a, 0x31, 0x7d),
    reason: 'invalid_utf8',
  },

  // Byte limit, checked before anything else.
  {
    name: 'string one byte over the limit',
    input: '"abcd"',
    maxBytes: 5,
    code: 'payload_too_large',
    reason: 'too_large',
    path: '$',
  },
  {
    name: 'bytes one byte over the limit',
    input: utf8('"abcd"'),
    maxBytes: 5,
    code: 'payload_too_large',
    reason: 'too_large',
  },
  {
    name: 'string over the limit only in UTF-8 bytes',
    input: '"é"',
    maxBytes: 3,
    code: 'payload_too_large',
    reason: 'too_large',
  },
  {
    name: 'astral string over the limit',
    input: '"😀"',
    maxBytes: 5,
    code: 'payload_too_large',
    reason: 'too_large',
  },
  { name: 'limit zero', input: '1', maxBytes: 0, code: 'payload_too_large', reason: 'too_large' },
  {
    name: 'too large wins over invalid UTF-8',
    input: bytes(0xff, 0xff, 0xff),
    maxBytes: 2,
    code: 'payload_too_large',
    reason: 'too_large',
  },
  {
    name: 'too large wins over bad syntax',
    input: '{{{{',
    maxBytes: 3,
    code: 'payload_too_large',
    reason: 'too_large',
  },
  {
    name: 'NaN limit fails closed',
    input: '1',
    maxBytes: Number.NaN,
    code: 'payload_too_large',
    reason: 'too_large',
  },

  // Truncated documents (more truncation points are generated below).
  { name: 'lone {', input: '{', reason: 'syntax', path: '$' },
  { name: 'lone [', input: '[', reason: 'syntax', path: '$[0]' },
  { name: 'key without colon at end', input: '{"a"', reason: 'syntax', path: '$.a' },
  { name: 'colon without value', input: '{"a":', reason: 'syntax', path: '$.a' },
  { name: 'member without close', input: '{"a":1', reason: 'syntax', path: '$' },
  { name: 'comma at end of object', input: '{"a":1,', reason: 'syntax', path: '$' },
  { name: 'unclosed array', input: '[1', reason: 'syntax', path: '$' },
  { name: 'comma at end of array', input: '[1,', reason: 'syntax', path: '$[1]' },
  { name: 'unterminated string', input: '"abc', reason: 'syntax', path: '$' },
  { name: 'unterminated escape', input: '"abc\\', reason: 'syntax' },
  { name: 'truncated \\u escape', input: '"\\u12', reason: 'syntax' },
  { name: 'truncated true', input: 'tru', reason: 'syntax' },
  { name: 'truncated null', input: 'nul', reason: 'syntax' },
  { name: 'truncated false', input: '[fals', reason: 'syntax', path: '$[0]' },
  { name: 'minus alone', input: '-', reason: 'syntax' },
  { name: 'unterminated key', input: '{"ab', reason: 'syntax', path: '$' },
  { name: 'deep truncation', input: '{"a":[{"b":[1,2', reason: 'syntax', path: '$.a[0].b' },

  // Number grammar.
  { name: 'dot without fraction', input: '1.', reason: 'syntax' },
  { name: 'exponent without digits', input: '1e', reason: 'syntax' },
  { name: 'exponent sign without digits', input: '1e+', reason: 'syntax' },
  { name: 'leading dot', input: '.5', reason: 'syntax' },
  { name: 'leading plus', input: '+1', reason: 'syntax' },
  { name: 'leading zero', input: '01', reason: 'syntax', path: '$' },
  { name: 'negative leading zero', input: '-01', reason: 'syntax' },
  { name: 'double zero', input: '00', reason: 'syntax' },
  { name: 'leading zero in an array', input: '[01]', reason: 'syntax', path: '$[0]' },
  { name: 'leading zeros in an object', input: '{"n":007}', reason: 'syntax', path: '$.n' },
  { name: 'hexadecimal', input: '0x10', reason: 'syntax' },
  { name: 'dot before exponent', input: '1.e5', reason: 'syntax' },
  { name: 'minus before space', input: '- 1', reason: 'syntax' },
  { name: 'double minus', input: '--1', reason: 'syntax' },
  { name: 'minus NaN', input: '-NaN', reason: 'syntax' },

  // Structure.
  { name: 'trailing comma in array', input: '[1,]', reason: 'syntax', path: '$[1]' },
  { name: 'trailing comma in object', input: '{"a":1,}', reason: 'syntax', path: '$' },
  { name: 'nested trailing comma', input: '{"a":[1,2,]}', reason: 'syntax', path: '$.a[2]' },
  { name: 'leading comma', input: '[,1]', reason: 'syntax', path: '$[0]' },
  { name: 'double comma', input: '[1,,2]', reason: 'syntax', path: '$[1]' },
  { name: 'comma in empty object', input: '{,}', reason: 'syntax' },
  { name: 'line comment', input: '// c\n1', reason: 'syntax' },
  { name: 'block comment', input: '/* c */1', reason: 'syntax' },
  { name: 'trailing comment', input: '[1]//c', reason: 'syntax' },
  { name: 'comment in an object', input: '{"a":1/*x*/}', reason: 'syntax' },
  { name: 'single-quoted string', input: "'a'", reason: 'syntax' },
  { name: 'single-quoted key', input: "{'a':1}", reason: 'syntax' },
  { name: 'unquoted key', input: '{a:1}', reason: 'syntax' },
  { name: 'number key', input: '{1:2}', reason: 'syntax' },
  { name: 'missing colon', input: '{"a" 1}', reason: 'syntax', path: '$.a' },
  { name: 'double colon', input: '{"a"::1}', reason: 'syntax', path: '$.a' },
  { name: 'missing comma between members', input: '{"a":1 "b":2}', reason: 'syntax' },
  { name: 'missing comma between elements', input: '[1 2]', reason: 'syntax', path: '$' },
  { name: 'object closed by ]', input: '{"a":1]', reason: 'syntax' },
  { name: 'array closed by }', input: '[1}', reason: 'syntax' },
  { name: 'capitalised True', input: 'True', reason: 'syntax' },
  { name: 'capitalised NULL', input: 'NULL', reason: 'syntax' },
  { name: 'undefined literal', input: '[undefined]', reason: 'syntax', path: '$[0]' },
  { name: 'no-break space as whitespace', input: '\u00a01', reason: 'syntax' },
  { name: 'line separator as whitespace', input: '\u20281', reason: 'syntax' },
  { name: 'form feed as whitespace', input: '\f1', reason: 'syntax' },
  { name: 'vertical tab as whitespace', input: '\v1', reason: 'syntax' },

  // Trailing garbage.
  { name: 'text after a value', input: '[1] x', reason: 'syntax', path: '$' },
  { name: 'two objects', input: '{} {}', reason: 'syntax' },
  { name: 'two numbers', input: '1 2', reason: 'syntax' },
  { name: 'two literals', input: 'nullnull', reason: 'syntax' },
  { name: 'literal with suffix', input: 'truex', reason: 'syntax' },
  { name: 'two strings', input: '"a""b"', reason: 'syntax' },
  { name: 'extra ]', input: '[1]]', reason: 'syntax' },
  { name: 'extra }', input: '{}}', reason: 'syntax' },
  { name: 'NUL after a value', input: '1\u0000', reason: 'syntax' },

  // Strings.
  { name: 'raw tab in a string', input: '"a\tb"', reason: 'syntax', path: '$' },
  { name: 'raw NUL in a string', input: '"a\u0000b"', reason: 'syntax' },
  { name: 'raw newline in a string', input: '["\n"]', reason: 'syntax', path: '$[0]' },
  { name: 'raw U+001F in a string', input: '"\u001f"', reason: 'syntax' },
  { name: 'raw control character in a key', input: '{"a\nb":1}', reason: 'syntax', path: '$' },
  { name: 'invalid escape \\x', input: '"\\x41"', reason: 'syntax' },
  { name: 'uppercase \\U escape', input: '"\\U0041"', reason: 'syntax' },
  { name: 'non-hex digit in \\u', input: '"\\u00G1"', reason: 'syntax' },
  { name: 'bell escape', input: '"\\a"', reason: 'syntax' },
  { name: 'NUL escape', input: '"\\0"', reason: 'syntax' },
  { name: 'escaped single quote', input: '"\\\'"', reason: 'syntax' },
  { name: 'invalid escape in a key', input: '{"\\q":1}', reason: 'syntax', path: '$' },

  // NaN and Infinity.
  { name: 'NaN', input: 'NaN', reason: 'non_finite_number', path: '$' },
  { name: 'Infinity', input: 'Infinity', reason: 'non_finite_number' },
  { name: '-Infinity', input: '-Infinity', reason: 'non_finite_number' },
  { name: 'NaN in an array', input: '[1,NaN]', reason: 'non_finite_number', path: '$[1]' },
  { name: 'Infinity in an object', input: '{"a":Infinity}', reason: 'non_finite_number' },

  // Numbers beyond ±(2^53−1).
  { name: '2^53', input: '9007199254740992', reason: 'number_out_of_range', path: '$' },
  { name: '2^53+1', input: '9007199254740993', reason: 'number_out_of_range' },
  { name: '-2^53', input: '-9007199254740992', reason: 'number_out_of_range' },
  { name: '-2^53-1', input: '-9007199254740993', reason: 'number_out_of_range' },
  { name: '1e300', input: '1e300', reason: 'number_out_of_range' },
  { name: '1e400', input: '1e400', reason: 'number_out_of_range' },
  { name: '-1e400', input: '-1e400', reason: 'number_out_of_range' },
  { name: '1E16', input: '1E16', reason: 'number_out_of_range' },
  { name: '-(2^53)-0.5', input: '-9007199254740992.5', reason: 'number_out_of_range' },
  {
    name: 'bound + 0.4 rounds to the bound',
    input: '9007199254740991.4',
    reason: 'number_out_of_range',
  },
  {
    name: 'bound plus a tiny fraction',
    input: '-9007199254740991.000000000000001',
    reason: 'number_out_of_range',
  },
  { name: '2^53 in exponent form', input: '9.007199254740992e15', reason: 'number_out_of_range' },
  { name: 'twenty digits', input: '12345678901234567890', reason: 'number_out_of_range' },
  { name: 'largest double', input: '1.7976931348623157e308', reason: 'number_out_of_range' },
  {
    name: 'nested out-of-range number',
    input: '{"a":[1,{"b":1e16}]}',
    reason: 'number_out_of_range',
    path: '$.a[1].b',
  },

  // Duplicate keys, compared after unescaping.
  { name: 'duplicate key', input: '{"a":1,"a":2}', reason: 'duplicate_key', path: '$.a' },
  {
    name: 'escaped-equal duplicate',
    input: '{"a":1,"\\u0061":2}',
    reason: 'duplicate_key',
    path: '$.a',
  },
  {
    name: 'nested duplicate',
    input: '{"a":{"b":1,"b":2}}',
    reason: 'duplicate_key',
    path: '$.a.b',
  },
  {
    name: 'duplicate in an array of objects',
    input: '[{"x":1},{"y":1,"y":2}]',
    reason: 'duplicate_key',
    path: '$[1].y',
  },
  {
    name: 'deep duplicate',
    input: '{"list":[[{"k":1,"k":1}]]}',
    reason: 'duplicate_key',
    path: '$.list[0][0].k',
  },
  {
    name: 'escaped é equals raw é',
    input: '{"\\u00e9":1,"é":2}',
    reason: 'duplicate_key',
    path: '$["é"]',
  },
  { name: 'duplicate empty key', input: '{"":1,"":2}', reason: 'duplicate_key', path: '$[""]' },
  {
    name: 'duplicate odd keys',
    input: '{"odd key":{"x y":1,"x y":2}}',
    reason: 'duplicate_key',
    path: '$["odd key"]["x y"]',
  },
  { name: 'non-adjacent duplicate', input: '{"a":1,"b":2,"a":3}', reason: 'duplicate_key' },
  {
    name: 'escaped pair equals raw emoji',
    input: '{"\\ud83d\\ude00":1,"😀":2}',
    reason: 'duplicate_key',
  },
  { name: 'escaped slash equals raw slash', input: '{"a\\/b":1,"a/b":2}', reason: 'duplicate_key' },
  {
    name: 'duplicate with an escaped control character',
    input: '{"\\n":1,"\\u000a":2}',
    reason: 'duplicate_key',
    path: '$["\\n"]',
  },
  {
    name: 'duplicate of a builtin name',
    input: '{"toString":1,"toString":2}',
    reason: 'duplicate_key',
  },

  // Keys that reach prototypes.
  { name: '__proto__', input: '{"__proto__":{}}', reason: 'forbidden_key', path: '$.__proto__' },
  {
    name: 'constructor',
    input: '{"constructor":1}',
    reason: 'forbidden_key',
    path: '$.constructor',
  },
  { name: 'prototype', input: '{"prototype":1}', reason: 'forbidden_key', path: '$.prototype' },
  {
    name: 'nested __proto__',
    input: '{"a":{"__proto__":{"x":1}}}',
    reason: 'forbidden_key',
    path: '$.a.__proto__',
  },
  {
    name: 'constructor inside an array',
    input: '[{"constructor":{"prototype":1}}]',
    reason: 'forbidden_key',
    path: '$[0].constructor',
  },
  {
    name: 'escaped __proto__',
    input: '{"\\u005f_proto__":1}',
    reason: 'forbidden_key',
    path: '$.__proto__',
  },
  {
    name: 'prototype deep in arrays',
    input: '{"x":[[{"prototype":null}]]}',
    reason: 'forbidden_key',
    path: '$.x[0][0].prototype',
  },

  // Lone surrogates, after unescaping.
  { name: 'lone high surrogate', input: '"\\ud800"', reason: 'lone_surrogate', path: '$' },
  { name: 'lone low surrogate', input: '"\\udc00"', reason: 'lone_surrogate' },
  { name: 'low surrogate then text', input: '"\\udc00x"', reason: 'lone_surrogate' },
  { name: 'reversed pair', input: '"\\ude00\\ud83d"', reason: 'lone_surrogate' },
  { name: 'high surrogate then text', input: '"\\ud83d x"', reason: 'lone_surrogate' },
  { name: 'high surrogate then BMP escape', input: '"\\ud83d\\u0041"', reason: 'lone_surrogate' },
  { name: 'two high surrogates', input: '"\\ud83d\\ud83d"', reason: 'lone_surrogate' },
  { name: 'uppercase hex surrogate', input: '"\\uD800"', reason: 'lone_surrogate' },
  {
    name: 'lone surrogate in an array',
    input: '["ok","\\ud800"]',
    reason: 'lone_surrogate',
    path: '$[1]',
  },
  {
    name: 'lone surrogate in a key',
    input: '{"a":{"\\udfff":1}}',
    reason: 'lone_surrogate',
    path: '$.a["\\udfff"]',
  },
  { name: 'raw lone surrogate in string input', input: '"\ud800"', reason: 'lone_surrogate' },
  { name: 'raw reversed pair in string input', input: '"\ude00\ud83d"', reason: 'lone_surrogate' },

  // Depth.
  {
    name: '65 nested arrays',
    input: nested('[', ']', 65),
    reason: 'depth_exceeded',
    path: arrayPath(64),
  },
  {
    name: '65 nested objects',
    input: nested('{"a":', '}', 65, '1'),
    reason: 'depth_exceeded',
    path: `$${'.a'.repeat(64)}`,
  },
  {
    name: '10 000 unclosed arrays',
    input: '['.repeat(10_000),
    reason: 'depth_exceeded',
    path: arrayPath(64),
  },
  { name: '10 000 nested arrays', input: nested('[', ']', 10_000), reason: 'depth_exceeded' },
  {
    name: '10 000 nested objects',
    input: nested('{"k":', '}', 10_000, 'null'),
    reason: 'depth_exceeded',
    path: `$${'.k'.repeat(64)}`,
  },
  {
    name: 'mixed nesting past the limit',
    input: nested('[{"a":', '}]', 33, '0'),
    reason: 'depth_exceeded',
    path: `$${'[0].a'.repeat(32)}`,
  },
  {
    name: 'custom depth 2',
    input: '[[[1]]]',
    maxDepth: 2,
    reason: 'depth_exceeded',
    path: '$[0][0]',
  },
  { name: 'depth 0 refuses any container', input: '[]', maxDepth: 0, reason: 'depth_exceeded' },
  {
    name: 'command depth + 1',
    input: nested('[', ']', COMMAND_MAX_DEPTH + 1),
    maxDepth: COMMAND_MAX_DEPTH,
    reason: 'depth_exceeded',
  },
];

// Every proper prefix of a document that uses each kind of token is truncated.
const TRUNCATED_SOURCE =
  '{"id":"t-1","n":-12.5e3,"ok":true,"no":false,"none":null,"esc":"a\\"\\u00e9\\n","list":[1,{"k":[]}],"o":{}}';
const TRUNCATED: Malformed[] = Array.from({ length: TRUNCATED_SOURCE.length - 1 }, (_, n) => ({
  name: `truncated after ${n + 1} characters`,
  input: TRUNCATED_SOURCE.slice(0, n + 1),
  reason: 'syntax',
}));

describe('decodeStrictJson: malformed corpus', () => {
  it('has at least 110 hand-written cases besides the truncations', () => {
    expect(MALFORMED.length).toBeGreaterThanOrEqual(110);
    expect(JSON.parse(TRUNCATED_SOURCE)).toBeTypeOf('object');
  });

  it.each([...MALFORMED, ...TRUNCATED])('rejects $name', (entry) => {
    const options: StrictJsonOptions = { maxBytes: entry.maxBytes ?? MiB };
    if (entry.maxDepth !== undefined) options.maxDepth = entry.maxDepth;
    const error = decodeError(entry.input, options);
    expect({ code: error.code, reason: error.reason }).toEqual({
      code: entry.code ?? 'invalid_input',
      reason: entry.reason,
    });
    expect(error.path).toBeTypeOf('string');
    expect(error.path?.startsWith('$')).toBe(true);
    if (entry.path !== undefined) {
      expect(error.path).toBe(entry.path);
      expect(error.message).toContain(entry.path);
    }
    // Messages go to logs: no raw control characters, bounded size.
    // biome-ignore lint/suspicious/noControlCharactersInRegex: asserting their absence
    expect(error.message).not.toMatch(/[\u0000-\u001f\u2028\u2029]/);
    if (entry.maxDepth === undefined) expect(error.message.length).toBeLessThan(400);
  });

  it('rejects the same cases given as bytes and as an ArrayBuffer', () => {
    for (const entry of MALFORMED) {
      if (typeof entry.input !== 'string' || !isWellFormedText(entry.input)) continue;
      const options = { maxBytes: entry.maxBytes ?? MiB, maxDepth: entry.maxDepth };
      const encoded = utf8(entry.input);
      const fromBytes = decodeError(encoded, options);
      expect([entry.name, fromBytes.reason]).toEqual([entry.name, entry.reason]);
      const fromBuffer = errorOf(() => decodeStrictJson(encoded.slice().buffer, options));
      expect([entry.name, fromBuffer.reason]).toEqual([entry.name, entry.reason]);
    }
  });
});

describe('decodeStrictJson: valid input', () => {
  const VALID = [
    '0',
    '-0',
    '1',
    '-1',
    '0.5',
    '-0.0',
    '1E2',
    '1e+2',
    '1.5e-3',
    '12.75E-1',
    '123456789012345',
    '1234567890123456',
    '9007199254740991',
    '-9007199254740991',
    '9007199254740991.0',
    '9007199254740990.9',
    '9.007199254740991e15',
    '90071992547409910e-1',
    '1e-400',
    '-1e-400',
    '4.9e-324',
    'true',
    'false',
    'null',
    '""',
    '"plain"',
    '"\\"\\\\\\/\\b\\f\\n\\r\\t"',
    '"\\u0000\\u001f\\u007f\\u0041\\u00e9\\u20ac"',
    '"\\ud83d\\ude00"',
    '"\\uD83D\\uDE00 upper-case pair"',
    '"😀 é € \u2028 \u2029 \u007f \u0080"',
    '"\ud83d\ude00 raw pair"',
    '[]',
    '{}',
    ' \t\n\r[ \t\n\r1 \t\n\r, \t\n\r{ "a" : [ ] } \t\n\r] \t\n\r',
    '[1,"two",true,false,null,{"k":[{}]},[[]]]',
    '{"toString":1,"hasOwnProperty":2,"valueOf":{},"__proto":3,"constructor_":4,"__proto__x":5}',
    '{"1":"one","0":"zero","01":"zero-one","b":"bee","":"empty"}',
    '{"é":1,"e\\u0301":2,"😀":3}',
    '{"a":{"b":1},"c":{"b":2}}',
    '[{"k":1},{"k":2},{"k":3}]',
    `[${'"x",'.repeat(1000)}"y"]`,
    nested('[', ']', 64),
    nested('{"a":', '}', 63, '{}'),
    nested('{"a":', '}', 64, '1'),
  ];

  const named = VALID.map((text) => [text.length > 60 ? `${text.slice(0, 60)}…` : text, text]);
  it.each(named)('decodes %s as JSON.parse does', (_, text) => {
    const value = decodeStrictJson(text, LIMIT);
    expect(value).toStrictEqual(JSON.parse(text));
    expect(decodeStrictJson(utf8(text), LIMIT)).toStrictEqual(JSON.parse(text));
  });

  it('keeps -0 as JSON.parse does', () => {
    expect(Object.is(decodeStrictJson('-0', LIMIT), -0)).toBe(true);
    expect(Object.is((decodeStrictJson('[-0.0]', LIMIT) as number[])[0], -0)).toBe(true);
  });

  it('returns ordinary objects and arrays', () => {
    const value = decodeStrictJson('{"a":[{"b":{}}]}', LIMIT) as { a: [{ b: object }] };
    expect(Object.getPrototypeOf(value)).toBe(Object.prototype);
    expect(Object.getPrototypeOf(value.a)).toBe(Array.prototype);
    expect(Object.getPrototypeOf(value.a[0].b)).toBe(Object.prototype);
  });

  it('accepts depth exactly 64 and rejects 65, for arrays and objects', () => {
    expect(() => decodeStrictJson(nested('[', ']', JSON_MAX_DEPTH), LIMIT)).not.toThrow();
    expect(decodeError(nested('[', ']', JSON_MAX_DEPTH + 1)).reason).toBe('depth_exceeded');
    const objects = (depth: number) => nested('{"a":', '}', depth - 1, '{}');
    expect(() => decodeStrictJson(objects(JSON_MAX_DEPTH), LIMIT)).not.toThrow();
    const error = decodeError(objects(JSON_MAX_DEPTH + 1));
    expect([error.reason, error.path]).toEqual(['depth_exceeded', `$${'.a'.repeat(64)}`]);
  });

  it('honours a custom depth', () => {
    const deep = nested('[', ']', COMMAND_MAX_DEPTH);
    expect(() =>
      decodeStrictJson(deep, { maxBytes: MiB, maxDepth: COMMAND_MAX_DEPTH }),
    ).not.toThrow();
    expect(() => decodeStrictJson('1', { maxBytes: 1, maxDepth: 0 })).not.toThrow();
  });

  it('accepts a body of exactly maxBytes and rejects one byte more', () => {
    const text = '"é€😀"';
    const size = utf8(text).byteLength;
    expect(size).toBe(11);
    for (const input of [text, utf8(text), utf8(text).slice().buffer]) {
      expect(decodeStrictJson(input, { maxBytes: size })).toBe('é€😀');
      const error = errorOf(() => decodeStrictJson(input, { maxBytes: size - 1 }));
      expect([error.code, error.reason, error.path]).toEqual([
        'payload_too_large',
        'too_large',
        '$',
      ]);
      expect(error.status).toBe(413);
    }
  });

  it('reads a view at an offset, not its whole buffer', () => {
    const buffer = Buffer.from('xx[1,2]yy');
    expect(decodeStrictJson(buffer.subarray(2, 7), { maxBytes: 5 })).toEqual([1, 2]);
    const view = new DataView(buffer.buffer, buffer.byteOffset + 2, 5);
    expect(decodeStrictJson(view as unknown as Uint8Array, { maxBytes: 5 })).toEqual([1, 2]);
  });

  it('rejects 10 MiB of [ under a 16 MiB limit with depth_exceeded', () => {
    const text = '['.repeat(10 * MiB);
    expect(decodeError(text, { maxBytes: 16 * MiB }).reason).toBe('depth_exceeded');
    expect(decodeError(utf8(text), { maxBytes: 16 * MiB }).reason).toBe('depth_exceeded');
  });

  it('throws only ContractError for input of the wrong type or missing options', () => {
    for (const input of [42, null, undefined, {}, [1]]) {
      expect(errorOf(() => decodeStrictJson(input as unknown as string, LIMIT)).code).toBe(
        'invalid_input',
      );
    }
    const error = errorOf(() => decodeStrictJson('1', undefined as unknown as StrictJsonOptions));
    expect([error.code, error.reason]).toEqual(['invalid_input', 'syntax']);
  });
});

describe('decodeStrictJson: paths in messages', () => {
  it('cuts long keys to 64 characters and escapes control characters', () => {
    const long = 'k'.repeat(1000);
    const error = decodeError(`{"${long}":{"x":1,"x":2}}`);
    expect(error.path).toBe(`$["${'k'.repeat(64)}…"].x`);
    expect(error.message.length).toBeLessThan(120);

    const control = decodeError('{"\\u0000\\u001b[31m\\u202e":{"a":1,"a":1}}');
    expect(control.path).toBe('$["\\u0000\\u001b[31m\\u202e"].a');
  });

  it('never splits a surrogate pair when cutting a key', () => {
    const key = `${'k'.repeat(63)}😀tail`;
    const error = decodeError(`{${JSON.stringify(key)}:{"a":1,"a":1}}`);
    expect(error.path).toBe(`$["${'k'.repeat(63)}…"].a`);
  });

  it('writes identifier keys with dots and others in brackets', () => {
    expect(appendJsonPath('$', 'input')).toBe('$.input');
    expect(appendJsonPath('$.input', 3)).toBe('$.input[3]');
    expect(appendJsonPath('$', 'odd key')).toBe('$["odd key"]');
    expect(appendJsonPath('$', '1a')).toBe('$["1a"]');
    expect(appendJsonPath('$', 'say "hi"\\')).toBe('$["say \\"hi\\"\\\\"]');
    expect(appendJsonPath('$', '\ud800')).toBe('$["\\ud800"]');
    expect(appendJsonPath('$', '\udc00\ud800x')).toBe('$["\\udc00\\ud800x"]');
    expect(appendJsonPath('$', 'a😀 é')).toBe('$["a😀 é"]');
    expect(appendJsonPath('$', '\u2028\u200f\u0085\u007f')).toBe(
      '$["\\u2028\\u200f\\u0085\\u007f"]',
    );
  });
});

// ---- Properties -------------------------------------------------------------------

const FORBIDDEN = new Set(['__proto__', 'constructor', 'prototype']);

/** A JSON value the strict rules accept: safe numbers, no forbidden keys, ordinary objects. */
function sanitize(value: unknown): unknown {
  if (typeof value === 'number') return Math.abs(value) <= MAX ? value : value % MAX;
  if (Array.isArray(value)) return value.map(sanitize);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [key, inner] of Object.entries(value)) {
      if (!FORBIDDEN.has(key)) out[key] = sanitize(inner);
    }
    return out;
  }
  return value;
}

/** Same value, every object's keys in reverse order. */
function reverseKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reverseKeys);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).reverse()) {
      out[key] = reverseKeys((value as Record<string, unknown>)[key]);
    }
    return out;
  }
  return value;
}

/** JSON values with ASCII, any code point, or grapheme strings, made acceptable to the strict rules. */
const strictJsonValue = fc
  .oneof(
    fc.jsonValue({ maxDepth: 6 }),
    fc.jsonValue({ maxDepth: 6, stringUnit: 'binary' }),
    fc.jsonValue({ maxDepth: 6, stringUnit: 'grapheme' }),
  )
  .map(sanitize);

const JSONISH_TOKENS = [
  '{',
  '}',
  '[',
  ']',
  ',',
  ':',
  '"',
  '\\',
  'u',
  'd8',
  '00',
  'dc',
  '1',
  '0',
  '-',
  '.',
  'e',
  '+',
  ' ',
  '\n',
  'true',
  'null',
  'fals',
  'N',
  '"a"',
  '"__proto__"',
  '9007199254740992',
  '\ud800',
  '\u0001',
];

/** JSON texts of `values` with one of `tokens` spliced in over up to 3 characters. */
function spliced(values: fc.Arbitrary<unknown>, tokens: readonly string[]): fc.Arbitrary<string> {
  return values.chain((value) => {
    const text = JSON.stringify(value);
    return fc
      .tuple(fc.nat(text.length), fc.nat(3), fc.constantFrom(...tokens))
      .map(([at, cut, insert]) => text.slice(0, at) + insert + text.slice(at + cut));
  });
}

describe('decodeStrictJson: properties', () => {
  const onlyContractErrors = (input: Uint8Array | string) => {
    try {
      decodeStrictJson(input, { maxBytes: 4096, maxDepth: 8 });
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
    }
  };

  it('throws nothing but ContractError on arbitrary bytes', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 300 }), onlyContractErrors), {
      numRuns: 2000,
    });
  });

  it('throws nothing but ContractError on arbitrary strings', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string(),
          fc.string({ unit: 'binary' }),
          fc.string({ unit: fc.constantFrom(...JSONISH_TOKENS) }),
        ),
        onlyContractErrors,
      ),
      { numRuns: 2000 },
    );
  });

  it('accepts a subset of JSON.parse and agrees with it on what it accepts', () => {
    const allowedExtraRejections = new Set([
      'duplicate_key',
      'forbidden_key',
      'number_out_of_range',
      'lone_surrogate',
      'depth_exceeded',
      'too_large',
    ]);
    const mutated = spliced(strictJsonValue, JSONISH_TOKENS);
    fc.assert(
      fc.property(
        fc.oneof(mutated, fc.string({ unit: fc.constantFrom(...JSONISH_TOKENS) })),
        (text) => {
          let expected: unknown;
          let parsed = true;
          try {
            expected = JSON.parse(text);
          } catch {
            parsed = false;
          }
          let value: unknown;
          let rejection: unknown;
          try {
            value = decodeStrictJson(text, { maxBytes: 1 << 20, maxDepth: 8 });
          } catch (error) {
            rejection = error;
          }
          if (rejection === undefined) {
            expect(parsed).toBe(true);
            expect(value).toStrictEqual(expected);
          } else {
            expect(rejection).toBeInstanceOf(ContractError);
            if (parsed)
              expect(allowedExtraRejections).toContain((rejection as ContractError).reason);
          }
        },
      ),
      { numRuns: 3000 },
    );
  });

  it('decodes JSON.stringify output as JSON.parse does', () => {
    fc.assert(
      fc.property(strictJsonValue, (value) => {
        const text = JSON.stringify(value);
        expect(decodeStrictJson(text, LIMIT)).toStrictEqual(JSON.parse(text));
        expect(decodeStrictJson(utf8(text), LIMIT)).toStrictEqual(JSON.parse(text));
      }),
      { numRuns: 500 },
    );
  });

  it('round-trips canonical JSON, which is idempotent and key-order independent', () => {
    fc.assert(
      fc.property(strictJsonValue, (value) => {
        const canonical = canonicalJson(value);
        const decoded = decodeStrictJson(canonical, LIMIT);
        expect(decoded).toStrictEqual(JSON.parse(JSON.stringify(value)));
        expect(canonicalJson(decoded)).toBe(canonical);
        expect(canonicalJson(reverseKeys(value))).toBe(canonical);
      }),
      { numRuns: 500 },
    );
  });
});

describe('decodeStrictJson: the JSON.parse fast path', () => {
  /** What a decode answered: its value, or its error's code, reason, path and message. */
  function outcome(decode: () => unknown): unknown {
    try {
      return { value: decode() };
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
      return { code: error.code, reason: error.reason, path: error.path, message: error.message };
    }
  }
  function agrees(input: string | Uint8Array, options: StrictJsonOptions) {
    expect(outcome(() => decodeStrictJson(input, options))).toStrictEqual(
      outcome(() => decodeStrictJsonByParser(input, options)),
    );
  }

  it('answers every text exactly as the strict parser alone does', () => {
    // Valid values with wide numbers, and texts with rule-breaking tokens spliced in.
    const wideNumbers = fc.oneof(
      fc.integer({ min: -(2 ** 53) + 1, max: 2 ** 53 - 1 }),
      fc.double({ noNaN: true, noDefaultInfinity: true }),
      fc.constantFrom(9007199254740991, -9007199254740991, 1e21, 1.5e-7, 0.1, -0),
    );
    const values = fc.oneof(
      strictJsonValue,
      fc.dictionary(fc.string({ maxLength: 3 }), wideNumbers),
      fc.array(wideNumbers),
    );
    const tokens = [...JSONISH_TOKENS, '"\\u005f_proto__"', '"\\ud83d\\ude00"', '1e5', '1E-2'];
    const mutated = spliced(values, tokens);
    fc.assert(
      fc.property(
        fc.oneof(
          values.map((value) => JSON.stringify(value)),
          mutated,
          fc.string({ unit: fc.constantFrom(...tokens) }),
        ),
        fc.integer({ min: 1, max: 8 }),
        (text, maxDepth) => {
          agrees(text, { maxBytes: 1 << 20, maxDepth });
          if (isWellFormedText(text)) agrees(utf8(text), { maxBytes: 1 << 20, maxDepth });
        },
      ),
      { numRuns: 3000 },
    );
  });

  it.each([
    ['a duplicate key deep inside', '{"a":[{"b":{"c":1,"c":2}}]}'],
    ['a duplicate key that differs only by an escape', '{"ab":1,"a\\u0062":2}'],
    ['an escaped __proto__ key', '{"\\u005f_proto__":{}}'],
    ['a constructor key', '[{"constructor":1}]'],
    ['a prototype key among others', '{"x":1,"prototype":2}'],
    ['an escaped lone surrogate', '["\\ud800"]'],
    ['a surrogate pair as escapes', '"\\ud83d\\ude00"'],
    ['2^53 as an integer literal', '[9007199254740992]'],
    ['2^53 − 1, the largest safe integer', '[9007199254740991]'],
    ['a sixteen-digit integer in range', '[1234567890123456]'],
    ['an exponent', '{"n":1e300}'],
    ['a small exponent', '{"n":2E2}'],
    ['fifteen digits with a fraction', '[12345678.9012345]'],
    ['a colon and brackets inside strings', '{"a:[{":"}]:\\"","b":[]}'],
    ['an escaped quote before the closing one', '{"a\\"":"\\\\"}'],
    ['a byte order mark', '\ufeff{}'],
    ['trailing garbage', '{"a":1}x'],
    ['an unterminated string', '{"a":"b'],
    ['NaN', '[NaN]'],
  ])('agrees on %s', (_, text) => {
    agrees(text, { maxBytes: 1024 });
    agrees(utf8(text), { maxBytes: 1024 });
  });

  it('agrees at the depth limit and one past it', () => {
    for (const depth of [1, 7, 8, 9, 64, 65]) {
      const text = '['.repeat(depth) + ']'.repeat(depth);
      agrees(text, { maxBytes: 1024, maxDepth: 8 });
      agrees(text, { maxBytes: 1024 });
    }
  });

  it('returns JSON.parse’s own value for a plain text, and the parser’s otherwise', () => {
    const parse = vi.spyOn(JSON, 'parse');
    try {
      const plain = decodeStrictJson('{"a":[1,"x\\n",{"b":null}],"c":true}', LIMIT);
      expect(parse).toHaveBeenCalledTimes(1);
      expect(plain).toBe(parse.mock.results[0]?.value);
      parse.mockClear();
      // An exponent is left to the strict parser before JSON.parse is asked.
      expect(decodeStrictJson('{"n":1e3}', LIMIT)).toStrictEqual({ n: 1000 });
      expect(parse).not.toHaveBeenCalled();
    } finally {
      parse.mockRestore();
    }
  });

  it('reads a string of many escapes once, not once per escape', () => {
    // Counted, not timed: the characters String.prototype.indexOf steps over during a decode.
    // Searching for the closing quote again from every escape read 1 MiB of `\n` ~260 000
    // times over (seconds of a blocked event loop for one settle or submit body).
    const text = JSON.stringify({ data: '\n'.repeat(100_000), more: 'a\\"b\tc' });
    const indexOf = String.prototype.indexOf;
    let scanned = 0;
    const spy = vi.spyOn(String.prototype, 'indexOf').mockImplementation(function (
      this: string,
      search: string,
      from?: number,
    ) {
      const at = indexOf.call(this, search, from);
      if (this === text) scanned += (at < 0 ? this.length : at) - (from ?? 0);
      return at;
    });
    let value: unknown;
    try {
      value = decodeStrictJson(text, { maxBytes: 1 << 20 });
    } finally {
      spy.mockRestore();
    }
    expect(value).toEqual(JSON.parse(text));
    expect(scanned).toBeGreaterThan(0);
    expect(scanned).toBeLessThanOrEqual(2 * text.length);
  });

  it('keeps rejecting what the fast path leaves to the strict parser', () => {
    expect(() => decodeStrictJson('{"a":1,"a":2}', { maxBytes: 64 })).toThrow(
      expect.objectContaining({ reason: 'duplicate_key', path: '$.a' }),
    );
    expect(() => decodeStrictJson('{"\\u005f_proto__":1}', { maxBytes: 64 })).toThrow(
      expect.objectContaining({ reason: 'forbidden_key' }),
    );
    expect(() => decodeStrictJson('[9007199254740992]', { maxBytes: 64 })).toThrow(
      expect.objectContaining({ reason: 'number_out_of_range', path: '$[0]' }),
    );
  });
});

// ---- checkJsonValue ----------------------------------------------------------------

function checkError(value: unknown, maxBytes = MiB, path?: string): ContractError {
  return errorOf(() => checkJsonValue(value, { maxBytes, path }));
}

describe('checkJsonValue', () => {
  it('counts the compact JSON.stringify bytes of generated values', () => {
    fc.assert(
      fc.property(strictJsonValue, (value) => {
        expect(checkJsonValue(value, { maxBytes: MiB })).toBe(
          Buffer.byteLength(JSON.stringify(value)),
        );
      }),
      { numRuns: 500 },
    );
  });

  it('counts escapes, multi-byte characters and numbers as JSON.stringify writes them', () => {
    const values: unknown[] = [
      null,
      true,
      false,
      0,
      -0,
      -1,
      MAX,
      -MAX,
      0.1,
      -1.5e-7,
      1e21 / 1e10,
      5e-324,
      '',
      '"\\/\b\f\n\r\t\u0000\u0001\u001f\u007f\u0080\u07ff\u0800\uffff😀\u2028',
      [],
      {},
      [null, [{}], { a: [] }],
      { 'odd "key"\n': 'é', '😀': [1, 2, 3] },
      { skipped: undefined, kept: 1, alsoSkipped: undefined },
      { onlyUndefined: undefined },
      Object.assign(Object.create(null), { a: 1 }),
    ];
    for (const value of values) {
      expect(checkJsonValue(value, { maxBytes: MiB })).toBe(
        Buffer.byteLength(JSON.stringify(value)),
      );
    }
  });

  it('refuses a toJSON method however it is reached (JSON.stringify would write what it returns), and takes a toJSON key holding data', () => {
    const made = () => ({ replaced: true });
    const hidden = Object.defineProperty({ a: 1 }, 'toJSON', { value: made });
    const inherited = Object.assign(
      Object.create(Object.create(null, { toJSON: { value: made } })),
      { a: 1 },
    );
    const inArray = Object.defineProperty([1], 'toJSON', { value: made });
    const reasons = [hidden, inherited, inArray, { nested: hidden }].map(
      (value) => errorOf(() => checkJsonValue(value, { maxBytes: MiB })).reason,
    );
    expect(reasons).toEqual(['not_json', 'not_json', 'not_json', 'not_json']);
    const data = { toJSON: 'x', n: [{ toJSON: null }] };
    expect(checkJsonValue(data, { maxBytes: MiB })).toBe(Buffer.byteLength(JSON.stringify(data)));
  });

  it('accepts shared (acyclic) references', () => {
    const shared = { a: [1] };
    expect(checkJsonValue([shared, { b: shared }], { maxBytes: MiB })).toBe(
      Buffer.byteLength(JSON.stringify([shared, { b: shared }])),
    );
  });

  it('accepts exactly maxBytes and rejects one byte more', () => {
    const value = { é: ['😀', 1.5, null] };
    const size = Buffer.byteLength(JSON.stringify(value));
    expect(checkJsonValue(value, { maxBytes: size })).toBe(size);
    const error = checkError(value, size - 1, '$.input.data');
    expect([error.code, error.reason, error.path]).toEqual([
      'payload_too_large',
      'too_large',
      '$.input.data',
    ]);
  });

  class Point {
    x = 1;
  }
  const cyclicObject: Record<string, unknown> = { a: 1 };
  cyclicObject.self = cyclicObject;
  const cyclicArray: unknown[] = [1];
  cyclicArray.push([cyclicArray]);
  const throwing = {
    get boom(): never {
      throw new RangeError('no');
    },
  };
  const deep = (depth: number): unknown => {
    let value: unknown = 1;
    for (let i = 0; i < depth; i++) value = [value];
    return value;
  };

  const REJECTED: [string, unknown, string, string][] = [
    ['undefined', undefined, 'not_json', '$'],
    ['undefined in an array', [1, undefined], 'not_json', '$[1]'],
    // biome-ignore lint/suspicious/noSparseArray: the hole is the point
    ['a hole in an array', [1, , 2], 'not_json', '$[1]'],
    ['a function', () => 1, 'not_json', '$'],
    ['a function property', { f() {} }, 'not_json', '$.f'],
    ['a bigint', { n: 1n }, 'not_json', '$.n'],
    ['a symbol', [Symbol('s')], 'not_json', '$[0]'],
    ['NaN', [Number.NaN], 'non_finite_number', '$[0]'],
    ['Infinity', { a: Number.POSITIVE_INFINITY }, 'non_finite_number', '$.a'],
    ['-Infinity', Number.NEGATIVE_INFINITY, 'non_finite_number', '$'],
    ['2^53', 2 ** 53, 'number_out_of_range', '$'],
    ['-(2^53)', { a: [-(2 ** 53)] }, 'number_out_of_range', '$.a[0]'],
    ['1e300', 1e300, 'number_out_of_range', '$'],
    ['a cyclic object', cyclicObject, 'cycle', '$.self'],
    ['a cyclic array', cyclicArray, 'cycle', '$[1][0]'],
    ['a Date', { at: new Date() }, 'not_json', '$.at'],
    ['a Map', new Map(), 'not_json', '$'],
    ['a Set', [new Set()], 'not_json', '$[0]'],
    ['a class instance', { p: new Point() }, 'not_json', '$.p'],
    ['a Uint8Array', new Uint8Array(2), 'not_json', '$'],
    ['a boxed number', [Object(1)], 'not_json', '$[0]'],
    ['an object inheriting from another', Object.create({ x: 1 }), 'not_json', '$'],
    ['an array subclass', new (class extends Array {})(), 'not_json', '$'],
    ['an own __proto__ key', JSON.parse('{"a":{"__proto__":1}}'), 'forbidden_key', '$.a.__proto__'],
    ['a constructor key', { constructor: 1 }, 'forbidden_key', '$.constructor'],
    ['a prototype key', [{ prototype: {} }], 'forbidden_key', '$[0].prototype'],
    ['a lone surrogate', ['ok', '\ud800'], 'lone_surrogate', '$[1]'],
    ['a reversed pair', 'a\ude00\ud83d', 'lone_surrogate', '$'],
    ['a lone surrogate in a key', { '\udc00': 1 }, 'lone_surrogate', '$["\\udc00"]'],
    ['depth 65', deep(65), 'depth_exceeded', arrayPath(64)],
    ['a throwing getter', throwing, 'not_json', '$'],
  ];

  it.each(REJECTED)('rejects %s', (_, value, reason, path) => {
    const error = checkError(value);
    expect([error.code, error.reason, error.path]).toEqual(['invalid_input', reason, path]);
    expect(error.message).toContain(path);
  });

  it('accepts depth 64 and honours a custom depth', () => {
    expect(checkJsonValue(deep(64), { maxBytes: MiB })).toBe(129);
    expect(checkError(deep(65)).reason).toBe('depth_exceeded');
    expect(() => checkJsonValue(deep(3), { maxBytes: MiB, maxDepth: 2 })).toThrow(ContractError);
    expect(checkJsonValue(deep(100_000 - 1), { maxBytes: MiB, maxDepth: 100_000 })).toBe(
      2 * (100_000 - 1) + 1,
    );
  });

  it('prefixes reported paths with the given path', () => {
    const error = checkError({ items: [{ at: new Date() }] }, MiB, '$.input.data');
    expect(error.path).toBe('$.input.data.items[0].at');
    expect(error.message).toContain('$.input.data.items[0].at');
  });
});
