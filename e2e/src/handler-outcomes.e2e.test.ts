/**
 * What a handler may return or throw, its ctx, and schema validation,
 * against the real server. Every task must end settled with an outcome that says what went
 * wrong, with a retry decision that makes sense.
 */
import { OUTPUT_MAX_BYTES, type TaskResult } from '@ledgence/contracts';
import { ApplicationError, type StandardSchemaV1, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  historyOf,
  reasons,
  Stack,
  settled,
  shortWorker,
  startHttpProxy,
  until,
  watchUnhandledRejections,
} from './test/harness.js';

const stack = new Stack('handler_outcomes_e2e');
let server: ServerProcess;
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];

beforeAll(async () => {
  await stack.open();
  // A short safety margin, so tasks of a 2 s budget may start.
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

const twice = { max_attempts: 2, delay_ms: 0 };

type Handler = Parameters<Worker['register']>[1];

/** Runs each program once as a task of its own (two attempts allowed) and returns the results. */
async function runAll(
  queue: string,
  programs: Record<string, Handler>,
): Promise<Record<string, TaskResult>> {
  const c = client(server.url);
  const ids: Record<string, string> = {};
  for (const program of Object.keys(programs)) {
    ids[program] = (await c.submit({ queue, program, data: null, retry: twice })).task_id;
  }
  const w = shortWorker(server.url, queue, { concurrency: 4 });
  workers.push(w);
  for (const [program, handler] of Object.entries(programs)) w.register(program, handler);
  const running = w.run();
  const names = Object.keys(ids);
  const results = await settled(
    c,
    names.map((n) => ids[n] as string),
  );
  await w.stop();
  await running;
  return Object.fromEntries(names.map((n, i) => [n, results[i] as TaskResult]));
}

function deep(levels: number): unknown {
  let value: unknown = 1;
  for (let i = 0; i < levels; i++) value = [value];
  return value;
}

describe('handler return values', () => {
  it('settles every return value JSON cannot carry as a non-retryable crash after one attempt', async () => {
    class Money {
      toJSON() {
        return { cents: 1 };
      }
    }
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    const results = await runAll('returns-bad', {
      fn: () => () => 1,
      sym: () => Symbol('x'),
      bigint: () => 10n,
      nan: () => Number.NaN,
      inf: () => ({ x: Number.POSITIVE_INFINITY }),
      date: () => new Date(0),
      map: () => new Map([[1, 2]]),
      classjson: () => new Money(),
      circular: () => circular,
      huge: () => 2 ** 53,
      lone: () => 'a\ud800b',
      deep: () => deep(65),
      big: () => 'x'.repeat(OUTPUT_MAX_BYTES - 1),
    });
    for (const [program, result] of Object.entries(results)) {
      expect({ program, outcome: result.outcome }).toMatchObject({
        program,
        outcome: {
          state: 'failed',
          failure: { kind: 'execution', error: { kind: 'crashed', retryable: false } },
        },
      });
      expect({ program, attempts: result.status.attempt_count }).toEqual({ program, attempts: 1 });
    }
  });

  it('settles the return values JSON can carry as success', async () => {
    const results = await runAll('returns-ok', {
      undef: () => undefined,
      negzero: () => -0,
      deep: () => deep(64),
      max: () => 2 ** 53 - 1,
      big: () => 'x'.repeat(OUTPUT_MAX_BYTES - 2),
      undefprop: () => ({ a: 1, b: undefined }),
    });
    expect(results.undef?.outcome).toEqual({ state: 'succeeded', output: null });
    expect(results.negzero?.outcome).toEqual({ state: 'succeeded', output: 0 });
    expect(results.deep?.outcome).toEqual({ state: 'succeeded', output: deep(64) });
    expect(results.max?.outcome).toEqual({ state: 'succeeded', output: 2 ** 53 - 1 });
    const big = results.big?.outcome as { output: string } | undefined;
    expect(big?.output.length).toBe(OUTPUT_MAX_BYTES - 2);
    expect(results.undefprop?.outcome).toEqual({ state: 'succeeded', output: { a: 1 } });
  });
});

describe('handler throws', () => {
  it('settles every kind of throw with an outcome and a retry decision', async () => {
    const getterBomb = new Error('x');
    Object.defineProperty(getterBomb, 'message', {
      get() {
        throw new Error('no');
      },
    });
    const results = await runAll('throws', {
      appNo: () => {
        throw new ApplicationError('nope', 'no', { retryable: false });
      },
      appYes: () => {
        throw new ApplicationError('again', 'again', { retryable: true });
      },
      appBadDetails: () => {
        throw new ApplicationError('bd', 'bad details', { retryable: false, details: { n: 1n } });
      },
      str: () => {
        throw 'a string';
      },
      nul: () => {
        throw null;
      },
      undef: () => {
        throw undefined;
      },
      promise: () => {
        throw Promise.resolve(1);
      },
      getter: () => {
        throw getterBomb;
      },
      rejectsLater: () =>
        new Promise((_, reject) => setTimeout(() => reject(new Error('late')), 10)),
    });
    expect(results.appNo?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'application', error: { code: 'nope', retryable: false } },
    });
    expect(results.appNo?.status.attempt_count).toBe(1);
    expect(results.appYes?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'application', error: { code: 'again', retryable: true } },
    });
    expect(results.appYes?.status.attempt_count).toBe(2);
    // Only its details cannot be reported: the error is kept, without them, saying why.
    expect(results.appBadDetails?.outcome).toMatchObject({
      state: 'failed',
      failure: {
        kind: 'application',
        error: {
          code: 'bd',
          retryable: false,
          message: expect.stringContaining('its details could not be reported'),
        },
      },
    });
    for (const p of ['str', 'nul', 'undef', 'promise', 'getter', 'rejectsLater']) {
      expect({ p, o: results[p]?.outcome }).toMatchObject({
        p,
        o: {
          state: 'failed',
          failure: { kind: 'execution', error: { kind: 'crashed', retryable: true } },
        },
      });
      expect({ p, n: results[p]?.status.attempt_count }).toEqual({ p, n: 2 });
    }
  });
});

