/**
 * The worker's `run()` / `stop()` lifecycle against real server processes: stop while a request
 * the drain waits on hangs, while a session extension is in flight, while polls are parked; what
 * a stop leaves running, what it hands back, a second stop with a shorter grace, a grace that is
 * not a number; run() against a deployment whose sessions keep vanishing; a worker process
 * SIGKILLed in the middle of its stop. Worker processes (test/stop-worker-process.ts) never call
 * `process.exit`, so a test sees whether one ends on its own once `run()` has resolved.
 */
import {
  request as httpRequest,
  createServer as httpServer,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import { type Logger, TaskAbortedError, type Worker, type WorkerOptions } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  type HttpProxy,
  historyOf,
  holdDispatchAnswers,
  perAttempt,
  reasons,
  Stack,
  settled,
  shortWorker,
  sleep,
  startHttpProxy,
  until,
  watchUnhandledRejections,
} from './test/harness.js';
import { killStopWorkers, startStopWorker } from './test/stop-worker-process.js';

const stack = new Stack('worker_stop_e2e');
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

/**
 * A worker running one task of `queue` whose handler waits for its abort signal and then throws
 * its reason; resolves once the handler runs. `reason()` is what aborted it (undefined before).
 */
async function hangingTask(queue: string, options: Partial<WorkerOptions> = {}) {
  await client(server.url).submit({ queue, program: 'hang', data: null });
  let started = false;
  let reason: unknown;
  const worker = shortWorker(server.url, queue, options);
  workers.push(worker);
  worker.register('hang', async (_data, ctx) => {
    started = true;
    await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
    reason = ctx.signal.reason;
    throw ctx.signal.reason;
  });
  const running = worker.run();
  await until(() => started, 30_000, 'the handler running');
  return { worker, running, reason: () => reason };
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

describe('stop() and what it leaves running', () => {
  it('a session extension that fails after stop() re-arms no timer: the process exits on its own', async () => {
    let extending = false;
    // The extension is held, and fails (its connection cut) only once stop() has resolved.
    const p = await proxy(server.url, {
      hold: ({ path }) => {
        if (!path.endsWith('/extend')) return undefined;
        extending = true;
        return new Promise<void>(() => {});
      },
    });
    const w = await startStopWorker({
      LEDGENCE_URL: p.url,
      QUEUE: 'extend-after-stop',
      EXTEND_MS: '1000',
      REQUEST_TIMEOUT_MS: '60000',
      TIMERS_AFTER: 'extending the session failed',
    });
    await until(() => extending, 30_000, 'a session extension in flight');
    w.child.kill('SIGTERM');
    await w.line((l) => l.event === 'stopped', 30_000, 'stop() resolving');
    await w.line((l) => l.event === 'run' && l.ok === true, 30_000, 'run() resolving');
    await p.close();
    const timers = await w.line((l) => l.event === 'timers', 30_000, 'the failed extension');
    // A stopped worker must not schedule another extension: that timer (the extension period,
    // 100 s by default) keeps the process alive after run() resolved.
    expect(timers.count).toBe(0);
    expect(await w.exited).toBe(0);
  });

  it('stop({ graceMs: 0 }) of a worker whose session open hangs resolves without waiting for the request timeout', async () => {
    let opening = false;
    const p = await proxy(server.url, {
      hold: ({ path }) => {
        if (path !== '/v1/worker/sessions') return undefined;
        opening = true;
        return new Promise<void>(() => {});
      },
    });
    const w = shortWorker(p.url, 'open-hangs', { requestTimeoutMs: 60_000 });
    workers.push(w);
    w.register('p', () => null);
    const running = w.run();
    await until(() => opening, 30_000, 'the session open in flight');
    // The worker holds nothing: nothing is left to drain, and no grace was given.
    const stopped = w.stop({ graceMs: 0 }).then(() => 'stopped' as const);
    expect(await within(stopped, 10_000)).toBe('stopped');
    await running;
  });

  it('stop() while polls are parked resolves before their wait ends and claims nothing', async () => {
    const parked = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '30000' });
    let polls = 0;
    const p = await proxy(parked.url, {
      observe: ({ path }) => {
        if (path.startsWith('/v1/worker/acquire')) polls += 1;
        return undefined;
      },
    });
    const c = client(parked.url);
    const w = shortWorker(p.url, 'parked', { concurrency: 4, pollWaitMs: 30_000 });
    workers.push(w);
    w.register('p', () => 'ran');
    const running = w.run();
    await until(() => polls >= 1, 30_000, 'a parked poll');
    await sleep(200);
    const stopped = w.stop({ graceMs: 10_000 }).then(() => 'stopped' as const);
    expect(await within(stopped, 10_000)).toBe('stopped');
    await running;
    const task = await c.submit({ queue: 'parked', program: 'p', data: null });
    await sleep(500);
    expect(reasons(await historyOf(c, task.task_id))).toEqual(['submitted']);
    await parked.stop('SIGKILL');
  });

  it('a worker process SIGTERMed while a handler runs finishes it, settles it and exits on its own', async () => {
    const c = client(server.url);
    const queue = 'exits-on-its-own';
    const task = await c.submit({ queue, program: 'job', data: { ms: 300 } });
    const w = await startStopWorker({ LEDGENCE_URL: server.url, QUEUE: queue, GRACE_MS: '10000' });
    await w.line((l) => l.event === 'start', 30_000, 'the handler starting');
    w.child.kill('SIGTERM');
    await w.line((l) => l.event === 'run' && l.ok === true, 30_000, 'run() resolving');
    // No process.exit in the child: it ends only if the SDK left nothing referenced.
    expect(await within(w.exited, 5_000)).toBe(0);
    expect((await c.status(task.task_id)).state).toBe('succeeded');
    const events = await historyOf(c, task.task_id);
    expect([...perAttempt(events, 'report_accepted').values()]).toEqual([1]);
  });

  it('stop() while a dispatch renewal is in flight: the answer within the grace runs the handler once', async () => {
    const c = client(server.url);
    const queue = 'dispatch-in-flight';
    const task = await c.submit({ queue, program: 'p', data: null });
    const held = await holdDispatchAnswers(server.url);
    proxies.push(held.proxy);
    let runs = 0;
    let abortedAtStart: boolean | undefined;
    const w = shortWorker(held.proxy.url, queue);
    workers.push(w);
    w.register('p', (_data, ctx) => {
      runs += 1;
      abortedAtStart = ctx.signal.aborted;
      return 'ran';
    });
    const running = w.run();
    await until(held.sent, 30_000, 'the dispatch renewal in flight');
    const stopping = w.stop({ graceMs: 10_000 });
    held.release();
    await stopping;
    await running;
    expect(runs).toBe(1);
    expect(abortedAtStart).toBe(false);
    expect((await c.status(task.task_id)).state).toBe('succeeded');
    expect([...perAttempt(await historyOf(c, task.task_id), 'report_accepted').values()]).toEqual([
      1,
    ]);
  });

  it.each([0, 150])(
    'a server SIGTERMed while the worker stops (%i ms apart): run() resolves, nothing claimed',
    async (apart) => {
      const draining = await stack.start({
        LEDGENCE_LONG_POLL_WAIT_MS: '30000',
        LEDGENCE_SHUTDOWN_TIMEOUT_MS: '2000',
      });
      const c = client(server.url);
      const queue = `server-drains-${apart}`;
      let polls = 0;
      const p = await proxy(draining.url, {
        observe: ({ path }) => {
          if (path.startsWith('/v1/worker/acquire')) polls += 1;
          return undefined;
        },
      });
      const w = shortWorker(p.url, queue, { concurrency: 4, pollWaitMs: 30_000 });
      workers.push(w);
      w.register('p', () => 'ran');
      const running = w.run().then(
        () => 'resolved',
        (error: unknown) => error,
      );
      await until(() => polls >= 1, 30_000, 'a parked poll');
      await sleep(200);
      const serverExit = draining.stop('SIGTERM');
      await sleep(apart);
      await w.stop({ graceMs: 2_000 });
      expect(await running).toBe('resolved');
      expect(await serverExit).toBe(0);
      const task = await c.submit({ queue, program: 'p', data: null });
      expect(reasons(await historyOf(c, task.task_id))).toEqual(['submitted']);
    },
  );

  it('run() called twice: the second rejects, the first runs on and resolves at stop()', async () => {
    const c = client(server.url);
    const w = shortWorker(server.url, 'twice');
    workers.push(w);
    let runs = 0;
    w.register('p', () => {
      runs += 1;
      return 'ok';
    });
    const first = w.run();
    await expect(w.run()).rejects.toBeInstanceOf(TypeError);
    const task = await c.submit({ queue: 'twice', program: 'p', data: null });
    const [result] = await settled(c, [task.task_id]);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'ok' });
    await w.stop();
    await first;
    expect(runs).toBe(1);
  });
});

