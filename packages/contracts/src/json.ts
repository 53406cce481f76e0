/**
 * The strict JSON decoder every body passes through at the edge (DESIGN §1
 * principle 4, §3, §4.1), and the checker for values built in memory that are
 * about to be sent or stored as application JSON.
 *
 * Both are iterative (an explicit stack, never recursion), so a hostile
 * nesting depth is a clean `depth_exceeded`, not a stack overflow.
 *
 * Measured on Node 20 (x64): a 1.2 MiB body of records (strings, numbers,
 * nested objects) decodes at ~100 MB/s from a string and ~85 MB/s from bytes,
 * UTF-8 validation included; `JSON.parse`, which checks none of these rules,
 * runs at ~210 MB/s. A 200-byte command decodes in about 2 µs. So a text that
 * one scan shows none of the rules can touch (no exponent, no number of more
 * than 15 digits, no surrogate escape, nesting within bounds) is handed to
 * `JSON.parse`, and its value kept when it holds as many keys as the text has
 * members and none is forbidden; any other text goes to the strict parser
 * (`parsePlain`): 25–40 % less time for the SDK's batch replies, 12–15 % for a
 * 1 000-command body (bench/README.md, "Strict JSON through JSON.parse").
 */

import { ContractError } from './errors.js';
import { JSON_MAX_DEPTH, JSON_MAX_SAFE_NUMBER } from './limits.js';
import { isWellFormedText, utf8ByteLength } from './text.js';

/** Bytes, an ArrayBuffer, or an already-decoded string. */
export type JsonInput = Uint8Array | ArrayBuffer | string;

/** Options of {@link decodeStrictJson}. */
export interface StrictJsonOptions {
  /** Byte limit, checked before any parsing (string input: its UTF-8 byte length). */
  maxBytes: number;
  /** Maximum container nesting depth; default JSON_MAX_DEPTH (64). Top-level `{}` or `[]` is depth 1. */
  maxDepth?: number;
}

/** Options of {@link checkJsonValue}. */
export interface JsonValueOptions {
  /** Max compact JSON.stringify UTF-8 bytes of the value. */
  maxBytes: number;
  /** Max nesting depth of the value itself (default JSON_MAX_DEPTH). */
  maxDepth?: number;
  /** JSON path of the value inside its command, used as the prefix of reported paths, default '$'. */
  path?: string;
}

// ---- Paths --------------------------------------------------------------------

