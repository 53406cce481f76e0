/**
 * A batch body's items decoded one by one, for a body that is well-formed JSON but breaks a
 * strict-JSON value rule inside one item (a duplicate key, a number beyond ±(2^53−1), a lone
 * surrogate, a forbidden key, nesting too deep). DESIGN §6: "each item is validated and answered
 * on its own (an item's error does not fail its neighbours)" — so such an item is that item's
 * problem, as a schema error in it already is, while the body's own shape (`{"commands": [...]}`,
 * syntax, size, encoding) still fails the request as a whole.
 *
 * Only the failure path pays for this: a body that decodes whole never comes here.
 */
import { ContractError } from './errors.js';
import { decodeStrictJson, type JsonInput } from './json.js';

/** The strict-JSON rules that well-formed JSON text can still break. */
const VALUE_RULES: ReadonlySet<string> = new Set([
  'depth_exceeded',
  'forbidden_key',
  'duplicate_key',
  'lone_surrogate',
  'number_out_of_range',
]);

const ITEM_PATH = /^\$\.commands\[(\d+)\]/;

/** One item's text that broke a strict-JSON rule on its own. */
export class ItemDecodeFailure {
  constructor(readonly error: ContractError) {}
}

/**
 * Each item of a batch body decoded alone (its strict-JSON failure as an
 * {@link ItemDecodeFailure}), when `failure` — the whole body's — is a value rule broken inside
 * `commands[i]`; `undefined` when the failure is the request's (the caller rethrows it).
 *
 * @param maxDepth - the whole body's depth limit; an item gets it less the envelope's two levels.
 */
export function itemsDecodedAlone(
  body: JsonInput,
  failure: unknown,
  options: { maxBytes: number; maxDepth: number },
): unknown[] | undefined {
  if (!(failure instanceof ContractError)) return undefined;
  if (!VALUE_RULES.has(failure.reason ?? '') || !ITEM_PATH.test(failure.path ?? '')) {
    return undefined;
  }
  const text = bodyText(body);
  const spans = text === undefined ? undefined : commandSpans(text);
  if (spans === undefined) return undefined;
  return spans.map((span, index) => {
    try {
      return decodeStrictJson(span, {
        maxBytes: options.maxBytes,
        maxDepth: options.maxDepth - 2,
      });
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
      return new ItemDecodeFailure(atItem(error, index));
    }
  });
}

/** The error of an item decoded alone, its path (and the path in its message) under the batch's. */
function atItem(error: ContractError, index: number): ContractError {
  const inner = error.path ?? '$';
  const path = `$.commands[${index}]${inner.slice(1)}`;
  return new ContractError(error.code, error.message.replace(inner, path), {
    reason: error.reason,
    path,
  });
}

const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true });

function bodyText(body: JsonInput): string | undefined {
  if (typeof body === 'string') return body;
  try {
    return STRICT_UTF8.decode(body instanceof ArrayBuffer ? new Uint8Array(body) : body);
  } catch {
    return undefined;
  }
}

/**
 * The texts of the elements of `{"commands": [...]}`, or `undefined` when `text` is not JSON
 * syntax of exactly that shape. `JSON.parse` checks the syntax first (it accepts what only the
 * strict rules refuse), so the scan below only has to find where each element ends.
 */
function commandSpans(text: string): string[] | undefined {
  try {
    JSON.parse(text);
  } catch {
    return undefined; // not JSON syntax (or too deep for the engine): the request's failure
  }
  let at = skipSpace(text, 0);
  if (text[at] !== '{') return undefined;
  at = skipSpace(text, at + 1);
  const keyEnd = valueEnd(text, at);
  if (text[at] !== '"' || JSON.parse(text.slice(at, keyEnd)) !== 'commands') return undefined;
  at = skipSpace(text, keyEnd);
  if (text[at] !== ':') return undefined;
  at = skipSpace(text, at + 1);
  if (text[at] !== '[') return undefined;
  at = skipSpace(text, at + 1);
  const spans: string[] = [];
  while (text[at] !== ']') {
    const end = valueEnd(text, at);
    spans.push(text.slice(at, end));
    at = skipSpace(text, end);
    if (text[at] === ',') at = skipSpace(text, at + 1);
  }
  at = skipSpace(text, at + 1);
  if (text[at] !== '}' || skipSpace(text, at + 1) !== text.length) return undefined;
  return spans;
}

/** JSON's insignificant whitespace: space, tab, line feed, carriage return. */
function skipSpace(text: string, from: number): number {
  let at = from;
  while (at < text.length && ' \t\n\r'.includes(text[at] as string)) at += 1;
  return at;
}

/** Where the JSON value starting at `from` ends (in syntactically valid text). */
function valueEnd(text: string, from: number): number {
  let depth = 0;
  for (let at = from; at < text.length; at += 1) {
    const char = text[at];
    if (char === '"') {
      at += 1;
      while (text[at] !== '"') at += text[at] === '\\' ? 2 : 1;
      if (depth === 0) return at + 1;
    } else if (char === '{' || char === '[') {
      depth += 1;
    } else if (char === '}' || char === ']') {
      depth -= 1;
      if (depth === 0) return at + 1;
      if (depth < 0) return at;
    } else if (depth === 0 && (char === ',' || ' \t\n\r'.includes(char as string))) {
      return at;
    }
  }
  return text.length;
}

const ENCODER = new TextEncoder();

/**
 * Whether a batch body holds a list of more than `maxItems` values at its first two levels —
 * where a well-formed body has only its `commands` array — found by a scan of the bytes that
 * stops at the first such list. Decoding a 16 MiB body of ~8 million tiny items took seconds of
 * the server's event loop (every other request, renewals included, waiting) before the
 * envelope's count refused it; this scan refuses it after 1 001 items. Strings are skipped
 * whole (an escaped quote is one preceded by an odd run of backslashes), so a `,` or bracket
 * inside one does not count; multi-byte UTF-8 never holds these ASCII bytes. Any text that is
 * not JSON is left to the decoder, which reports it; a body over `maxBytes` too.
 */
export function batchListTooLong(body: JsonInput, maxItems: number, maxBytes: number): boolean {
  const bytes =
    typeof body === 'string'
      ? ENCODER.encode(body)
      : body instanceof Uint8Array
        ? body
        : ArrayBuffer.isView(body)
          ? new Uint8Array(body.buffer, body.byteOffset, body.byteLength)
          : new Uint8Array(body as ArrayBuffer);
  if (bytes.byteLength > maxBytes) return false;
  // Commas of the open containers at depths 1 and 2 (index 0 unused).
  const commas = [0, 0, 0];
  let depth = 0;
  for (let i = 0; i < bytes.length; i++) {
    const c = bytes[i];
    if (c === 0x22) {
      let from = i + 1;
      for (;;) {
        const quote = bytes.indexOf(0x22, from);
        if (quote < 0) return false;
        let run = 0;
        while (quote - run - 1 > i && bytes[quote - run - 1] === 0x5c) run++;
        if (run % 2 === 0) {
          i = quote;
          break;
        }
        from = quote + 1;
      }
    } else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth <= 2) commas[depth] = 0;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    } else if (c === 0x2c && depth >= 1 && depth <= 2) {
      if (++(commas[depth] as number) >= maxItems) return true;
    }
  }
  return false;
}
