/**
 * A submit writes the concurrency-key rows of the tasks it creates, and nothing else:
 * - a submit refused as a `conflict` (its idempotency key is held by a stored task naming another
 *   key) changes nothing, so it creates no key row — such a row (active 0) was written before,
 *   and retention, which deletes only the rows of the keys of the tasks it collects, never
 *   removed it;
 * - a key whose row exists is not touched: a submit does not wait for a claim or settle holding
 *   that row. It waited before (an `on conflict` check waits out the row's updater), and a
 *   submit that had just created one new key row and then waited so for a claim's key closed a
 *   cycle with a claim taking that new key without waiting (`takeConcurrencySlotNoWait`), which
 *   PostgreSQL broke after `deadlock_timeout` by aborting one.
 */
import type { SubmitCommand } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Harness, harness, SCOPE, submitCommand } from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('submit_key_rows');
});
afterAll(() => h.close());

/** The key rows named `prefix…` of the test scope, as `key → active`. */
async function keyRows(prefix: string): Promise<Record<string, number>> {
  const rows = await h.sql`select concurrency_key, active from concurrency_keys
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
      and starts_with(concurrency_key, ${prefix})
    order by concurrency_key`;
  return Object.fromEntries(rows.map((r) => [String(r.concurrency_key), Number(r.active)]));
}

const keyed = (idem: string, key: string, data: unknown = idem): SubmitCommand =>
  submitCommand(idem, { queue: 'key-rows', concurrency_key: key, data });

describe('a refused submit', () => {
  it('creates no key row for a single submit conflicting with a stored task of another key', async () => {
    await h.store.submit(keyed('single-held', 'single-a'));
    await expect(h.store.submit(keyed('single-held', 'single-b'))).rejects.toMatchObject({
      code: 'conflict',
    });
    expect(await keyRows('single-')).toEqual({ 'single-a': 0 });
  });

  it('creates no key row for the conflicting items of a batch, and the rows of its new tasks', async () => {
    await h.store.submit(keyed('batch-held', 'batch-a'));
    const results = await h.store.submitBatch([
      keyed('batch-held', 'batch-b'), // conflict: the stored task names batch-a
      keyed('batch-new', 'batch-c'),
      keyed('batch-held', 'batch-a', 'other data'), // conflict with the same key
      submitCommand('batch-unkeyed', { queue: 'key-rows' }), // no key at all
    ]);
    expect(results.map((r) => (r.ok ? r.value.created : r.error.code))).toEqual([
      'conflict',
      true,
      'conflict',
      true,
    ]);
    expect(await keyRows('batch-')).toEqual({ 'batch-a': 0, 'batch-c': 0 });
  });

  it('creates no key row for a replay either', async () => {
    await h.store.submit(keyed('replay-held', 'replay-a'));
    // Retention deleted the idle key's row (key-rows-retention.int.test.ts); the task remains.
    await h.sql`delete from concurrency_keys where concurrency_key = 'replay-a'`;
    const replay = await h.store.submit(keyed('replay-held', 'replay-a'));
    expect(replay.created).toBe(false);
    expect(await keyRows('replay-')).toEqual({});
  });
});

describe('a key row that exists', () => {
  it('is not waited for: a submit of its key commits while a claim holds the row', async () => {
    await h.store.submit(keyed('held-first', 'held-key'));
    // A claim's slot taken and not committed yet (takeConcurrencySlot's update), held until the
    // submit below has answered.
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let holding!: () => void;
    const held = new Promise<void>((resolve) => {
      holding = resolve;
    });
    const claim = h.sql.begin(async (tx) => {
      await tx`update concurrency_keys set active = active + 1
        where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
          and concurrency_key = 'held-key'`;
      holding();
      await released;
      await tx`select 1`;
      throw new Error('rolled back');
    });
    try {
      await held;
      // Either the submits answer, or one of them waits for the claim's row lock.
      const outcome = await Promise.race([
        Promise.all([
          h.store.submit(keyed('held-second', 'held-key')),
          // With a new key beside it: the shape that closed the deadlock cycle.
          h.store.submitBatch([keyed('held-third', 'held-key'), keyed('held-fourth', 'held-new')]),
        ]).then(() => 'answered'),
        h.untilLockWaits(1).then(() => 'waited for the claim'),
      ]);
      expect(outcome).toBe('answered');
    } finally {
      release();
      await claim.catch(() => {});
    }
    expect(await keyRows('held-')).toEqual({ 'held-key': 0, 'held-new': 0 });
  });
});