/** Keys are echoed into messages and logs; beyond this many characters they are cut. */
const KEY_ECHO_MAX = 64;
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;
// Anything that could forge a log line, reorder displayed text or break the
// quoting of a bracketed key: quotes, backslashes, C0/C1 controls, line and
// paragraph separators, bidi and invisible marks, and lone surrogate halves.
// A surrogate pair matches first, as a whole, and is kept. (No lookbehind:
// older browsers running the SDK would fail to load the module.)
const UNSAFE_KEY_CHARACTER =
  // biome-ignore lint/suspicious/noControlCharactersInRegex: escaping control characters is the point
  /[\ud800-\udbff][\udc00-\udfff]|["\\\u0000-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]/g;
const SHORT_ESCAPES: Readonly<Record<string, string>> = {
  '"': '\\"',
  '\\': '\\\\',
  '\b': '\\b',
  '\f': '\\f',
  '\n': '\\n',
  '\r': '\\r',
  '\t': '\\t',
};

function escapeKeyCharacter(ch: string): string {
  if (ch.length === 2) return ch;
  return SHORT_ESCAPES[ch] ?? `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`;
}

/**
 * `path` extended by an array index or an object key, in the notation every
 * Ledgence error uses: `$.items[3]`, `$.input.data`, `$["odd key"]`. Keys are
 * cut to 64 characters (marked `…`) and control, bidi and quoting characters
 * are escaped, so a path is always safe to put in a message or a log line.
 */
export function appendJsonPath(path: string, key: string | number): string {
  if (typeof key === 'number') return `${path}[${key}]`;
  if (key.length <= KEY_ECHO_MAX && IDENTIFIER.test(key)) return `${path}.${key}`;
  let shown = key;
  if (key.length > KEY_ECHO_MAX) {
    // Never split a surrogate pair: half of one would show as a lone surrogate.
    const last = key.charCodeAt(KEY_ECHO_MAX - 1);
    const end = last >= 0xd800 && last <= 0xdbff ? KEY_ECHO_MAX - 1 : KEY_ECHO_MAX;
    shown = `${key.slice(0, end)}…`;
  }
  return `${path}["${shown.replace(UNSAFE_KEY_CHARACTER, escapeKeyCharacter)}"]`;
}

/**
 * Object keys refused anywhere in application JSON and labels: they could reach a prototype when
 * a consumer merges or assigns the value.
 */
export const FORBIDDEN_JSON_KEYS: readonly string[] = ['__proto__', 'constructor', 'prototype'];
const FORBIDDEN_KEYS: ReadonlySet<string> = new Set(FORBIDDEN_JSON_KEYS);

function invalid(message: string, reason: string, path: string): ContractError {
  return new ContractError('invalid_input', message, { reason, path });
}

// ---- Numbers ------------------------------------------------------------------

const MAX_SAFE_DIGITS = String(JSON_MAX_SAFE_NUMBER);

/**
 * Whether a JSON number literal that rounds to ±(2^53−1) is in fact larger in
 * magnitude, e.g. `9007199254740991.4`: rounding must not let it in. Compares
 * the exact decimal value; only called for literals rounding to the bound.
 */
function exceedsMaxSafe(literal: string): boolean {
  let s = literal.charCodeAt(0) === 0x2d ? literal.slice(1) : literal;
  let exponent = 0;
  const e = s.search(/[eE]/);
  if (e >= 0) {
    exponent = Number(s.slice(e + 1));
    s = s.slice(0, e);
  }
  const dot = s.indexOf('.');
  let digits = dot >= 0 ? s.slice(0, dot) + s.slice(dot + 1) : s;
  let point = (dot >= 0 ? dot : s.length) + exponent;
  let lead = 0;
  while (lead < digits.length && digits.charCodeAt(lead) === 0x30) lead++;
  digits = digits.slice(lead);
  point -= lead;
  let end = digits.length;
  while (end > 0 && digits.charCodeAt(end - 1) === 0x30) end--;
  digits = digits.slice(0, end);
  // The literal rounds to the bound, so its integer part has about 16 digits.
  if (point !== MAX_SAFE_DIGITS.length) return point > MAX_SAFE_DIGITS.length;
  const integer = digits.slice(0, point).padEnd(point, '0');
  if (integer !== MAX_SAFE_DIGITS) return integer > MAX_SAFE_DIGITS;
  return digits.length > point;
}

// ---- The decoder --------------------------------------------------------------

const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

type Container = unknown[] | Record<string, unknown>;

// Bodies repeat the same keys, within one body (arrays of records) and across
// requests. Reusing the string read last time for the same characters skips a
// slice and lets the engine reuse its internalized property name: 5–10%
// faster on record-shaped bodies. Short keys only, so the cache stays small.
const KEY_CACHE_SIZE = 256;
const KEY_CACHE_MAX_LENGTH = 32;
const keyCache: (string | undefined)[] = new Array(KEY_CACHE_SIZE).fill(undefined);

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  const lower = c | 0x20;
  return lower >= 0x61 && lower <= 0x66 ? lower - 0x57 : -1;
}

/** The index of the first character at or after `i` that is not JSON whitespace. */
function skipWhitespace(text: string, i: number): number {
  for (;;) {
    const c = text.charCodeAt(i);
    if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
    else return i;
  }
}

/**
 * One strict parse of one text. The open containers live on `frames`; for an
 * object, `keys` holds the key whose value is being read, so the path of any
 * error is rebuilt from the stack only when the error is thrown.
 */
class StrictParser {
  private readonly text: string;
  private readonly maxDepth: number;
  private readonly frames: Container[] = [];
  private readonly keys: string[] = [];
  /** Where the last string or number read by a helper ended. */
  private end = 0;

  constructor(text: string, maxDepth: number) {
    this.text = text;
    this.maxDepth = maxDepth;
  }

  /** The path of the value being read inside the first `depth` open containers. */
  private pathTo(depth: number): string {
    let path = '$';
    for (let k = 0; k < depth; k++) {
      const frame = this.frames[k];
      path = appendJsonPath(path, Array.isArray(frame) ? frame.length : (this.keys[k] ?? ''));
    }
    return path;
  }

  private syntax(what: string, at: number, depth = this.frames.length): ContractError {
    const path = this.pathTo(depth);
    return invalid(`${what} at ${path} (character ${at})`, 'syntax', path);
  }