describe('an ApplicationError thrown once ctx.signal aborted', () => {
  /** A handler that waits for its signal, then wraps the abort as a non-retryable error. */
  const wrapsTheAbort: Handler = async (_data, ctx) => {
    if (ctx.attempt > 1) return 'retried';
    await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
    throw new ApplicationError('upstream_failed', 'the upstream call failed', { retryable: false });
  };

  it('is reported by the abort: a budget that ran out is timed_out and retried', async () => {
    const c = client(server.url);
    const task = await c.submit({
      queue: 'abort-wrapped-budget',
      program: 'p',
      data: null,
      timeout_ms: 2_000,
      retry: twice,
    });
    const w = shortWorker(server.url, 'abort-wrapped-budget');
    workers.push(w);
    w.register('p', wrapsTheAbort);
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    // README (worker): "A throw after ctx.signal aborted, an ApplicationError too, is reported
    // by its cause ... budget → timed_out (retryable)".
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'retried' });
    expect(result?.status.attempt_count).toBe(2);
  });

  it('is reported by the abort: a shutdown is cancelled and retried, not a failure for good', async () => {
    const c = client(server.url);
    const queue = 'abort-wrapped-shutdown';
    const task = await c.submit({ queue, program: 'p', data: null, retry: twice });
    let started = false;
    const first = shortWorker(server.url, queue);
    workers.push(first);
    first.register('p', async (data, ctx) => {
      started = true;
      return wrapsTheAbort(data, ctx);
    });
    const running = first.run();
    await until(() => started, 30_000, 'the first attempt started');
    await first.stop({ graceMs: 0 });
    await running;
    const second = shortWorker(server.url, queue);
    workers.push(second);
    second.register('p', wrapsTheAbort);
    const again = second.run();
    const [result] = await settled(c, [task.task_id]);
    await second.stop();
    await again;
    // Reported as the application's own (not retryable), the task would have failed for good.
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'retried' });
    expect(result?.status.attempt_count).toBe(2);
  });
});

