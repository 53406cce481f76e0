import { type Logger, TaskAbortedError, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  type HttpProxy,
  historyOf,
  reasons,
  Stack,
  shortWorker,
  sleep,
  startHttpProxy,
  until,
  watchUnhandledRejections,
} from './test/harness.js';
import { killStopWorkers, startStopWorker } from './test/stop-worker-process.js';

const stack = new Stack('worker_stop_more_e2e');
let server: ServerProcess;
/** Leases of 20 s: a task left leased is noticed long before its lease would expire. */
let longLeases: ServerProcess;
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];
const proxies: { close(): Promise<void> }[] = [];

beforeAll(async () => {
  await stack.open();
  [server, longLeases] = await Promise.all([
    stack.start(),
    stack.start({ LEDGENCE_LEASE_DURATION_MS: '20000', LEDGENCE_RENEW_INTERVAL_MS: '250' }),
  ]);
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  await Promise.all(proxies.splice(0).map((p) => p.close()));
  await killStopWorkers();
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

async function proxy(...args: Parameters<typeof startHttpProxy>): Promise<HttpProxy> {
  const p = await startHttpProxy(...args);
  proxies.push(p);
  return p;
}

/** `promise`'s value, or `'pending'` if it has not settled within `ms` (a termination bound). */
async function within<T>(promise: Promise<T>, ms: number): Promise<T | 'pending'> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const bound = new Promise<'pending'>((resolve) => {
    timer = setTimeout(() => resolve('pending'), ms);
  });
  try {
    return await Promise.race([promise, bound]);
  } finally {
    clearTimeout(timer);
  }
}

/** A logger keeping warnings, to see what the worker said about its options. */
function warnings(): { logger: Logger; seen: string[] } {
  const seen: string[] = [];
  return {
    seen,
    logger: {
      debug: () => {},
      info: () => {},
      warn: (message) => seen.push(message),
      error: (message) => seen.push(message),
    },
  };
}

describe('requests left running after stop()', () => {
  it('a session open in flight at stop() is aborted: the process exits long before the request timeout', async () => {
    let opening = false;
    const p = await proxy(server.url, {
      hold: ({ path }) => {
        if (path !== '/v1/worker/sessions') return undefined;
        opening = true;
        return new Promise<void>(() => {});
      },
    });
    const w = await startStopWorker({
      LEDGENCE_URL: p.url,
      QUEUE: 'open-in-flight',
      GRACE_MS: '0',
      REQUEST_TIMEOUT_MS: '60000',
    });
    await until(() => opening, 30_000, 'the session open in flight');
    w.child.kill('SIGTERM');
    await w.line((l) => l.event === 'run', 30_000, 'run() settling');
    // The open's socket (and its 60 s timer) must not keep the process alive once run() resolved.
    expect(await within(w.exited, 10_000)).toBe(0);
    expect(w.lines.find((l) => l.event === 'run')).toMatchObject({ ok: true });
  });

  it('a session extension in flight when run() resolves is aborted: the process exits long before the request timeout', async () => {
    let extending = false;
    const p = await proxy(server.url, {
      hold: ({ path }) => {
        if (!path.endsWith('/extend')) return undefined;
        extending = true;
        return new Promise<void>(() => {});
      },
    });
    const w = await startStopWorker({
      LEDGENCE_URL: p.url,
      QUEUE: 'extend-in-flight',
      EXTEND_MS: '1000',
      GRACE_MS: '0',
      REQUEST_TIMEOUT_MS: '60000',
    });
    await until(() => extending, 30_000, 'a session extension in flight');
    w.child.kill('SIGTERM');
    await w.line((l) => l.event === 'run', 30_000, 'run() settling');
    expect(await within(w.exited, 10_000)).toBe(0);
    expect(w.lines.find((l) => l.event === 'run')).toMatchObject({ ok: true });
    // The poll parked at SIGTERM was replayed, and its reply waited for: not cut by the drain's
    // end as a failed acquire.
    expect(w.lines.filter((l) => l.event === 'log' && l.message === 'acquire failed')).toEqual([]);
  });

  // With a `fetch` of the caller's (WorkerOptions.fetch), the drain's closeIdle() reaches no
  // socket: only an abort ends a request the worker no longer needs.
  it.each([
    ['session open', (path: string) => path === '/v1/worker/sessions', {}],
    [
      'session extension',
      (path: string) => path.endsWith('/extend'),
      { sessionExtendIntervalMs: 500 },
    ],
  ] as const)(
    'with a fetch of its own: a %s in flight is aborted by stop(), not left to its 60 s timeout',
    async (_what, matches, options) => {
      let inFlight = false;
      let ended = false;
      const p = await proxy(server.url, {
        observe: ({ path }) => {
          if (!matches(path)) return undefined;
          inFlight = true;
          return () => {
            ended = true;
          };
        },
        hold: ({ path }) => (matches(path) ? new Promise<void>(() => {}) : undefined),
      });
      const w = shortWorker(p.url, `fetch-${_what.replace(' ', '-')}`, {
        fetch: globalThis.fetch,
        requestTimeoutMs: 60_000,
        ...options,
      });
      workers.push(w);
      w.register('p', () => null);
      const running = w.run();
      await until(() => inFlight, 30_000, `the ${_what} in flight`);
      expect(await within(w.stop({ graceMs: 0 }), 10_000)).not.toBe('pending');
      await running;
      // The proxy sees the worker's side of the request go away (a termination bound).
      await until(() => ended, 10_000, `the ${_what} ended by the worker`);
    },
  );
});

describe('stop({ graceMs: 0 }) and an assignment a cut-short poll carried', () => {
  it('hands the task back before stop() resolves, so it is claimable at once, not after lease expiry', async () => {
    const c = client(longLeases.url);
    const queue = 'handback-at-zero-grace';
    const task = await c.submit({ queue, program: 'p', data: null });
    let acquires = 0;
    // The first poll claims the task but its reply never reaches the worker; the replay's reply
    // (the same assignment, replayed by the server) comes a little later than no time at all.
    const p = await proxy(longLeases.url, {
      hold: ({ path }) => {
        if (!path.startsWith('/v1/worker/acquire')) return undefined;
        acquires += 1;
        return acquires === 1 ? new Promise<void>(() => {}) : sleep(300);
      },
    });
    let ran = false;
    const w = shortWorker(p.url, queue);
    workers.push(w);
    w.register('p', () => {
      ran = true;
      return 'ran';
    });
    const running = w.run();
    await until(
      async () => reasons(await historyOf(c, task.task_id)).includes('claimed'),
      30_000,
      'the task claimed by the held poll',
    );
    await w.stop({ graceMs: 0 });
    await running;
    // Handed back (failed/rejected, retryable, no dispatch): queued again now, while its lease
    // (20 s) would still hold it had the hand-back been given up.
    expect((await c.status(task.task_id)).state).toBe('queued');
    expect(ran).toBe(false);
    expect(acquires).toBe(2);
    const events = reasons(await historyOf(c, task.task_id));
    expect(events).toContain('report_accepted');
    expect(events).not.toContain('dispatch_authorized');
    expect(events).not.toContain('lease_expired');
  });
});

describe('a second stop() with a shorter grace', () => {
  it('stop({ graceMs: 0 }) after stop({ graceMs: 60 000 }) aborts the running handler now', async () => {
    const c = client(server.url);
    const queue = 'second-stop-shortens';
    await c.submit({ queue, program: 'hang', data: null });
    let started = false;
    let reason: unknown;
    const w = shortWorker(server.url, queue, { abortGraceMs: 1_000 });
    workers.push(w);
    w.register('hang', async (_data, ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      reason = ctx.signal.reason;
      throw ctx.signal.reason;
    });
    const running = w.run();
    await until(() => started, 30_000, 'the handler running');
    const first = w.stop({ graceMs: 60_000 });
    await sleep(100);
    expect(reason).toBeUndefined();
    // A second SIGTERM, or an orchestrator's deadline nearing: what is left of the grace is now 0.
    const second = w.stop({ graceMs: 0 });
    expect(await within(Promise.all([first, second]), 10_000)).not.toBe('pending');
    await running;
    expect(reason).toBeInstanceOf(TaskAbortedError);
    expect((reason as TaskAbortedError).why).toBe('shutdown');
  });

  it('a later stop() with a longer grace does not lengthen it', async () => {
    const c = client(server.url);
    const queue = 'second-stop-longer';
    await c.submit({ queue, program: 'hang', data: null });
    let started = false;
    let reason: unknown;
    const w = shortWorker(server.url, queue, { abortGraceMs: 1_000 });
    workers.push(w);
    w.register('hang', async (_data, ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      reason = ctx.signal.reason;
      throw ctx.signal.reason;
    });
    const running = w.run();
    await until(() => started, 30_000, 'the handler running');
    const first = w.stop({ graceMs: 200 });
    const second = w.stop({ graceMs: 60_000 });
    expect(await within(Promise.all([first, second]), 10_000)).not.toBe('pending');
    await running;
    expect((reason as TaskAbortedError).why).toBe('shutdown');
  });
});

describe('a grace that is not a number ≥ 0', () => {
  it.each([
    ['a numeric string (an environment variable passed as is)', '5000'],
    ['NaN (Number() of an unset environment variable)', Number.NaN],
    ['a non-numeric string', 'soon'],
  ])(
    'stop({ graceMs: %s }) uses the worker shutdownGraceMs and warns, not a grace of 0',
    async (_what, graceMs) => {
      const c = client(server.url);
      const queue = `grace-${String(graceMs)}`;
      const task = await c.submit({ queue, program: 'job', data: null });
      let started = false;
      let finish!: () => void;
      const finished = new Promise<void>((resolve) => {
        finish = resolve;
      });
      let aborted: unknown;
      const log = warnings();
      const w = shortWorker(server.url, queue, { shutdownGraceMs: 30_000, logger: log.logger });
      workers.push(w);
      w.register('job', async (_data, ctx) => {
        started = true;
        ctx.signal.addEventListener('abort', () => {
          aborted = ctx.signal.reason;
        });
        await finished;
        return 'done';
      });
      const running = w.run();
      await until(() => started, 30_000, 'the handler running');
      const stopping = w.stop({ graceMs: graceMs as number });
      // Within a grace of 30 s the handler is not aborted; with a grace of 0 it is within ms.
      await sleep(500);
      expect(aborted).toBeUndefined();
      finish();
      await stopping;
      await running;
      expect(aborted).toBeUndefined();
      expect((await c.status(task.task_id)).state).toBe('succeeded');
      expect(log.seen.some((m) => m.includes('graceMs'))).toBe(true);
    },
  );

  it('stop(null) from plain JavaScript neither throws nor rejects: it stops with shutdownGraceMs', async () => {
    const w = shortWorker(server.url, 'stop-null', { shutdownGraceMs: 1_000 });
    workers.push(w);
    w.register('p', () => null);
    const running = w.run();
    await sleep(200);
    let stopping: Promise<void> | undefined;
    expect(() => {
      stopping = w.stop(null as never);
    }).not.toThrow();
    await expect(stopping).resolves.toBeUndefined();
    await running;
  });

  it('stop({ graceMs: -1 }) is a grace of 0 (no time left), without a warning', async () => {
    const c = client(server.url);
    const queue = 'grace-negative';
    await c.submit({ queue, program: 'hang', data: null });
    let started = false;
    let reason: unknown;
    const log = warnings();
    const w = shortWorker(server.url, queue, { shutdownGraceMs: 60_000, logger: log.logger });
    workers.push(w);
    w.register('hang', async (_data, ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      reason = ctx.signal.reason;
      throw ctx.signal.reason;
    });
    const running = w.run();
    await until(() => started, 30_000, 'the handler running');
    expect(await within(w.stop({ graceMs: -1 }), 10_000)).not.toBe('pending');
    await running;
    expect((reason as TaskAbortedError).why).toBe('shutdown');
    expect(log.seen.filter((m) => m.includes('graceMs'))).toEqual([]);
  });
});