  parse(): unknown {
    const text = this.text;
    const frames = this.frames;
    const keys = this.keys;
    let i = skipWhitespace(text, 0);
    if (i >= text.length) throw invalid('$ is empty: there is no JSON value', 'empty', '$');
    let value: unknown;
    outer: for (;;) {
      // A value starts at `i`.
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        value = this.string(i, false);
        i = this.end;
      } else if (c === 0x7b || c === 0x5b) {
        if (!(frames.length < this.maxDepth)) {
          const path = this.pathTo(frames.length);
          throw invalid(
            `nesting deeper than ${this.maxDepth} levels at ${path}`,
            'depth_exceeded',
            path,
          );
        }
        i = skipWhitespace(text, i + 1);
        if (c === 0x5b) {
          const array: unknown[] = [];
          if (text.charCodeAt(i) === 0x5d) {
            value = array;
            i++;
          } else {
            frames.push(array);
            keys.push('');
            continue;
          }
        } else {
          const object: Record<string, unknown> = {};
          if (text.charCodeAt(i) === 0x7d) {
            value = object;
            i++;
          } else {
            frames.push(object);
            keys.push('');
            i = this.member(object, i);
            continue;
          }
        }
      } else if (c === 0x2d || isDigit(c)) {
        value = this.number(i);
        i = this.end;
      } else if (c === 0x74 && text.startsWith('true', i)) {
        value = true;
        i += 4;
      } else if (c === 0x66 && text.startsWith('false', i)) {
        value = false;
        i += 5;
      } else if (c === 0x6e && text.startsWith('null', i)) {
        value = null;
        i += 4;
      } else if (text.startsWith('NaN', i) || text.startsWith('Infinity', i)) {
        const path = this.pathTo(frames.length);
        throw invalid(`NaN and Infinity are not JSON at ${path}`, 'non_finite_number', path);
      } else if (i >= text.length) {
        throw this.syntax('unexpected end of input, expected a value', i);
      } else {
        throw this.syntax('expected a value', i);
      }

      // A value ended at `i`: attach it and close every container it completes.
      for (;;) {
        const depth = frames.length;
        if (depth === 0) break outer;
        const top = frames[depth - 1] as Container;
        i = skipWhitespace(text, i);
        const d = text.charCodeAt(i);
        if (Array.isArray(top)) {
          top.push(value);
          if (d === 0x2c) {
            i = skipWhitespace(text, i + 1);
            continue outer;
          }
          if (d !== 0x5d) {
            throw this.syntax(
              i >= text.length ? 'unexpected end of input' : "expected ',' or ']'",
              i,
              depth - 1,
            );
          }
        } else {
          top[keys[depth - 1] as string] = value;
          if (d === 0x2c) {
            i = this.member(top, skipWhitespace(text, i + 1));
            continue outer;
          }
          if (d !== 0x7d) {
            throw this.syntax(
              i >= text.length ? 'unexpected end of input' : "expected ',' or '}'",
              i,
              depth - 1,
            );
          }
        }
        i++;
        value = top;
        frames.pop();
        keys.pop();
      }
    }
    i = skipWhitespace(text, i);
    if (i < text.length) throw this.syntax('unexpected data after the JSON value', i);
    return value;
  }

  /**
   * Reads `"key":` of a member of `object` (the top frame) starting at `i`,
   * rejecting duplicate and forbidden keys; returns where its value starts.
   */
  private member(object: Record<string, unknown>, i: number): number {
    const text = this.text;
    const depth = this.frames.length;
    if (text.charCodeAt(i) !== 0x22) {
      throw this.syntax(
        i >= text.length ? 'unexpected end of input' : 'expected a double-quoted key',
        i,
        depth - 1,
      );
    }
    const key = this.string(i, true);
    if (FORBIDDEN_KEYS.has(key)) {
      const path = appendJsonPath(this.pathTo(depth - 1), key);
      throw invalid(`the key at ${path} is not allowed`, 'forbidden_key', path);
    }
    if (Object.hasOwn(object, key)) {
      const path = appendJsonPath(this.pathTo(depth - 1), key);
      throw invalid(`duplicate key at ${path}`, 'duplicate_key', path);
    }
    this.keys[depth - 1] = key;
    i = skipWhitespace(text, this.end);
    if (text.charCodeAt(i) !== 0x3a) {
      throw this.syntax(i >= text.length ? 'unexpected end of input' : "expected ':'", i);
    }
    return skipWhitespace(text, i + 1);
  }

  /** Reads the string whose opening quote is at `start`; sets `end` past its closing quote. */
  private string(start: number, isKey: boolean): string {
    const text = this.text;
    let j = start + 1;
    let chunk = j;
    let unescaped = '';
    let surrogates = false;
    for (;;) {
      const c = text.charCodeAt(j);
      // The common case first: printable, no escape, not a surrogate half.
      if (c >= 0x20 && c !== 0x22 && c !== 0x5c && c < 0xd800) {
        j++;
        continue;
      }
      if (c === 0x22) break;
      if (c === 0x5c) {
        unescaped += text.slice(chunk, j);
        const e = text.charCodeAt(j + 1);
        if (e === 0x75) {
          const code =
            (hexValue(text.charCodeAt(j + 2)) << 12) |
            (hexValue(text.charCodeAt(j + 3)) << 8) |
            (hexValue(text.charCodeAt(j + 4)) << 4) |
            hexValue(text.charCodeAt(j + 5));
          // Any invalid digit is -1, which sets the sign bit of the combination.
          if (code < 0) throw this.stringSyntax('invalid \\u escape', j, isKey);
          if (code >= 0xd800 && code <= 0xdfff) surrogates = true;
          unescaped += String.fromCharCode(code);
          j += 6;
        } else {
          const short = shortEscape(e);
          if (short === undefined) {
            throw this.stringSyntax(
              j + 1 >= text.length ? 'unterminated string' : 'invalid escape',
              j,
              isKey,
            );
          }
          unescaped += short;
          j += 2;
        }
        chunk = j;
      } else if (c >= 0xd800) {
        // Only string input can carry raw surrogates; UTF-8 decoding never yields lone ones.
        if (c <= 0xdfff) surrogates = true;
        j++;
      } else if (j >= text.length) {
        throw this.stringSyntax('unterminated string', j, isKey);
      } else {
        throw this.stringSyntax('control character in string', j, isKey);
      }
    }
    this.end = j + 1;
    const plain = chunk === start + 1;
    let slot = -1;
    if (isKey && plain) {
      const length = j - chunk;
      if (length <= KEY_CACHE_MAX_LENGTH) {
        slot = (length * 31 + text.charCodeAt(chunk)) & (KEY_CACHE_SIZE - 1);
        const cached = keyCache[slot];
        if (cached !== undefined && cached.length === length && text.startsWith(cached, chunk)) {
          return cached;
        }
      }
    }
    const value = plain ? text.slice(chunk, j) : unescaped + text.slice(chunk, j);
    // Checked after unescaping: `"\ud83d\ude00"` is a pair, `"\ud800"` is not.
    if (surrogates && !isWellFormedText(value)) {
      const depth = this.frames.length;
      const path = isKey ? appendJsonPath(this.pathTo(depth - 1), value) : this.pathTo(depth);
      throw invalid(`lone surrogate in string at ${path}`, 'lone_surrogate', path);
    }
    if (slot >= 0) keyCache[slot] = value;
    return value;
  }

  private stringSyntax(what: string, at: number, isKey: boolean): ContractError {
    return this.syntax(
      isKey ? `${what} in a key` : what,
      at,
      isKey ? this.frames.length - 1 : this.frames.length,
    );
  }

  /** Reads the number starting at `start`; sets `end` past it. */
  private number(start: number): number {
    const text = this.text;
    let i = start;
    let c = text.charCodeAt(i);
    const negative = c === 0x2d;
    if (negative) c = text.charCodeAt(++i);
    let n = 0;
    let digits = 0;
    if (c === 0x30) {
      c = text.charCodeAt(++i);
      if (isDigit(c)) throw this.syntax('leading zeros are not allowed', i);
    } else if (c >= 0x31 && c <= 0x39) {
      do {
        n = n * 10 + (c - 0x30);
        digits++;
        c = text.charCodeAt(++i);
      } while (isDigit(c));
    } else if (text.startsWith('Infinity', i)) {
      const path = this.pathTo(this.frames.length);
      throw invalid(`NaN and Infinity are not JSON at ${path}`, 'non_finite_number', path);
    } else {
      throw this.syntax('expected a digit', i);
    }
    let integer = true;
    if (c === 0x2e) {
      integer = false;
      c = text.charCodeAt(++i);
      if (!isDigit(c)) throw this.syntax('expected a digit after the decimal point', i);
      do c = text.charCodeAt(++i);
      while (isDigit(c));
    }
    if (c === 0x65 || c === 0x45) {
      integer = false;
      c = text.charCodeAt(++i);
      if (c === 0x2b || c === 0x2d) c = text.charCodeAt(++i);
      if (!isDigit(c)) throw this.syntax('expected a digit in the exponent', i);
      do c = text.charCodeAt(++i);
      while (isDigit(c));
    }
    this.end = i;
    // Up to 15 digits the accumulated integer is exact; JSON.parse('-0') is -0 too.
    if (integer && digits <= 15) return negative ? -n : n;
    const literal = text.slice(start, i);
    const value = Number(literal);
    const magnitude = Math.abs(value);
    if (
      magnitude > JSON_MAX_SAFE_NUMBER ||
      (magnitude === JSON_MAX_SAFE_NUMBER && exceedsMaxSafe(literal))
    ) {
      const path = this.pathTo(this.frames.length);
      throw invalid(
        `number at ${path} is beyond ±(2^53−1) and cannot be represented exactly`,
        'number_out_of_range',
        path,
      );
    }
    return value;
  }
}

