/**
 * Applies the committed drizzle-kit migrations (`drizzle/`) under an advisory lock.
 *
 * Drizzle's own migrator takes no lock, so replicas starting together collide (both create the
 * bookkeeping table, both apply the same migration). This one runs the whole pass in ONE
 * transaction that first takes `pg_advisory_xact_lock`: a second migrator waits for the first to
 * commit, then (READ COMMITTED, a fresh snapshot per statement) finds the migrations recorded and
 * applies nothing. The transaction-scoped lock is released by commit, rollback or a dropped
 * connection alike, so a migrator that dies never leaves the lock behind, and it works through
 * any pooled client (a session-level lock would need the lock and unlock on one connection).
 *
 * Bookkeeping is drizzle's own table (`drizzle.__drizzle_migrations`: hash, created_at = the
 * journal's `when`), so `drizzle-kit` tooling reads the same history.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { readMigrationFiles } from 'drizzle-orm/migrator';
import postgres from 'postgres';
import { firstConnection } from './first-connection.js';

/** Where the committed migrations live: `<package>/drizzle`, from `src/` and `dist/` alike. */
export const MIGRATIONS_FOLDER: string = fileURLToPath(new URL('../drizzle', import.meta.url));

/**
 * The advisory lock key of migrations: a fixed 64-bit number ("ledgence" in ASCII), so that
 * every replica and version agrees on it.
 */
export const MIGRATION_LOCK_KEY = 0x6c65646765_6e6365n;

/** A database to migrate: a postgres:// URL (a short-lived client is made) or a postgres.js client. */
export type MigrationTarget = string | postgres.Sql;

/** What {@link migrate} did. */
export interface MigrationResult {
  /** Tags of the migrations this call applied, in order (empty when already current). */
  applied: string[];
}

/** Which migrations a database has and lacks (for readiness checks). */
export interface MigrationStatus {
  /** Tags recorded as applied, oldest first. */
  applied: string[];
  /** Tags of committed migrations not yet applied, oldest first. */
  pending: string[];
  /**
   * Recorded migrations this build does not know, newer than its own (a newer Ledgence
   * migrated the database), each described by its time and hash (drizzle records no tag).
   */
  unknown: string[];
  /** True when nothing is pending and nothing unknown is recorded. */
  current: boolean;
}

/** Options of {@link migrate}. */
export interface MigrateOptions {
  /** The migrations folder (tests); default the committed one. */
  folder?: string;
  /**
   * Stops connecting (a URL target: the client is ended), waiting for the migration lock
   * (another replica migrating), or a migration statement (one queued behind a table lock, as
   * a pg_dump holds for its whole run): `migrate` then rejects with the signal's reason, having
   * changed nothing (the one transaction rolls back).
   */
  signal?: AbortSignal;
  /**
   * Called once a session with the database is established, before the migration lock is
   * taken: a rejection before this call is a failure to connect (the server unreachable, not
   * PostgreSQL, or refusing the user or database), one after it is not.
   */
  onConnected?: () => void;
  /**
   * Called once when the migration lock is held by another session, with that session's
   * backend pid when PostgreSQL shows it, before waiting for it.
   */
  onWait?: (holderPid: number | undefined) => void;
  /**
   * Called once per migration statement still waiting after {@link BLOCKED_REPORT_MS}, with the
   * backend pids PostgreSQL says block it (`pg_blocking_pids`: a `pg_dump`, a long transaction
   * holding the table). Asked on a connection of its own, so only for a URL target.
   */
  onBlocked?: (blockerPids: number[]) => void;
}

/** How long a migration statement may wait before {@link MigrateOptions.onBlocked} is asked. */
const BLOCKED_REPORT_MS = 5_000;

interface Migration {
  tag: string;
  sql: string[];
  folderMillis: number;
  hash: string;
}

// The committed files do not change while a process runs; readiness probes ask often.
const loaded = new Map<string, Migration[]>();

function loadMigrations(folder: string): Migration[] {
  let migrations = loaded.get(folder);
  if (migrations === undefined) {
    migrations = readMigrations(folder);
    loaded.set(folder, migrations);
  }
  return migrations;
}

