/**
 * The one PostgreSQL of a run (embedded, or `DATABASE_URL`), one database per system, and the
 * counters read around a measured window: `pg_stat_database.xact_commit` of the system's
 * database, `pg_current_wal_lsn()` of the cluster, and the system's statements from
 * `pg_stat_statements` (loaded in the embedded server; used with `DATABASE_URL` when the
 * extension is there).
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { startEmbeddedPostgres } from '@ledgence/store-postgres';
import pg from 'pg';
import { treeCpuMs } from './cpu.js';
import type { StatementCounters } from './stats.js';

/** The PostgreSQL server of a run. */
export interface Postgres {
  /** URL of another database on the same server. */
  urlFor(database: string): string;
  /** Drops `database` if it exists and creates it empty. */
  recreate(database: string): Promise<void>;
  /** The counters of `database` now (read from the admin connection, not from `database`). */
  counters(database: string): Promise<Counters>;
  /** Bytes of WAL between two counter readings. */
  walBytes(from: Counters, to: Counters): Promise<number>;
  /** `SHOW server_version`. */
  version(): Promise<string>;
  /**
   * The statements PostgreSQL has run for `database` so far, from `pg_stat_statements`; read at
   * once (no statistics flush delay). `undefined` when the extension is not available.
   */
  statements(database: string): Promise<StatementCounters | undefined>;
  /** Why `statements` is unavailable, or `undefined` when it works. */
  readonly statementsUnavailable: string | undefined;
  /** CPU ms PostgreSQL has used so far (embedded only; NaN with `DATABASE_URL`). */
  cpuMs(): Promise<number>;
  stop(): Promise<void>;
}

/** Counters read at one moment. */
export interface Counters {
  xactCommit: number;
  walLsn: string;
  /**
   * The snapshot's xmax: the next transaction id to complete, cluster-wide. Only transactions
   * that write get an id, and the number is current at once (no statistics flush delay), so
   * the difference over a quiet window counts write transactions.
   */
  nextXid: number;
}

/**
 * Settings of the embedded server for statement counts. `max` well above the distinct
 * statements of a run (each queue's name may be part of a peer's statement text), so that no
 * entry is evicted and no count lost.
 */
const STATEMENT_SETTINGS = {
  shared_preload_libraries: 'pg_stat_statements',
  'pg_stat_statements.max': '20000',
};

/**
 * Starts embedded PostgreSQL in `<dataDir>/pg` (`bench/.data/pg` by default; crash-safe
 * settings: fsync on), or uses `databaseUrl` when given (its database is used for admin work
 * only).
 */
