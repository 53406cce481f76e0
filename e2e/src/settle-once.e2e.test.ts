/**
 * The worker SDK's promise that a result is reported exactly once under network
 * faults (DESIGN §5 Renew/Settle, §10; packages/worker README "Settlement", "Acquisition").
 *
 * A "tap" (the harness's HTTP proxy judging replies) forwards each request to the real server,
 * reads the whole reply, and then lets the test pass it on, drop it (the server committed, the
 * worker sees a network failure), cut it, hold it, or rewrite it.
 */
import { ApplicationError, type TaskAbortedError } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  attemptIds,
  client,
  historyOf,
  type ProxiedExchange,
  perAttempt,
  type ReplyVerdict,
  reasons,
  settled,
  sleep,
  startHttpProxy,
  until,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('settle_once', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '30000',
});

/** A test proxy that records every exchange and lets `decide` judge each reply. */
interface Tap {
  url: string;
  exchanges: ProxiedExchange[];
}

async function startTap(
  target: string,
  decide: (ex: ProxiedExchange) => ReplyVerdict | Promise<ReplyVerdict>,
): Promise<Tap> {
  const exchanges: ProxiedExchange[] = [];
  const proxy = await startHttpProxy(target, {
    reply: (ex) => {
      exchanges.push(ex);
      return decide(ex);
    },
  });
  suite.proxies.push(proxy);
  return { url: proxy.url, exchanges };
}

const isSettle = (ex: ProxiedExchange) => ex.path.startsWith('/v1/worker/settle');
const isAcquire = (ex: ProxiedExchange) => ex.path.startsWith('/v1/worker/acquire');

// biome-ignore lint/suspicious/noExplicitAny: wire replies read field by field
function settleItems(ex: ProxiedExchange): any[] {
  return (JSON.parse(ex.reply) as { results: unknown[] }).results;
}
// biome-ignore lint/suspicious/noExplicitAny: wire commands read field by field
function settleCommands(ex: ProxiedExchange): any[] {
  return (JSON.parse(String(ex.body)) as { commands: unknown[] }).commands;
}

describe('a settlement whose reply is lost', () => {
  it.each(['drop', 'cut'] as const)(
    'is sent again byte for byte (%s), answered with the same receipt (already_accepted), and the task shows one settlement',
    async (how) => {
      const c = client(suite.server.url);
      const queue = `settle-lost-${how}`;
      const task = await c.submit({ queue, program: 'p', data: { n: 1 } });
      let dropped = 0;
      const tap = await startTap(suite.server.url, (ex) => {
        if (isSettle(ex) && dropped === 0) {
          dropped += 1;
          return how;
        }
        return 'pass';
      });
      const w = suite.worker(queue, { url: tap.url });
      let runs = 0;
      w.register('p', (data) => {
        runs += 1;
        return data;
      });
      const running = w.run();
      const [result] = await settled(c, [task.task_id]);
      await until(() => tap.exchanges.filter(isSettle).length >= 2);
      await w.stop();
      await running;
      expect(result?.outcome).toEqual({ state: 'succeeded', output: { n: 1 } });
      expect(result?.status.attempt_count).toBe(1);
      expect(runs).toBe(1);
      const [first, second] = tap.exchanges.filter(isSettle);
      expect(settleCommands(second as ProxiedExchange)).toEqual(
        settleCommands(first as ProxiedExchange),
      );
      const [a] = settleItems(first as ProxiedExchange);
      const [b] = settleItems(second as ProxiedExchange);
      expect(a.already_accepted).toBe(false);
      expect(b.already_accepted).toBe(true);
      expect(b.receipt).toEqual(a.receipt);
      const events = await historyOf(c, task.task_id);
      expect([...perAttempt(events, 'report_accepted').values()]).toEqual([1]);
      expect(reasons(events).filter((r) => r === 'succeeded')).toHaveLength(1);
    },
  );

  it('held past the lease and then lost is still answered already_accepted, not refused as ownership_lost', async () => {
    const c = client(suite.server.url);
    const queue = 'settle-late';
    const task = await c.submit({ queue, program: 'p', data: 2 });
    let dropped = 0;
    const tap = await startTap(suite.server.url, (ex) => {
      if (isSettle(ex) && dropped === 0) {
        dropped += 1;
        // Past the 1 s lease, then cut.
        return sleep(1_800).then(() => 'drop' as const);
      }
      return 'pass';
    });
    const w = suite.worker(queue, { url: tap.url, requestTimeoutMs: 5_000 });
    w.register('p', (data) => data);
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await until(() => tap.exchanges.filter(isSettle).length >= 2, 15_000, 'the settle resent');
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 2 });
    const [, second] = tap.exchanges.filter(isSettle);
    expect(settleItems(second as ProxiedExchange)[0]).toMatchObject({ already_accepted: true });
    const events = await historyOf(c, task.task_id);
    expect([...perAttempt(events, 'report_accepted').values()]).toEqual([1]);
    expect(reasons(events)).not.toContain('lease_expired');
  });
});

