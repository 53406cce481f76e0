/**
 * Store time is the clock (DESIGN §1.2), also for `webhook-timestamp` (DESIGN §8): a receiver
 * following Standard Webhooks refuses a timestamp more than 5 minutes from its own clock, so a
 * sender replica whose process clock is off by more than that would have every try refused
 * until the delivery exhausts. These tests run a real server process whose `Date` is offset
 * (a preloaded module, test/skewed-clock.ts) against the real PostgreSQL and a real
 * receiver that enforces the 5-minute tolerance against a correct clock.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { client, Stack, until } from './test/harness.js';
import { skewedClocks } from './test/skewed-clock.js';

const MINUTE = 60_000;
/** Standard Webhooks' default timestamp tolerance, in seconds. */
const TOLERANCE_S = 300;
const SECRET_BYTES = Buffer.alloc(32, 21);
const SECRET = `whsec_${SECRET_BYTES.toString('base64')}`;

const clocks = skewedClocks();

/** One POST as the receiver saw it, and what it answered. */
interface Post {
  id: string;
  timestampS: number;
  /** The receiver's own clock (the real one) when the POST arrived, in unix seconds. */
  receivedS: number;
  status: number;
}

/**
 * A Standard Webhooks receiver: the signature must verify over `id.timestamp.body` and the
 * timestamp must lie within TOLERANCE_S of the receiver's clock (the replay protection every
 * Standard Webhooks library applies), else it answers 400, as a verifier's failure would.
 */
async function startStrictReceiver() {
  const posts: Post[] = [];
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const receivedS = Math.floor(Date.now() / 1000);
      const body = Buffer.concat(chunks);
      const timestampS = Number(request.headers['webhook-timestamp']);
      const ok =
        signatureValid(request.headers, body) && Math.abs(receivedS - timestampS) <= TOLERANCE_S;
      const status = ok ? 204 : 400;
      posts.push({ id: String(request.headers['webhook-id']), timestampS, receivedS, status });
      response.writeHead(status).end();
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

function signatureValid(headers: IncomingHttpHeaders, body: Buffer): boolean {
  const id = String(headers['webhook-id']);
  const timestamp = String(headers['webhook-timestamp']);
  const expected = createHmac('sha256', SECRET_BYTES)
    .update(`${id}.${timestamp}.`)
    .update(body)
    .digest();
  return String(headers['webhook-signature'])
    .split(' ')
    .some((entry) => {
      const [version, signature] = entry.split(',');
      const given = Buffer.from(signature ?? '', 'base64');
      return (
        version === 'v1' && given.length === expected.length && timingSafeEqual(given, expected)
      );
    });
}

const stack = new Stack('cb_clock_skew');
const receivers: { close(): Promise<void> }[] = [];
let db: PostgresTaskStore;

beforeAll(async () => {
  await stack.open();
  db = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
});
afterEach(async () => {
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
  await Promise.all(receivers.splice(0).map((r) => r.close()));
});
afterAll(async () => {
  await db?.close();
  await stack.close();
});

describe('a sender replica whose process clock is off by more than a receiver tolerates', () => {
  for (const [label, offsetMs] of [
    ['10 minutes fast', 10 * MINUTE],
    ['10 minutes slow', -10 * MINUTE],
  ] as const) {
    it(`signs webhook-timestamp with store time (process clock ${label}): delivered at the first try`, async () => {
      const receiver = await startStrictReceiver();
      receivers.push(receiver);
      const server = await stack.start({
        ...clocks.env(offsetMs),
        LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
          billing: { url: receiver.url, secret: SECRET, timeout_ms: 2_000 },
        }),
        LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      });
      // The skew is in effect in the server process.
      const reading = clocks.reading(server);
      expect(Math.abs(reading - offsetMs - (await db.now()))).toBeLessThan(MINUTE);

      const c = client(server.url);
      const task = await c.submit({
        queue: `cb-clock-${offsetMs}`,
        program: 'never-run',
        data: {},
      });
      const subscription = await c.subscribe(task.task_id, { destination: 'billing' });
      // Cancelling the queued task makes it terminal: the delivery is due at once.
      await c.cancel(task.task_id);
      // Only this test's event (an earlier test's undelivered one may be posted here too).
      const mine = () => receiver.posts.filter((p) => p.id === subscription.event_id);
      await until(() => mine().length > 0, 30_000, 'the first POST');

      const first = mine()[0] as Post;
      // The timestamp is the store's clock (this process's and PostgreSQL's agree), not the
      // sender process's: within a few seconds of when the receiver got it.
      expect(Math.abs(first.timestampS - first.receivedS)).toBeLessThanOrEqual(5);
      expect(first.status).toBe(204);
      await until(
        async () => (await c.subscriptions(task.task_id))[0]?.state === 'delivered',
        30_000,
        'delivered',
      );
      const [view] = await c.subscriptions(task.task_id);
      expect(view).toMatchObject({ state: 'delivered', attempts: 1, last_status_code: 204 });
    });
  }
});

describe('a Retry-After HTTP-date from a receiver, at a sender replica whose clock is wrong', () => {
  it('is read against store time: the retry waits until that date (process clock 10 minutes fast)', async () => {
    const RETRY_AFTER_S = 60;
    const posts: { id: string; retryAt: number }[] = [];
    // Answers 503 asking for a retry at a date 60 s ahead of the receiver's (correct) clock.
    const server: Server = createServer((request, response) => {
      request.resume();
      request.on('end', () => {
        const retryAt = (Math.floor(Date.now() / 1000) + RETRY_AFTER_S) * 1000;
        posts.push({ id: String(request.headers['webhook-id']), retryAt });
        response.writeHead(503, { 'retry-after': new Date(retryAt).toUTCString() }).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    receivers.push({
      close: () =>
        new Promise<void>((resolve) => {
          server.closeAllConnections();
          server.close(() => resolve());
        }),
    });
    const { port } = server.address() as AddressInfo;
    const sender = await stack.start({
      ...clocks.env(10 * MINUTE),
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        later: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, timeout_ms: 2_000 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    });
    const c = client(sender.url);
    const task = await c.submit({ queue: 'cb-retry-after', program: 'never-run', data: {} });
    const subscription = await c.subscribe(task.task_id, { destination: 'later' });
    await c.cancel(task.task_id);
    const mine = () => posts.filter((p) => p.id === subscription.event_id);
    await until(() => mine().length > 0, 30_000, 'the first POST');
    await until(
      async () => (await c.subscriptions(task.task_id))[0]?.state === 'due',
      30_000,
      'the failed try recorded',
    );
    const [view] = await c.subscriptions(task.task_id);
    const asked = (mine()[0] as { retryAt: number }).retryAt;
    expect(view).toMatchObject({ state: 'due', attempts: 1, last_status_code: 503 });
    // Due at the date the receiver named (store and receiver clocks agree), not at once: a
    // replica 10 minutes fast would read that date as 9 minutes past and retry immediately.
    expect(view?.next_attempt_at).toBeGreaterThanOrEqual(asked - 2_000);
    expect(view?.next_attempt_at).toBeLessThanOrEqual(asked + 2_000);
    expect(mine()).toHaveLength(1);
  });
});
