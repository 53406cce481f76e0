/**
 * The worker SDK at the edges of its lifecycle, against the real server: a dispatch answered
 * after stop()'s grace, a lease lost through an outage, an attempt lost before its dispatch,
 * stop() with tasks at every phase, and a valid 1 MiB output of escapes (review r35e).
 */
import type { TaskAbortedError, Worker, WorkerOptions } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  attemptIds,
  client,
  historyOf,
  holdDispatchAnswers,
  perAttempt,
  reasons,
  Stack,
  settled,
  shortWorker,
  sleep,
  startHttpProxy,
  startProxy,
  until,
  watchUnhandledRejections,
} from './test/harness.js';

const log: string[] = [];
const line =
  (level: string) =>
  (message: string, fields?: object): void => {
    log.push(`${level} ${message} ${JSON.stringify(fields ?? {})} @${Date.now() % 100_000}`);
  };
const logger = {
  debug: line('debug'),
  info: line('info'),
  warn: line('warn'),
  error: line('error'),
};

const stack = new Stack('worker_handler_edges');
let server: ServerProcess;
let longLeases: ServerProcess;
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
  longLeases = await stack.start({ LEDGENCE_LEASE_DURATION_MS: '20000' });
});
afterEach(async (ctx) => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  if (process.env.WORKER_DEBUG && ctx.task.result?.state === 'fail') console.log(log.join('\n'));
  log.length = 0;
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

function worker(url: string, queue: string, options: Partial<WorkerOptions> = {}): Worker {
  const w = shortWorker(url, queue, { concurrency: 1, logger, shutdownGraceMs: 5_000, ...options });
  workers.push(w);
  return w;
}

describe('stop() and a dispatch answered after the grace', () => {
  it('hands the task back without running it, and the attempt counts (the dispatch was granted): max_attempts 1 ends failed', async () => {
    const c = client(longLeases.url);
    const queue = 'edges-late-dispatch-once';
    const task = await c.submit({
      queue,
      program: 'late',
      data: null,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    const {
      proxy,
      sent: dispatchSent,
      release: answerDispatch,
    } = await holdDispatchAnswers(longLeases.url);
    try {
      let started = false;
      const w = worker(proxy.url, queue, { abortGraceMs: 5_000 });
      w.register('late', () => {
        started = true;
        return 'ran';
      });
      const running = w.run();
      await until(dispatchSent);
      const stopping = w.stop({ graceMs: 0 });
      await until(() => log.some((l) => l.includes('shutdown grace period over')));
      answerDispatch();
      await stopping;
      await running;
      expect(started).toBe(false);
      const events = await historyOf(c, task.task_id);
      // The SDK's own words: "hand the task back" — the handler never ran.
      expect(log.some((l) => l.includes('handing the task back'))).toBe(true);
      // The server granted the dispatch, so the attempt counts (DESIGN §5; the SDK's README,
      // Shutdown): with max_attempts 1 the task ends failed, saying why, without having run.
      expect(reasons(events)).toContain('dispatch_authorized');
      const { outcome } = await c.result(task.task_id);
      expect(outcome).toMatchObject({
        state: 'failed',
        failure: {
          kind: 'execution',
          error: { kind: 'rejected', message: 'the worker is shutting down', retryable: true },
        },
      });
    } finally {
      await proxy.close();
    }
  });
});

describe('lease loss through an outage', () => {
  it('aborts with lease_lost, does not get the lost attempt accepted, retries as attempt 2, and logs what happened', async () => {
    const c = client(server.url);
    const queue = 'edges-outage';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    const proxy = await startProxy(server.url);
    try {
      const seen: { attempt: number; attemptId: string }[] = [];
      let reason: unknown;
      const w = worker(proxy.url, queue);
      w.register('p', async (_data, ctx) => {
        seen.push({ attempt: ctx.attempt, attemptId: ctx.attemptId });
        if (seen.length > 1) return 'second';
        proxy.setDown(true);
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
        reason = ctx.signal.reason;
        await until(async () => reasons(await historyOf(c, ctx.taskId)).includes('lease_expired'));
        proxy.setDown(false);
        throw ctx.signal.reason;
      });
      const running = w.run();
      const [result] = await settled(c, [task.task_id]);
      await w.stop();
      await running;
      expect((reason as TaskAbortedError).why).toBe('lease_lost');
      expect(result?.outcome).toEqual({ state: 'succeeded', output: 'second' });
      expect(seen.map((s) => s.attempt)).toEqual([1, 2]);
      const events = await historyOf(c, task.task_id);
      const [first, second] = attemptIds(events);
      expect(seen.map((s) => s.attemptId)).toEqual([first, second]);
      expect((await c.attempt(task.task_id, first as string)).state).toBe('lost');
      expect((await c.attempt(task.task_id, first as string)).settlement).toBeNull();
      const accepted = perAttempt(events, 'report_accepted');
      expect(accepted.get(first as string)).toBeUndefined();
      expect(accepted.get(second as string)).toBe(1);
      expect((await c.status(task.task_id)).attempt_count).toBe(2);
      // What the logs say.
      expect(
        log.some((l) => l.startsWith('warn lease lost ') && l.includes('"why":"expired"')),
      ).toBe(true);
      expect(
        log.some((l) => l.startsWith('warn settlement rejected') && l.includes('ownership_lost')),
      ).toBe(true);
    } finally {
      await proxy.close();
    }
  });

  it('an attempt lost before dispatch does not count: the handler then sees ctx.attempt 2 on a task of max_attempts 1', async () => {
    const c = client(server.url);
    const queue = 'edges-attempt-ordinal';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let refuseDispatch = true;
    const proxy = await startHttpProxy(server.url, {
      refuse: ({ path, body }) =>
        refuseDispatch &&
        path.startsWith('/v1/worker/renew') &&
        body.includes('"intent":"dispatch"'),
    });
    try {
      const attempts: number[] = [];
      const w = worker(proxy.url, queue);
      w.register('p', (_data, ctx) => {
        attempts.push(ctx.attempt);
        return ctx.attempt;
      });
      const running = w.run();
      await until(async () => reasons(await historyOf(c, task.task_id)).includes('lease_expired'));
      refuseDispatch = false;
      const [result] = await settled(c, [task.task_id]);
      await w.stop();
      await running;
      expect(result?.outcome).toEqual({ state: 'succeeded', output: 2 });
      // The handler's only run is numbered 2, above max_attempts 1 (ordinal of attempts created).
      expect(attempts).toEqual([2]);
      expect(log.some((l) => l.startsWith('warn lease lost before dispatch'))).toBe(true);
    } finally {
      await proxy.close();
    }
  });
});

describe('stop() with tasks at different phases', () => {
  it('every claimed task ends settled or handed back, once, and stop() resolves', async () => {
    const c = client(longLeases.url);
    const queue = 'edges-phases';
    const running1 = await c.submit({ queue, program: 'run', data: null });
    const settling = await c.submit({ queue, program: 'settle', data: null });
    // Its id is known before the worker runs; it is submitted once the other two run, so its
    // dispatch renewal goes alone (renewals asked in the same tick share one request).
    const undispatchedId = { task_id: '' };
    const undispatched = undispatchedId;
    let releaseDispatch!: () => void;
    const dispatchHeld = new Promise<void>((r) => {
      releaseDispatch = r;
    });
    let dispatchHeldSent = false;
    let settleRefusals = 0;
    const proxy = await startHttpProxy(longLeases.url, {
      refuse: ({ path, body }) => {
        const refuse = path.startsWith('/v1/worker/settle') && body.includes('SETTLE-ME');
        if (refuse) settleRefusals += 1;
        return refuse;
      },
      hold: ({ path, body }) => {
        if (
          path.startsWith('/v1/worker/renew') &&
          body.includes('"intent":"dispatch"') &&
          undispatched.task_id !== '' &&
          body.includes(undispatched.task_id)
        ) {
          dispatchHeldSent = true;
          return dispatchHeld;
        }
        return undefined;
      },
    });
    try {
      const started: string[] = [];
      let runAborted: unknown;
      const w = worker(proxy.url, queue, { concurrency: 3, abortGraceMs: 300 });
      w.register('run', async (_d, ctx) => {
        started.push('run');
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
        runAborted = ctx.signal.reason;
        throw ctx.signal.reason;
      });
      w.register('settle', () => {
        started.push('settle');
        return 'SETTLE-ME';
      });
      w.register('undispatched', () => {
        started.push('undispatched');
        return 'x';
      });
      const running = w.run();
      await until(() => started.includes('run') && settleRefusals >= 2, 20_000, 'two running');
      undispatchedId.task_id = (
        await c.submit({ queue, program: 'undispatched', data: null })
      ).task_id;
      const ids = [running1.task_id, settling.task_id, undispatchedId.task_id];
      await until(
        () => started.includes('run') && settleRefusals >= 2 && dispatchHeldSent,
        20_000,
        'phases reached',
      );
      const t0 = Date.now();
      const stopping = w.stop({ graceMs: 300 });
      await sleep(500);
      releaseDispatch();
      await stopping;
      await running;
      const took = Date.now() - t0;
      expect(w.inFlight).toBe(0);
      expect((runAborted as TaskAbortedError).why).toBe('shutdown');
      expect(started).not.toContain('undispatched');
      for (const id of ids) {
        const events = await historyOf(c, id);
        for (const n of perAttempt(events, 'report_accepted').values()) expect(n).toBe(1);
      }
      const states = await Promise.all(ids.map(async (id) => (await c.status(id)).state));
      // running: settled cancelled/retryable → queued; undispatched: handed back → queued;
      // settling: abandoned, its lease left to expire (20 s here) → still active.
      expect(states).toEqual(['queued', 'active', 'queued']);
      expect(took).toBeLessThan(10_000);
    } finally {
      releaseDispatch();
      await proxy.close();
    }
  });
});

describe('a valid 1 MiB output made of escapes', () => {
  it('a handler returning 1 MiB of newlines (plain JSON, within OUTPUT_MAX_BYTES) is settled as it returned', async () => {
    // Decoded in quadratic time, the settlement held the server's event loop ~4 s: these 1 s
    // leases expired meanwhile and the task ended lease_expired.
    const MAX = 1024 * 1024;
    const c = client(server.url);
    const queue = 'edges-newlines';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let returnedAt = 0;
    const w = worker(server.url, queue, { requestTimeoutMs: 30_000 });
    w.register('p', () => {
      returnedAt = Date.now();
      return '\n'.repeat((MAX - 2) / 2);
    });
    const running = w.run();
    await until(() => returnedAt > 0);
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: '\n'.repeat((MAX - 2) / 2) });
  });
});