describe('ctx', () => {
  it('gives the task id, attempt, program, queue and the execution deadline', async () => {
    const c = client(server.url);
    const queue = 'ctx';
    const task = await c.submit({
      queue,
      program: { name: 'ctx', version: '7' },
      data: { a: 1 },
      timeout_ms: 60_000,
      retry: twice,
    });
    const seen: unknown[] = [];
    const w = shortWorker(server.url, queue);
    workers.push(w);
    w.register('ctx', (data, ctx) => {
      seen.push({
        data,
        taskId: ctx.taskId,
        attempt: ctx.attempt,
        attemptId: ctx.attemptId,
        runId: ctx.runId,
        program: ctx.program,
        queue: ctx.queue,
        deadline: ctx.deadline,
        now: Date.now(),
      });
      if (ctx.attempt === 1) throw new Error('again');
      return 'ok';
    });
    const running = w.run();
    await settled(c, [task.task_id]);
    await w.stop();
    await running;
    const snapshot = await c.snapshot(task.task_id);
    expect(seen).toHaveLength(2);
    const [first, second] = seen as {
      data: unknown;
      taskId: string;
      attempt: number;
      attemptId: string;
      runId: string;
      program: unknown;
      queue: string;
      deadline: number;
      now: number;
    }[];
    for (const [i, s] of [first, second].entries()) {
      expect(s).toMatchObject({
        data: { a: 1 },
        taskId: task.task_id,
        attempt: i + 1,
        runId: snapshot.run_id,
        program: { name: 'ctx', version: '7' },
        queue,
      });
      // The execution budget ends timeout_ms after the attempt started, in store time.
      expect(s?.deadline).toBeGreaterThan(s?.now ?? 0);
      expect(s?.deadline).toBeLessThanOrEqual((s?.now ?? 0) + 60_000 + 5_000);
    }
    expect(first?.attemptId).not.toBe(second?.attemptId);
    expect(reasons(await historyOf(c, task.task_id))).toContain('succeeded');
  });
});

describe('schemas', () => {
  const asyncReject: StandardSchemaV1 = {
    '~standard': {
      version: 1,
      vendor: 'test',
      validate: async () => ({ issues: [{ message: 'nope', path: [Symbol('k'), { key: 3 }] }] }),
    },
  };
  const asyncOk: StandardSchemaV1 = {
    '~standard': {
      version: 1,
      vendor: 'test',
      validate: async (v) => ({ value: { wrapped: v } }),
    },
  };
  const throwing: StandardSchemaV1 = {
    '~standard': {
      version: 1,
      vendor: 'test',
      validate: () => {
        throw new Error('schema bug');
      },
    },
  };
  it('settles invalid data as invalid_data when its issues name a long key of the data', async () => {
    const c = client(server.url);
    const queue = 'schema-long-key';
    // Data well within its 1 MiB: one 60 KB key over a list of 20 wrong items.
    const key = 'k'.repeat(60_000);
    const task = await c.submit({ queue, program: 'typed', data: { [key]: Array(20).fill(0) } });
    const everyItem: StandardSchemaV1 = {
      '~standard': {
        version: 1,
        vendor: 'test',
        validate: () => ({
          issues: Array.from({ length: 20 }, (_, i) => ({
            message: 'expected a string',
            path: [key, i],
          })),
        }),
      },
    };
    const w = shortWorker(server.url, queue);
    workers.push(w);
    w.register('typed', () => 1, { schema: everyItem });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'application', error: { code: 'invalid_data', retryable: false } },
    });
  });

  it('async schemas, a rejecting one and a throwing one', async () => {
    const c = client(server.url);
    const queue = 'schemas';
    const ids = [];
    for (const program of ['rej', 'ok', 'throw']) {
      ids.push((await c.submit({ queue, program, data: { q: 1 }, retry: twice })).task_id);
    }
    const w = shortWorker(server.url, queue, { concurrency: 3 });
    workers.push(w);
    w.register('rej', () => 1, { schema: asyncReject });
    w.register('ok', (d) => d, { schema: asyncOk });
    w.register('throw', () => 1, { schema: throwing });
    const running = w.run();
    const [rej, ok, thr] = await settled(c, ids);
    await w.stop();
    await running;
    expect(rej?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'application', error: { code: 'invalid_data', retryable: false } },
    });
    expect(ok?.outcome).toEqual({ state: 'succeeded', output: { wrapped: { q: 1 } } });
    // A schema that throws is a bug of the worker's code, not of the data: crashed, retryable.
    expect(thr?.outcome).toMatchObject({
      state: 'failed',
      failure: {
        kind: 'execution',
        error: { kind: 'crashed', message: 'schema bug', retryable: true },
      },
    });
  });
});