function readMigrations(folder: string): Migration[] {
  const files = readMigrationFiles({ migrationsFolder: folder });
  // readMigrationFiles does not return tags; the journal order is the same, so read them alongside.
  const tags = journalTags(folder);
  return files.map((file, index) => ({
    tag: tags[index] ?? `#${index}`,
    sql: file.sql,
    folderMillis: file.folderMillis,
    hash: file.hash,
  }));
}

function journalTags(folder: string): string[] {
  const journal = JSON.parse(readFileSync(`${folder}/meta/_journal.json`, 'utf8')) as {
    entries: { tag: string }[];
  };
  return journal.entries.map((entry) => entry.tag);
}

/** The deadline of a URL target's first session (and postgres.js's per-try connect timeout). */
const CONNECT_TIMEOUT_SECONDS = 10;

/**
 * Runs `use` with `target`: a client as is, or a short-lived client on a URL, ended afterwards.
 * The URL's first session has one deadline and bounded tries with backoff (first-connection.ts:
 * a connection closed before its session fails the query, which is sent again while the gate
 * allows), and `signal` abandons it: the client is ended and `withClient` rejects with the
 * signal's reason.
 */
async function withClient<T>(
  target: MigrationTarget,
  use: (sql: postgres.Sql) => Promise<T>,
  signal?: AbortSignal,
): Promise<T> {
  if (typeof target !== 'string') return use(target);
  const first = firstConnection(CONNECT_TIMEOUT_SECONDS * 1000, signal);
  // `socket` is a postgres.js option its types do not declare.
  const options: postgres.Options<Record<string, never>> & { socket: typeof first.socket } = {
    max: 1,
    onnotice: () => {},
    connect_timeout: CONNECT_TIMEOUT_SECONDS,
    // The gate's socket waits the backoff between tries; postgres.js's own would add to it.
    backoff: () => 0,
    socket: first.socket,
    onparameter: first.onparameter,
  };
  const sql = postgres(target, options);
  let abandoned = false;
  const abandon = first.failure.catch((error: unknown) => {
    abandoned = true;
    throw error;
  });
  try {
    for (;;) {
      const using = use(sql);
      // Rejected with CONNECTION_DESTROYED once an abandoned client is ended below.
      using.catch(() => {});
      try {
        return await Promise.race([using, abandon]);
      } catch (error) {
        // A connection closed before its session: nothing of `use` ran, so it is sent again
        // (the gate's next socket waits its backoff) until the gate's tries or deadline run out.
        if (abandoned || !first.retryable(error)) throw error;
      }
    }
  } finally {
    first.dispose();
    // An abandoned client still holds its query, which a plain end() would wait for.
    await sql.end(abandoned ? { timeout: 0 } : {});
  }
}

/** PostgreSQL's SQLSTATE for a write in a read-only transaction (a hot standby refuses every one). */
const READ_ONLY_SQL_TRANSACTION = '25006';

/**
 * Refuses a read-only database, then creates drizzle's bookkeeping schema and table where they
 * are missing, and only there: PostgreSQL checks CREATE on the schema (and on the database)
 * before it sees that an `if not exists` object exists, so the database's owner could not start
 * on a schema another role had migrated (review r51b: "permission denied for schema drizzle"
 * with nothing pending).
 */
async function ensureBookkeeping(
  tx: postgres.TransactionSql,
  signal: AbortSignal | undefined,
): Promise<void> {
  // A current schema needs no write, so a standby (or a database whose sessions default to
  // read-only) would pass here and then refuse every request: refused now, with PostgreSQL's
  // own SQLSTATE for a write in a read-only transaction, as the first CREATE used to be.
  const [mode] = await tx<{ readOnly: string }[]>`
    select current_setting('transaction_read_only') as "readOnly"`;
  if (mode?.readOnly === 'on') {
    throw Object.assign(new Error('cannot run migrations in a read-only transaction'), {
      code: READ_ONLY_SQL_TRANSACTION,
    });
  }
  const [found] = await tx<{ schema: string | null; table: string | null }[]>`
    select to_regnamespace('drizzle')::text as schema,
           to_regclass('drizzle.__drizzle_migrations')::text as table`;
  if (found?.schema == null) await cancellable(tx`create schema drizzle`, signal);
  if (found?.table == null) {
    await cancellable(
      tx`create table drizzle.__drizzle_migrations (
        id serial primary key, hash text not null, created_at bigint
      )`,
      signal,
    );
  }
}

