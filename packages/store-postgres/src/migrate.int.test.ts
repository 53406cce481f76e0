import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import {
  MIGRATION_LOCK_KEY,
  MIGRATIONS_FOLDER,
  migrate,
  migrationStatus,
  pendingMigrations,
} from './migrate.js';
import { createTestDatabase, type TestDatabase } from './testing/index.js';

const created: TestDatabase[] = [];
afterAll(() => Promise.all(created.map((db) => db.drop())));

async function fresh(): Promise<TestDatabase> {
  const db = await createTestDatabase({ prefix: 'migrate' });
  created.push(db);
  return db;
}

describe('migrate', () => {
  it('applies every migration to a fresh database, then is a no-op', async () => {
    const db = await fresh();
    const before = await migrationStatus(db.url);
    expect(before.current).toBe(false);
    expect(before.applied).toEqual([]);
    const first = await migrate(db.url);
    expect(first.applied).toEqual(before.pending);
    expect(await pendingMigrations(db.url)).toEqual([]);
    const again = await migrate(db.url);
    expect(again.applied).toEqual([]);
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const tables = await sql<{ name: string }[]>`
        select tablename as name from pg_tables where schemaname = 'public' order by 1`;
      expect(tables.map((t) => t.name)).toEqual([
        'attempts',
        'completion_deliveries',
        'completion_subscriptions',
        'concurrency_keys',
        'consumer_cursors',
        'retention_policies',
        'task_history',
        'task_payloads',
        'tasks',
        'worker_sessions',
      ]);
      const [options] = await sql<{ options: string[] }[]>`
        select reloptions as options from pg_class where relname = 'tasks'`;
      expect(options?.options).toContain('fillfactor=80');
      const [collation] = await sql<{ collation: string }[]>`
        select collation_name as collation from information_schema.columns
        where table_name = 'tasks' and column_name = 'task_id'`;
      expect(collation?.collation).toBe('C');
      const [{ count } = { count: '0' }] = await sql<{ count: string }[]>`
        select count(*)::text as count from drizzle.__drizzle_migrations`;
      expect(Number(count)).toBe(first.applied.length);
    } finally {
      await sql.end();
    }
  });

  it('two concurrent migrators both succeed and the migrations apply once', async () => {
    const db = await fresh();
    const pending = await pendingMigrations(db.url);
    const [a, b] = await Promise.all([migrate(db.url), migrate(db.url)]);
    // One of them applied everything; the other waited on the lock and found nothing to do.
    expect([a?.applied, b?.applied].sort((x, y) => (y?.length ?? 0) - (x?.length ?? 0))).toEqual([
      pending,
      [],
    ]);
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const rows = await sql`select hash from drizzle.__drizzle_migrations`;
      expect(rows).toHaveLength(pending.length);
    } finally {
      await sql.end();
    }
    expect((await migrationStatus(db.url)).current).toBe(true);
  });

  it('waits for the migration lock another session holds, naming its pid once, until aborted', async () => {
    const db = await fresh();
    const holder = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const reserved = await holder.reserve();
      await reserved`select pg_advisory_lock(${MIGRATION_LOCK_KEY.toString()}::bigint)`;
      const [held] = await reserved<{ pid: number }[]>`select pg_backend_pid() as pid`;
      const waits: (number | undefined)[] = [];
      const abort = new AbortController();
      const migrating = migrate(db.url, {
        signal: abort.signal,
        onWait: (pid) => waits.push(pid),
      }).then(
        () => 'migrated',
        (error: unknown) => error,
      );
      for (let i = 0; i < 300 && waits.length === 0; i++) {
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(waits).toEqual([held?.pid]);
      const reason = new Error('stop waiting');
      abort.abort(reason);
      expect(await migrating).toBe(reason);
      // Nothing was applied: the waiting transaction rolled back.
      expect((await migrationStatus(db.url)).applied).toEqual([]);
      reserved.release();
    } finally {
      await holder.end({ timeout: 1 });
    }
  });

  it('accepts a postgres.js client', async () => {
    const db = await fresh();
    const sql = postgres(db.url, { max: 2, onnotice: () => {} });
    try {
      expect((await migrate(sql)).applied.length).toBeGreaterThan(0);
      expect((await migrationStatus(sql)).current).toBe(true);
    } finally {
      await sql.end();
    }
  });

  it('upgrades a database migrated with 0000 only, keeping its rows (0001, 0002, 0003)', async () => {
    // The committed folder as it was before 0001: the first migration and a one-entry journal.
    const folder = mkdtempSync(join(tmpdir(), 'ledgence-migrations-'));
    try {
      cpSync(MIGRATIONS_FOLDER, folder, { recursive: true });
      const journalPath = join(folder, 'meta', '_journal.json');
      const journal = JSON.parse(readFileSync(journalPath, 'utf8')) as { entries: unknown[] };
      journal.entries = journal.entries.slice(0, 1);
      writeFileSync(journalPath, JSON.stringify(journal));
      const db = await fresh();
      expect((await migrate(db.url, { folder })).applied).toEqual(['0000_init']);
      const sql = postgres(db.url, { max: 1, onnotice: () => {} });
      try {
        await sql`
          insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key,
            command_digest, input, queue, program, retry, timeout_ms, priority, labels, state,
            submitted_at, available_at, terminal_at, attempt_count, dispatch_count,
            history_sequence)
          values ('acme', 'prod', 'tsk_old', 'run_old', 'old', 'x', '{}', 'q', '{}', '{}', 1, 0,
            '{}', 'succeeded', 1, 1, 2, 1, 1, 3)`;
        const status = await migrationStatus(db.url);
        expect(status.applied).toEqual(['0000_init']);
        const later = [
          '0001_completion_retention',
          '0002_submit_digest_optional',
          '0003_retention_floor',
        ];
        expect(status.pending).toEqual(later);
        expect((await migrate(db.url)).applied).toEqual(later);
        expect((await migrationStatus(db.url)).current).toBe(true);
        const [kept] = await sql`select count(*)::int as n from tasks where terminal_at = 2`;
        expect(kept?.n).toBe(1);
        // 0002: the old task keeps its digest; a new one may record none.
        const [old] = await sql`select command_digest from tasks where task_id = 'tsk_old'`;
        expect(old?.command_digest).toBe('x');
        const [column] = await sql`
          select is_nullable from information_schema.columns
          where table_name = 'tasks' and column_name = 'command_digest'`;
        expect(column?.is_nullable).toBe('YES');
        const indexes = await sql<{ name: string }[]>`
          select indexname as name from pg_indexes
          where indexname in ('tasks_retention', 'completion_deliveries_lease',
            'worker_sessions_retention')
          order by 1`;
        expect(indexes.map((i) => i.name)).toEqual([
          'completion_deliveries_lease',
          'tasks_retention',
          'worker_sessions_retention',
        ]);
        // 0003: existing policies have no retiring floor until they are next set.
        const [floor] = await sql`
          select is_nullable from information_schema.columns
          where table_name = 'retention_policies' and column_name = 'retiring_before'`;
        expect(floor?.is_nullable).toBe('YES');
      } finally {
        await sql.end();
      }
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
  });
});

