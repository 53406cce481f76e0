/**
 * Waking parked polls across replicas by every path that makes work claimable — a delayed task
 * coming due, a retry's backoff ending, a lease expiry recovered by the other replica, a
 * concurrency slot freed there — and through the LISTEN connection's failures.
 * Two real server processes on one database; the rescan is ten minutes, so only a
 * LISTEN hint (or a learned due time) can answer a parked poll before its 20 s wait ends.
 */
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { sleep } from './test/harness.js';
import { killWakeConnections, replicaPair, untilListening } from './test/replicas.js';
import {
  call,
  claimNext,
  HINTS_ONLY_ENV,
  openSession,
  parkedPoll,
  pollBody,
  settleBody,
  submitTask,
  TASKS_BASE,
  taskBody,
  WAIT_MS,
} from './test/wire.js';

/** "Promptly": far under the wait, a generous bound for a loaded 2-core machine. */
const PROMPT_MS = 5_000;

/** Fails the attempt `assignment` holds with an application error (a retry, when one is left). */
function failBody(assignment: Assignment) {
  return settleBody(assignment, {
    kind: 'application_error',
    error: { code: 'boom', message: 'x' },
  });
}

// A never runs recovery within a test (maintenance hourly): a lease expiry is recovered on B.
// A's stdout is kept, at info level, to see what it tells the operator.
const pair = replicaPair(
  'replicas_wake_paths',
  {
    env: {
      ...HINTS_ONLY_ENV,
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '3600000',
      LEDGENCE_LOG_LEVEL: 'info',
    },
    captureStdout: true,
  },
  { env: HINTS_ONLY_ENV },
);

describe('a poll parked on A is woken by changes made through B', () => {
  it('a delayed task submitted through B comes due (2 s delay) and reaches the poll on A', async () => {
    const queue = 'q1-delayed';
    const parked = parkedPoll(pair.a.url, queue, WAIT_MS);
    await sleep(300);
    const t0 = performance.now();
    await submitTask(pair.b.url, taskBody('delayed-1', queue, { delay_ms: 2_000 }));
    const { reply, ms } = await parked;
    const sinceSubmit = performance.now() - t0;
    expect(reply.disposition).toBe('assigned');
    expect(sinceSubmit).toBeGreaterThanOrEqual(1_900);
    expect(sinceSubmit).toBeLessThan(2_000 + PROMPT_MS);
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a retry with a 1.5 s backoff settled through B reaches the poll on A when due', async () => {
    const queue = 'q1-retry-delay';
    await submitTask(
      pair.b.url,
      taskBody('retry-delay-1', queue, { retry: { max_attempts: 3, delay_ms: 1_500 } }),
    );
    const first = await claimNext(pair.b.url, queue);
    const parked = parkedPoll(pair.a.url, queue, WAIT_MS);
    await sleep(300);
    const t0 = performance.now();
    const settled = await call<{ task_state: string }>(
      pair.b.url,
      '/v1/worker/settle',
      failBody(first),
    );
    expect(settled.body.task_state).toBe('queued');
    const { reply } = await parked;
    const sinceSettle = performance.now() - t0;
    expect(reply.disposition).toBe('assigned');
    expect(sinceSettle).toBeLessThan(1_500 + PROMPT_MS);
  }, 60_000);

  it('a lease expiry recovered by B (A runs no recovery) re-queues onto the poll parked on A', async () => {
    const queue = 'q1-expiry-on-b';
    const id = await submitTask(
      pair.b.url,
      taskBody('expiry-b-1', queue, { retry: { max_attempts: 3, delay_ms: 0 } }),
    );
    await claimNext(pair.b.url, queue, false); // never renewed: the 1 s lease expires
    const { reply, ms } = await parkedPoll(pair.a.url, queue, WAIT_MS);
    expect(reply.disposition).toBe('assigned');
    if (reply.disposition === 'assigned') expect(reply.assignment.lease.owner.task_id).toBe(id);
    expect(ms).toBeLessThan(PROMPT_MS);
  }, 60_000);

  it('a batch poll on A over one session is woken by a batch submit through B', async () => {
    const queue = 'q1-batch';
    const sid = await openSession(pair.a.url, queue, 4);
    const started = performance.now();
    const parked = call<{ replies: AcquireReply[] }>(
      pair.a.url,
      `/v1/worker/acquire:batch?wait_ms=${WAIT_MS}`,
      {
        commands: [0, 1, 2, 3].map((c) => pollBody(sid, queue, c, 1)),
      },
    );
    await sleep(300);
    const res = await call(pair.b.url, `${TASKS_BASE}/tasks:batch`, {
      commands: [taskBody('batch-a', queue), taskBody('batch-b', queue)],
    });
    expect([200, 201, 207]).toContain(res.status);
    const { body } = await parked;
    expect(performance.now() - started).toBeLessThan(PROMPT_MS);
    expect(body.replies.filter((r) => r.disposition === 'assigned').length).toBeGreaterThanOrEqual(
      1,
    );
  }, 60_000);
});

