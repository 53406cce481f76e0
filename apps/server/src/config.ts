/**
 * Server configuration from environment variables (DESIGN §11), validated at
 * start. Every problem names the variable, says what is wrong and what would
 * be right; all problems are reported at once, so one restart fixes them all.
 */
import { type Destinations, DestinationsError, parseDestinations } from '@ledgence/callbacks';
import {
  CLEANUP_GRACE_MS,
  COMPLETION_LEASE_MS,
  COMPLETION_MAX_RETRY_DELAY_MS,
  COMPLETION_RETRY_BASE_MS,
  DEFAULT_TIMEOUT_MS,
  LEASE_DURATION_MS,
  LEASE_SAFETY_MARGIN_MS,
  LONG_POLL_WAIT_MS,
  MAX_RETENTION_MS,
  MIN_RETENTION_MS,
  RENEW_INTERVAL_MS,
  SESSION_VALIDITY_MS,
  TERMINAL_RETENTION_MS,
} from '@ledgence/contracts';
import {
  type FailpointSetting,
  FailpointSpecError,
  MIN_DISPATCH_WINDOW_MS,
  parseFailpoints,
} from '@ledgence/core';
import { type ApiKeyConfig, apiKeyProblems, isLoopbackHost } from '@ledgence/http';
import { closest, distance } from 'fastest-levenshtein';

// The one loopback rule (development mode's), shared with the HTTP app's Host check.
export { isLoopbackHost };

/**
 * One API key as the operator configures it in `LEDGENCE_API_KEYS` (DESIGN §6): the HTTP layer's
 * own key configuration, so the two cannot drift apart.
 */
export type ApiKeySetting = ApiKeyConfig;

/** The log levels pino understands. */
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';

/** Everything the server reads from its environment. */
export interface ServerConfig {
  /** `DATABASE_URL`; absent → embedded PostgreSQL in {@link ServerConfig.dataDir}. */
  databaseUrl: string | undefined;
  /** `LEDGENCE_DATA_DIR`: the embedded database's folder (default `./.ledgence/pg`). */
  dataDir: string;
  /**
   * `LEDGENCE_DB_POOL_SIZE`: the most connections the store opens (default 10), besides one for
   * LISTEN. Replicas × this must fit PostgreSQL's `max_connections`; batching keeps the hot path
   * on a few connections (2 and 10 drained alike in bench/README.md).
   */
  dbPoolSize: number;
  /** `HOST` (default 127.0.0.1); a bracketed IPv6 literal is unbracketed (`[::1]` → `::1`). */
  host: string;
  /** `PORT` (default 8080; 0 picks a free port). */
  port: number;
  /** `LEDGENCE_API_KEYS` or the file named by `LEDGENCE_API_KEYS_FILE`; empty = development mode. */
  apiKeys: ApiKeySetting[];
  /** `LEDGENCE_LOG_LEVEL` (default info). */
  logLevel: LogLevel;
  /**
   * `LEDGENCE_CALLBACK_DESTINATIONS` or the file named by `LEDGENCE_CALLBACK_DESTINATIONS_FILE`:
   * operator-configured completion-callback destinations by alias (DESIGN §8); none by default.
   */
  callbackDestinations: Destinations;
  /** `LEDGENCE_TERMINAL_RETENTION_MS`: default retention of terminal tasks (≥ MIN_RETENTION_MS). */
  terminalRetentionMs: number;
  /**
   * `LEDGENCE_COMPLETION_RETRY_BASE_MS`: the first callback retry's backoff cap (default
   * COMPLETION_RETRY_BASE_MS); tests shorten it to exercise the whole schedule quickly.
   */
  completionRetryBaseMs: number;
  /**
   * `LEDGENCE_COMPLETION_LEASE_MS`: how long a sender owns a leased delivery (default
   * COMPLETION_LEASE_MS); tests shorten it to see a killed sender's delivery taken over
   * quickly. The sender raises it to the longest destination timeout plus a report margin, so
   * a try never outlives its lease and no replica posts an event whose try is still in flight.
   */
  completionLeaseMs: number;
  /** `LEDGENCE_RETENTION_INTERVAL_MS`: how often each replica collects retired tasks (default 60 s). */
  retentionIntervalMs: number;
  /** `LEDGENCE_LEASE_DURATION_MS`. */
  leaseDurationMs: number;
  /**
   * `LEDGENCE_RENEW_INTERVAL_MS`: the heartbeat period the lease is sized for; unless set, a
   * third of the lease (at most RENEW_INTERVAL_MS). When set it must leave room for a missed
   * renewal. No reply carries it: workers renew on their own period, and by half the time their
   * lease has left whatever that period is (README).
   */
  renewIntervalMs: number;
  /** `LEDGENCE_CLEANUP_GRACE_MS`. */
  cleanupGraceMs: number;
  /** `LEDGENCE_LEASE_SAFETY_MARGIN_MS`. */
  leaseSafetyMarginMs: number;
  /** `LEDGENCE_SESSION_VALIDITY_MS`. */
  sessionValidityMs: number;
  /** `LEDGENCE_LONG_POLL_WAIT_MS`: the most a poll or result wait parks. */
  longPollWaitMs: number;
  /** `LEDGENCE_RESCAN_INTERVAL_MS`: a parked wait rescans this often even without a wake hint. */
  rescanIntervalMs: number;
  /** `LEDGENCE_MAINTENANCE_INTERVAL_MS`: how often each replica runs lease recovery. */
  maintenanceIntervalMs: number;
  /** `LEDGENCE_SHUTDOWN_TIMEOUT_MS`: graceful shutdown budget (default 10 s). */
  shutdownTimeoutMs: number;
  /**
   * `LEDGENCE_FAILPOINTS` — TEST ONLY, never set in production: crash points armed for the
   * reliability suites, e.g. `settle.after_commit=crash` (grammar and names: `FAILPOINTS` in
   * `@ledgence/core`). Empty (the default) arms nothing; an unknown name stops the start.
   */
  failpoints: FailpointSetting[];
}

