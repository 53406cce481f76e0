/**
 * Retention: what a collected task leaves behind and what each identity of it
 * answers afterwards, and what collection never removes whatever its age.
 */
import { MIN_RETENTION_MS, type Scope } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  outcomeCode,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

const HOUR = 3_600_000;
const DAY = 24 * HOUR;

let h: Harness;
beforeAll(async () => {
  // Sessions valid for 10 days, so one stays live across the hours the clock moves.
  h = await harness(
    'retention_leftovers',
    lifecycleConfig({ ...CONFIG, sessionValidityMs: 10 * DAY }),
  );
});
afterAll(async () => {
  await h.close();
});

async function rows(table: string, scope: Scope, where = 'true'): Promise<number> {
  const [row] = await h.sql.unsafe(
    `select count(*)::int as n from ${table} where tenant_id = $1 and namespace = $2 and ${where}`,
    [scope.tenant_id, scope.namespace],
  );
  return Number(row?.n);
}

async function drain(scope: Scope) {
  const total = { tasks: 0, sessions: 0 };
  for (;;) {
    const p = await h.store.collectRetired(scope, 5);
    total.tasks += p.tasks_removed;
    total.sessions += p.sessions_removed;
    if (!p.has_more) return total;
  }
}

describe('a collected task', () => {
  it('leaves no row of its own, answers not_found everywhere, its key makes one new task, and a live slot that last held it polls on', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'left' };
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    const queue = 'lq';
    const command = submitCommand('kept-key', {
      ...scope,
      queue,
      concurrency_key: 'ck',
      concurrency_limit: 1,
    });
    const first = await h.store.submit(command);
    expect(first.created).toBe(true);
    const session = await h.store.openSession({ scope, queue, concurrency: 1 });
    const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue, scope), {
      recordEmpty: true,
    });
    if (reply.disposition !== 'assigned') throw new Error(reply.disposition);
    const assignment = reply.assignment;
    const attemptId = assignment.lease.owner.attempt_id;
    const sub = await h.store.subscribe(scope, first.snapshot.task_id, {
      subscription_key: 's1',
      destination: 'billing',
    });
    await h.store.settle(successCommand(assignment, 'op-1', { big: 'x'.repeat(100) }));
    // Deliver the callback so nothing protects the task.
    const leases = await h.store.leaseDeliveries(10, 30_000);
    expect(leases.map((l) => l.subscription_id)).toEqual([sub.subscription.id]);
    for (const lease of leases) {
      expect(
        await h.store.reportDelivery({
          scope,
          subscription_id: lease.subscription_id,
          generation: lease.generation,
          attempt: lease.attempt,
          next: { state: 'delivered' },
          status_code: 200,
        }),
      ).toBe(true);
    }
    // Before the policy's age the key answers the stored task.
    const early = await h.store.submit(command);
    expect(early.created).toBe(false);
    expect(early.snapshot.task_id).toBe(first.snapshot.task_id);

    h.advance(2 * HOUR);
    expect((await drain(scope)).tasks).toBe(1);

    const id = first.snapshot.task_id;
    for (const table of [
      'tasks',
      'task_payloads',
      'attempts',
      'task_history',
      'completion_subscriptions',
      'completion_deliveries',
    ]) {
      expect([table, await rows(table, scope, `task_id = '${id}'`)]).toEqual([table, 0]);
    }
    expect(await rows('concurrency_keys', scope)).toBe(0);
    expect({
      status: await outcomeCode(h.store.status(scope, id)),
      result: await outcomeCode(h.store.result(scope, id)),
      inspect: await outcomeCode(h.store.inspect(scope, id)),
      attempt: await outcomeCode(h.store.inspectAttempt(scope, id, attemptId)),
      history: await outcomeCode(h.store.history(scope, id, 0)),
      subscriptions: await outcomeCode(h.store.listSubscriptions(scope, id)),
      cancel: await outcomeCode(h.store.cancel(scope, id)),
      subscribe: await outcomeCode(
        h.store.subscribe(scope, id, { subscription_key: 's2', destination: 'billing' }),
      ),
      redeliver: await outcomeCode(
        h.store.redeliver(scope, sub.subscription.id, { generation: 1 }),
      ),
    }).toEqual({
      status: 'not_found',
      result: 'not_found',
      inspect: 'not_found',
      attempt: 'not_found',
      history: 'not_found',
      subscriptions: 'not_found',
      cancel: 'not_found',
      subscribe: 'not_found',
      redeliver: 'not_found',
    });

    // The live slot's replay of its last poll: the attempt is no longer owned.
    const replay = await h.store.acquire(acquireCommand(session.id, 0, 1, queue, scope), {
      recordEmpty: true,
    });
    expect(replay.reply.disposition).toBe('ownership_lost');

    // The key is free: one new task, then replays of it.
    const again = await h.store.submit(command);
    expect(again.created).toBe(true);
    expect(again.snapshot.task_id).not.toBe(id);
    const replayed = await h.store.submitBatch([command, command]);
    expect(replayed.map((r) => (r.ok ? [r.value.created, r.value.snapshot.task_id] : r))).toEqual([
      [false, again.snapshot.task_id],
      [false, again.snapshot.task_id],
    ]);
    // The same slot polls on and gets it (its key's row deleted by retention is re-created).
    const next = await h.store.acquire(acquireCommand(session.id, 0, 2, queue, scope), {
      recordEmpty: true,
    });
    expect(next.reply.disposition).toBe('assigned');
    expect(await rows('concurrency_keys', scope, 'active = 1')).toBe(1);
  });
});

describe('collection never removes', () => {
  it('a live task at any age, nor a terminal task whose last callback try ran out its lease', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'never' };
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    const queue = 'nq';
    // queued, far in the past
    const queued = await h.store.submit(submitCommand('queued', { ...scope, queue: 'idle' }));
    // active, its settlement held for cleanup (quiescence unconfirmed)
    await h.store.submit(submitCommand('held', { ...scope, queue, timeout_ms: 86_400_000 }));
    const session = await h.store.openSession({ scope, queue, concurrency: 1 });
    const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue, scope), {
      recordEmpty: true,
    });
    if (reply.disposition !== 'assigned') throw new Error(reply.disposition);
    await h.store.renew({ owner: reply.assignment.lease.owner, sequence: 1, intent: 'dispatch' });
    await h.store.settle(successCommand(reply.assignment, 'held-op', { ok: 1 }, 'unconfirmed'));
    // terminal, its only callback leased for its last try and never reported
    const cb = await h.store.submit(submitCommand('cb', { ...scope, queue: 'cbq' }));
    await h.store.subscribe(scope, cb.snapshot.task_id, {
      subscription_key: 's',
      destination: 'billing',
    });
    expect(await h.store.cancel(scope, cb.snapshot.task_id)).toBe('cancelled');
    await h.sql`update completion_deliveries set state = 'delivering', attempts = 12,
      next_attempt_at = 1 where namespace = 'never'`;

    h.advance(30 * DAY);
    await drain(scope);
    expect((await h.store.status(scope, queued.snapshot.task_id)).state).toBe('queued');
    expect((await h.store.status(scope, reply.assignment.lease.owner.task_id)).state).toBe(
      'active',
    );
    expect((await h.store.status(scope, cb.snapshot.task_id)).state).toBe('cancelled');
  });
});
