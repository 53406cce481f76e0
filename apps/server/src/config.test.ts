import {
  COMPLETION_LEASE_MS,
  COMPLETION_MAX_RETRY_DELAY_MS,
  COMPLETION_RETRY_BASE_MS,
  DEFAULT_TIMEOUT_MS,
  MAX_RETENTION_MS,
  MIN_RETENTION_MS,
} from '@ledgence/contracts';
import { createHttpApp } from '@ledgence/http';
import { describe, expect, it } from 'vitest';
import {
  CONFIG_VARIABLES,
  ConfigError,
  isLoopbackHost,
  loadConfig,
  misspelledVariables,
  type ServerConfig,
} from './config.js';

const noFiles = (path: string): string => {
  throw new Error(`ENOENT: no such file, open '${path}'`);
};
const KEYS = JSON.stringify([
  { key: 'k'.repeat(32), tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
]);

function problemsOf(env: Record<string, string>, readFile = noFiles): string[] {
  try {
    loadConfig(env, readFile);
  } catch (error) {
    if (error instanceof ConfigError) return [...error.problems];
    throw error;
  }
  return [];
}

describe('loadConfig', () => {
  it('runs with no configuration at all: embedded database, loopback, development mode', () => {
    const config = loadConfig({}, noFiles);
    expect(config).toMatchObject({
      databaseUrl: undefined,
      dataDir: '.ledgence/pg',
      dbPoolSize: 10,
      host: '127.0.0.1',
      port: 8080,
      apiKeys: [],
      logLevel: 'info',
      leaseDurationMs: 30_000,
      renewIntervalMs: 10_000,
      longPollWaitMs: 20_000,
      shutdownTimeoutMs: 10_000,
      failpoints: [],
    });
  });

  it('reads every setting', () => {
    const config = loadConfig(
      {
        DATABASE_URL: 'postgres://u@db:5432/ledgence',
        LEDGENCE_DATA_DIR: '/var/lib/ledgence',
        LEDGENCE_DB_POOL_SIZE: '3',
        HOST: '0.0.0.0',
        PORT: '9000',
        LEDGENCE_API_KEYS: KEYS,
        LEDGENCE_LOG_LEVEL: 'debug',
        LEDGENCE_TERMINAL_RETENTION_MS: '7200000',
        LEDGENCE_COMPLETION_RETRY_BASE_MS: '20',
        LEDGENCE_RETENTION_INTERVAL_MS: '500',
        LEDGENCE_LEASE_DURATION_MS: '1000',
        LEDGENCE_RENEW_INTERVAL_MS: '300',
        LEDGENCE_CLEANUP_GRACE_MS: '500',
        LEDGENCE_LEASE_SAFETY_MARGIN_MS: '100',
        LEDGENCE_SESSION_VALIDITY_MS: '5000',
        LEDGENCE_LONG_POLL_WAIT_MS: '2000',
        LEDGENCE_RESCAN_INTERVAL_MS: '50',
        LEDGENCE_MAINTENANCE_INTERVAL_MS: '200',
        LEDGENCE_SHUTDOWN_TIMEOUT_MS: '3000',
        LEDGENCE_FAILPOINTS: 'settle.after_commit=crash, submit.before_commit=error*2',
      },
      noFiles,
    );
    expect(config.callbackDestinations.size).toBe(0);
    expect({ ...config, callbackDestinations: undefined }).toEqual({
      callbackDestinations: undefined,
      terminalRetentionMs: 7_200_000,
      completionRetryBaseMs: 20,
      retentionIntervalMs: 500,
      completionLeaseMs: 30_000,
      databaseUrl: 'postgres://u@db:5432/ledgence',
      dataDir: '/var/lib/ledgence',
      dbPoolSize: 3,
      host: '0.0.0.0',
      port: 9000,
      apiKeys: JSON.parse(KEYS),
      logLevel: 'debug',
      leaseDurationMs: 1000,
      renewIntervalMs: 300,
      cleanupGraceMs: 500,
      leaseSafetyMarginMs: 100,
      sessionValidityMs: 5000,
      longPollWaitMs: 2000,
      rescanIntervalMs: 50,
      maintenanceIntervalMs: 200,
      shutdownTimeoutMs: 3000,
      failpoints: [
        { name: 'settle.after_commit', action: 'crash', count: undefined },
        { name: 'submit.before_commit', action: 'error', count: 2 },
      ],
    });
  });

  it('refuses to start with an unknown failpoint, naming the variable and the known points', () => {
    const [problem] = problemsOf({ LEDGENCE_FAILPOINTS: 'settle.after_comit=crash' });
    expect(problem).toMatch(
      /^LEDGENCE_FAILPOINTS \(test only\): unknown failpoint "settle\.after_comit"/,
    );
    expect(problem).toContain('settle.after_commit');
  });

  it('reads callback destinations, inline or from a file, without keeping the secret in sight', () => {
    const secret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
    const document = JSON.stringify({
      billing: { url: 'https://billing.internal/hooks', secret, timeout_ms: 2000 },
    });
    const inline = loadConfig({ LEDGENCE_CALLBACK_DESTINATIONS: document }, noFiles);
    expect(inline.callbackDestinations.get('billing')?.url).toBe('https://billing.internal/hooks');
    expect(JSON.stringify([...inline.callbackDestinations.values()])).not.toContain(secret);
    const fromFile = loadConfig(
      { LEDGENCE_CALLBACK_DESTINATIONS_FILE: '/etc/d.json' },
      () => document,
    );
    expect(fromFile.callbackDestinations.get('billing')?.timeoutMs).toBe(2000);
    expect(loadConfig({}, noFiles).terminalRetentionMs).toBe(7 * 24 * 3_600_000);
    expect(loadConfig({}, noFiles).completionRetryBaseMs).toBe(COMPLETION_RETRY_BASE_MS);
  });

  it('reads the delivery lease, bounded', () => {
    expect(loadConfig({}, noFiles).completionLeaseMs).toBe(COMPLETION_LEASE_MS);
    const lease = (value: string) => ({ LEDGENCE_COMPLETION_LEASE_MS: value });
    expect(loadConfig(lease('100'), noFiles).completionLeaseMs).toBe(100);
    expect(problemsOf(lease('99')).join()).toContain('LEDGENCE_COMPLETION_LEASE_MS');
  });

  it('bounds the database pool size from 1 to 1 000 connections', () => {
    const pool = (value: string) => ({ LEDGENCE_DB_POOL_SIZE: value });
    expect(loadConfig(pool('1'), noFiles).dbPoolSize).toBe(1);
    expect(loadConfig(pool('1000'), noFiles).dbPoolSize).toBe(1_000);
    for (const bad of ['0', '1001', 'ten']) {
      expect(problemsOf(pool(bad))).toEqual([
        `LEDGENCE_DB_POOL_SIZE must be a whole number from 1 to 1000 (got "${bad}")`,
      ]);
    }
  });

  it('bounds the lease safety margin so that the default timeout_ms (5 min) is still accepted', () => {
    const margin = (value: string) => ({ LEDGENCE_LEASE_SAFETY_MARGIN_MS: value });
    expect(loadConfig(margin('299500'), noFiles).leaseSafetyMarginMs).toBe(299_500);
    expect(problemsOf(margin('299501'))).toEqual([
      'LEDGENCE_LEASE_SAFETY_MARGIN_MS must be a whole number from 0 to 299500 (got "299501")',
    ]);
  });

  it('bounds the callback retry base and the retention policy at their edges', () => {
    const base = (value: number) => ({ LEDGENCE_COMPLETION_RETRY_BASE_MS: String(value) });
    expect(loadConfig(base(1), noFiles).completionRetryBaseMs).toBe(1);
    expect(loadConfig(base(COMPLETION_MAX_RETRY_DELAY_MS), noFiles).completionRetryBaseMs).toBe(
      COMPLETION_MAX_RETRY_DELAY_MS,
    );
    expect(problemsOf(base(0)).join()).toContain('LEDGENCE_COMPLETION_RETRY_BASE_MS');
    expect(problemsOf(base(COMPLETION_MAX_RETRY_DELAY_MS + 1)).join()).toContain(
      'LEDGENCE_COMPLETION_RETRY_BASE_MS',
    );
    const retention = (value: number) => ({ LEDGENCE_TERMINAL_RETENTION_MS: String(value) });
    expect(loadConfig(retention(MIN_RETENTION_MS), noFiles).terminalRetentionMs).toBe(
      MIN_RETENTION_MS,
    );
    expect(loadConfig(retention(MAX_RETENTION_MS), noFiles).terminalRetentionMs).toBe(
      MAX_RETENTION_MS,
    );
    expect(problemsOf(retention(MIN_RETENTION_MS - 1)).join()).toContain(
      'LEDGENCE_TERMINAL_RETENTION_MS',
    );
    expect(problemsOf(retention(MAX_RETENTION_MS + 1)).join()).toContain(
      'LEDGENCE_TERMINAL_RETENTION_MS',
    );
  });

  it('reports bad callback destinations and retention with the other problems, never the secret', () => {
    const secret = 'whsec_c2hvcnQ=';
    const problems = problemsOf({
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({ billing: { url: 'ftp://x', secret } }),
      LEDGENCE_TERMINAL_RETENTION_MS: '1000',
      PORT: 'x',
    });
    expect(problems.some((p) => p.includes('LEDGENCE_TERMINAL_RETENTION_MS'))).toBe(true);
    expect(problems.some((p) => p.includes('PORT'))).toBe(true);
    expect(problems.some((p) => p.includes('billing') && p.includes('url'))).toBe(true);
    expect(problems.some((p) => p.includes('billing') && p.includes('secret'))).toBe(true);
    expect(problems.join('\n')).not.toContain(secret);
  });

  it('reads keys from a file', () => {
    const config = loadConfig({ LEDGENCE_API_KEYS_FILE: '/etc/keys.json' }, (path) => {
      expect(path).toBe('/etc/keys.json');
      return KEYS;
    });
    expect(config.apiKeys).toHaveLength(1);
  });

  it.each([
    [{ PORT: '80a' }, 'PORT must be a whole number from 0 to 65535'],
    [{ PORT: '70000' }, 'PORT must be a whole number from 0 to 65535'],
    [{ PORT: '-1' }, 'PORT must be a whole number'],
    [{ LEDGENCE_LEASE_DURATION_MS: '1.5' }, 'LEDGENCE_LEASE_DURATION_MS must be a whole number'],
    [{ LEDGENCE_LOG_LEVEL: 'loud' }, 'LEDGENCE_LOG_LEVEL must be one of'],
    [{ DATABASE_URL: 'mysql://x' }, 'DATABASE_URL must be a postgres://'],
    [{ HOST: '0.0.0.0' }, 'HOST=0.0.0.0 would expose a server without API keys'],
    [{ LEDGENCE_API_KEYS: 'not json' }, 'LEDGENCE_API_KEYS is not valid JSON'],
    // A well-formed array of the wrong shape is another message: an unclosed one is not JSON.
    [
      { LEDGENCE_API_KEYS: '[{"key":"k_0123456789abcdef","tenant":"a","roles":["client"]}' },
      'LEDGENCE_API_KEYS is not valid JSON: check its brackets',
    ],
    [{ LEDGENCE_API_KEYS: '{}' }, 'LEDGENCE_API_KEYS must be a JSON array of keys'],
    [{ LEDGENCE_API_KEYS: '[1]' }, 'LEDGENCE_API_KEYS[0] must be an object'],
    [
      { LEDGENCE_API_KEYS: '[{"key":"short","tenant":"a","namespaces":["*"],"roles":["client"]}]' },
      'LEDGENCE_API_KEYS[0].key must be at least 16 characters',
    ],
    [
      {
        LEDGENCE_API_KEYS: `[{"key":"${'k'.repeat(20)}","tenant":"a","namespaces":[],"roles":["client"]}]`,
      },
      'LEDGENCE_API_KEYS[0].namespaces must be a non-empty array',
    ],
    [
      {
        LEDGENCE_API_KEYS: `[{"key":"${'k'.repeat(20)}","tenant":"a","namespaces":["*"],"roles":["root"]}]`,
      },
      'LEDGENCE_API_KEYS[0].roles[0] must be one of client, worker, admin',
    ],
    [
      {
        LEDGENCE_API_KEYS: `[{"key":"${'k'.repeat(20)}","tenant":"a","namespaces":["*"],"roles":["client"],"x":1}]`,
      },
      'LEDGENCE_API_KEYS[0] has unknown fields: x',
    ],
    [{ LEDGENCE_API_KEYS: KEYS, LEDGENCE_API_KEYS_FILE: '/k' }, 'not both'],
    [
      { LEDGENCE_API_KEYS_FILE: '/missing.json' },
      'LEDGENCE_API_KEYS_FILE names a file that cannot be read',
    ],
    [
      { LEDGENCE_LEASE_DURATION_MS: '1000', LEDGENCE_RENEW_INTERVAL_MS: '600' },
      'LEDGENCE_RENEW_INTERVAL_MS (600) must be at most half of LEDGENCE_LEASE_DURATION_MS (1000)',
    ],
  ])('rejects %j naming the variable', (env, message) => {
    const problems = problemsOf(env as Record<string, string>);
    expect(problems.some((p) => p.includes(message))).toBe(true);
  });

  it('reports every problem at once', () => {
    expect(problemsOf({ PORT: 'x', LEDGENCE_LOG_LEVEL: 'y', HOST: '10.0.0.1' })).toHaveLength(3);
  });

  it('never echoes a key in a problem', () => {
    const secret = 'super-secret-value-12345';
    const problems = problemsOf({
      LEDGENCE_API_KEYS: `[{"key":"${secret}","tenant":"","namespaces":["*"],"roles":["client"]}] trailing`,
    });
    expect(problems.length).toBeGreaterThan(0);
    expect(problems.join('\n')).not.toContain(secret);
  });

  it('never echoes a key pasted where a field name goes, and still lists a mistyped field', () => {
    const secret = 'lgk_live_0123456789abcdefghij';
    const problems = problemsOf({
      LEDGENCE_API_KEYS: `[{"key":"${'k'.repeat(20)}","tenant":"a","namespaces":["*"],"roles":["client"],"namespace":["x"],"${secret}":1}]`,
    });
    expect(problems).toContain(
      'LEDGENCE_API_KEYS[0] has unknown fields: namespace, 1 not shown (not field names: a key out of place?)',
    );
    expect(problems.join('\n')).not.toContain(secret);
  });

  it('reads a …_FILE saved with a UTF-8 byte order mark', () => {
    const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
    const config = loadConfig(
      {
        LEDGENCE_API_KEYS_FILE: '/etc/keys.json',
        LEDGENCE_CALLBACK_DESTINATIONS_FILE: '/etc/d.json',
      },
      (path) =>
        `\uFEFF${path === '/etc/keys.json' ? KEYS : JSON.stringify({ billing: { url: 'https://billing.example/hook', secret: SECRET } })}`,
    );
    expect(config.apiKeys).toHaveLength(1);
    expect(config.callbackDestinations.get('billing')?.url).toBe('https://billing.example/hook');
  });
});

describe('API keys loadConfig accepts are keys the HTTP app accepts', () => {
  const key = 'k'.repeat(24);
  it.each([
    ['a key with a space (not a bearer token)', { key: 'my secret api key 1234', tenant: 'acme' }],
    ['a key ending in a newline', { key: `${key}\n`, tenant: 'acme' }],
    ['a tenant with a trailing space', { key, tenant: 'acme ' }],
    ['a tenant longer than 128 bytes', { key, tenant: 't'.repeat(200) }],
    ['a tenant with a control character', { key, tenant: 'ac\u0001me' }],
    ['"*" beside a named namespace', { key, tenant: 'acme', namespaces: ['*', 'dev'] }],
    ['a namespace with leading whitespace', { key, tenant: 'acme', namespaces: [' dev'] }],
  ])('%s: rejected naming LEDGENCE_API_KEYS[0], or accepted by the app', (_, entry) => {
    const setting = { namespaces: ['*'], roles: ['client'], ...entry };
    const env = { LEDGENCE_API_KEYS: JSON.stringify([setting]) };
    const problems = problemsOf(env);
    if (problems.length > 0) {
      expect(problems.some((p) => p.startsWith('LEDGENCE_API_KEYS[0].'))).toBe(true);
      expect(problems.join('\n')).not.toContain(setting.key.trim());
      return;
    }
    // Accepted: what startServer then does with config.apiKeys (server.ts → createHttpApp). A
    // key the app refuses would stop the start after the embedded database started, naming
    // `auth.keys[0]` rather than the variable.
    const { apiKeys } = loadConfig(env, noFiles);
    expect(() => createHttpApp({ service: {} as never, auth: { keys: apiKeys } })).not.toThrow();
  });

  it('reports every problem of every key at once, naming the file variable it came from', () => {
    const keys = JSON.stringify([
      { key: `${key} x`, tenant: 'acme ', namespaces: ['*', 'dev'], roles: ['client'] },
      { key, tenant: 'acme', namespaces: ['dev', '\u0000'], roles: ['root'] },
    ]);
    const problems = problemsOf({ LEDGENCE_API_KEYS_FILE: '/etc/keys.json' }, () => keys);
    expect(problems.map((p) => p.split(' ')[0])).toEqual([
      'LEDGENCE_API_KEYS_FILE[0].key',
      'LEDGENCE_API_KEYS_FILE[0].tenant',
      'LEDGENCE_API_KEYS_FILE[0].namespaces',
      'LEDGENCE_API_KEYS_FILE[1].namespaces[1]',
      'LEDGENCE_API_KEYS_FILE[1].roles[0]',
    ]);
    expect(problems.join('\n')).not.toContain(key);
  });
});

describe('DATABASE_URL', () => {
  it.each([
    ['a port above 65535', 'postgres://ledgence:pw@127.0.0.1:99999/ledgence', 'port'],
    ['port 0', 'postgres://ledgence:pw@127.0.0.1:0/ledgence', 'port'],
    [
      'a port out of range among several hosts',
      'postgres://ledgence:pw@h1:5432,h2:70000/db',
      'port',
    ],
    [
      'a malformed escape in the password',
      'postgres://ledgence:p%zzw@127.0.0.1:5432/db',
      'password',
    ],
    ['a malformed escape in the user name', 'postgres://led%gence:pw@127.0.0.1:5432/db', 'user'],
    ['a malformed escape in the database name', 'postgres://ledgence:pw@127.0.0.1/d%b', 'database'],
    ['a malformed escape in the host', 'postgres://ledgence:pw@db%/ledgence', 'valid URL'],
    ['a host that is no host', 'postgres://ledgence:pw@a b/ledgence', 'valid URL'],
    // postgres.js would read `x,y@127.0.0.1` as hosts and name `y@127.0.0.1` in its errors.
    ['an unencoded @ in the password', 'postgres://ledgence:pw@x,y@127.0.0.1:5432/db', '%40'],
    ['an unencoded @ in the user name', 'postgres://pw@corp:secret@127.0.0.1/db', '%40'],
  ])('%s is one problem naming DATABASE_URL, never echoing the URL', (_, url, what) => {
    // Unchecked, these started the server and failed later with "Invalid URL"/"URI malformed".
    const problems = problemsOf({ DATABASE_URL: url });
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatch(/^DATABASE_URL /);
    expect(problems[0]).toContain(what);
    expect(problems[0]).not.toContain('pw');
    expect(problems[0]).not.toContain('127.0.0.1');
  });

  it.each([
    'postgres://ledgence:p%40ss@127.0.0.1:5432/ledgence',
    'postgresql://127.0.0.1/ledgence?sslmode=require',
    'postgres://u@[::1]:5432/db',
    'postgres://u:pw@h1:5432,h2:5433/db',
  ])('accepts %s', (url) => {
    expect(loadConfig({ DATABASE_URL: url }, noFiles).databaseUrl).toBe(url);
  });
});

describe('HOST', () => {
  it('takes a bracketed IPv6 literal as the address listen() understands', () => {
    // `[::1]` passed to listen() is a host name to resolve: ENOTFOUND, after migrating.
    expect(loadConfig({ HOST: '[::1]' }, noFiles).host).toBe('::1');
    expect(loadConfig({ HOST: '[::]', LEDGENCE_API_KEYS: KEYS }, noFiles).host).toBe('::');
    expect(problemsOf({ HOST: '[::]' })[0]).toContain('would expose a server without API keys');
  });

  it('beside keys that were given but refused, names only the keys to fix (found by review r45b)', () => {
    const problems = problemsOf({
      HOST: '0.0.0.0',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: 'too-short', tenant: 'acme', namespaces: ['*'], roles: ['client'] },
      ]),
    });
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatch(/^LEDGENCE_API_KEYS\[0\]\.key /);
  });
});

