/**
 * The completion-subscription API over a real server process and a real local receiver (review
 * r52a; DESIGN §6 rows, §8, README "Completion callbacks"): subscribing before, during and after
 * the end, key replays and events' ids; the list's delivery state through due → delivering →
 * delivered / exhausted, and redeliver of each state.
 */
import {
  createServer,
  type IncomingHttpHeaders,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, shortWorker, sleep, TENANT, until } from './test/harness.js';
import { call, TASKS_BASE } from './test/wire.js';

const SECRET = `whsec_${Buffer.alloc(32, 52).toString('base64')}`;

interface Post {
  path: string;
  id: string;
  headers: IncomingHttpHeaders;
  body: string;
  event: { id: string; data: { task_id: string; state: string }; [k: string]: unknown };
}
type Answer = number | 'hang' | { status: number; retryAfter: string };

const posts: Post[] = [];
const held = new Set<ServerResponse>();
let answer: (post: Post, seen: number) => Answer = () => 200;
let receiver: Server;
let server: ServerProcess;
const stack = new Stack('cb_api_r52a');

interface Sub {
  id: string;
  task_id: string;
  subscription_key: string;
  destination: string;
  event_id: string;
  state: string;
  attempts: number;
  generation: number;
  next_attempt_at?: number;
  delivered_at?: number;
  last_status_code?: number;
  last_error?: string;
}

beforeAll(async () => {
  await stack.open();
  receiver = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (c: Buffer) => chunks.push(c));
    request.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const post: Post = {
        path: request.url ?? '',
        id: String(request.headers['webhook-id']),
        headers: request.headers,
        body,
        event: JSON.parse(body),
      };
      const seen = posts.filter((p) => p.id === post.id).length;
      posts.push(post);
      const a = answer(post, seen);
      if (a === 'hang') {
        held.add(response);
        response.on('close', () => held.delete(response));
        return;
      }
      if (typeof a === 'number') response.writeHead(a).end();
      else response.writeHead(a.status, { 'retry-after': a.retryAfter }).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const { port } = receiver.address() as AddressInfo;
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: `http://127.0.0.1:${port}/billing`, secret: SECRET, timeout_ms: 1_500 },
      audit: { url: `http://127.0.0.1:${port}/audit`, secret: SECRET, timeout_ms: 1_500 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  });
});

afterEach(() => {
  answer = () => 200;
  for (const r of held) r.destroy();
});

afterAll(async () => {
  for (const r of held) r.destroy();
  await stack.close();
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
});

async function submit(queue: string): Promise<string> {
  const r = await call<{ task_id: string }>(server.url, `${TASKS_BASE}/tasks`, {
    idempotency_key: `k-${queue}-${Math.random()}`,
    input: {
      tenant_id: TENANT,
      namespace: NAMESPACE,
      queue,
      program: { name: 'never-run' },
      data: null,
    },
  });
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  return r.body.task_id;
}

async function cancel(taskId: string): Promise<void> {
  const r = await fetch(`${server.url}${TASKS_BASE}/tasks/${taskId}/cancel`, { method: 'POST' });
  expect(r.status).toBe(200);
}

function subscribe(taskId: string, key: string, destination = 'billing') {
  return call<Sub & { code?: string }>(
    server.url,
    `${TASKS_BASE}/tasks/${taskId}/completion-subscriptions`,
    { subscription_key: key, destination },
  );
}

async function list(taskId: string): Promise<Sub[]> {
  const r = await call<Sub[]>(server.url, `${TASKS_BASE}/tasks/${taskId}/completion-subscriptions`);
  expect(r.status).toBe(200);
  return r.body;
}

async function one(taskId: string, id: string): Promise<Sub> {
  const s = (await list(taskId)).find((x) => x.id === id);
  if (s === undefined) throw new Error(`no subscription ${id}`);
  return s;
}