describe('a concurrency slot freed by recovery on B wakes a key-blocked poll on A (another queue)', () => {
  for (const cancelFirst of [false, true]) {
    it(cancelFirst
      ? 'cancel-requested holder, lease expiry → cancelled'
      : 'lease expiry → re-queued', async () => {
      const key = { concurrency_key: `k-${cancelFirst}`, concurrency_limit: 1 };
      const holderQueue = `q1b-holder-${cancelFirst}`;
      const waiterQueue = `q1b-waiter-${cancelFirst}`;
      const holderId = await submitTask(
        pair.b.url,
        taskBody(`holder-${cancelFirst}`, holderQueue, {
          ...key,
          retry: { max_attempts: 3, delay_ms: 0 },
        }),
      );
      await claimNext(pair.b.url, holderQueue, cancelFirst); // never renewed after: the 1 s lease expires
      const waiterId = await submitTask(
        pair.b.url,
        taskBody(`waiter-${cancelFirst}`, waiterQueue, key),
      );
      if (cancelFirst) {
        const c = await call(pair.b.url, `${TASKS_BASE}/tasks/${holderId}/cancel`, {});
        expect(c.status).toBe(200);
      }
      const { reply, ms } = await parkedPoll(pair.a.url, waiterQueue, WAIT_MS);
      expect(reply.disposition).toBe('assigned');
      if (reply.disposition === 'assigned')
        expect(reply.assignment.lease.owner.task_id).toBe(waiterId);
      expect(ms).toBeLessThan(PROMPT_MS);
    }, 60_000);
  }
});

describe("A's LISTEN connection killed", () => {
  it('a poll parked on A across the kill, for work submitted through B right after, is answered promptly', async () => {
    await untilListening(pair.sql);
    for (let round = 0; round < 5; round += 1) {
      const queue = `q2-deaf-${round}`;
      const parked = parkedPoll(pair.a.url, queue, WAIT_MS);
      await sleep(300);
      // Kill every wake connection (A's and B's): work then arrives while both are deaf.
      await killWakeConnections(pair.sql);
      await submitTask(pair.b.url, taskBody(`deaf-${round}`, queue));
      const { reply, ms } = await parked;
      expect(reply.disposition, `round ${round}`).toBe('assigned');
      expect(ms, `round ${round}`).toBeLessThan(PROMPT_MS);
      await untilListening(pair.sql);
    }
  }, 180_000);

  it('killed repeatedly while it reconnects (LISTEN in flight): it comes back and hints flow', async () => {
    await untilListening(pair.sql);
    const end = performance.now() + 3_000;
    while (performance.now() < end) {
      await killWakeConnections(pair.sql);
      await sleep(Math.floor(Math.random() * 60));
    }
    await untilListening(pair.sql);
    const queue = 'q2-after-storm';
    const parked = parkedPoll(pair.a.url, queue, WAIT_MS);
    await sleep(300);
    await submitTask(pair.b.url, taskBody('after-storm', queue));
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(PROMPT_MS);
  }, 120_000);

  it('the operator is told: A logs the LISTEN lost, and back', async () => {
    await untilListening(pair.sql);
    // A's JSON log is captured (its start line is there).
    expect(pair.a.stdout()).toContain('listening');
    const before = pair.a.stdout().length;
    await killWakeConnections(pair.sql);
    await untilListening(pair.sql);
    await sleep(1_000);
    const lines = pair.a
      .stdout()
      .slice(before)
      .split('\n')
      .filter((l) => l.trim() !== '');
    const told = lines.filter((l) => /"msg":"wake LISTEN (lost|works again)/.test(l));
    expect(
      told.map((l) => JSON.parse(l).level),
      `A's stdout after the kill:\n${lines.join('\n')}`,
    ).toEqual([40, 30]);
  }, 60_000);
});
