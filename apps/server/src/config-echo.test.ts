/**
 * What `loadConfig` prints of a malformed configuration never shows a key or a signing secret
 * (stderr, DESIGN §6). Until 2026-12-05 a key of 16..20 identifier characters pasted where a
 * field name goes was listed as an unknown field (keys are at least 16 characters), and a
 * `…_FILE` variable given the JSON itself quoted it in the read error's message.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from './config.js';

const noFiles = (path: string): string => {
  throw new Error(`ENOENT: no such file, open '${path}'`);
};

function problemsOf(env: Record<string, string>): string[] {
  try {
    loadConfig(env, noFiles);
  } catch (error) {
    if (error instanceof ConfigError) return [...error.problems];
    throw error;
  }
  return [];
}

describe('a key pasted where a field name goes is never shown', () => {
  // Keys the server accepts (>= 16 characters, bearer tokens), e.g. `openssl rand -hex 8`
  // starting with a letter, or a 20-character alphanumeric token.
  const keys = ['a3f09c1d7e5b2c48', 'Zq7RkP2mXw9LtB4c', 'lk_live_Zq7RkP2mXw9L'];

  it.each(keys)('%s is a key loadConfig accepts', (key) => {
    const config = loadConfig(
      {
        LEDGENCE_API_KEYS: JSON.stringify([
          { key, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
        ]),
      },
      noFiles,
    );
    expect(config.apiKeys).toHaveLength(1);
  });

  it.each(keys)('%s written as a map key → binding is not echoed to stderr', (key) => {
    // A common shape mistake: the key as the name of its binding.
    const problems = problemsOf({
      LEDGENCE_API_KEYS: JSON.stringify([
        { [key]: { tenant: 'acme', namespaces: ['*'], roles: ['client'] } },
      ]),
    });
    expect(problems.length).toBeGreaterThan(0);
    expect(problems.join('\n')).not.toContain(key);
  });

  it.each(keys)('%s pasted as a field name beside the others is not echoed', (key) => {
    const problems = problemsOf({
      LEDGENCE_API_KEYS: JSON.stringify([
        { [key]: true, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
      ]),
    });
    expect(problems.length).toBeGreaterThan(0);
    expect(problems.join('\n')).not.toContain(key);
  });
});

describe('a …_FILE variable given the JSON itself instead of a path', () => {
  // A frequent slip: the keys array put in LEDGENCE_API_KEYS_FILE (or the key itself). main.ts
  // reads the file with readFileSync; the failure is printed to stderr (ConfigError).
  const key = 'k_live_3f9a0c1d7e5b2c48a3f09c1d';
  const json = JSON.stringify([{ key, tenant: 'acme', namespaces: ['*'], roles: ['client'] }]);
  const readFile = (path: string) => readFileSync(path, 'utf8');

  it.each([
    ['the keys array', json],
    ['the key alone', key],
  ])('LEDGENCE_API_KEYS_FILE holding %s: the start fails without printing the key', (_, value) => {
    let problems: string[] = [];
    try {
      loadConfig({ LEDGENCE_API_KEYS_FILE: value }, readFile);
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      problems = [...error.problems];
    }
    expect(problems).toEqual([
      value.startsWith('[')
        ? 'LEDGENCE_API_KEYS_FILE names a file that cannot be read (ENOENT): its value looks like the JSON itself, which goes in LEDGENCE_API_KEYS; LEDGENCE_API_KEYS_FILE takes a path'
        : 'LEDGENCE_API_KEYS_FILE names a file that cannot be read (ENOENT)',
    ]);
  });
});

describe('LEDGENCE_CALLBACK_DESTINATIONS_FILE given the JSON itself instead of a path', () => {
  it('the start fails without printing the signing secret', () => {
    const secret = `whsec_${Buffer.alloc(32, 9).toString('base64')}`;
    const value = JSON.stringify({ billing: { url: 'https://billing.example/hook', secret } });
    let problems: string[] = [];
    try {
      loadConfig({ LEDGENCE_CALLBACK_DESTINATIONS_FILE: value }, (path) =>
        readFileSync(path, 'utf8'),
      );
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      problems = [...error.problems];
    }
    expect(problems.some((p) => p.startsWith('LEDGENCE_CALLBACK_DESTINATIONS_FILE'))).toBe(true);
    expect(problems.join('\n')).not.toContain(secret);
    expect(problems.join('\n')).not.toContain(secret.slice('whsec_'.length));
  });
});