/**
 * Runs `query`, cancelling it when `signal` aborts: a statement waiting on a lock (the migration
 * lock, or a table lock a backup holds) then ends with an error, the transaction rolls back, and
 * the signal's reason is what the caller sees.
 */
async function cancellable<T extends readonly postgres.MaybeRow[]>(
  query: postgres.PendingQuery<T>,
  signal?: AbortSignal,
): Promise<postgres.RowList<T>> {
  if (signal === undefined) return query;
  signal.throwIfAborted();
  const cancel = () => void query.cancel();
  signal.addEventListener('abort', cancel, { once: true });
  try {
    return await query;
  } catch (error) {
    if (signal.aborted) throw signal.reason;
    throw error;
  } finally {
    signal.removeEventListener('abort', cancel);
  }
}

/**
 * Applies every pending migration, once, even when many replicas call it at the same moment.
 * Refuses a database that records migrations newer than this build's (a newer Ledgence
 * migrated it): this build was not written for that schema.
 *
 * @param target a postgres:// URL or a postgres.js client.
 * @param options `folder` overrides the migrations folder (tests); `signal` abandons the
 *   connecting, a wait for the migration lock or a migration statement; `onWait` learns of a
 *   wait for the lock, `onBlocked` of a statement waiting on other sessions;
 *   `onConnected` of the session established.
 * @returns the tags this call applied.
 */
export async function migrate(
  target: MigrationTarget,
  options: MigrateOptions = {},
): Promise<MigrationResult> {
  const migrations = loadMigrations(options.folder ?? MIGRATIONS_FOLDER);
  options.signal?.throwIfAborted();
  return withClient(
    target,
    (sql) =>
      sql.begin(async (tx) => {
        options.onConnected?.();
        await takeMigrationLock(tx, options);
        // After the lock: a migrator that ran first has committed its schema and rows by now.
        await ensureBookkeeping(tx, options.signal);
        const newer = await unknownMigrations(tx, migrations);
        if (newer.length > 0) {
          throw new Error(
            `The database was migrated by a newer Ledgence: it records ${newer.length} ` +
              `migration(s) this build does not know (${newer.join('; ')}). Upgrade this server ` +
              'to that version or later; an older one must not run against the newer schema. ' +
              "(Should another application's drizzle migrations share drizzle.__drizzle_migrations " +
              'in this database, give Ledgence a database of its own instead.)',
          );
        }
        const last = await lastApplied(tx);
        const [session] = await tx<{ pid: number }[]>`select pg_backend_pid() as pid`;
        const backendPid = session?.pid ?? 0;
        const applied: string[] = [];
        for (const migration of migrations) {
          if (last !== null && last >= migration.folderMillis) continue;
          for (const statement of migration.sql) {
            if (statement.trim() === '') continue;
            await reportingBlockers(
              cancellable(tx.unsafe(statement), options.signal),
              typeof target === 'string' ? target : undefined,
              backendPid,
              options.onBlocked,
            );
          }
          await tx`
          insert into drizzle.__drizzle_migrations (hash, created_at)
          values (${migration.hash}, ${migration.folderMillis})`;
          applied.push(migration.tag);
        }
        return { applied };
      }),
    options.signal,
  );
}

/**
 * Takes the transaction-scoped migration lock, waiting while another session holds it: first
 * a try, so that a wait is reported (once) with the holder's pid; then a blocking wait (queued
 * fairly behind the holder), which `signal` cancels.
 */
async function takeMigrationLock(
  tx: postgres.TransactionSql,
  options: Pick<MigrateOptions, 'signal' | 'onWait'>,
): Promise<void> {
  const key = MIGRATION_LOCK_KEY.toString();
  const [tried] = await tx<{ locked: boolean }[]>`
    select pg_try_advisory_xact_lock(${key}::bigint) as locked`;
  if (tried?.locked === true) return;
  options.onWait?.(await lockHolder(tx));
  await cancellable(tx`select pg_advisory_xact_lock(${key}::bigint)`, options.signal);
}

