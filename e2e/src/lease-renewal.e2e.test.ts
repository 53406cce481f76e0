/**
 * Lease renewal end to end (review r52d): a real server process (1 s leases), the real SDK, and
 * the harness's HTTP proxy holding, dropping or refusing renewals (DESIGN §4.1 renew sequences,
 * §5 Authority/Renew, §6 renew:batch; packages/worker README "Heartbeats").
 */
import type { TaskAbortedError } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  client,
  historyOf,
  type ProxiedExchange,
  type ProxiedRequest,
  perAttempt,
  reasons,
  settled,
  sleep,
  startHttpProxy,
  until,
  workerSuite,
} from './test/harness.js';
import {
  call,
  openSession,
  pollBody,
  SCOPE,
  settleBody,
  submitTask,
  TASKS_BASE,
  taskBody,
} from './test/wire.js';

const suite = workerSuite('lease_renewal_r52d', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '30000',
});

// biome-ignore lint/suspicious/noExplicitAny: wire commands read field by field
type Any = any;

const isRenew = (r: ProxiedRequest) => r.path.startsWith('/v1/worker/renew');
function renewCommands(r: ProxiedRequest): Any[] {
  const parsed = JSON.parse(String(r.body));
  return r.path.startsWith('/v1/worker/renew:batch') ? parsed.commands : [parsed];
}

/** Every renewal sent for `attemptId`, in the order the proxy saw them: [sequence, intent]. */
function sentFor(requests: ProxiedRequest[], attemptId: string): [number, string][] {
  const out: [number, string][] = [];
  for (const r of requests) {
    if (!isRenew(r)) continue;
    for (const c of renewCommands(r)) {
      if (c.owner.attempt_id === attemptId) out.push([c.sequence, c.intent]);
    }
  }
  return out;
}

describe('heartbeats over many lease durations, one reply lost', () => {
  it('keeps the lease of a 4 s handler (1 s leases); the lost renewal is re-sent with the same sequence and intent, never skipped', async () => {
    const c = client(suite.server.url);
    const queue = 'r52d-long';
    const task = await c.submit({ queue, program: 'long', data: null });
    const requests: ProxiedRequest[] = [];
    let keepAlives = 0;
    let droppedSequence: number | undefined;
    const proxy = await startHttpProxy(suite.server.url, {
      observe: (r) => {
        requests.push(r);
        return undefined;
      },
      reply: (ex: ProxiedExchange) => {
        if (isRenew(ex) && ex.body.includes('keep_alive')) {
          keepAlives += 1;
          if (keepAlives === 3 && droppedSequence === undefined) {
            droppedSequence = renewCommands(ex)[0].sequence;
            return 'drop';
          }
        }
        return 'pass';
      },
    });
    suite.proxies.push(proxy);
    const w = suite.worker(queue, { url: proxy.url });
    let abortedBy: unknown;
    let attemptId = '';
    w.register('long', async (_data, ctx) => {
      attemptId = ctx.attemptId;
      await sleep(4_000);
      abortedBy = ctx.signal.aborted ? ctx.signal.reason : undefined;
      return 'done';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop({ graceMs: 1_000 });
    await running;
    expect(abortedBy).toBeUndefined();
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'done' });
    expect(result?.status.attempt_count).toBe(1);
    expect(reasons(await historyOf(c, task.task_id))).not.toContain('lease_expired');
    expect(droppedSequence).toBeDefined();
    const sent = sentFor(requests, attemptId);
    // Sequence 1 is the dispatch; every later one is the last sent again (a lost reply) or + 1.
    expect(sent[0]).toEqual([1, 'dispatch']);
    let max = 0;
    for (const [sequence, intent] of sent) {
      expect(sequence === max || sequence === max + 1).toBe(true);
      expect(intent).toBe(sequence === 1 ? 'dispatch' : 'keep_alive');
      max = Math.max(max, sequence);
    }
    // The dropped one was re-sent, and at least ~8 renewals carried a 4 s handler on 1 s leases.
    expect(sent.filter(([s]) => s === droppedSequence).length).toBeGreaterThanOrEqual(2);
    expect(max).toBeGreaterThanOrEqual(6);
    const attempt = await c.attempt(task.task_id, attemptId);
    expect(attempt.last_renewal?.sequence).toBe(max);
  });
});