/** The configuration could not be used; `problems` name each variable and what is wrong. */
export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(
      `Invalid configuration (${problems.length} problem${problems.length === 1 ? '' : 's'}):\n` +
        problems.map((p) => `  - ${p}`).join('\n'),
    );
    this.name = 'ConfigError';
  }
}

/** Reads a file named by a `…_FILE` variable. */
export type ReadConfigFile = (path: string) => string;

const LOG_LEVELS: readonly LogLevel[] = [
  'fatal',
  'error',
  'warn',
  'info',
  'debug',
  'trace',
  'silent',
];
// The server asks more of a key than the HTTP app does: long enough not to be guessed.
const KEY_MIN_CHARS = 16;

/** Environment variables the configuration reads, for help texts and docs. */
export const CONFIG_VARIABLES = [
  'DATABASE_URL',
  'LEDGENCE_DATA_DIR',
  'LEDGENCE_DB_POOL_SIZE',
  'HOST',
  'PORT',
  'LEDGENCE_API_KEYS',
  'LEDGENCE_API_KEYS_FILE',
  'LEDGENCE_LOG_LEVEL',
  'LEDGENCE_CALLBACK_DESTINATIONS',
  'LEDGENCE_CALLBACK_DESTINATIONS_FILE',
  'LEDGENCE_TERMINAL_RETENTION_MS',
  'LEDGENCE_COMPLETION_RETRY_BASE_MS',
  'LEDGENCE_COMPLETION_LEASE_MS',
  'LEDGENCE_RETENTION_INTERVAL_MS',
  'LEDGENCE_LEASE_DURATION_MS',
  'LEDGENCE_RENEW_INTERVAL_MS',
  'LEDGENCE_CLEANUP_GRACE_MS',
  'LEDGENCE_LEASE_SAFETY_MARGIN_MS',
  'LEDGENCE_SESSION_VALIDITY_MS',
  'LEDGENCE_LONG_POLL_WAIT_MS',
  'LEDGENCE_RESCAN_INTERVAL_MS',
  'LEDGENCE_MAINTENANCE_INTERVAL_MS',
  'LEDGENCE_SHUTDOWN_TIMEOUT_MS',
  'LEDGENCE_FAILPOINTS',
] as const;

/**
 * The variables of {@link CONFIG_VARIABLES} whose values are secrets: API keys, signing secrets,
 * a database password. `ledgence-server` removes them from its environment once the configuration
 * is read, so no process it starts inherits them (see main.ts).
 */
export const SECRET_VARIABLES = [
  'DATABASE_URL',
  'LEDGENCE_API_KEYS',
  'LEDGENCE_CALLBACK_DESTINATIONS',
] as const satisfies readonly (typeof CONFIG_VARIABLES)[number][];

