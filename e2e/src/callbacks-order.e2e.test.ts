/**
 * Completion callbacks: order, duplicates and limits (DESIGN §8, §12) against real server
 * processes on a real PostgreSQL and real receivers. Each event id is acknowledged (2xx) at
 * most once per generation, the event says what the task's terminal state is, and the limits
 * (MAX_COMPLETION_SUBSCRIPTIONS, COMPLETION_MAX_GENERATION, COMPLETION_MAX_ATTEMPTS,
 * COMPLETION_MAX_RETRY_DELAY_MS) hold at their edges.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  COMPLETION_MAX_ATTEMPTS,
  COMPLETION_MAX_GENERATION,
  COMPLETION_MAX_RETRY_DELAY_MS,
  MAX_COMPLETION_SUBSCRIPTIONS,
} from '@ledgence/contracts';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { ApplicationError, ProblemError, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { client, Stack, settled, shortWorker, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 3).toString('base64')}`;

interface Post {
  id: string;
  path: string;
  state: string;
  taskId: string;
  status: number;
}

/** A receiver recording each POST; `answer` picks the status, or 'hang' to hold it open. */
async function startReceiver(
  answer: (post: Omit<Post, 'status'>, seen: number) => number | 'hang' = () => 200,
) {
  const posts: Post[] = [];
  const hanging: ServerResponse[] = [];
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (c: Buffer) => chunks.push(c));
    request.on('end', () => {
      const event = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      const post = {
        id: String(request.headers['webhook-id']),
        path: request.url ?? '',
        state: String(event.data.state),
        taskId: String(event.data.task_id),
      };
      const seen = posts.filter((p) => p.id === post.id && p.path === post.path).length;
      const status = answer(post, seen);
      if (status === 'hang') {
        posts.push({ ...post, status: 0 });
        hanging.push(response);
        return;
      }
      posts.push({ ...post, status });
      response.writeHead(status).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const receiver = {
    origin: `http://127.0.0.1:${port}`,
    posts,
    hanging,
    /** 2xx answers per event id. */
    acknowledged: (id: string) =>
      posts.filter((p) => p.id === id && p.status >= 200 && p.status < 300).length,
    close: () =>
      new Promise<void>((resolve) => {
        for (const r of hanging) r.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  open.push(receiver);
  return receiver;
}

function destinationsEnv(urls: Record<string, string>, timeoutMs = 2_000) {
  return JSON.stringify(
    Object.fromEntries(
      Object.entries(urls).map(([alias, url]) => [
        alias,
        { url, secret: SECRET, timeout_ms: timeoutMs },
      ]),
    ),
  );
}

const stack = new Stack('cb_order');
const open: { close(): Promise<void> }[] = [];
const workers: Worker[] = [];
let db: PostgresTaskStore;

beforeAll(async () => {
  await stack.open();
  db = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  // Every sender serves the whole database: none may post this test's leftovers to the next.
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
  await Promise.all(open.splice(0).map((r) => r.close()));
});
afterAll(async () => {
  await db?.close();
  await stack.close();
});

async function expectProblem(call: Promise<unknown>, status: number, code: string, reason: string) {
  const error = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ProblemError);
  expect((error as ProblemError).problem).toMatchObject({ status, code, reason });
}

describe('several subscriptions on one task, two sender replicas', () => {
  it(`${MAX_COMPLETION_SUBSCRIPTIONS} subscriptions (one more refused), some after the end, one destination failing then recovering: each event acknowledged once, saying failed`, async () => {
    let failing = true;
    const good = await startReceiver();
    const flaky = await startReceiver(() => (failing ? 503 : 200));
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: destinationsEnv({
        good: `${good.origin}/good`,
        flaky: `${flaky.origin}/flaky`,
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '20',
    };
    const a = await stack.start(env);
    const b = await stack.start(env);
    const c = client(a.url);
    const task = await c.submit({ queue: 'cb-many-subs', program: 'fails', data: {} });
    const before = [];
    // Half before the task ends, alternating destinations.
    for (let i = 0; i < MAX_COMPLETION_SUBSCRIPTIONS / 2; i += 1) {
      before.push(
        await c.subscribe(task.task_id, {
          destination: i % 2 === 0 ? 'good' : 'flaky',
          subscriptionKey: `k${i}`,
        }),
      );
    }
    const w = shortWorker(b.url, 'cb-many-subs');
    w.register('fails', () => {
      throw new ApplicationError('nope', 'does not work', { retryable: false });
    });
    workers.push(w);
    void w.run();
    const [result] = await settled(c, [task.task_id]);
    expect(result?.outcome.state).toBe('failed');

    // The other half once the task is terminal (due at once), through the other replica.
    const cb = client(b.url);
    const after = [];
    for (let i = MAX_COMPLETION_SUBSCRIPTIONS / 2; i < MAX_COMPLETION_SUBSCRIPTIONS; i += 1) {
      after.push(
        await cb.subscribe(task.task_id, {
          destination: i % 2 === 0 ? 'good' : 'flaky',
          subscriptionKey: `k${i}`,
        }),
      );
    }
    // At the limit: a repeated key still answers its subscription; a new one is refused.
    const repeated = await cb.subscribe(task.task_id, {
      destination: 'good',
      subscriptionKey: 'k0',
    });
    expect(repeated.id).toBe(before[0]?.id);
    await expectProblem(
      cb.subscribe(task.task_id, { destination: 'good', subscriptionKey: 'one-more' }),
      409,
      'limit_exceeded',
      'max_completion_subscriptions',
    );
    const all = [...before, ...after];
    expect(new Set(all.map((s) => s.event_id)).size).toBe(MAX_COMPLETION_SUBSCRIPTIONS);

    // Every subscription to the flaky destination has had a failed try before it recovers.
    await until(
      () =>
        new Set(flaky.posts.filter((p) => p.status === 503).map((p) => p.id)).size ===
        all.filter((sub) => sub.destination === 'flaky').length,
      30_000,
      'a failed try of each subscription at the flaky destination',
    );
    failing = false;
    await until(
      async () => (await c.subscriptions(task.task_id)).every((s) => s.state === 'delivered'),
      60_000,
      'every subscription delivered',
    );
    const views = await c.subscriptions(task.task_id);
    expect(views).toHaveLength(MAX_COMPLETION_SUBSCRIPTIONS);
    for (const s of all) {
      const receiver = s.destination === 'good' ? good : flaky;
      expect(receiver.acknowledged(s.event_id)).toBe(1);
      // Never posted to the other destination.
      const other = s.destination === 'good' ? flaky : good;
      expect(other.posts.filter((p) => p.id === s.event_id)).toEqual([]);
    }
    for (const p of [...good.posts, ...flaky.posts]) {
      expect(p).toMatchObject({ state: 'failed', taskId: task.task_id });
    }
  });
});

describe('generations', () => {
  it(`redelivery up to generation ${COMPLETION_MAX_GENERATION}, each acknowledged once; a redelivery while a try is in flight is refused`, async () => {
    let hangFirst = true;
    const r = await startReceiver(() => {
      if (hangFirst) {
        hangFirst = false;
        return 'hang';
      }
      return 200;
    });
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: destinationsEnv({ billing: `${r.origin}/hooks` }, 1_000),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '20',
    });
    const c = client(server.url);
    const task = await c.submit({ queue: 'cb-generations', program: 'never-run', data: {} });
    await c.cancel(task.task_id);
    // Subscribed once terminal: due at once.
    const sub = await c.subscribe(task.task_id, { destination: 'billing' });
    await until(() => r.hanging.length === 1, 30_000, 'the first try in flight');
    // The first try is in flight: its generation is not finished.
    await expectProblem(c.redeliver(sub.id, 1), 409, 'conflict', 'generation_in_progress');
    // The hanging try times out (1 s); the retry is acknowledged.
    await until(
      async () => (await c.subscriptions(task.task_id))[0]?.state === 'delivered',
      30_000,
      'generation 1 delivered',
    );
    expect((await c.subscriptions(task.task_id))[0]).toMatchObject({ generation: 1, attempts: 2 });

    for (let g = 1; g < COMPLETION_MAX_GENERATION; g += 1) {
      const next = await c.redeliver(sub.id, g);
      expect(next).toMatchObject({ generation: g + 1, attempts: 0 });
      // The same request again starts nothing.
      expect((await c.redeliver(sub.id, g)).generation).toBe(g + 1);
      await until(
        async () => (await c.subscriptions(task.task_id))[0]?.state === 'delivered',
        30_000,
        `generation ${g + 1} delivered`,
      );
    }
    const [last] = await c.subscriptions(task.task_id);
    expect(last).toMatchObject({ generation: COMPLETION_MAX_GENERATION, attempts: 1 });
    await expectProblem(
      c.redeliver(sub.id, COMPLETION_MAX_GENERATION),
      409,
      'limit_exceeded',
      'max_completion_generation',
    );
    // Once per generation: one acknowledgement each, the same id and state throughout.
    expect(r.acknowledged(sub.event_id)).toBe(COMPLETION_MAX_GENERATION);
    expect(new Set(r.posts.map((p) => p.state))).toEqual(new Set(['cancelled']));
  });
});

describe('the retry schedule', () => {
  it(`${COMPLETION_MAX_ATTEMPTS} tries then exhausted, with the last try's status and error in the view`, async () => {
    const r = await startReceiver(() => 500);
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: destinationsEnv({ billing: `${r.origin}/hooks` }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
    });
    const c = client(server.url);
    const task = await c.submit({ queue: 'cb-exhaust', program: 'never-run', data: {} });
    const sub = await c.subscribe(task.task_id, { destination: 'billing' });
    await c.cancel(task.task_id);
    await until(
      async () => (await c.subscriptions(task.task_id))[0]?.state === 'exhausted',
      30_000,
      'exhausted',
    );
    const [view] = await c.subscriptions(task.task_id);
    expect(view).toMatchObject({
      state: 'exhausted',
      generation: 1,
      attempts: COMPLETION_MAX_ATTEMPTS,
      last_status_code: 500,
      last_error: 'status 500',
    });
    expect(view?.next_attempt_at).toBeUndefined();
    expect(r.posts.filter((p) => p.id === sub.event_id)).toHaveLength(COMPLETION_MAX_ATTEMPTS);
  });

  it('a Retry-After beyond COMPLETION_MAX_RETRY_DELAY_MS is capped, counted from store time', async () => {
    const r = await startReceiver(() => 503);
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: destinationsEnv({ billing: `${r.origin}/hooks` }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
    });
    // Retry-After of two hours: the receiver is replaced to send it.
    await r.close();
    open.splice(open.indexOf(r), 1);
    const slow: Server = createServer((request, response) => {
      request.resume();
      request.on('end', () => response.writeHead(503, { 'retry-after': '7200' }).end());
    });
    await new Promise<void>((resolve) =>
      slow.listen(Number(new URL(r.origin).port), '127.0.0.1', resolve),
    );
    open.push({
      close: () =>
        new Promise<void>((resolve) => {
          slow.closeAllConnections();
          slow.close(() => resolve());
        }),
    });
    const c = client(server.url);
    const task = await c.submit({ queue: 'cb-retry-cap', program: 'never-run', data: {} });
    await c.subscribe(task.task_id, { destination: 'billing' });
    const began = await db.now();
    await c.cancel(task.task_id);
    await until(
      async () =>
        (await c.subscriptions(task.task_id))[0]?.attempts === 1 &&
        (await c.subscriptions(task.task_id))[0]?.state === 'due',
      30_000,
      'the failed try recorded',
    );
    const ended = await db.now();
    const [view] = await c.subscriptions(task.task_id);
    expect(view).toMatchObject({ state: 'due', attempts: 1, last_status_code: 503 });
    expect(view?.next_attempt_at).toBeGreaterThanOrEqual(began + COMPLETION_MAX_RETRY_DELAY_MS);
    expect(view?.next_attempt_at).toBeLessThanOrEqual(ended + COMPLETION_MAX_RETRY_DELAY_MS);
  });
});
