/**
 * Replicas: completion callbacks with two server processes on one database, both
 * running the sender (DESIGN §8: the sender leases due deliveries, SKIP LOCKED).
 */
import type { Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { client, idsOf, Stack, settled, shortWorker, until } from './test/harness.js';
import { startReceiver } from './test/receiver.js';

const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;

function env(url: string, timeoutMs: number) {
  return {
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url, secret: SECRET, timeout_ms: timeoutMs },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    LEDGENCE_COMPLETION_LEASE_MS: '1000',
  };
}

const stack = new Stack('replicas_callbacks');
const workers: Worker[] = [];
const closers: (() => Promise<void>)[] = [];
beforeAll(async () => {
  await stack.open();
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
  await Promise.all(closers.splice(0).map((c) => c()));
});
afterAll(async () => {
  await stack.close();
});

function echo(url: string, queue: string) {
  const w = shortWorker(url, queue, { concurrency: 8 });
  w.register('echo', (data) => data);
  workers.push(w);
  void w.run();
}

it('two replicas sending: each event is posted once and recorded delivered once', async () => {
  const r = await startReceiver();
  closers.push(r.close);
  const [a, b] = await Promise.all([
    stack.start(env(r.url, 2_000)),
    stack.start(env(r.url, 2_000)),
  ]);
  const ca = client(a.url);
  const cb = client(b.url);
  const queue = 'cb2';
  const ids = idsOf(
    await ca.submitBatch(
      Array.from({ length: 200 }, (_, i) => ({ queue, program: 'echo', data: { i } })),
    ),
  );
  await Promise.all(
    ids.map((id, i) => (i % 2 ? ca : cb).subscribe(id, { destination: 'billing' })),
  );
  echo(a.url, queue);
  echo(b.url, queue);
  await settled(ca, ids, 120_000);
  await until(() => new Set(r.posts.map((p) => p.id)).size >= 200, 60_000, '200 deliveries');
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  expect(r.posts.length).toBe(200);
  for (const id of ids.slice(0, 20)) {
    const [s] = await cb.subscriptions(id);
    expect(s).toMatchObject({ state: 'delivered', generation: 1, attempts: 1 });
  }
}, 240_000);

it('a replica SIGKILLed mid-delivery: the other posts the same id and bytes once the lease ran out', async () => {
  const r = await startReceiver((_, seen) => (seen === 0 ? 'hang' : 0));
  closers.push(r.close);
  // A timeout long enough that the first try still hangs when its replica dies (the lease is
  // raised to it + 5 s: the other replica takes the delivery after 20 s).
  const a = await stack.start(env(r.url, 15_000));
  const ca = client(a.url);
  const queue = 'cb-kill2';
  const [id] = idsOf(await ca.submitBatch([{ queue, program: 'echo', data: {} }]));
  const subscription = await ca.subscribe(id as string, { destination: 'billing' });
  echo(a.url, queue);
  await settled(ca, [id as string]);
  await until(() => r.posts.length === 1, 30_000, 'the first (hanging) try');
  // B starts only now, so A's sender made the first try.
  const b = await stack.start(env(r.url, 2_000));
  expect(await a.stop('SIGKILL')).toBe('SIGKILL');
  await until(() => r.posts.length >= 2, 120_000, 'the try by the other replica');
  const [first, second] = r.posts;
  expect(second?.id).toBe(first?.id);
  expect(second?.id).toBe(subscription.event_id);
  expect(second?.body).toBe(first?.body);
  const cb = client(b.url);
  await until(async () => (await cb.subscriptions(id as string))[0]?.state === 'delivered', 30_000);
  expect((await cb.subscriptions(id as string))[0]).toMatchObject({ generation: 1, attempts: 2 });
}, 240_000);
