/**
 * A Worker with default options against servers configured away from the defaults
 * (LEDGENCE_LONG_POLL_WAIT_MS, LEDGENCE_LEASE_DURATION_MS, LEDGENCE_SESSION_VALIDITY_MS,
 * LEDGENCE_CLEANUP_GRACE_MS). Real server process, real PostgreSQL, real sockets.
 */
import { Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  attemptIds,
  client,
  historyOf,
  NAMESPACE,
  reasons,
  Stack,
  settled,
  sleep,
  startHttpProxy,
  TENANT,
  watchUnhandledRejections,
} from './test/harness.js';

const log: string[] = [];
const line =
  (level: string) =>
  (message: string, fields?: object): void => {
    log.push(`${Date.now() % 100_000} ${level} ${message} ${JSON.stringify(fields ?? {})}`);
  };
const logger = {
  debug: line('debug'),
  info: line('info'),
  warn: line('warn'),
  error: line('error'),
};

const stack = new Stack('worker_config');
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];

beforeAll(async () => {
  await stack.open();
});
afterEach(async (ctx) => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  if (ctx.task.result?.state === 'fail') console.log(log.slice(-80).join('\n'));
  log.length = 0;
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

/** A worker with the SDK's defaults: only what it must be told. */
function defaultWorker(url: string, queue: string, concurrency = 1): Worker {
  const w = new Worker({ url, tenant: TENANT, namespace: NAMESPACE, queue, concurrency, logger });
  workers.push(w);
  return w;
}

describe('default Worker vs. a server with LEDGENCE_LONG_POLL_WAIT_MS=0', () => {
  it('does not busy-loop acquire requests while the queue is empty', async () => {
    const server = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '0' });
    let acquires = 0;
    const proxy = await startHttpProxy(server.url, {
      observe: ({ path }) => {
        if (path.startsWith('/v1/worker/acquire')) acquires += 1;
        return undefined;
      },
    });
    try {
      const w = defaultWorker(proxy.url, 'idle-zero-wait');
      w.register('p', () => null);
      const running = w.run();
      await sleep(1_000); // session open, first polls
      const before = acquires;
      await sleep(2_000);
      const during = acquires - before;
      await w.stop();
      await running;
      // An idle worker with one slot: the SDK's own wait is 20 s; a server that parks 0 ms must
      // not turn that into a request per round trip. 2 s at one per 100 ms would be 20.
      console.log(`acquire requests in 2 s of an idle queue: ${during}`);
      expect(during).toBeLessThanOrEqual(20);
    } finally {
      await proxy.close();
      await server.stop('SIGKILL');
    }
  });
});

// 1 s leases, ten times shorter than the worker's renew period: its due timer (half the lease
// left) must renew them, and keep doing so while a loaded machine slows round trips.
describe('default Worker vs. a server with 1 s leases and 20 s long polls', () => {
  it('keeps the lease of a 3 s handler claimed at the end of a long park', async () => {
    const server = await stack.start({
      LEDGENCE_LEASE_DURATION_MS: '1000',
      LEDGENCE_RENEW_INTERVAL_MS: '300',
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
    });
    try {
      const c = client(server.url);
      const queue = 'short-lease';
      const w = defaultWorker(server.url, queue);
      let aborted = 0;
      w.register('slow', async (_data, ctx) => {
        await sleep(3_000);
        if (ctx.signal.aborted) aborted += 1;
        return 'done';
      });
      const running = w.run();
      await sleep(3_000); // the worker's poll is parked
      const task = await c.submit({
        queue,
        program: 'slow',
        data: null,
        retry: { max_attempts: 1, delay_ms: 0 },
      });
      const [result] = await settled(c, [task.task_id], 30_000);
      await w.stop();
      await running;
      const history = await historyOf(c, task.task_id);
      expect(aborted).toBe(0);
      expect(attemptIds(history)).toHaveLength(1);
      expect(result?.outcome.state).toBe('succeeded');
    } finally {
      await server.stop('SIGKILL');
    }
  });
});

describe('default Worker vs. a server with 1 s sessions', () => {
  it('runs every task once, with one attempt, across many session expiries', async () => {
    const server = await stack.start({
      LEDGENCE_SESSION_VALIDITY_MS: '1000',
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_LEASE_DURATION_MS: '3000',
      LEDGENCE_RENEW_INTERVAL_MS: '1000',
    });
    let sessions = 0;
    const proxy = await startHttpProxy(server.url, {
      observe: ({ path }) => {
        if (path === '/v1/worker/sessions') sessions += 1;
        return undefined;
      },
    });
    try {
      const c = client(server.url);
      const queue = 'short-sessions';
      const w = defaultWorker(proxy.url, queue, 3);
      const runs = new Map<string, number>();
      const startDelay: number[] = [];
      const submittedAt = new Map<string, number>();
      w.register('t', async (_data, ctx) => {
        runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1);
        startDelay.push(Date.now() - (submittedAt.get(ctx.taskId) ?? Date.now()));
        await sleep(1_500);
        return ctx.taskId;
      });
      const running = w.run();
      const ids: string[] = [];
      for (let i = 0; i < 8; i += 1) {
        await sleep(700);
        const t = await c.submit({
          queue,
          program: 't',
          data: i,
          retry: { max_attempts: 1, delay_ms: 0 },
        });
        submittedAt.set(t.task_id, Date.now());
        ids.push(t.task_id);
      }
      const results = await settled(c, ids, 60_000);
      await w.stop();
      await running;
      console.log(`sessions opened: ${sessions}; start delays: ${startDelay.join(',')}`);
      for (const id of ids) {
        const history = await historyOf(c, id);
        expect(
          attemptIds(history),
          `attempts of ${id}: ${reasons(history).join(',')}`,
        ).toHaveLength(1);
        expect(runs.get(id)).toBe(1);
      }
      expect(results.map((r) => r.outcome.state)).toEqual(Array(ids.length).fill('succeeded'));
      expect(Math.max(...startDelay)).toBeLessThan(5_000);
    } finally {
      await proxy.close();
      await server.stop('SIGKILL');
    }
  });
});
