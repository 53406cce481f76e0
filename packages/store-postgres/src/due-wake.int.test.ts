/**
 * A parked poll is answered when work COMES DUE (a delayed task's or a retry's `available_at`),
 * not at the next periodic rescan: nothing NOTIFYs at a due time (DESIGN §5: a wake is only a
 * hint, the rescan decides), so an empty probe learns its queue's next due time and the park
 * ends then. Each test parks with a rescan longer than the poll's wait: without the due time,
 * the poll is answered only by the final probe at the end of its wait.
 */
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { createTaskService, type TaskService } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  failureCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
let service: TaskService;
/** The poll's wait; the rescan is twice as long, so only a due time can end the park early. */
const WAIT = 5_000;
beforeAll(async () => {
  h = await harness('duewake');
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
  service = createTaskService({
    store: h.store,
    wake,
    rescanIntervalMs: 2 * WAIT,
    longPollMaxMs: 20_000,
  });
});
afterAll(async () => {
  await wake.close();
  await h.close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function assignmentOf(reply: AcquireReply | undefined): Assignment {
  if (reply?.disposition !== 'assigned') throw new Error(`expected an assignment: ${reply}`);
  return reply.assignment;
}

/** Store time of an attempt's claim, from the task's history. */
async function claimedAt(assignment: Assignment): Promise<number> {
  const { task_id, attempt_id } = assignment.lease.owner;
  const events = await h.store.history(SCOPE, task_id, 0);
  const claimed = events.find(
    (e) => e.event.reason === 'claimed' && e.event.attempt_id === attempt_id,
  );
  if (claimed === undefined) throw new Error('no claim recorded');
  return claimed.event.at;
}

/**
 * A poll answered by the due time ends its park well before the wait: the final probe would
 * answer it only once WAIT has passed. Claimed never before its `available_at` (store time).
 */
async function expectAnsweredWhenDue(
  assignment: Assignment,
  availableAt: number,
  elapsedMs: number,
  what: string,
): Promise<void> {
  const claimed = await claimedAt(assignment);
  console.log(`[due-wake] ${what}: claimed ${claimed - availableAt} ms after it came due`);
  expect(claimed).toBeGreaterThanOrEqual(availableAt);
  expect(elapsedMs).toBeLessThan(WAIT / 2);
}

describe('a parked poll and the due times of its queue', () => {
  it('an empty probe reports the earliest due time of its queue, over every priority, and only when it parks', async () => {
    const queue = 'dw-report';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const probe = () =>
      h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: false });
    // Nothing queued: nothing will come due.
    expect((await probe()).nextDue).toBeUndefined();
    const later = await h.store.submit(
      submitCommand('dw-report-high', { queue, priority: 5, delay_ms: 60_000 }),
    );
    const sooner = await h.store.submit(
      submitCommand('dw-report-low', { queue, priority: -5, delay_ms: 30_000 }),
    );
    // Due now but held back by its concurrency key (full): not a due-time matter, the rescan's.
    await h.store.submit(
      submitCommand('dw-report-keyed', { queue, concurrency_key: 'dw-full', concurrency_limit: 1 }),
    );
    await h.sql`update concurrency_keys set active = 1 where concurrency_key = 'dw-full'`;
    const before = await h.store.now();
    const outcome = await probe();
    const after = await h.store.now();
    expect(outcome.reply.disposition).toBe('empty');
    expect(outcome.nextDue?.at).toBe(sooner.snapshot.available_at);
    expect(outcome.nextDue?.at).toBeLessThan(later.snapshot.available_at);
    expect(outcome.nextDue?.observedAt).toBeGreaterThanOrEqual(before);
    expect(outcome.nextDue?.observedAt).toBeLessThanOrEqual(after);
    // A poll that answers now (recorded) does not park: no due time is looked up for it.
    const recorded = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
      recordEmpty: true,
    });
    expect(recorded.reply.disposition).toBe('empty');
    expect(recorded.nextDue).toBeUndefined();
  });

  it('a task delayed 300 ms, submitted while a poll is parked, is handed out when due, not at the rescan', async () => {
    const queue = 'dw-delay';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const started = performance.now();
    const parked = service.acquire(acquireCommand(session.id, 0, 1, queue), { waitMs: WAIT });
    await sleep(100);
    // The submit's hint wakes the poll; its probe finds the task not yet due and parks again.
    const { snapshot } = await h.store.submit(submitCommand('dw-delay', { queue, delay_ms: 300 }));
    const assignment = assignmentOf(await parked);
    const elapsed = performance.now() - started;
    expect(assignment.lease.owner.task_id).toBe(snapshot.task_id);
    await expectAnsweredWhenDue(assignment, snapshot.available_at, elapsed, 'delay_ms 300');
  });

  it("a retry's 200 ms delay ends the park of a poll parked before the failure", async () => {
    const queue = 'dw-retry';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
    const { snapshot } = await h.store.submit(
      submitCommand('dw-retry', {
        queue,
        retry: { max_attempts: 2, delay_ms: 200, backoff: 'fixed' },
      }),
    );
    const first = assignmentOf(
      (await h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true })).reply,
    );
    await h.store.renew(renewCommand(first.lease.owner, 1, 'dispatch'));
    const started = performance.now();
    const parked = service.acquire(acquireCommand(session.id, 1, 1, queue), { waitMs: WAIT });
    await sleep(100);
    await h.store.settle(failureCommand(first, 'dw-retry-1'));
    const { available_at } = await h.store.status(SCOPE, snapshot.task_id);
    const second = assignmentOf(await parked);
    const elapsed = performance.now() - started;
    expect(second.lease.owner.task_id).toBe(snapshot.task_id);
    expect(second.lease.owner.attempt_id).not.toBe(first.lease.owner.attempt_id);
    await expectAnsweredWhenDue(second, available_at, elapsed, 'retry delay_ms 200');
  });

  it('a batch parked on two queues wakes at the earliest due time of either', async () => {
    const far = await h.store.openSession({ scope: SCOPE, queue: 'dw-far', concurrency: 1 });
    const near = await h.store.openSession({ scope: SCOPE, queue: 'dw-near', concurrency: 1 });
    // Due only after the wait: the batch must not sleep on this queue's due time.
    await h.store.submit(submitCommand('dw-far', { queue: 'dw-far', delay_ms: 60_000 }));
    const { snapshot } = await h.store.submit(
      submitCommand('dw-near', { queue: 'dw-near', delay_ms: 300 }),
    );
    const started = performance.now();
    const answered = await service.acquireBatch(
      [acquireCommand(far.id, 0, 1, 'dw-far'), acquireCommand(near.id, 0, 1, 'dw-near')],
      { waitMs: WAIT },
    );
    const elapsed = performance.now() - started;
    const [farReply, nearReply] = answered.map((r) => (r.ok ? r.value : undefined));
    expect(farReply?.disposition).toBe('empty');
    const assignment = assignmentOf(nearReply);
    expect(assignment.lease.owner.task_id).toBe(snapshot.task_id);
    await expectAnsweredWhenDue(assignment, snapshot.available_at, elapsed, 'batch, delay_ms 300');
  });

  // The recovery path of the same promise (DESIGN §5 Lease expiry: "re-queued with the retry
  // delay"): the poll was parked before the lease ran out.
  it('a lease-expiry retry delayed 300 ms is handed to a poll parked before the recovery when due, not at the rescan', async () => {
    const queue = 'due-lost';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
    const { snapshot } = await h.store.submit(
      submitCommand('due-lost', { queue, retry: { max_attempts: 3, delay_ms: 300 } }),
    );
    const first = assignmentOf(
      (await h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true })).reply,
    );
    await h.store.renew(renewCommand(first.lease.owner, 1, 'dispatch'));
    h.advance(CONFIG.leaseDurationMs + 50);
    const started = performance.now();
    const parked = service.acquire(acquireCommand(session.id, 1, 1, queue), { waitMs: WAIT });
    await sleep(100);
    // The clock moved past the earlier tests' leases too: the count covers theirs as well.
    expect((await h.store.recoverExpiredLeases()).requeued).toBeGreaterThanOrEqual(1);
    const { state, available_at } = await h.store.status(SCOPE, snapshot.task_id);
    expect(state).toBe('queued');
    const second = assignmentOf(await parked);
    const elapsed = performance.now() - started;
    expect(second.lease.owner.task_id).toBe(snapshot.task_id);
    expect(second.event.ldgattempt).toBe(2);
    const claimed = (await h.store.history(SCOPE, snapshot.task_id, 0)).find(
      (e) => e.event.reason === 'claimed' && e.event.attempt_id === second.lease.owner.attempt_id,
    );
    expect(claimed?.event.at).toBeGreaterThanOrEqual(available_at);
    expect(elapsed).toBeLessThan(WAIT / 2);
  });
});
