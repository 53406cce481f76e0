/**
 * Drives tasks through the in-memory store's TaskStore API to a terminal
 * state and subscribes them, so sender tests start from the rows a real
 * store would hold: a finished task with a due delivery.
 */
import { randomUUID } from 'node:crypto';
import type { CompletionSubscription, Scope } from '@ledgence/contracts';
import {
  acquireCommand,
  type MemoryTaskStore,
  openSessionCommand,
  renewCommand,
  settleApplicationError,
  settleSuccess,
  submitCommand,
} from '@ledgence/core/testing';

/**
 * Submits a task, claims it, renews it for dispatch and settles it, so it
 * ends `succeeded` (or `failed`, with a one-attempt retry policy); returns its id.
 */
export async function finishTask(
  store: MemoryTaskStore,
  scope: Scope,
  outcome: 'succeeded' | 'failed' = 'succeeded',
): Promise<string> {
  const { snapshot } = await store.submit(
    submitCommand(scope, { retry: { max_attempts: 1, delay_ms: 0 } }),
  );
  const session = await store.openSession(openSessionCommand(scope, { concurrency: 1 }));
  const { reply } = await store.acquire(acquireCommand(session, 0, 1), { recordEmpty: true });
  if (reply.disposition !== 'assigned')
    throw new Error(`expected a claim, got ${reply.disposition}`);
  await store.renew(renewCommand(reply.assignment, 1, 'dispatch'));
  const settle =
    outcome === 'succeeded'
      ? settleSuccess(reply.assignment)
      : settleApplicationError(reply.assignment);
  const { task_state } = await store.settle(settle);
  if (task_state !== outcome) throw new Error(`expected ${outcome}, got ${task_state}`);
  return snapshot.task_id;
}

/** Subscribes `taskId` to `alias` under a fresh key; a finished task's delivery is due at once. */
export async function subscribe(
  store: MemoryTaskStore,
  scope: Scope,
  taskId: string,
  alias: string,
): Promise<CompletionSubscription> {
  const { subscription } = await store.subscribe(scope, taskId, {
    subscription_key: `sub_${randomUUID()}`,
    destination: alias,
  });
  return subscription;
}

/** A subscription as the store holds it now. */
export async function subscriptionOf(
  store: MemoryTaskStore,
  scope: Scope,
  subscription: CompletionSubscription,
): Promise<CompletionSubscription> {
  const found = (await store.listSubscriptions(scope, subscription.task_id)).find(
    (row) => row.id === subscription.id,
  );
  if (found === undefined) throw new Error(`subscription ${subscription.id} is gone`);
  return found;
}
