/**
 * Leasing deliveries for a sender's own aliases (`leaseDeliveries(limit, leaseMs, only)`, DESIGN
 * §8): while replicas' destinations differ (a rolling configuration change), a sender leases the
 * deliveries to its aliases as they fall due and any other only once it has been leasable for the
 * wait, so it does not spend the tries of deliveries another replica can send; a lost last try is
 * exhausted by any sender. The filtered statement still walks the partial lease index.
 */
import { COMPLETION_MAX_ATTEMPTS, ContractError } from '@ledgence/contracts';
import { DELIVERY_LEASE_EXPIRED_ERROR } from '@ledgence/core';
import postgres from 'postgres';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createPostgresTaskStore } from './store.js';
import { type Harness, harness, SCOPE, submitCommand } from './testdata/fixtures.js';

const WAIT_MS = 60_000;
const BILLING_ONLY = { destinations: ['billing'], otherDestinationsAfterMs: WAIT_MS };

let h: Harness;
beforeAll(async () => {
  h = await harness('lease_filter');
});
afterAll(() => h.close());

// Leasing is global (every scope), so each test starts with no leasable delivery left behind.
beforeEach(async () => {
  await h.sql`
    update completion_deliveries set state = 'delivered', next_attempt_at = null,
      finished_at = 0, delivered_at = 0
    where state in ('due', 'delivering')`;
});

/** A cancelled task's subscription to `alias`: due at once. Returns the subscription id. */
async function dueDelivery(key: string, alias: string): Promise<string> {
  const { snapshot } = await h.store.submit(submitCommand(key));
  await h.store.cancel(SCOPE, snapshot.task_id);
  const { subscription } = await h.store.subscribe(SCOPE, snapshot.task_id, {
    subscription_key: key,
    destination: alias,
  });
  return subscription.id;
}

async function delivery(subscriptionId: string) {
  const [row] = await h.sql`
    select state, attempts, last_error from completion_deliveries
    where subscription_id = ${subscriptionId}`;
  return row;
}

const ids = (leases: { subscription_id: string }[]) => leases.map((l) => l.subscription_id);

describe('leasing with the sender’s aliases', () => {
  it('leases its aliases once due, any other only once leasable for the wait', async () => {
    const billing = await dueDelivery('f-billing', 'billing');
    const audit = await dueDelivery('f-audit', 'audit');

    // Leases that outlast the test: a row is leased once here, or not at all.
    const leaseMs = 10 * WAIT_MS;
    expect(ids(await h.store.leaseDeliveries(10, leaseMs, BILLING_ONLY))).toEqual([billing]);
    h.advance(WAIT_MS / 2);
    expect(await h.store.leaseDeliveries(10, leaseMs, BILLING_ONLY)).toEqual([]);
    expect(await delivery(audit)).toMatchObject({ state: 'due', attempts: 0 });
    h.advance(WAIT_MS / 2);
    const [late] = await h.store.leaseDeliveries(10, leaseMs, BILLING_ONLY);
    expect(late).toMatchObject({ subscription_id: audit, destination: 'audit', attempt: 1 });
  });

  it('without `only`, and with a wait of 0, every leasable delivery is leased', async () => {
    const a = await dueDelivery('f-all-a', 'audit');
    const b = await dueDelivery('f-all-b', 'crm');
    expect(ids(await h.store.leaseDeliveries(10, 1_000)).sort()).toEqual([a, b].sort());
    h.advance(1_000);
    const none = { destinations: [], otherDestinationsAfterMs: 0 };
    expect(ids(await h.store.leaseDeliveries(10, 1_000, none)).sort()).toEqual([a, b].sort());
  });

  it('an expired sender lease waits for the wait too; a lost last try is exhausted at once', async () => {
    const crashed = await dueDelivery('f-crashed', 'billing');
    const lost = await dueDelivery('f-lost', 'billing');
    // Both leased by a sender with `billing`, which then dies mid-try.
    expect(ids(await h.store.leaseDeliveries(10, 1_000, BILLING_ONLY)).sort()).toEqual(
      [crashed, lost].sort(),
    );
    await h.sql`
      update completion_deliveries set attempts = ${COMPLETION_MAX_ATTEMPTS}
      where subscription_id = ${lost}`;
    h.advance(1_000);

    const auditOnly = { destinations: ['audit'], otherDestinationsAfterMs: WAIT_MS };
    expect(await h.store.leaseDeliveries(10, 1_000, auditOnly)).toEqual([]);
    // The lost last try needs no POST, so the sender without the alias ends it...
    expect(await delivery(lost)).toMatchObject({
      state: 'exhausted',
      attempts: COMPLETION_MAX_ATTEMPTS,
      last_error: DELIVERY_LEASE_EXPIRED_ERROR,
    });
    // ...and leaves the try to retry to a sender that has the alias.
    expect(await delivery(crashed)).toMatchObject({ state: 'delivering', attempts: 1 });
    const [retried] = await h.store.leaseDeliveries(10, 1_000, BILLING_ONLY);
    expect(retried).toMatchObject({ subscription_id: crashed, attempt: 2 });
  });

  it.each([-1, 1.5, Number.NaN])('refuses a wait of %s', async (wait) => {
    const error = await h.store
      .leaseDeliveries(10, 1_000, { destinations: [], otherDestinationsAfterMs: wait })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractError);
    expect((error as ContractError).code).toBe('invalid_input');
  });
});

