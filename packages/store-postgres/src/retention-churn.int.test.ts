/**
 * Two collectors retiring one namespace at once while workers claim and settle live
 * tasks of the same concurrency keys and clients subscribe to the retiring tasks — then SQL over
 * every table: nothing a task owned outlives it, every key row's `active` equals its active
 * tasks, every subscription that was accepted kept its task, and once everything has retired no
 * key row is left (README "Retention", DESIGN §7 `concurrency_keys`).
 */
import { MIN_RETENTION_MS, type Scope } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  type Harness,
  harness,
  outcomeCode,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

const HOUR = 3_600_000;
const KEYS = 6;
const OLD = 600;
const LIVE = 120;

let h: Harness;
let other: PostgresTaskStore;
beforeAll(async () => {
  h = await harness(
    'retention_churn',
    lifecycleConfig({
      leaseDurationMs: 6 * HOUR,
      cleanupGraceMs: 6 * HOUR,
      sessionValidityMs: 48 * HOUR,
    }),
  );
  other = h.makeStore(4);
}, 60_000);
afterAll(() => h.close());

const scope: Scope = { tenant_id: 'acme', namespace: 'churn' };

async function orphans(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const table of [
    'task_payloads',
    'attempts',
    'task_history',
    'completion_subscriptions',
    'completion_deliveries',
  ]) {
    const [row] = await h.sql.unsafe(
      `select count(*)::int as n from ${table} c where not exists (
         select 1 from tasks t where t.tenant_id = c.tenant_id and t.namespace = c.namespace
           and t.task_id = c.task_id)`,
    );
    out[table] = Number(row?.n);
  }
  const [subs] = await h.sql`select count(*)::int as n from completion_subscriptions s
    where not exists (select 1 from completion_deliveries d where d.tenant_id = s.tenant_id
      and d.namespace = s.namespace and d.subscription_id = s.subscription_id)`;
  out.subscriptions_without_delivery = Number(subs?.n);
  const [cursors] = await h.sql`select count(*)::int as n from consumer_cursors c
    where not exists (select 1 from worker_sessions w where w.tenant_id = c.tenant_id
      and w.namespace = c.namespace and w.session_id = c.worker_session_id)`;
  out.consumer_cursors = Number(cursors?.n);
  return out;
}

async function keyMismatches(): Promise<unknown[]> {
  return [
    ...(await h.sql`
    select k.concurrency_key, k.active,
      (select count(*)::int from tasks t where t.tenant_id = k.tenant_id
        and t.namespace = k.namespace and t.concurrency_key = k.concurrency_key
        and t.state = 'active') as held
    from concurrency_keys k where k.namespace = ${scope.namespace}`),
  ].filter((r) => Number(r.active) !== Number(r.held));
}

async function drain(store: PostgresTaskStore): Promise<number> {
  let removed = 0;
  for (;;) {
    const p = await store.collectRetired(scope, 37);
    removed += p.tasks_removed;
    if (!p.has_more) return removed;
  }
}

