/**
 * Lease keeping over the real server (short timings): renewals, dispatch, settlements and
 * session extensions, and the SDK's retries of them, driven by a real `Worker` through an HTTP
 * proxy that sees every request and can refuse or hold one back.
 */
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { silentLogger } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  client,
  historyOf,
  type ProxiedRequest,
  perAttempt,
  reasons,
  settled,
  sleep,
  startHttpProxy,
  until,
  workerSuite,
} from './test/harness.js';

// A small safety margin lets 1.5 s budgets be dispatched; the cleanup grace stays long.
const suite = workerSuite('lease_keeping_e2e', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '30000',
});
const { proxies } = suite;

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** Whether `request` is a worker batch of `route` naming `attemptId`. */
function names(sent: ProxiedRequest, route: string, attemptId: string | null): boolean {
  return (
    attemptId !== null &&
    sent.path.startsWith(`/v1/worker/${route}`) &&
    sent.body.toString('utf8').includes(attemptId)
  );
}

/** Referenced timers of this process: each one alone keeps a process alive. */
function referencedTimers(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
}

describe('lease keeping', () => {
  it('a dispatch renewal refused past the lease local expiry is retried with backoff, not in a hot loop', async () => {
    const c = client(suite.server.url);
    const queue = 'r-dispatch-refused';
    const task = await c.submit({ queue, program: 'p', data: null });
    let refusing = true;
    let refused = 0;
    const proxy = await startHttpProxy(suite.server.url, {
      refuse: (request) => {
        if (refusing && request.path.startsWith('/v1/worker/renew')) {
          refused += 1;
          return true;
        }
        return false;
      },
    });
    proxies.push(proxy);
    // Backoff capped at 200 ms, heartbeats every 250 ms: over 1.5 s a well-behaved retry loop
    // sends a few dozen renewals at most.
    const w = suite.worker(queue, { url: proxy.url });
    let ran = false;
    w.register('p', () => {
      ran = true;
      return 'ok';
    });
    const running = w.run();
    await until(() => refused > 0);
    // Past the 1 s lease's local expiry, while the dispatch renewal is still unanswered.
    await sleep(1_500);
    const before = refused;
    await sleep(1_500);
    const during = refused - before;
    refusing = false;
    // Once the server answers again the task is taken again and runs.
    const [result] = await settled(c, [task.task_id]);
    await w.stop({ graceMs: 5_000 });
    await running;
    expect(result?.outcome).toMatchObject({ state: 'succeeded' });
    expect(ran).toBe(true);
    // Jittered backoff of at least 100 ms (half its 200 ms cap): a dozen or so, never hundreds.
    expect(during).toBeLessThan(50);
  });

  it('a slot refused as consumer_busy does not hold back the polls of the other slots', async () => {
    const c = client(suite.server.url);
    const queue = 'r-busy-slot';
    // A handler that ignores the end of its budget: reported `unconfirmed`, its slot stays busy
    // on the server until the cleanup grace (30 s) ends or quiescence is confirmed.
    const deaf = await c.submit({
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
    // A long poll backoff makes the difference plain: a retry of the busy slot 30..60 s later.
    const w = suite.worker(queue, {
      concurrency: 2,
      abortGraceMs: 50,
      backoff: { baseMs: 60_000, maxMs: 60_000 },
    });
    w.register('deaf', async () => {
      await released;
      return 'late';
    });
    w.register('quick', () => 'done');
    const running = w.run();
    try {
      await until(async () =>
        reasons(await historyOf(c, deaf.task_id)).includes('report_accepted'),
      );
      // The busy slot polls again at once and is refused; the other slot's long poll ends.
      await sleep(1_500);
      const quick = await c.submit({ queue, program: 'quick', data: null });
      // The free slot takes it: the busy slot's refusal must not pause it for the backoff.
      await until(async () => (await c.status(quick.task_id)).state === 'succeeded', 15_000);
    } finally {
      release();
      await w.stop({ graceMs: 1_000 });
      await running;
    }
  });

  it('a renewal whose reply is slower than the lease is re-sent in time and the handler keeps its lease', async () => {
    const c = client(suite.server.url);
    const queue = 'r-slow-renew';
    const task = await c.submit({ queue, program: 'long', data: null });
    let heldOne = false;
    const proxy = await startHttpProxy(suite.server.url, {
      // The first heartbeat reaches the server (the lease is extended there) but its reply is
      // held back longer than the 1 s lease: a lost reply, as on a congested link.
      hold: (request) => {
        if (
          !heldOne &&
          request.path.startsWith('/v1/worker/renew') &&
          request.body.toString().includes('keep_alive')
        ) {
          heldOne = true;
          return sleep(1_800);
        }
        return undefined;
      },
    });
    proxies.push(proxy);
    const w = suite.worker(queue, { url: proxy.url });
    let abortedBy: unknown;
    w.register('long', async (_data, ctx) => {
      await sleep(3_000);
      abortedBy = ctx.signal.aborted ? ctx.signal.reason : undefined;
      return 'done';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop({ graceMs: 1_000 });
    await running;
    expect(heldOne).toBe(true);
    expect(abortedBy).toBeUndefined();
    expect(result?.outcome).toMatchObject({ state: 'succeeded' });
    expect(reasons(await historyOf(c, task.task_id))).not.toContain('lease_expired');
  });

  it('a renewal answered after the lease was lost locally leaves no timer firing every millisecond', async () => {
    const c = client(suite.server.url);
    const queue = 'r-late-reply';
    const task = await c.submit({ queue, program: 'deaf', data: null });
    let holding = false;
    const proxy = await startHttpProxy(suite.server.url, {
      // Every renewal sent while `holding` reaches the server but its reply comes 1.5 s late:
      // the 1 s lease runs out locally first, then the replies arrive.
      hold: (request) =>
        holding && request.path.startsWith('/v1/worker/renew') ? sleep(1_500) : undefined,
    });
    proxies.push(proxy);
    const w = suite.worker(queue, { url: proxy.url });
    let started = false;
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let aborted = false;
    w.register('deaf', async (_data, ctx) => {
      started = true;
      ctx.signal.addEventListener('abort', () => {
        aborted = true;
      });
      // Ignores the abort, as a handler busy in code that does not watch its signal.
      await released;
      return 'late';
    });
    const running = w.run();
    try {
      await until(() => started);
      holding = true;
      await until(() => aborted);
      holding = false;
      // The held replies have all arrived.
      await sleep(2_000);
      // Count the timers this process arms over one second while nothing happens: the lease is
      // lost, the handler waits, no request goes out.
      const original = globalThis.setTimeout;
      let armed = 0;
      globalThis.setTimeout = ((...args: Parameters<typeof setTimeout>) => {
        armed += 1;
        return original(...args);
      }) as typeof setTimeout;
      try {
        await new Promise((resolve) => original(resolve, 1_000));
      } finally {
        globalThis.setTimeout = original;
      }
      expect(armed).toBeLessThan(50);
    } finally {
      release();
      await w.stop({ graceMs: 1_000 });
      await running;
    }
    // The attempt was given up locally: recovery re-queues the task for another worker.
    await until(async () => (await c.status(task.task_id)).state === 'queued');
  });

  it('a first copy of a renewal reaching the server after a later renewal does not cost the lease', async () => {
    const c = client(suite.server.url);
    const queue = 'r-stale-copy';
    const task = await c.submit({ queue, program: 'long', data: null });
    // A proxy that delays the *request* of the first heartbeat by 1.8 s before forwarding it:
    // the worker re-sends it meanwhile and moves on, so the first copy reaches the server after
    // a later sequence and is refused there as `sequence_conflict`.
    let delayed = 0;
    let staleAnswered: string | undefined;
    const target = new URL(suite.server.url);
    const proxyServer = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (chunk: Buffer) => chunks.push(chunk));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        const first =
          delayed === 0 &&
          (req.url ?? '').startsWith('/v1/worker/renew') &&
          body.toString().includes('keep_alive');
        if (first) delayed += 1;
        const forward = () => {
          const out = request(
            {
              host: target.hostname,
              port: target.port,
              method: req.method,
              path: req.url,
              headers: req.headers,
            },
            (reply) => {
              if (first) {
                const parts: Buffer[] = [];
                reply.on('data', (chunk: Buffer) => parts.push(chunk));
                reply.on('end', () => {
                  staleAnswered = Buffer.concat(parts).toString();
                });
              }
              res.writeHead(reply.statusCode ?? 502, reply.headers);
              reply.pipe(res);
            },
          );
          out.on('error', () => res.destroy());
          out.end(body);
        };
        if (first) setTimeout(forward, 1_800);
        else forward();
      });
    });
    await new Promise<void>((resolve) => proxyServer.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(proxyServer.address() as AddressInfo).port}`;
    const w = suite.worker(queue, { url, requestTimeoutMs: 5_000 });
    let abortedBy: unknown;
    w.register('long', async (_data, ctx) => {
      await sleep(3_000);
      abortedBy = ctx.signal.aborted ? ctx.signal.reason : undefined;
      return 'done';
    });
    const running = w.run();
    try {
      const [result] = await settled(c, [task.task_id]);
      expect(delayed).toBe(1);
      // The batch answers 200 with the item's problem.
      expect(staleAnswered).toContain('sequence_conflict');
      expect(abortedBy).toBeUndefined();
      expect(result?.outcome).toMatchObject({ state: 'succeeded' });
      expect(reasons(await historyOf(c, task.task_id))).not.toContain('lease_expired');
    } finally {
      await w.stop({ graceMs: 1_000 });
      await running;
      proxyServer.closeAllConnections();
      await new Promise<void>((resolve) => proxyServer.close(() => resolve()));
    }
  });

  it('slots whose shared poll request failed poll again together, in one request', async () => {
    const queue = 'r-outage-together';
    let refusing = true;
    const slotsPerPoll: number[] = [];
    const proxy = await startHttpProxy(suite.server.url, {
      refuse: (request) => refusing && request.path.startsWith('/v1/worker/acquire'),
      observe: (request) => {
        if (request.path.startsWith('/v1/worker/acquire:batch')) {
          slotsPerPoll.push(
            (JSON.parse(request.body.toString()) as { commands: unknown[] }).commands.length,
          );
        }
        return undefined;
      },
    });
    proxies.push(proxy);
    // A backoff wide enough that eight slots' own jittered delays (100–200 ms on the first
    // failure) would come due at eight different moments.
    const w = suite.worker(queue, {
      url: proxy.url,
      concurrency: 8,
      backoff: { baseMs: 200, maxMs: 400 },
    });
    w.register('p', () => 'ok');
    const running = w.run();
    await sleep(1_000);
    refusing = false;
    await until(() => slotsPerPoll.length > 0);
    // The first request after the outage carries every slot, as the failed ones did.
    expect(slotsPerPoll[0]).toBe(8);
    await w.stop({ graceMs: 0 });
    await running;
  });

  it('retries a refused settlement for as long as renewals keep the lease, past its first duration', async () => {
    // DESIGN §10: a settlement is retried until accepted or definitively rejected, and the
    // renewals go on meanwhile, so the report lands although it took longer than a lease.
    const c = client(suite.server.url);
    const queue = 'lk-settle-kept';
    const task = await c.submit({ queue, program: 'p', data: null });
    let refusing: string | null = null;
    let refused = 0;
    const proxy = await startHttpProxy(suite.server.url, {
      refuse: (request) => {
        if (!names(request, 'settle:batch', refusing)) return false;
        refused += 1;
        return true;
      },
    });
    proxies.push(proxy);
    const w = suite.worker(queue, { url: proxy.url });
    w.register('p', (_data, ctx) => {
      refusing = ctx.attemptId;
      return 'kept';
    });
    const running = w.run();
    await until(() => refused > 0, 30_000, 'a refused settlement');
    // Longer than the server's 1 s lease: only the renewals keep it.
    await sleep(1_500);
    refusing = null;
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'kept' });
    expect(result?.status.attempt_count).toBe(1);
    const accepted = perAttempt(await historyOf(c, task.task_id), 'report_accepted');
    expect([...accepted.values()]).toEqual([1]);
  });

  it('a session extension aborted by the drain re-arms no timer while a quiescence confirmation is still awaited', async () => {
    const c = client(suite.server.url);
    const queue = 'lk-extend-drain';
    await c.submit({ queue, program: 'deaf', data: null });
    let extending = false;
    let holdConfirmations = true;
    let confirming = false;
    const handlerEnded = deferred();
    const proxy = await startHttpProxy(suite.server.url, {
      hold: ({ path }) => {
        if (path.endsWith('/extend')) {
          extending = true;
          return new Promise<void>(() => {});
        }
        // The `unconfirmed` report is answered once the handler has ended, so its confirmation
        // goes out at once and is still awaited when the drain aborts the extension.
        if (path.startsWith('/v1/worker/settle:batch')) return handlerEnded.promise;
        if (path === '/v1/worker/quiescence' && holdConfirmations) {
          confirming = true;
          return new Promise<void>(() => {});
        }
        return undefined;
      },
    });
    proxies.push(proxy);
    const warnings: string[] = [];
    const w = suite.worker(queue, {
      url: proxy.url,
      sessionExtendIntervalMs: 300,
      requestTimeoutMs: 60_000,
      abortGraceMs: 100,
      logger: { ...silentLogger, warn: (message) => warnings.push(message) },
    });
    let started = false;
    w.register('deaf', async () => {
      started = true;
      // Deaf to its signal: reported `unconfirmed` at the shutdown, confirmed when it ends.
      await sleep(600);
      handlerEnded.resolve();
      return 'late';
    });
    const baseline = referencedTimers();
    const running = w.run();
    await until(() => started && extending, 30_000, 'the handler running and an extension held');
    await w.stop({ graceMs: 0 });
    const left = referencedTimers();
    holdConfirmations = false;
    await running;
    expect(confirming).toBe(true);
    // The one extension in flight, cut by the drain; none scheduled after it, and no timer of
    // the worker's left to keep the process alive.
    expect(warnings.filter((m) => m === 'extending the session failed')).toHaveLength(1);
    expect(left).toBeLessThanOrEqual(baseline);
  });
});

export { settled };