describe('a deployment whose sessions keep vanishing', () => {
  const other = new Stack('worker_stop_other_e2e');
  let elsewhere: ServerProcess;

  beforeAll(async () => {
    await other.open();
    elsewhere = await other.start();
  });
  afterAll(async () => {
    await other.close();
  });

  it('a session answered session_not_found at every poll is not re-opened in a hot loop', async () => {
    // A balancer misrouting between two deployments: sessions are opened on one, polls reach the
    // other (its own database), which answers every poll session_not_found.
    let opens = 0;
    let polls = 0;
    const router = httpServer((req: IncomingMessage, res: ServerResponse) => {
      const path = req.url ?? '';
      const toSessions = path.startsWith('/v1/worker/sessions');
      if (toSessions && req.method === 'POST' && !path.endsWith('/extend')) opens += 1;
      if (path.startsWith('/v1/worker/acquire')) polls += 1;
      const target = new URL(toSessions ? server.url : elsewhere.url);
      const out = httpRequest(
        {
          host: target.hostname,
          port: target.port,
          method: req.method,
          path,
          headers: req.headers,
        },
        (reply) => {
          res.writeHead(reply.statusCode ?? 502, reply.headers);
          reply.pipe(res);
        },
      );
      out.on('error', () => res.destroy());
      req.pipe(out);
    });
    await new Promise<void>((resolve) => router.listen(0, '127.0.0.1', resolve));
    proxies.push({
      close: () =>
        new Promise<void>((resolve) => {
          router.closeAllConnections();
          router.close(() => resolve());
        }),
    });
    const url = `http://127.0.0.1:${(router.address() as AddressInfo).port}`;
    const w = shortWorker(url, 'vanishing', { backoff: { baseMs: 100, maxMs: 1_000 } });
    workers.push(w);
    w.register('p', () => null);
    const running = w.run().catch((error: unknown) => error);
    await sleep(3_000);
    await w.stop({ graceMs: 0 });
    const outcome = await running;
    // With a backoff of at most 1 s, 3 s allow a handful of tries; a hot loop makes hundreds.
    expect(outcome).toBeUndefined();
    expect(opens).toBeLessThan(20);
    expect(polls).toBeLessThan(20);
  });
});