describe('a batch settlement whose items are answered unavailable (their outcome unknown)', () => {
  it('sends those items again and each attempt keeps one settlement', async () => {
    const c = client(suite.server.url);
    const queue = 'settle-batch';
    const ids: string[] = [];
    for (let i = 0; i < 3; i += 1) {
      ids.push((await c.submit({ queue, program: 'p', data: i })).task_id);
    }
    let rewrote = 0;
    const tap = await startTap(suite.server.url, (ex) => {
      if (!isSettle(ex) || rewrote > 0) return 'pass';
      const items = settleItems(ex);
      if (items.length < 2) return 'pass';
      rewrote += 1;
      const problem = {
        type: 'https://ledgence.dev/problems/unavailable',
        title: 'Service Unavailable',
        status: 503,
        code: 'unavailable',
        detail: 'the commit outcome is unknown',
      };
      return {
        body: JSON.stringify({
          results: items.map((item, i) => (i % 2 === 0 ? problem : item)),
        }),
      };
    });
    const w = suite.worker(queue, { url: tap.url, concurrency: 3 });
    let started = 0;
    let go = () => {};
    const together = new Promise<void>((resolve) => {
      go = resolve;
    });
    w.register('p', async (data) => {
      started += 1;
      if (started === 3) go();
      await together;
      return data;
    });
    const running = w.run();
    const results = await settled(c, ids);
    await sleep(300);
    await w.stop();
    await running;
    expect(rewrote).toBe(1);
    results.forEach((r, i) => {
      expect(r.outcome).toEqual({ state: 'succeeded', output: i });
      expect(r.status.attempt_count).toBe(1);
    });
    for (const id of ids) {
      const events = await historyOf(c, id);
      expect([...perAttempt(events, 'report_accepted').values()]).toEqual([1]);
    }
  });
});

describe('an acquire reply carrying a task, cut in flight', () => {
  it('the task is not lost: the replay hands the same attempt, run once, one claim, one dispatch', async () => {
    const c = client(suite.server.url);
    const queue = 'acquire-cut';
    const task = await c.submit({ queue, program: 'p', data: 'x' });
    let dropped = 0;
    const tap = await startTap(suite.server.url, (ex) => {
      if (isAcquire(ex) && dropped === 0 && ex.reply.includes('"assigned"')) {
        dropped += 1;
        return 'drop';
      }
      return 'pass';
    });
    const w = suite.worker(queue, { url: tap.url });
    const attempts: string[] = [];
    w.register('p', (data, ctx) => {
      attempts.push(ctx.attemptId);
      return data;
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(dropped).toBe(1);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'x' });
    const events = await historyOf(c, task.task_id);
    expect(attemptIds(events)).toHaveLength(1);
    expect(attempts).toEqual(attemptIds(events));
    expect(result?.status.attempt_count).toBe(1);
    expect(reasons(events).filter((r) => r === 'dispatch_authorized')).toHaveLength(1);
    expect(reasons(events)).not.toContain('lease_expired');
  });
});

