/**
 * The README's Configuration table and `loadConfig` agree (DESIGN §11): every variable the
 * README documents is read, with the documented default, and every variable config.ts reads is
 * documented. An operator configures the server from that table alone.
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { CONFIG_VARIABLES, loadConfig, type ServerConfig } from './config.js';

const here = dirname(fileURLToPath(import.meta.url));
const readme = readFileSync(join(here, '..', '..', '..', 'README.md'), 'utf8');
const configSource = readFileSync(join(here, 'config.ts'), 'utf8');

/** The Configuration table's rows: each variable named in a first cell, with its default cell. */
function documented(): Map<string, string> {
  const section = readme.slice(
    readme.indexOf('## Configuration'),
    readme.indexOf('### Running the server'),
  );
  const rows = new Map<string, string>();
  for (const line of section.split('\n')) {
    const cells = line.split('|').map((cell) => cell.trim());
    const [, names, fallback] = cells;
    if (names === undefined || fallback === undefined || !names.startsWith('`')) continue;
    const variables = [...names.matchAll(/`([A-Z_]+)`/g)].map((m) => m[1] as string);
    const defaults = fallback.split(' / ');
    variables.forEach((variable, i) => {
      rows.set(variable, (variables.length > 1 ? defaults[i] : fallback) ?? fallback);
    });
  }
  return rows;
}

const UNITS: Record<string, number> = { days: 86_400_000, hour: 3_600_000 };

/** A documented default as a value: `—` none, `` `text` `` a string, `30 000` or `7 days` a number. */
function parseDefault(cell: string): string | number | undefined {
  if (cell === '—') return undefined;
  const quoted = /^`(.*)`$/.exec(cell);
  if (quoted) return quoted[1];
  const amount = /^([\d ]+)(?: (days|hour))?$/.exec(cell);
  if (amount?.[1] === undefined) throw new Error(`unreadable default: ${cell}`);
  return Number(amount[1].replaceAll(' ', '')) * (amount[2] ? (UNITS[amount[2]] ?? 1) : 1);
}

/** Which setting of ServerConfig each variable sets. */
const SETTING: Record<(typeof CONFIG_VARIABLES)[number], keyof ServerConfig> = {
  DATABASE_URL: 'databaseUrl',
  LEDGENCE_DATA_DIR: 'dataDir',
  LEDGENCE_DB_POOL_SIZE: 'dbPoolSize',
  HOST: 'host',
  PORT: 'port',
  LEDGENCE_API_KEYS: 'apiKeys',
  LEDGENCE_API_KEYS_FILE: 'apiKeys',
  LEDGENCE_LOG_LEVEL: 'logLevel',
  LEDGENCE_CALLBACK_DESTINATIONS: 'callbackDestinations',
  LEDGENCE_CALLBACK_DESTINATIONS_FILE: 'callbackDestinations',
  LEDGENCE_TERMINAL_RETENTION_MS: 'terminalRetentionMs',
  LEDGENCE_COMPLETION_RETRY_BASE_MS: 'completionRetryBaseMs',
  LEDGENCE_COMPLETION_LEASE_MS: 'completionLeaseMs',
  LEDGENCE_RETENTION_INTERVAL_MS: 'retentionIntervalMs',
  LEDGENCE_LEASE_DURATION_MS: 'leaseDurationMs',
  LEDGENCE_RENEW_INTERVAL_MS: 'renewIntervalMs',
  LEDGENCE_CLEANUP_GRACE_MS: 'cleanupGraceMs',
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: 'leaseSafetyMarginMs',
  LEDGENCE_SESSION_VALIDITY_MS: 'sessionValidityMs',
  LEDGENCE_LONG_POLL_WAIT_MS: 'longPollWaitMs',
  LEDGENCE_RESCAN_INTERVAL_MS: 'rescanIntervalMs',
  LEDGENCE_MAINTENANCE_INTERVAL_MS: 'maintenanceIntervalMs',
  LEDGENCE_SHUTDOWN_TIMEOUT_MS: 'shutdownTimeoutMs',
  LEDGENCE_FAILPOINTS: 'failpoints',
};

describe('the README Configuration table', () => {
  it('documents exactly the variables config.ts reads', () => {
    const read = new Set(
      [...configSource.matchAll(/(?:text|integer)\(\s*'([A-Z_]+)'/g)].map((m) => m[1]),
    );
    expect([...read].sort()).toEqual([...CONFIG_VARIABLES].sort());
    expect([...documented().keys()].sort()).toEqual([...CONFIG_VARIABLES].sort());
  });

  it('gives the default each variable has when unset', () => {
    const config = loadConfig({}, () => {
      throw new Error('no file is named');
    });
    const mismatches: string[] = [];
    for (const [variable, cell] of documented()) {
      const setting = SETTING[variable as (typeof CONFIG_VARIABLES)[number]];
      const actual = config[setting];
      if (variable === 'LEDGENCE_RENEW_INTERVAL_MS') {
        // "a third of the lease, at most 10 000"
        const third = Math.min(10_000, Math.floor(config.leaseDurationMs / 3));
        if (actual !== third) mismatches.push(`${variable}: ${String(actual)} vs ${third}`);
        continue;
      }
      const expected = parseDefault(cell);
      const unset =
        expected === undefined &&
        (actual === undefined ||
          (Array.isArray(actual) && actual.length === 0) ||
          (actual instanceof Map && actual.size === 0));
      if (!unset && String(actual) !== String(expected)) {
        mismatches.push(`${variable}: README ${cell}, config.ts ${JSON.stringify(actual)}`);
      }
    }
    expect(mismatches).toEqual([]);
  });
});
