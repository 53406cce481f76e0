/**
 * The worker SDK's runtime against the real server: a server process on a
 * real PostgreSQL with short lease timings, driven by real `Worker`s and a
 * `Client` over real sockets. Every assertion reads the server's record
 * (results, statuses, attempts, history) through the public API.
 */
import {
  ApplicationError,
  Client,
  ProblemError,
  type StandardSchemaV1,
  TaskAbortedError,
  Worker,
  type WorkerOptions,
} from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  attemptIds,
  client,
  historyOf,
  holdDispatchAnswers,
  idsOf,
  NAMESPACE,
  perAttempt,
  RENEW_MS,
  reasons,
  Stack,
  settled,
  shortWorker,
  sleep,
  startHttpProxy,
  startProxy,
  type TcpProxy,
  TENANT,
  until,
  watchUnhandledRejections,
} from './test/harness.js';

// WORKER_DEBUG=1 prints the workers' log lines of a failing test.
const debugLog: string[] = [];
const line =
  (level: string) =>
  (message: string, fields?: object): void => {
    debugLog.push(`${Date.now() % 100_000} ${level} ${message} ${JSON.stringify(fields ?? {})}`);
  };
const logger = {
  debug: line('debug'),
  info: line('info'),
  warn: line('warn'),
  error: line('error'),
};

