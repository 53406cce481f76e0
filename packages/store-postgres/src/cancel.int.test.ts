/**
 * Cancellation in every phase (DESIGN §5) and waiting for results, against real PostgreSQL
 * through the store and the task service (two "replicas" on one database): repeated cancels,
 * cancel racing a settle and lease expiry in both orders, concurrency slots and completion
 * deliveries after a cancel, and result waits woken by another replica.
 */
import type { Assignment, Scope, TaskState } from '@ledgence/contracts';
import { createTaskService, lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
const wakes: PostgresWakeSource[] = [];
beforeAll(async () => {
  h = await harness(
    'cancel',
    lifecycleConfig({
      leaseDurationMs: 2_000,
      cleanupGraceMs: 1_000,
      leaseSafetyMarginMs: 500,
      sessionValidityMs: 600_000,
    }),
  );
});
afterAll(async () => {
  await Promise.all(wakes.map((w) => w.close()));
  await h.close();
});

async function claim(queue: string): Promise<Assignment> {
  const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(s.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned')
    throw new Error(`expected assigned, got ${reply.disposition}`);
  return reply.assignment;
}

async function reasons(taskId: string): Promise<[string, string | null][]> {
  const events = await h.store.history(SCOPE, taskId, 0);
  return events.map((e) => [e.event.reason, e.event.attempt_id]);
}

async function keyActive(key: string): Promise<number> {
  const rows = await h.sql`select active from concurrency_keys
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace} and concurrency_key = ${key}`;
  return rows.length === 0 ? 0 : Number(rows[0]?.active);
}

describe('cancel in every phase', () => {
  it('queued: cancelled at once, idempotent, one history entry', async () => {
    const { snapshot } = await h.store.submit(submitCommand('q1', { queue: 'c-q1' }));
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.outcome).toEqual({ state: 'cancelled' });
    expect(result.status.state).toBe('cancelled');
    expect(result.status.terminal_at).not.toBeNull();
    expect(result.status.cancel_requested_at).not.toBeNull();
    expect(await reasons(snapshot.task_id)).toEqual([
      ['submitted', null],
      ['cancelled', null],
    ]);
  });

  it('queued in retry wait: cancelled, no earlier attempt attributed', async () => {
    const { snapshot } = await h.store.submit(
      submitCommand('q2', { queue: 'c-q2', retry: { max_attempts: 3, delay_ms: 60_000 } }),
    );
    const a = await claim('c-q2');
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    expect((await h.store.settle(failureCommand(a, 'f'))).task_state).toBe('queued');
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.outcome).toEqual({ state: 'cancelled' });
    const hist = await reasons(snapshot.task_id);
    expect(hist.at(-1)).toEqual(['cancelled', null]);
    // A queued task released to a worker later must not be claimable.
    const s = await h.store.openSession({ scope: SCOPE, queue: 'c-q2', concurrency: 1 });
    h.advance(61_000);
    const { reply } = await h.store.acquire(acquireCommand(s.id, 0, 1, 'c-q2'), {
      recordEmpty: true,
    });
    expect(reply.disposition).toBe('empty');
  });

  it('leased before dispatch: dispatch refused, expiry finishes it cancelled, slot released', async () => {
    const { snapshot } = await h.store.submit(
      submitCommand('l1', { queue: 'c-l1', concurrency_key: 'ck-l1', concurrency_limit: 1 }),
    );
    const a = await claim('c-l1');
    expect(await keyActive('ck-l1')).toBe(1);
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    const auth = await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    expect(auth.dispatch_allowed).toBe(false);
    expect(auth.cancel_requested).toBe(true);
    h.advance(5_000);
    const progress = await h.store.recoverExpiredLeases();
    expect(progress.cancelled).toBeGreaterThanOrEqual(1);
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.outcome).toEqual({ state: 'cancelled' });
    expect(await keyActive('ck-l1')).toBe(0);
    const hist = await reasons(snapshot.task_id);
    expect(hist.filter(([r]) => r === 'cancel_requested')).toHaveLength(1);
    expect(hist.filter(([r]) => r === 'cancelled')).toHaveLength(1);
  });

  it('active: a success settlement after cancel is cancelled, output not kept, slot released', async () => {
    const { snapshot } = await h.store.submit(
      submitCommand('a1', { queue: 'c-a1', concurrency_key: 'ck-a1', concurrency_limit: 1 }),
    );
    const a = await claim('c-a1');
    const granted = await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    expect(granted.dispatch_allowed).toBe(true);
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    const seen = await h.store.renew(renewCommand(a.lease.owner, 2));
    expect(seen.cancel_requested).toBe(true);
    const reply = await h.store.settle(successCommand(a, 's', { secret: 1 }));
    expect(reply.task_state).toBe('cancelled');
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.outcome).toEqual({ state: 'cancelled' });
    expect(await keyActive('ck-a1')).toBe(0);
    const attempt = await h.store.inspectAttempt(SCOPE, snapshot.task_id, a.lease.owner.attempt_id);
    expect(attempt.state).toBe('cancelled');
  });

  it('settling (unconfirmed retryable failure): a later cancel wins over the retry', async () => {
    const { snapshot } = await h.store.submit(submitCommand('s1', { queue: 'c-s1' }));
    const a = await claim('c-s1');
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    await h.store.settle({ ...failureCommand(a, 'u'), quiescence: 'unconfirmed' });
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    expect(await h.store.confirmQuiescence(a.lease.owner)).toBe('cancelled');
    expect((await h.store.result(SCOPE, snapshot.task_id)).outcome).toEqual({
      state: 'cancelled',
    });
  });

  it('terminal: answers its state and changes nothing', async () => {
    const { snapshot } = await h.store.submit(submitCommand('t1', { queue: 'c-t1' }));
    const a = await claim('c-t1');
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    await h.store.settle(successCommand(a, 'ok', { v: 1 }));
    const before = await reasons(snapshot.task_id);
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('succeeded');
    expect(await reasons(snapshot.task_id)).toEqual(before);
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.status.cancel_requested_at).toBeNull();
    expect(result.outcome).toEqual({ state: 'succeeded', output: { v: 1 } });
  });

  it('another namespace or tenant: not_found, task untouched', async () => {
    const { snapshot } = await h.store.submit(submitCommand('x1', { queue: 'c-x1' }));
    const other: Scope = { tenant_id: SCOPE.tenant_id, namespace: 'other' };
    const otherTenant: Scope = { tenant_id: 'evil', namespace: SCOPE.namespace };
    expect(await outcomeCode(h.store.cancel(other, snapshot.task_id))).toBe('not_found');
    expect(await outcomeCode(h.store.cancel(otherTenant, snapshot.task_id))).toBe('not_found');
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('queued');
  });
});

