import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { migrate, migrationStatus, pendingMigrations } from './migrate.js';
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
        'concurrency_keys',
        'consumer_cursors',
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
});