const stack = new Stack('worker_e2e');
let server: ServerProcess;
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterEach(async (ctx) => {
  // A test that failed midway must not leave a worker polling the next test's queues.
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  if (process.env.WORKER_DEBUG && ctx.task.result?.state === 'fail') {
    console.log(debugLog.join('\n'));
  }
  debugLog.length = 0;
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

/** The worker session the first attempt of a task ran under. */
async function sessionOf(c: Client, taskId: string): Promise<string> {
  const [attemptId] = attemptIds(await historyOf(c, taskId));
  return (await c.attempt(taskId, attemptId as string)).lease.owner.worker_session_id;
}

function worker(queue: string, options: Partial<WorkerOptions> = {}): Worker {
  const w = shortWorker(server.url, queue, {
    concurrency: 4,
    logger,
    shutdownGraceMs: 5_000,
    ...options,
  });
  workers.push(w);
  return w;
}

/** A hand-written Standard Schema (the interface valibot, zod and arktype implement). */
const numberBox: StandardSchemaV1<unknown, { n: number }> = {
  '~standard': {
    version: 1,
    vendor: 'ledgence-e2e',
    validate(value) {
      const n = (value as { n?: unknown } | null)?.n;
      if (typeof n === 'number') return { value: { n } };
      return { issues: [{ message: 'expected a number', path: ['n'] }] };
    },
  },
};

describe('Worker against the real server', () => {
  it('runs handlers by program name and settles outputs, application errors and crashes', async () => {
    const c = client(server.url);
    const queue = 'outcomes';
    const once = { max_attempts: 1, delay_ms: 0 };
    const ok = await c.submit({ queue, program: 'echo', data: { n: 1 } });
    const app = await c.submit({ queue, program: 'app', data: null, retry: once });
    const crash = await c.submit({ queue, program: 'crash', data: null, retry: once });
    const w = worker(queue);
    w.register('echo', (data, ctx) => ({ data, attempt: ctx.attempt, task: ctx.taskId }));
    w.register('app', () => {
      throw new ApplicationError('bad', 'bad thing', { retryable: false, details: { x: 1 } });
    });
    w.register('crash', () => {
      throw new Error('boom');
    });
    const running = w.run();
    const results = await settled(c, [ok.task_id, app.task_id, crash.task_id]);
    await w.stop();
    await running;
    expect(results[0]?.outcome).toEqual({
      state: 'succeeded',
      output: { data: { n: 1 }, attempt: 1, task: ok.task_id },
    });
    expect(results[1]?.outcome).toEqual({
      state: 'failed',
      failure: {
        kind: 'application',
        error: { code: 'bad', message: 'bad thing', retryable: false, details: { x: 1 } },
      },
    });
    expect(results[2]?.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'crashed', message: 'boom', retryable: true } },
    });
    expect(reasons(await historyOf(c, ok.task_id))).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'succeeded',
    ]);
  });

  it('settles a throw of a value with no text as a retryable crash, not leaving it to lease expiry', async () => {
    const c = client(server.url);
    const queue = 'textless-throw';
    const task = await c.submit({
      queue,
      program: 'odd',
      data: null,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    const w = worker(queue, { concurrency: 1 });
    w.register('odd', () => {
      // No prototype: String() of it throws.
      throw Object.assign(Object.create(null), { reason: 'odd' });
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(reasons(await historyOf(c, task.task_id))).toContain('report_accepted');
    expect(result?.outcome).toEqual({
      state: 'failed',
      failure: {
        kind: 'execution',
        error: {
          kind: 'crashed',
          message: 'the handler threw a value that cannot be turned into text',
          retryable: true,
        },
      },
    });
  });

  it('retries a crash whose long message is cut between characters, never inside one', async () => {
    const c = client(server.url);
    const queue = 'long-message';
    const task = await c.submit({
      queue,
      program: 'flaky',
      data: null,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    const emoji = '\u{1F600}';
    const w = worker(queue, { concurrency: 1 });
    w.register('flaky', (_data, ctx) => {
      // A long error text (an upstream reply, say) of two UTF-16 units per character.
      if (ctx.attempt === 1) throw new Error(`!${emoji.repeat(2_000)}`);
      return 'second attempt';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'second attempt' });
    const [first] = attemptIds(await historyOf(c, task.task_id));
    const attempt = await c.attempt(task.task_id, first as string);
    // Cut to the server's 4 KiB message limit: one byte, 1 023 emoji of four, the ellipsis.
    expect(attempt.settlement?.command.report).toEqual({
      kind: 'failed',
      report: { kind: 'crashed', message: `!${emoji.repeat(1_023)}…`, retryable: true },
    });
  });

  it('validates data with a Standard Schema: invalid data fails as invalid_data, not retried', async () => {
    const c = client(server.url);
    const queue = 'typed';
    const bad = await c.submit({ queue, program: 'typed', data: { n: 'x' } });
    const good = await c.submit({ queue, program: 'typed', data: { n: 41 } });
    let got: number | undefined;
    const w = worker(queue);
    w.register(
      'typed',
      (data) => {
        got = data.n;
        return data.n + 1;
      },
      { schema: numberBox },
    );
    const running = w.run();
    const [badResult, goodResult] = await settled(c, [bad.task_id, good.task_id]);
    await w.stop();
    await running;
    expect(badResult?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'application', error: { code: 'invalid_data', retryable: false } },
    });
    expect(badResult?.status.attempt_count).toBe(1);
    expect(goodResult?.outcome).toEqual({ state: 'succeeded', output: 42 });
    expect(got).toBe(41);
  });

  it('settles invalid data as invalid_data even when an issue message must be cut inside an emoji', async () => {
    const c = client(server.url);
    const queue = 'typed-long';
    const task = await c.submit({ queue, program: 'typed', data: { n: 'x' } });
    // 500 UTF-16 units end between the two halves of the 250th emoji: a naive cut sends a lone
    // surrogate, which the server refuses as JSON, and the report would never land as invalid_data.
    const longMessage = `!${'\u{1F600}'.repeat(400)}`;
    const verbose: StandardSchemaV1<unknown, { n: number }> = {
      '~standard': {
        version: 1,
        vendor: 'ledgence-e2e',
        validate: () => ({ issues: [{ message: longMessage, path: ['n'] }] }),
      },
    };
    const w = worker(queue);
    w.register('typed', (data) => data.n, { schema: verbose });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'application', error: { code: 'invalid_data', retryable: false } },
    });
    expect(result?.status.attempt_count).toBe(1);
    const outcome = result?.outcome as unknown as {
      failure: { error: { details: { issues: { message: string }[] } } };
    };
    const [issue] = outcome.failure.error.details.issues;
    // No lone surrogate half (with the `u` flag a whole pair is one code point, never matched).
    expect(/\p{Cs}/u.test(issue?.message ?? '')).toBe(false);
    expect(longMessage.startsWith((issue?.message ?? '').replace(/…$/, ''))).toBe(true);
  });

  it('counts an unknown program against the retry budget', async () => {
    const c = client(server.url);
    const queue = 'unknown';
    const task = await c.submit({
      queue,
      program: 'nobody-knows',
      data: null,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    const w = worker(queue);
    w.register('known', () => null);
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'rejected', retryable: true } },
    });
    expect(result?.status.attempt_count).toBe(2);
  });

  it('aborts ctx.signal on cancellation at the next renewal and settles the task cancelled', async () => {
    const c = client(server.url);
    const queue = 'cancel';
    const task = await c.submit({ queue, program: 'wait', data: null });
    let started = false;
    let abortedAt = 0;
    let reason: unknown;
    const w = worker(queue);
    w.register('wait', async (_data, ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      abortedAt = Date.now();
      reason = ctx.signal.reason;
      throw ctx.signal.reason;
    });
    const running = w.run();
    await until(() => started);
    const cancelledAt = Date.now();
    expect(await c.cancel(task.task_id)).toBe('active');
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'cancelled' });
    expect(reason).toBeInstanceOf(TaskAbortedError);
    expect((reason as TaskAbortedError).why).toBe('cancelled');
    // The worker learnt of the cancel from a renewal and settled while it held
    // the lease (1 s): the attempt was reported, not recovered by expiry.
    const events = await historyOf(c, task.task_id);
    expect(reasons(events)).toContain('report_accepted');
    expect(reasons(events)).not.toContain('lease_expired');
    const [attemptId] = attemptIds(events);
    const attempt = await c.attempt(task.task_id, attemptId as string);
    expect(attempt.state).toBe('cancelled');
    console.log(
      `cancellation seen by the handler ${abortedAt - cancelledAt} ms after the cancel (renew interval ${RENEW_MS} ms)`,
    );
  });

  it('ctx.heartbeat() renews the lease at once', async () => {
    const c = client(server.url);
    const queue = 'heartbeat';
    const task = await c.submit({ queue, program: 'beat', data: null });
    const sequences: (number | undefined)[] = [];
    // No periodic heartbeat within the handler's run: only ctx.heartbeat() renews.
    const w = worker(queue, { renewIntervalMs: 60_000 });
    w.register('beat', async (_data, ctx) => {
      const renewed = async () =>
        (await c.attempt(ctx.taskId, ctx.attemptId)).last_renewal?.sequence;
      sequences.push(await renewed());
      await ctx.heartbeat();
      sequences.push(await renewed());
      await ctx.heartbeat();
      sequences.push(await renewed());
      return null;
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome.state).toBe('succeeded');
    // Sequence 1 is the dispatch renewal; each heartbeat resolves only once a
    // later renewal was answered (a lease-driven early renewal may also fall
    // in between on a slow machine, so the claim is "advanced", not "+1").
    expect(sequences[0]).toBe(1);
    expect(sequences[1]).toBeGreaterThan(sequences[0] as number);
    expect(sequences[2]).toBeGreaterThan(sequences[1] as number);
  });

  it('keeps a lease shorter than its heartbeat period alive', async () => {
    const c = client(server.url);
    const queue = 'short-lease';
    const task = await c.submit({ queue, program: 'long', data: null });
    // The default heartbeat period (10 s) is far longer than this server's
    // 1 s lease: the SDK must renew by the lease the server grants.
    const w = worker(queue, { renewIntervalMs: undefined });
    let aborted = false;
    w.register('long', async (_data, ctx) => {
      await sleep(2_500);
      aborted = ctx.signal.aborted;
      return 'held';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(aborted).toBe(false);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'held' });
    expect(result?.status.attempt_count).toBe(1);
    expect(reasons(await historyOf(c, task.task_id))).not.toContain('lease_expired');
  });

  it('aborts the handler on lease loss, and its late settlement is refused', async () => {
    const c = client(server.url);
    const queue = 'lease-loss';
    const task = await c.submit({ queue, program: 'slow', data: null });
    const proxy: TcpProxy = await startProxy(server.url);
    try {
      let reason: unknown;
      let runs = 0;
      const w = worker(queue, { url: proxy.url, concurrency: 1 });
      w.register('slow', async (_data, ctx) => {
        runs += 1;
        if (runs > 1) return 'second attempt';
        // The network to the server fails from now on: no renewal gets through.
        proxy.setDown(true);
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
        reason = ctx.signal.reason;
        // Returns after the server expired the lease (recovery every 100 ms).
        await until(async () => reasons(await historyOf(c, ctx.taskId)).includes('lease_expired'));
        proxy.setDown(false);
        return 'late';
      });
      const running = w.run();
      const [result] = await settled(c, [task.task_id]);
      await w.stop();
      await running;
      expect((reason as TaskAbortedError).why).toBe('lease_lost');
      expect(result?.outcome).toEqual({ state: 'succeeded', output: 'second attempt' });
      const events = await historyOf(c, task.task_id);
      const [first, second] = attemptIds(events);
      expect((await c.attempt(task.task_id, first as string)).state).toBe('lost');
      expect((await c.attempt(task.task_id, first as string)).settlement).toBeNull();
      const accepted = perAttempt(events, 'report_accepted');
      expect(accepted.get(first as string)).toBeUndefined();
      expect(accepted.get(second as string)).toBe(1);
    } finally {
      await proxy.close();
    }
  });

  it('resyncs on a new session after a sequence conflict', async () => {
    const c = client(server.url);
    const queue = 'resync';
    const w = worker(queue, { concurrency: 1, pollWaitMs: 300 });
    let runs = 0;
    w.register('job', () => {
      runs += 1;
      return null;
    });
    const running = w.run();
    const first = await c.submit({ queue, program: 'job', data: null });
    await settled(c, [first.task_id]);
    const session = await sessionOf(c, first.task_id);
    // Another client polls the worker's own slot (same session, consumer 0) and
    // moves its cursor far ahead: the worker's next poll is a sequence gap.
    let advanced = 0;
    for (let sequence = 1; sequence <= 60; sequence++) {
      const response = await fetch(`${server.url}/v1/worker/acquire?wait_ms=0`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          scope: { tenant_id: TENANT, namespace: NAMESPACE },
          queue,
          worker_session_id: session,
          consumer_id: 0,
          sequence,
        }),
      });
      if (response.status === 200) advanced += 1;
      await response.body?.cancel();
    }
    expect(advanced).toBeGreaterThan(10);
    const second = await c.submit({ queue, program: 'job', data: null });
    const [result] = await settled(c, [second.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome.state).toBe('succeeded');
    expect(runs).toBe(2);
    expect(await sessionOf(c, second.task_id)).not.toBe(session);
    expect(debugLog.some((l) => l.includes('slot cursor lost; moving to a new session'))).toBe(
      true,
    );
  });

  it('splits the polls of a worker of 256 slots into lanes of 64, and runs every task once', async () => {
    const c = client(server.url);
    const queue = 'lanes';
    const ids = idsOf(
      await c.submitBatch(
        Array.from({ length: 600 }, (_, i) => ({ queue, program: 'lane', data: { i } })),
      ),
    );
    // Every acquire request the SDK's default exchange sent, as it reached a forwarding proxy
    // in front of the server: how many polls it carried and how many acquire requests were out
    // at that moment.
    const polls: { size: number; outstanding: number }[] = [];
    let outstanding = 0;
    // The first wave's replies are held until its fourth request arrives (or 5 s pass, for the
    // assertions to name a missing request): with 600 tasks ready, the server's first answer
    // would otherwise free its lane to poll again before a loaded machine sent the fourth.
    let releaseFirstWave = () => {};
    const firstWave = new Promise<void>((resolve) => {
      releaseFirstWave = resolve;
      setTimeout(resolve, 5_000).unref();
    });
    const proxy = await startHttpProxy(server.url, {
      hold: ({ path }) =>
        path.startsWith('/v1/worker/acquire:batch') && polls.length <= 4 ? firstWave : undefined,
      observe({ path, body }) {
        if (!path.startsWith('/v1/worker/acquire:batch')) return undefined;
        outstanding += 1;
        polls.push({
          size: (JSON.parse(body.toString()) as { commands: unknown[] }).commands.length,
          outstanding,
        });
        if (polls.length === 4) releaseFirstWave();
        return () => {
          outstanding -= 1;
        };
      },
    });
    const w = worker(queue, { concurrency: 256, url: proxy.url });
    const runs = new Map<string, number>();
    w.register('lane', async (data: unknown, ctx) => {
      runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1);
      return data;
    });
    const running = w.run();
    const results = await settled(c, ids);
    await w.stop();
    await running;
    await proxy.close();
    results.forEach((result, i) => {
      expect(result.outcome).toEqual({ state: 'succeeded', output: { i } });
    });
    expect(runs.size).toBe(600);
    expect([...runs.values()].every((n) => n === 1)).toBe(true);
    // The first wave: 256 idle slots as four requests of 64, all four out at once.
    expect(polls.slice(0, 4).map((p) => p.size)).toEqual([64, 64, 64, 64]);
    expect(polls[3]?.outstanding).toBe(4);
    expect(Math.max(...polls.map((p) => p.size))).toBeLessThanOrEqual(64);
  });

  it('stop() drains in-flight tasks and takes no new ones', async () => {
    const c = client(server.url);
    const queue = 'drain';
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      ids.push((await c.submit({ queue, program: 'slow', data: i })).task_id);
    }
    let started = 0;
    const w = worker(queue, { concurrency: 2 });
    w.register('slow', async () => {
      started += 1;
      await sleep(300);
      return 'ok';
    });
    const running = w.run();
    await until(() => started === 2);
    await w.stop({ graceMs: 5_000 });
    await running;
    const states = (await Promise.all(ids.map((id) => c.status(id)))).map((s) => s.state).sort();
    expect(states).toEqual(['queued', 'queued', 'succeeded', 'succeeded']);
    expect(started).toBe(2);
    expect(w.inFlight).toBe(0);
  });

  it('stop() aborts handlers past the grace period and reports them retryable', async () => {
    const c = client(server.url);
    const queue = 'grace';
    const task = await c.submit({ queue, program: 'stuck', data: null });
    let started = false;
    let reason: unknown;
    const w = worker(queue, { abortGraceMs: 1_000 });
    w.register('stuck', async (_data, ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      reason = ctx.signal.reason;
      throw new Error('interrupted');
    });
    const running = w.run();
    await until(() => started);
    await w.stop({ graceMs: 50 });
    await running;
    expect((reason as TaskAbortedError).why).toBe('shutdown');
    const events = await historyOf(c, task.task_id);
    expect(reasons(events)).toContain('retry_scheduled');
    expect((await c.status(task.task_id)).state).toBe('queued');
    const [attemptId] = attemptIds(events);
    const attempt = await c.attempt(task.task_id, attemptId as string);
    expect(attempt.settlement?.command.report).toMatchObject({
      kind: 'failed',
      report: { kind: 'cancelled', retryable: true },
    });
  });

  it('stop() resolves while the server is unreachable, leaving the task to lease expiry', async () => {
    const c = client(server.url);
    const queue = 'unreachable';
    const task = await c.submit({ queue, program: 'cut', data: null });
    const proxy = await startProxy(server.url);
    try {
      let finished = false;
      const w = worker(queue, { url: proxy.url, abortGraceMs: 100 });
      w.register('cut', async () => {
        // The network fails while the handler runs: its settlement cannot be sent.
        proxy.setDown(true);
        await sleep(100);
        finished = true;
        return 'unsent';
      });
      const running = w.run();
      await until(() => finished);
      await w.stop({ graceMs: 300 });
      await running;
      expect(w.inFlight).toBe(0);
      // The server never heard of the outcome: recovery re-queues the attempt.
      await until(async () => reasons(await historyOf(c, task.task_id)).includes('lease_expired'));
      const events = await historyOf(c, task.task_id);
      expect(reasons(events)).not.toContain('report_accepted');
      expect((await c.status(task.task_id)).state).toBe('queued');
    } finally {
      await proxy.close();
    }
  });

  it('reports a handler still running after the abort grace as unconfirmed, then confirms quiescence', async () => {
    const c = client(server.url);
    const queue = 'deaf';
    const task = await c.submit({ queue, program: 'deaf', data: null });
    let started = false;
    let finished = false;
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const w = worker(queue, { abortGraceMs: 50 });
    // Ignores its signal and runs until the test releases it.
    w.register('deaf', async () => {
      started = true;
      await released;
      finished = true;
    });
    const running = w.run();
    await until(() => started);
    await w.stop({ graceMs: 20 });
    await running;
    // Reported, but the task stays active while the code may still run.
    expect(finished).toBe(false);
    const events = await historyOf(c, task.task_id);
    expect(reasons(events)).toContain('report_accepted');
    expect((await c.status(task.task_id)).state).toBe('active');
    const [attemptId] = attemptIds(events);
    expect((await c.attempt(task.task_id, attemptId as string)).quiescence).toBe('unconfirmed');
    // Once the handler ends, the (stopped) worker still confirms quiescence.
    release();
    await until(async () =>
      reasons(await historyOf(c, task.task_id)).includes('cleanup_confirmed'),
    );
    expect(finished).toBe(true);
    expect((await c.status(task.task_id)).state).toBe('queued');
  });

  it('retries a quiescence confirmation the server could not take, so the task is released then, not at its deadline', async () => {
    const c = client(server.url);
    const queue = 'deaf-retry';
    const task = await c.submit({ queue, program: 'deaf', data: null });
    let refused = 0;
    const proxy = await startHttpProxy(server.url, {
      // The first confirmation never reaches the server (503, as from an overloaded server).
      refuse: (request) => request.path === '/v1/worker/quiescence' && refused++ === 0,
    });
    try {
      let started = false;
      let release = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      const w = worker(queue, { url: proxy.url, abortGraceMs: 50 });
      w.register('deaf', async () => {
        started = true;
        await released;
      });
      const running = w.run();
      await until(() => started);
      await w.stop({ graceMs: 20 });
      await running;
      expect((await c.status(task.task_id)).state).toBe('active');
      release();
      await until(async () =>
        reasons(await historyOf(c, task.task_id)).includes('cleanup_confirmed'),
      );
      expect(refused).toBe(2);
      expect((await c.status(task.task_id)).state).toBe('queued');
    } finally {
      await proxy.close();
    }
  });

  it.each([7, 11, 23, 42])(
    'loses no task and settles none twice when 30 percent of exchanges drop (seed %i)',
    async (seed) => {
      const c = client(server.url);
      const queue = `faults-${seed}`;
      const proxy = await startProxy(server.url, 0.3, seed);
      try {
        const ids = idsOf(
          await c.submitBatch(
            Array.from({ length: 60 }, (_, i) => ({ queue, program: 'inc', data: { i } })),
          ),
        );
        const runs = new Map<string, number>();
        const w = worker(queue, { url: proxy.url, concurrency: 6 });
        w.register('inc', (data: unknown, ctx) => {
          runs.set(ctx.attemptId, (runs.get(ctx.attemptId) ?? 0) + 1);
          return data;
        });
        const running = w.run();
        const results = await settled(c, ids, 120_000);
        await w.stop();
        await running;
        expect(proxy.drops()).toBeGreaterThan(10);
        results.forEach((result, i) => {
          expect(result.outcome).toEqual({ state: 'succeeded', output: { i } });
        });
        // A lost reply replays the same assignment, so a handler runs once per
        // attempt; an attempt is only repeated when its lease expired.
        expect([...runs.values()].every((n) => n === 1)).toBe(true);
        const claimed = new Set<string>();
        for (const id of ids) {
          const events = await historyOf(c, id);
          for (const count of perAttempt(events, 'report_accepted').values()) {
            expect(count).toBe(1);
          }
          for (const attempt of attemptIds(events)) claimed.add(attempt);
        }
        // User code ran only for attempts the server recorded as claimed.
        expect([...runs.keys()].every((attempt) => claimed.has(attempt))).toBe(true);
        expect(debugLog.filter((l) => l.includes('slot cursor lost'))).toEqual([]);
      } finally {
        await proxy.close();
      }
    },
  );

  it('loses no settlement and duplicates none through a proxy that drops connections', async () => {
    const c = client(server.url);
    const queue = 'flaky';
    const proxy = await startProxy(server.url, 0.15, 1234);
    try {
      const ids = idsOf(
        await c.submitBatch(
          Array.from({ length: 200 }, (_, i) => ({ queue, program: 'work', data: { i } })),
        ),
      );
      const runs = new Map<string, number>();
      const pair = [1, 2].map(() => worker(queue, { url: proxy.url, concurrency: 6 }));
      for (const w of pair) {
        w.register('work', async (data: unknown, ctx) => {
          runs.set(ctx.attemptId, (runs.get(ctx.attemptId) ?? 0) + 1);
          await sleep(5);
          return data;
        });
      }
      const running = pair.map((w) => w.run());
      const results = await settled(c, ids, 120_000);
      await Promise.all(pair.map((w) => w.stop()));
      await Promise.all(running);
      expect(proxy.drops()).toBeGreaterThan(5);
      // Every task succeeded with its own output; user code ran at most once
      // per attempt; every attempt has at most one accepted settlement.
      results.forEach((result, i) => {
        expect(result.outcome).toEqual({ state: 'succeeded', output: { i } });
      });
      expect([...runs.values()].every((n) => n === 1)).toBe(true);
      for (const id of ids) {
        const events = await historyOf(c, id);
        for (const count of perAttempt(events, 'report_accepted').values()) {
          expect(count).toBe(1);
        }
        expect(reasons(events).filter((r) => r === 'succeeded')).toHaveLength(1);
      }
      // A lost reply is replayed (same sequence, same bytes), never guessed
      // past: the server never answered a sequence conflict.
      expect(debugLog.filter((l) => l.includes('slot cursor lost'))).toEqual([]);
      expect(debugLog.filter((l) => l.includes('"why":"renew_conflict"'))).toEqual([]);
      console.log(`flaky proxy: ${proxy.drops()} connections dropped over 200 tasks`);
    } finally {
      await proxy.close();
    }
  });
});

