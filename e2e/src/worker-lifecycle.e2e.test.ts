/**
 * The Worker's lifecycle against a real server process and the real SDK (review r51c): stop()
 * while a dispatch answer and a replayed poll are both outstanding (no handler may start past
 * the grace), a server restarted on the same port and database while handlers are held, and a
 * handler that outlives stop().
 */
import type { Worker } from '@ledgence/worker';
import { afterEach, describe, expect, it } from 'vitest';
import {
  attemptIds,
  client,
  historyOf,
  portOf,
  sleep,
  startHttpProxy,
  until,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('worker_lifecycle_r51c', { LEDGENCE_LEASE_DURATION_MS: '20000' });

const log: string[] = [];
const line =
  (level: string) =>
  (message: string, fields?: object): void => {
    log.push(`${level} ${message} ${JSON.stringify(fields ?? {})}`);
  };
const logger = {
  debug: line('debug'),
  info: line('info'),
  warn: line('warn'),
  error: line('error'),
};
afterEach((ctx) => {
  if (process.env.WORKER_DEBUG && ctx.task.result?.state === 'fail') console.log(log.join('\n'));
  log.length = 0;
});

function gate() {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

describe('stop({ graceMs: 0 }) with a dispatch answer and a replayed poll both outstanding', () => {
  it('no handler starts after the deadline: a dispatch answered while the drain waits for the replay is handed back', async () => {
    const c = client(suite.server.url);
    const queue = 'late-dispatch-with-replay';
    const task = await c.submit({ queue, program: 'late', data: null });
    const dispatch = gate();
    const replay = gate();
    let dispatchSent = false;
    let replaySent = false;
    let parked = 0;
    const proxy = await startHttpProxy(suite.server.url, {
      observe({ path }) {
        if (!path.startsWith('/v1/worker/acquire') || !path.includes('wait_ms=')) return undefined;
        parked += 1;
        return () => {
          parked -= 1;
        };
      },
      hold({ path, body }) {
        if (path.startsWith('/v1/worker/renew') && body.includes('"intent":"dispatch"')) {
          dispatchSent = true;
          return dispatch.promise;
        }
        // A replay asks for no wait: its query leaves wait_ms out.
        if (path.startsWith('/v1/worker/acquire') && !path.includes('wait_ms=')) {
          replaySent = true;
          return replay.promise;
        }
        return undefined;
      },
    });
    suite.proxies.push(proxy);
    let started = false;
    const w = suite.worker(queue, {
      url: proxy.url,
      concurrency: 2,
      pollWaitMs: 5_000,
      requestTimeoutMs: 8_000,
      abortGraceMs: 2_000,
      logger,
    });
    w.register('late', () => {
      started = true;
      return 'ran';
    });
    const running = w.run();
    await until(() => dispatchSent, 10_000, 'dispatch sent');
    // The other slot's poll is parked at the server: stop() aborts it and the drain replays it.
    await until(() => parked > 0, 10_000, 'a parked poll');
    const stopping = w.stop({ graceMs: 0 });
    await until(() => replaySent, 10_000, 'the replay sent');
    // The grace (0) is over; the dispatch is answered now, while the drain waits for the replay.
    dispatch.open();
    await sleep(500);
    const startedWhileDraining = started;
    replay.open();
    await stopping;
    await running;
    expect(startedWhileDraining).toBe(false);
    expect(started).toBe(false);
    const [attemptId] = attemptIds(await historyOf(c, task.task_id));
    const attempt = await c.attempt(task.task_id, attemptId as string);
    expect(attempt.settlement?.command).toMatchObject({
      report: { kind: 'failed', report: { kind: 'rejected', retryable: true } },
    });
  }, 60_000);
});

describe('a server restarted on the same port and database while the worker runs', () => {
  it('tasks held across the restart settle once, each ran once, never more than concurrency at once, and the worker takes new work afterwards', async () => {
    const server = await suite.stack.start({ LEDGENCE_LEASE_DURATION_MS: '20000' });
    const port = portOf(server.url);
    const c = client(server.url);
    const queue = 'restart-same-db';
    const runs = new Map<string, number>();
    let active = 0;
    let maxActive = 0;
    const w: Worker = suite.worker(queue, {
      url: server.url,
      concurrency: 3,
      requestTimeoutMs: 2_000,
      logger,
    });
    let release = gate();
    w.register('hold', async (data) => {
      const id = (data as { i: number }).i;
      runs.set(String(id), (runs.get(String(id)) ?? 0) + 1);
      active += 1;
      maxActive = Math.max(maxActive, active);
      try {
        await release.promise;
        return { i: id };
      } finally {
        active -= 1;
      }
    });
    let failed: unknown;
    const running = w.run().catch((error: unknown) => {
      failed = error;
    });
    const first = await Promise.all(
      [0, 1, 2, 3].map((i) => c.submit({ queue, program: 'hold', data: { i } })),
    );
    await until(() => active === 3, 10_000, 'three handlers running');
    expect(await server.stop('SIGKILL')).toBeDefined();
    suite.stack.servers.splice(suite.stack.servers.indexOf(server), 1);
    await sleep(1_000);
    const again = await suite.stack.start({ LEDGENCE_LEASE_DURATION_MS: '20000', PORT: port });
    release.open();
    await until(() => runs.size === 4 && active === 0, 30_000, 'all four ran');
    release = gate();
    release.open();
    const c2 = client(again.url);
    const later = await Promise.all(
      [4, 5, 6].map((i) => c2.submit({ queue, program: 'hold', data: { i } })),
    );
    const ids = [...first, ...later].map((t) => t.task_id);
    for (const id of ids) {
      let r = await c2.result(id, { waitMs: 1_000 });
      const end = Date.now() + 30_000;
      while (r.outcome.state === 'pending' && Date.now() < end) {
        r = await c2.result(id, { waitMs: 1_000 });
      }
      expect(r.outcome.state).toBe('succeeded');
    }
    expect([...runs.values()].every((n) => n === 1)).toBe(true);
    expect(runs.size).toBe(7);
    expect(maxActive).toBeLessThanOrEqual(3);
    await w.stop({ graceMs: 1_000 });
    await running;
    expect(failed).toBeUndefined();
  }, 90_000);
});

describe('a handler that never settles and ignores its signal, at stop()', () => {
  it('stop() resolves after grace + abortGrace, reports it cancelled/unconfirmed, and confirms quiescence when it ends after stop() resolved', async () => {
    const c = client(suite.server.url);
    const queue = 'deaf-at-stop';
    const task = await c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 120_000,
      retry: { max_attempts: 3, delay_ms: 0 },
    });
    const end = gate();
    let began = false;
    let ended = false;
    const w = suite.worker(queue, { abortGraceMs: 200, logger });
    w.register('deaf', async () => {
      began = true;
      await end.promise;
      ended = true;
      return 'late';
    });
    const running = w.run();
    await until(() => began, 10_000, 'handler started');
    const t0 = performance.now();
    await w.stop({ graceMs: 300 });
    await running;
    const took = performance.now() - t0;
    expect(ended).toBe(false);
    expect(took).toBeLessThan(5_000);
    const [attemptId] = attemptIds(await historyOf(c, task.task_id));
    const attempt = await c.attempt(task.task_id, attemptId as string);
    expect(attempt.settlement?.command).toMatchObject({
      report: { kind: 'failed', report: { kind: 'cancelled', retryable: true } },
      quiescence: 'unconfirmed',
    });
    expect((await c.status(task.task_id)).state).toBe('active');
    // The handler ends while the process lives: its quiescence is confirmed, and the task is
    // queued again now, not at its authority deadline (120 s + cleanup grace).
    end.open();
    await until(
      async () => (await c.status(task.task_id)).state !== 'active',
      10_000,
      'task released by the confirmation',
    );
    expect((await c.status(task.task_id)).state).toBe('queued');
  }, 60_000);
});