describe('stop() racing a settlement in flight', () => {
  it.each([0, 5_000])(
    'stop({ graceMs: %i }) while the settle reply is held and then lost: one settlement, no lease expiry, stop resolves',
    async (graceMs) => {
      const c = client(suite.server.url);
      const queue = `stop-settle-${graceMs}`;
      const task = await c.submit({ queue, program: 'p', data: 'done' });
      let heldOne = false;
      let release = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      const tap = await startTap(suite.server.url, (ex) => {
        if (isSettle(ex) && !heldOne) {
          heldOne = true;
          return released.then(() => 'drop' as const);
        }
        return 'pass';
      });
      const w = suite.worker(queue, { url: tap.url });
      w.register('p', (data) => data);
      const running = w.run();
      await until(() => heldOne);
      const stopping = w.stop({ graceMs });
      await sleep(100);
      release();
      await stopping;
      await running;
      const [result] = await settled(c, [task.task_id]);
      expect(result?.outcome).toEqual({ state: 'succeeded', output: 'done' });
      expect(result?.status.attempt_count).toBe(1);
      const events = await historyOf(c, task.task_id);
      expect([...perAttempt(events, 'report_accepted').values()]).toEqual([1]);
      expect(reasons(events)).not.toContain('lease_expired');
    },
  );
});

describe('a renewal whose reply is lost past the lease', () => {
  /**
   * Runs one task whose keep-alive renewals are answered only past the 1 s lease (the server
   * kept it: the renewals arrived), so the worker aborts the handler with `lease_lost`; the
   * handler then does `afterAbort` on attempt 1, and returns 'retried' on any later one.
   */
  async function pastLostRenewals(queue: string, afterAbort: () => unknown) {
    const c = client(suite.server.url);
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    let holding = false;
    const tap = await startTap(suite.server.url, (ex) => {
      if (holding && ex.path.startsWith('/v1/worker/renew') && ex.body.includes('keep_alive')) {
        return sleep(3_000).then(() => 'drop' as const);
      }
      return 'pass';
    });
    const w = suite.worker(queue, { url: tap.url, requestTimeoutMs: 10_000 });
    const whys: string[] = [];
    w.register('p', async (_data, ctx) => {
      if (ctx.attempt > 1) return 'retried';
      holding = true;
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      whys.push((ctx.signal.reason as TaskAbortedError).why);
      holding = false;
      return afterAbort();
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop({ graceMs: 0 });
    await running;
    expect(whys).toEqual(['lease_lost']);
    // The renewals reached the server: its lease was live when the first settlement came.
    const events = await historyOf(c, task.task_id);
    expect([...perAttempt(events, 'report_accepted').values()][0]).toBe(1);
    return result;
  }

  it('aborts the handler (lease_lost) and its settlement, sent while the server lease lives, is accepted', async () => {
    const result = await pastLostRenewals('renew-lost', () => 'finished after abort');
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'finished after abort' });
    expect(result?.status.attempt_count).toBe(1);
  });

  it('an ApplicationError thrown after the abort is reported as the lost lease (a retryable crash), not a failure for good', async () => {
    // README (worker): "A throw after ctx.signal aborted, an ApplicationError too, is reported by
    // its cause: ... lease lost → crashed (retryable)" — the error most likely wraps the abort.
    const result = await pastLostRenewals('renew-lost-app-error', () => {
      throw new ApplicationError('card_declined', 'the card was declined', { retryable: false });
    });
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'retried' });
    expect(result?.status.attempt_count).toBe(2);
  });
});