describe('an empty key list', () => {
  it('is refused, from the variable or the file, rather than starting in development mode', () => {
    for (const [env, variable] of [
      [{ LEDGENCE_API_KEYS: '[]' }, 'LEDGENCE_API_KEYS'],
      [{ LEDGENCE_API_KEYS_FILE: '/keys.json' }, 'LEDGENCE_API_KEYS_FILE'],
    ] as const) {
      expect(problemsOf(env, () => ' [ ]\n')).toEqual([
        `${variable} holds no keys: add one, or unset ${variable} to run in development mode (no keys, loopback only)`,
      ]);
    }
  });
});

describe('LEDGENCE_RENEW_INTERVAL_MS', () => {
  it('follows a lease shortened alone: a third of it', () => {
    // The 10 s default was checked against a 15 s lease, refusing a variable never set.
    const config = loadConfig({ LEDGENCE_LEASE_DURATION_MS: '15000' }, noFiles);
    expect(config.renewIntervalMs).toBe(5_000);
    expect(loadConfig({ LEDGENCE_LEASE_DURATION_MS: '100' }, noFiles).renewIntervalMs).toBe(33);
    expect(loadConfig({ LEDGENCE_LEASE_DURATION_MS: '600000' }, noFiles).renewIntervalMs).toBe(
      10_000,
    );
  });

  it('refuses only a value set too long for the lease, naming what was set', () => {
    expect(problemsOf({ LEDGENCE_RENEW_INTERVAL_MS: '20000' })).toEqual([
      'LEDGENCE_RENEW_INTERVAL_MS (20000) must be at most half of the lease (30000, the default of LEDGENCE_LEASE_DURATION_MS), so one lost renewal does not lose the lease; unset it to use a third of the lease',
    ]);
    expect(
      problemsOf({ LEDGENCE_LEASE_DURATION_MS: '15000', LEDGENCE_RENEW_INTERVAL_MS: '7500' }),
    ).toEqual([]);
  });
});

