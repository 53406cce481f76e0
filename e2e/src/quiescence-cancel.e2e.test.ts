/**
 * Cancellation meeting a held (`unconfirmed`) report, through the real worker SDK and
 * a real server process. DESIGN §5 Settle/Cancel; worker README (a handler that ignores a cancel
 * keeps its slot until it returns or its budget ends; reported `unconfirmed`; quiescence confirmed
 * when it returns; a cancelled task is never retried).
 */
import { describe, expect, it } from 'vitest';
import { client, historyOf, reasons, sleep, until, workerSuite } from './test/harness.js';

const suite = workerSuite('r50d_quiescence_cancel', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '60000',
});

function gate() {
  let release = () => {};
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  return { released, release };
}

describe('cancel and held reports through the SDK', () => {
  it('a deaf handler cancelled mid-run: held after its budget, cancelled (not retried) at the confirmation; its key is then freed', async () => {
    const c = client(suite.server.url);
    const queue = 'r50d-deaf-cancel';
    const key = 'r50d-k1';
    const task = await c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 1_000,
      retry: { max_attempts: 3, delay_ms: 0 },
      concurrency_key: key,
      concurrency_limit: 1,
    });
    const next = await c.submit({
      queue,
      program: 'quick',
      data: null,
      concurrency_key: key,
      concurrency_limit: 1,
    });
    const g = gate();
    let started = 0;
    let quickRan = 0;
    const w = suite.worker(queue, { abortGraceMs: 50, concurrency: 2 });
    w.register('deaf', async () => {
      started += 1;
      await g.released;
      return 'late';
    });
    w.register('quick', async () => {
      quickRan += 1;
      return 'ok';
    });
    const running = w.run();
    await until(() => started === 1, 10_000, 'deaf handler to start');
    expect(await c.cancel(task.task_id)).toBe('active');
    await until(
      async () => reasons(await historyOf(c, task.task_id)).includes('report_accepted'),
      10_000,
      'report_accepted',
    );
    expect((await c.status(task.task_id)).state).toBe('active');
    expect(quickRan).toBe(0);
    const waiting = c.result(task.task_id, { waitMs: 20_000 });
    await sleep(300);
    expect(quickRan).toBe(0);
    g.release();
    const result = await waiting;
    expect(result.outcome).toEqual({ state: 'cancelled' });
    const history = reasons(await historyOf(c, task.task_id));
    expect(history).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'cancel_requested',
      'report_accepted',
      'cleanup_confirmed',
      'cancelled',
    ]);
    const after = await c.result(next.task_id, { waitMs: 10_000 });
    expect(after.outcome).toMatchObject({ state: 'succeeded' });
    expect(started).toBe(1);
    expect((await c.status(task.task_id)).attempt_count).toBe(1);
    await w.stop({ graceMs: 0 });
    await running;
  });

  it('a handler held at shutdown (retryable, unconfirmed) and cancelled meanwhile is cancelled at its confirmation, never retried', async () => {
    const c = client(suite.server.url);
    const queue = 'r50d-stop-cancel';
    const task = await c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 60_000,
      retry: { max_attempts: 3, delay_ms: 0 },
    });
    const g = gate();
    let started = 0;
    const w = suite.worker(queue, { abortGraceMs: 50 });
    w.register('deaf', async () => {
      started += 1;
      await g.released;
      return 'late';
    });
    const running = w.run();
    await until(() => started === 1, 10_000, 'deaf handler to start');
    const stopping = w.stop({ graceMs: 50 });
    await until(
      async () => reasons(await historyOf(c, task.task_id)).includes('report_accepted'),
      10_000,
      'report_accepted',
    );
    expect((await c.status(task.task_id)).state).toBe('active');
    expect(await c.cancel(task.task_id)).toBe('active');
    const waiting = c.result(task.task_id, { waitMs: 20_000 });
    await sleep(200);
    g.release();
    const result = await waiting;
    expect(result.outcome).toEqual({ state: 'cancelled' });
    await stopping;
    await running;
    const history = reasons(await historyOf(c, task.task_id));
    expect(history).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'cancel_requested',
      'cleanup_confirmed',
      'cancelled',
    ]);
    expect(started).toBe(1);
  });
});
