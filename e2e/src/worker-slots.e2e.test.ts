/**
 * `concurrency` bounds the handlers running at once, deaf ones included (worker README), over a
 * real server process: through throws, outputs that cannot be sent, budget timeouts and cancels
 * no slot is leaked; and a deaf handler whose lease was lost keeps its slot until it returns
 * (until 2026-12-05 the slot took the retry of that very task beside it).
 */
import { OUTPUT_MAX_BYTES } from '@ledgence/contracts';
import { ApplicationError } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  client,
  historyOf,
  reasons,
  settled,
  sleep,
  startProxy,
  until,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('worker_slots_e2e', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '2000',
});

/** Counts handlers running at once. */
function gauge() {
  let now = 0;
  let max = 0;
  return {
    enter() {
      now += 1;
      max = Math.max(max, now);
    },
    leave() {
      now -= 1;
    },
    get now() {
      return now;
    },
    get max() {
      return max;
    },
    reset() {
      max = now;
    },
  };
}

const once = { max_attempts: 1, delay_ms: 0 };

describe('slot accounting through failures', () => {
  it('concurrency 2: never more than 2 at once through throws, bad outputs, timeouts and cancels, and 2 at once afterwards', async () => {
    const c = client(suite.server.url);
    const queue = 'slots-mixed';
    const g = gauge();
    const w = suite.worker(queue, { concurrency: 2, abortGraceMs: 200 });
    const wrap =
      (fn: (signal: AbortSignal) => unknown | Promise<unknown>) =>
      async (_data: unknown, ctx: { signal: AbortSignal }) => {
        g.enter();
        try {
          return await fn(ctx.signal);
        } finally {
          g.leave();
        }
      };
    const untilAbort = (signal: AbortSignal) =>
      new Promise<never>((_, reject) =>
        signal.addEventListener('abort', () => reject(signal.reason), { once: true }),
      );
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    let cancelStarted = false;
    w.register(
      'throws',
      wrap(async () => {
        await sleep(100);
        throw new Error('boom');
      }),
    );
    w.register(
      'app',
      wrap(async () => {
        await sleep(100);
        throw new ApplicationError('nope', 'no', { retryable: false });
      }),
    );
    w.register(
      'bigint',
      wrap(async () => {
        await sleep(100);
        return 10n;
      }),
    );
    w.register(
      'circular',
      wrap(async () => {
        await sleep(100);
        return circular;
      }),
    );
    w.register(
      'huge',
      wrap(async () => {
        await sleep(100);
        return 'x'.repeat(OUTPUT_MAX_BYTES + 10);
      }),
    );
    w.register(
      'strthrow',
      wrap(async () => {
        await sleep(100);
        throw 'a string';
      }),
    );
    w.register(
      'timeout',
      wrap((signal) => untilAbort(signal)),
    );
    w.register(
      'cancel',
      wrap((signal) => {
        cancelStarted = true;
        return untilAbort(signal);
      }),
    );
    w.register(
      'probe',
      wrap(async () => {
        await sleep(400);
        return 'ok';
      }),
    );
    const ids: string[] = [];
    for (const program of ['throws', 'app', 'bigint', 'circular', 'huge', 'strthrow']) {
      ids.push((await c.submit({ queue, program, data: null, retry: once })).task_id);
    }
    ids.push(
      (await c.submit({ queue, program: 'timeout', data: null, retry: once, timeout_ms: 1_000 }))
        .task_id,
    );
    const cancelTask = await c.submit({ queue, program: 'cancel', data: null, retry: once });
    ids.push(cancelTask.task_id);
    const running = w.run();
    await until(() => cancelStarted, 30_000, 'cancel handler started');
    await c.cancel(cancelTask.task_id);
    const results = await settled(c, ids, 60_000);
    for (const r of results) expect(r.outcome.state).not.toBe('succeeded');
    expect(results.at(-1)?.outcome).toEqual({ state: 'cancelled' });
    expect(g.max).toBeLessThanOrEqual(2);

    // No slot leaked: probes run two at once.
    await until(() => g.now === 0, 10_000, 'all handlers ended');
    g.reset();
    const probes: string[] = [];
    for (let i = 0; i < 6; i++) {
      probes.push((await c.submit({ queue, program: 'probe', data: null })).task_id);
    }
    const probeResults = await settled(c, probes, 30_000);
    expect(probeResults.every((r) => r.outcome.state === 'succeeded')).toBe(true);
    // Two handlers of 400 ms ran at once: both slots came back.
    expect(g.max).toBe(2);
    await w.stop({ graceMs: 0 });
    await running;
  });
});

describe('a handler deaf to the loss of its lease', () => {
  it('concurrency 1: the slot is not given to the retry of its own task while the deaf handler still runs', async () => {
    const c = client(suite.server.url);
    const queue = 'lease-lost-deaf';
    const proxy = await startProxy(suite.server.url);
    suite.proxies.push(proxy);
    const g = gauge();
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const attempts: number[] = [];
    let aborted: unknown;
    const w = suite.worker(queue, { url: proxy.url, abortGraceMs: 200 });
    w.register('deaf', async (_d, ctx) => {
      attempts.push(ctx.attempt);
      g.enter();
      ctx.signal.addEventListener('abort', () => {
        aborted = (ctx.signal.reason as { why?: string }).why;
      });
      try {
        await released; // deaf: ignores its signal
        return 'late';
      } finally {
        g.leave();
      }
    });
    const task = await c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 3_000,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    const running = w.run();
    await until(() => attempts.length === 1, 30_000, 'first attempt running');
    // Partition the worker for longer than its lease: the server recovers the attempt.
    proxy.setDown(true);
    await until(
      async () => reasons(await historyOf(c, task.task_id)).includes('lease_expired'),
      10_000,
      'lease_expired',
    );
    proxy.setDown(false);
    expect(aborted).toBe('lease_lost');
    // Past the first attempt's budget (3 s) and the abort grace: does the worker start the retry
    // while the first handler still runs?
    await sleep(4_000);
    const maxSeen = g.max;
    const seen = [...attempts];
    release();
    await w.stop({ graceMs: 0 });
    await running;
    expect({ maxConcurrent: maxSeen, attempts: seen }).toEqual({ maxConcurrent: 1, attempts: [1] });
  });
});