describe('isLoopbackHost', () => {
  it('accepts loopback names and addresses only', () => {
    for (const host of ['127.0.0.1', '127.1.2.3', 'localhost', '::1']) {
      expect(isLoopbackHost(host)).toBe(true);
    }
    for (const host of ['0.0.0.0', '10.0.0.1', '::', 'example.com']) {
      expect(isLoopbackHost(host)).toBe(false);
    }
  });
});

const HOUR = 3_600_000;
/** Every whole-number variable: its setting and the range `loadConfig` enforces. */
const RANGES: [variable: string, setting: keyof ServerConfig, min: number, max: number][] = [
  ['PORT', 'port', 0, 65_535],
  ['LEDGENCE_DB_POOL_SIZE', 'dbPoolSize', 1, 1_000],
  ['LEDGENCE_TERMINAL_RETENTION_MS', 'terminalRetentionMs', MIN_RETENTION_MS, MAX_RETENTION_MS],
  ['LEDGENCE_COMPLETION_RETRY_BASE_MS', 'completionRetryBaseMs', 1, COMPLETION_MAX_RETRY_DELAY_MS],
  ['LEDGENCE_COMPLETION_LEASE_MS', 'completionLeaseMs', 100, HOUR],
  ['LEDGENCE_RETENTION_INTERVAL_MS', 'retentionIntervalMs', 10, 24 * HOUR],
  ['LEDGENCE_LEASE_DURATION_MS', 'leaseDurationMs', 100, HOUR],
  ['LEDGENCE_CLEANUP_GRACE_MS', 'cleanupGraceMs', 0, HOUR],
  ['LEDGENCE_LEASE_SAFETY_MARGIN_MS', 'leaseSafetyMarginMs', 0, DEFAULT_TIMEOUT_MS - 500],
  ['LEDGENCE_SESSION_VALIDITY_MS', 'sessionValidityMs', 1_000, 24 * HOUR],
  ['LEDGENCE_LONG_POLL_WAIT_MS', 'longPollWaitMs', 0, 300_000],
  ['LEDGENCE_RESCAN_INTERVAL_MS', 'rescanIntervalMs', 10, HOUR],
  ['LEDGENCE_MAINTENANCE_INTERVAL_MS', 'maintenanceIntervalMs', 10, HOUR],
  ['LEDGENCE_SHUTDOWN_TIMEOUT_MS', 'shutdownTimeoutMs', 100, 300_000],
];