describe('Worker with long leases', () => {
  let longLeases: ServerProcess;

  beforeAll(async () => {
    // Leases that outlast what these tests hold up: a 15 MiB settlement batch being committed,
    // a claim or a dispatch answer held back by the test.
    longLeases = await stack.start({ LEDGENCE_LEASE_DURATION_MS: '20000' });
  });

  it('settles large non-ASCII outputs finishing together with no request refused as too large', async () => {
    const c = client(longLeases.url);
    const queue = 'large-outputs';
    // ~1 MiB of UTF-8 each (three bytes per character, one UTF-16 unit): 18 are over the
    // server's 16 MiB batch limit, a third of it counted in units.
    const n = 18;
    const output = '\u4e2d'.repeat(340_000);
    const ids = idsOf(
      await c.submitBatch(
        Array.from({ length: n }, (_, i) => ({
          queue,
          program: 'large',
          data: i,
          retry: { max_attempts: 1, delay_ms: 0 },
        })),
      ),
    );
    let started = 0;
    let releaseAll!: () => void;
    const together = new Promise<void>((resolve) => {
      releaseAll = resolve;
    });
    const w = worker(queue, { url: longLeases.url, concurrency: n, requestTimeoutMs: 10_000 });
    w.register('large', async () => {
      started += 1;
      if (started === n) releaseAll();
      await together;
      return output;
    });
    const running = w.run();
    // Statuses, not results: reading 18 MiB of outputs back would only slow the test.
    const states = async () =>
      (await Promise.all(ids.map((id) => c.status(id)))).map((s) => s.state);
    await until(
      async () => (await states()).every((state) => state !== 'queued' && state !== 'active'),
      90_000,
      'every task terminal',
    );
    await w.stop();
    await running;
    expect(await states()).toEqual(Array(n).fill('succeeded'));
    // A request refused as too large would have been sent again split, and logged.
    expect(debugLog.filter((l) => l.includes('did not fit a shared request'))).toEqual([]);
  });

  it('settles without running user code when the server refuses dispatch', async () => {
    const c = client(longLeases.url);
    const queue = 'refused';
    // The server accepts no budget within its 5 s safety margin, so the worker is made to ask
    // late: the claim's answer is held back 2 s, leaving 4 s of the 6 s budget at the dispatch
    // renew. The 20 s lease outlasts the wait.
    // A fixed 30 s retry delay keeps the re-queued task from being claimed again before stop():
    // with the default jittered delay (1..1 000 ms) the worker's next poll could claim it and the
    // proxy hold that answer, leaving the task active at the cancel below.
    const task = await c.submit({
      queue,
      program: 'never',
      data: null,
      timeout_ms: 6_000,
      retry: { max_attempts: 3, delay_ms: 30_000 },
    });
    const proxy = await startHttpProxy(longLeases.url, {
      hold: ({ path }) => (path.startsWith('/v1/worker/acquire') ? sleep(2_000) : undefined),
    });
    try {
      let ran = false;
      const w = worker(queue, { url: proxy.url, concurrency: 1 });
      w.register('never', () => {
        ran = true;
      });
      const running = w.run();
      await until(async () =>
        reasons(await historyOf(c, task.task_id)).includes('report_accepted'),
      );
      await w.stop();
      await running;
      expect(ran).toBe(false);
      const events = await historyOf(c, task.task_id);
      expect(reasons(events)).not.toContain('dispatch_authorized');
      // A refused attempt does not count: the task is queued again, not failed.
      expect(await c.cancel(task.task_id)).toBe('cancelled');
    } finally {
      await proxy.close();
    }
  });

  it('stop() hands back, without running it, a task whose dispatch is answered after the grace period', async () => {
    const c = client(longLeases.url);
    const queue = 'late-dispatch';
    const task = await c.submit({ queue, program: 'late', data: null });
    const {
      proxy,
      sent: dispatchSent,
      release: answerDispatch,
    } = await holdDispatchAnswers(longLeases.url);
    try {
      let started = false;
      const w = worker(queue, { url: proxy.url, concurrency: 1, abortGraceMs: 5_000 });
      w.register('late', () => {
        started = true;
        return 'ran';
      });
      const running = w.run();
      await until(dispatchSent);
      const stopping = w.stop({ graceMs: 0 });
      // The answer comes once the drain has passed its grace and aborted what was running.
      await until(() => debugLog.some((l) => l.includes('shutdown grace period over')));
      answerDispatch();
      await stopping;
      await running;
      expect(started).toBe(false);
      const [attemptId] = attemptIds(await historyOf(c, task.task_id));
      const attempt = await c.attempt(task.task_id, attemptId as string);
      expect(attempt.settlement?.command).toMatchObject({
        report: { kind: 'failed', report: { kind: 'rejected', retryable: true } },
        quiescence: 'confirmed',
      });
      expect((await c.status(task.task_id)).state).toBe('queued');
    } finally {
      await proxy.close();
    }
  });
});