describe('renewals that never reach the server past the lease', () => {
  it('aborts the handler (lease_lost) before another worker can start the task, and its late settlement is refused', async () => {
    const c = client(suite.server.url);
    const queue = 'r52d-refused';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    let refusing = false;
    const proxy = await startHttpProxy(suite.server.url, {
      refuse: (r) => refusing && isRenew(r) && String(r.body).includes('keep_alive'),
    });
    suite.proxies.push(proxy);
    const a = suite.worker(queue, { url: proxy.url });
    let abortedAt = 0;
    let why = '';
    let firstAttempt = '';
    a.register('p', async (_data, ctx) => {
      if (ctx.attempt > 1) return 'retried on a';
      firstAttempt = ctx.attemptId;
      refusing = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      abortedAt = performance.now();
      why = (ctx.signal.reason as TaskAbortedError).why;
      refusing = false;
      // Returns well after the server's lease ran out: this report must not be accepted.
      await sleep(1_500);
      return 'late';
    });
    const runningA = a.run();
    await until(() => refusing, 10_000, 'worker a holding the task');
    let startedOnBAt = 0;
    const b = suite.worker(queue);
    b.register('p', async (_data, ctx) => {
      if (ctx.attempt > 1 && startedOnBAt === 0) startedOnBAt = performance.now();
      return 'retried on b';
    });
    const runningB = b.run();
    const [result] = await settled(c, [task.task_id]);
    await Promise.all([a.stop({ graceMs: 1_000 }), b.stop({ graceMs: 1_000 })]);
    await Promise.all([runningA, runningB]);
    expect(why).toBe('lease_lost');
    expect(result?.outcome.state).toBe('succeeded');
    expect(result?.outcome).not.toEqual({ state: 'succeeded', output: 'late' });
    const events = await historyOf(c, task.task_id);
    expect(perAttempt(events, 'lease_expired').get(firstAttempt)).toBe(1);
    expect(perAttempt(events, 'report_accepted').get(firstAttempt)).toBeUndefined();
    if (startedOnBAt !== 0) expect(abortedAt).toBeLessThan(startedOnBAt);
  });
});

