/**
 * A migration pass whose connection dies half-way (the server process killed while
 * migrating) leaves nothing half-applied, and the next start applies everything (migrate.ts: "runs
 * the whole pass in ONE transaction … a migrator that dies never leaves the lock behind"). Driven
 * through the test proxy so the wire breaks at one exact statement, between migrations.
 */
import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { migrate, migrationStatus } from './migrate.js';
import { createTestDatabase, startPgProxy, type TestDatabase } from './testing/index.js';

const created: TestDatabase[] = [];
afterAll(() => Promise.all(created.map((db) => db.drop())));

describe('a migration pass interrupted mid-way', () => {
  it('leaves no table or bookkeeping row of the pass, and the next pass applies every migration', async () => {
    const db = await createTestDatabase({ prefix: 'migrate_interrupt' });
    created.push(db);
    const proxy = await startPgProxy(db.url);
    try {
      // 0003's first statement: 0000 to 0002 have run in the pass's transaction by then.
      const held = proxy.holdRequestCarrying('ADD COLUMN "retiring_before"');
      const migrating = migrate(proxy.url).then(
        () => 'migrated',
        (error: unknown) => error,
      );
      await held;
      // The process dies: its connection is reset with the statement unsent.
      proxy.refuse(true);
      const outcome = await migrating;
      expect(outcome).toBeInstanceOf(Error);
      proxy.refuse(false);

      const sql = postgres(db.url, { max: 1, onnotice: () => {} });
      try {
        const tables = await sql`
          select tablename from pg_tables where schemaname = 'public'`;
        expect(tables).toEqual([]);
      } finally {
        await sql.end();
      }
      const status = await migrationStatus(db.url);
      expect(status.applied).toEqual([]);

      // The next start: it may wait for the dead session's lock, then applies all of them.
      const again = await migrate(db.url);
      expect(again.applied).toEqual(status.pending);
      expect((await migrationStatus(db.url)).current).toBe(true);
    } finally {
      await proxy.close();
    }
  });

  it('a pass whose COMMIT reply is lost has applied everything, and the next pass applies nothing', async () => {
    const db = await createTestDatabase({ prefix: 'migrate_commit_lost' });
    created.push(db);
    const proxy = await startPgProxy(db.url);
    try {
      const pending = (await migrationStatus(db.url)).pending;
      proxy.loseReplyCarrying('COMMIT');
      const outcome = await migrate(proxy.url).then(
        () => 'migrated',
        (error: unknown) => error,
      );
      expect(proxy.lostReplies()).toBe(1);
      expect(outcome).toBeInstanceOf(Error);
      const again = await migrate(db.url);
      expect(again.applied).toEqual([]);
      const status = await migrationStatus(db.url);
      expect(status.applied).toEqual(pending);
      expect(status.current).toBe(true);
    } finally {
      await proxy.close();
    }
  });
});
