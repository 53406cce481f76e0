/**
 * The store's own pool bounds how long an operation waits for a row lock, and ends
 * transactions left idle by a frozen process. And a task's own execution budget is bounded
 * below by the store's lease safety margin at submit.
 */
import { ContractError } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
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

describe('execution budget at submit (DESIGN §5 dispatch margin)', () => {
  let db: TestDatabase;
  let store: PostgresTaskStore;

  beforeAll(async () => {
    db = await createMigratedTestDatabase('timeouts_budget');
    // The default configuration: a 5 s lease safety margin (LEASE_SAFETY_MARGIN_MS).
    store = createPostgresTaskStore({ url: db.url });
  });
  afterAll(async () => {
    await store.close();
    await db.drop();
  });

  // Dispatch is never granted with no more budget than the margin left, and an attempt never
  // granted dispatch does not count against max_attempts: a task whose budget leaves the
  // dispatch renewal less than MIN_DISPATCH_WINDOW_MS above the margin would be re-queued by
  // lease recovery for ever. It is refused at submit instead.
  it('refuses a timeout_ms less than MIN_DISPATCH_WINDOW_MS above the margin, alone or in a batch, and takes no key', async () => {
    const refusal = {
      code: 'invalid_input',
      path: '$.input.timeout_ms',
      message: expect.stringContaining('use at least 5500'),
    };
    const short = submitCommand('short-timeout', {
      timeout_ms: 3_000, // within the contract's 1 000..86 400 000
      retry: { max_attempts: 2, delay_ms: 1 },
    });
    const error = await store.submit(short).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractError);
    expect(error).toMatchObject(refusal);
    const [ok, refused] = await store.submitBatch([
      submitCommand('at-the-bound', { timeout_ms: 5_500 }),
      submitCommand('one-below-the-bound', { timeout_ms: 5_499 }),
    ]);
    if (!ok?.ok) throw new Error('expected the task at the bound to be created');
    expect(refused).toMatchObject({ ok: false, error: refusal });
    const listed = await store.listTasks(SCOPE, { filters: {} });
    expect(listed.tasks.map((t) => t.task_id)).toEqual([ok.value.snapshot.task_id]);
  });

  it('answers a replay of a task accepted under a shorter margin as before', async () => {
    // A replica with a shorter margin (or an earlier version) accepted it.
    const shorter = createPostgresTaskStore({
      url: db.url,
      config: lifecycleConfig({ leaseSafetyMarginMs: 500 }),
    });
    try {
      const command = submitCommand('accepted-before', { timeout_ms: 1_000 });
      const first = await shorter.submit(command);
      expect(first.created).toBe(true);
      expect(await store.submit(command)).toEqual({ created: false, snapshot: first.snapshot });
    } finally {
      await shorter.close();
    }
  });
});