// Read by the SDK's examples and clients, not by the server: one edit from `LEDGENCE_API_KEYS`,
// and often set in the same shell as a development server.
const CLIENT_VARIABLES: readonly string[] = ['LEDGENCE_URL', 'LEDGENCE_API_KEY'];
// Server variables are 16 to 35 characters long; three edits covers a dropped `_MS` or `S`, a
// swapped pair and a stray letter, and stays far from the test and bench variables.
const MISSPELLING_EDITS = 3;

/** A `LEDGENCE_*` variable the server does not read, and the one it probably stands for. */
export interface MisspelledVariable {
  /** The name as set. */
  readonly name: string;
  /** The variable the server reads that it is closest to. */
  readonly meant: (typeof CONFIG_VARIABLES)[number];
}

/**
 * `LEDGENCE_*` variables in `env` (any case) that the server does not read but are within a few
 * edits of one it does. The server ignores names it does not know, so `LEDGENCE_API_KEYS_FLE`
 * started it in development mode, and `LEDGENCE_LEASE_DURATION` with the default lease, without
 * a word; the caller warns, and starts as configured.
 */
export function misspelledVariables(
  env: Readonly<Record<string, string | undefined>>,
): MisspelledVariable[] {
  const known: readonly string[] = CONFIG_VARIABLES;
  const found: MisspelledVariable[] = [];
  for (const name of Object.keys(env)) {
    const upper = name.toUpperCase();
    if (!upper.startsWith('LEDGENCE_') || known.includes(name) || CLIENT_VARIABLES.includes(name)) {
      continue;
    }
    const meant = closest(upper, known) as MisspelledVariable['meant'];
    if (distance(upper, meant) <= MISSPELLING_EDITS) found.push({ name, meant });
  }
  return found;
}

/** What `ledgence-server --help` prints: how the server is configured, and where to read more. */
export const USAGE = [
  'Usage: ledgence-server',
  '',
  'Runs the Ledgence server. It takes no arguments: it is configured by environment variables,',
  'and with none it starts an embedded PostgreSQL in ./.ledgence/pg and listens on',
  '127.0.0.1:8080 in development mode (no API keys, loopback only).',
  '',
  'Variables (see the Configuration section of the README for defaults and ranges):',
  ...CONFIG_VARIABLES.filter((name) => name !== 'LEDGENCE_FAILPOINTS').map((name) => `  ${name}`),
  '',
  'SIGTERM, SIGINT or SIGHUP stops it gracefully; a second signal stops it at once.',
].join('\n');

/**
 * The server configuration from `env`, or a {@link ConfigError} listing every
 * problem. Pure apart from `readFile`, which reads `…_FILE` variables.
 */