function shortEscape(c: number): string | undefined {
  switch (c) {
    case 0x22:
      return '"';
    case 0x5c:
      return '\\';
    case 0x2f:
      return '/';
    case 0x62:
      return '\b';
    case 0x66:
      return '\f';
    case 0x6e:
      return '\n';
    case 0x72:
      return '\r';
    case 0x74:
      return '\t';
    default:
      return undefined;
  }
}

/** {@link parsePlain}'s answer for a text it leaves to the strict parser. */
const NOT_PLAIN: unique symbol = Symbol('not plain');

/**
 * `JSON.parse(text)` when that is provably what the strict parser would return, else
 * {@link NOT_PLAIN}. JSON.parse is native, about twice as fast as {@link StrictParser} on the
 * replies and bodies of the hot paths, but silently accepts what the strict rules reject, so
 * one scan of the text outside its strings first rules those out:
 * - nesting deeper than `maxDepth`, counted from the brackets;
 * - numbers that may not be exact or in range: any exponent, or more than 15 digits (up to 15
 *   digits a literal is below 2^53 and both parsers round it alike);
 * - `\u` escapes of surrogates (lone ones are rejected; pairs are rare and left to the
 *   strict parser too);
 * - duplicate keys: the scan counts the members (`:` outside strings), and the parsed value
 *   must hold exactly as many keys — JSON.parse keeps one key of each duplicate set;
 * - forbidden keys (`__proto__`, `constructor`, `prototype`), checked on the parsed keys, so
 *   that escaped spellings are caught too.
 * A syntax error also leaves the text to the strict parser, which reports it with its path.
 * Raw surrogates cannot occur: the caller passes only well-formed text.
 */