describe('a worker process SIGKILLed in the middle of its stop()', () => {
  it('the task it held comes back after lease expiry and runs once more, settled once', async () => {
    const c = client(server.url);
    const queue = 'kill-mid-stop';
    const task = await c.submit({ queue, program: 'hang', data: null });
    const w = await startStopWorker({
      LEDGENCE_URL: server.url,
      QUEUE: queue,
      GRACE_MS: '30000',
      WORKER_LOG: 'debug',
    });
    await w.line((l) => l.event === 'start', 30_000, 'the handler starting');
    w.child.kill('SIGTERM');
    await w.line((l) => l.event === 'log' && l.message === 'worker stopping', 30_000, 'stopping');
    w.child.kill('SIGKILL');
    expect(await w.exited).toBe('SIGKILL');
    let runs = 0;
    const survivor = shortWorker(server.url, queue);
    workers.push(survivor);
    survivor.register('hang', (_data, ctx) => {
      runs += 1;
      return { attempt: ctx.attempt };
    });
    const running = survivor.run();
    const [result] = await settled(c, [task.task_id]);
    await survivor.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: { attempt: 2 } });
    expect(runs).toBe(1);
    const events = await historyOf(c, task.task_id);
    expect(reasons(events).filter((r) => r === 'lease_expired')).toHaveLength(1);
    expect(reasons(events).filter((r) => r === 'claimed')).toHaveLength(2);
    expect([...perAttempt(events, 'report_accepted').values()]).toEqual([1]);
    expect(w.lines.filter((l) => l.event === 'start')).toHaveLength(1);
  });
});

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
    expect(
      w.lines.filter((l) => l.event === 'log' && l.message === 'acquire failed; retrying'),
    ).toEqual([]);
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
    const {
      worker: w,
      running,
      reason,
    } = await hangingTask('second-stop-shortens', {
      abortGraceMs: 1_000,
    });
    const first = w.stop({ graceMs: 60_000 });
    await sleep(100);
    expect(reason()).toBeUndefined();
    // A second SIGTERM, or an orchestrator's deadline nearing: what is left of the grace is now 0.
    const second = w.stop({ graceMs: 0 });
    expect(await within(Promise.all([first, second]), 10_000)).not.toBe('pending');
    await running;
    expect(reason()).toBeInstanceOf(TaskAbortedError);
    expect((reason() as TaskAbortedError).why).toBe('shutdown');
  });

  it('a later stop() with a longer grace does not lengthen it', async () => {
    const {
      worker: w,
      running,
      reason,
    } = await hangingTask('second-stop-longer', {
      abortGraceMs: 1_000,
    });
    const first = w.stop({ graceMs: 200 });
    const second = w.stop({ graceMs: 60_000 });
    expect(await within(Promise.all([first, second]), 10_000)).not.toBe('pending');
    await running;
    expect((reason() as TaskAbortedError).why).toBe('shutdown');
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
    const log = warnings();
    const {
      worker: w,
      running,
      reason,
    } = await hangingTask('grace-negative', {
      shutdownGraceMs: 60_000,
      logger: log.logger,
    });
    expect(await within(w.stop({ graceMs: -1 }), 10_000)).not.toBe('pending');
    await running;
    expect((reason() as TaskAbortedError).why).toBe('shutdown');
    expect(log.seen.filter((m) => m.includes('graceMs'))).toEqual([]);
  });
});

