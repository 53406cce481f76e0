/**
 * Cancellation and result waits end to end — two server processes on one database, the real
 * worker SDK and client over real sockets: a wait on one replica woken by a cancel on the other,
 * a task cancelled before its dispatch never runs, and a handler that ignores its abort still
 * ends cancelled and frees its concurrency slot.
 */
import { Client, TaskAbortedError, type Worker, type WorkerOptions } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  attemptIds,
  client,
  type HttpProxy,
  historyOf,
  NAMESPACE,
  reasons,
  Stack,
  settled,
  shortWorker,
  sleep,
  startHttpProxy,
  TENANT,
  until,
} from './test/harness.js';

const stack = new Stack('cancel_e2e');
let a: ServerProcess;
let b: ServerProcess;
const workers: Worker[] = [];
const proxies: HttpProxy[] = [];

beforeAll(async () => {
  await stack.open();
  // Long rescans: a parked result wait can only end early through a wake hint.
  const env = { LEDGENCE_RESCAN_INTERVAL_MS: '60000', LEDGENCE_LONG_POLL_WAIT_MS: '20000' };
  [a, b] = await Promise.all([stack.start(env), stack.start(env)]);
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});
afterAll(() => stack.close());

function worker(url: string, queue: string, options: Partial<WorkerOptions> = {}): Worker {
  const w = shortWorker(url, queue, {
    requestTimeoutMs: 5_000,
    shutdownGraceMs: 5_000,
    ...options,
  });
  workers.push(w);
  return w;
}

describe('result waits across replicas', () => {
  it('a result wait parked on replica A is answered promptly when replica B cancels', async () => {
    const ca = client(a.url);
    const cb = client(b.url);
    const task = await cb.submit({ queue: 'x-wake', program: 'p', data: null });
    const started = Date.now();
    const waiting = ca.result(task.task_id, { waitMs: 20_000 });
    await sleep(500);
    expect(await cb.cancel(task.task_id)).toBe('cancelled');
    const result = await waiting;
    expect(result.outcome).toEqual({ state: 'cancelled' });
    expect(Date.now() - started).toBeLessThan(12_000);
  });

  it('a result wait answers pending with the current status when the wait ends', async () => {
    const ca = client(a.url);
    const task = await ca.submit({ queue: 'x-pending', program: 'p', data: null });
    const started = Date.now();
    const result = await ca.result(task.task_id, { waitMs: 1_500 });
    expect(result.outcome).toEqual({ state: 'pending' });
    expect(result.status.state).toBe('queued');
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_400);
  });
});

describe('the worker and cancellation', () => {
  it('a task cancelled before its dispatch is answered is settled cancelled without running the handler', async () => {
    const c = client(a.url);
    const queue = 'x-before-dispatch';
    const task = await c.submit({ queue, program: 'never', data: null });
    let releaseAcquire: () => void = () => {};
    const acquireHeld = new Promise<void>((resolve) => {
      releaseAcquire = resolve;
    });
    let acquireSeen = false;
    const proxy = await startHttpProxy(a.url, {
      hold: (request) => {
        if (request.path.startsWith('/v1/worker/acquire') && !acquireSeen) {
          acquireSeen = true;
          return acquireHeld;
        }
        return undefined;
      },
    });
    proxies.push(proxy);
    let ran = false;
    const w = worker(proxy.url, queue);
    w.register('never', () => {
      ran = true;
      return null;
    });
    const running = w.run();
    // The poll reached the server and claimed the task; its reply is held back.
    await until(async () => (await c.status(task.task_id)).state === 'active');
    expect(await c.cancel(task.task_id)).toBe('active');
    releaseAcquire();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(ran).toBe(false);
    expect(result?.outcome).toEqual({ state: 'cancelled' });
    const events = await historyOf(c, task.task_id);
    expect(reasons(events)).toContain('report_accepted');
    expect(reasons(events)).not.toContain('dispatch_authorized');
    expect(reasons(events)).not.toContain('lease_expired');
    const [attemptId] = attemptIds(events);
    expect((await c.attempt(task.task_id, attemptId as string)).state).toBe('cancelled');
  });

  it('a handler that ignores the abort and returns is still cancelled, and frees its concurrency slot', async () => {
    const c = client(a.url);
    const queue = 'x-ignore';
    const first = await c.submit({
      queue,
      program: 'stubborn',
      data: 1,
      concurrency_key: 'k',
      concurrency_limit: 1,
    });
    const second = await c.submit({
      queue,
      program: 'stubborn',
      data: 2,
      concurrency_key: 'k',
      concurrency_limit: 1,
    });
    let reason: unknown;
    let started = 0;
    const w = worker(a.url, queue, { concurrency: 2 });
    w.register('stubborn', async (data, ctx) => {
      started += 1;
      if (data === 1) {
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
        reason = ctx.signal.reason;
        return { ignored: true };
      }
      return { second: true };
    });
    const running = w.run();
    await until(() => started === 1);
    await sleep(300);
    expect(started).toBe(1);
    // Cancel through the other replica.
    expect(await client(b.url).cancel(first.task_id)).toBe('active');
    const [r1, r2] = await settled(c, [first.task_id, second.task_id]);
    await w.stop();
    await running;
    expect(r1?.outcome).toEqual({ state: 'cancelled' });
    expect(r2?.outcome).toEqual({ state: 'succeeded', output: { second: true } });
    expect(reason).toBeInstanceOf(TaskAbortedError);
    expect((reason as TaskAbortedError).why).toBe('cancelled');
  });

  it('cancel via a Client without a worker: repeated cancels answer the same state', async () => {
    const c = new Client({ url: b.url, tenant: TENANT, namespace: NAMESPACE });
    const task = await c.submit({ queue: 'x-repeat', program: 'p', data: null });
    const replies = await Promise.all([c.cancel(task.task_id), c.cancel(task.task_id)]);
    expect(replies).toEqual(['cancelled', 'cancelled']);
    expect(await c.cancel(task.task_id)).toBe('cancelled');
  });
});
