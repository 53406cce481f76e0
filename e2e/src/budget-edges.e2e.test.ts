/**
 * Time limits and the retry policy at their edges, end to end — the real server
 * (short timings, a 1 s lease safety margin) and the real worker SDK.
 */
import type { Worker } from '@ledgence/worker';
import { beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  attemptIds,
  client,
  historyOf,
  reasons,
  settled,
  sleep,
  workerSuite,
} from './test/harness.js';

const MARGIN_MS = 1_000;
/** @ledgence/core's MIN_DISPATCH_WINDOW_MS: what a budget must leave above the margin. */
const MIN_DISPATCH_WINDOW_MS = 500;
const suite = workerSuite('budget_edges', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: String(MARGIN_MS),
  LEDGENCE_CLEANUP_GRACE_MS: '2000',
});

function worker(queue: string): Worker {
  return suite.worker(queue, { shutdownGraceMs: 1_000 });
}

describe('the least execution budget the server accepts: its margin + MIN_DISPATCH_WINDOW_MS', () => {
  it('runs the handler once over HTTP and succeeds; 1 ms less is refused at submit', async () => {
    const c = client(suite.server.url);
    const queue = 'budget-edge-min';
    const least = MARGIN_MS + MIN_DISPATCH_WINDOW_MS;
    const refused = await c
      .submit({ queue, program: 'p', data: null, timeout_ms: least - 1 })
      .catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: 'invalid_input', path: '$.input.timeout_ms' });
    // Before the fix the least was margin + 1: dispatch needed the renewal to reach the store
    // within 1 ms of the claim, was refused every time, and the task was re-queued for ever
    // (~480 claims in 15 s, the handler never ran).
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      timeout_ms: least,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    let ran = 0;
    const w = worker(queue);
    w.register('p', () => {
      ran += 1;
      return 'ran';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 30_000);
    await w.stop({ graceMs: 0 });
    await running;
    expect(result?.outcome).toMatchObject({ state: 'succeeded', output: 'ran' });
    expect(ran).toBe(1);
    expect((await c.status(task.task_id)).attempt_count).toBe(1);
  });
});

describe('the last attempt', () => {
  it('a handler timing out on every attempt runs exactly max_attempts times; the task fails timed_out with one retry_scheduled per earlier attempt', async () => {
    const c = client(suite.server.url);
    const queue = 'budget-edge-last';
    const task = await c.submit({
      queue,
      program: 'slow',
      data: null,
      timeout_ms: 2_000,
      retry: { max_attempts: 3, delay_ms: 10 },
    });
    const seen: number[] = [];
    const w = worker(queue);
    w.register('slow', async (_data, ctx) => {
      seen.push(ctx.attempt);
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      throw new Error('gave up');
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 40_000);
    await w.stop({ graceMs: 0 });
    await running;
    expect(seen).toEqual([1, 2, 3]);
    expect(result?.status).toMatchObject({ state: 'failed', attempt_count: 3, max_attempts: 3 });
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'timed_out', retryable: true } },
    });
    const events = await historyOf(c, task.task_id);
    const r = reasons(events);
    expect(r.filter((x) => x === 'retry_scheduled')).toHaveLength(2);
    expect(r.filter((x) => x === 'dispatch_authorized')).toHaveLength(3);
    expect(r.at(-1)).toBe('failed');
    expect(attemptIds(events)).toHaveLength(3);
  });
});

describe('a retry delay', () => {
  it('a fixed delay is waited out after a failure: the retry is not claimed before it, by store time', async () => {
    const c = client(suite.server.url);
    const queue = 'budget-edge-delay';
    const task = await c.submit({
      queue,
      program: 'fails-once',
      data: null,
      timeout_ms: 10_000,
      retry: { max_attempts: 2, delay_ms: 1_500 },
    });
    const w = worker(queue);
    w.register('fails-once', async (_data, ctx) => {
      if (ctx.attempt === 1) throw new Error('first try fails');
      return 'second';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 30_000);
    await w.stop({ graceMs: 0 });
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'second' });
    const events = await historyOf(c, task.task_id);
    const scheduled = events.find((e) => e.event.reason === 'retry_scheduled');
    const claims = events.filter((e) => e.event.reason === 'claimed');
    expect(claims).toHaveLength(2);
    expect((claims[1]?.event.at ?? 0) - (scheduled?.event.at ?? 0)).toBeGreaterThanOrEqual(1_500);
  });
});

describe('a lease as long as the budget, or longer', () => {
  const LEASE_MS = 3_000;
  let longLease: ServerProcess;
  beforeAll(async () => {
    longLease = await suite.stack.start({
      LEDGENCE_LEASE_DURATION_MS: String(LEASE_MS),
      LEDGENCE_LEASE_SAFETY_MARGIN_MS: String(MARGIN_MS),
      LEDGENCE_CLEANUP_GRACE_MS: '2000',
    });
  });
  function longWorker(queue: string): Worker {
    return suite.worker(queue, { url: longLease.url, shutdownGraceMs: 1_000 });
  }

  it('timeout_ms equal to the lease: a handler that returns before its deadline succeeds on its one attempt', async () => {
    const c = client(longLease.url);
    const queue = 'budget-edge-equal';
    const task = await c.submit({
      queue,
      program: 'within',
      data: null,
      timeout_ms: LEASE_MS,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let aborted = false;
    const w = longWorker(queue);
    w.register('within', async (_data, ctx) => {
      await sleep(1_500);
      aborted = ctx.signal.aborted;
      return 'done';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 30_000);
    await w.stop({ graceMs: 0 });
    await running;
    expect(aborted).toBe(false);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'done' });
    expect(result?.status.attempt_count).toBe(1);
  });

  it('timeout_ms shorter than the lease: the signal aborts at the budget’s end, not at the lease’s, and the retry runs as attempt 2', async () => {
    const c = client(longLease.url);
    const queue = 'budget-edge-shorter';
    const task = await c.submit({
      queue,
      program: 'waits',
      data: null,
      timeout_ms: 1_500,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    const runs: { attempt: number; why: unknown }[] = [];
    const w = longWorker(queue);
    w.register('waits', async (_data, ctx) => {
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      runs.push({
        attempt: ctx.attempt,
        why: (ctx.signal.reason as { why?: unknown }).why,
      });
      throw new Error('out of time');
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 30_000);
    await w.stop({ graceMs: 0 });
    await running;
    expect(runs.map((r) => [r.attempt, r.why])).toEqual([
      [1, 'timeout'],
      [2, 'timeout'],
    ]);
    // The abort's reason tells the budget's end ('timeout') from the lease's; no clock is read
    // against the other, so a loaded machine's scheduling cannot fail this.
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'timed_out' } },
    });
  });
});
