/**
 * The sender signs with store time (DESIGN §1.2, §8): `webhook-timestamp` and the reading of an
 * HTTP-date `Retry-After` follow the store's clock, advanced by the monotonic clock since the
 * lease, never this process's wall clock. The in-memory store's clock stands at a chosen time
 * far from the process's; the receiver is real, on 127.0.0.1.
 */
import { createHmac } from 'node:crypto';
import { createMemoryTaskStore, freshScope } from '@ledgence/core/testing';
import { afterEach, expect, it } from 'vitest';
import { createDestination } from './destinations.js';
import { createCompletionSender } from './sender.js';
import { type Receiver, startReceiver } from './testdata/receiver.js';
import { finishTask, subscribe, subscriptionOf } from './testdata/tasks.js';

const KEY = Buffer.alloc(32, 0x33);
/** Store time: two days before this process's clock, far beyond any receiver's tolerance. */
const STORE_NOW = Math.floor((Date.now() - 2 * 86_400_000) / 1000) * 1000;

const open: Receiver[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((r) => r.close()));
});

it('signs webhook-timestamp with the store clock, and reads a Retry-After date against it', async () => {
  const store = createMemoryTaskStore({ now: () => STORE_NOW });
  const scope = freshScope();
  // Retry at a date 60 s after store time: by this process's clock, two days in the past.
  const retryAt = new Date(STORE_NOW + 60_000).toUTCString();
  const r = await startReceiver((res) => res.writeHead(503, { 'retry-after': retryAt }).end());
  open.push(r);
  const sender = createCompletionSender({
    store,
    destinations: new Map([
      ['billing', createDestination({ alias: 'billing', url: `${r.origin}/hooks`, secret: KEY })],
    ]),
  });
  const subscription = await subscribe(store, scope, await finishTask(store, scope), 'billing');

  const [record] = (await sender.runOnce()).records;
  expect(record).toMatchObject({ outcome: 'retry', status: 503 });
  const [request] = r.requests;
  const timestamp = Number(request?.headers['webhook-timestamp']);
  // Store time plus the moments the try took, not this process's clock.
  expect(timestamp).toBeGreaterThanOrEqual(STORE_NOW / 1000);
  expect(timestamp).toBeLessThanOrEqual(STORE_NOW / 1000 + 5);
  // The signature covers the timestamp sent.
  const body = request?.body ?? Buffer.alloc(0);
  const expected = createHmac('sha256', KEY)
    .update(`${subscription.event_id}.${timestamp}.`)
    .update(body)
    .digest('base64');
  expect(request?.headers['webhook-signature']).toBe(`v1,${expected}`);
  // Due at the receiver's date, 60 s after store time (not at once, as a date in the past).
  // (The store's clock stands still while the try's moments pass: a few ms less than 60 s.)
  const due = (await subscriptionOf(store, scope, subscription)).next_attempt_at as number;
  expect(due).toBeGreaterThan(STORE_NOW + 59_000);
  expect(due).toBeLessThanOrEqual(STORE_NOW + 60_000);
  await sender.stop();
});