describe('two collectors, live claims of the same keys and racing subscribes', () => {
  it('leave no orphan row, exact key counts, every accepted subscription’s task, and no key row at the end', async () => {
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    const key = (i: number) => `k${i % KEYS}`;
    const session = await h.store.openSession({ scope, queue: 'old', concurrency: 1 });
    // Old tasks: half run to success through their key's slot, half cancelled while queued.
    const old: string[] = [];
    let seq = 0;
    for (let i = 0; i < OLD; i += 1) {
      const { snapshot } = await h.store.submit(
        submitCommand(`old-${i}`, {
          ...scope,
          queue: 'old',
          concurrency_key: key(i),
          concurrency_limit: 1,
        }),
      );
      old.push(snapshot.task_id);
      if (i % 2 === 0) {
        seq += 1;
        const { reply } = await h.store.acquire(acquireCommand(session.id, 0, seq, 'old', scope), {
          recordEmpty: true,
        });
        if (reply.disposition !== 'assigned') throw new Error(reply.disposition);
        await h.store.renew({
          owner: reply.assignment.lease.owner,
          sequence: 1,
          intent: 'dispatch',
        });
        await h.store.settle(successCommand(reply.assignment, `op-${i}`));
      } else {
        expect(await h.store.cancel(scope, snapshot.task_id)).toBe('cancelled');
      }
    }
    h.advance(2 * HOUR);
    // Live tasks of the same keys, claimed and settled while retention runs.
    for (let i = 0; i < LIVE; i += 1) {
      await h.store.submit(
        submitCommand(`live-${i}`, {
          ...scope,
          queue: 'live',
          concurrency_key: key(i),
          concurrency_limit: 1,
        }),
      );
    }
    const workers = await Promise.all(
      [h.store, other].map((s) => s.openSession({ scope, queue: 'live', concurrency: 3 })),
    );
    let collecting = true;
    const errors: unknown[] = [];
    const work = async (store: PostgresTaskStore, sessionId: string, slot: number) => {
      let sequence = 0;
      let settled = 0;
      while (collecting || settled < 5) {
        sequence += 1;
        const { reply } = await store.acquire(
          acquireCommand(sessionId, slot, sequence, 'live', scope),
          {
            recordEmpty: true,
          },
        );
        if (reply.disposition !== 'assigned') {
          if (!collecting) break;
          continue;
        }
        try {
          await store.renew({
            owner: reply.assignment.lease.owner,
            sequence: 1,
            intent: 'dispatch',
          });
          await store.settle(successCommand(reply.assignment, `live-op-${sessionId}-${sequence}`));
          settled += 1;
        } catch (error) {
          errors.push(error);
        }
      }
    };
    const subscribed: string[] = [];
    const subscribe = async () => {
      for (let i = OLD - 1; i >= 0; i -= 7) {
        const taskId = old[i] as string;
        const code = await outcomeCode(
          h.store.subscribe(scope, taskId, { subscription_key: 's', destination: 'billing' }),
        );
        if (code === 'ok') subscribed.push(taskId);
        else expect(code).toBe('not_found');
      }
    };
    const running = [
      ...workers.flatMap((w, n) =>
        [0, 1, 2].map((slot) => work(n === 0 ? h.store : other, w.id, slot)),
      ),
      subscribe(),
    ];
    const removed = await Promise.all([drain(h.store), drain(other), drain(h.store)]);
    collecting = false;
    await Promise.all(running);
    expect(errors).toEqual([]);
    const left = await h.sql`select count(*)::int as n from tasks
      where namespace = ${scope.namespace} and queue = 'old'`;
    expect(removed.reduce((a, b) => a + b, 0) + Number(left[0]?.n)).toBe(OLD);
    expect(subscribed.length).toBeGreaterThan(0);
    // Every accepted subscription kept its task (a due callback protects it at any age).
    for (const taskId of subscribed) {
      expect([taskId, (await h.store.status(scope, taskId)).state]).not.toEqual([
        taskId,
        undefined,
      ]);
    }
    expect(await orphans()).toEqual({
      task_payloads: 0,
      attempts: 0,
      task_history: 0,
      completion_subscriptions: 0,
      completion_deliveries: 0,
      subscriptions_without_delivery: 0,
      consumer_cursors: 0,
    });
    expect(await keyMismatches()).toEqual([]);

    // Finish every live task, deliver every callback, then retire everything.
    const finisher = await h.store.openSession({ scope, queue: 'live', concurrency: 1 });
    let guard = 0;
    for (;;) {
      const [q] = await h.sql`select count(*)::int as n from tasks
        where namespace = ${scope.namespace} and state in ('queued', 'active')`;
      if (Number(q?.n) === 0 || guard > LIVE * 3) break;
      guard += 1;
      const { reply } = await h.store.acquire(
        acquireCommand(finisher.id, 0, guard, 'live', scope),
        { recordEmpty: true },
      );
      if (reply.disposition !== 'assigned') continue;
      await h.store.renew({ owner: reply.assignment.lease.owner, sequence: 1, intent: 'dispatch' });
      await h.store.settle(successCommand(reply.assignment, `fin-${guard}`));
    }
    expect(errors).toEqual([]);
    for (;;) {
      const leases = await h.store.leaseDeliveries(100, 30_000);
      if (leases.length === 0) break;
      for (const lease of leases) {
        await h.store.reportDelivery({
          scope,
          subscription_id: lease.subscription_id,
          generation: lease.generation,
          attempt: lease.attempt,
          next: { state: 'delivered' },
          status_code: 200,
        });
      }
    }
    h.advance(2 * HOUR);
    await Promise.all([drain(h.store), drain(other)]);
    const [tasksLeft] = await h.sql`select count(*)::int as n from tasks
      where namespace = ${scope.namespace}`;
    expect(Number(tasksLeft?.n)).toBe(0);
    expect(await orphans()).toMatchObject({ attempts: 0, task_history: 0 });
    const keysLeft = await h.sql`select concurrency_key, active from concurrency_keys
      where namespace = ${scope.namespace} order by 1`;
    expect(keysLeft.map((r) => [r.concurrency_key, r.active])).toEqual([]);
  }, 120_000);
});
