/**
 * The `Worker`'s retry loops honour `Retry-After`, over real sockets: a small `node:http` server
 * speaks the worker routes (sessions, acquire, renew, settle, quiescence) with valid contract
 * replies, and answers one request of the route under test with a 429/503 carrying the header,
 * as a rate limiter or gateway in front of the server would. The wait is measured at the server,
 * between the failed request and the one sent again. A renewal honours the header only as far as
 * its lease allows: the lease is never lost to it.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AcquireCommand, LeaseOwner, RenewCommand, SettleCommand } from '@ledgence/contracts';
import { afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from './logger.js';
import { stubServers } from './testdata/stub-servers.js';
import { type TaskContext, Worker } from './worker.js';

/** See client-retry-after.e2e.test.ts: a timer may end a few ms early by the server's clock. */
const SLACK_MS = 25;

const scope = { tenant_id: 'acme', namespace: 'prod' };

const stubs = stubServers();
const workers: Worker[] = [];
// Registered after the servers' teardown, so it runs first: workers stop, then servers close.
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.stop({ graceMs: 0 })));
});

type Route = 'sessions' | 'acquire' | 'renew' | 'settle' | 'quiescence';

/** A reply the test puts in place of the stub's own: a rate limiter's or a gateway's. */
interface Refusal {
  status: number;
  headers: Record<string, string>;
  body?: string;
}

interface StubOptions {
  /** Replaces the reply to the `index`-th request (0-based) of `route`, when it returns one. */
  refuse?: (route: Route, index: number, body: string) => Refusal | undefined;
  /** The lease time each assignment and renewal grants. */
  leaseMs?: number;
  /** The execution budget each renewal grants. */
  budgetMs?: number;
  /** Called with each keep-alive renewal the stub answered with an authority. */
  onKeptAlive?: () => void;
}

interface Stub {
  url: string;
  /** Monotonic arrival times of each route's requests. */
  arrivals: Record<Route, number[]>;
  /** The bodies of the renewals received, in order. */
  renewals: RenewCommand[];
  /** The settlements answered as accepted. */
  settled: SettleCommand[];
}

/**
 * A stand-in server with one task (`tsk_1`, program `p`) for consumer 0's first poll; every
 * other poll is parked for its `wait_ms` and answered `empty`.
 */
