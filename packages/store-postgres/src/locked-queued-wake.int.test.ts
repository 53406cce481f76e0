/**
 * A transaction that locks a queued task's row must hint the task's queue, whatever it then
 * does: commits without changing the task (a completion subscribe, a stale owner's renew or
 * settle) or is refused (a subscribe reusing its key for another destination, a redeliver of a
 * generation still waiting). A parked poll whose probe skipped that row (`FOR UPDATE SKIP
 * LOCKED`) finds nothing; without the hint it waits for the rescan or the end of its long poll,
 * although the task was claimable the moment the lock was released (DESIGN §5: "woken by NOTIFY
 * on that queue"). A NOTIFY reaches listeners only on COMMIT, so a refusal commits its hint and
 * is thrown after it.
 *
 * The interleaving is forced: the store's call is made to hold the task's row lock (after
 * `lockTasks` it waits for a lock another connection holds) while the poll probes and parks. The
 * rescan interval is 60 s, the long poll 15 s: only a wake answers the poll within half of it.
 */
import postgres from 'postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { WAKE_CHANNEL } from './hot-sql.js';
import {
  acquireCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';
import { parkedPoll } from './testdata/parked.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
let holders: postgres.Sql;
/** Ends a holder's open transaction, whatever the test got to. */
const cleanups: (() => Promise<void>)[] = [];
beforeAll(async () => {
  h = await harness('locked_queued_wake');
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

/** How a scenario's store call is made to hold the queued task's row lock. */
interface Locking {
  /** Before the hold: what the task needs (a subscription, say). */
  setup?: (taskId: string) => Promise<void>;
  /** Takes, in `holder`'s open transaction, the lock the store's call will wait for. */
  hold: (holder: postgres.ReservedSql, taskId: string) => Promise<void>;
  /** The store's call (on a store of its own), which locks the task row, then waits. */
  call: (store: ReturnType<Harness['makeStore']>, taskId: string) => Promise<unknown>;
}

/**
 * The store's call holds the queued task's row while a poll probes and parks; the holder then
 * gives way and the call ends. Its outcome (`ok`, or the refusal's code), the poll's answer and
 * how long after the call ended it came.
 */
async function scenario(
  queue: string,
  { setup, hold, call }: Locking,
): Promise<{ outcome: string; disposition: string; waited: number }> {
  const { snapshot } = await h.store.submit(submitCommand(`${queue}-1`, { queue }));
  const taskId = snapshot.task_id;
  await setup?.(taskId);
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });

  const holder = await holders.reserve();
  let held = true;
  const giveWay = async () => {
    if (!held) return;
    held = false;
    await holder`rollback`;
    holder.release();
  };
  cleanups.push(giveWay);
  await holder`begin`;
  await hold(holder, taskId);

  const other = h.makeStore(1);
  const called = call(other, taskId).then(
    () => 'ok',
    (error: { code?: string }) => error.code ?? String(error),
  );
  await h.untilLockWaits(1);
  const free = await h.sql`select task_id from tasks where task_id = ${taskId}
    for update skip locked`;
  expect(free).toHaveLength(0); // the store's call holds the queued task's row

  // The poll probes while the row is held, finds nothing and parks.
  const poll = parkedPoll(h.store, wake, acquireCommand(session.id, 0, 1, queue), WAIT);
  expect((await poll.probed).reply.disposition).toBe('empty');

  await giveWay();
  const outcome = await called;
  const endedAt = performance.now();
  const answer = await poll.answered;
  const waited = performance.now() - endedAt;
  await other.close();
  return { outcome, disposition: answer.disposition, waited };
}

/** Another connection inserts the subscription key first: the store's subscribe waits for it. */
const insertSubscriptionKey = async (holder: postgres.ReservedSql, taskId: string) => {
  await holder`insert into completion_subscriptions (tenant_id, namespace, subscription_id,
      task_id, subscription_key, destination, event_id, created_at)
    values (${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub-holder', ${taskId}, 'k1', 'billing',
      'evt-holder', 0)`;
};

it('a parked poll is answered once a subscribe that held its queued task’s row lock commits (no wait for the rescan)', async () => {
  const result = await scenario('locked', {
    hold: insertSubscriptionKey,
    call: (store, taskId) =>
      store.subscribe(SCOPE, taskId, { subscription_key: 'k1', destination: 'billing' }),
  });
  expect(result.outcome).toBe('ok');
  expect(result.disposition).toBe('assigned');
  // DESIGN §5: a parked poll "is woken by NOTIFY on that queue, with a periodic rescan as
  // fallback"; the task was claimable from the subscribe's commit on.
  expect(result.waited).toBeLessThan(WAIT / 2);
}, 30_000);

it('a subscribe refused as a conflict (key reused, another destination) after locking a queued task wakes the parked poll at once', async () => {
  const result = await scenario('sub-conflict', {
    setup: async (taskId) => {
      await h.store.subscribe(SCOPE, taskId, { subscription_key: 'k1', destination: 'billing' });
    },
    // The store's subscribe reads the task's subscriptions after locking the task: a table
    // lock held elsewhere makes that read wait with the task row held.
    hold: async (holder) => {
      await holder`lock table completion_subscriptions in access exclusive mode`;
    },
    call: (store, taskId) =>
      store.subscribe(SCOPE, taskId, { subscription_key: 'k1', destination: 'audit' }),
  });
  expect(result.outcome).toBe('conflict');
  expect(result.disposition).toBe('assigned');
  expect(result.waited).toBeLessThan(WAIT / 2);
}, 40_000);

it('a redeliver refused (generation still waiting) after locking a queued task wakes the parked poll at once', async () => {
  let subscriptionId = '';
  const result = await scenario('redeliver-refused', {
    setup: async (taskId) => {
      const { subscription } = await h.store.subscribe(SCOPE, taskId, {
        subscription_key: 'k1',
        destination: 'billing',
      });
      subscriptionId = subscription.id;
    },
    // Redelivery locks the task, then the delivery row: hold the delivery row elsewhere.
    hold: async (holder) => {
      await holder`select 1 from completion_deliveries
        where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
          and subscription_id = ${subscriptionId} for update`;
    },
    call: (store) => store.redeliver(SCOPE, subscriptionId, { generation: 1 }),
  });
  expect(result.outcome).toBe('conflict');
  expect(result.disposition).toBe('assigned');
  expect(result.waited).toBeLessThan(WAIT / 2);
}, 40_000);

it('a stale owner’s renewal of its recovered, re-queued task hints the queue', async () => {
  const queue = 'stale-owner';
  await h.store.submit(submitCommand('stale-owner-1', { queue }));
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error(`not assigned: ${reply.disposition}`);
  h.advance(5_000); // past the lease
  await h.store.recoverExpiredLeases();
  const taskId = reply.assignment.lease.owner.task_id;
  expect((await h.store.status(SCOPE, taskId)).state).toBe('queued');

  const heard: string[] = [];
  const listening = await h.sql.listen(WAKE_CHANNEL, (payload) => heard.push(payload));
  try {
    // The old worker, not yet aware, renews: refused, but its transaction locked the task's row.
    await expect(
      h.store.renew(renewCommand(reply.assignment.lease.owner, 1)),
    ).rejects.toMatchObject({ code: 'ownership_lost' });
    const hinted = () => heard.some((p) => p.includes(`"queue":"${queue}"`));
    for (let waited = 0; waited < 5_000 && !hinted(); waited += 10) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect(hinted()).toBe(true);
  } finally {
    await listening.unlisten();
  }
});
