/**
 * The store's own pool bounds how long an operation waits for a row lock, and ends
 * transactions left idle by a frozen process.
 */
import { ContractError } from '@ledgence/contracts';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore, type PostgresTaskStore } from './store.js';
import { SCOPE, submitCommand } from './testdata/fixtures.js';
import type { TestDatabase } from './testing/database.js';
import { createMigratedTestDatabase } from './testing/migrated.js';

describe('store session timeouts', () => {
  let db: TestDatabase;
  let store: PostgresTaskStore;
  let other: postgres.Sql;

  beforeAll(async () => {
    db = await createMigratedTestDatabase('timeouts');
    store = createPostgresTaskStore({
      url: db.url,
      lockTimeoutMs: 300,
      idleInTransactionTimeoutMs: 1_500,
    });
    other = postgres(db.url, { max: 1, onnotice: () => {} });
  });
  afterAll(async () => {
    await other.end();
    await store.close();
    await db.drop();
  });

  it('applies both settings to the pool', async () => {
    const [row] = await store.sql`
      select current_setting('lock_timeout') as lock,
             current_setting('idle_in_transaction_session_timeout') as idle`;
    expect(row).toEqual({ lock: '300ms', idle: '1500ms' });
  });

  it('answers unavailable instead of waiting behind a held row lock, and succeeds after', async () => {
    const { snapshot } = await store.submit(submitCommand('locked'));
    let release = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    let locked = () => {};
    const isLocked = new Promise<void>((resolve) => {
      locked = resolve;
    });
    const holder = other.begin(async (tx) => {
      await tx`select 1 from tasks where task_id = ${snapshot.task_id} for update`;
      locked();
      await held;
    });
    await isLocked;
    const error = await store.cancel(SCOPE, snapshot.task_id).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractError);
    expect((error as ContractError).code).toBe('unavailable');
    release();
    await holder;
    // Nothing was written by the failed attempt; the retry takes effect once.
    expect(await store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    const history = await store.history(SCOPE, snapshot.task_id, 0);
    expect(history.map((h) => h.event.reason)).toEqual(['submitted', 'cancelled']);
  });
});