function redeliver(id: string, generation: number, scope = TASKS_BASE) {
  return call<Sub & { code?: string; status?: number }>(
    server.url,
    `${scope}/completion-subscriptions/${id}/redeliver`,
    { generation },
  );
}

const postsOf = (eventId: string) => posts.filter((p) => p.id === eventId);

describe('completion subscriptions over the real server', () => {
  it('before, during and after the end: one delivery each, ids as the list says', async () => {
    const queue = 'r52a-phases';
    const taskId = await submit(queue);
    const before = await subscribe(taskId, 'before');
    expect(before.status).toBe(201);
    expect(before.body).toMatchObject({ state: 'waiting', generation: 1, attempts: 0 });
    expect(before.body.next_attempt_at).toBeUndefined();

    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let started = false;
    const w = shortWorker(server.url, queue);
    w.register('never-run', async () => {
      started = true;
      await gate;
      return { ok: true };
    });
    void w.run();
    try {
      await until(() => started, 20_000, 'handler start');
      const during = await subscribe(taskId, 'during', 'audit');
      expect(during.status).toBe(201);
      expect(during.body.state).toBe('waiting');
      release();
      await until(
        async () => (await list(taskId)).every((s) => s.state === 'delivered'),
        20_000,
        'both delivered',
      );
    } finally {
      release();
      await w.stop({ graceMs: 0 });
    }
    const after = await subscribe(taskId, 'after');
    expect(after.status).toBe(201);
    expect(after.body.state).toBe('due');
    expect(after.body.next_attempt_at).toBeTypeOf('number');
    await until(
      async () => (await one(taskId, after.body.id)).state === 'delivered',
      20_000,
      'after delivered',
    );
    // Replaying each key (same destination) after the end: 200, same subscription, no new post.
    for (const [key, dest, sub] of [
      ['before', 'billing', before.body],
      ['during', 'audit', (await list(taskId))[1] as Sub],
      ['after', 'billing', after.body],
    ] as const) {
      const again = await subscribe(taskId, key, dest);
      expect(again.status).toBe(200);
      expect(again.body.id).toBe(sub.id);
      expect(again.body.event_id).toBe(sub.event_id);
      expect(again.body.state).toBe('delivered');
      const other = await subscribe(taskId, key, dest === 'billing' ? 'audit' : 'billing');
      expect([other.status, other.body.code]).toEqual([409, 'conflict']);
    }
    await sleep(800);
    const subs = await list(taskId);
    expect(subs.map((s) => s.subscription_key)).toEqual(['before', 'during', 'after']);
    const ids = new Set(subs.map((s) => s.event_id));
    expect(ids.size).toBe(3);
    for (const s of subs) {
      expect(s).toMatchObject({
        state: 'delivered',
        attempts: 1,
        generation: 1,
        last_status_code: 200,
      });
      expect(s.delivered_at).toBeTypeOf('number');
      expect(s.next_attempt_at).toBeUndefined();
      expect(s.last_error).toBeUndefined();
      const got = postsOf(s.event_id);
      expect(got).toHaveLength(1);
      expect(got[0]?.event.id).toBe(s.event_id);
      expect(got[0]?.event.data.task_id).toBe(taskId);
      expect(got[0]?.event.data.state).toBe('succeeded');
      expect(got[0]?.path).toBe(s.destination === 'billing' ? '/billing' : '/audit');
    }
  }, 60_000);

  it('redeliver of waiting, due, delivering: 409; delivered and exhausted: next generation, same bytes; replays change nothing', async () => {
    const taskId = await submit('r52a-redeliver');
    const sub = (await subscribe(taskId, 'r')).body;
    const waiting = await redeliver(sub.id, 1);
    expect(waiting.status).toBe(409);

    // First try: 503 with a long Retry-After → due, next_attempt_at in the future.
    answer = () => ({ status: 503, retryAfter: '3' });
    await cancel(taskId);
    await until(
      async () =>
        (await one(taskId, sub.id)).attempts === 1 && (await one(taskId, sub.id)).state === 'due',
      20_000,
      'due after 503',
    );
    const due = await one(taskId, sub.id);
    expect(due).toMatchObject({ state: 'due', attempts: 1, last_status_code: 503 });
    expect(due.next_attempt_at).toBeTypeOf('number');
    const redueAnswer = await redeliver(sub.id, 1);
    expect(redueAnswer.status).toBe(409);
    expect(redueAnswer.body.code).toBe('conflict');

    // Second try hangs → delivering.
    answer = () => 'hang';
    await until(
      async () => (await one(taskId, sub.id)).state === 'delivering',
      20_000,
      'delivering',
    );
    const delivering = await one(taskId, sub.id);
    expect(delivering.attempts).toBe(2);
    const inFlight = await redeliver(sub.id, 1);
    expect([inFlight.status, inFlight.body.code]).toEqual([409, 'conflict']);
    for (const r of held) r.destroy();

    // Then delivered.
    answer = () => 200;
    await until(async () => (await one(taskId, sub.id)).state === 'delivered', 30_000, 'delivered');
    const delivered = await one(taskId, sub.id);
    expect(delivered).toMatchObject({ generation: 1, last_status_code: 200 });
    expect(delivered.last_error).toBeUndefined();
    const beforeRedeliver = postsOf(sub.event_id).length;

    const g2 = await redeliver(sub.id, 1);
    expect(g2.status).toBe(200);
    expect(g2.body).toMatchObject({
      id: sub.id,
      generation: 2,
      attempts: 0,
      event_id: sub.event_id,
    });
    expect(g2.body.delivered_at).toBeUndefined();
    const g2again = await redeliver(sub.id, 1);
    expect(g2again.status).toBe(200);
    expect(g2again.body.generation).toBe(2);
    await until(
      async () => (await one(taskId, sub.id)).state === 'delivered',
      20_000,
      'g2 delivered',
    );
    await sleep(500);
    const all = postsOf(sub.event_id);
    expect(all).toHaveLength(beforeRedeliver + 1);
    expect(new Set(all.map((p) => p.body)).size).toBe(1);
    expect(await one(taskId, sub.id)).toMatchObject({ generation: 2, attempts: 1 });

    // 410 → exhausted; redeliver → generation 3.
    answer = () => 410;
    const g3 = await redeliver(sub.id, 2);
    expect(g3.body.generation).toBe(3);
    await until(async () => (await one(taskId, sub.id)).state === 'exhausted', 20_000, 'exhausted');
    expect(await one(taskId, sub.id)).toMatchObject({
      generation: 3,
      attempts: 1,
      last_status_code: 410,
    });
    answer = () => 200;
    const g4 = await redeliver(sub.id, 3);
    expect(g4.body).toMatchObject({ generation: 4, state: 'due' });
    expect(g4.body.last_status_code).toBeUndefined();
    expect(g4.body.last_error).toBeUndefined();
    for (const g of [1, 2, 3]) expect((await redeliver(sub.id, g)).status).toBe(200);
    const ahead = await redeliver(sub.id, 6);
    expect([ahead.status, ahead.body.code]).toEqual([409, 'conflict']);
    await until(
      async () => (await one(taskId, sub.id)).state === 'delivered',
      20_000,
      'g4 delivered',
    );
    await sleep(500);
    const final = postsOf(sub.event_id);
    expect(new Set(final.map((p) => p.body)).size).toBe(1);
    expect(final.every((p) => p.event.id === sub.event_id)).toBe(true);

    // Another namespace, another tenant: 404.
    const otherNs = await redeliver(sub.id, 4, `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}-x`);
    expect(otherNs.status).toBe(404);
    const otherTenant = await redeliver(
      sub.id,
      4,
      `/v1/tenants/${TENANT}x/namespaces/${NAMESPACE}`,
    );
    expect(otherTenant.status).toBe(404);
  }, 90_000);
});