async function workerServer(options: StubOptions = {}): Promise<Stub> {
  const leaseMs = options.leaseMs ?? 60_000;
  const budgetMs = options.budgetMs ?? 60_000;
  const stub: Stub = {
    url: '',
    arrivals: { sessions: [], acquire: [], renew: [], settle: [], quiescence: [] },
    renewals: [],
    settled: [],
  };
  let assigned = false;
  const json = (res: ServerResponse, status: number, value: unknown) =>
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));
  const authority = (owner: LeaseOwner, sequence: number) => ({
    owner,
    expires_at: Date.now() + leaseMs,
    remaining_ms: leaseMs,
    execution_remaining_ms: budgetMs,
    renew_sequence: sequence,
    cancel_requested: false,
    dispatch_allowed: sequence > 0,
  });
  const assignment = (command: AcquireCommand) => {
    const owner: LeaseOwner = {
      scope,
      task_id: 'tsk_1',
      attempt_id: 'att_1',
      lease_id: 'lse_1',
      generation: 1,
      worker_session_id: command.worker_session_id,
      consumer_id: command.consumer_id,
    };
    return {
      descriptor: { name: 'p' },
      event: {
        specversion: '1.0',
        id: 'att_1',
        source: '/v1/tenants/acme/namespaces/prod/queues/q',
        type: 'dev.ledgence.task.attempt',
        time: new Date().toISOString(),
        datacontenttype: 'application/json',
        data: null,
        ldgtenant: 'acme',
        ldgnamespace: 'prod',
        ldgqueue: 'q',
        ldgtaskid: 'tsk_1',
        ldgrunid: 'run_1',
        ldgattemptid: 'att_1',
        ldgattempt: 1,
      },
      lease: { owner, expires_at: Date.now() + leaseMs },
      authority: authority(owner, 0),
      attempt_deadline: Date.now() + budgetMs,
    };
  };
  const answer = (route: Route, req: IncomingMessage, res: ServerResponse, body: string) => {
    const request = body === '' ? {} : (JSON.parse(body) as Record<string, unknown>);
    switch (route) {
      case 'sessions':
        return json(res, 201, {
          id: 'ses_1',
          scope,
          queue: 'q',
          concurrency: 1,
          expires_at: Date.now() + 300_000,
        });
      case 'acquire': {
        const commands = request.commands as AcquireCommand[];
        const wait = Number(new URL(req.url ?? '', 'http://x').searchParams.get('wait_ms') ?? 0);
        const first = commands[0];
        if (!assigned && first !== undefined && first.sequence === 1) {
          assigned = true;
          return json(res, 200, {
            replies: commands.map((command) =>
              command === first
                ? { disposition: 'assigned', sequence: 1, assignment: assignment(command) }
                : { disposition: 'empty', sequence: command.sequence },
            ),
          });
        }
        const timer = setTimeout(
          () =>
            json(res, 200, {
              replies: commands.map((c) => ({ disposition: 'empty', sequence: c.sequence })),
            }),
          wait,
        );
        res.on('close', () => clearTimeout(timer));
        return;
      }
      case 'renew': {
        const commands = request.commands as RenewCommand[];
        stub.renewals.push(...commands);
        json(res, 200, { results: commands.map((c) => authority(c.owner, c.sequence)) });
        if (commands.some((c) => c.intent === 'keep_alive')) options.onKeptAlive?.();
        return;
      }
      case 'settle': {
        const commands = request.commands as SettleCommand[];
        stub.settled.push(...commands);
        return json(res, 200, {
          results: commands.map((c) => ({
            receipt: {
              operation_id: c.operation_id,
              task_id: c.owner.task_id,
              attempt_id: c.owner.attempt_id,
              accepted_at: Date.now(),
            },
            already_accepted: false,
            task_state: c.quiescence === 'confirmed' ? 'succeeded' : 'active',
          })),
        });
      }
      case 'quiescence':
        return json(res, 200, { task_state: 'failed' });
    }
  };
  const routeOf = (path: string): Route | undefined => {
    if (path === '/v1/worker/sessions') return 'sessions';
    if (path === '/v1/worker/acquire:batch') return 'acquire';
    if (path === '/v1/worker/renew:batch') return 'renew';
    if (path === '/v1/worker/settle:batch') return 'settle';
    if (path === '/v1/worker/quiescence') return 'quiescence';
    return undefined;
  };
  stub.url = await stubs.serve((req, res, body) => {
    const route = routeOf(new URL(req.url ?? '', 'http://x').pathname);
    if (route === undefined) {
      // Session extensions and anything else: a period of 100 s is never reached here.
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not here');
      return;
    }
    const index = stub.arrivals[route].push(performance.now()) - 1;
    const refusal = options.refuse?.(route, index, body);
    if (refusal !== undefined) {
      res.writeHead(refusal.status, refusal.headers).end(refusal.body ?? 'slow down');
      return;
    }
    answer(route, req, res, body);
  });
  return stub;
}

function workerOf(url: string, extra: Partial<ConstructorParameters<typeof Worker>[0]> = {}) {
  const worker = new Worker({
    url,
    tenant: 'acme',
    namespace: 'prod',
    queue: 'q',
    concurrency: 1,
    logger: silentLogger,
    pollWaitMs: 100,
    renewIntervalMs: 30_000,
    sessionExtendIntervalMs: 100_000,
    backoff: { baseMs: 5, maxMs: 2_000 },
    ...extra,
  });
  workers.push(worker);
  return worker;
}

/** Resolves once `check` holds, polling every 10 ms. */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 10));
}

/** The gap between request `index` and the next one of `route`. */
function gapAfter(stub: Stub, route: Route, index = 0): number {
  const times = stub.arrivals[route];
  return (times[index + 1] ?? Number.NaN) - (times[index] ?? Number.NaN);
}

const rateLimited = (seconds: string): Refusal => ({
  status: 429,
  headers: { 'content-type': 'text/html', 'retry-after': seconds },
  body: '<html>too many requests</html>',
});

