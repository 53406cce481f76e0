/**
 * DESIGN §8 over the real server on PostgreSQL, under concurrency: `subscription_key` makes
 * subscribing idempotent and MAX_COMPLETION_SUBSCRIPTIONS bounds a task even when the requests
 * race, and a repeated redeliver request naming the same generation never starts two
 * generations (CompletionRetryCommand: naming g again once g+1 exists answers unchanged).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type CompletionSubscription, MAX_COMPLETION_SUBSCRIPTIONS } from '@ledgence/contracts';
import { afterAll, describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'races-key-000000000000000001';
const SCOPE = '/v1/tenants/acme/namespaces/a';

// A receiver that acknowledges every event (2xx = delivered), started before the server reads
// its destinations: the port is fixed here and the receiver listens on it at once.
const received: string[] = [];
const receiver: Server = createServer((req, res) => {
  const id = req.headers['webhook-id'];
  if (typeof id === 'string') received.push(id);
  req.resume();
  req.on('end', () => res.writeHead(204).end());
});
const port: number = await new Promise((resolve) => {
  receiver.listen(0, '127.0.0.1', () => resolve((receiver.address() as AddressInfo).port));
});
afterAll(() => new Promise<void>((resolve) => receiver.close(() => resolve())));

const server = keyedServer('completion_races', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    billing: {
      url: `http://127.0.0.1:${port}/hook`,
      secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
    },
  }),
  LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
});
const api = server.as(KEY);

let n = 0;
async function submit(): Promise<string> {
  n += 1;
  const reply = await api.post(`${SCOPE}/tasks`, {
    idempotency_key: `races-${n}`,
    input: { tenant_id: 'acme', namespace: 'a', queue: 'q', program: { name: 'p' }, data: n },
  });
  expect(reply.status).toBe(201);
  return reply.body.task_id as string;
}

const subscriptionsOf = (taskId: string) => `${SCOPE}/tasks/${taskId}/completion-subscriptions`;

async function list(taskId: string): Promise<CompletionSubscription[]> {
  const reply = await api.get<CompletionSubscription[]>(subscriptionsOf(taskId));
  expect(reply.status).toBe(200);
  return reply.body;
}

async function until<T>(read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const value = await read();
    if (done(value) || Date.now() > deadline) return value;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe('racing subscribes (DESIGN §8 subscription_key, MAX_COMPLETION_SUBSCRIPTIONS)', () => {
  it('8 concurrent subscribes with one key create one subscription: one 201, seven 200 with its id', async () => {
    const taskId = await submit();
    const replies = await Promise.all(
      Array.from({ length: 8 }, () =>
        api.post(subscriptionsOf(taskId), { subscription_key: 'same', destination: 'billing' }),
      ),
    );
    expect(replies.map((r) => r.status).sort()).toEqual([200, 200, 200, 200, 200, 200, 200, 201]);
    expect(new Set(replies.map((r) => r.body.id)).size).toBe(1);
    expect(await list(taskId)).toHaveLength(1);
  });

  it(`${MAX_COMPLETION_SUBSCRIPTIONS + 4} concurrent subscribes with distinct keys: exactly ${MAX_COMPLETION_SUBSCRIPTIONS} created, the rest 409 limit_exceeded`, async () => {
    const taskId = await submit();
    const replies = await Promise.all(
      Array.from({ length: MAX_COMPLETION_SUBSCRIPTIONS + 4 }, (_, i) =>
        api.post(subscriptionsOf(taskId), { subscription_key: `k${i}`, destination: 'billing' }),
      ),
    );
    const created = replies.filter((r) => r.status === 201);
    const refused = replies.filter((r) => r.status !== 201);
    expect(created).toHaveLength(MAX_COMPLETION_SUBSCRIPTIONS);
    expect(refused.map((r) => [r.status, r.body.code])).toEqual(
      Array.from({ length: 4 }, () => [409, 'limit_exceeded']),
    );
    const stored = await list(taskId);
    expect(stored.map((s) => s.id).sort()).toEqual(created.map((r) => r.body.id).sort());
  });
});

describe('racing redeliveries (DESIGN §8 CompletionRetryCommand)', () => {
  it('5 concurrent redeliveries naming the delivered generation 1 start generation 2 once; naming 1 again is unchanged, naming 3 is 409', async () => {
    const taskId = await submit();
    const sub = await api.post<CompletionSubscription>(subscriptionsOf(taskId), {
      subscription_key: 'redeliver',
      destination: 'billing',
    });
    expect(sub.status).toBe(201);
    expect((await api.post(`${SCOPE}/tasks/${taskId}/cancel`)).status).toBe(200);
    const [delivered] = await until(
      () => list(taskId),
      (subs) => subs[0]?.state === 'delivered',
    );
    expect(delivered).toMatchObject({ state: 'delivered', generation: 1, attempts: 1 });
    const path = `${SCOPE}/completion-subscriptions/${sub.body.id}/redeliver`;
    const replies = await Promise.all(
      Array.from({ length: 5 }, () => api.post<CompletionSubscription>(path, { generation: 1 })),
    );
    expect(replies.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
    expect(replies.map((r) => r.body.generation)).toEqual([2, 2, 2, 2, 2]);
    expect(new Set(replies.map((r) => r.body.event_id))).toEqual(new Set([sub.body.event_id]));
    const [second] = await until(
      () => list(taskId),
      (subs) => subs[0]?.state === 'delivered',
    );
    expect(second).toMatchObject({ state: 'delivered', generation: 2, attempts: 1 });
    // One try per generation reached the receiver, both with the subscription's event id.
    expect(received.filter((id) => id === sub.body.event_id)).toHaveLength(2);
    const repeated = await api.post<CompletionSubscription>(path, { generation: 1 });
    expect([repeated.status, repeated.body]).toEqual([200, second]);
    const skipped = await api.post(path, { generation: 3 });
    expect([skipped.status, skipped.body.code]).toEqual([409, 'conflict']);
    expect(await list(taskId)).toEqual([second]);
  });
});