export function loadConfig(
  env: Readonly<Record<string, string | undefined>>,
  readConfigFile: ReadConfigFile,
): ServerConfig {
  const problems: string[] = [];
  // A byte order mark, as some editors save UTF-8, is no JSON: the file's content was refused
  // as "not valid JSON: check its brackets" with nothing wrong in sight.
  const readFile: ReadConfigFile = (path) => readConfigFile(path).replace(/^\uFEFF/, '');
  const text = (name: string): string | undefined => {
    const value = env[name];
    return value === undefined || value.trim() === '' ? undefined : value.trim();
  };
  const integer = (name: string, fallback: number, min: number, max: number): number => {
    const raw = text(name);
    if (raw === undefined) return fallback;
    const value = Number(raw);
    if (!/^\d+$/.test(raw) || !Number.isSafeInteger(value) || value < min || value > max) {
      problems.push(
        `${name} must be a whole number from ${min} to ${max} (got "${truncate(raw)}")`,
      );
      return fallback;
    }
    return value;
  };

  const databaseUrl = text('DATABASE_URL');
  const urlProblem = databaseUrl === undefined ? undefined : databaseUrlProblem(databaseUrl);
  if (urlProblem !== undefined) problems.push(`DATABASE_URL ${urlProblem}`);
  // `[::1]` is how a URL writes an IPv6 address; listen() wants it without the brackets.
  const host = (text('HOST') ?? '127.0.0.1').replace(/^\[([0-9A-Fa-f:.]+)\]$/, '$1');
  const port = integer('PORT', 8080, 0, 65_535);
  const logLevel = (text('LEDGENCE_LOG_LEVEL') ?? 'info') as LogLevel;
  if (!LOG_LEVELS.includes(logLevel)) {
    problems.push(`LEDGENCE_LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')}`);
  }

  const problemsBeforeKeys = problems.length;
  const apiKeys = readApiKeys(
    text('LEDGENCE_API_KEYS'),
    text('LEDGENCE_API_KEYS_FILE'),
    readFile,
    problems,
  );
  // Keys that were given but refused are what to fix: "set LEDGENCE_API_KEYS, or use a loopback
  // HOST" would tell an operator who did set them the wrong thing (review r45b).
  const keysRefused = problems.length > problemsBeforeKeys;
  if (apiKeys.length === 0 && !keysRefused && !isLoopbackHost(host)) {
    problems.push(
      `HOST=${truncate(host)} would expose a server without API keys: development mode listens on loopback only. ` +
        'Set LEDGENCE_API_KEYS (or LEDGENCE_API_KEYS_FILE), or use HOST=127.0.0.1',
    );
  }

  const callbackDestinations = readDestinations(
    text('LEDGENCE_CALLBACK_DESTINATIONS'),
    text('LEDGENCE_CALLBACK_DESTINATIONS_FILE'),
    readFile,
    problems,
  );

  let failpoints: FailpointSetting[] = [];
  try {
    failpoints = parseFailpoints(text('LEDGENCE_FAILPOINTS') ?? '');
  } catch (error) {
    if (!(error instanceof FailpointSpecError)) throw error;
    problems.push(`LEDGENCE_FAILPOINTS (test only): ${error.message}`);
  }

  const second = 1_000;
  const hour = 3_600_000;
  const before = problems.length;
  const leaseDurationMs = integer('LEDGENCE_LEASE_DURATION_MS', LEASE_DURATION_MS, 100, hour);
  const leaseSet = text('LEDGENCE_LEASE_DURATION_MS') !== undefined && problems.length === before;
  // Unless set, the heartbeat follows the lease (a third of it, as the contract defaults are), so
  // shortening the lease alone never leaves the default heartbeat too slow for it.
  const renewSet = text('LEDGENCE_RENEW_INTERVAL_MS') !== undefined;
  const renewIntervalMs = integer(
    'LEDGENCE_RENEW_INTERVAL_MS',
    Math.min(RENEW_INTERVAL_MS, Math.floor(leaseDurationMs / 3)),
    10,
    hour,
  );
  // A renewal must fit inside the lease with room for one to be lost.
  if (renewSet && renewIntervalMs * 2 > leaseDurationMs) {
    const lease = leaseSet
      ? `LEDGENCE_LEASE_DURATION_MS (${leaseDurationMs})`
      : `the lease (${leaseDurationMs}, the default of LEDGENCE_LEASE_DURATION_MS)`;
    problems.push(
      `LEDGENCE_RENEW_INTERVAL_MS (${renewIntervalMs}) must be at most half of ${lease}, so one lost renewal does not lose the lease; unset it to use a third of the lease`,
    );
  }
  const config: ServerConfig = {
    databaseUrl,
    dataDir: text('LEDGENCE_DATA_DIR') ?? '.ledgence/pg',
    dbPoolSize: integer('LEDGENCE_DB_POOL_SIZE', 10, 1, 1_000),
    host,
    port,
    apiKeys,
    logLevel,
    callbackDestinations,
    terminalRetentionMs: integer(
      'LEDGENCE_TERMINAL_RETENTION_MS',
      TERMINAL_RETENTION_MS,
      MIN_RETENTION_MS,
      MAX_RETENTION_MS,
    ),
    completionRetryBaseMs: integer(
      'LEDGENCE_COMPLETION_RETRY_BASE_MS',
      COMPLETION_RETRY_BASE_MS,
      1,
      COMPLETION_MAX_RETRY_DELAY_MS,
    ),
    completionLeaseMs: integer('LEDGENCE_COMPLETION_LEASE_MS', COMPLETION_LEASE_MS, 100, hour),
    retentionIntervalMs: integer('LEDGENCE_RETENTION_INTERVAL_MS', 60 * second, 10, 24 * hour),
    leaseDurationMs,
    renewIntervalMs,
    cleanupGraceMs: integer('LEDGENCE_CLEANUP_GRACE_MS', CLEANUP_GRACE_MS, 0, hour),
    // A larger margin would refuse every submit that leaves timeout_ms to its default (a
    // budget must exceed the margin by MIN_DISPATCH_WINDOW_MS).
    leaseSafetyMarginMs: integer(
      'LEDGENCE_LEASE_SAFETY_MARGIN_MS',
      LEASE_SAFETY_MARGIN_MS,
      0,
      DEFAULT_TIMEOUT_MS - MIN_DISPATCH_WINDOW_MS,
    ),
    sessionValidityMs: integer(
      'LEDGENCE_SESSION_VALIDITY_MS',
      SESSION_VALIDITY_MS,
      second,
      24 * hour,
    ),
    longPollWaitMs: integer('LEDGENCE_LONG_POLL_WAIT_MS', LONG_POLL_WAIT_MS, 0, 5 * 60 * second),
    rescanIntervalMs: integer('LEDGENCE_RESCAN_INTERVAL_MS', 1_000, 10, hour),
    maintenanceIntervalMs: integer('LEDGENCE_MAINTENANCE_INTERVAL_MS', 1_000, 10, hour),
    shutdownTimeoutMs: integer('LEDGENCE_SHUTDOWN_TIMEOUT_MS', 10_000, 100, 5 * 60 * second),
    failpoints,
  };
  if (problems.length > 0) throw new ConfigError(problems);
  return config;
}

