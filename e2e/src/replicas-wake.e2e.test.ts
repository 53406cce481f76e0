/**
 * Replicas: several server processes on one database, as behind a load balancer.
 * Every wake below crosses processes: the change commits through replica A, the parked poll waits
 * on replica B, whose rescan is far beyond the wait — only B's LISTEN can answer it early.
 */
import type { AcquireReply } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { sleep } from './test/harness.js';
import {
  killWakeConnections,
  replicaPair,
  untilListening,
  wakeConnections,
} from './test/replicas.js';
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

const pair = replicaPair('replicas_wake', { env: HINTS_ONLY_ENV });

describe('a parked poll on replica B is woken by a change committed through replica A', () => {
  it('a batch poll, by a submit', async () => {
    const queue = 'wake-batch';
    const id = await openSession(pair.b.url, queue, 2);
    const started = performance.now();
    const parked = call<{ replies: AcquireReply[] }>(
      pair.b.url,
      `/v1/worker/acquire:batch?wait_ms=${WAIT_MS}`,
      { commands: [pollBody(id, queue, 0, 1), pollBody(id, queue, 1, 1)] },
    );
    await sleep(300);
    await submitTask(pair.a.url, taskBody('batch-1', queue));
    const { body } = await parked;
    expect(body.replies.some((r) => r.disposition === 'assigned')).toBe(true);
    expect(performance.now() - started).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a retry re-queue (settled failed through A)', async () => {
    const queue = 'wake-retry';
    await submitTask(
      pair.a.url,
      taskBody('retry-1', queue, { retry: { max_attempts: 2, delay_ms: 0 } }),
    );
    const first = await claimNext(pair.a.url, queue);
    const parked = parkedPoll(pair.b.url, queue, WAIT_MS);
    await sleep(300);
    const settled = await call<{ task_state: string }>(
      pair.a.url,
      '/v1/worker/settle',
      settleBody(first, { kind: 'application_error', error: { code: 'boom', message: 'x' } }),
    );
    expect(settled.body.task_state).toBe('queued');
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a concurrency slot freed by a settle through A', async () => {
    const queue = 'wake-slot';
    const key = { concurrency_key: 'slot', concurrency_limit: 1 };
    await submitTask(pair.a.url, taskBody('slot-1', queue, key));
    const holder = await claimNext(pair.a.url, queue);
    await submitTask(pair.a.url, taskBody('slot-2', queue, key));
    const parked = parkedPoll(pair.b.url, queue, WAIT_MS);
    await sleep(300);
    const cancelled = await call<{ state: string }>(
      pair.a.url,
      `${TASKS_BASE}/tasks/${holder.lease.owner.task_id}/cancel`,
      {},
    );
    expect(cancelled.status).toBe(200);
    await call(
      pair.a.url,
      '/v1/worker/settle',
      settleBody(holder, { kind: 'success', output: null }),
    );
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a lease expiry re-queue by recovery', async () => {
    const queue = 'wake-expiry';
    await submitTask(
      pair.a.url,
      taskBody('expiry-1', queue, { retry: { max_attempts: 3, delay_ms: 0 } }),
    );
    await claimNext(pair.a.url, queue, false);
    const { reply, ms } = await parkedPoll(pair.b.url, queue, WAIT_MS);
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);
});

describe('a result wait on replica B is woken by a terminal transition committed through A', () => {
  async function resultWait(taskId: string) {
    const started = performance.now();
    const { body } = await call<{ outcome: { state: string } }>(
      pair.b.url,
      `${TASKS_BASE}/tasks/${taskId}/result?wait_ms=${WAIT_MS}`,
    );
    return { state: body.outcome.state, ms: performance.now() - started };
  }

  it('a cancel of a queued task', async () => {
    const id = await submitTask(pair.a.url, taskBody('result-cancel', 'result-cancel'));
    const waiting = resultWait(id);
    await sleep(300);
    await call(pair.a.url, `${TASKS_BASE}/tasks/${id}/cancel`, {});
    const { state, ms } = await waiting;
    expect(state).toBe('cancelled');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a settle', async () => {
    const id = await submitTask(pair.a.url, taskBody('result-settle', 'result-settle'));
    const assignment = await claimNext(pair.a.url, 'result-settle');
    const waiting = resultWait(id);
    await sleep(300);
    await call(
      pair.a.url,
      '/v1/worker/settle',
      settleBody(assignment, { kind: 'success', output: 1 }),
    );
    const { state, ms } = await waiting;
    expect(state).toBe('succeeded');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a lease expiry with no attempt left (recovery)', async () => {
    const id = await submitTask(
      pair.a.url,
      taskBody('result-expiry', 'result-expiry', { retry: { max_attempts: 1, delay_ms: 0 } }),
    );
    await claimNext(pair.a.url, 'result-expiry');
    const { state, ms } = await resultWait(id);
    expect(state).toBe('failed');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);
});

describe("replica B's LISTEN connection cut", () => {
  it('reconnects: a later submit through A still wakes a poll parked on B', async () => {
    const before = await wakeConnections(pair.sql);
    expect(before.length).toBe(2);
    await killWakeConnections(pair.sql);
    await untilListening(
      pair.sql,
      2,
      before.map((c) => c.pid),
    );
    const directions: [ServerProcess, ServerProcess][] = [
      [pair.a, pair.b],
      [pair.b, pair.a],
    ];
    for (const [i, [from, to]] of directions.entries()) {
      const queue = `wake-after-cut-${i}`;
      const parked = parkedPoll(to.url, queue, WAIT_MS);
      await sleep(300);
      await submitTask(from.url, taskBody(`after-cut-${i}`, queue));
      const { reply, ms } = await parked;
      expect(reply.disposition).toBe('assigned');
      expect(ms).toBeLessThan(WAIT_MS);
    }
  }, 120_000);
});
