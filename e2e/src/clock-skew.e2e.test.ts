/**
 * Store time is the clock (DESIGN §1.2): no decision depends on a Node process clock. These tests
 * run real server processes whose process clock is wrong — preloaded with a module that offsets
 * `Date` and `Date.now` (and can step it while the server runs, as NTP does to a machine whose
 * clock drifted) — against the real PostgreSQL, and check that the server still follows store
 * time: long-poll and result waits last what they asked for, leases expire, retries fall due,
 * sessions expire, retention keeps what is young and callbacks are redelivered on the store's
 * schedule, with two replicas whose clocks disagree by three hours.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { WorkerSession } from '@ledgence/contracts';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { ApplicationError, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  client,
  historyOf,
  NAMESPACE,
  Stack,
  settled,
  shortWorker,
  TENANT,
  until,
} from './test/harness.js';
import { skewedClocks } from './test/skewed-clock.js';

const HOUR = 3_600_000;
const scope = { tenant_id: TENANT, namespace: NAMESPACE };
const base = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;

const clocks = skewedClocks();

interface Reply {
  status: number;
  // biome-ignore lint/suspicious/noExplicitAny: replies of several routes, read field by field
  body: any;
}

async function call(url: string, method: string, path: string, body?: unknown): Promise<Reply> {
  const response = await fetch(new URL(path, url), {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    // A bound on the test, far above every wait asked for below.
    signal: AbortSignal.timeout(60_000),
  });
  const text = await response.text();
  return { status: response.status, body: text === '' ? null : JSON.parse(text) };
}

async function openSession(url: string, queue: string): Promise<WorkerSession> {
  const reply = await call(url, 'POST', '/v1/worker/sessions', { scope, queue, concurrency: 1 });
  expect(reply.status).toBe(200);
  return reply.body as WorkerSession;
}

function poll(session: WorkerSession, sequence: number) {
  return {
    scope,
    queue: session.queue,
    worker_session_id: session.id,
    consumer_id: 0,
    sequence,
  };
}

/** A rejected promise after `ms`, to race a request that should have ended long before. */
function overdue(ms: number, what: string): Promise<never> {
  return new Promise((_, reject) => {
    setTimeout(() => reject(new Error(`${what} still pending after ${ms} ms`)), ms).unref();
  });
}

const stack = new Stack('clock_skew');
const workers: Worker[] = [];
let db: PostgresTaskStore;

beforeAll(async () => {
  await stack.open();
  db = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
});
afterAll(async () => {
  await db?.close();
  await stack.close();
});

/** The database's clock, in ms since the epoch. */
async function storeNow(): Promise<number> {
  return db.now();
}

describe('a process clock stepped while a wait is parked', () => {
  const WAIT_MS = 2_000;
  const timings = {
    LEDGENCE_LONG_POLL_WAIT_MS: String(WAIT_MS),
    LEDGENCE_RESCAN_INTERVAL_MS: '200',
  };

  it('an acquire long poll still ends when its wait_ms is over, answered empty', async () => {
    const server = await stack.start({ ...timings, ...clocks.env(0, -HOUR) });
    const session = await openSession(server.url, 'step-acquire');
    const parked = call(
      server.url,
      'POST',
      `/v1/worker/acquire?wait_ms=${WAIT_MS}`,
      poll(session, 1),
    );
    // Should it never end, the server's kill in afterEach fails it: not an unhandled rejection.
    parked.catch(() => undefined);
    // The poll is parked (nothing is queued) when the clock steps back an hour.
    await new Promise((resolve) => setTimeout(resolve, 300));
    await clocks.step(server);
    const reply = await Promise.race([parked, overdue(WAIT_MS + 10_000, 'the long poll')]);
    expect(reply).toEqual({ status: 200, body: { disposition: 'empty', sequence: 1 } });
  });

  it('a clock stepped forward does not end an acquire long poll before its wait_ms', async () => {
    const server = await stack.start({ ...timings, ...clocks.env(0, HOUR) });
    const session = await openSession(server.url, 'step-forward');
    const began = performance.now();
    const parked = call(
      server.url,
      'POST',
      `/v1/worker/acquire?wait_ms=${WAIT_MS}`,
      poll(session, 1),
    );
    parked.catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 300));
    await clocks.step(server);
    const reply = await parked;
    const waited = performance.now() - began;
    expect(reply).toEqual({ status: 200, body: { disposition: 'empty', sequence: 1 } });
    // Answered empty after the wait it asked for (less a timer's slack), not at the step.
    expect(waited).toBeGreaterThanOrEqual(WAIT_MS - 50);
  });

  it('a result wait still ends when its wait_ms is over, answered pending', async () => {
    const server = await stack.start({ ...timings, ...clocks.env(0, -HOUR) });
    const c = client(server.url);
    const task = await c.submit({ queue: 'step-result', program: 'noop', data: {} });
    const parked = call(
      server.url,
      'GET',
      `${base}/tasks/${task.task_id}/result?wait_ms=${WAIT_MS}`,
    );
    parked.catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 300));
    await clocks.step(server);
    const reply = await Promise.race([parked, overdue(WAIT_MS + 10_000, 'the result wait')]);
    expect(reply.status).toBe(200);
    expect(reply.body.outcome).toEqual({ state: 'pending' });
  });
});

