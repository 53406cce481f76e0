/**
 * The worker SDK's handler contract at its edges, against the real server — a
 * handler that returns after its signal aborted, one that never settles until stop(), ctx.heartbeat
 * around aborts and after the handler returned, an ApplicationError whose details cannot be sent.
 */
import { MESSAGE_MAX_BYTES, type TaskResult, utf8ByteLength } from '@ledgence/contracts';
import { ApplicationError, type TaskContext, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  historyOf,
  reasons,
  Stack,
  settled,
  shortWorker,
  until,
  watchUnhandledRejections,
} from './test/harness.js';

const stack = new Stack('handler_contract');
let server: ServerProcess;
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];

beforeAll(async () => {
  await stack.open();
  server = await stack.start({
    LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
    LEDGENCE_CLEANUP_GRACE_MS: '2000',
  });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener('abort', () => resolve(), { once: true });
  });
}

/** The error of a failed outcome (`{}` when there is none: the test's expectations then fail). */
function failureError(outcome: unknown): Record<string, unknown> {
  return (
    (outcome as { failure?: { error?: Record<string, unknown> } } | undefined)?.failure?.error ?? {}
  );
}

describe('a handler that returns after its signal aborted', () => {
  it('budget ran out, the handler returns within abortGraceMs: its output is settled as success', async () => {
    const c = client(server.url);
    const queue = 'late-return-budget';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      timeout_ms: 1_500,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let reason: unknown;
    const w = shortWorker(server.url, queue, { abortGraceMs: 2_000 });
    workers.push(w);
    w.register('p', async (_data, ctx) => {
      await aborted(ctx.signal);
      reason = ctx.signal.reason;
      return { late: true };
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 20_000);
    await w.stop();
    await running;
    expect((reason as { why?: string }).why).toBe('timeout');
    expect(result?.outcome).toEqual({ state: 'succeeded', output: { late: true } });
  });

  it('cancelled, the handler returns a value anyway: the task ends cancelled, settled once', async () => {
    const c = client(server.url);
    const queue = 'late-return-cancel';
    const task = await c.submit({ queue, program: 'p', data: null });
    let started = false;
    const w = shortWorker(server.url, queue);
    workers.push(w);
    w.register('p', async (_data, ctx) => {
      started = true;
      await aborted(ctx.signal);
      return 'done anyway';
    });
    const running = w.run();
    await until(() => started);
    await c.cancel(task.task_id);
    const [result] = await settled(c, [task.task_id], 20_000);
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'cancelled' });
    const history = reasons(await historyOf(c, task.task_id));
    expect(history.filter((r) => r === 'report_accepted')).toHaveLength(1);
    expect(history.at(-1)).toBe('cancelled');
  });

  it('shutdown grace over, the handler returns within abortGraceMs: success, not a cancelled retry', async () => {
    const c = client(server.url);
    const queue = 'late-return-shutdown';
    const task = await c.submit({ queue, program: 'p', data: null });
    let started = false;
    const w = shortWorker(server.url, queue, { abortGraceMs: 2_000 });
    w.register('p', async (_data, ctx) => {
      started = true;
      await aborted(ctx.signal);
      await new Promise((r) => setTimeout(r, 100));
      return 'finished on shutdown';
    });
    const running = w.run();
    await until(() => started);
    await w.stop({ graceMs: 50 });
    await running;
    const [result] = await settled(c, [task.task_id], 20_000);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'finished on shutdown' });
    expect(result?.status.attempt_count).toBe(1);
  });
});

describe('a handler that never settles its promise', () => {
  it('stop() resolves within its grace + abortGraceMs + a request, and the task is run again after the authority deadline', async () => {
    const c = client(server.url);
    const queue = 'never-settles';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      timeout_ms: 3_000,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    let started = 0;
    const first = shortWorker(server.url, queue, { abortGraceMs: 300 });
    first.register('p', async () => {
      started += 1;
      await new Promise(() => {});
    });
    const running = first.run();
    await until(() => started === 1);
    const t0 = Date.now();
    await first.stop({ graceMs: 200 });
    await running;
    const took = Date.now() - t0;
    // Grace + abortGraceMs + one request; the margin is wide (a loaded machine), the point is
    // that stop() does not wait for a handler that never settles.
    expect(took).toBeLessThan(200 + 300 + 5_000);
    // Reported `unconfirmed` (it may still run): the server holds the task active.
    const snapshot = await c.snapshot(task.task_id);
    expect(snapshot.state).toBe('active');
    const second = shortWorker(server.url, queue);
    workers.push(second);
    second.register('p', (_d, ctx) => `attempt ${ctx.attempt}`);
    const again = second.run();
    const [result] = (await settled(c, [task.task_id], 30_000)) as TaskResult[];
    await second.stop();
    await again;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'attempt 2' });
    expect(result?.status.attempt_count).toBe(2);
  });
});