describe('cancel racing a settle', () => {
  for (const order of ['cancel-first', 'settle-first'] as const) {
    it(`${order}: exactly one terminal outcome`, async () => {
      const queue = `c-race-${order}`;
      const { snapshot } = await h.store.submit(submitCommand(`race-${order}`, { queue }));
      const a = await claim(queue);
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      const other = h.makeStore(2);
      // Hold the task row so both requests queue behind it, in the chosen order.
      const holder = await h.sql.reserve();
      await holder`begin`;
      await holder`select 1 from tasks where task_id = ${snapshot.task_id} for update`;
      let cancelled: Promise<TaskState>;
      let settled: Promise<unknown>;
      if (order === 'cancel-first') {
        cancelled = h.store.cancel(SCOPE, snapshot.task_id);
        await h.untilLockWaits(1);
        settled = other.settle(successCommand(a, 'race'));
        await h.untilLockWaits(2);
      } else {
        settled = other.settle(successCommand(a, 'race'));
        await h.untilLockWaits(1);
        cancelled = h.store.cancel(SCOPE, snapshot.task_id);
        await h.untilLockWaits(2);
      }
      await holder`commit`;
      holder.release();
      const cancelReply = await cancelled;
      const settleReply = (await settled) as { task_state: TaskState };
      const result = await h.store.result(SCOPE, snapshot.task_id);
      const hist = await reasons(snapshot.task_id);
      const terminal = hist.filter(([r]) => ['succeeded', 'failed', 'cancelled'].includes(r));
      expect(terminal).toHaveLength(1);
      if (order === 'cancel-first') {
        expect(cancelReply).toBe('active');
        expect(settleReply.task_state).toBe('cancelled');
        expect(result.outcome).toEqual({ state: 'cancelled' });
      } else {
        expect(settleReply.task_state).toBe('succeeded');
        expect(cancelReply).toBe('succeeded');
        expect(result.outcome).toEqual({ state: 'succeeded', output: { ok: true } });
      }
    });
  }
});