function readApiKeys(
  inline: string | undefined,
  file: string | undefined,
  readFile: ReadConfigFile,
  problems: string[],
): ApiKeySetting[] {
  if (inline !== undefined && file !== undefined) {
    problems.push('set LEDGENCE_API_KEYS or LEDGENCE_API_KEYS_FILE, not both');
    return [];
  }
  const source = file !== undefined ? 'LEDGENCE_API_KEYS_FILE' : 'LEDGENCE_API_KEYS';
  let raw = inline;
  if (file !== undefined) {
    try {
      raw = readFile(file);
    } catch (error) {
      problems.push(unreadableFile('LEDGENCE_API_KEYS', file, error));
      return [];
    }
  }
  if (raw === undefined) return [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    // Never echo the value: it holds secrets.
    problems.push(
      `${source} is not valid JSON: check its brackets, quotes and commas (and the shell quoting around it); it must be a JSON array like [{"key":"…","tenant":"acme","namespaces":["*"],"roles":["client","worker"]}]`,
    );
    return [];
  }
  if (!Array.isArray(parsed)) {
    problems.push(`${source} must be a JSON array of keys`);
    return [];
  }
  if (parsed.length === 0) {
    // Set, yet empty (a file not filled in yet): starting open, in development mode, is not what
    // setting it asked for.
    problems.push(
      `${source} holds no keys: add one, or unset ${source} to run in development mode (no keys, loopback only)`,
    );
    return [];
  }
  const keys: ApiKeySetting[] = [];
  parsed.forEach((entry: unknown, index) => {
    const where = `${source}[${index}]`;
    if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) {
      problems.push(`${where} must be an object with key, tenant, namespaces and roles`);
      return;
    }
    const { key, tenant, namespaces, roles, ...rest } = entry as Record<string, unknown>;
    const unknown = Object.keys(rest);
    if (unknown.length > 0) problems.push(`${where} has unknown fields: ${fieldNames(unknown)}`);
    // The HTTP app's own rule for a key (apiKeyProblems), so a key it would refuse stops the
    // start here, naming this variable, and not after the database started. Its problems name
    // fields, never the key.
    const setting = { key, tenant, namespaces, roles } as ApiKeySetting;
    const found = apiKeyProblems(setting);
    for (const { field, message } of found) problems.push(`${where}.${field} ${message}`);
    const short =
      typeof key === 'string' &&
      key.length < KEY_MIN_CHARS &&
      !found.some(({ field }) => field === 'key');
    if (short) {
      problems.push(
        `${where}.key must be at least ${KEY_MIN_CHARS} characters, so it cannot be guessed (e.g. the output of openssl rand -hex 32)`,
      );
    }
    if (found.length === 0 && !short) keys.push(setting);
  });
  const seen = new Set<string>();
  for (const { key } of keys) {
    if (seen.has(key)) problems.push(`${source} lists the same key twice`);
    seen.add(key);
  }
  return keys;
}

/**
 * Why `url` is not a PostgreSQL URL the driver (postgres.js) can connect with, or `undefined`.
 * Checked here so a bad value stops the start naming DATABASE_URL, not later as "Invalid URL".
 * Never quotes the URL: it may hold a password.
 */