describe('every whole-number variable at the edges of its range (review r45b)', () => {
  it.each(RANGES)(
    '%s: min and max accepted, one past either refused naming the variable and range',
    (variable, setting, min, max) => {
      expect(loadConfig({ [variable]: String(min) }, noFiles)[setting]).toBe(min);
      expect(loadConfig({ [variable]: String(max) }, noFiles)[setting]).toBe(max);
      // Written with the surrounding whitespace an env file may leave.
      expect(loadConfig({ [variable]: ` ${max}\r\n` }, noFiles)[setting]).toBe(max);
      const refusal = `${variable} must be a whole number from ${min} to ${max}`;
      if (min > 0)
        expect(problemsOf({ [variable]: String(min - 1) })).toEqual([
          `${refusal} (got "${min - 1}")`,
        ]);
      expect(problemsOf({ [variable]: String(max + 1) })).toEqual([
        `${refusal} (got "${max + 1}")`,
      ]);
      for (const bad of [
        '-1',
        '1e3',
        '0x10',
        '+5',
        '5.0',
        '３０',
        '1_000',
        '1 000',
        `${max}0000000000000000000`,
      ]) {
        const problems = problemsOf({ [variable]: bad });
        expect(problems).toHaveLength(1);
        expect(problems[0]?.startsWith(refusal)).toBe(true);
      }
    },
  );
});

