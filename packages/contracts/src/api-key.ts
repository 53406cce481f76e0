/**
 * What an API key can be, for both ends of `Authorization: Bearer <key>`: the server refuses to
 * configure a key outside this form, and the SDK refuses to send one, because such a key could
 * never authenticate — the server's header parser would not match it, `node:http` would refuse
 * to send it, or `fetch` would silently trim it.
 */

/** Longest API key the server accepts, configured or presented. */
export const API_KEY_MAX_CHARS = 4096;

/**
 * An RFC 6750 b64token: letters, digits and `- . _ ~ + /`, optionally ending in `=`. The spaces
 * a header may hold around it are not part of it (Node trims them from a header value), so a key
 * holding them never matches.
 */
export const BEARER_TOKEN_PATTERN: RegExp = /^[A-Za-z0-9\-._~+/]+=*$/;

/**
 * Why `key` cannot be an API key, or `undefined` if it can: a sentence naming the first offending
 * character and where it is, phrased for the one who passed the key in (`apiKey ...`).
 *
 * @example
 * ```ts
 * apiKeyProblem('k_live_1\n'); // → 'apiKey contains a line break (at character 9 of 9); trim it: …'
 * apiKeyProblem('k_live_1');   // → undefined
 * ```
 */
export function apiKeyProblem(key: unknown): string | undefined {
  if (typeof key !== 'string') return 'apiKey must be a string';
  // An empty key is most often an unset variable read as '' (`process.env.KEY ?? ''`): sent, it
  // is `Bearer ` — a 401 in every call, or in development mode a key that hides the mistake.
  if (key.length === 0) {
    return 'apiKey is empty; pass the key, or leave apiKey out for a server in development mode';
  }
  if (key.length > API_KEY_MAX_CHARS) {
    return `apiKey is ${key.length} characters long, over the ${API_KEY_MAX_CHARS} a key can have; check that the right value is passed as the key`;
  }
  if (BEARER_TOKEN_PATTERN.test(key)) return undefined;
  const at = firstNonTokenChar(key);
  const where = `at character ${at + 1} of ${key.length}`;
  const char = key[at] as string;
  if (char === '\n' || char === '\r') {
    return `apiKey contains a line break (${where}); trim it: a key read from a file often ends with one`;
  }
  if (/\s/.test(char)) {
    return `apiKey contains whitespace (${where}); trim it: an API key is a single token`;
  }
  if (char < ' ' || char === '\x7f') {
    return `apiKey contains a control character (${where}); remove it`;
  }
  if (char > '\x7f') {
    return `apiKey contains a character that is not printable ASCII (${where}); check that the right value is passed as the key`;
  }
  return `apiKey contains ${JSON.stringify(char)} (${where}), which no API key holds (letters, digits and - . _ ~ + /, optionally ending in =); check that the right value is passed as the key`;
}

/** Index of the first character that breaks the b64token form (an `=` counts only before the end's run). */
function firstNonTokenChar(key: string): number {
  const body = key.replace(/=+$/, '');
  const bad = body.search(/[^A-Za-z0-9\-._~+/]/);
  return Math.max(bad, 0);
}