describe('a returned value changed after the handler returned', () => {
  /** A worker behind a proxy that answers the first settle request `unavailable` unseen. */
  async function behindRefusingProxy(queue: string) {
    let refused = 0;
    const proxy = await startHttpProxy(server.url, {
      refuse: (request) => {
        if (!request.path.startsWith('/v1/worker/settle') || refused > 0) return false;
        refused += 1;
        return true;
      },
    });
    const w = shortWorker(proxy.url, queue);
    workers.push(w);
    return { w, proxy, refused: () => refused };
  }

  it('reports the output as it was returned, not as it is when the settlement is sent again', async () => {
    const c = client(server.url);
    const queue = 'mutated-output';
    const task = await c.submit({ queue, program: 'live', data: null, retry: twice });
    const { w, proxy, refused } = await behindRefusingProxy(queue);
    w.register('live', () => {
      const out = { n: 1 };
      // The handler keeps using the object it returned (a cache entry, a live accumulator).
      setTimeout(() => {
        out.n = 2;
      }, 0);
      return out;
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    await proxy.close();
    expect(refused()).toBe(1);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: { n: 1 } });
  });

  it('settles an output that became unserialisable after it was returned, not leaving it to lease expiry', async () => {
    const c = client(server.url);
    const queue = 'mutated-bigint';
    const task = await c.submit({ queue, program: 'live', data: null, retry: twice });
    const { w, proxy, refused } = await behindRefusingProxy(queue);
    w.register('live', () => {
      const out: Record<string, unknown> = { n: 1 };
      setTimeout(() => {
        out.n = 10n;
      }, 0);
      return out;
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    await proxy.close();
    expect(refused()).toBe(1);
    expect(reasons(await historyOf(c, task.task_id))).not.toContain('lease_expired');
    expect(result?.outcome).toEqual({ state: 'succeeded', output: { n: 1 } });
  });
});

describe('a handler deaf to its signal', () => {
  it('a handler that ignores a cancel and never returns is reported once its budget ends, and frees its slot', async () => {
    const c = client(server.url);
    const queue = 'cancel-deaf';
    const deaf = await c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 2_000,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let started = false;
    const w = shortWorker(server.url, queue, { abortGraceMs: 500 });
    workers.push(w);
    w.register('deaf', async () => {
      started = true;
      await new Promise(() => {});
    });
    w.register('next', () => 'ran');
    const running = w.run();
    await until(() => started);
    expect(await c.cancel(deaf.task_id)).toBe('active');
    const [cancelled] = await settled(c, [deaf.task_id], 30_000);
    expect(cancelled?.outcome).toEqual({ state: 'cancelled' });
    // The worker's one slot must come free: its deaf handler was reported, like one deaf to the
    // end of its budget.
    const next = await c.submit({ queue, program: 'next', data: null });
    const [result] = await settled(c, [next.task_id], 20_000);
    await w.stop({ graceMs: 0 });
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'ran' });
    // Reported by the worker (it may still run), not left to lease expiry.
    expect(reasons(await historyOf(c, deaf.task_id))).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'cancel_requested',
      'report_accepted',
      'cancelled',
    ]);
  });
});