describe('LEDGENCE_RENEW_INTERVAL_MS "at most half the lease, checked at start", at its edges', () => {
  it.each([
    // [lease (unset = default 30 000), renew accepted, renew refused]
    [undefined, 15_000, 15_001],
    [1_001, 500, 501],
    [100, 50, 51],
    [HOUR, HOUR / 2, HOUR / 2 + 1],
  ])('lease %s: renew %i accepted, %i refused naming both', (lease, ok, tooLong) => {
    const env = (renew: number): Record<string, string> => ({
      ...(lease === undefined ? {} : { LEDGENCE_LEASE_DURATION_MS: String(lease) }),
      LEDGENCE_RENEW_INTERVAL_MS: String(renew),
    });
    expect(loadConfig(env(ok), noFiles).renewIntervalMs).toBe(ok);
    const problems = problemsOf(env(tooLong));
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatch(/^LEDGENCE_RENEW_INTERVAL_MS \(\d+\) must be at most half of /);
    expect(problems[0]).toContain('LEDGENCE_LEASE_DURATION_MS');
  });

  it('its own range is 10 .. 1 hour, whatever the lease', () => {
    const lease = { LEDGENCE_LEASE_DURATION_MS: String(HOUR) };
    expect(
      loadConfig({ ...lease, LEDGENCE_RENEW_INTERVAL_MS: '10' }, noFiles).renewIntervalMs,
    ).toBe(10);
    expect(problemsOf({ ...lease, LEDGENCE_RENEW_INTERVAL_MS: '9' })).toEqual([
      'LEDGENCE_RENEW_INTERVAL_MS must be a whole number from 10 to 3600000 (got "9")',
    ]);
  });
});