describe('stop() given a bare grace instead of { graceMs }', () => {
  it('stop(200), as graphile-worker or Temporal users may write it, is a grace of 200 ms, not shutdownGraceMs', async () => {
    const log = warnings();
    const {
      worker: w,
      running,
      reason,
    } = await hangingTask('grace-bare-number', {
      shutdownGraceMs: 60_000,
      logger: log.logger,
    });
    // Within a grace of 60 s stop() would still be pending; within 200 ms it has long resolved.
    expect(await within(w.stop(200), 10_000)).not.toBe('pending');
    await running;
    expect((reason() as TaskAbortedError).why).toBe('shutdown');
    expect(log.seen.filter((m) => m.includes('graceMs'))).toEqual([]);
  });

  it('a bare value that is not a number (stop("5000") from plain JavaScript) is warned about, not silently dropped', async () => {
    const log = warnings();
    const w = shortWorker(server.url, 'grace-bare-string', {
      shutdownGraceMs: 1_000,
      logger: log.logger,
    });
    workers.push(w);
    w.register('p', () => null);
    const running = w.run();
    await sleep(200);
    await expect(w.stop('5000' as never)).resolves.toBeUndefined();
    await running;
    expect(log.seen.some((m) => m.includes('graceMs'))).toBe(true);
  });
});
