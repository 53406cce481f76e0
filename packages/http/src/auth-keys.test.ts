/**
 * API key rules: a configured key is accepted only when some
 * `Authorization: Bearer <key>` header could present it.
 */
import { apiKeyProblem } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { type ApiKeyConfig, apiKeyProblems, createAuthenticator } from './auth.js';

const KEY = 'lgk_keys_0123456789abcdef';

function entry(key: string): ApiKeyConfig {
  return { key, tenant: 'acme', namespaces: ['*'], roles: ['admin'] };
}

describe('a configured key with spaces around it', () => {
  it.each([
    ['a trailing space', `${KEY} `],
    ['a leading space', ` ${KEY}`],
    ['spaces on both sides', `  ${KEY}  `],
  ])('is refused, naming the field and not the key: %s', (_, key) => {
    const problems = apiKeyProblems(entry(key));
    expect(problems.map((p) => p.field)).toEqual(['key']);
    expect(JSON.stringify(problems)).not.toContain(KEY);
    expect(() => createAuthenticator({ keys: [entry(key)] })).toThrow(/auth\.keys\[0\]\.key/);
  });

  it('holds for every accepted key: some Authorization header presents it', () => {
    // Node trims a header value's surrounding whitespace, and the scheme's spaces are not part
    // of the token: a key with spaces around it would be accepted and never authenticate.
    for (const key of [KEY, `${KEY}==`, 'a.b-c_d~e+f/g', `${KEY} `, ` ${KEY}`, `\t${KEY}`]) {
      if (apiKeyProblems(entry(key)).length > 0) continue;
      const auth = createAuthenticator({ keys: [entry(key)] });
      const sent = [`Bearer ${key}`, `Bearer ${key}`.trim(), `bearer ${key.trim()}`];
      expect({ key, authenticates: sent.some((h) => auth.authenticate(h.trim()).ok) }).toEqual({
        key,
        authenticates: true,
      });
    }
  });
});

describe('the SDK and the server agree on what an API key is', () => {
  it('accepts for configuration exactly the keys the SDK agrees to send', () => {
    // The SDK refuses at construction what the server could never hold (contracts' apiKeyProblem);
    // a key one side takes and the other refuses would be a 401 on every call.
    const printable = Array.from({ length: 0x7f - 0x20 }, (_, i) => String.fromCharCode(0x20 + i));
    const candidates = [
      '',
      'x'.repeat(4096),
      'x'.repeat(4097),
      `${KEY}==`,
      `${KEY}=x`,
      `${KEY}\n`,
      'kéy',
      ...printable.map((char) => `k${char}y`),
    ];
    for (const key of candidates) {
      expect({ key, sdk: apiKeyProblem(key) === undefined }).toEqual({
        key,
        sdk: apiKeyProblems(entry(key)).length === 0,
      });
    }
  });
});
