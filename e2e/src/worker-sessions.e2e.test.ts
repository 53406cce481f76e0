/**
 * The worker's session and poll protocol under server-side faults — a worker process paused
 * past its session, a server restarted on another database, refusals in every order — driven by
 * the real SDK against real server processes.
 */
import { ContractError, problemDocument } from '@ledgence/contracts';
import { createTestDatabase } from '@ledgence/store-postgres/testing';
import { Worker } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import { startServerProcess } from './server-process.js';
import {
  attemptIds,
  client,
  historyOf,
  portOf,
  reasons,
  settled,
  sleep,
  startHttpProxy,
  until,
  workerSuite,
} from './test/harness.js';

// Sessions of 2 s: under what a one-second `Date` can show (session.ts), so a worker whose own
// extension period is long loses its first session. Leases of 1 s (short timings).
const suite = workerSuite('worker_sessions', {
  LEDGENCE_SESSION_VALIDITY_MS: '2000',
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
});

describe('a worker process paused past its session', () => {
  it('held tasks keep their leases and settle once; the worker moves to a new session and runs the rest', async () => {
    // Sessions of 6 s (the worker learns them from Date and extends every ~1.7 s), leases of
    // 20 s: a pause of 8 s outlives the session but not the leases.
    const server = await suite.stack.start({
      LEDGENCE_SESSION_VALIDITY_MS: '6000',
      LEDGENCE_LEASE_DURATION_MS: '20000',
      LEDGENCE_RENEW_INTERVAL_MS: '250',
    });
    const { startWorkerProcess } = await import('./test/worker-process.js');
    const c = client(server.url);
    const queue = 'paused-worker';
    const first = [];
    for (let i = 0; i < 4; i += 1) {
      first.push((await c.submit({ queue, program: 'job', data: { i, ms: 3_000 } })).task_id);
    }
    const proc = await startWorkerProcess('paused', server.url, queue, { CONCURRENCY: '4' });
    try {
      await until(() => proc.lines.filter((l) => l.event === 'start').length >= 4, 20_000);
      proc.child.kill('SIGSTOP');
      await sleep(8_000);
      proc.child.kill('SIGCONT');
      const rest = [];
      for (let i = 4; i < 10; i += 1) {
        rest.push((await c.submit({ queue, program: 'job', data: { i, ms: 20 } })).task_id);
      }
      const results = await settled(c, [...first, ...rest], 40_000);
      for (const r of results) {
        expect(r.outcome.state).toBe('succeeded');
        expect(r.status.attempt_count).toBe(1);
      }
      const starts = new Map<string, number>();
      for (const l of proc.lines) {
        if (l.event === 'start')
          starts.set(l.task_id ?? '', (starts.get(l.task_id ?? '') ?? 0) + 1);
      }
      for (const id of [...first, ...rest]) expect(starts.get(id)).toBe(1);
      for (const id of [...first, ...rest]) {
        const rs = reasons(await historyOf(c, id));
        expect(rs.filter((x) => x === 'report_accepted')).toHaveLength(1);
        expect(rs).not.toContain('lease_expired');
      }
      // The tasks submitted after the pause ran on another session than those held across it.
      const sessionOf = async (id: string) => {
        const [attemptId] = attemptIds(await historyOf(c, id));
        const attempt = await c.attempt(id, attemptId as string);
        return attempt.lease.owner.worker_session_id;
      };
      expect(await sessionOf(rest[0] as string)).not.toBe(await sessionOf(first[0] as string));
    } finally {
      expect(await proc.stop('SIGTERM')).toBe(0);
    }
    expect(proc.stderr()).not.toMatch(/ error /);
  });
});