function parsePlain(text: string, maxDepth: number): unknown {
  const members = plainMembers(text, maxDepth);
  if (members < 0) return NOT_PLAIN;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return NOT_PLAIN;
  }
  return keysOf(value, members) === members ? value : NOT_PLAIN;
}

/**
 * The members of `text` (its `:` outside strings), or -1 when JSON.parse may disagree with the
 * strict parser (see {@link parsePlain}). Strings are skipped with `indexOf`, so the loop visits
 * only the characters between them.
 */
function plainMembers(text: string, maxDepth: number): number {
  const length = text.length;
  let members = 0;
  let depth = 0;
  let backslash = text.indexOf('\\');
  if (backslash < 0) backslash = length;
  for (let i = 0; i < length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // Find the closing quote, stepping over escapes (which may escape a quote). The quote
      // found stays the next one until an escape steps past it: searched again only then, a
      // string of many escapes is read once, not once per escape (quadratic: 1 MiB of `\n`
      // took seconds, the server's event loop blocked all the while).
      let at = i + 1;
      let quote = text.indexOf('"', at);
      for (;;) {
        if (quote < 0) return -1;
        if (quote < backslash) {
          i = quote;
          break;
        }
        // An escape comes first: `\uD800`–`\uDFFF` is left to the strict parser.
        if (text.charCodeAt(backslash + 1) === 0x75) {
          const high = text.charCodeAt(backslash + 2) | 0x20;
          const next = text.charCodeAt(backslash + 3) | 0x20;
          if (high === 0x64 && next >= 0x38 && next <= 0x66 && (next >= 0x61 || next <= 0x39)) {
            return -1;
          }
        }
        at = backslash + 2;
        backslash = text.indexOf('\\', at);
        if (backslash < 0) backslash = length;
        if (quote < at) quote = text.indexOf('"', at);
      }
    } else if (c === 0x3a) {
      members++;
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > maxDepth) return -1;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    } else if (c === 0x2d || isDigit(c)) {
      let digits = 0;
      let j = c === 0x2d ? i + 1 : i;
      for (; ; j++) {
        const d = text.charCodeAt(j);
        if (isDigit(d)) digits++;
        else if (d !== 0x2e) break;
      }
      const after = text.charCodeAt(j);
      if (digits > 15 || after === 0x65 || after === 0x45) return -1;
      i = j - 1;
    }
  }
  return members;
}