describe('renew:batch with many leases, some of them gone', () => {
  it('answers each item on its own, in order: ownership_lost and sequence_conflict items do not stop the others being renewed', async () => {
    const queue = 'r52d-batch-raw';
    const ids = [];
    for (let i = 0; i < 4; i++)
      ids.push(await submitTask(suite.server.url, taskBody(`r52d-b-${i}`, queue)));
    const session = await openSession(suite.server.url, queue, 4);
    const owners: Any[] = [];
    for (let slot = 0; slot < 4; slot++) {
      const { body } = await call<Any>(
        suite.server.url,
        '/v1/worker/acquire',
        pollBody(session, queue, slot, 1),
      );
      expect(body.disposition).toBe('assigned');
      owners.push(body.assignment.lease.owner);
    }
    const dispatch = await call<Any>(suite.server.url, '/v1/worker/renew:batch', {
      commands: owners.map((owner) => ({ owner, sequence: 1, intent: 'dispatch' })),
    });
    expect(dispatch.body.results.map((r: Any) => r.dispatch_allowed)).toEqual([
      true,
      true,
      true,
      true,
    ]);
    // Keep 0, 1 and 2 alive; let 3 expire (1 s leases).
    for (let seq = 2; seq <= 3; seq++) {
      await sleep(600);
      const kept = await call<Any>(suite.server.url, '/v1/worker/renew:batch', {
        commands: owners
          .slice(0, 3)
          .map((owner) => ({ owner, sequence: seq, intent: 'keep_alive' })),
      });
      expect(kept.body.results.map((r: Any) => r.renew_sequence)).toEqual([seq, seq, seq]);
    }
    const stolen = { ...owners[1], lease_id: `${owners[1].lease_id}x` };
    const before = await call<Any>(
      suite.server.url,
      `${TASKS_BASE}/tasks/${ids[0]}/attempts/${owners[0].attempt_id}`,
    );
    const reply = await call<Any>(suite.server.url, '/v1/worker/renew:batch', {
      commands: [
        { owner: owners[3], sequence: 2, intent: 'keep_alive' }, // expired
        { owner: owners[0], sequence: 4, intent: 'keep_alive' }, // next
        { owner: stolen, sequence: 4, intent: 'keep_alive' }, // not the owner
        { owner: owners[2], sequence: 9, intent: 'keep_alive' }, // a gap
        { owner: owners[1], sequence: 3, intent: 'keep_alive' }, // a replay
        { owner: owners[0], sequence: 4, intent: 'keep_alive' }, // a replay within the batch
      ],
    });
    expect(reply.status).toBe(200);
    const r = reply.body.results;
    expect(r[0].code).toBe('ownership_lost');
    expect(r[1].renew_sequence).toBe(4);
    expect(r[2].code).toBe('ownership_lost');
    expect(r[3].code).toBe('sequence_conflict');
    expect(r[4].renew_sequence).toBe(3);
    expect(r[5].renew_sequence).toBe(4);
    const after = await call<Any>(
      suite.server.url,
      `${TASKS_BASE}/tasks/${ids[0]}/attempts/${owners[0].attempt_id}`,
    );
    expect(after.body.last_renewal.sequence).toBe(4);
    expect(after.body.lease_expires_at ?? after.body.lease?.expires_at).toBeGreaterThan(
      before.body.lease_expires_at ?? before.body.lease?.expires_at,
    );
    // Slot 2 is still alive at sequence 3 and renews on.
    const next = await call<Any>(suite.server.url, '/v1/worker/renew', {
      owner: owners[2],
      sequence: 4,
      intent: 'keep_alive',
    });
    expect(next.body.renew_sequence).toBe(4);
  });

  it('the SDK: one lease of a shared heartbeat batch answered ownership_lost aborts that handler only; the other keeps renewing and settles', async () => {
    const c = client(suite.server.url);
    const queue = 'r52d-batch-sdk';
    const first = await c.submit({ queue, program: 'hold', data: 'a' });
    const second = await c.submit({ queue, program: 'hold', data: 'b' });
    const requests: ProxiedRequest[] = [];
    const owners = new Map<string, Any>();
    const proxy = await startHttpProxy(suite.server.url, {
      observe: (r) => {
        requests.push(r);
        if (isRenew(r))
          for (const cmd of renewCommands(r)) owners.set(cmd.owner.task_id, cmd.owner);
        return undefined;
      },
    });
    suite.proxies.push(proxy);
    const w = suite.worker(queue, { url: proxy.url, concurrency: 2 });
    const whys = new Map<string, string | undefined>();
    const running = new Set<string>();
    w.register('hold', async (data, ctx) => {
      running.add(String(data));
      const endAt = performance.now() + 3_000;
      while (performance.now() < endAt && !ctx.signal.aborted) await sleep(20);
      whys.set(
        String(data),
        ctx.signal.aborted ? (ctx.signal.reason as TaskAbortedError).why : undefined,
      );
      return `ran ${data}`;
    });
    const run = w.run();
    await until(() => running.size === 2 && owners.size === 2, 10_000, 'both handlers running');
    // Both leases renew together; end the first one's lease at the server by settling it by hand.
    const ownerA = owners.get(first.task_id);
    const settleByTest = await call<Any>(suite.server.url, '/v1/worker/settle', {
      ...settleBody({ lease: { owner: ownerA } } as Any, { kind: 'success', output: 'by test' }),
    });
    expect(settleByTest.status).toBe(200);
    const [ra, rb] = await settled(c, [first.task_id, second.task_id]);
    await w.stop({ graceMs: 1_000 });
    await run;
    expect(whys.get('a')).toBe('lease_lost');
    expect(whys.get('b')).toBeUndefined();
    expect(ra?.outcome).toEqual({ state: 'succeeded', output: 'by test' });
    expect(rb?.outcome).toEqual({ state: 'succeeded', output: 'ran b' });
    // Nothing more is sent for the lost lease: not its settlement.
    const settles = requests.filter((r) => r.path.startsWith('/v1/worker/settle'));
    const settledAttempts = settles.flatMap((r) => {
      const parsed = JSON.parse(String(r.body));
      return (r.path.includes(':batch') ? parsed.commands : [parsed]).map(
        (x: Any) => x.owner.attempt_id,
      );
    });
    expect(settledAttempts).not.toContain(ownerA.attempt_id);
    // Renewals of b shared requests with a's and went on after a's was refused: sequences 1..n.
    const bSent = sentFor(requests, owners.get(second.task_id).attempt_id).map(([s]) => s);
    expect(Math.max(...bSent)).toBeGreaterThanOrEqual(4);
  });
});

