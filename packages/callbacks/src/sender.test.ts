/**
 * The sender's pure parts and the paths that need no receiver: the event a
 * lease encodes, the bound on recorded errors, option checks, and hooks or
 * loggers that throw. Deliveries over real sockets are in sender.e2e.test.ts.
 */
import { MAX_COMPLETION_BATCH } from '@ledgence/contracts';
import { createMemoryTaskStore, freshScope } from '@ledgence/core/testing';
import { describe, expect, it } from 'vitest';
import { createCompletionSender, encodeLeaseEvent } from './sender.js';
import { finishTask, subscribe } from './testdata/tasks.js';

describe('encodeLeaseEvent', () => {
  it('encodes identical bytes from every lease of a subscription, across tries and generations', async () => {
    const store = createMemoryTaskStore();
    const scope = freshScope();
    const taskId = await finishTask(store, scope, 'failed');
    const subscription = await subscribe(store, scope, taskId, 'billing');

    const leaseOne = async () => {
      const [lease] = await store.leaseDeliveries(1, 60_000);
      if (lease === undefined) throw new Error('nothing was due');
      return lease;
    };
    const report = (lease: Awaited<ReturnType<typeof leaseOne>>, state: 'due' | 'delivered') =>
      store.reportDelivery({
        scope,
        subscription_id: lease.subscription_id,
        generation: lease.generation,
        attempt: lease.attempt,
        next: state === 'due' ? { state, delay_ms: 0 } : { state },
      });

    const first = await leaseOne();
    await report(first, 'due');
    const second = await leaseOne();
    await report(second, 'delivered');
    await store.redeliver(scope, subscription.id, { generation: 1 });
    const third = await leaseOne();

    expect([first, second, third].map((lease) => [lease.generation, lease.attempt])).toEqual([
      [1, 1],
      [1, 2],
      [2, 1],
    ]);
    const [a, b, c] = [first, second, third].map(encodeLeaseEvent);
    expect(a?.id).toBe(subscription.event_id);
    expect(b?.body.equals(a?.body ?? Buffer.alloc(0))).toBe(true);
    expect(c?.body.equals(a?.body ?? Buffer.alloc(0))).toBe(true);
    expect(JSON.parse(a?.body.toString('utf8') ?? '')).toMatchObject({
      id: subscription.event_id,
      subject: taskId,
      data: { task_id: taskId, state: 'failed' },
    });
  });
});

describe('createCompletionSender', () => {
  const store = createMemoryTaskStore();
  const destinations = new Map();

  it.each([
    ['batchSize', 0],
    ['batchSize', MAX_COMPLETION_BATCH + 1],
    ['retryBaseMs', 0],
    ['leaseMs', -1],
    ['idleIntervalMs', 0.5],
    ['unconfiguredGraceMs', -1],
    ['unconfiguredGraceMs', 1.5],
  ])('refuses %s = %s', (name, value) => {
    expect(() => createCompletionSender({ store, destinations, [name]: value })).toThrow(
      RangeError,
    );
  });

  it('survives a throwing onDelivery hook and a throwing logger', async () => {
    const scope = freshScope();
    const subscription = await subscribe(store, scope, await finishTask(store, scope), 'nowhere');
    const fail = (): never => {
      throw new Error('boom');
    };
    const sender = createCompletionSender({
      store,
      destinations,
      // No grace: the unconfigured alias is tried at once, a try that needs no receiver.
      unconfiguredGraceMs: 0,
      onDelivery: fail,
      logger: { info: fail, warn: fail, error: fail },
    });

    const { records } = await sender.runOnce();

    expect(records).toMatchObject([
      { subscriptionId: subscription.id, outcome: 'retry', reason: 'unconfigured' },
    ]);
    await sender.stop();
  });
});
