/**
 * Seed promise (seeds/001 `CompletionEvent`): "Compact reference-only CloudEvent: no
 * application result copy and no platform data. Event identity and bytes remain unchanged across
 * retries and manual redelivery." Retries are covered by sender.e2e.test.ts; this file covers the
 * manual redelivery (a new generation) against a real receiver on 127.0.0.1.
 */
import type { Scope } from '@ledgence/contracts';
import { createMemoryTaskStore, freshScope, type MemoryTaskStore } from '@ledgence/core/testing';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createDestination, type Destinations } from './destinations.js';
import { type CompletionSender, createCompletionSender } from './sender.js';
import { type Receiver, startReceiver } from './testdata/receiver.js';
import { finishTask, subscribe, subscriptionOf } from './testdata/tasks.js';

const KEY = Buffer.alloc(32, 0x5a);
const T0 = Date.UTC(2026, 10, 29, 12);

let store: MemoryTaskStore;
let scope: Scope;
let r: Receiver | undefined;
let s: CompletionSender | undefined;

beforeEach(() => {
  store = createMemoryTaskStore({ now: () => T0 });
  scope = freshScope();
});

afterEach(async () => {
  const stopping = s?.stop();
  await r?.close();
  await stopping;
  r = undefined;
  s = undefined;
});

function destinations(origin: string): Destinations {
  return new Map([
    ['billing', createDestination({ alias: 'billing', url: `${origin}/hooks`, secret: KEY })],
  ]);
}

describe('manual redelivery of a completion event', () => {
  it('posts the same event id and identical body bytes as the first generation, with no result copy', async () => {
    r = await startReceiver((res) => res.writeHead(204).end());
    s = createCompletionSender({ store, idleIntervalMs: 10, destinations: destinations(r.origin) });
    const taskId = await finishTask(store, scope, 'succeeded');
    const subscription = await subscribe(store, scope, taskId, 'billing');

    expect((await s.runOnce()).records).toMatchObject([{ outcome: 'delivered', attempt: 1 }]);
    // Time moves on before the operator redelivers: the bytes must not depend on it.
    store.advance(3_600_000);
    const redelivered = await store.redeliver(scope, subscription.id, { generation: 1 });
    expect(redelivered.generation).toBe(2);
    expect((await s.runOnce()).records).toMatchObject([{ outcome: 'delivered', attempt: 1 }]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'delivered',
      generation: 2,
      event_id: subscription.event_id,
    });

    const [first, second] = r.requests;
    if (first === undefined || second === undefined) throw new Error('expected two posts');
    expect(second.headers['webhook-id']).toBe(first.headers['webhook-id']);
    expect(second.body.equals(first.body)).toBe(true);

    const event = JSON.parse(first.body.toString('utf8')) as Record<string, unknown>;
    expect(event.id).toBe(subscription.event_id);
    expect(event.subject).toBe(taskId);
    // Reference only: the output the task produced ({ ok: true }) is not copied.
    expect(Object.keys(event.data as object).sort()).toEqual([
      'result_ref',
      'run_id',
      'state',
      'task_id',
    ]);
    expect(first.body.toString('utf8')).not.toContain('"ok"');
  });
});