describe('ctx.heartbeat() at the edges', () => {
  it('many at once, after the budget abort, and from a ctx kept after the handler returned: each resolves', async () => {
    const c = client(server.url);
    const queue = 'heartbeat-edges';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      timeout_ms: 1_500,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let kept: TaskContext | undefined;
    const steps: string[] = [];
    const w = shortWorker(server.url, queue, { abortGraceMs: 3_000 });
    workers.push(w);
    const within = <T>(p: Promise<T>, ms: number, what: string) =>
      Promise.race([
        p,
        new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} hung`)), ms)),
      ]);
    w.register('p', async (_data, ctx) => {
      kept = ctx;
      await within(
        Promise.all(Array.from({ length: 50 }, () => ctx.heartbeat())),
        3_000,
        '50 concurrent heartbeats',
      );
      steps.push('50 heartbeats');
      await aborted(ctx.signal);
      await within(ctx.heartbeat(), 1_500, 'heartbeat after the budget abort');
      steps.push('heartbeat after abort');
      return 'ok';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 20_000);
    await within(kept?.heartbeat() ?? Promise.resolve(), 1_000, 'heartbeat of a finished handler');
    steps.push('heartbeat after return');
    await w.stop();
    await running;
    expect(steps).toEqual(['50 heartbeats', 'heartbeat after abort', 'heartbeat after return']);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'ok' });
  });
});

describe('an ApplicationError whose details cannot be reported', () => {
  it('is reported without them and its message says why, also when its message is long', async () => {
    const c = client(server.url);
    const queue = 'app-error-long-message';
    const task = await c.submit({ queue, program: 'p', data: null });
    const w = shortWorker(server.url, queue);
    workers.push(w);
    w.register('p', () => {
      throw new ApplicationError('upstream', `upstream said: ${'no '.repeat(2_000)}`, {
        retryable: false,
        details: { when: new Date(0) },
      });
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 20_000);
    await w.stop();
    await running;
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'application', error: { code: 'upstream', retryable: false } },
    });
    const error = failureError(result?.outcome) as { message: string; details?: unknown };
    expect(error.details).toBeUndefined();
    expect(utf8ByteLength(error.message)).toBeLessThanOrEqual(MESSAGE_MAX_BYTES);
    // README (worker): "reported without them (its message says why)".
    expect(error.message.slice(-200)).toContain('its details could not be reported');
  });
});

describe('a handler deaf to the shutdown that ends after stop() resolved', () => {
  it('its quiescence is still confirmed while the process lives: the task is released long before the authority deadline', async () => {
    const c = client(server.url);
    const queue = 'deaf-ends-after-stop';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      timeout_ms: 30_000,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    let started = false;
    let release: () => void = () => {};
    const w = shortWorker(server.url, queue, { abortGraceMs: 200 });
    w.register('p', async () => {
      started = true;
      await new Promise<void>((r) => {
        release = r;
      });
      return 'ended';
    });
    const running = w.run();
    await until(() => started);
    await w.stop({ graceMs: 100 });
    await running;
    expect((await c.snapshot(task.task_id)).state).toBe('active');
    const releasedAt = Date.now();
    release();
    // README (worker, Shutdown): "The worker confirms quiescence once that report is in and the
    // handler has ended while the process lives".
    await until(
      async () => (await c.snapshot(task.task_id)).state !== 'active',
      10_000,
      'the task released by the quiescence confirmation',
    );
    expect(Date.now() - releasedAt).toBeLessThan(10_000);
    expect(reasons(await historyOf(c, task.task_id))).toContain('cleanup_confirmed');
  });

  it('a handler that awaits worker.stop() itself: stop() still resolves, the task is not lost', async () => {
    const c = client(server.url);
    const queue = 'self-stop';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    const w = shortWorker(server.url, queue, { abortGraceMs: 200, shutdownGraceMs: 300 });
    let worker: Worker | undefined = w;
    w.register('p', async (_d, ctx) => {
      if (ctx.attempt === 1 && worker !== undefined) {
        await worker.stop();
        return 'after own stop';
      }
      return `attempt ${ctx.attempt}`;
    });
    const t0 = Date.now();
    await w.run();
    worker = undefined;
    expect(Date.now() - t0).toBeLessThan(15_000);
    const second = shortWorker(server.url, queue);
    workers.push(second);
    second.register('p', (_d, ctx) => `attempt ${ctx.attempt}`);
    const again = second.run();
    const [result] = await settled(c, [task.task_id], 30_000);
    await second.stop();
    await again;
    expect(result?.outcome.state).toBe('succeeded');
  });
});

describe('return values that are plain JSON in less common forms', () => {
  it('null-prototype objects, values of another realm, tiny and exponent numbers settle as success', async () => {
    const { runInNewContext } = await import('node:vm');
    const c = client(server.url);
    const queue = 'returns-exotic-ok';
    const programs: Record<string, () => unknown> = {
      nullproto: () => Object.assign(Object.create(null), { a: 1, b: [Object.create(null)] }),
      realmArray: () => runInNewContext('[1, {"x": [2]}]'),
      realmObject: () => runInNewContext('({ a: { b: [1, 2] } })'),
      tiny: () => [5e-324, 1e-7, -1.5e-10, 0.1 + 0.2],
      frozen: () => Object.freeze({ a: Object.freeze([1]) }),
      emptyKey: () => ({ '': 1, ' spaced key ': 2, 'é\u{1F600}': 3 }),
      controls: () => '\u0000\u0001\n\u007f\u2028',
    };
    const ids: Record<string, string> = {};
    for (const p of Object.keys(programs)) {
      ids[p] = (
        await c.submit({ queue, program: p, data: null, retry: { max_attempts: 1, delay_ms: 0 } })
      ).task_id;
    }
    const w = shortWorker(server.url, queue, { concurrency: 4 });
    workers.push(w);
    for (const [p, h] of Object.entries(programs)) w.register(p, h);
    const running = w.run();
    const names = Object.keys(ids);
    const results = await settled(
      c,
      names.map((n) => ids[n] as string),
      30_000,
    );
    await w.stop();
    await running;
    const by = Object.fromEntries(names.map((n, i) => [n, results[i]?.outcome]));
    expect(by).toEqual({
      nullproto: { state: 'succeeded', output: { a: 1, b: [{}] } },
      realmArray: { state: 'succeeded', output: [1, { x: [2] }] },
      realmObject: { state: 'succeeded', output: { a: { b: [1, 2] } } },
      tiny: { state: 'succeeded', output: [5e-324, 1e-7, -1.5e-10, 0.1 + 0.2] },
      frozen: { state: 'succeeded', output: { a: [1] } },
      emptyKey: { state: 'succeeded', output: { '': 1, ' spaced key ': 2, 'é\u{1F600}': 3 } },
      controls: { state: 'succeeded', output: '\u0000\u0001\n\u007f\u2028' },
    });
  });

  it('an otherwise plain object with a hidden (non-enumerable) toJSON fails the attempt as a crash, never settles what toJSON returns', async () => {
    const c = client(server.url);
    const queue = 'returns-hidden-tojson';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    const w = shortWorker(server.url, queue);
    workers.push(w);
    w.register('p', () => {
      const value = { a: 1 };
      Object.defineProperty(value, 'toJSON', {
        value: () => ({ replaced: true }),
        enumerable: false,
      });
      return value;
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 20_000);
    await w.stop();
    await running;
    // Refused as not plain JSON (contracts json.ts): a crash, not what toJSON would have made.
    expect(result?.outcome.state).toBe('failed');
  });
});

describe('ApplicationError optional fields on the wire', () => {
  it('details: null is reported as no details: the result omits the field (DESIGN §3, §4.1)', async () => {
    const c = client(server.url);
    const queue = 'app-error-null-details';
    const task = await c.submit({ queue, program: 'p', data: null });
    const w = shortWorker(server.url, queue);
    workers.push(w);
    w.register('p', () => {
      throw new ApplicationError('nothing_more', 'no details', { retryable: false, details: null });
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id], 20_000);
    await w.stop();
    await running;
    const error = failureError(result?.outcome);
    expect(error).toMatchObject({ code: 'nothing_more', retryable: false });
    expect(Object.keys(error)).not.toContain('details');
  });
});

describe('ApplicationError details at the limits', () => {
  it('details nested 64 deep, and details of OUTPUT_MAX_BYTES, are reported with the error', async () => {
    const c = client(server.url);
    const queue = 'app-error-details-limits';
    let deep: unknown = { leaf: true };
    for (let i = 0; i < 63; i++) deep = { d: deep };
    const big = 'z'.repeat(1024 * 1024 - 2);
    const deepTask = await c.submit({ queue, program: 'deep', data: null });
    const bigTask = await c.submit({ queue, program: 'big', data: null });
    const w = shortWorker(server.url, queue, { concurrency: 2 });
    workers.push(w);
    w.register('deep', () => {
      throw new ApplicationError('deep', 'deep details', { retryable: false, details: deep });
    });
    w.register('big', () => {
      throw new ApplicationError('big', 'big details', { retryable: false, details: big });
    });
    const running = w.run();
    const [d, b] = await settled(c, [deepTask.task_id, bigTask.task_id], 30_000);
    await w.stop();
    await running;
    expect(d?.outcome).toEqual({
      state: 'failed',
      failure: {
        kind: 'application',
        error: { code: 'deep', message: 'deep details', retryable: false, details: deep },
      },
    });
    const bigError = failureError(b?.outcome) as { code: string; details?: string };
    expect(bigError.code).toBe('big');
    expect(bigError.details?.length).toBe(big.length);
  });
});
