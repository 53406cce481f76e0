import { ContractError } from './errors.js';

/**
 * The number of bytes `value` takes as UTF-8, computed without encoding it.
 * A lone surrogate counts 3 bytes, as the replacement character would.
 */
export function utf8ByteLength(value: string): number {
  let bytes = 0;
  for (let i = 0; i < value.length; i++) {
    const unit = value.charCodeAt(i);
    if (unit < 0x80) bytes += 1;
    else if (unit < 0x800) bytes += 2;
    else if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < value.length) {
      const next = value.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        bytes += 4;
        i++;
      } else bytes += 3;
    } else bytes += 3;
  }
  return bytes;
}

const LONE_SURROGATES = /\p{Cs}/gu;
const CUT_MARK = '…';
const CUT_MARK_BYTES = 3;

/**
 * `text` made safe to send within `maxBytes` of UTF-8: lone surrogates (which no JSON decoder
 * here accepts) become U+FFFD, and a longer text is cut at a character boundary — never inside a
 * surrogate pair — and ends with `…`. For free text a peer wrote (error messages, schema issues),
 * where refusing the whole report would lose more than the cut does.
 */
export function fitText(text: string, maxBytes: number): string {
  const wellFormed = text.replace(LONE_SURROGATES, '\ufffd');
  if (utf8ByteLength(wellFormed) <= maxBytes) return wellFormed;
  const budget = maxBytes - CUT_MARK_BYTES;
  let bytes = 0;
  let end = 0;
  for (const char of wellFormed) {
    bytes += utf8ByteLength(char);
    if (bytes > budget) break;
    end += char.length;
  }
  return `${wellFormed.slice(0, end)}${CUT_MARK}`;
}

// C0 and C1 controls and DEL; identifiers end up in logs, headers and indexes.
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const CONTROL_CHARACTER = /[\u0000-\u001f\u007f-\u009f]/;
// With the `u` flag a surrogate pair is one code point, so only lone halves match.
const LONE_SURROGATE = /\p{Cs}/u;
// Unicode White_Space plus the zero-width and BOM characters trim() leaves alone.
const EDGE_SPACE = /^[\s\u200b\ufeff]|[\s\u200b\ufeff]$/;

/**
 * Whether `value` holds a Unicode noncharacter (U+FDD0..U+FDEF, or the last two code points of any
 * plane). CloudEvents 1.0 excludes them from its `String` type, and a task's tenant, namespace and
 * queue are attributes of its events (DESIGN §4, §8): identifier text refuses them, as it refuses
 * the control characters and lone surrogates that type excludes too.
 */
function hasNoncharacter(value: string): boolean {
  for (const char of value) {
    const code = char.codePointAt(0) as number;
    if ((code >= 0xfdd0 && code <= 0xfdef) || (code & 0xfffe) === 0xfffe) return true;
  }
  return false;
}

/** Whether `value` holds no lone surrogate, so it encodes to UTF-8 without loss. */
export function isWellFormedText(value: string): boolean {
  return !LONE_SURROGATE.test(value);
}

/**
 * The common case of {@link textProblem} in one pass: printable ASCII (U+0020..U+007E), no
 * space at either end, at most `maxBytes` characters. Such text passes every rule there — one
 * byte per character, no surrogate, no control character, and the only whitespace printable
 * ASCII holds is the space — so only text outside it needs the rules one by one. Identifiers
 * are nearly always such text, and every command and reply carries several (issue #7: the
 * regular expressions were a fifth of a compiled schema's time).
 */
function isPlainAsciiText(value: string, maxBytes: number): boolean {
  const length = value.length;
  if (length > maxBytes || value.charCodeAt(0) === 0x20 || value.charCodeAt(length - 1) === 0x20) {
    return false;
  }
  for (let i = 0; i < length; i++) {
    const unit = value.charCodeAt(i);
    if (unit < 0x20 || unit > 0x7e) return false;
  }
  return true;
}

/**
 * Why `value` is not acceptable identifier text, or `undefined` when it is:
 * 1..`maxBytes` UTF-8 bytes, well-formed Unicode, no control characters, no
 * leading or trailing whitespace (seed: `validate_text`; DESIGN §3), and no Unicode
 * noncharacters (CloudEvents 1.0 `String`: see {@link hasNoncharacter}).
 */
export function textProblem(value: unknown, maxBytes: number): string | undefined {
  if (typeof value === 'string' && value.length > 0 && isPlainAsciiText(value, maxBytes)) {
    return undefined;
  }
  return textProblemByRules(value, maxBytes);
}

/**
 * {@link textProblem} with every rule checked in turn, whatever the text: what the one-pass
 * check must agree with (text.test.ts). Exported for that test, not from the package.
 */
export function textProblemByRules(value: unknown, maxBytes: number): string | undefined {
  if (typeof value !== 'string') return 'must be a string';
  if (value.length === 0) return 'must not be empty';
  if (!isWellFormedText(value)) return 'must be well-formed Unicode';
  if (utf8ByteLength(value) > maxBytes) return `must be at most ${maxBytes} UTF-8 bytes`;
  if (CONTROL_CHARACTER.test(value)) return 'must not contain control characters';
  if (hasNoncharacter(value))
    return 'must not contain Unicode noncharacters (U+FDD0..U+FDEF, U+xFFFE, U+xFFFF)';
  if (EDGE_SPACE.test(value)) return 'must not start or end with whitespace';
  return undefined;
}

/**
 * Identifier or reference text stored in indexed platform columns: throws an
 * `invalid_input` {@link ContractError} naming `path` unless `value` is
 * 1..`maxBytes` UTF-8 bytes without control characters or edge whitespace.
 *
 * @example
 * validateText('email', 128, '$.input.queue'); // ok
 * validateText(' email', 128, '$.input.queue'); // throws: must not start or end with whitespace
 */
export function validateText(value: unknown, maxBytes: number, path = '$'): string {
  const problem = textProblem(value, maxBytes);
  if (problem !== undefined) {
    throw new ContractError('invalid_input', `${path} ${problem}`, {
      reason: 'invalid_text',
      path,
    });
  }
  return value as string;
}