/** A local receiver that answers a webhook id's first POST 500 and later ones 200. */
async function startFlakyReceiver() {
  const posts: { id: string; atMs: number }[] = [];
  const server: Server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      const id = String(request.headers['webhook-id']);
      const seen = posts.filter((p) => p.id === id).length;
      posts.push({ id, atMs: performance.now() });
      response.writeHead(seen === 0 ? 500 : 200).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    posts,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The value of a label-less counter in a server's /metrics text. */
async function counter(url: string, name: string): Promise<number> {
  const text = await (await fetch(new URL('/metrics', url))).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? 0 : Number(line.slice(name.length + 1));
}

describe('two replicas whose process clocks are 3 hours apart (+2 h and −1 h)', () => {
  it('lease expiry, retry delay, session expiry, retention and callback redelivery follow store time', async () => {
    const receiver = await startFlakyReceiver();
    const SESSION_MS = 4_000;
    const RETRY_DELAY_MS = 1_000;
    const env = {
      LEDGENCE_SESSION_VALIDITY_MS: String(SESSION_MS),
      // The shortest retention: a replica deciding on a clock 2 h fast would collect at once.
      LEDGENCE_TERMINAL_RETENTION_MS: String(HOUR),
      LEDGENCE_RETENTION_INTERVAL_MS: '100',
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: {
          url: receiver.url,
          secret: `whsec_${Buffer.alloc(32, 9).toString('base64')}`,
          timeout_ms: 2_000,
        },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '200',
    };
    try {
      const fast = await stack.start({ ...env, ...clocks.env(2 * HOUR) });
      const slow = await stack.start({ ...env, ...clocks.env(-HOUR) });
      // The skew is in effect in each server process.
      const now = await storeNow();
      expect(Math.abs(clocks.reading(fast) - 2 * HOUR - now)).toBeLessThan(120_000);
      expect(Math.abs(clocks.reading(slow) + HOUR - now)).toBeLessThan(120_000);
      const cf = client(fast.url);
      const cs = client(slow.url);
      const began = await storeNow();

      // Session expiry: opened on the slow replica, still live on the fast one, then expired.
      const session = await openSession(slow.url, 'skew-expire');
      const opened = await storeNow();
      expect(session.expires_at).toBeGreaterThanOrEqual(began + SESSION_MS);
      expect(session.expires_at).toBeLessThanOrEqual(opened + SESSION_MS);

      // Lease expiry: claimed on the fast replica (1 s lease) and never renewed; a worker on
      // the slow replica gets it after recovery.
      const expiring = await cf.submit({ queue: 'skew-expire', program: 'ok', data: {} });
      const claim = await call(fast.url, 'POST', '/v1/worker/acquire', poll(session, 1));
      expect(claim.body.disposition).toBe('assigned');

      // A retry delay: the first attempt fails retryably, on whichever replica claims it.
      const retried = await cs.submit({
        queue: 'skew-retry',
        program: 'flaky',
        data: {},
        retry: { max_attempts: 3, delay_ms: RETRY_DELAY_MS },
      });
      await cs.subscribe(retried.task_id, { destination: 'billing' });
      let flakyRuns = 0;
      for (const url of [fast.url, slow.url]) {
        const w = shortWorker(url, 'skew-retry');
        w.register('flaky', () => {
          flakyRuns += 1;
          if (flakyRuns === 1)
            throw new ApplicationError('again', 'try again', { retryable: true });
          return 'done';
        });
        workers.push(w);
        void w.run();
      }

      // The session expires by store time: a poll on the fast replica (2 h ahead) was assigned
      // above, and is refused only once the store's clock passed expires_at.
      await until(async () => (await storeNow()) > session.expires_at + 50, 20_000, 'expiry');
      const late = await call(fast.url, 'POST', '/v1/worker/acquire', poll(session, 2));
      expect(late.status).toBe(410);

      const w = shortWorker(slow.url, 'skew-expire');
      w.register('ok', () => 'ok');
      workers.push(w);
      void w.run();

      const [expired, again] = await settled(cs, [expiring.task_id, retried.task_id]);
      expect(expired?.outcome).toMatchObject({ state: 'succeeded' });
      expect(again?.outcome).toMatchObject({ state: 'succeeded', output: 'done' });

      const expiringHistory = await historyOf(cf, expiring.task_id);
      const claimedAt = expiringHistory.find((e) => e.event.reason === 'claimed')?.event.at;
      const expiredAt = expiringHistory.find((e) => e.event.reason === 'lease_expired')?.event.at;
      expect(claimedAt).toBeDefined();
      expect(expiredAt).toBeDefined();
      // Lease 1 s, recovered every 100 ms: not before the lease ran out, nor an hour late.
      expect((expiredAt as number) - (claimedAt as number)).toBeGreaterThanOrEqual(1_000);
      expect((expiredAt as number) - (claimedAt as number)).toBeLessThan(15_000);

      const retryHistory = await historyOf(cs, retried.task_id);
      const scheduled = retryHistory.find((e) => e.event.reason === 'retry_scheduled')?.event.at;
      const claims = retryHistory
        .filter((e) => e.event.reason === 'claimed')
        .map((e) => e.event.at);
      expect(scheduled).toBeDefined();
      expect(claims).toHaveLength(2);
      expect((claims[1] as number) - (scheduled as number)).toBeGreaterThanOrEqual(RETRY_DELAY_MS);
      expect((claims[1] as number) - (scheduled as number)).toBeLessThan(15_000);

      // Callback redelivery: the first POST failed (500); the retry is due within the backoff.
      await until(
        async () => (await cf.subscriptions(retried.task_id))[0]?.state === 'delivered',
        30_000,
        'the redelivery',
      );
      expect(receiver.posts).toHaveLength(2);

      // Retention rounds on both replicas ran and kept both terminal tasks: they are seconds old
      // in store time, under the 1 h retention (a round with nothing due commits nothing).
      const roundsBefore = await counter(fast.url, 'ledgence_retention_rounds_total');
      await until(
        async () =>
          (await counter(fast.url, 'ledgence_retention_rounds_total')) >= roundsBefore + 5 &&
          (await counter(slow.url, 'ledgence_retention_rounds_total')) >= 5,
        30_000,
        'retention rounds on both replicas',
      );
      expect((await cf.status(expiring.task_id)).task_id).toBe(expiring.task_id);
      expect((await cs.status(retried.task_id)).task_id).toBe(retried.task_id);

      // Every time the server recorded is store time: between the first and last reading.
      const ended = await storeNow();
      for (const { event } of [...expiringHistory, ...retryHistory]) {
        expect(event.at).toBeGreaterThanOrEqual(began);
        expect(event.at).toBeLessThanOrEqual(ended);
      }
    } finally {
      await receiver.close();
    }
  });
});