describe('cancel racing recovery and cleanup confirmation', () => {
  for (const order of ['cancel-first', 'recovery-first'] as const) {
    it(`cancel vs recovery (${order}): cancelled once, never retried`, async () => {
      const queue = `c-rec-${order}`;
      const { snapshot } = await h.store.submit(
        submitCommand(`rec-${order}`, { queue, retry: { max_attempts: 3, delay_ms: 1 } }),
      );
      const a = await claim(queue);
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      h.advance(5_000);
      // Recovery skips locked rows (SKIP LOCKED), so the two orders are run one after the other.
      if (order === 'cancel-first') {
        expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
        expect((await h.store.recoverExpiredLeases()).cancelled).toBe(1);
      } else {
        expect((await h.store.recoverExpiredLeases()).requeued).toBe(1);
        expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
      }
      // Whatever recovery did, the task ends cancelled, once.
      await h.store.recoverExpiredLeases();
      const result = await h.store.result(SCOPE, snapshot.task_id);
      expect(result.outcome).toEqual({ state: 'cancelled' });
      const hist = await reasons(snapshot.task_id);
      expect(hist.filter(([r]) => r === 'cancelled')).toHaveLength(1);
    });
  }

  it('subscriptions of a cancelled task get exactly one due delivery', async () => {
    const { snapshot } = await h.store.submit(submitCommand('cb1', { queue: 'c-cb1' }));
    await h.store.subscribe(SCOPE, snapshot.task_id, { subscription_key: 's', destination: 'd' });
    const a = await claim('c-cb1');
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    const [waiting] = await h.sql`select count(*)::int as n from completion_deliveries
      where task_id = ${snapshot.task_id} and state = 'due'`;
    expect(Number(waiting?.n)).toBe(0);
    await h.store.settle(successCommand(a, 'cb'));
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    const rows = await h.sql`select state, generation from completion_deliveries
      where task_id = ${snapshot.task_id}`;
    expect(rows.map((r) => [r.state, Number(r.generation)])).toEqual([['due', 1]]);
  });
});

describe('result waits across replicas', () => {
  /** Replica A: its own store and LISTEN; a long rescan, so only a NOTIFY ends a wait early. */
  const replicaWoken = async () => {
    const wake = createPostgresWakeSource({ url: h.db.url });
    wakes.push(wake);
    await wake.ready();
    return createTaskService({
      store: h.makeStore(2),
      wake,
      longPollMaxMs: 20_000,
      rescanIntervalMs: 60_000,
    });
  };

  it('a result long-poll on one replica wakes promptly when another replica cancels', async () => {
    const serviceA = await replicaWoken();
    const storeB = h.makeStore(2);
    const { snapshot } = await storeB.submit(submitCommand('w1', { queue: 'c-w1' }));
    const started = Date.now();
    const waiting = serviceA.result(SCOPE, snapshot.task_id, { waitMs: 20_000 });
    await new Promise((r) => setTimeout(r, 300));
    expect(await storeB.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    const result = await waiting;
    expect(result.outcome).toEqual({ state: 'cancelled' });
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('a result long-poll wakes when recovery on another replica finishes a cancelled task', async () => {
    const serviceA = await replicaWoken();
    const storeB = h.makeStore(2);
    const { snapshot } = await storeB.submit(submitCommand('w2', { queue: 'c-w2' }));
    const a = await claim('c-w2');
    await storeB.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    expect(await storeB.cancel(SCOPE, snapshot.task_id)).toBe('active');
    const started = Date.now();
    const waiting = serviceA.result(SCOPE, snapshot.task_id, { waitMs: 20_000 });
    await new Promise((r) => setTimeout(r, 300));
    h.advance(10_000);
    await storeB.recoverExpiredLeases();
    const result = await waiting;
    expect(result.outcome).toEqual({ state: 'cancelled' });
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('answers pending at the end of the wait, not earlier', async () => {
    const serviceA = createTaskService({ store: h.store, longPollMaxMs: 1_500 });
    const { snapshot } = await h.store.submit(submitCommand('w3', { queue: 'c-w3' }));
    const started = Date.now();
    const result = await serviceA.result(SCOPE, snapshot.task_id, { waitMs: 60_000 });
    const elapsed = Date.now() - started;
    expect(result.outcome).toEqual({ state: 'pending' });
    expect(result.status.state).toBe('queued');
    expect(elapsed).toBeGreaterThanOrEqual(1_400);
    expect(elapsed).toBeLessThan(8_000);
  });
});