/**
 * The keys of every object in `value` (a JSON.parse result), or -1 on a forbidden key; stops
 * counting once past `limit`. Iterative, like the rest of this module. `for…in` would also
 * count enumerable keys someone added to `Object.prototype`: too many, so the text then goes to
 * the strict parser, never the wrong way.
 */
function keysOf(value: unknown, limit: number): number {
  let count = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const item = stack.pop();
    if (typeof item !== 'object' || item === null) continue;
    if (Array.isArray(item)) {
      for (const element of item) if (typeof element === 'object') stack.push(element);
      continue;
    }
    const record = item as Record<string, unknown>;
    for (const key in record) {
      if (FORBIDDEN_KEYS.has(key)) return -1;
      if (++count > limit) return count;
      const member = record[key];
      if (typeof member === 'object') stack.push(member);
    }
  }
  return count;
}

function tooLarge(maxBytes: number): ContractError {
  return new ContractError('payload_too_large', `$ is larger than ${maxBytes} bytes`, {
    reason: 'too_large',
    path: '$',
  });
}

function asBytes(input: unknown): Uint8Array {
  if (input instanceof Uint8Array) return input;
  if (ArrayBuffer.isView(input)) {
    return new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
  }
  const tag = Object.prototype.toString.call(input);
  if (tag === '[object ArrayBuffer]' || tag === '[object SharedArrayBuffer]') {
    return new Uint8Array(input as ArrayBuffer);
  }
  throw invalid('$ must be a string, bytes or an ArrayBuffer', 'syntax', '$');
}

/** The checked text of `input`: within the byte limit, valid UTF-8, without a BOM. */
function inputText(input: unknown, maxBytes: number): string {
  let text: string;
  if (typeof input === 'string') {
    // A UTF-16 unit is 1 to 3 UTF-8 bytes, so counting is needed only in between.
    if (
      !(input.length <= maxBytes) ||
      (input.length * 3 > maxBytes && !(utf8ByteLength(input) <= maxBytes))
    ) {
      throw tooLarge(maxBytes);
    }
    text = input;
  } else {
    const bytes = asBytes(input);
    if (!(bytes.byteLength <= maxBytes)) throw tooLarge(maxBytes);
    try {
      text = decoder.decode(bytes);
    } catch (error) {
      throw new ContractError('invalid_input', '$ is not valid UTF-8', {
        reason: 'invalid_utf8',
        path: '$',
        cause: error,
      });
    }
  }
  if (text.charCodeAt(0) === 0xfeff) {
    throw invalid('$ starts with a byte order mark', 'bom', '$');
  }
  return text;
}

/**
 * Decode one JSON text strictly; throws ContractError, never anything else. Returns plain
 * objects/arrays/primitives.
 *
 * The byte limit is checked first (`payload_too_large`, reason `too_large`), then UTF-8
 * (`invalid_utf8`, `bom`), then the RFC 8259 grammar (`empty`, `syntax`,
 * `non_finite_number`), duplicate keys (`duplicate_key`), `__proto__`, `constructor` and
 * `prototype` keys (`forbidden_key`), numbers beyond ±(2^53−1) (`number_out_of_range`),
 * lone surrogates (`lone_surrogate`) and nesting (`depth_exceeded`). Every other failure is
 * `invalid_input`; each carries the JSON path of the offending value.
 *
 * @example
 * decodeStrictJson('{"a":[1,2]}', { maxBytes: 1024 }); // { a: [1, 2] }
 * decodeStrictJson('{"a":{"b":1,"b":2}}', { maxBytes: 1024 }); // throws duplicate_key at $.a.b
 */
export function decodeStrictJson(input: JsonInput, options: StrictJsonOptions): unknown {
  return decode(input, options, true);
}

/**
 * {@link decodeStrictJson} without its JSON.parse fast path: every text through the strict
 * parser. Not exported from the package; the tests compare the two.
 */
export function decodeStrictJsonByParser(input: JsonInput, options: StrictJsonOptions): unknown {
  return decode(input, options, false);
}

