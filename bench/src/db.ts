/**
 * The one PostgreSQL of a run (embedded, or `DATABASE_URL`), one database per system, and the
 * counters read around a measured window: `pg_stat_database.xact_commit` of the system's
 * database and `pg_current_wal_lsn()` of the cluster.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { startEmbeddedPostgres } from '@ledgence/store-postgres';
import pg from 'pg';
import { treeCpuMs } from './cpu.js';

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
 * Starts embedded PostgreSQL in `bench/.data/pg` (crash-safe settings: fsync on), or uses
 * `databaseUrl` when given (its database is used for admin work only).
 */
export async function startPostgres(
  benchDir: string,
  databaseUrl: string | undefined,
): Promise<Postgres> {
  let urlFor: (database: string) => string;
  let stopServer: () => Promise<void>;
  let postmasterPid: number | undefined;
  if (databaseUrl === undefined) {
    const embedded = await startEmbeddedPostgres({
      dataDir: join(benchDir, '.data', 'pg'),
      durability: 'full',
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
  return {
    urlFor,
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
