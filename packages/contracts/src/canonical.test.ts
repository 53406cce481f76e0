import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalEqual, canonicalJson } from './canonical.js';
import { ContractError } from './errors.js';
import { isWellFormedText } from './text.js';

function canonicalError(value: unknown): ContractError {
  try {
    canonicalJson(value);
  } catch (error) {
    expect(error).toBeInstanceOf(ContractError);
    return error as ContractError;
  }
  throw new Error('expected a ContractError, but nothing was thrown');
}

/** RFC 8785 written the slow, obvious way, to check both paths of the implementation. */
function reference(value: unknown): string {
  if (typeof value === 'number') return Object.is(value, -0) ? '0' : String(value);
  if (typeof value === 'string' || typeof value === 'boolean' || value === null) {
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(reference).join(',')}]`;
  const object = value as Record<string, unknown>;
  const byCodeUnits = (a: string, b: string): number => {
    for (let i = 0; i < Math.min(a.length, b.length); i++) {
      const diff = a.charCodeAt(i) - b.charCodeAt(i);
      if (diff !== 0) return diff;
    }
    return a.length - b.length;
  };
  const members = Object.keys(object)
    .filter((key) => object[key] !== undefined)
    .sort(byCodeUnits)
    .map((key) => `${JSON.stringify(key)}:${reference(object[key])}`);
  return `{${members.join(',')}}`;
}

/** An object with exactly these own properties, `__proto__` included. */
function objectOf(entries: readonly (readonly [string, unknown])[]): Record<string, unknown> {
  const object: Record<string, unknown> = {};
  for (const [key, value] of entries) {
    Object.defineProperty(object, key, {
      value,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return object;
}

describe('canonicalJson: RFC 8785 examples', () => {
  it('sorts keys by UTF-16 code units (§3.2.3)', () => {
    const value = {
      '\u20ac': 'Euro Sign',
      '\r': 'Carriage Return',
      '\ufb33': 'Hebrew Letter Dalet With Dagesh',
      '1': 'One',
      '\ud83d\ude00': 'Emoji: Grinning Face',
      '\u0080': 'Control',
      '\u00f6': 'Latin Small Letter O With Diaeresis',
      מ: 'Hebrew Letter Mem',
    };
    const expected =
      '{"\\r":"Carriage Return","1":"One","\u0080":"Control",' +
      '"\u00f6":"Latin Small Letter O With Diaeresis","מ":"Hebrew Letter Mem",' +
      '"\u20ac":"Euro Sign","\ud83d\ude00":"Emoji: Grinning Face",' +
      '"\ufb33":"Hebrew Letter Dalet With Dagesh"}';
    expect(canonicalJson(value)).toBe(expected);
    // U+1F600 is the pair D83D DE00, so it sorts before U+FB33 although its code point is higher.
    expect(Object.keys(JSON.parse(canonicalJson(value))).slice(-2)).toEqual([
      '\ud83d\ude00',
      '\ufb33',
    ]);
  });

  it('sorts the same without the array-index key "1"', () => {
    const value = { '\ufb33': 'b', '\ud83d\ude00': 'a', '\r': 'c', '\u0080': 'd' };
    expect(canonicalJson(value)).toBe('{"\\r":"c","\u0080":"d","\ud83d\ude00":"a","\ufb33":"b"}');
  });

  it('writes the §3.2.2 example', () => {
    const input =
      '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],' +
      ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",' +
      ' "literals": [null, true, false]}';
    expect(canonicalJson(JSON.parse(input))).toBe(
      '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],' +
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}',
    );
  });

  it.each([
    [1e21, '1e+21'],
    [0.000001, '0.000001'],
    [1e-7, '1e-7'],
    [-0, '0'],
    [0, '0'],
    // Written as text: the literal has more digits than a double keeps, which is the point.
    [Number('333333333.33333329'), '333333333.3333333'],
    [1e20, '100000000000000000000'],
    [4.5, '4.5'],
    [-1.5e-7, '-1.5e-7'],
  ])('writes the number %s as %s', (value, text) => {
    expect(canonicalJson(value)).toBe(text);
    expect(canonicalJson([value])).toBe(`[${text}]`);
  });

  it.each([
    ['0000000000000000', '0'],
    ['8000000000000000', '0'],
    ['0000000000000001', '5e-324'],
    ['8000000000000001', '-5e-324'],
    ['7fefffffffffffff', '1.7976931348623157e+308'],
    ['ffefffffffffffff', '-1.7976931348623157e+308'],
    ['4340000000000000', '9007199254740992'],
    ['c340000000000000', '-9007199254740992'],
    ['4430000000000000', '295147905179352830000'],
    ['44b52d02c7e14af5', '9.999999999999997e+22'],
    ['44b52d02c7e14af6', '1e+23'],
    ['44b52d02c7e14af7', '1.0000000000000001e+23'],
    ['444b1ae4d6e2ef4e', '999999999999999700000'],
    ['444b1ae4d6e2ef4f', '999999999999999900000'],
    ['444b1ae4d6e2ef50', '1e+21'],
    ['3eb0c6f7a0b5ed8c', '9.999999999999997e-7'],
    ['3eb0c6f7a0b5ed8d', '0.000001'],
    ['41b3de4355555553', '333333333.3333332'],
    ['41b3de4355555554', '333333333.33333325'],
    ['41b3de4355555555', '333333333.3333333'],
    ['41b3de4355555556', '333333333.3333334'],
    ['41b3de4355555557', '333333333.33333343'],
    ['becbf647612f3696', '-0.0000033333333333333333'],
    ['43143ff3c1cb0959', '1424953923781206.2'],
  ])('writes the IEEE 754 value %s as %s (Appendix B)', (bits, text) => {
    const value = Buffer.from(bits, 'hex').readDoubleBE(0);
    expect(canonicalJson(value)).toBe(text);
  });

  it.each([
    ['\u000f', '"\\u000f"'],
    ['\u0000\u0001\u001f', '"\\u0000\\u0001\\u001f"'],
    ['"', '"\\""'],
    ['\\', '"\\\\"'],
    ['/', '"/"'],
    ['\b\f\n\r\t', '"\\b\\f\\n\\r\\t"'],
    ['\u2028\u2029', '"\u2028\u2029"'],
    ['\u007f\u0080', '"\u007f\u0080"'],
    ['é€😀', '"é€😀"'],
    ["'", '"\'"'],
  ])('escapes the string %j as %s', (value, text) => {
    expect(canonicalJson(value)).toBe(text);
    expect(canonicalJson({ [value]: value })).toBe(`{${text}:${text}}`);
  });
});

describe('canonicalJson', () => {
  it('writes literals, empty containers and nesting compactly', () => {
    expect(canonicalJson(null)).toBe('null');
    expect(canonicalJson(true)).toBe('true');
    expect(canonicalJson(false)).toBe('false');
    expect(canonicalJson([])).toBe('[]');
    expect(canonicalJson({})).toBe('{}');
    expect(canonicalJson({ b: [1, { d: 2, c: [] }], a: {} })).toBe(
      '{"a":{},"b":[1,{"c":[],"d":2}]}',
    );
  });

  it('omits object properties holding undefined', () => {
    expect(canonicalJson({ b: undefined, a: 1, c: { d: undefined } })).toBe('{"a":1,"c":{}}');
    expect(canonicalJson({ only: undefined })).toBe('{}');
  });

  it('orders array-index keys as strings, not numerically', () => {
    const value = { b: 3, '10': 1, '9': 2, '!': 4, '': 5, '01': 6, '4294967295': 7 };
    expect(canonicalJson(value)).toBe('{"":5,"!":4,"01":6,"10":1,"4294967295":7,"9":2,"b":3}');
    expect(canonicalJson({ '1': { z: 1, a: [{ '2': 0, '10': 0 }] } })).toBe(
      '{"1":{"a":[{"10":0,"2":0}],"z":1}}',
    );
  });

  it('keeps an own __proto__ key', () => {
    expect(canonicalJson(JSON.parse('{"z":0,"__proto__":{"b":1,"a":2}}'))).toBe(
      '{"__proto__":{"a":2,"b":1},"z":0}',
    );
    expect(canonicalJson(JSON.parse('{"__proto__":[]}'))).toBe('{"__proto__":[]}');
  });

  it('does not range-check numbers: that is a wire rule, not canonical form', () => {
    expect(canonicalJson([2 ** 53, 1e300, -1e300])).toBe('[9007199254740992,1e+300,-1e+300]');
  });

  it('accepts null-prototype objects and shared references', () => {
    const shared = { x: 1 };
    const bare = Object.assign(Object.create(null) as object, { b: 1, a: 2 });
    expect(canonicalJson([shared, shared, bare])).toBe('[{"x":1},{"x":1},{"a":2,"b":1}]');
  });

  it('accepts depth 1000 and rejects 1001', () => {
    const arrays = (depth: number) => JSON.parse('['.repeat(depth) + ']'.repeat(depth)) as unknown;
    expect(canonicalJson(arrays(1000))).toBe('['.repeat(1000) + ']'.repeat(1000));
    expect(canonicalError(arrays(1001)).reason).toBe('not_json');
    let objects: unknown = 1;
    for (let i = 0; i < 1001; i++) objects = { k: objects };
    expect(canonicalError(objects).reason).toBe('not_json');
    expect(canonicalJson((objects as { k: unknown }).k)).toHaveLength(1000 * 6 + 1);
  });

  class Point {
    x = 1;
  }
  const cyclic: Record<string, unknown> = {};
  cyclic.inner = [cyclic];

  it.each([
    ['undefined', undefined, '$'],
    ['undefined in an array', [1, undefined], '$[1]'],
    ['NaN', { a: Number.NaN }, '$.a'],
    ['Infinity', [Number.POSITIVE_INFINITY], '$[0]'],
    ['a bigint', 1n, '$'],
    ['a symbol', { s: Symbol('s') }, '$.s'],
    ['a function', { f: () => 1 }, '$.f'],
    ['a cycle', cyclic, '$.inner[0]'],
    ['a Date', { d: new Date(0) }, '$.d'],
    ['a Map', new Map(), '$'],
    ['a class instance', [new Point()], '$[0]'],
    ['a lone surrogate', ['\ud800'], '$[0]'],
    ['a reversed pair', 'x\ude00\ud83d', '$'],
    ['a lone surrogate in a key', { a: { '\udc00': 1 } }, '$.a["\\udc00"]'],
    ['a non-JSON value under an index key', { '10': 1, '9': [undefined] }, '$["9"][0]'],
  ])('rejects %s', (_, value, path) => {
    const error = canonicalError(value);
    expect([error.code, error.reason, error.path]).toEqual(['invalid_input', 'not_json', path]);
    expect(error.message).toContain(path);
  });

  it('wraps errors thrown while reading the value', () => {
    const value = {
      get boom(): never {
        throw new TypeError('no');
      },
    };
    expect([canonicalError(value).code, canonicalError(value).reason]).toEqual([
      'invalid_input',
      'not_json',
    ]);
  });
});

describe('canonicalEqual', () => {
  it('ignores key order, number spelling and undefined properties', () => {
    expect(canonicalEqual({ a: 1, b: [1, 2] }, { b: [1, 2], a: 1 })).toBe(true);
    expect(canonicalEqual(JSON.parse('{"n":1.0}'), { n: 1 })).toBe(true);
    expect(canonicalEqual({ a: 1, b: undefined }, { a: 1 })).toBe(true);
    expect(canonicalEqual(-0, 0)).toBe(true);
  });

  it('tells different values apart', () => {
    expect(canonicalEqual([1, 2], [2, 1])).toBe(false);
    expect(canonicalEqual({ a: 1 }, { a: '1' })).toBe(false);
    expect(canonicalEqual({ a: null }, {})).toBe(false);
    expect(canonicalEqual('e\u0301', '\u00e9')).toBe(false);
  });

  it('throws like canonicalJson for non-JSON values', () => {
    expect(() => canonicalEqual(1, Number.NaN)).toThrow(ContractError);
  });
});

// ---- Properties -------------------------------------------------------------------

const key = fc.oneof(
  fc.string(),
  fc.string({ unit: 'binary', maxLength: 4 }),
  fc.nat({ max: 30 }).map(String),
  fc.constantFrom(
    '',
    '0',
    '01',
    '10',
    '9',
    '4294967294',
    '4294967295',
    '__proto__',
    '\r',
    '\u20ac',
  ),
  fc.constantFrom('\ud83d\ude00', '\ufb33', '\u0080', 'constructor', 'a"b', 'é'),
);
const scalar = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.constant(-0),
  fc.string({ unit: 'binary' }),
  fc.string(),
);
const { value: anyJson } = fc.letrec<{ value: unknown; array: unknown[]; object: unknown }>(
  (tie) => ({
    value: fc.oneof(
      { depthSize: 'small', withCrossShrink: true },
      scalar,
      tie('array'),
      tie('object'),
    ),
    array: fc.array(tie('value'), { maxLength: 5 }),
    object: fc
      .array(fc.tuple(key, fc.oneof(tie('value'), fc.constant(undefined))), { maxLength: 6 })
      .map(objectOf),
  }),
);

/** Same value, every object's own keys defined in reverse order. */
function reverseKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reverseKeys);
  if (value !== null && typeof value === 'object') {
    const object = value as Record<string, unknown>;
    return objectOf(
      Object.keys(object)
        .reverse()
        .map((k) => [k, reverseKeys(object[k])] as const),
    );
  }
  return value;
}

describe('canonicalJson: properties', () => {
  it('matches a straightforward RFC 8785 writer', () => {
    fc.assert(
      fc.property(anyJson, (value) => {
        expect(canonicalJson(value)).toBe(reference(value));
      }),
      { numRuns: 1000 },
    );
  });

  it('is idempotent, key-order independent and parses back to the same value', () => {
    fc.assert(
      fc.property(anyJson, (value) => {
        const text = canonicalJson(value);
        const parsed: unknown = JSON.parse(text);
        expect(canonicalJson(parsed)).toBe(text);
        expect(canonicalJson(reverseKeys(value))).toBe(text);
        expect(canonicalEqual(parsed, value)).toBe(true);
        expect(isWellFormedText(text)).toBe(true);
      }),
      { numRuns: 1000 },
    );
  });
});