describe('the Worker waits out a Retry-After before sending again', () => {
  it('a session open answered 503 with Retry-After: 1', async () => {
    const stub = await workerServer({
      refuse: (route, index) =>
        route === 'sessions' && index === 0
          ? { status: 503, headers: { 'retry-after': '1' } }
          : undefined,
    });
    const worker = workerOf(stub.url).register('p', () => null);
    const running = worker.run();
    await until(() => stub.arrivals.acquire.length > 0);
    await worker.stop({ graceMs: 0 });
    await running;
    expect(gapAfter(stub, 'sessions')).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
  });

  it('a poll answered 429 with Retry-After: 1', async () => {
    const stub = await workerServer({
      refuse: (route, index) => (route === 'acquire' && index === 0 ? rateLimited('1') : undefined),
    });
    const worker = workerOf(stub.url).register('p', () => ({ ok: true }));
    const running = worker.run();
    await until(() => stub.settled.length > 0);
    await worker.stop({ graceMs: 0 });
    await running;
    // The poll sent again is the same one (its sequence stays pending): it gets the task.
    expect(gapAfter(stub, 'acquire')).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
    expect(stub.settled[0]?.report.kind).toBe('completed');
  });

  it("a settlement answered 503 with an HTTP-date Retry-After, read against the reply's Date", async () => {
    const stub = await workerServer({
      refuse: (route, index) => {
        if (route !== 'settle' || index !== 0) return undefined;
        const at = Math.floor(Date.now() / 1000) * 1000;
        return {
          status: 503,
          headers: {
            date: new Date(at).toUTCString(),
            'retry-after': new Date(at + 1_000).toUTCString(),
          },
        };
      },
    });
    const worker = workerOf(stub.url).register('p', () => ({ ok: true }));
    const running = worker.run();
    await until(() => stub.settled.length > 0);
    await worker.stop({ graceMs: 0 });
    await running;
    expect(stub.arrivals.settle).toHaveLength(2);
    expect(gapAfter(stub, 'settle')).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
  });

  it('a keep-alive renewal answered 429 with Retry-After: 1, its lease having a minute left', async () => {
    let keptAlive: () => void = () => {};
    const kept = new Promise<void>((resolve) => {
      keptAlive = resolve;
    });
    const stub = await workerServer({
      onKeptAlive: () => keptAlive(),
      // Request 0 is the dispatch renewal; request 1 the handler's heartbeat.
      refuse: (route, index) => (route === 'renew' && index === 1 ? rateLimited('1') : undefined),
    });
    const worker = workerOf(stub.url).register('p', async (_data, ctx: TaskContext) => {
      await ctx.heartbeat();
      await kept;
      return { ok: true };
    });
    const running = worker.run();
    await until(() => stub.settled.length > 0);
    await worker.stop({ graceMs: 0 });
    await running;
    expect(stub.renewals.map((r) => [r.sequence, r.intent])).toEqual([
      [1, 'dispatch'],
      [2, 'keep_alive'],
    ]);
    expect(gapAfter(stub, 'renew', 1)).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
  });

  it('a quiescence confirmation answered 503 with Retry-After: 1', async () => {
    const stub = await workerServer({
      // A budget this short is over before the handler returns: it is reported `unconfirmed`,
      // and its quiescence confirmed once it has returned.
      budgetMs: 100,
      refuse: (route, index) =>
        route === 'quiescence' && index === 0
          ? { status: 503, headers: { 'retry-after': '1' } }
          : undefined,
    });
    const worker = workerOf(stub.url, { abortGraceMs: 20 }).register('p', async () => {
      // Deaf to its signal: still running when the abort grace ends.
      await new Promise((resolve) => setTimeout(resolve, 300));
      return null;
    });
    const running = worker.run();
    await until(() => stub.arrivals.quiescence.length >= 2);
    await worker.stop({ graceMs: 0 });
    await running;
    expect(stub.settled[0]?.quiescence).toBe('unconfirmed');
    expect(gapAfter(stub, 'quiescence')).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
  });
});

describe("a renewal's Retry-After never costs its lease", () => {
  it('a lease of 2 s is renewed before it runs out, though the limiter asked for a minute', async () => {
    let keptAlive: () => void = () => {};
    const kept = new Promise<void>((resolve) => {
      keptAlive = resolve;
    });
    const stub = await workerServer({
      leaseMs: 2_000,
      onKeptAlive: () => keptAlive(),
      refuse: (route, index) => (route === 'renew' && index === 1 ? rateLimited('60') : undefined),
    });
    let aborted: unknown;
    const worker = workerOf(stub.url, { backoff: { baseMs: 5, maxMs: 10_000 } }).register(
      'p',
      async (_data, ctx: TaskContext) => {
        await ctx.heartbeat();
        await kept;
        aborted = ctx.signal.aborted ? ctx.signal.reason : undefined;
        return { ok: true };
      },
    );
    const running = worker.run();
    await until(() => stub.settled.length > 0);
    await worker.stop({ graceMs: 0 });
    await running;
    // Honoured as far as the lease allowed: the retry came at its due time (half the ~2 s it had
    // left), far later than the 5 ms backoff, far sooner than the minute asked.
    expect(gapAfter(stub, 'renew', 1)).toBeGreaterThanOrEqual(500);
    expect(aborted).toBeUndefined();
    expect(stub.settled[0]?.report).toMatchObject({
      kind: 'completed',
      report: { outcome: { kind: 'success' } },
    });
  });
});