describe('migrate against a database migrated by a newer version', () => {
  /** The committed migrations plus one a future version adds (`9999_future`). */
  function futureFolder(): string {
    const folder = mkdtempSync(join(tmpdir(), 'ledgence-future-migrations-'));
    cpSync(MIGRATIONS_FOLDER, folder, { recursive: true });
    const journalPath = join(folder, 'meta', '_journal.json');
    const journal = JSON.parse(readFileSync(journalPath, 'utf8')) as {
      entries: { idx: number; version: string; when: number; tag: string; breakpoints: boolean }[];
    };
    const last = journal.entries[journal.entries.length - 1];
    if (last === undefined) throw new Error('no committed migrations');
    journal.entries.push({
      idx: last.idx + 1,
      version: last.version,
      when: last.when + 86_400_000,
      tag: '9999_future',
      breakpoints: true,
    });
    writeFileSync(journalPath, JSON.stringify(journal));
    writeFileSync(
      join(folder, '9999_future.sql'),
      'ALTER TABLE "tasks" ADD COLUMN "future_required" integer NOT NULL DEFAULT 0;',
    );
    return folder;
  }

  it('refuses to migrate, saying to upgrade, and reports the schema not current', async () => {
    const db = await fresh();
    const folder = futureFolder();
    try {
      // A newer release migrated this database (all of ours, plus one we do not know).
      const newer = await migrate(db.url, { folder });
      expect(newer.applied).toContain('9999_future');
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }

    // This (older) build must not start, nor be ready, on a schema it was not written for.
    await expect(migrate(db.url)).rejects.toThrow(
      /migrated by a newer Ledgence: it records 1 migration\(s\) this build does not know \(created [^)]*\)\. Upgrade this server/,
    );
    const status = await migrationStatus(db.url);
    expect(status).toMatchObject({ current: false, pending: [] });
    expect(status.unknown).toHaveLength(1);
  });
});
