/**
 * A transaction that locks a queued task's row and commits without changing it — a completion
 * subscribe, a stale owner's renew or settle — must hint the task's queue. A parked poll whose
 * probe skipped that row (`FOR UPDATE SKIP LOCKED`) finds nothing; without the hint it waits for
 * the rescan or the end of its long poll, although the task was claimable the moment the lock
 * was released (DESIGN §5: "woken by NOTIFY on that queue").
 *
 * The interleaving is forced: a subscribe of the queued task is made to hold the task's row lock
 * (it waits, after `lockTasks`, for an uncommitted insert of the same subscription key by another
 * connection) while the poll probes and parks. The rescan interval is 60 s, the long poll 15 s:
 * only a wake answers the poll within half of it.
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

/** A poll parks while a subscribe holds the queued task's row; the subscribe then commits. */
async function scenario(queue: string): Promise<{ disposition: string; waited: number }> {
  const { snapshot } = await h.store.submit(submitCommand(`${queue}-1`, { queue }));
  const taskId = snapshot.task_id;
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });

  // Another connection inserts the subscription key first and keeps its transaction open: the
  // store's subscribe below locks the task, then waits for that insert.
  const holder = await holders.reserve();
  let held = true;
  cleanups.push(async () => {
    if (!held) return;
    held = false;
    await holder`rollback`;
    holder.release();
  });
  await holder`begin`;
  await holder`insert into completion_subscriptions (tenant_id, namespace, subscription_id,
      task_id, subscription_key, destination, event_id, created_at)
    values (${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub-holder', ${taskId}, 'k1', 'billing',
      'evt-holder', 0)`;
  const subscriber = h.makeStore(1);
  const subscribed = subscriber.subscribe(SCOPE, taskId, {
    subscription_key: 'k1',
    destination: 'billing',
  });
  subscribed.catch(() => {});
  await h.untilLockWaits(1);
  const free = await h.sql`select task_id from tasks
    where task_id = ${taskId} for update skip locked`;
  expect(free).toHaveLength(0); // the subscribe holds the queued task's row

  // The poll probes while the row is held, finds nothing and parks.
  const poll = parkedPoll(h.store, wake, acquireCommand(session.id, 0, 1, queue), WAIT);
  const probe = await poll.probed;
  expect(probe.reply.disposition).toBe('empty');

  // The holder gives way: the subscribe inserts its row and commits, the task is free again.
  held = false;
  await holder`rollback`;
  holder.release();
  const subscription = await subscribed;
  expect(subscription.created).toBe(true);
  const freedAt = performance.now();
  const answer = await poll.answered;
  const waited = performance.now() - freedAt;
  await subscriber.close();
  return { disposition: answer.disposition, waited };
}

const WAIT = 15_000;

it('a parked poll is answered once a subscribe that held its queued task’s row lock commits (no wait for the rescan)', async () => {
  const { disposition, waited } = await scenario('locked');
  expect(disposition).toBe('assigned');
  // DESIGN §5: a parked poll "is woken by NOTIFY on that queue, with a periodic rescan as
  // fallback"; the task was claimable from the subscribe's commit on.
  expect(waited).toBeLessThan(WAIT / 2);
}, 30_000);

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
