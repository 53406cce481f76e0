/**
 * A transaction that locks a queued task's row and is then refused (a `409`) held the row as a
 * committed no-op does: a parked poll whose probe skipped the row (`FOR UPDATE SKIP LOCKED`)
 * found nothing and parked. A refused subscribe (`subscription_key` reused with another
 * destination) or redeliver (the generation still `waiting`) must hint the queue as a committed
 * one does (locked-queued-wake.int.test.ts), or the poll waits for the rescan or the end of its
 * long poll although the task was claimable from the moment the lock was released (DESIGN §5:
 * a parked poll "is woken by NOTIFY on that queue, with a periodic rescan as fallback"). A
 * NOTIFY reaches listeners only on COMMIT, so such a refusal commits and is thrown after it.
 *
 * The interleaving is forced: the store's subscribe / redeliver is made to wait, after it locked
 * the task row, on a lock another connection holds; the poll probes and parks meanwhile. The
 * rescan interval is 60 s, the long poll 15 s: only a wake answers the poll within half of it.
 */
import postgres from 'postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';
import { parkedPoll } from './testdata/parked.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
let holders: postgres.Sql;
const cleanups: (() => Promise<void>)[] = [];
beforeAll(async () => {
  h = await harness('refused_lock_wake');
  holders = postgres(h.db.url, { max: 2, onnotice: () => {} });
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
});
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup().catch(() => {});
  await holders.end({ timeout: 1 });
  await wake.close();
  await h.close();
});

const WAIT = 15_000;

/**
 * Runs `refused` (a store call that locks the queued task, then waits on `hold`'s lock, then is
 * refused) while a poll parks; returns the poll's answer and how long after the refusal it came.
 */
async function scenario(
  queue: string,
  setup: (taskId: string) => Promise<void>,
  hold: (holder: postgres.ReservedSql, taskId: string) => Promise<void>,
  refused: (store: ReturnType<Harness['makeStore']>, taskId: string) => Promise<unknown>,
): Promise<{ refusal: string; disposition: string; waited: number }> {
  const { snapshot } = await h.store.submit(submitCommand(`${queue}-1`, { queue }));
  const taskId = snapshot.task_id;
  await setup(taskId);
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });

  const holder = await holders.reserve();
  let held = true;
  cleanups.push(async () => {
    if (!held) return;
    held = false;
    await holder`rollback`;
    holder.release();
  });
  await holder`begin`;
  await hold(holder, taskId);

  const other = h.makeStore(1);
  const call = refused(other, taskId).then(
    () => 'ok',
    (error: { code?: string }) => error.code ?? String(error),
  );
  await h.untilLockWaits(1);
  const free = await h.sql`select task_id from tasks where task_id = ${taskId}
    for update skip locked`;
  expect(free).toHaveLength(0); // the refused call holds the queued task's row

  const poll = parkedPoll(h.store, wake, acquireCommand(session.id, 0, 1, queue), WAIT);
  const probe = await poll.probed;
  expect(probe.reply.disposition).toBe('empty');

  held = false;
  await holder`rollback`;
  holder.release();
  const refusal = await call;
  const freedAt = performance.now();
  const answer = await poll.answered;
  const waited = performance.now() - freedAt;
  await other.close();
  return { refusal, disposition: answer.disposition, waited };
}

it('a subscribe refused as a conflict (key reused, another destination) after locking a queued task wakes the parked poll at once', async () => {
  const result = await scenario(
    'sub-conflict',
    async (taskId) => {
      await h.store.subscribe(SCOPE, taskId, { subscription_key: 'k1', destination: 'billing' });
    },
    // The store's subscribe reads the task's subscriptions after locking the task: a table
    // lock held elsewhere makes that read wait with the task row held.
    async (holder) => {
      await holder`lock table completion_subscriptions in access exclusive mode`;
    },
    (store, taskId) =>
      store.subscribe(SCOPE, taskId, { subscription_key: 'k1', destination: 'audit' }),
  );
  expect(result.refusal).toBe('conflict');
  expect(result.disposition).toBe('assigned');
  expect(result.waited).toBeLessThan(WAIT / 2);
}, 40_000);

it('a redeliver refused (generation still waiting) after locking a queued task wakes the parked poll at once', async () => {
  let subscriptionId = '';
  const result = await scenario(
    'redeliver-refused',
    async (taskId) => {
      const { subscription } = await h.store.subscribe(SCOPE, taskId, {
        subscription_key: 'k1',
        destination: 'billing',
      });
      subscriptionId = subscription.id;
    },
    // Redelivery locks the task, then the delivery row: hold the delivery row elsewhere.
    async (holder) => {
      await holder`select 1 from completion_deliveries
        where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
          and subscription_id = ${subscriptionId} for update`;
    },
    (store) => store.redeliver(SCOPE, subscriptionId, { generation: 1 }),
  );
  expect(result.refusal).toBe('conflict');
  expect(result.disposition).toBe('assigned');
  expect(result.waited).toBeLessThan(WAIT / 2);
}, 40_000);