describe('stop() after an acquire reply carrying a task was lost', () => {
  it('the drain replays the poll and hands the task back uncounted: queued when stop() resolves, and a max_attempts 1 task still runs', async () => {
    const c = client(suite.server.url);
    const queue = 'stop-lost-poll';
    const task = await c.submit({
      queue,
      program: 'p',
      data: 'y',
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let dropped = 0;
    const tap = await startTap(suite.server.url, (ex) => {
      if (isAcquire(ex) && dropped === 0 && ex.reply.includes('"assigned"')) {
        dropped += 1;
        return 'cut';
      }
      return 'pass';
    });
    // A long backoff: the slot is waiting to replay its poll when stop() comes.
    const w = suite.worker(queue, { url: tap.url, backoff: { baseMs: 5_000, maxMs: 5_000 } });
    let ranFirst = false;
    w.register('p', () => {
      ranFirst = true;
      return 'first';
    });
    const running = w.run();
    await until(() => dropped === 1);
    await w.stop({ graceMs: 1_000 });
    await running;
    expect(ranFirst).toBe(false);
    const status = await c.status(task.task_id);
    expect(status.state).toBe('queued');
    const second = suite.worker(queue);
    second.register('p', (data, ctx) => ({ data, attempt: ctx.attempt }));
    const again = second.run();
    const [result] = await settled(c, [task.task_id]);
    await second.stop();
    await again;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: { data: 'y', attempt: 2 } });
    const events = await historyOf(c, task.task_id);
    expect(reasons(events).filter((r) => r === 'dispatch_authorized')).toHaveLength(1);
  });
});

describe('a dispatch answer that arrives after the lease it granted has run out', () => {
  it('does not start user code on a lease the worker already knows expired (the attempt is handed back, not run)', async () => {
    const c = client(suite.server.url);
    const queue = 'late-dispatch';
    const task = await c.submit({
      queue,
      program: 'p',
      data: null,
      retry: { max_attempts: 3, delay_ms: 0 },
    });
    let firstAttempt: string | undefined;
    const tap = await startTap(suite.server.url, (ex) => {
      if (
        ex.path.startsWith('/v1/worker/renew') &&
        ex.body.includes('"intent":"dispatch"') &&
        (firstAttempt === undefined || ex.body.includes(firstAttempt))
      ) {
        firstAttempt ??= (
          JSON.parse(String(ex.body)) as { commands: { owner: { attempt_id: string } }[] }
        ).commands[0]?.owner.attempt_id;
        // Granted at the server, which extends the 1 s lease from now; the answer comes 1.5 s
        // later, when that lease has run out (and recovery has taken the task back).
        return sleep(1_500).then(() => 'pass' as const);
      }
      return 'pass';
    });
    const w = suite.worker(queue, { url: tap.url, requestTimeoutMs: 5_000 });
    const started: { attemptId: string; abortedAtStart: boolean }[] = [];
    w.register('p', (_data, ctx) => {
      // A synchronous handler: whatever it does is done before any timer can abort it.
      started.push({ attemptId: ctx.attemptId, abortedAtStart: ctx.signal.aborted });
      return 'ran';
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'ran' });
    const events = await historyOf(c, task.task_id);
    // The first attempt's lease expired at the server before its dispatch answer arrived.
    expect(reasons(events)).toContain('lease_expired');
    expect(firstAttempt).toBeDefined();
    // User code must not start on the first attempt: the worker's own estimate of its lease
    // (send time + remaining_ms) had passed when the grant arrived.
    expect(started.filter((s) => s.attemptId === firstAttempt)).toEqual([]);
  });
});

describe('ctx.heartbeat() when the renewal reply is lost', () => {
  it('resolves only once a renewal was answered or the lease is gone, not when the request failed', async () => {
    const c = client(suite.server.url);
    const queue = 'heartbeat-lost';
    const task = await c.submit({ queue, program: 'p', data: null });
    let cutting = false;
    let answered = 0;
    let cut = 0;
    // Renewals on the wire: heartbeat() rides on one already sent, whose answer then resolves it
    // (a CI run saw it answered, passed before the cutting began: neither cut nor counted after).
    let renewing = 0;
    const proxy = await startHttpProxy(suite.server.url, {
      observe({ path }) {
        if (!path.startsWith('/v1/worker/renew')) return undefined;
        renewing += 1;
        return () => {
          renewing -= 1;
        };
      },
      reply(ex) {
        if (!ex.path.startsWith('/v1/worker/renew')) return 'pass';
        if (cutting) {
          cut += 1;
          return 'cut';
        }
        answered += 1;
        return 'pass';
      },
    });
    suite.proxies.push(proxy);
    const w = suite.worker(queue, { url: proxy.url, renewIntervalMs: 60_000 });
    let seen: { answeredSince: number; cutSince: number; aborted: boolean } | undefined;
    w.register('p', async (_data, ctx) => {
      await until(() => renewing === 0, 10_000, 'no renewal on the wire');
      await sleep(100); // and the last reply taken in by the worker
      cutting = true;
      const answeredBefore = answered;
      const cutBefore = cut;
      await ctx.heartbeat();
      seen = {
        answeredSince: answered - answeredBefore,
        cutSince: cut - cutBefore,
        aborted: ctx.signal.aborted,
      };
      cutting = false;
      return 'ok';
    });
    const running = w.run();
    await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(seen).toBeDefined();
    expect(seen?.cutSince).toBeGreaterThan(0);
    // JSDoc of TaskContext.heartbeat: "resolves once a renewal was answered (or the lease is
    // gone)"; README: "renews now; resolves once answered". A reply lost on the way is neither.
    expect(seen?.answeredSince !== 0 || seen?.aborted === true).toBe(true);
  });
});