describe('misspelledVariables', () => {
  it('names each near miss of a server variable with the variable it probably means', () => {
    expect(
      misspelledVariables({
        LEDGENCE_API_KEYS_FLE: 'keys.json',
        LEDGENCE_LEASE_DURATION: '60000',
        LEDGENCE_LOGLEVEL: 'debug',
        ledgence_data_dir: '/srv/pg',
        LEDGENCE_SHUTDOWN_TIMEOUT_MS: '5000',
      }),
    ).toEqual([
      { name: 'LEDGENCE_API_KEYS_FLE', meant: 'LEDGENCE_API_KEYS_FILE' },
      { name: 'LEDGENCE_LEASE_DURATION', meant: 'LEDGENCE_LEASE_DURATION_MS' },
      { name: 'LEDGENCE_LOGLEVEL', meant: 'LEDGENCE_LOG_LEVEL' },
      { name: 'ledgence_data_dir', meant: 'LEDGENCE_DATA_DIR' },
    ]);
  });

  it("leaves alone every variable the server reads, the clients' variables, and the test and bench ones", () => {
    const env = Object.fromEntries(
      [
        ...CONFIG_VARIABLES,
        'LEDGENCE_URL',
        'LEDGENCE_API_KEY',
        'LEDGENCE_TEST_REPORT',
        'LEDGENCE_CHAOS_SEED',
        'LEDGENCE_RACE_SEED',
        'LEDGENCE_RACE_ROUNDS',
        'LEDGENCE_CLOCK_SKEW_MS',
        'LEDGENCE_CLOCK_STEP_MS',
        'LEDGENCE_CONCURRENCY',
        'LEDGENCE_BENCH_DATA_DIR',
        'LEDGENCE_BENCH_SERVER_ENTRY',
        'LEDGENCE_BENCH_SERVER_NODE_OPTIONS',
        'LEDGENCE_PROTO_GRANT_AT_CLAIM',
        'PATH',
      ].map((name) => [name, 'x']),
    );
    expect(misspelledVariables(env)).toEqual([]);
  });
});