describe('the filtered lease statement', () => {
  it('walks the partial lease index and probes subscriptions by key: no sequential scan', async () => {
    // 20 000 finished deliveries, and due ones the sender cannot send (fallen due within the
    // wait) ahead of the 50 it can: the walk passes over the former through the index.
    await h.sql`
      with clock as (
        select (extract(epoch from clock_timestamp()) * 1000)::bigint as now
      ), tasks_in as (
        insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
          input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
          available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
        select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'tsk_plan_' || g, 'run_plan_' || g,
          'plan-' || g, 'x', '{}', 'q', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}',
          300000, 0, '{}', 'succeeded', 1, 1, 2, 1, 1, '{"state":"succeeded"}', 3
        from generate_series(1, 22050) as g
      ), subscriptions_in as (
        insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
          subscription_key, destination, event_id, created_at)
        select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub_plan_' || g, 'tsk_plan_' || g, 'k',
          case when g > 22000 then 'billing' else 'audit' end, 'evt_plan_' || g, 2
        from generate_series(1, 22050) as g
      )
      insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
        generation, attempts, next_attempt_at, delivered_at, finished_at)
      select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub_plan_' || g, 'tsk_plan_' || g,
        case when g > 20000 then 'due' else 'delivered' end, 1, 1,
        case when g > 20000 then c.now - 30000 + g - 20000 end,
        case when g <= 20000 then g end, case when g <= 20000 then g end
      from generate_series(1, 22050) as g, clock c`;
    await h.sql`analyze`;
    const captured: { query: string; params: unknown[] }[] = [];
    const client = postgres(h.db.url, {
      max: 1,
      onnotice: () => {},
      debug: (_connection, query, params) => captured.push({ query, params: [...params] }),
    });
    const store = createPostgresTaskStore({ sql: client });
    try {
      const leases = await store.leaseDeliveries(100, 30_000, BILLING_ONLY);
      expect(leases).toHaveLength(50);
      expect(leases.every((lease) => lease.destination === 'billing')).toBe(true);
    } finally {
      await client.end();
    }
    const lease = captured.find((c) => /for update of d skip locked/.test(c.query));
    if (lease === undefined) throw new Error('statement not captured');
    const plan = (
      await h.sql.unsafe(
        `explain ${lease.query}`,
        lease.params as postgres.ParameterOrJSON<never>[],
      )
    )
      .map((row) => String(row['QUERY PLAN']))
      .join('\n');
    expect(plan).toMatch(/Index Scan using completion_deliveries_lease/);
    expect(plan).toMatch(
      /Index Scan using completion_subscriptions_tenant_id_namespace_subscription_id_pk on completion_subscriptions s_1/,
    );
    expect(plan).not.toMatch(/Seq Scan on (completion_deliveries|completion_subscriptions|tasks)/);
  });
});