function databaseUrlProblem(url: string): string | undefined {
  if (!/^postgres(?:ql)?:\/\//.test(url)) {
    return 'must be a postgres:// or postgresql:// URL; unset it to use the embedded database';
  }
  // As postgres.js reads it: the authority may list several hosts (`h1:5432,h2:5433`), and the
  // URL is parsed with the first of them in their place.
  const authority = url.slice(url.indexOf('://') + 3).split(/[?/]/)[0] ?? '';
  // postgres.js takes the host list from after the FIRST @, the URL parser from after the last:
  // an unencoded @ in the password would make part of the password a "host", named in errors.
  if (authority.indexOf('@') !== authority.lastIndexOf('@')) {
    return 'has more than one @ before its host: percent-encode an @ in the user name or password as %40';
  }
  let hosts: string;
  let parsed: URL;
  try {
    hosts = decodeURIComponent(authority.slice(authority.indexOf('@') + 1));
    parsed = new URL(url.replace(hosts, hosts.split(',')[0] ?? ''));
  } catch {
    return 'is not a valid URL: check the host and port, and percent-encode special characters of the user name and password (e.g. @ as %40)';
  }
  const ports = hosts.includes(',')
    ? hosts.split(',').map((host) => host.split(':')[1] ?? '')
    : [parsed.port];
  const badPort = (port: string) =>
    port !== '' && (!/^\d+$/.test(port) || Number(port) < 1 || Number(port) > 65_535);
  if (ports.some(badPort)) return 'must name a port from 1 to 65535 (or none, for 5432)';
  for (const [part, value] of [
    ['user name', parsed.username],
    ['password', parsed.password],
    ['database name', parsed.pathname.slice(1)],
  ] as const) {
    try {
      decodeURIComponent(value);
    } catch {
      return `has a malformed percent escape in its ${part}: write a literal % as %25`;
    }
  }
  return undefined;
}

function readDestinations(
  inline: string | undefined,
  file: string | undefined,
  readFile: ReadConfigFile,
  problems: string[],
): Destinations {
  const none: Destinations = new Map();
  if (inline !== undefined && file !== undefined) {
    problems.push(
      'set LEDGENCE_CALLBACK_DESTINATIONS or LEDGENCE_CALLBACK_DESTINATIONS_FILE, not both',
    );
    return none;
  }
  let text = inline;
  const source =
    file !== undefined ? 'LEDGENCE_CALLBACK_DESTINATIONS_FILE' : 'LEDGENCE_CALLBACK_DESTINATIONS';
  if (file !== undefined) {
    try {
      text = readFile(file);
    } catch (error) {
      problems.push(unreadableFile('LEDGENCE_CALLBACK_DESTINATIONS', file, error));
      return none;
    }
  }
  if (text === undefined) return none;
  try {
    return parseDestinations(text, { source });
  } catch (error) {
    // The parser names alias and field and never the secret; its problems join ours.
    if (error instanceof DestinationsError) {
      problems.push(...error.problems.map((p) => p.message));
      return none;
    }
    throw error;
  }
}

/**
 * The problem line of a `…_FILE` variable (`variable` + `_FILE`) whose file cannot be read: the
 * error's code (ENOENT, EACCES, …), never its message, which quotes the path — and a value that
 * is no path may be the secret itself, put in the wrong variable (the keys' JSON, say).
 */
function unreadableFile(variable: string, path: string, error: unknown): string {
  const code = (error as NodeJS.ErrnoException | undefined)?.code ?? 'unreadable';
  const inline = /^\s*[[{]/.test(path)
    ? `: its value looks like the JSON itself, which goes in ${variable}; ${variable}_FILE takes a path`
    : '';
  return `${variable}_FILE names a file that cannot be read (${code})${inline}`;
}

/**
 * Unknown field names of a keys entry as a problem line may show them: names that look like a
 * field (an identifier shorter than any key, a typo of `namespaces` say) are listed; anything
 * else only counted, as it may be a key pasted where a field name goes, and stderr must never
 * show a key.
 */
function fieldNames(names: readonly string[]): string {
  const field = new RegExp(`^[A-Za-z_][A-Za-z0-9_]{0,${KEY_MIN_CHARS - 2}}$`);
  const shown = names.filter((name) => field.test(name));
  const hidden = names.length - shown.length;
  const note = hidden === 0 ? '' : `${hidden} not shown (not field names: a key out of place?)`;
  return [...shown, note].filter((part) => part !== '').join(', ');
}

function truncate(value: string): string {
  return value.length > 40 ? `${value.slice(0, 40)}…` : value;
}