describe('renew:batch items that cannot be decoded or name nothing', () => {
  it('answers them on their own (invalid_input, not_found) and still renews the valid item', async () => {
    const queue = 'r52d-batch-bad';
    await submitTask(suite.server.url, taskBody('r52d-bad-0', queue));
    const session = await openSession(suite.server.url, queue, 1);
    const { body } = await call<Any>(
      suite.server.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 1),
    );
    const owner = body.assignment.lease.owner;
    const reply = await call<Any>(suite.server.url, '/v1/worker/renew:batch', {
      commands: [
        { owner, sequence: -1, intent: 'dispatch' },
        {
          owner: { ...owner, attempt_id: 'nope', task_id: 'nope' },
          sequence: 1,
          intent: 'dispatch',
        },
        { owner, sequence: 1, intent: 'dispatch' },
        { owner, sequence: 1, intent: 'keep_alive' },
      ],
    });
    expect(reply.status).toBe(200);
    const r = reply.body.results;
    expect(r[0].code).toBe('invalid_input');
    expect(r[1].code).toBe('not_found');
    expect(r[2].renew_sequence).toBe(1);
    expect(r[2].dispatch_allowed).toBe(true);
    expect(r[3].code).toBe('conflict');
    void SCOPE;
  });
});

describe('a cancel learnt from a renewal whose reply was lost', () => {
  it('the re-sent renewal (same sequence) carries the cancel: ctx.signal aborts with cancelled and the task is cancelled', async () => {
    const c = client(suite.server.url);
    const queue = 'r52d-cancel-lost';
    const task = await c.submit({ queue, program: 'wait', data: null });
    let dropNext = false;
    let dropped: Any;
    const requests: ProxiedRequest[] = [];
    const proxy = await startHttpProxy(suite.server.url, {
      observe: (r) => {
        requests.push(r);
        return undefined;
      },
      reply: (ex) => {
        if (dropNext && isRenew(ex) && ex.reply.includes('"cancel_requested":true')) {
          dropNext = false;
          dropped = renewCommands(ex)[0];
          return 'drop';
        }
        return 'pass';
      },
    });
    suite.proxies.push(proxy);
    const w = suite.worker(queue, { url: proxy.url });
    let started = false;
    let why = '';
    let attemptId = '';
    w.register('wait', async (_data, ctx) => {
      attemptId = ctx.attemptId;
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      why = (ctx.signal.reason as TaskAbortedError).why;
      throw ctx.signal.reason;
    });
    const running = w.run();
    await until(() => started, 10_000, 'the handler started');
    dropNext = true;
    await c.cancel(task.task_id);
    const [result] = await settled(c, [task.task_id]);
    await w.stop({ graceMs: 1_000 });
    await running;
    expect(dropped).toBeDefined();
    expect(why).toBe('cancelled');
    expect(result?.outcome).toEqual({ state: 'cancelled' });
    expect(result?.status.attempt_count).toBe(1);
    const sent = sentFor(requests, attemptId).map(([s]) => s);
    expect(sent.filter((s) => s === dropped.sequence).length).toBeGreaterThanOrEqual(2);
  });
});

describe('the execution budget', () => {
  it('aborts ctx.signal (timeout) at the server deadline, not earlier, when the task was claimed mid long poll; reported timed_out', async () => {
    const c = client(suite.server.url);
    const queue = 'r52d-budget';
    const w = suite.worker(queue, { pollWaitMs: 1_000 });
    let abortedAt = 0;
    let deadline = 0;
    let why = '';
    w.register('b', async (_data, ctx) => {
      deadline = ctx.deadline;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      abortedAt = Date.now();
      why = (ctx.signal.reason as TaskAbortedError).why;
      throw ctx.signal.reason;
    });
    const running = w.run();
    await sleep(700); // the worker's poll is parked
    const task = await c.submit({
      queue,
      program: 'b',
      data: null,
      timeout_ms: 2_000,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    const [result] = await settled(c, [task.task_id]);
    await w.stop({ graceMs: 1_000 });
    await running;
    expect(why).toBe('timeout');
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'timed_out', retryable: true } },
    });
    // Store time and this process share the machine's clock.
    expect(abortedAt).toBeGreaterThanOrEqual(deadline - 150);
    expect(abortedAt).toBeLessThanOrEqual(deadline + 500);
  });
});