describe('two Worker instances in one process on the same queue, replies lost', () => {
  it('every task runs once per attempt, one attempt each, one settlement each', async () => {
    const c = client(suite.server.url);
    const queue = 'two-workers';
    const ids: string[] = [];
    for (let i = 0; i < 16; i += 1)
      ids.push((await c.submit({ queue, program: 'p', data: i })).task_id);
    let n = 0;
    // Every third settle reply and every third acquire reply carrying a task is cut.
    const tap = await startTap(suite.server.url, (ex) => {
      if (isSettle(ex) || (isAcquire(ex) && ex.reply.includes('"assigned"'))) {
        n += 1;
        if (n % 3 === 0) return 'cut';
      }
      return 'pass';
    });
    const runs = new Map<string, number>();
    const pair = [0, 1].map(() => suite.worker(queue, { url: tap.url, concurrency: 2 }));
    for (const w of pair) {
      w.register('p', async (data, ctx) => {
        runs.set(ctx.attemptId, (runs.get(ctx.attemptId) ?? 0) + 1);
        await sleep(5);
        return data;
      });
    }
    const running = pair.map((w) => w.run());
    const results = await settled(c, ids);
    await Promise.all(pair.map((w) => w.stop()));
    await Promise.all(running);
    expect(n).toBeGreaterThan(6);
    results.forEach((r, i) => {
      expect(r.outcome).toEqual({ state: 'succeeded', output: i });
      expect(r.status.attempt_count).toBe(1);
    });
    expect([...runs.values()].every((k) => k === 1)).toBe(true);
    expect(runs.size).toBe(ids.length);
    for (const id of ids) {
      const events = await historyOf(c, id);
      expect([...perAttempt(events, 'report_accepted').values()]).toEqual([1]);
    }
  });
});

describe('a worker whose wall clock is skewed and stepped', () => {
  it('keeps its lease and settles once: no lease decision reads the wall clock', async () => {
    const c = client(suite.server.url);
    const queue = 'skewed-worker';
    const task = await c.submit({ queue, program: 'p', data: null });
    const realNow = Date.now;
    // Three hours behind from the start, stepped another hour back while the handler runs.
    let offset = -3 * 3_600_000;
    Date.now = () => realNow() + offset;
    try {
      const w = suite.worker(queue);
      let aborted: unknown;
      w.register('p', async (_data, ctx) => {
        await sleep(800);
        offset -= 3_600_000;
        await sleep(1_700);
        aborted = ctx.signal.aborted ? ctx.signal.reason : undefined;
        return 'kept';
      });
      const running = w.run();
      const [result] = await settled(c, [task.task_id]);
      await w.stop();
      await running;
      expect(aborted).toBeUndefined();
      expect(result?.outcome).toEqual({ state: 'succeeded', output: 'kept' });
      expect(result?.status.attempt_count).toBe(1);
      expect(reasons(await historyOf(c, task.task_id))).not.toContain('lease_expired');
    } finally {
      Date.now = realNow;
    }
  });
});
