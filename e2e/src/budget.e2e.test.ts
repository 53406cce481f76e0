/**
 * The worker SDK at the execution budget's end, against a real server with a short safety
 * margin and cleanup grace: a handler that honours the abort fails the task `timed_out`, and one
 * that ignores it is reported `timed_out` (unconfirmed) after the abort grace, not left to
 * lease expiry.
 */
import type { TaskAbortedError, Worker } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  attemptIds,
  client,
  historyOf,
  reasons,
  settled,
  until,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('budget_e2e', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '2000',
});

function worker(queue: string): Worker {
  return suite.worker(queue, { shutdownGraceMs: 1_000 });
}

describe('execution budget in the worker', () => {
  it('aborts the handler when its budget ends and reports timed_out', async () => {
    const c = client(suite.server.url);
    const queue = 'budget-honour';
    const task = await c.submit({
      queue,
      program: 'slow',
      data: null,
      timeout_ms: 1_500,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let reason: unknown;
    let deadline = 0;
    let abortedAt = 0;
    const w = worker(queue);
    w.register('slow', async (_data, ctx) => {
      deadline = ctx.deadline;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      abortedAt = Date.now();
      reason = ctx.signal.reason;
      throw new Error('stopped');
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 30_000);
    await w.stop();
    await running;
    expect((reason as TaskAbortedError).why).toBe('timeout');
    expect(abortedAt).toBeGreaterThanOrEqual(deadline - 100);
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: {
        kind: 'execution',
        error: { kind: 'timed_out', message: 'the execution budget ran out: stopped' },
      },
    });
  });

  it('says the cause once when the handler lets the abort’s own reason through', async () => {
    const c = client(suite.server.url);
    const queue = 'budget-reason';
    const task = await c.submit({
      queue,
      program: 'through',
      data: null,
      timeout_ms: 1_500,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    const w = worker(queue);
    w.register('through', async (_data, ctx) => {
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      ctx.signal.throwIfAborted();
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 30_000);
    await w.stop();
    await running;
    // Not "the execution budget ran out: the attempt's execution budget ran out".
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: {
        kind: 'execution',
        error: { kind: 'timed_out', message: 'the execution budget ran out' },
      },
    });
  });

  it('reports an attempt whose handler ignores the budget’s end as timed_out (unconfirmed) within the cleanup grace', async () => {
    const c = client(suite.server.url);
    const queue = 'budget-deaf';
    const task = await c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 1_500,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let started = false;
    const w = worker(queue);
    w.register('deaf', async () => {
      started = true;
      await released;
      return 'late';
    });
    const running = w.run();
    await until(() => started);
    const [result] = await settled(c, [task.task_id], 30_000);
    release();
    await w.stop();
    await running;
    const events = await historyOf(c, task.task_id);
    // The worker knew the budget ran out: it reports that, rather than leaving the attempt to
    // lease expiry.
    expect(reasons(events)).toContain('report_accepted');
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'timed_out' } },
    });
    const [attemptId] = attemptIds(events);
    const attempt = await c.attempt(task.task_id, attemptId as string);
    expect(attempt.settlement?.command).toMatchObject({
      report: { kind: 'failed', report: { kind: 'timed_out' } },
      quiescence: 'unconfirmed',
    });
  });
});
