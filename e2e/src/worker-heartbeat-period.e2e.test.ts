/**
 * DESIGN §10: the SDK heartbeats held leases at RENEW_INTERVAL_MS (the `renewIntervalMs`
 * option), and `ctx.signal` aborts on cancel — learnt from a heartbeat's answer. The other
 * worker tests run against 1 s leases, where the SDK's "renew halfway through what the lease has
 * left" rule alone renews every ~500 ms and would hide a heartbeat that never fires. Here the
 * server grants 30 s leases, so only the heartbeat period explains renewals within the first
 * seconds, and a cancel seen within a few periods rather than ~15 s later.
 */
import { describe, expect, it } from 'vitest';
import { client, historyOf, reasons, settled, sleep, until, workerSuite } from './test/harness.js';

/** The worker's heartbeat period, far below half the server's lease. */
const PERIOD_MS = 200;

const suite = workerSuite('worker_heartbeat_period', {
  LEDGENCE_LEASE_DURATION_MS: '30000',
  LEDGENCE_RENEW_INTERVAL_MS: '10000',
});

function worker(queue: string) {
  const w = suite.worker(queue, { renewIntervalMs: PERIOD_MS });
  return w;
}

describe('a worker holding a 30 s lease with renewIntervalMs 200', () => {
  it('renews it every period while the handler runs, not only halfway through the lease', async () => {
    const c = client(suite.server.url);
    const queue = 'heartbeat-period';
    const task = await c.submit({ queue, program: 'hold', data: null });
    const sequences: (number | undefined)[] = [];
    const w = worker(queue);
    w.register('hold', async (_data, ctx) => {
      const renewed = async () =>
        (await c.attempt(ctx.taskId, ctx.attemptId)).last_renewal?.sequence;
      sequences.push(await renewed());
      await sleep(10 * PERIOD_MS);
      sequences.push(await renewed());
      return null;
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome.state).toBe('succeeded');
    // Sequence 1 is the dispatch renewal. Ten periods later about ten heartbeats were answered;
    // three is the bound (a busy CI machine delays timers and requests), and
    // halfway-through-the-lease renewing alone would have sent none before 15 s.
    expect(sequences[0]).toBe(1);
    expect(sequences[1]).toBeGreaterThanOrEqual(1 + 3);
  });

  it('aborts ctx.signal on a cancel within a few periods, and the task settles cancelled', async () => {
    const c = client(suite.server.url);
    const queue = 'heartbeat-cancel';
    const task = await c.submit({ queue, program: 'wait', data: null });
    let started = false;
    let abortedAt = 0;
    const w = worker(queue);
    w.register('wait', async (_data, ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      abortedAt = Date.now();
      throw ctx.signal.reason;
    });
    const running = w.run();
    await until(() => started);
    const cancelledAt = Date.now();
    expect(await c.cancel(task.task_id)).toBe('active');
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'cancelled' });
    // The next heartbeat (≤ 200 ms away) carries the cancel; 10 s is a bound no busy machine
    // comes near, and that a worker renewing only halfway through its 30 s lease (~15 s after
    // the claim) could not meet.
    expect(abortedAt - cancelledAt).toBeLessThan(10_000);
    expect(reasons(await historyOf(c, task.task_id))).toContain('report_accepted');
  });
});