function decode(input: JsonInput, options: StrictJsonOptions, tryPlain: boolean): unknown {
  try {
    const text = inputText(input, options.maxBytes);
    const maxDepth = options.maxDepth ?? JSON_MAX_DEPTH;
    // Bytes decode to well-formed text (fatal UTF-8); a string may carry lone surrogates, which
    // JSON.parse would keep.
    const plain =
      tryPlain && (typeof input !== 'string' || isWellFormedText(text))
        ? parsePlain(text, maxDepth)
        : NOT_PLAIN;
    return plain === NOT_PLAIN ? new StrictParser(text, maxDepth).parse() : plain;
  } catch (error) {
    if (error instanceof ContractError) throw error;
    // E.g. a RangeError for a string beyond the engine's maximum length.
    throw new ContractError('invalid_input', '$ could not be decoded as JSON', {
      reason: 'syntax',
      path: '$',
      cause: error,
    });
  }
}

// ---- In-memory values -----------------------------------------------------------

/** Compact JSON.stringify bytes of each code unit below 0x20: `\b \t \n \f \r` take 2, the rest `\u00XX`. */
const CONTROL_ESCAPE_BYTES = Array.from({ length: 0x20 }, (_, c) =>
  c === 0x08 || c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d ? 2 : 6,
);

/** UTF-8 bytes of `JSON.stringify(s)`, or -1 when `s` holds a lone surrogate. */
function jsonStringBytes(s: string): number {
  let bytes = 2;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) {
      if (c < 0x20) bytes += CONTROL_ESCAPE_BYTES[c] as number;
      else bytes += c === 0x22 || c === 0x5c ? 2 : 1;
    } else if (c < 0x800) bytes += 2;
    else if (c < 0xd800 || c > 0xdfff) bytes += 3;
    else if (c <= 0xdbff && i + 1 < s.length) {
      const next = s.charCodeAt(i + 1);
      if (next < 0xdc00 || next > 0xdfff) return -1;
      bytes += 4;
      i++;
    } else return -1;
  }
  return bytes;
}

/** Characters of `String(n)` for a safe integer, without building the string. */
function integerLength(n: number): number {
  let length = n < 0 ? 2 : 1;
  for (let m = Math.abs(n); m >= 10; m = Math.floor(m / 10)) length++;
  return length;
}

interface ValueFrame {
  readonly node: object;
  /** Own enumerable keys of an object; `undefined` for an array. */
  readonly keys: string[] | undefined;
  /** The next element or key to visit. */
  index: number;
  /** Members written so far, to count the commas between them. */
  written: number;
}

/** Walks one value depth-first with an explicit stack, adding up its compact size. */
class ValueChecker {
  private readonly frames: ValueFrame[] = [];
  private readonly ancestors = new Set<object>();
  private readonly root: string;
  private readonly maxBytes: number;
  private readonly maxDepth: number;
  private bytes = 0;

  constructor(root: string, maxBytes: number, maxDepth: number) {
    this.root = root;
    this.maxBytes = maxBytes;
    this.maxDepth = maxDepth;
  }

  private path(): string {
    let path = this.root;
    for (const frame of this.frames) {
      const at = frame.index - 1;
      path = appendJsonPath(path, frame.keys === undefined ? at : (frame.keys[at] ?? ''));
    }
    return path;
  }

  private fail(what: string, reason: string): ContractError {
    const path = this.path();
    return invalid(`${what} at ${path}`, reason, path);
  }

  private add(bytes: number): void {
    this.bytes += bytes;
    if (!(this.bytes <= this.maxBytes)) {
      const path = this.path();
      throw new ContractError(
        'payload_too_large',
        `${this.root} is larger than ${this.maxBytes} bytes as compact JSON (reached at ${path})`,
        { reason: 'too_large', path: this.root },
      );
    }
  }

  run(value: unknown): number {
    if (value === undefined) throw this.fail('undefined is not JSON', 'not_json');
    this.visit(value);
    const frames = this.frames;
    while (frames.length > 0) {
      const frame = frames[frames.length - 1] as ValueFrame;
      const keys = frame.keys;
      let next: unknown;
      let found = false;
      if (keys === undefined) {
        const array = frame.node as unknown[];
        if (frame.index < array.length) {
          next = array[frame.index++];
          if (next === undefined) throw this.fail('undefined (or a hole) in an array', 'not_json');
          found = true;
          if (frame.written++ > 0) this.add(1);
        }
      } else {
        const object = frame.node as Record<string, unknown>;
        while (frame.index < keys.length) {
          const key = keys[frame.index++] as string;
          next = object[key];
          // JSON.stringify leaves such properties out, and so does the size.
          if (next === undefined) continue;
          if (FORBIDDEN_KEYS.has(key)) throw this.fail('forbidden key', 'forbidden_key');
          const keyBytes = jsonStringBytes(key);
          if (keyBytes < 0) throw this.fail('lone surrogate in key', 'lone_surrogate');
          this.add(keyBytes + (frame.written++ > 0 ? 2 : 1));
          found = true;
          break;
        }
      }
      if (found) this.visit(next);
      else {
        frames.pop();
        this.ancestors.delete(frame.node);
      }
    }
    return this.bytes;
  }