describe('a server restarted on another database', () => {
  it('the worker drops what it held, opens a session on the new server and runs its tasks; run() does not reject', async () => {
    const dbA = await createTestDatabase({ prefix: 'worker_sessions_a' });
    const dbB = await createTestDatabase({ prefix: 'worker_sessions_b' });
    const env = {
      LEDGENCE_LEASE_DURATION_MS: '1000',
      LEDGENCE_RENEW_INTERVAL_MS: '250',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '100',
      LEDGENCE_RESCAN_INTERVAL_MS: '100',
      LEDGENCE_LONG_POLL_WAIT_MS: '1000',
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '1000',
    };
    const a = await startServerProcess({ DATABASE_URL: dbA.url, ...env });
    let b: Awaited<ReturnType<typeof startServerProcess>> | undefined;
    const queue = 'other-db';
    const starts = new Map<string, number>();
    let aborted = 0;
    const w = suite.worker(queue, { url: a.url, concurrency: 4 });
    w.register('hold', async (_data, ctx) => {
      starts.set(ctx.taskId, (starts.get(ctx.taskId) ?? 0) + 1);
      await new Promise<void>((resolve) => {
        if (ctx.signal.aborted) resolve();
        ctx.signal.addEventListener('abort', () => resolve(), { once: true });
      });
      aborted += 1;
      throw ctx.signal.reason;
    });
    w.register('job', (_data, ctx) => {
      starts.set(ctx.taskId, (starts.get(ctx.taskId) ?? 0) + 1);
      return 'ok';
    });
    let rejected: unknown;
    const run = w.run().catch((error: unknown) => {
      rejected = error;
    });
    try {
      const ca = client(a.url);
      await ca.submit({ queue, program: 'hold', data: null });
      await until(() => starts.size === 1, 20_000);
      await a.stop('SIGKILL');
      b = await startServerProcess({ DATABASE_URL: dbB.url, ...env, PORT: portOf(a.url) });
      const cb = client(b.url);
      const ids = [];
      for (let i = 0; i < 6; i += 1) {
        ids.push((await cb.submit({ queue, program: 'job', data: i })).task_id);
      }
      const results = await settled(cb, ids, 30_000);
      for (const r of results) expect(r.outcome.state).toBe('succeeded');
      for (const id of ids) expect(starts.get(id)).toBe(1);
      // The held task's lease is unknown to the new server: its handler is aborted.
      await until(() => aborted === 1, 10_000);
      expect(rejected).toBeUndefined();
    } finally {
      await w.stop({ graceMs: 1_000 });
      await run;
      await b?.stop('SIGKILL');
      await a.stop('SIGKILL');
      await dbA.drop();
      await dbB.drop();
    }
    expect(rejected).toBeUndefined();
  });
});

describe('polls refused in every order', () => {
  it('session_not_found, consumer_busy and sequence_conflict in rotation: no hot loop, and the worker converges', async () => {
    const c = client(suite.server.url);
    const queue = 'refusal-rotation';
    const codes = ['session_not_found', 'consumer_busy', 'sequence_conflict', 'consumer_busy'];
    let faulting = true;
    let refused = 0;
    let opens = 0;
    const refusedAt: number[] = [];
    const proxy = await startHttpProxy(suite.server.url, {
      observe: (request) => {
        if (request.path.startsWith('/v1/worker/sessions') && !request.path.includes('extend')) {
          opens += 1;
        }
        return undefined;
      },
      answer: (request) => {
        if (!faulting || !request.path.startsWith('/v1/worker/acquire')) return undefined;
        const { commands } = JSON.parse(request.body.toString('utf8')) as { commands: unknown[] };
        const code = codes[refused % codes.length] as 'consumer_busy';
        refused += 1;
        refusedAt.push(Date.now());
        const problem = problemDocument(new ContractError(code, `refused by the test proxy`));
        return {
          status: 200,
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ replies: commands.map(() => problem) }),
        };
      },
    });
    suite.proxies.push(proxy);
    // The SDK's default backoff (100 ms doubling to 5 s).
    const w = new Worker({
      url: proxy.url,
      tenant: 'acme',
      namespace: 'e2e',
      queue,
      concurrency: 8,
      pollWaitMs: 500,
      renewIntervalMs: 250,
      logger: { debug() {}, info() {}, warn() {}, error() {} },
    });
    suite.workers.push(w);
    w.register('job', () => 'ok');
    let rejected: unknown;
    const run = w.run().catch((error: unknown) => {
      rejected = error;
    });
    const t0 = Date.now();
    await sleep(6_000);
    const perSecond = [0, 0, 0, 0, 0, 0, 0];
    for (const t of refusedAt) {
      const second = Math.min(6, Math.floor((t - t0) / 1000));
      perSecond[second] = (perSecond[second] ?? 0) + 1;
    }
    const refusedRequests = refused;
    const sessionOpens = opens;
    faulting = false;
    const task = await c.submit({ queue, program: 'job', data: null });
    const [result] = await settled(c, [task.task_id], 20_000);
    await w.stop({ graceMs: 1_000 });
    await run;
    expect(rejected).toBeUndefined();
    expect(result?.outcome.state).toBe('succeeded');
    // Backing off from 100 ms to 5 s: a few dozen refused requests in 6 s, never hundreds.
    expect(refusedRequests).toBeGreaterThan(2);
    expect(refusedRequests).toBeLessThan(60);
    expect(sessionOpens).toBeLessThan(40);
    // Converging: the last seconds see fewer refusals than the first.
    expect((perSecond[4] ?? 0) + (perSecond[5] ?? 0)).toBeLessThan(
      (perSecond[0] ?? 0) + (perSecond[1] ?? 0),
    );
  });
});
