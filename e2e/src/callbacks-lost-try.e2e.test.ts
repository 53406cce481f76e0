/**
 * A completion delivery whose sender died after leasing the generation's last try
 * (COMPLETION_MAX_ATTEMPTS), seen through a real server process's HTTP API (DESIGN §8). Nothing
 * can happen to such a delivery once the lease ends but its exhaustion by some sender's next
 * lease — which comes late when the senders are busy, or never when none runs. The view must say
 * `exhausted` from the lease's end, and redelivery must start the next generation then, rather
 * than answer 409 "still delivering" until a sender gets round to the row.
 *
 * The server's own sender is kept busy the way a slow receiver does it: its window holds more
 * than half of MAX_COMPLETION_BATCH hanging tries, and a sender leases nothing more until a try
 * ends. This process plays the sender that dies: through the store it leases the tries (the
 * first ones fail and are reported) and never reports the last one.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  COMPLETION_MAX_ATTEMPTS,
  MAX_COMPLETION_BATCH,
  MAX_COMPLETION_SUBSCRIPTIONS,
} from '@ledgence/contracts';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { client, Stack, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
/** Enough hanging tries that the server's sender (window MAX_COMPLETION_BATCH) stops leasing. */
const BLOCKING = MAX_COMPLETION_BATCH / 2 + 1;
/** The dying sender's lease of the last try: short, so the test waits little for its end. */
const LAST_LEASE_MS = 200;

type Lease = Awaited<ReturnType<PostgresTaskStore['leaseDeliveries']>>[number];

const stack = new Stack('cb_lost_try');
/** The dying sender's store, on the server's database and clock. */
let sender: PostgresTaskStore;
let receiver: Server;
let origin: string;
/** The `slow` receiver's tries, held open until the test lets them answer. */
const held: ServerResponse[] = [];
let holding = true;
/** The `webhook-id` of every POST to `billing`. */
const billing: string[] = [];

beforeAll(async () => {
  await stack.open();
  sender = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
  receiver = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      if (request.url === '/hooks/slow' && holding) {
        held.push(response);
        return;
      }
      if (request.url === '/hooks/billing') billing.push(String(request.headers['webhook-id']));
      response.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await Promise.all(stack.servers.map((s) => s.stop('SIGKILL')));
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
  await sender?.close();
  await stack.close();
});

/** The lease `sender` takes of `subscriptionId` now; fails the test if it takes none. */
async function leaseOf(subscriptionId: string, leaseMs: number): Promise<Lease> {
  const leases = await sender.leaseDeliveries(MAX_COMPLETION_BATCH, leaseMs);
  const mine = leases.find((lease) => lease.subscription_id === subscriptionId);
  if (mine === undefined) throw new Error(`subscription ${subscriptionId} was not leased`);
  return mine;
}

it('a lost last try: exhausted in the view once its lease ended, and redelivered at once', async () => {
  const server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      slow: { url: `${origin}/hooks/slow`, secret: SECRET, timeout_ms: 60_000 },
      billing: { url: `${origin}/hooks/billing`, secret: SECRET },
    }),
  });
  const c = client(server.url);

  // The server's sender fills its window with tries the slow receiver holds.
  let blockingTask = '';
  for (let n = 0; n < BLOCKING; n += 1) {
    if (n % MAX_COMPLETION_SUBSCRIPTIONS === 0) {
      blockingTask = (await c.submit({ queue: 'cb-slow', program: 'never-run', data: {} })).task_id;
      await c.cancel(blockingTask);
    }
    await c.subscribe(blockingTask, { destination: 'slow' });
  }
  await until(() => held.length === BLOCKING, 30_000, 'the sender’s window full');

  const task = await c.submit({ queue: 'cb-lost', program: 'never-run', data: {} });
  await c.cancel(task.task_id);
  const subscription = await c.subscribe(task.task_id, { destination: 'billing' });
  for (let attempt = 1; attempt < COMPLETION_MAX_ATTEMPTS; attempt += 1) {
    const lease = await leaseOf(subscription.id, 60_000);
    expect(lease.attempt).toBe(attempt);
    const failed = {
      scope: lease.scope,
      subscription_id: lease.subscription_id,
      generation: lease.generation,
      attempt,
      next: { state: 'due' as const, delay_ms: 0 },
      status_code: 503,
      error: 'status 503',
    };
    expect(await sender.reportDelivery(failed)).toBe(true);
  }
  const last = await leaseOf(subscription.id, LAST_LEASE_MS);
  expect(last.attempt).toBe(COMPLETION_MAX_ATTEMPTS);
  // The sender died with its POST unsent: nobody reports the try.
  await until(async () => (await sender.now()) >= last.lease_expires_at, 30_000, 'lease end');

  const [view] = await c.subscriptions(task.task_id);
  expect(view).toMatchObject({
    id: subscription.id,
    state: 'exhausted',
    generation: 1,
    attempts: COMPLETION_MAX_ATTEMPTS,
  });
  expect(view?.next_attempt_at).toBeUndefined();
  // The lost try got no answer: the earlier tries' 503 does not describe it.
  expect(view?.last_status_code).toBeUndefined();
  expect(view?.last_error).toMatch(/lease expired/);

  const next = await c.redeliver(subscription.id, 1);
  expect(next).toMatchObject({ state: 'due', generation: 2, attempts: 0 });

  // The slow receiver answers at last; the freed sender sends generation 2.
  holding = false;
  for (const response of held.splice(0)) response.writeHead(204).end();
  await until(
    async () => (await c.subscriptions(task.task_id))[0]?.state === 'delivered',
    30_000,
    'generation 2 delivered',
  );
  expect((await c.subscriptions(task.task_id))[0]).toMatchObject({
    generation: 2,
    attempts: 1,
    event_id: subscription.event_id,
  });
  expect(billing).toEqual([subscription.event_id]);
});