export async function startPostgres(
  dataDir: string,
  databaseUrl: string | undefined,
): Promise<Postgres> {
  let urlFor: (database: string) => string;
  let stopServer: () => Promise<void>;
  let postmasterPid: number | undefined;
  if (databaseUrl === undefined) {
    const embedded = await startEmbeddedPostgres({
      dataDir: join(dataDir, 'pg'),
      durability: 'full',
      settings: STATEMENT_SETTINGS,
    });
    urlFor = (database) => embedded.urlFor(database);
    stopServer = () => embedded.stop();
    const pidFile = await readFile(join(embedded.dataDir, 'postmaster.pid'), 'utf8');
    postmasterPid = Number(pidFile.split('\n')[0]);
  } else {
    urlFor = (database) => {
      const url = new URL(databaseUrl);
      url.pathname = `/${database}`;
      return url.toString();
    };
    stopServer = async () => {};
  }
  const admin = new pg.Client({ connectionString: urlFor('postgres') });
  await admin.connect();
  const ident = (name: string): string => `"${name.replaceAll('"', '""')}"`;
  const statementsUnavailable = await enableStatementCounts(admin, databaseUrl === undefined);
  return {
    urlFor,
    statementsUnavailable,
    async statements(database) {
      if (statementsUnavailable !== undefined) return undefined;
      // pg_stat_statements(false): the counters without reading the query texts' file.
      const reply = await admin.query<{ calls: string; exec_ms: string; dealloc: string }>(
        `SELECT coalesce(sum(s.calls), 0)::text AS calls,
                coalesce(sum(s.total_exec_time), 0)::text AS exec_ms,
                (SELECT dealloc FROM pg_stat_statements_info)::text AS dealloc
           FROM pg_stat_statements(false) s
          WHERE s.toplevel AND s.dbid = (SELECT oid FROM pg_database WHERE datname = $1)`,
        [database],
      );
      const row = reply.rows[0];
      return {
        calls: Number(row?.calls ?? Number.NaN),
        execMs: Number(row?.exec_ms ?? Number.NaN),
        evictions: Number(row?.dealloc ?? Number.NaN),
      };
    },
    async recreate(database) {
      await admin.query(`DROP DATABASE IF EXISTS ${ident(database)} WITH (FORCE)`);
      await admin.query(`CREATE DATABASE ${ident(database)}`);
    },
    async counters(database) {
      const stat = await admin.query<{ xact_commit: string }>(
        'SELECT xact_commit::text FROM pg_stat_database WHERE datname = $1',
        [database],
      );
      const wal = await admin.query<{ lsn: string; xid: string }>(
        'SELECT pg_current_wal_lsn()::text AS lsn, pg_snapshot_xmax(pg_current_snapshot())::text AS xid',
      );
      return {
        xactCommit: Number(stat.rows[0]?.xact_commit ?? Number.NaN),
        walLsn: wal.rows[0]?.lsn ?? '0/0',
        nextXid: Number(wal.rows[0]?.xid ?? Number.NaN),
      };
    },
    async walBytes(from, to) {
      const diff = await admin.query<{ bytes: string }>(
        'SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::text AS bytes',
        [from.walLsn, to.walLsn],
      );
      return Number(diff.rows[0]?.bytes ?? Number.NaN);
    },
    async version() {
      const reply = await admin.query<{ server_version: string }>('SHOW server_version');
      return reply.rows[0]?.server_version ?? 'unknown';
    },
    async cpuMs() {
      return postmasterPid === undefined ? Number.NaN : treeCpuMs(postmasterPid);
    },
    async stop() {
      await admin.end();
      await stopServer();
    },
  };
}

/**
 * Makes `pg_stat_statements` readable from the admin database; returns why it cannot be, or
 * `undefined`. The embedded server preloads the library, so the extension is created there; a
 * `DATABASE_URL` server is only read, never changed: it must have the library preloaded and the
 * extension created in its `postgres` database already.
 */
async function enableStatementCounts(
  admin: pg.Client,
  embedded: boolean,
): Promise<string | undefined> {
  try {
    if (embedded) await admin.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    await admin.query('SELECT 1 FROM pg_stat_statements(false) LIMIT 1');
    return undefined;
  } catch (error) {
    return (
      `pg_stat_statements is not readable (${(error as Error).message}); statement counts are ` +
      "left out. To have them, set shared_preload_libraries = 'pg_stat_statements' on that " +
      'server and run CREATE EXTENSION pg_stat_statements in its postgres database.'
    );
  }
}

/**
 * A connection to a system's own database that counts the statements it runs, so that the
 * commits it adds to that database's `xact_commit` can be subtracted.
 */
export class CountingClient {
  readonly #client: pg.Client;
  #statements = 0;

  constructor(url: string) {
    this.#client = new pg.Client({ connectionString: url });
  }

  /** Statements run so far (each one an autocommitted transaction). */
  get statements(): number {
    return this.#statements;
  }

  async connect(): Promise<void> {
    await this.#client.connect();
  }

  /** The first column of the first row of `sql` as a number. */
  async scalar(sql: string, values: unknown[] = []): Promise<number> {
    this.#statements += 1;
    const reply = await this.#client.query(sql, values);
    const row = reply.rows[0] as Record<string, unknown> | undefined;
    return Number(row === undefined ? Number.NaN : Object.values(row)[0]);
  }

  end(): Promise<void> {
    return this.#client.end();
  }
}
