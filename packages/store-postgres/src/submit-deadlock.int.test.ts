/**
 * Overlapping batch submits must not deadlock on rows neither has committed: brand-new
 * concurrency-key rows and brand-new idempotency keys. Two batches naming the same new keys in
 * opposite orders, each spanning two insert chunks, used to take them in their request order,
 * chunk by chunk: each held the keys of its first chunk and waited for the other's in its
 * second, PostgreSQL aborted one after `deadlock_timeout`, and that batch was answered item by
 * item in transactions of their own. Every submit now takes these rows in one global order.
 *
 * The store answers a deadlocked batch correctly (one item at a time), so the answers alone
 * cannot show the deadlock: the database's `pg_stat_database.deadlocks` counter does.
 */
import type { SubmitCommand } from '@ledgence/contracts';
import type { ItemResult, SubmitOutcome } from '@ledgence/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresTaskStore, type PostgresTaskStore, SUBMIT_CHUNK } from './store.js';
import { CONFIG, type Harness, harness, submitCommand } from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('submit_deadlock');
});
afterAll(() => h.close());

/** Rounds per scenario: the two batches of a round must overlap, which nearly every round does. */
const ROUNDS = 4;
/** Items per batch: two chunks, so each batch holds one chunk's keys while it sends the next. */
const ITEMS = 2 * SUBMIT_CHUNK;

/**
 * Two stores, each with its own pool, whose connections are opened before the rounds start, so
 * the two batches of a round begin together. They are closed before the counter is read.
 */
async function twoStores(): Promise<[PostgresTaskStore, PostgresTaskStore]> {
  const make = () => createPostgresTaskStore({ url: h.db.url, config: CONFIG, max: 2 });
  const stores: [PostgresTaskStore, PostgresTaskStore] = [make(), make()];
  await Promise.all(stores.map((s) => s.sql`select 1`));
  return stores;
}

/**
 * The deadlocks PostgreSQL detected in this database, once the stores' backends have exited: a
 * backend reports its pending counts before it leaves `pg_stat_activity` (a busy backend may
 * otherwise hold them back for up to a second).
 */
async function deadlocks(stores: readonly PostgresTaskStore[]): Promise<number> {
  await Promise.all(stores.map((s) => s.close()));
  for (;;) {
    const [row] = await h.sql`select count(*)::int as n from pg_stat_activity
      where datname = current_database() and application_name = 'ledgence-store'`;
    if (Number(row?.n) === 0) break;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  const [row] = await h.sql`select deadlocks::int as n from pg_stat_database
    where datname = current_database()`;
  return Number(row?.n);
}

function values(results: ItemResult<SubmitOutcome>[]): SubmitOutcome[] {
  return results.map((result) => {
    if (!result.ok) throw result.error;
    return result.value;
  });
}

const pad = (i: number) => String(i).padStart(4, '0');

it('two batches creating the same new concurrency keys in opposite orders do not deadlock', async () => {
  const before = await deadlocks([]);
  const stores = await twoStores();
  for (let round = 0; round < ROUNDS; round += 1) {
    // One new key per item; the second batch names them in reverse, so its first chunk creates
    // the keys of the first batch's second chunk. Idempotency keys follow the position in the
    // batch, not the concurrency key: in idempotency-key order too the two orders are opposite.
    const keys = Array.from({ length: ITEMS }, (_, i) => `ck-${round}-${pad(i)}`);
    const batch = (side: string, order: readonly string[]): SubmitCommand[] =>
      order.map((key, i) => submitCommand(`${side}-${round}-${pad(i)}`, { concurrency_key: key }));
    const forward = batch('a', keys);
    const backward = batch('b', [...keys].reverse());
    const [a, b] = await Promise.all([
      stores[0].submitBatch(forward),
      stores[1].submitBatch(backward),
    ]);
    for (const [commands, results] of [
      [forward, a],
      [backward, b],
    ] as const) {
      expect(values(results).map((v) => [v.created, v.snapshot.idempotency_key])).toEqual(
        commands.map((c) => [true, c.idempotency_key]),
      );
      expect(values(results).map((v) => v.snapshot.input.concurrency_key)).toEqual(
        commands.map((c) => c.input.concurrency_key),
      );
    }
  }
  expect(await deadlocks(stores)).toBe(before);
  const [row] = await h.sql`select count(*)::int as n from concurrency_keys
    where concurrency_key like 'ck-%' and active = 0`;
  expect(row?.n).toBe(ROUNDS * ITEMS);
});

it('two batches submitting the same new idempotency keys in opposite orders do not deadlock', async () => {
  const before = await deadlocks([]);
  const stores = await twoStores();
  for (let round = 0; round < ROUNDS; round += 1) {
    const forward = Array.from({ length: ITEMS }, (_, i) =>
      submitCommand(`idem-${round}-${pad(i)}`, { queue: 'idem' }),
    );
    const backward = [...forward].reverse();
    const [a, b] = await Promise.all([
      stores[0].submitBatch(forward),
      stores[1].submitBatch(backward),
    ]);
    const taskOf = new Map<string, string>();
    const createdBy = new Map<string, number>();
    for (const [commands, results] of [
      [forward, a],
      [backward, b],
    ] as const) {
      const answered = values(results);
      // Request order: each answer is its own item's.
      expect(answered.map((v) => v.snapshot.idempotency_key)).toEqual(
        commands.map((c) => c.idempotency_key),
      );
      for (const { created, snapshot } of answered) {
        const key = snapshot.idempotency_key;
        // The replay answers with the task the other batch created.
        const known = taskOf.get(key);
        if (known === undefined) taskOf.set(key, snapshot.task_id);
        else expect(snapshot.task_id).toBe(known);
        if (created) createdBy.set(key, (createdBy.get(key) ?? 0) + 1);
      }
    }
    expect([...createdBy.values()]).toEqual(forward.map(() => 1));
  }
  expect(await deadlocks(stores)).toBe(before);
  const [row] = await h.sql`select count(*)::int as n from tasks where queue = 'idem'`;
  expect(row?.n).toBe(ROUNDS * ITEMS);
});

it('two one-statement submits of the same new idempotency keys in opposite orders do not deadlock', async () => {
  // A batch of one chunk without concurrency keys is one statement (no BEGIN): its rows meet
  // the other batch's in the middle of the statement.
  const before = await deadlocks([]);
  const stores = await twoStores();
  for (let round = 0; round < 2 * ROUNDS; round += 1) {
    const forward = Array.from({ length: SUBMIT_CHUNK }, (_, i) =>
      submitCommand(`one-${round}-${pad(i)}`, { queue: 'one' }),
    );
    const backward = [...forward].reverse();
    const [a, b] = await Promise.all([
      stores[0].submitBatch(forward),
      stores[1].submitBatch(backward),
    ]);
    const tasks = new Map(values(a).map((v) => [v.snapshot.idempotency_key, v.snapshot.task_id]));
    expect(values(a).map((v) => v.snapshot.idempotency_key)).toEqual(
      forward.map((c) => c.idempotency_key),
    );
    expect(values(b).map((v) => [v.snapshot.idempotency_key, v.snapshot.task_id])).toEqual(
      backward.map((c) => [c.idempotency_key, tasks.get(c.idempotency_key)]),
    );
    const created = [...values(a), ...values(b)].filter((v) => v.created).length;
    expect(created).toBe(SUBMIT_CHUNK);
  }
  expect(await deadlocks(stores)).toBe(before);
});