  private visit(value: unknown): void {
    switch (typeof value) {
      case 'string': {
        const bytes = jsonStringBytes(value);
        if (bytes < 0) throw this.fail('lone surrogate in string', 'lone_surrogate');
        this.add(bytes);
        return;
      }
      case 'number':
        if (!Number.isFinite(value)) {
          throw this.fail('NaN and Infinity are not JSON', 'non_finite_number');
        }
        if (Math.abs(value) > JSON_MAX_SAFE_NUMBER) {
          throw this.fail('number beyond ±(2^53−1)', 'number_out_of_range');
        }
        this.add(Number.isInteger(value) ? integerLength(value) : String(value).length);
        return;
      case 'boolean':
        this.add(value ? 4 : 5);
        return;
      case 'object': {
        if (value === null) {
          this.add(4);
          return;
        }
        if (this.ancestors.has(value)) throw this.fail('cyclic reference', 'cycle');
        const proto: unknown = Object.getPrototypeOf(value);
        const isArray = Array.isArray(value);
        // Array.prototype is itself an array, in every realm; a plain object's
        // prototype is null or a realm's Object.prototype, whose prototype is null.
        const plain = isArray
          ? Array.isArray(proto)
          : proto === null || Object.getPrototypeOf(proto) === null;
        if (!plain) throw this.fail('not a plain object or array', 'not_json');
        // JSON.stringify calls a `toJSON` method however it is reached (own and hidden, or
        // inherited through a null-prototype chain) and writes what it returns, not what was
        // walked here (review r56a). A `toJSON` key holding data is JSON like any other.
        if (typeof (value as { toJSON?: unknown }).toJSON === 'function') {
          throw this.fail('an object with a toJSON method is not plain JSON', 'not_json');
        }
        if (!(this.frames.length < this.maxDepth)) {
          throw this.fail(`nesting deeper than ${this.maxDepth} levels`, 'depth_exceeded');
        }
        this.add(2);
        this.ancestors.add(value);
        this.frames.push({
          node: value,
          keys: isArray ? undefined : Object.keys(value),
          index: 0,
          written: 0,
        });
        return;
      }
      default:
        throw this.fail(`a ${typeof value} is not JSON`, 'not_json');
    }
  }
}

/**
 * Check an in-memory value is plain JSON (null, boolean, finite number within ±(2^53−1),
 * well-formed string, array, plain object without __proto__/constructor/prototype keys; no
 * undefined inside arrays, no functions, bigint, symbols, cycles, class instances), within
 * depth and compact size. Object properties whose value is `undefined` are skipped (as
 * JSON.stringify does). Returns the compact UTF-8 byte length. Iterative.
 * Throws ContractError: size → 'payload_too_large' reason 'too_large'; everything else
 * 'invalid_input' (reasons `not_json`, `cycle`, `non_finite_number`, `number_out_of_range`,
 * `lone_surrogate`, `forbidden_key`, `depth_exceeded`).
 *
 * Symbol-keyed and non-enumerable properties are ignored, as JSON.stringify ignores them; a
 * `toJSON` method, which JSON.stringify would call, is refused wherever it is found.
 *
 * @example
 * checkJsonValue({ a: [1, 'x'] }, { maxBytes: 1024, path: '$.input.data' }); // 13
 */
export function checkJsonValue(value: unknown, options: JsonValueOptions): number {
  const root = options.path ?? '$';
  try {
    return new ValueChecker(root, options.maxBytes, options.maxDepth ?? JSON_MAX_DEPTH).run(value);
  } catch (error) {
    if (error instanceof ContractError) throw error;
    // A throwing getter or proxy trap: whatever it is, it is not plain JSON.
    throw new ContractError('invalid_input', `${root} could not be read as JSON`, {
      reason: 'not_json',
      path: root,
      cause: error,
    });
  }
}
