/**
 * Conformance suites for the `CompletionStore` (DESIGN §8) and the
 * `RetentionStore` (seed: `RetentionPolicy`, `RetentionStore`), driven only
 * through the store interfaces, so the memory store and the PostgreSQL store
 * are held to the very same behaviour. Tasks reach their states through the
 * `TaskStore` exactly as in {@link runTaskStoreConformance}.
 *
 * Time and isolation follow the `TaskStore` suite: time moves only with the
 * harness's `advance` and is never assumed to stand still (exact checks use
 * times a reply carries, others bounds read with `store.now()`), and every
 * test works in its own random scope. Delivery leasing, the due backlog and
 * the retention walk are global, so tests see other tests' rows there: they
 * assert about their own rows only, and counts are lower bounds.
 */
import { randomUUID } from 'node:crypto';
import {
  COMPLETION_MAX_ATTEMPTS,
  type CompletionSubscription,
  MAX_COMPLETION_BATCH,
  MAX_COMPLETION_SUBSCRIPTIONS,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
  MIN_RETENTION_MS,
  type Scope,
  type TaskState,
  type Timestamp,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import {
  DELIVERY_LEASE_EXPIRED_ERROR,
  type DeliveryNext,
  type DeliveryReport,
} from '../completion.js';
import type {
  CompletionLease,
  CompletionStore,
  RetentionStore,
  SubscribeOutcome,
  TaskStore,
} from '../ports.js';
import {
  type ConformanceHarness,
  describeConformance,
  expectContractError,
  type World,
} from './conformance.js';
import {
  freshScope,
  openSessionCommand,
  settleApplicationError,
  settleExecutionFailure,
  settleSuccess,
  submitCommand,
  TEST_QUEUE,
} from './fixtures.js';

/** The store the completion and retention suites drive. */
export type CompletionConformanceStore = TaskStore & CompletionStore & RetentionStore;

/**
 * What {@link runCompletionStoreConformance} and
 * {@link runRetentionStoreConformance} need: a {@link ConformanceHarness}
 * whose store also implements `CompletionStore` and `RetentionStore`.
 */
export type CompletionConformanceHarness = ConformanceHarness<CompletionConformanceStore>;

type CompletionWorld = World<CompletionConformanceStore>;

/** The destination alias the suites subscribe to (stores take aliases the caller checked). */
const DESTINATION = 'billing';

/**
 * The sender lease the suites take: long enough that no test step outlives
 * it by accident (a running store clock moves milliseconds per call), so a
 * lease only runs out when a test advances past it.
 */
const SENDER_LEASE_MS = 60_000;

/**
 * Bounds the passes {@link leaseAll} makes: other tests' stale deliveries
 * share the store, so a pass may be filled with rows that are not ours.
 */
const MAX_LEASE_PASSES = 100;

/** Subscribes `taskId` in the world's scope under `key` (default: a fresh one). */
function subscribe(
  w: CompletionWorld,
  taskId: string,
  key = `key_${randomUUID()}`,
  destination = DESTINATION,
): Promise<SubscribeOutcome> {
  return w.store.subscribe(w.scope, taskId, { subscription_key: key, destination });
}

/** The task's subscription `subscriptionId` as listed now; fails the test if absent. */
async function listed(
  w: CompletionWorld,
  taskId: string,
  subscriptionId: string,
): Promise<CompletionSubscription> {
  const found = (await w.store.listSubscriptions(w.scope, taskId)).find(
    (subscription) => subscription.id === subscriptionId,
  );
  if (found === undefined) throw new Error(`subscription ${subscriptionId} is not listed`);
  return found;
}

/**
 * Leases every delivery leasable now, pass after pass, until a pass finds
 * none. Leasing is global: the result includes other tests' rows, which the
 * caller ignores.
 */
async function leaseAll(w: CompletionWorld, leaseMs = SENDER_LEASE_MS): Promise<CompletionLease[]> {
  const leases: CompletionLease[] = [];
  for (let pass = 0; pass < MAX_LEASE_PASSES; pass += 1) {
    const batch = await w.store.leaseDeliveries(MAX_COMPLETION_BATCH, leaseMs);
    expect(batch.length).toBeLessThanOrEqual(MAX_COMPLETION_BATCH);
    if (batch.length === 0) return leases;
    leases.push(...batch);
  }
  return leases;
}

/** The lease of `subscriptionId` among all leasable now, or undefined when it is not leasable. */
async function leaseOf(
  w: CompletionWorld,
  subscriptionId: string,
  leaseMs = SENDER_LEASE_MS,
): Promise<CompletionLease | undefined> {
  const mine = (await leaseAll(w, leaseMs)).filter(
    (lease) => lease.subscription_id === subscriptionId,
  );
  // A row is leased at most once per pass of store time: never twice at once.
  expect(mine.length).toBeLessThanOrEqual(1);
  return mine[0];
}

/** Like {@link leaseOf}, but fails the test when the delivery is not leased. */
async function requireLease(
  w: CompletionWorld,
  subscriptionId: string,
  leaseMs = SENDER_LEASE_MS,
): Promise<CompletionLease> {
  const lease = await leaseOf(w, subscriptionId, leaseMs);
  if (lease === undefined) throw new Error(`subscription ${subscriptionId} was not leased`);
  return lease;
}

/** A report of `lease`'s try deciding `next`, with the receiver's status when it answered. */
function report(
  lease: CompletionLease,
  next: DeliveryNext,
  statusCode?: number,
  error?: string,
): DeliveryReport {
  return {
    scope: lease.scope,
    subscription_id: lease.subscription_id,
    generation: lease.generation,
    attempt: lease.attempt,
    next,
    ...(statusCode === undefined ? {} : { status_code: statusCode }),
    ...(error === undefined ? {} : { error }),
  };
}

/** Asserts the subscription is waiting: subscribed, its task not yet terminal. */
async function expectWaiting(w: CompletionWorld, taskId: string, subscriptionId: string) {
  const subscription = await listed(w, taskId, subscriptionId);
  expect(subscription).toMatchObject({ state: 'waiting', attempts: 0, generation: 1 });
  expect(subscription.next_attempt_at).toBeUndefined();
}

/**
 * Asserts the task is terminal in `state` and the subscription became due in
 * the same transaction: due exactly at the task's `terminal_at`.
 */
async function expectDueAtTerminal(
  w: CompletionWorld,
  taskId: string,
  subscriptionId: string,
  state: TaskState,
): Promise<void> {
  const status = await w.store.status(w.scope, taskId);
  expect(status.state).toBe(state);
  expect(status.terminal_at).not.toBeNull();
  const subscription = await listed(w, taskId, subscriptionId);
  expect(subscription).toMatchObject({ state: 'due', attempts: 0, generation: 1 });
  expect(subscription.next_attempt_at).toBe(status.terminal_at);
}

/** A terminal (cancelled) task of the world's scope, and when it became terminal. */
async function terminalTask(
  w: CompletionWorld,
): Promise<{ taskId: string; terminalAt: Timestamp }> {
  const task = await w.submit();
  expect(await w.store.cancel(w.scope, task.task_id)).toBe('cancelled');
  const { terminal_at } = await w.store.status(w.scope, task.task_id);
  if (terminal_at === null) throw new Error('a cancelled task has a terminal_at');
  return { taskId: task.task_id, terminalAt: terminal_at };
}

/** A subscription whose task is terminal, so its delivery is due at once. */
async function dueSubscription(w: CompletionWorld) {
  const { taskId } = await terminalTask(w);
  const { subscription } = await subscribe(w, taskId);
  expect(subscription.state).toBe('due');
  return { taskId, subscription };
}

/**
 * Redelivers generation 1 of `subscription` and asserts the DESIGN §8 rule:
 * the next generation keeps the event, is due at the request's store time and
 * has made no attempt; the listing shows the same row.
 */
async function redeliverFirstGeneration(
  w: CompletionWorld,
  taskId: string,
  subscription: CompletionSubscription,
): Promise<CompletionSubscription> {
  const before = await w.store.now();
  const next = await w.store.redeliver(w.scope, subscription.id, { generation: 1 });
  const after = await w.store.now();
  expect(next).toEqual({
    ...subscription,
    state: 'due',
    generation: 2,
    attempts: 0,
    next_attempt_at: next.next_attempt_at,
  });
  expect(next.next_attempt_at).toBeGreaterThanOrEqual(before);
  expect(next.next_attempt_at).toBeLessThanOrEqual(after);
  expect(await listed(w, taskId, subscription.id)).toEqual(next);
  return next;
}

/** Asserts the next lease of `subscription` is generation 2's first try of the same event. */
async function expectSecondGenerationLeased(
  w: CompletionWorld,
  subscription: CompletionSubscription,
): Promise<void> {
  const lease = await requireLease(w, subscription.id);
  expect(lease).toMatchObject({ generation: 2, attempt: 1, event_id: subscription.event_id });
}

/**
 * One way a task becomes terminal: `prepare` brings a task to just before
 * its terminal transition (the suite subscribes there), `finish` makes it.
 */
interface TerminalPath {
  name: string;
  state: TaskState;
  prepare(w: CompletionWorld): Promise<{ taskId: string; finish(): Promise<void> }>;
}

const TERMINAL_PATHS: readonly TerminalPath[] = [
  {
    name: 'a successful settlement',
    state: 'succeeded',
    async prepare(w) {
      const { task, assignment } = await w.submitAndClaim();
      await w.dispatch(assignment);
      return {
        taskId: task.task_id,
        finish: async () => {
          expect((await w.store.settle(settleSuccess(assignment))).task_state).toBe('succeeded');
        },
      };
    },
  },
  {
    name: 'a failure once retries are exhausted (waiting while re-queued)',
    state: 'failed',
    async prepare(w) {
      const claimed = await w.submitAndClaim({ retry: { max_attempts: 2, delay_ms: 1_000 } });
      return {
        taskId: claimed.task.task_id,
        finish: async () => {
          // The retry re-queues the task: not terminal, so nothing is due yet.
          const last = await w.failThroughRetries(claimed, [1_000]);
          const subscription = (await w.store.listSubscriptions(w.scope, claimed.task.task_id))[0];
          expect(subscription?.state).toBe('waiting');
          await w.dispatch(last);
          expect((await w.store.settle(settleApplicationError(last))).task_state).toBe('failed');
        },
      };
    },
  },
  {
    name: 'cancelling a queued task',
    state: 'cancelled',
    async prepare(w) {
      const task = await w.submit();
      return {
        taskId: task.task_id,
        finish: async () => {
          expect(await w.store.cancel(w.scope, task.task_id)).toBe('cancelled');
        },
      };
    },
  },
  {
    name: 'the settlement of an active task whose cancellation was requested',
    state: 'cancelled',
    async prepare(w) {
      const { task, assignment } = await w.submitAndClaim();
      await w.dispatch(assignment);
      expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
      return {
        taskId: task.task_id,
        finish: async () => {
          const reply = await w.store.settle(
            settleExecutionFailure(assignment, { kind: 'cancelled', retryable: true }),
          );
          expect(reply.task_state).toBe('cancelled');
        },
      };
    },
  },
  {
    name: 'confirming the cleanup of an unconfirmed settlement',
    state: 'succeeded',
    async prepare(w) {
      const { task, assignment } = await w.submitAndClaim();
      await w.dispatch(assignment);
      await w.store.settle(settleSuccess(assignment, 'out', { quiescence: 'unconfirmed' }));
      expect((await w.store.status(w.scope, task.task_id)).state).toBe('active');
      return {
        taskId: task.task_id,
        finish: async () => {
          expect(await w.store.confirmQuiescence(assignment.lease.owner)).toBe('succeeded');
        },
      };
    },
  },
  {
    name: 'recovery of an expired lease that fails the task',
    state: 'failed',
    async prepare(w) {
      const { task, assignment } = await w.submitAndClaim({
        retry: { max_attempts: 1, delay_ms: 0 },
      });
      const authority = await w.dispatch(assignment);
      return {
        taskId: task.task_id,
        finish: async () => {
          await w.advancePast(authority.expires_at);
          await w.recoverAll();
        },
      };
    },
  },
  {
    name: 'recovery of an expired lease whose cancellation was requested',
    state: 'cancelled',
    async prepare(w) {
      const { task, assignment } = await w.submitAndClaim();
      const authority = await w.dispatch(assignment);
      expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
      return {
        taskId: task.task_id,
        finish: async () => {
          await w.advancePast(authority.expires_at);
          await w.recoverAll();
        },
      };
    },
  },
];

/**
 * Registers the `CompletionStore` conformance suite (DESIGN §8): subscribing,
 * the terminal hook on every path to a terminal state, leasing and reporting
 * deliveries, and redelivery's generation rule. `makeHarness` runs once, in
 * `beforeAll`; the harness is closed in `afterAll`.
 *
 * @example
 * ```ts
 * runCompletionStoreConformance('memory store', async () => {
 *   const store = createMemoryTaskStore();
 *   return { store, config: store.config, advance: async (ms) => store.advance(ms),
 *            close: async () => {} };
 * });
 * ```
 */
export function runCompletionStoreConformance(
  name: string,
  makeHarness: () => Promise<CompletionConformanceHarness>,
): void {
  describeConformance(name, makeHarness, (setup) => {
    describe('subscribe (DESIGN §8)', () => {
      it('a subscription of a live task waits, with a fresh id and event id', async () => {
        const w = setup();
        const task = await w.submit();
        const { created, subscription } = await subscribe(w, task.task_id, 'k1');
        expect(created).toBe(true);
        expect(subscription).toEqual({
          id: subscription.id,
          task_id: task.task_id,
          subscription_key: 'k1',
          destination: DESTINATION,
          event_id: subscription.event_id,
          state: 'waiting',
          attempts: 0,
          generation: 1,
        });
        expect(subscription.id.length).toBeGreaterThan(0);
        expect(subscription.event_id.length).toBeGreaterThan(0);
        expect(subscription.event_id).not.toBe(subscription.id);
        expect(await w.store.listSubscriptions(w.scope, task.task_id)).toEqual([subscription]);
      });

      it('a subscription of a terminal task is due at once', async () => {
        const w = setup();
        const { taskId } = await terminalTask(w);
        const before = await w.store.now();
        const { created, subscription } = await subscribe(w, taskId);
        const after = await w.store.now();
        expect(created).toBe(true);
        expect(subscription).toMatchObject({ state: 'due', attempts: 0, generation: 1 });
        expect(subscription.next_attempt_at).toBeGreaterThanOrEqual(before);
        expect(subscription.next_attempt_at).toBeLessThanOrEqual(after);
        expect(await w.store.listSubscriptions(w.scope, taskId)).toEqual([subscription]);
      });

      it('the same key and destination answers the existing subscription (created: false)', async () => {
        const w = setup();
        const task = await w.submit();
        const first = await subscribe(w, task.task_id, 'k');
        const again = await subscribe(w, task.task_id, 'k');
        expect(again).toEqual({ created: false, subscription: first.subscription });
        expect(await w.store.listSubscriptions(w.scope, task.task_id)).toHaveLength(1);
      });

      it('a replayed subscribe answers the subscription as it is now', async () => {
        const w = setup();
        const task = await w.submit();
        const first = await subscribe(w, task.task_id, 'k');
        await w.store.cancel(w.scope, task.task_id);
        const again = await subscribe(w, task.task_id, 'k');
        expect(again.created).toBe(false);
        expect(again.subscription).toMatchObject({ id: first.subscription.id, state: 'due' });
      });

      it('the same key with another destination is 409 conflict and changes nothing', async () => {
        const w = setup();
        const task = await w.submit();
        const first = await subscribe(w, task.task_id, 'k');
        await expectContractError(subscribe(w, task.task_id, 'k', 'audit'), 'conflict');
        expect(await w.store.listSubscriptions(w.scope, task.task_id)).toEqual([
          first.subscription,
        ]);
      });

      it(`allows ${MAX_COMPLETION_SUBSCRIPTIONS} subscriptions per task; one more is 409 limit_exceeded`, async () => {
        const w = setup();
        const task = await w.submit();
        const ids: string[] = [];
        for (let n = 1; n <= MAX_COMPLETION_SUBSCRIPTIONS; n += 1) {
          const { created, subscription } = await subscribe(w, task.task_id, `k${n}`);
          expect(created).toBe(true);
          ids.push(subscription.id);
        }
        await expectContractError(subscribe(w, task.task_id, 'one-more'), 'limit_exceeded');
        // A known key still answers at the limit: idempotency comes first.
        expect((await subscribe(w, task.task_id, 'k1')).created).toBe(false);
        const list = await w.store.listSubscriptions(w.scope, task.task_id);
        expect(list.map((subscription) => subscription.id).sort()).toEqual([...ids].sort());
      });

      it('keys are per task: the same key on another task is another subscription', async () => {
        const w = setup();
        const one = await w.submit();
        const two = await w.submit();
        const a = await subscribe(w, one.task_id, 'k');
        const b = await subscribe(w, two.task_id, 'k');
        expect(b.created).toBe(true);
        expect(b.subscription.id).not.toBe(a.subscription.id);
        expect(b.subscription.event_id).not.toBe(a.subscription.event_id);
      });

      it('lists a task’s subscriptions oldest first', async () => {
        const w = setup();
        const task = await w.submit();
        const ids: string[] = [];
        for (const key of ['c', 'a', 'b']) {
          ids.push((await subscribe(w, task.task_id, key)).subscription.id);
          await w.advance(1);
        }
        const list = await w.store.listSubscriptions(w.scope, task.task_id);
        expect(list.map((subscription) => subscription.id)).toEqual(ids);
        expect(await w.store.listSubscriptions(w.scope, (await w.submit()).task_id)).toEqual([]);
      });

      it('answers not_found for an unknown task or a task of another scope', async () => {
        const w = setup();
        const task = await w.submit();
        await expectContractError(subscribe(w, `${task.task_id}x`), 'not_found');
        await expectContractError(
          w.store.subscribe(freshScope(), task.task_id, {
            subscription_key: 'k',
            destination: DESTINATION,
          }),
          'not_found',
        );
        await expectContractError(
          w.store.listSubscriptions(w.scope, `${task.task_id}x`),
          'not_found',
        );
        await expectContractError(
          w.store.listSubscriptions(freshScope(), task.task_id),
          'not_found',
        );
        expect(await w.store.listSubscriptions(w.scope, task.task_id)).toEqual([]);
      });
    });

    describe('the terminal hook (DESIGN §8: due in the same transaction)', () => {
      for (const path of TERMINAL_PATHS) {
        it(`a waiting subscription is due when ${path.name}`, async () => {
          const w = setup();
          const { taskId, finish } = await path.prepare(w);
          const { subscription } = await subscribe(w, taskId);
          await expectWaiting(w, taskId, subscription.id);
          await finish();
          await expectDueAtTerminal(w, taskId, subscription.id, path.state);
        });
      }

      it('marks every waiting subscription of the task due, and only that task’s', async () => {
        const w = setup();
        const task = await w.submit();
        const other = await w.submit();
        const mine = [await subscribe(w, task.task_id), await subscribe(w, task.task_id)];
        const theirs = await subscribe(w, other.task_id);
        await w.store.cancel(w.scope, task.task_id);
        for (const { subscription } of mine) {
          await expectDueAtTerminal(w, task.task_id, subscription.id, 'cancelled');
        }
        await expectWaiting(w, other.task_id, theirs.subscription.id);
      });

      it('a cancel of a terminal task changes no delivery', async () => {
        const w = setup();
        const { subscription, taskId } = await dueSubscription(w);
        const lease = await requireLease(w, subscription.id);
        await w.store.reportDelivery(report(lease, { state: 'delivered' }, 204));
        const delivered = await listed(w, taskId, subscription.id);
        expect(await w.store.cancel(w.scope, taskId)).toBe('cancelled');
        expect(await listed(w, taskId, subscription.id)).toEqual(delivered);
      });
    });

    describe('delivery leases and reports (DESIGN §8 sender)', () => {
      it('a lease starts try 1 and carries the terminal task’s facts', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.store.settle(settleSuccess(assignment));
        const { subscription } = await subscribe(w, task.task_id);
        const status = await w.store.status(w.scope, task.task_id);
        const before = await w.store.now();
        const lease = await requireLease(w, subscription.id);
        const after = await w.store.now();
        expect(lease).toEqual({
          scope: w.scope,
          subscription_id: subscription.id,
          task_id: task.task_id,
          destination: DESTINATION,
          event_id: subscription.event_id,
          generation: 1,
          attempt: 1,
          lease_expires_at: lease.lease_expires_at,
          queue: TEST_QUEUE,
          run_id: task.run_id,
          state: 'succeeded',
          terminal_at: status.terminal_at,
        });
        expect(lease.lease_expires_at).toBeGreaterThanOrEqual(before + SENDER_LEASE_MS);
        expect(lease.lease_expires_at).toBeLessThanOrEqual(after + SENDER_LEASE_MS);
        expect(await listed(w, task.task_id, subscription.id)).toMatchObject({
          state: 'delivering',
          attempts: 1,
          generation: 1,
          next_attempt_at: lease.lease_expires_at,
        });
      });

      it('never leases a waiting delivery', async () => {
        const w = setup();
        const task = await w.submit();
        const { subscription } = await subscribe(w, task.task_id);
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
        await expectWaiting(w, task.task_id, subscription.id);
      });

      it('a held lease is not leased again until it runs out; then the next try is attempt 2', async () => {
        const w = setup();
        const { taskId, subscription } = await dueSubscription(w);
        const first = await requireLease(w, subscription.id);
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
        expect(await listed(w, taskId, subscription.id)).toMatchObject({
          state: 'delivering',
          attempts: 1,
        });
        await w.advancePast(first.lease_expires_at - 1);
        const second = await requireLease(w, subscription.id);
        expect(second).toMatchObject({ attempt: 2, generation: 1, event_id: first.event_id });
        expect(second.lease_expires_at).toBeGreaterThan(first.lease_expires_at);
        // The first sender's lease ran out: its late report is stale.
        expect(await w.store.reportDelivery(report(first, { state: 'delivered' }, 200))).toBe(
          false,
        );
        expect(await listed(w, taskId, subscription.id)).toMatchObject({
          state: 'delivering',
          attempts: 2,
        });
      });

      it('honours the lease length it is given', async () => {
        const w = setup();
        const { subscription } = await dueSubscription(w);
        const before = await w.store.now();
        const lease = await requireLease(w, subscription.id, 1_000);
        const after = await w.store.now();
        expect(lease.lease_expires_at).toBeGreaterThanOrEqual(before + 1_000);
        expect(lease.lease_expires_at).toBeLessThanOrEqual(after + 1_000);
      });

      it('leases at most `limit` deliveries per call', async () => {
        const w = setup();
        for (let n = 0; n < 3; n += 1) await dueSubscription(w);
        expect((await w.store.leaseDeliveries(2, SENDER_LEASE_MS)).length).toBeLessThanOrEqual(2);
        expect((await w.store.leaseDeliveries(1, SENDER_LEASE_MS)).length).toBeLessThanOrEqual(1);
      });

      it('a delivered report finishes the delivery with the receiver’s status', async () => {
        const w = setup();
        const { taskId, subscription } = await dueSubscription(w);
        const lease = await requireLease(w, subscription.id);
        const before = await w.store.now();
        expect(await w.store.reportDelivery(report(lease, { state: 'delivered' }, 204))).toBe(true);
        const after = await w.store.now();
        const delivered = await listed(w, taskId, subscription.id);
        expect(delivered).toEqual({
          ...subscription,
          state: 'delivered',
          attempts: 1,
          next_attempt_at: undefined,
          delivered_at: delivered.delivered_at,
          last_status_code: 204,
        });
        expect(delivered).not.toHaveProperty('next_attempt_at');
        expect(delivered.delivered_at).toBeGreaterThanOrEqual(before);
        expect(delivered.delivered_at).toBeLessThanOrEqual(after);
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
      });

      it('a due report schedules the next try after its delay, recording the failure', async () => {
        const w = setup();
        const { taskId, subscription } = await dueSubscription(w);
        const lease = await requireLease(w, subscription.id);
        const before = await w.store.now();
        const failed = report(lease, { state: 'due', delay_ms: 5_000 }, 503, 'HTTP 503');
        expect(await w.store.reportDelivery(failed)).toBe(true);
        const after = await w.store.now();
        const due = await listed(w, taskId, subscription.id);
        expect(due).toMatchObject({
          state: 'due',
          attempts: 1,
          last_status_code: 503,
          last_error: 'HTTP 503',
        });
        const next = due.next_attempt_at ?? Number.NaN;
        expect(next).toBeGreaterThanOrEqual(before + 5_000);
        expect(next).toBeLessThanOrEqual(after + 5_000);
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
        await w.advancePast(next - 1);
        expect(await requireLease(w, subscription.id)).toMatchObject({ attempt: 2 });
      });

      it('an exhausted report finishes the delivery without a next try', async () => {
        const w = setup();
        const { taskId, subscription } = await dueSubscription(w);
        const lease = await requireLease(w, subscription.id);
        const exhausted = report(lease, { state: 'exhausted' }, 410, 'HTTP 410');
        expect(await w.store.reportDelivery(exhausted)).toBe(true);
        const row = await listed(w, taskId, subscription.id);
        expect(row).toMatchObject({
          state: 'exhausted',
          attempts: 1,
          last_status_code: 410,
          last_error: 'HTTP 410',
        });
        expect(row.next_attempt_at).toBeUndefined();
        expect(row.delivered_at).toBeUndefined();
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
      });

      it('reports made together are each recorded as one report would be, answered in their order', async () => {
        const w = setup();
        const overtaken = await dueSubscription(w);
        const first = await requireLease(w, overtaken.subscription.id, 1_000);
        await w.advancePast(first.lease_expires_at - 1);
        const second = await requireLease(w, overtaken.subscription.id);
        const delivered = await dueSubscription(w);
        const failed = await dueSubscription(w);
        const leased = await leaseAll(w);
        const leaseFor = (id: string): CompletionLease => {
          const lease = leased.find((l) => l.subscription_id === id);
          if (lease === undefined) throw new Error(`subscription ${id} was not leased`);
          return lease;
        };
        const reports = [
          report(leaseFor(delivered.subscription.id), { state: 'delivered' }, 200),
          // The first sender's try was overtaken: stale, whatever else is in the call.
          report(first, { state: 'delivered' }, 200),
          report(
            leaseFor(failed.subscription.id),
            { state: 'due', delay_ms: 5_000 },
            503,
            'HTTP 503',
          ),
        ];
        const before = await w.store.now();
        expect(await w.store.reportDeliveries(reports)).toEqual([true, false, true]);
        expect(await listed(w, delivered.taskId, delivered.subscription.id)).toMatchObject({
          state: 'delivered',
          last_status_code: 200,
        });
        const due = await listed(w, failed.taskId, failed.subscription.id);
        expect(due).toMatchObject({ state: 'due', attempts: 1, last_error: 'HTTP 503' });
        expect(due.next_attempt_at).toBeGreaterThanOrEqual(before + 5_000);
        expect(await listed(w, overtaken.taskId, overtaken.subscription.id)).toMatchObject({
          state: 'delivering',
          attempts: second.attempt,
        });
        expect(await w.store.reportDeliveries([])).toEqual([]);
      });

      it('a stale report (wrong try, generation or scope, or already reported) changes nothing', async () => {
        const w = setup();
        const { taskId, subscription } = await dueSubscription(w);
        const lease = await requireLease(w, subscription.id);
        const before = await listed(w, taskId, subscription.id);
        const delivered = report(lease, { state: 'delivered' }, 200);
        for (const stale of [
          { ...delivered, attempt: lease.attempt + 1 },
          { ...delivered, attempt: lease.attempt - 1 },
          { ...delivered, generation: lease.generation + 1 },
          { ...delivered, scope: freshScope() },
          { ...delivered, subscription_id: `${lease.subscription_id}x` },
        ]) {
          expect(await w.store.reportDelivery(stale)).toBe(false);
        }
        expect(await listed(w, taskId, subscription.id)).toEqual(before);
        expect(await w.store.reportDelivery(delivered)).toBe(true);
        const after = await listed(w, taskId, subscription.id);
        // Reporting the same try twice is stale too: the try is no longer delivering.
        expect(
          await w.store.reportDelivery(report(lease, { state: 'due', delay_ms: 0 }, 500)),
        ).toBe(false);
        expect(await listed(w, taskId, subscription.id)).toEqual(after);
      });

      it(`a sender that never reports: exhausted after ${COMPLETION_MAX_ATTEMPTS} tries`, async () => {
        const w = setup();
        const { taskId, subscription } = await dueSubscription(w);
        for (let attempt = 1; attempt <= COMPLETION_MAX_ATTEMPTS; attempt += 1) {
          const lease = await requireLease(w, subscription.id);
          expect(lease.attempt).toBe(attempt);
          await w.advancePast(lease.lease_expires_at - 1);
        }
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
        const row = await listed(w, taskId, subscription.id);
        expect(row).toMatchObject({
          state: 'exhausted',
          attempts: COMPLETION_MAX_ATTEMPTS,
          generation: 1,
        });
        expect(row.next_attempt_at).toBeUndefined();
        expect(row.last_error?.length).toBeGreaterThan(0);
      });

      it('a due report of the last try exhausts the delivery', async () => {
        const w = setup();
        const { taskId, subscription } = await dueSubscription(w);
        for (let attempt = 1; attempt <= COMPLETION_MAX_ATTEMPTS; attempt += 1) {
          const lease = await requireLease(w, subscription.id);
          expect(lease.attempt).toBe(attempt);
          const failed = report(lease, { state: 'due', delay_ms: 0 }, 500, 'HTTP 500');
          expect(await w.store.reportDelivery(failed)).toBe(true);
        }
        expect(await listed(w, taskId, subscription.id)).toMatchObject({
          state: 'exhausted',
          attempts: COMPLETION_MAX_ATTEMPTS,
          last_status_code: 500,
        });
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
      });

      it('the due backlog counts due deliveries, up to its limit', async () => {
        const w = setup();
        await dueSubscription(w);
        expect(await w.store.dueBacklog(1)).toBe(1);
        expect(await w.store.dueBacklog(MAX_COMPLETION_BATCH)).toBeGreaterThanOrEqual(1);
        expect(await w.store.dueBacklog(MAX_COMPLETION_BATCH)).toBeLessThanOrEqual(
          MAX_COMPLETION_BATCH,
        );
      });
    });

    describe(`a lost last try (its sender died after leasing try ${COMPLETION_MAX_ATTEMPTS})`, () => {
      /**
       * A delivery whose tries 1..COMPLETION_MAX_ATTEMPTS − 1 failed with 503
       * and whose last try was leased and never reported: the row is
       * `delivering` the last try until the lease's end.
       */
      async function lastTryLeased(w: CompletionWorld) {
        const { taskId, subscription } = await dueSubscription(w);
        for (let attempt = 1; attempt < COMPLETION_MAX_ATTEMPTS; attempt += 1) {
          const lease = await requireLease(w, subscription.id);
          expect(lease.attempt).toBe(attempt);
          const failed = report(lease, { state: 'due', delay_ms: 0 }, 503, 'HTTP 503');
          expect(await w.store.reportDelivery(failed)).toBe(true);
        }
        const last = await requireLease(w, subscription.id);
        expect(last.attempt).toBe(COMPLETION_MAX_ATTEMPTS);
        return { taskId, subscription, last };
      }

      it('is exhausted in the views once its lease ends, as the next lease then writes it', async () => {
        const w = setup();
        const { taskId, subscription, last } = await lastTryLeased(w);
        // While the lease runs the sender may still report: the try is in progress.
        expect(await listed(w, taskId, subscription.id)).toMatchObject({
          state: 'delivering',
          attempts: COMPLETION_MAX_ATTEMPTS,
          next_attempt_at: last.lease_expires_at,
        });
        await w.advancePast(last.lease_expires_at - 1);
        // No sender leased since: only the views can say what became of the delivery.
        const view = await listed(w, taskId, subscription.id);
        expect(view).toEqual({
          ...subscription,
          state: 'exhausted',
          attempts: COMPLETION_MAX_ATTEMPTS,
          next_attempt_at: undefined,
          // The lost try got no answer: the earlier tries' 503 does not describe it.
          last_error: DELIVERY_LEASE_EXPIRED_ERROR,
        });
        expect(view).not.toHaveProperty('next_attempt_at');
        expect(view).not.toHaveProperty('last_status_code');
        const replayed = await subscribe(w, taskId, subscription.subscription_key);
        expect(replayed).toEqual({ created: false, subscription: view });
        // The next lease exhausts the row (no try starts), writing what the views showed.
        expect(await leaseOf(w, subscription.id)).toBeUndefined();
        expect(await listed(w, taskId, subscription.id)).toEqual(view);
      });

      it('a report of it arriving after its lease ended is stale: the exhausted the views showed stands', async () => {
        const w = setup();
        const { taskId, subscription, last } = await lastTryLeased(w);
        await w.advancePast(last.lease_expires_at - 1);
        const shown = await listed(w, taskId, subscription.id);
        expect(shown).toMatchObject({
          state: 'exhausted',
          last_error: DELIVERY_LEASE_EXPIRED_ERROR,
        });
        expect(await w.store.reportDelivery(report(last, { state: 'delivered' }, 200))).toBe(false);
        expect(await listed(w, taskId, subscription.id)).toEqual(shown);
      });

      it('a report of it while its lease runs is taken', async () => {
        const w = setup();
        const { taskId, subscription, last } = await lastTryLeased(w);
        expect(await w.store.reportDelivery(report(last, { state: 'delivered' }, 200))).toBe(true);
        expect(await listed(w, taskId, subscription.id)).toMatchObject({
          state: 'delivered',
          attempts: COMPLETION_MAX_ATTEMPTS,
          last_status_code: 200,
        });
      });

      it('is 409 to redeliver while its lease runs; once it ended, redelivery starts the next generation', async () => {
        const w = setup();
        const { taskId, subscription, last } = await lastTryLeased(w);
        await expectContractError(
          w.store.redeliver(w.scope, subscription.id, { generation: 1 }),
          'conflict',
        );
        await w.advancePast(last.lease_expires_at - 1);
        const next = await redeliverFirstGeneration(w, taskId, subscription);
        // The same request again starts nothing.
        expect(await w.store.redeliver(w.scope, subscription.id, { generation: 1 })).toEqual(next);
        await expectSecondGenerationLeased(w, subscription);
        // The lost try's sender reports after all: its generation is over, the report is stale.
        expect(await w.store.reportDelivery(report(last, { state: 'delivered' }, 200))).toBe(false);
      });
    });

    describe('redeliver (DESIGN §8 generation rule)', () => {
      /** A subscription whose generation 1 was delivered. */
      async function delivered(w: CompletionWorld) {
        const { taskId, subscription } = await dueSubscription(w);
        const lease = await requireLease(w, subscription.id);
        expect(await w.store.reportDelivery(report(lease, { state: 'delivered' }, 200))).toBe(true);
        return { taskId, subscription };
      }

      it('naming the delivered generation starts the next one: same event, due now, attempts 0', async () => {
        const w = setup();
        const { taskId, subscription } = await delivered(w);
        await redeliverFirstGeneration(w, taskId, subscription);
        await expectSecondGenerationLeased(w, subscription);
      });

      it('naming the previous generation again answers the subscription unchanged', async () => {
        const w = setup();
        const { taskId, subscription } = await delivered(w);
        const next = await w.store.redeliver(w.scope, subscription.id, { generation: 1 });
        expect(await w.store.redeliver(w.scope, subscription.id, { generation: 1 })).toEqual(next);
        expect(await w.store.listSubscriptions(w.scope, taskId)).toEqual([next]);
      });

      it('naming the current generation while it is waiting, due or delivering is 409 conflict', async () => {
        const w = setup();
        const task = await w.submit();
        const waiting = await subscribe(w, task.task_id);
        await expectContractError(
          w.store.redeliver(w.scope, waiting.subscription.id, { generation: 1 }),
          'conflict',
        );
        const { taskId, subscription } = await dueSubscription(w);
        await expectContractError(
          w.store.redeliver(w.scope, subscription.id, { generation: 1 }),
          'conflict',
        );
        await requireLease(w, subscription.id);
        await expectContractError(
          w.store.redeliver(w.scope, subscription.id, { generation: 1 }),
          'conflict',
        );
        expect(await listed(w, taskId, subscription.id)).toMatchObject({
          state: 'delivering',
          generation: 1,
        });
      });

      it('naming any other generation is 409 conflict', async () => {
        const w = setup();
        const { taskId, subscription } = await delivered(w);
        await expectContractError(
          w.store.redeliver(w.scope, subscription.id, { generation: 2 }),
          'conflict',
        );
        await w.store.redeliver(w.scope, subscription.id, { generation: 1 });
        await expectContractError(
          w.store.redeliver(w.scope, subscription.id, { generation: 3 }),
          'conflict',
        );
        expect(await listed(w, taskId, subscription.id)).toMatchObject({ generation: 2 });
      });

      it('an exhausted generation may be redelivered too', async () => {
        const w = setup();
        const { subscription } = await dueSubscription(w);
        const lease = await requireLease(w, subscription.id);
        await w.store.reportDelivery(report(lease, { state: 'exhausted' }, 500, 'HTTP 500'));
        const next = await w.store.redeliver(w.scope, subscription.id, { generation: 1 });
        expect(next).toMatchObject({ state: 'due', generation: 2, attempts: 0 });
        expect(next.last_status_code).toBeUndefined();
        expect(next.last_error).toBeUndefined();
        expect(next.event_id).toBe(subscription.event_id);
      });

      it('answers not_found for an unknown subscription or one of another scope', async () => {
        const w = setup();
        const { taskId, subscription } = await delivered(w);
        const before = await listed(w, taskId, subscription.id);
        await expectContractError(
          w.store.redeliver(w.scope, `${subscription.id}x`, { generation: 1 }),
          'not_found',
        );
        await expectContractError(
          w.store.redeliver(freshScope(), subscription.id, { generation: 1 }),
          'not_found',
        );
        // Another namespace of the same tenant is another scope as well.
        await expectContractError(
          w.store.redeliver(
            { ...w.scope, namespace: `${w.scope.namespace}-other` },
            subscription.id,
            {
              generation: 1,
            },
          ),
          'not_found',
        );
        expect(await listed(w, taskId, subscription.id)).toEqual(before);
      });
    });
  });
}

