/**
 * The acquire path around a wait for a concurrency key's row lock — what it decides after the
 * wait, the order it locks key rows in — and the wake a freed key slot sends to parked polls.
 */
import { ContractError } from '@ledgence/contracts';
import { createTaskService } from '@ledgence/core';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
/** The lock holders' own client: the harness's `sql` has two connections only. */
let holders: postgres.Sql;
beforeAll(async () => {
  h = await harness('rvwake');
  holders = postgres(h.db.url, { max: 4, onnotice: () => {} });
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
});
afterAll(async () => {
  await holders.end();
  await wake.close();
  await h.close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Holds a key's row in another transaction (optionally taking one of its slots, as a claim does). */
async function holdKey(key: string, take = false): Promise<() => Promise<void>> {
  const holder = await holders.reserve();
  await holder`begin`;
  if (take) {
    await holder`update concurrency_keys set active = active + 1 where concurrency_key = ${key}`;
  } else {
    await holder`select 1 from concurrency_keys where concurrency_key = ${key} for update`;
  }
  return async () => {
    await holder`commit`;
    holder.release();
  };
}

/** A poll's disposition, or the code and message of the contract error it failed with. */
async function answerOf(promise: Promise<unknown>): Promise<string> {
  try {
    const value = (await promise) as { reply?: { disposition?: string } };
    return value?.reply?.disposition ?? 'ok';
  } catch (error) {
    if (error instanceof ContractError) return `${error.code}: ${error.message}`;
    throw error;
  }
}

describe('acquire decisions after a concurrency-key wait', () => {
  it('a poll whose session expired while it waited for a key lock is rejected, not assigned', async () => {
    const queue = 'rv-expire';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(submitCommand('rv-expire-k', { queue, concurrency_key: 'rv-expire' }));
    const release = await holdKey('rv-expire');
    const poll = h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true });
    await h.untilLockWaits(1);
    // The key's wait outlasts the session (store time moves past expires_at, as in
    // concurrency.int.test.ts's waited-claim case).
    h.advance(CONFIG.sessionValidityMs + 1_000);
    await release();
    const outcome = await answerOf(poll);
    expect(await h.store.now()).toBeGreaterThan(session.expires_at);
    // DESIGN §5: "Acquisition never creates a session; unknown or expired sessions are
    // rejected (410 session_expired)". The claim is made at store time after the wait, when the
    // session had expired; it must not hand out a task.
    expect(outcome).toMatch(/^session_expired: /);
    // Nothing was claimed: the task is still queued and its key slot was given back.
    const [row] = await h.sql`
      select t.state, k.active from tasks t
      join concurrency_keys k on k.tenant_id = t.tenant_id and k.namespace = t.namespace
        and k.concurrency_key = t.concurrency_key
      where t.idempotency_key = 'rv-expire-k'`;
    expect(row).toEqual({ state: 'queued', active: 0 });
  });
});

describe('concurrency-key row locks across claim rounds', () => {
  it('two claims never deadlock: a single poll is answered, not failed as unavailable', async () => {
    const queue = 'rv-dl';
    const a = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const b = await h.store.openSession({ scope: SCOPE, queue, concurrency: 3 });
    const task = (key: string, priority: number, concurrency_key: string) =>
      h.store.submit(
        submitCommand(key, { queue, priority, concurrency_key, concurrency_limit: 1 }),
      );
    await task('rv-dl-1', 100, 'rv-dl-c'); // A's first round
    await task('rv-dl-2', 90, 'rv-dl-a'); // B's first round: keys a, b, c in key order
    await task('rv-dl-5', 80, 'rv-dl-b');
    await task('rv-dl-3', 70, 'rv-dl-c');
    await task('rv-dl-4', 60, 'rv-dl-a'); // A's second round

    // X: a concurrent claim of key c, in flight (it will fill c when it commits).
    const releaseC = await holdKey('rv-dl-c', true);
    const storeA = h.makeStore(1);
    const storeB = h.makeStore(1);
    // A: its first-round task has key c; it waits for X.
    const pollA = answerOf(
      storeA.acquire(acquireCommand(a.id, 0, 1, queue), { recordEmpty: true }),
    );
    await h.untilLockWaits(1);
    // Y: someone holding key b for a moment (a settle of a b task, say).
    const releaseB = await holdKey('rv-dl-b');
    // B: three slots; its first round takes key a, then waits for key b.
    const pollB = storeB.acquireBatch(
      [0, 1, 2].map((slot) => acquireCommand(b.id, slot, 1, queue)),
      { recordEmpty: true },
    );
    await h.untilLockWaits(2);
    // X commits: c is full, A is refused it (but holds its row lock) and starts a second round,
    // which picks the a task and waits for key a, held by B.
    await releaseC();
    await sleep(200);
    // Y commits: B takes key b, then asks for key c, held by A: B sorted its own round, but A's
    // second round took a key (a) lower than one it already holds (c).
    await releaseB();

    const [answerA, answerB] = await Promise.all([pollA, pollB]);
    expect(answerB.every((r) => r.ok)).toBe(true);
    // A poll must be answered (assigned or empty); a deadlock would make it a 503.
    expect(answerA).toMatch(/^(assigned|empty)$/);
    await storeA.close();
    await storeB.close();
  });
});

describe('wakes of a parked poll', () => {
  it('a key slot freed by a task of another queue wakes polls parked on the queue it unblocks', async () => {
    // The key is shared by two queues (keys are per tenant and namespace, not per queue).
    const key = 'rv-shared-key';
    const session1 = await h.store.openSession({ scope: SCOPE, queue: 'rv-q1', concurrency: 1 });
    const session2 = await h.store.openSession({ scope: SCOPE, queue: 'rv-q2', concurrency: 1 });
    await h.store.submit(
      submitCommand('rv-shared-1', { queue: 'rv-q1', concurrency_key: key, concurrency_limit: 1 }),
    );
    const { reply } = await h.store.acquire(acquireCommand(session1.id, 0, 1, 'rv-q1'), {
      recordEmpty: true,
    });
    if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
    await h.store.renew(renewCommand(reply.assignment.lease.owner, 1, 'dispatch'));
    // Queue 2's task is blocked by the key queue 1's task holds.
    await h.store.submit(
      submitCommand('rv-shared-2', { queue: 'rv-q2', concurrency_key: key, concurrency_limit: 1 }),
    );
    // A rescan long after the hint should have come: only a wake answers the poll early.
    const service = createTaskService({
      store: h.store,
      wake,
      rescanIntervalMs: 60_000,
      longPollMaxMs: 20_000,
    });
    // Woken, it is answered at once; missed, only by the final probe when the wait ends.
    const WAIT = 15_000;
    const started = performance.now();
    const parked = service.acquire(acquireCommand(session2.id, 0, 1, 'rv-q2'), { waitMs: WAIT });
    await sleep(200);
    // Settling queue 1's task frees the key: queue 2's task is claimable now.
    const settler = h.makeStore(1);
    await settler.settle(successCommand(reply.assignment, 'rv-shared-done'));
    await settler.close();
    const answer = await parked;
    const elapsed = performance.now() - started;
    expect(answer.disposition).toBe('assigned');
    // DESIGN §5: a parked poll "is woken by NOTIFY on that queue".
    expect(elapsed).toBeLessThan(WAIT / 2);
  });
});