describe('Worker sessions and keys', () => {
  const key = 'e2e-worker-key-0123456789';
  let keyed: ServerProcess;

  beforeAll(async () => {
    // Sessions valid 1 s: a worker that does not extend its session loses it.
    keyed = await stack.start({
      LEDGENCE_SESSION_VALIDITY_MS: '1000',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key, tenant: TENANT, namespaces: ['*'], roles: ['client', 'worker'] },
      ]),
    });
  });

  it('moves to a new session when its session expires', async () => {
    const c = new Client({
      url: keyed.url,
      apiKey: key,
      tenant: TENANT,
      namespace: NAMESPACE,
    });
    const queue = 'session';
    const w = new Worker({
      url: keyed.url,
      apiKey: key,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue,
      concurrency: 2,
      logger,
      renewIntervalMs: RENEW_MS,
      pollWaitMs: 300,
      // Far beyond the session's validity: it expires between the two tasks.
      sessionExtendIntervalMs: 600_000,
    });
    workers.push(w);
    w.register('job', () => null);
    const running = w.run();
    const first = await c.submit({ queue, program: 'job', data: null });
    await settled(c, [first.task_id]);
    await sleep(1_500);
    const second = await c.submit({ queue, program: 'job', data: null });
    const results = await settled(c, [second.task_id]);
    await w.stop();
    await running;
    expect(results[0]?.outcome.state).toBe('succeeded');
    expect(await sessionOf(c, second.task_id)).not.toBe(await sessionOf(c, first.task_id));
  });

  it('keeps renewing and settles a task held across its session expiring', async () => {
    const c = new Client({ url: keyed.url, apiKey: key, tenant: TENANT, namespace: NAMESPACE });
    const queue = 'session-held';
    const task = await c.submit({ queue, program: 'long', data: null });
    const w = new Worker({
      url: keyed.url,
      apiKey: key,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue,
      concurrency: 1,
      logger,
      renewIntervalMs: RENEW_MS,
      pollWaitMs: 300,
      sessionExtendIntervalMs: 600_000,
    });
    workers.push(w);
    let aborted = false;
    w.register('long', async (_data, ctx) => {
      // Twice the session's validity: the lease outlives the session it was taken on.
      await sleep(2_000);
      aborted = ctx.signal.aborted;
      return 'done';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(aborted).toBe(false);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'done' });
    expect(result?.status.attempt_count).toBe(1);
  });

  it('a client with an unknown key gets unauthorized, without retrying', async () => {
    const requests: string[] = [];
    const c = new Client({
      url: keyed.url,
      apiKey: 'not-a-key-the-server-knows',
      tenant: TENANT,
      namespace: NAMESPACE,
      logger,
      fetch: (input, init) => {
        requests.push(input);
        return fetch(input, init);
      },
    });
    const error = await c.submit({ queue: 'q', program: 'p' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toMatchObject({ code: 'unauthorized', status: 401 });
    expect(requests).toHaveLength(1);
  });

  it('run() rejects when the server refuses the key, and stop() still resolves', async () => {
    const w = new Worker({
      url: keyed.url,
      apiKey: 'not-a-key-the-server-knows',
      tenant: TENANT,
      namespace: NAMESPACE,
      queue: 'refused-key',
      concurrency: 1,
      logger,
    });
    w.register('x', () => null);
    await expect(w.run()).rejects.toMatchObject({ code: 'unauthorized' });
    await w.stop();
  });
});