/** The world's scope with its own retention policy of MIN_RETENTION_MS. */
async function shortRetention(w: CompletionWorld): Promise<number> {
  await w.store.setRetentionPolicy(w.scope, { retention_ms: MIN_RETENTION_MS });
  return MIN_RETENTION_MS;
}

/** Whether the task is gone: every read of it answers not_found. */
async function expectRemoved(w: CompletionWorld, taskId: string): Promise<void> {
  await expectContractError(w.store.status(w.scope, taskId), 'not_found');
  await expectContractError(w.store.history(w.scope, taskId, 0), 'not_found');
  await expectContractError(w.store.listSubscriptions(w.scope, taskId), 'not_found');
}

/**
 * Registers the `RetentionStore` conformance suite: per-namespace policies,
 * the bounded preview, collection of retired tasks (and only those) with
 * everything they own, expired sessions, and the walk over scopes.
 * `makeHarness` runs once, in `beforeAll`; the harness is closed in `afterAll`.
 *
 * @example
 * ```ts
 * runRetentionStoreConformance('memory store', async () => {
 *   const store = createMemoryTaskStore();
 *   return { store, config: store.config, advance: async (ms) => store.advance(ms),
 *            close: async () => {} };
 * });
 * ```
 */
export function runRetentionStoreConformance(
  name: string,
  makeHarness: () => Promise<CompletionConformanceHarness>,
): void {
  describeConformance(name, makeHarness, (setup) => {
    describe('retention policy', () => {
      it('a namespace without a policy of its own uses the store default', async () => {
        const w = setup();
        expect(await w.store.retentionPolicy(w.scope)).toEqual({
          retention_ms: w.config.terminalRetentionMs,
          source: 'default',
        });
      });

      it('a namespace’s own policy replaces the default, for that namespace only', async () => {
        const w = setup();
        const before = await w.store.now();
        const set = await w.store.setRetentionPolicy(w.scope, { retention_ms: MIN_RETENTION_MS });
        const after = await w.store.now();
        expect(set).toEqual({
          retention_ms: MIN_RETENTION_MS,
          source: 'namespace',
          updated_at: set.updated_at,
        });
        expect(set.updated_at).toBeGreaterThanOrEqual(before);
        expect(set.updated_at).toBeLessThanOrEqual(after);
        expect(await w.store.retentionPolicy(w.scope)).toEqual(set);
        const sibling = { ...w.scope, namespace: `${w.scope.namespace}-other` };
        expect((await w.store.retentionPolicy(sibling)).source).toBe('default');
        await w.advance(1_000);
        // The same policy again: the same answer, set when it was first set (DESIGN §1.3; until
        // 2026-12-05 its updated_at moved on every repeat).
        expect(
          await w.store.setRetentionPolicy(w.scope, { retention_ms: MIN_RETENTION_MS }),
        ).toEqual(set);
        expect(await w.store.retentionPolicy(w.scope)).toEqual(set);
        const changed = await w.store.setRetentionPolicy(w.scope, {
          retention_ms: 2 * MIN_RETENTION_MS,
        });
        expect(changed.retention_ms).toBe(2 * MIN_RETENTION_MS);
        expect(changed.updated_at).toBeGreaterThan(set.updated_at ?? Number.NaN);
        expect(await w.store.retentionPolicy(w.scope)).toEqual(changed);
      });
    });

    describe('preview', () => {
      it('counts the terminal tasks older than the cutoff, never live ones', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        const first = await terminalTask(w);
        await w.advance(1);
        await terminalTask(w);
        await w.submit();
        const young = await w.store.previewRetention(w.scope);
        expect(young).toEqual({
          retention_ms: retention,
          as_of: young.as_of,
          cutoff: young.as_of - retention,
          candidates: 0,
          truncated: false,
        });
        await w.advance(retention + 1_000);
        // A task whose delivery is pending is still an age candidate: a
        // candidate is not a promise of removal.
        await subscribe(w, first.taskId);
        const old = await w.store.previewRetention(w.scope);
        expect(old).toEqual({
          retention_ms: retention,
          as_of: old.as_of,
          cutoff: old.as_of - retention,
          candidates: 2,
          truncated: false,
          oldest_terminal_at: first.terminalAt,
        });
      });

      it('counts up to its limit and says when there are more', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        for (let n = 0; n < 3; n += 1) await terminalTask(w);
        await w.advance(retention + 1_000);
        expect(await w.store.previewRetention(w.scope, 2)).toMatchObject({
          candidates: 2,
          truncated: true,
        });
        expect(await w.store.previewRetention(w.scope, 3)).toMatchObject({
          candidates: 3,
          truncated: false,
        });
      });
    });

    describe('collection', () => {
      it('removes retired tasks with their attempts, history and sessions; keeps the rest', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        // Old and retired: a settled task (attempt and history) and a cancelled one.
        const settled = await w.submitAndClaim();
        await w.store.settle(settleSuccess(settled.assignment));
        const cancelled = await terminalTask(w);
        // Old but protected: a delivery still pending, and one that will finish late.
        const pending = await dueSubscription(w);
        const late = await dueSubscription(w);
        // Never a candidate: a live task, however old.
        const live = await w.submit();
        const history = [
          ...(await w.events(settled.task.task_id)),
          ...(await w.events(cancelled.taskId)),
        ];

        // Past the retention and the session's validity, so the session expired before the cutoff.
        await w.advance(retention + w.config.sessionValidityMs + 1_000);
        const lease = await requireLease(w, late.subscription.id);
        await w.store.reportDelivery(report(lease, { state: 'delivered' }, 200));
        // Young: terminal after the advance.
        const young = await terminalTask(w);

        const progress = await w.store.collectRetired(w.scope);
        expect(progress).toEqual({
          cutoff: progress.cutoff,
          tasks_removed: 2,
          attempts_removed: 1,
          history_removed: history.length,
          subscriptions_removed: 0,
          sessions_removed: 1,
          has_more: false,
        });
        const now = await w.store.now();
        expect(progress.cutoff).toBeLessThanOrEqual(now - retention);
        expect(progress.cutoff).toBeGreaterThanOrEqual(young.terminalAt - retention);

        await expectRemoved(w, settled.task.task_id);
        await expectRemoved(w, cancelled.taskId);
        await expectContractError(
          w.store.inspectAttempt(w.scope, settled.task.task_id, settled.assignment.event.id),
          'not_found',
        );
        // The expired session went with its cursor.
        await expectContractError(
          w.store.extendSession(w.scope, settled.session.id),
          'session_not_found',
        );
        for (const taskId of [pending.taskId, late.taskId, live.task_id, young.taskId]) {
          expect((await w.store.status(w.scope, taskId)).task_id).toBe(taskId);
        }
        expect(await w.store.listSubscriptions(w.scope, late.taskId)).toHaveLength(1);
        expect((await w.store.collectRetired(w.scope)).tasks_removed).toBe(0);
      });

      it('a finished delivery protects its task until its own finish is older than the cutoff', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        const { taskId, subscription } = await dueSubscription(w);
        await w.advance(retention + 1_000);
        const lease = await requireLease(w, subscription.id);
        await w.store.reportDelivery(report(lease, { state: 'delivered' }, 200));
        expect((await w.store.collectRetired(w.scope)).tasks_removed).toBe(0);
        await w.advance(retention + 1_000);
        const progress = await w.store.collectRetired(w.scope);
        expect(progress).toMatchObject({ tasks_removed: 1, subscriptions_removed: 1 });
        await expectRemoved(w, taskId);
        await expectContractError(
          w.store.redeliver(w.scope, subscription.id, { generation: 1 }),
          'not_found',
        );
      });

      it('uses the store default when the namespace has no policy', async () => {
        const w = setup();
        const { taskId } = await terminalTask(w);
        await w.advance(w.config.terminalRetentionMs - 1_000);
        expect((await w.store.collectRetired(w.scope)).tasks_removed).toBe(0);
        await w.advance(2_000);
        const progress = await w.store.collectRetired(w.scope);
        expect(progress.tasks_removed).toBe(1);
        await expectRemoved(w, taskId);
      });

      it('touches only its own scope', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        const sibling = { ...w.scope, namespace: `${w.scope.namespace}-other` };
        await w.store.setRetentionPolicy(sibling, { retention_ms: retention });
        const theirs = await w.store.submit(submitCommand(sibling));
        await w.store.cancel(sibling, theirs.snapshot.task_id);
        const mine = await terminalTask(w);
        await w.advance(retention + 1_000);
        expect((await w.store.collectRetired(w.scope)).tasks_removed).toBe(1);
        await expectRemoved(w, mine.taskId);
        expect((await w.store.status(sibling, theirs.snapshot.task_id)).state).toBe('cancelled');
      });

      it('removes sessions that expired before the cutoff, never live ones', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        const expired = await w.session();
        await w.advance(retention + w.config.sessionValidityMs + 1_000);
        await expectContractError(w.store.extendSession(w.scope, expired.id), 'session_expired');
        const live = await w.session();
        const progress = await w.store.collectRetired(w.scope);
        expect(progress).toMatchObject({ tasks_removed: 0, sessions_removed: 1, has_more: false });
        await expectContractError(w.store.extendSession(w.scope, expired.id), 'session_not_found');
        expect((await w.store.extendSession(w.scope, live.id)).id).toBe(live.id);
      });

      it('is bounded by its limit, oldest terminal first, with has_more when full', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        const tasks: string[] = [];
        for (let n = 0; n < 3; n += 1) {
          tasks.push((await terminalTask(w)).taskId);
          await w.advance(1);
        }
        await w.advance(retention + 1_000);
        const first = await w.store.collectRetired(w.scope, 2);
        expect(first).toMatchObject({ tasks_removed: 2, has_more: true });
        await expectRemoved(w, tasks[0] ?? '');
        await expectRemoved(w, tasks[1] ?? '');
        expect((await w.store.status(w.scope, tasks[2] ?? '')).state).toBe('cancelled');
        const second = await w.store.collectRetired(w.scope, 2);
        expect(second).toMatchObject({ tasks_removed: 1, has_more: false });
        const third = await w.store.collectRetired(w.scope, 2);
        expect(third).toMatchObject({ tasks_removed: 0, sessions_removed: 0, has_more: false });
      });

      it('keeps collecting what was retiring after the policy is lengthened (seed RetentionPolicy)', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        const retiring: string[] = [];
        for (let n = 0; n < 3; n += 1) retiring.push((await terminalTask(w)).taskId);
        await w.advance(retention + 1_000);
        // Terminal after the old cutoff: not retiring when the policy changes.
        const young = await terminalTask(w);
        expect(await w.store.collectRetired(w.scope, 1)).toMatchObject({
          tasks_removed: 1,
          has_more: true,
        });
        await w.store.setRetentionPolicy(w.scope, { retention_ms: MAX_RETENTION_MS });
        expect((await w.store.previewRetention(w.scope)).candidates).toBe(2);
        expect((await w.store.collectRetired(w.scope)).tasks_removed).toBe(2);
        for (const taskId of retiring) await expectRemoved(w, taskId);
        await w.advance(retention + 1_000);
        expect((await w.store.collectRetired(w.scope)).tasks_removed).toBe(0);
        expect((await w.store.status(w.scope, young.taskId)).state).toBe('cancelled');
      });

      it('lists a namespace whose only garbage is expired sessions, and collects them', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        const expired = await w.session();
        await w.advance(retention + w.config.sessionValidityMs + 1_000);
        expect(await w.store.retentionScopes(undefined, MAX_RETENTION_BATCH)).toContainEqual(
          w.scope,
        );
        expect((await w.store.collectRetired(w.scope)).sessions_removed).toBe(1);
        await expectContractError(w.store.extendSession(w.scope, expired.id), 'session_not_found');
      });

      it('has_more when the sessions fill the pass', async () => {
        const w = setup();
        const retention = await shortRetention(w);
        await w.store.openSession(openSessionCommand(w.scope));
        await w.store.openSession(openSessionCommand(w.scope));
        await w.advance(retention + w.config.sessionValidityMs + 1_000);
        expect(await w.store.collectRetired(w.scope, 1)).toMatchObject({
          tasks_removed: 0,
          sessions_removed: 1,
          has_more: true,
        });
        expect(await w.store.collectRetired(w.scope, 1)).toMatchObject({
          sessions_removed: 1,
          has_more: true,
        });
        expect(await w.store.collectRetired(w.scope, 1)).toMatchObject({
          sessions_removed: 0,
          has_more: false,
        });
      });

      it(`rejects limits outside 1..MAX_RETENTION_BATCH (${MAX_RETENTION_BATCH})`, async () => {
        const w = setup();
        const task = await terminalTask(w);
        for (const bad of [0, -1, 1.5, MAX_RETENTION_BATCH + 1]) {
          await expect(w.store.previewRetention(w.scope, bad)).rejects.toThrow();
          await expect(w.store.collectRetired(w.scope, bad)).rejects.toThrow();
          await expect(w.store.retentionScopes(undefined, bad)).rejects.toThrow();
        }
        expect((await w.store.status(w.scope, task.taskId)).state).toBe('cancelled');
      });
    });

    describe('retention scopes', () => {
      /** One cancelled task in each namespace of the world's tenant. */
      async function terminalIn(w: CompletionWorld, namespaces: readonly string[]) {
        for (const namespace of namespaces) {
          const scope: Scope = { tenant_id: w.scope.tenant_id, namespace };
          const { snapshot } = await w.store.submit(submitCommand(scope));
          await w.store.cancel(scope, snapshot.task_id);
        }
      }
      const mine = (w: CompletionWorld, scopes: Scope[]) =>
        scopes.filter((scope) => scope.tenant_id === w.scope.tenant_id).map((s) => s.namespace);

      it('walks the namespaces holding terminal tasks in UTF-8 byte order', async () => {
        const w = setup();
        // Byte order differs from UTF-16 order ('𝐀' is a surrogate pair) and
        // from locale collations ('B' before 'a').
        await terminalIn(w, ['𝐀', 'a', 'Ａ', 'B']);
        // A namespace with only a live task holds nothing to retire.
        await w.store.submit(submitCommand({ tenant_id: w.scope.tenant_id, namespace: 'live' }));
        const start: Scope = { tenant_id: w.scope.tenant_id, namespace: '!' };
        const walk = await w.store.retentionScopes(start, 10);
        // Nothing sorts between two namespaces of one random tenant.
        expect(walk.slice(0, 4)).toEqual(
          ['B', 'a', 'Ａ', '𝐀'].map((namespace) => ({ tenant_id: w.scope.tenant_id, namespace })),
        );
        expect(mine(w, walk)).toEqual(['B', 'a', 'Ａ', '𝐀']);
      });

      it('`after` is exclusive and `limit` bounds the page', async () => {
        const w = setup();
        await terminalIn(w, ['a', 'b', 'c']);
        const tenant = w.scope.tenant_id;
        expect(await w.store.retentionScopes({ tenant_id: tenant, namespace: 'a' }, 1)).toEqual([
          { tenant_id: tenant, namespace: 'b' },
        ]);
        const page = await w.store.retentionScopes({ tenant_id: tenant, namespace: 'a' }, 2);
        expect(page).toEqual([
          { tenant_id: tenant, namespace: 'b' },
          { tenant_id: tenant, namespace: 'c' },
        ]);
      });

      it('pages from the start in strictly increasing order', async () => {
        const w = setup();
        await terminalIn(w, ['a']);
        const page = await w.store.retentionScopes(undefined, 50);
        expect(page.length).toBeGreaterThanOrEqual(1);
        expect(page.length).toBeLessThanOrEqual(50);
        for (let n = 1; n < page.length; n += 1) {
          const [a, b] = [page[n - 1], page[n]];
          if (a === undefined || b === undefined) throw new Error('unreachable');
          const order =
            Buffer.compare(Buffer.from(a.tenant_id), Buffer.from(b.tenant_id)) ||
            Buffer.compare(Buffer.from(a.namespace), Buffer.from(b.namespace));
          expect(order).toBeLessThan(0);
        }
      });
    });
  });
}
