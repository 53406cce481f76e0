/**
 * A lost last try on PostgreSQL (DESIGN §8): a sender leased a generation's last try
 * (COMPLETION_MAX_ATTEMPTS) and died. Once its lease ends nothing can happen to the delivery but
 * its exhaustion by the next lease, which may be long in coming (leases walk oldest first,
 * behind any backlog) or never come (no sender runs). The views say `exhausted` from the lease's
 * end, in store time, without writing; they agree with the row the lease statement then writes.
 * Redelivery writes the exhaustion and applies the generation rule in one transaction; a refused
 * redelivery writes nothing. The conformance suite holds both stores to the views' answers; this
 * file checks the rows underneath.
 */
import { COMPLETION_MAX_ATTEMPTS, type Scope } from '@ledgence/contracts';
import {
  type CompletionLease,
  completionSubscription,
  leaseDelivery,
  type SubscriptionRow,
} from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { subscriptionFromDb } from './codec.js';
import { loadSubscriptions } from './completion-sql.js';
import { type Harness, harness, outcomeCode, SCOPE, submitCommand } from './testdata/fixtures.js';

/**
 * The lost try's lease: far longer than the test, so only the store clock's offset (never the
 * process clock) can carry store time past its end.
 */
const LAST_LEASE_MS = 600_000;

let h: Harness;
beforeAll(async () => {
  h = await harness('completion_lost_try');
});
afterAll(() => h.close());

/** A subscription whose delivery is due: its task was cancelled first. */
async function dueDelivery(key: string): Promise<{ taskId: string; subscriptionId: string }> {
  const { snapshot } = await h.store.submit(submitCommand(key));
  await h.store.cancel(SCOPE, snapshot.task_id);
  const { subscription } = await h.store.subscribe(SCOPE, snapshot.task_id, {
    subscription_key: key,
    destination: 'billing',
  });
  return { taskId: snapshot.task_id, subscriptionId: subscription.id };
}

/** The only lease of `subscriptionId` a lease call now takes (each test's own database rows). */
async function leaseOf(subscriptionId: string, leaseMs: number): Promise<CompletionLease> {
  const leases = await h.store.leaseDeliveries(10, leaseMs);
  const mine = leases.find((lease) => lease.subscription_id === subscriptionId);
  if (mine === undefined) throw new Error(`subscription ${subscriptionId} was not leased`);
  return mine;
}

/**
 * Fails tries 1..COMPLETION_MAX_ATTEMPTS − 1 of the delivery's current generation (503, due at
 * once), leases its last try and never reports it; then moves store time to the lease's end.
 */
async function loseLastTry(subscriptionId: string, generation: number): Promise<CompletionLease> {
  for (let attempt = 1; attempt < COMPLETION_MAX_ATTEMPTS; attempt += 1) {
    const lease = await leaseOf(subscriptionId, 60_000);
    expect(lease).toMatchObject({ generation, attempt });
    const failed = {
      scope: lease.scope,
      subscription_id: subscriptionId,
      generation,
      attempt,
      next: { state: 'due' as const, delay_ms: 0 },
      status_code: 503,
      error: 'HTTP 503',
    };
    expect(await h.store.reportDelivery(failed)).toBe(true);
  }
  const last = await leaseOf(subscriptionId, LAST_LEASE_MS);
  expect(last).toMatchObject({ generation, attempt: COMPLETION_MAX_ATTEMPTS });
  h.advance(LAST_LEASE_MS);
  return last;
}

/** The delivery's row as stored, read outside any store transaction. */
async function stored(scope: Scope, taskId: string, subscriptionId: string) {
  const rows = await loadSubscriptions(h.sql, { ...scope, task_id: taskId });
  const found = rows
    .map((r) => subscriptionFromDb(r))
    .find((r) => r.subscription_id === subscriptionId);
  if (found === undefined) throw new Error(`no subscription ${subscriptionId}`);
  return found;
}

describe('a lost last try, once its lease ended', () => {
  it('the views say exhausted without writing; the lease statement then writes that row', async () => {
    const { taskId, subscriptionId } = await dueDelivery('views');
    await loseLastTry(subscriptionId, 1);
    const lost: SubscriptionRow = await stored(SCOPE, taskId, subscriptionId);
    expect(lost).toMatchObject({ state: 'delivering', attempts: COMPLETION_MAX_ATTEMPTS });

    const [view] = await h.store.listSubscriptions(SCOPE, taskId);
    expect(view).toMatchObject({ state: 'exhausted', attempts: COMPLETION_MAX_ATTEMPTS });
    const replay = await h.store.subscribe(SCOPE, taskId, {
      subscription_key: 'views',
      destination: 'billing',
    });
    expect(replay).toEqual({ created: false, subscription: view });
    // Read-only: the delivery is exhausted by the lease, never by a read.
    expect(await stored(SCOPE, taskId, subscriptionId)).toEqual(lost);

    const t0 = await h.store.now();
    expect(await h.store.leaseDeliveries(10, 1_000)).toEqual([]);
    const exhausted = await stored(SCOPE, taskId, subscriptionId);
    expect(exhausted.finished_at).toBeGreaterThanOrEqual(t0);
    expect(exhausted).toEqual(leaseDelivery(lost, exhausted.finished_at ?? 0, 1_000));
    expect(completionSubscription(exhausted)).toEqual(view);
  });

  it('redelivery writes the exhaustion with its answer in one transaction; a refused one writes nothing', async () => {
    const { taskId, subscriptionId } = await dueDelivery('redeliver');
    await loseLastTry(subscriptionId, 1);
    const lost = await stored(SCOPE, taskId, subscriptionId);
    expect(await outcomeCode(h.store.redeliver(SCOPE, subscriptionId, { generation: 2 }))).toBe(
      'conflict',
    );
    expect(await stored(SCOPE, taskId, subscriptionId)).toEqual(lost);

    const next = await h.store.redeliver(SCOPE, subscriptionId, { generation: 1 });
    expect(next).toMatchObject({ state: 'due', generation: 2, attempts: 0 });
    expect(completionSubscription(await stored(SCOPE, taskId, subscriptionId))).toEqual(next);

    // Generation 2 loses its last try too; the earlier request, repeated, answers the
    // subscription unchanged — as its view says it is, and now as it is stored.
    await loseLastTry(subscriptionId, 2);
    const lostAgain = await stored(SCOPE, taskId, subscriptionId);
    const t0 = await h.store.now();
    const repeated = await h.store.redeliver(SCOPE, subscriptionId, { generation: 1 });
    expect(repeated).toMatchObject({ state: 'exhausted', generation: 2 });
    const written = await stored(SCOPE, taskId, subscriptionId);
    expect(written.finished_at).toBeGreaterThanOrEqual(t0);
    expect(written).toEqual(leaseDelivery(lostAgain, written.finished_at ?? 0, 1_000));
    expect(completionSubscription(written)).toEqual(repeated);
    expect(await h.store.redeliver(SCOPE, subscriptionId, { generation: 2 })).toMatchObject({
      state: 'due',
      generation: 3,
    });
  });
});
