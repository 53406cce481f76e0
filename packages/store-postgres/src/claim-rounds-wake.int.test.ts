/**
 * A claim gives up after three rounds of concurrency-key refusals (store.ts `claimable`). A poll
 * whose three rounds were each refused — three keys each filled by a concurrent claim while this
 * one waited for the key's row — is answered `empty` although an unkeyed task of its queue was
 * eligible and unlocked the whole time. Its claim must then hint the queue at commit: parked, the
 * poll would otherwise wait for the rescan or the end of its long poll, since no commit of the
 * concurrent claims wakes it (DESIGN §5: "woken by NOTIFY on that queue").
 *
 * The interleaving is forced: three other transactions each take the last slot of one key (as a
 * claim's `takeConcurrencySlot` does) and hold it until this poll waits for that key's row. The
 * rescan is a minute and the long poll 15 s, so an answer within half of it came from a hint.
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
  h = await harness('claim_rounds_wake');
  holders = postgres(h.db.url, { max: 4, onnotice: () => {} });
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

/** Takes the last slot of `key` in an open transaction, as a concurrent claim does. */
async function takeLastSlot(key: string): Promise<{ pid: number; commit: () => Promise<void> }> {
  const holder = await holders.reserve();
  let open = true;
  const end = async (how: 'commit' | 'rollback') => {
    if (!open) return;
    open = false;
    await holder.unsafe(how);
    holder.release();
  };
  cleanups.push(() => end('rollback'));
  await holder`begin`;
  await holder`update concurrency_keys set active = active + 1
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
      and concurrency_key = ${key}`;
  const [row] = await holder`select pg_backend_pid() as pid`;
  return { pid: Number(row?.pid), commit: () => end('commit') };
}

/** Resolves once some backend waits for a lock `pid` holds. */
async function untilBlockedBy(pid: number): Promise<void> {
  for (;;) {
    const [row] = await h.sql`select count(*)::int as n from pg_stat_activity
      where datname = current_database() and ${pid}::int = any(pg_blocking_pids(pid))`;
    if (Number(row?.n) > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

async function scenario(queue: string) {
  // Claim order: the three keyed tasks first (higher priority), then the unkeyed one.
  for (const n of [1, 2, 3]) {
    await h.store.submit(
      submitCommand(`${queue}-k${n}`, {
        queue,
        priority: 10 - n,
        concurrency_key: `${queue}-key-${n}`,
      }),
    );
  }
  await h.store.submit(submitCommand(`${queue}-free`, { queue, priority: 0 }));
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const holds = [
    await takeLastSlot(`${queue}-key-1`),
    await takeLastSlot(`${queue}-key-2`),
    await takeLastSlot(`${queue}-key-3`),
  ];

  const poll = parkedPoll(h.store, wake, acquireCommand(session.id, 0, 1, queue), WAIT);
  // Each round of the probe's claim waits for one key's row; its holder then commits the slot.
  for (const hold of holds) {
    await untilBlockedBy(hold.pid);
    await hold.commit();
  }
  const probe = await poll.probed;
  const probedAt = performance.now();
  const answer = await poll.answered;
  const waited = performance.now() - probedAt;

  // The unkeyed task was eligible and unlocked throughout (DESIGN §5: "pick the best eligible
  // task"). The first probe passed it over; the parked poll must not then wait for a wake
  // nobody sends ("woken by NOTIFY on that queue, with a periodic rescan as fallback").
  expect(probe.reply.disposition).toBe('empty'); // the first probe passed the task over
  expect(answer.disposition).toBe('assigned');
  const [free] = await h.sql`select task_id from tasks where idempotency_key = ${`${queue}-free`}`;
  if (answer.disposition === 'assigned') {
    expect(answer.assignment.lease.owner.task_id).toBe(free?.task_id);
  }
  expect(waited).toBeLessThan(WAIT / 2);
}

it('a poll whose three claim rounds were refused by keys filled concurrently still gets the eligible unkeyed task without waiting for the rescan', async () => {
  await scenario('rounds');
}, 30_000);