/**
 * Awaits `statement`; should it still run after {@link BLOCKED_REPORT_MS}, asks PostgreSQL on a
 * connection of its own which sessions block backend `pid` and tells `onBlocked` (review r51b: a
 * start whose ALTER TABLE queued behind a pg_dump waited in silence). The question is best effort:
 * a failure to ask is ignored, and the statement's own outcome is what counts.
 */
async function reportingBlockers<T>(
  statement: Promise<T>,
  url: string | undefined,
  pid: number,
  onBlocked: ((blockerPids: number[]) => void) | undefined,
): Promise<T> {
  if (url === undefined || onBlocked === undefined) return statement;
  let done = false;
  const timer = setTimeout(async () => {
    const probe = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 5 });
    try {
      const [row] = await probe<{ pids: number[] }[]>`select pg_blocking_pids(${pid}) as pids`;
      if (!done && row !== undefined && row.pids.length > 0) onBlocked(row.pids);
    } catch {
      // Best effort: the report is a hint, the migration goes on either way.
    } finally {
      await probe.end({ timeout: 1 });
    }
  }, BLOCKED_REPORT_MS);
  try {
    return await statement;
  } finally {
    done = true;
    clearTimeout(timer);
  }
}

/** The backend pid holding the migration lock in this database, if PostgreSQL shows one. */
async function lockHolder(tx: postgres.TransactionSql): Promise<number | undefined> {
  // A bigint advisory lock shows as classid (high 32 bits), objid (low 32 bits), objsubid 1.
  const high = (MIGRATION_LOCK_KEY >> 32n).toString();
  const low = (MIGRATION_LOCK_KEY & 0xffff_ffffn).toString();
  const [holder] = await tx<{ pid: number }[]>`
    select pid from pg_locks
    where locktype = 'advisory' and granted and objsubid = 1
      and classid::bigint = ${high}::bigint and objid::bigint = ${low}::bigint
      and database = (select oid from pg_database where datname = current_database())
    limit 1`;
  return holder?.pid;
}

/** Recorded migrations newer than every one in `migrations`, described (oldest first). */
async function unknownMigrations(
  sql: postgres.Sql | postgres.TransactionSql,
  migrations: readonly Migration[],
): Promise<string[]> {
  const newest = migrations.reduce((max, m) => Math.max(max, m.folderMillis), 0);
  const rows = await sql<{ hash: string; created_at: string | number }[]>`
    select hash, created_at from drizzle.__drizzle_migrations
    where created_at > ${newest} order by created_at`;
  return rows.map((row) => {
    const when = new Date(Number(row.created_at));
    const time = Number.isNaN(when.getTime()) ? String(row.created_at) : when.toISOString();
    return `created ${time}, hash ${row.hash.slice(0, 12)}`;
  });
}

async function lastApplied(sql: postgres.Sql | postgres.TransactionSql): Promise<number | null> {
  const rows = await sql<{ created_at: string | number | null }[]>`
    select created_at from drizzle.__drizzle_migrations order by created_at desc limit 1`;
  const value = rows[0]?.created_at;
  return value === undefined || value === null ? null : Number(value);
}

/**
 * Which committed migrations the database has applied and which are pending, without changing
 * anything (for `/readyz`: a replica whose schema is behind is not ready).
 *
 * @param target a postgres:// URL or a postgres.js client.
 */
export async function migrationStatus(
  target: MigrationTarget,
  options: { folder?: string } = {},
): Promise<MigrationStatus> {
  const migrations = loadMigrations(options.folder ?? MIGRATIONS_FOLDER);
  return withClient(target, async (sql) => {
    const [exists] = await sql<{ found: string | null }[]>`
      select to_regclass('drizzle.__drizzle_migrations')::text as found`;
    const last = exists?.found ? await lastApplied(sql) : null;
    const unknown = exists?.found ? await unknownMigrations(sql, migrations) : [];
    const applied = migrations.filter((m) => last !== null && last >= m.folderMillis);
    const pending = migrations.filter((m) => last === null || last < m.folderMillis);
    return {
      applied: applied.map((m) => m.tag),
      pending: pending.map((m) => m.tag),
      unknown,
      current: pending.length === 0 && unknown.length === 0,
    };
  });
}

/** The tags of committed migrations the database has not applied yet. */
export async function pendingMigrations(target: MigrationTarget): Promise<string[]> {
  return (await migrationStatus(target)).pending;
}