describe("Worker sessions against a server's shorter validity", () => {
  // The worker's own extension period stays at its default (a third of SESSION_VALIDITY_MS,
  // 100 s): it must learn that these servers' sessions are far shorter, or lose them.
  const defaultWorker = (url: string, queue: string, seen: string[]) => {
    const w = new Worker({
      url,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue,
      concurrency: 1,
      renewIntervalMs: RENEW_MS,
      pollWaitMs: 300,
      logger: {
        ...logger,
        warn: (message, fields) => {
          seen.push(message);
          logger.warn(message, fields);
        },
      },
    });
    workers.push(w);
    w.register('job', () => null);
    return w;
  };
  // Two tasks `gapMs` apart, each settled before the next is submitted: the sessions they ran on.
  const twoTasksApart = async (c: Client, queue: string, gapMs: number) => {
    const first = await c.submit({ queue, program: 'job', data: null });
    await settled(c, [first.task_id]);
    await sleep(gapMs);
    const second = await c.submit({ queue, program: 'job', data: null });
    await settled(c, [second.task_id]);
    return [await sessionOf(c, first.task_id), await sessionOf(c, second.task_id)];
  };

  it('extends within a validity its replies show (expires_at against Date), losing none', async () => {
    const short = await stack.start({ LEDGENCE_SESSION_VALIDITY_MS: '4500' });
    const c = new Client({ url: short.url, tenant: TENANT, namespace: NAMESPACE });
    const seen: string[] = [];
    const w = defaultWorker(short.url, 'validity-shown', seen);
    const running = w.run();
    // Longer than the validity: the session outlives it only if extended.
    const [first, second] = await twoTasksApart(c, 'validity-shown', 6_000);
    await w.stop();
    await running;
    expect(second).toBe(first);
    expect(seen).not.toContain('session lost; opening a new one');
    expect(seen).not.toContain('slot cursor lost; moving to a new session');
  });

  it('learns a validity too short to show from the first session it loses, then keeps the next', async () => {
    // 2 s: under what a one-second Date can show, so only a loss can tell.
    const short = await stack.start({ LEDGENCE_SESSION_VALIDITY_MS: '2000' });
    const c = new Client({ url: short.url, tenant: TENANT, namespace: NAMESPACE });
    const seen: string[] = [];
    const w = defaultWorker(short.url, 'validity-lost', seen);
    const running = w.run();
    const [first, second] = await twoTasksApart(c, 'validity-lost', 3_000);
    expect(second).not.toBe(first);
    const learned = seen.filter((m) => m.startsWith('the server lets sessions expire sooner'));
    expect(learned).toHaveLength(1);
    const [third, fourth] = await twoTasksApart(c, 'validity-lost', 5_000);
    await w.stop();
    await running;
    expect(third).toBe(second);
    expect(fourth).toBe(second);
    expect(seen.filter((m) => m.startsWith('the server lets sessions expire sooner'))).toEqual(
      learned,
    );
  });
});
