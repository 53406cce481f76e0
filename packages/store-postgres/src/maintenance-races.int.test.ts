/**
 * Maintenance racing live traffic with real row locks, forced deterministically.
 *
 * - A recovery pass that holds the task lock (blocked in its own flush on a concurrency-key row
 *   the test holds) while a settle, renew, cancel or confirmation of the same attempt arrives:
 *   each waits, and answers what it would after the recovery (DESIGN §1.6, §5).
 * - A settle that waited for the task lock past its lease's expiry decides at the time it acts.
 * - Retention deleting an idle key row while a claim needs that row.
 */
import type { Assignment, LeaseOwner } from '@ledgence/contracts';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectRetiredRows, lockRetiredTasks } from './retention-sql.js';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  claimedTask,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
let b: PostgresTaskStore;
let c: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('maintenance_races');
  b = h.makeStore(4);
  c = h.makeStore(4);
});
afterAll(() => h.close());

async function reasons(taskId: string): Promise<string[]> {
  return (await h.store.history(SCOPE, taskId, 0)).map((e) => e.event.reason);
}

async function historyRows(taskId: string) {
  return h.store.history(SCOPE, taskId, 0);
}

async function keyActive(key: string): Promise<number | null> {
  const [row] = await h.sql`select active from concurrency_keys where tenant_id = ${SCOPE.tenant_id}
    and namespace = ${SCOPE.namespace} and concurrency_key = ${key}`;
  return row === undefined ? null : Number(row.active);
}

/**
 * Holds the row `lock` selects (`… for update`) in a transaction of the test's own, on a
 * connection of its own, until `release()` commits it.
 */
async function holdingRow(
  lock: (t: postgres.TransactionSql) => Promise<unknown>,
): Promise<{ release: () => Promise<void> }> {
  const sql = postgres(h.db.url, { max: 1, onnotice: () => {} });
  let release!: () => void;
  const done = new Promise<void>((resolve) => {
    release = resolve;
  });
  let locked!: () => void;
  const isLocked = new Promise<void>((resolve) => {
    locked = resolve;
  });
  const tx = sql.begin(async (t) => {
    await lock(t);
    locked();
    await done;
  });
  await isLocked;
  return {
    release: async () => {
      release();
      await tx;
      await sql.end();
    },
  };
}

/** Holds the concurrency-key row `key` locked until `release()`. */
const holdingKey = (key: string) =>
  holdingRow(
    (t) => t`select 1 from concurrency_keys where tenant_id = ${SCOPE.tenant_id}
    and namespace = ${SCOPE.namespace} and concurrency_key = ${key} for update`,
  );

/** Holds the task row `taskId` locked until `release()`. */
const holdingTask = (taskId: string) =>
  holdingRow(
    (t) => t`select 1 from tasks where tenant_id = ${SCOPE.tenant_id}
    and namespace = ${SCOPE.namespace} and task_id = ${taskId} for update`,
  );

let serial = 0;
/** A keyed task (limit 1), claimed; `dispatch` grants it dispatch. */
async function keyedClaim(
  dispatch: boolean,
  retry = { max_attempts: 3, delay_ms: 0 },
): Promise<{ a: Assignment; key: string; id: string }> {
  serial += 1;
  const key = `r40j-k-${serial}`;
  const a = await claimedTask(h, `r40j-${serial}`, {
    concurrency_key: key,
    concurrency_limit: 1,
    retry,
  });
  if (dispatch) await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
  return { a, key, id: a.lease.owner.task_id };
}

/**
 * Starts a recovery pass on store `b` that takes the lease of `key`'s task and then blocks in
 * its flush on the key row the test holds; resolves once it waits.
 */
async function recoveryBlockedOnKey(key: string) {
  const hold = await holdingKey(key);
  const pass = b.recoverExpiredLeases(100);
  await h.untilLockWaits(1);
  return { hold, pass };
}

describe('operations arriving while a recovery pass holds the expired attempt’s task', () => {
  it('a settle that arrives while recovery is mid-pass: ownership_lost, one outcome, no report_accepted', async () => {
    const { a, key, id } = await keyedClaim(true);
    h.advance(2_500);
    const { hold, pass } = await recoveryBlockedOnKey(key);
    // A second replica's pass does not wait for, nor recover, the held task.
    const second = await c.recoverExpiredLeases(100);
    expect(second.recovered).toBe(0);
    const settle = outcomeCode(h.store.settle(successCommand(a, 'r40j-late-settle')));
    await h.untilLockWaits(2);
    await hold.release();
    const progress = await pass;
    expect(progress.recovered).toBe(1);
    expect(await settle).toBe('ownership_lost');
    expect(await reasons(id)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'lease_expired',
      'retry_scheduled',
    ]);
    const status = await h.store.status(SCOPE, id);
    expect(status.state).toBe('queued');
    expect(await keyActive(key)).toBe(0);
    const attempt = await h.store.inspectAttempt(SCOPE, id, a.lease.owner.attempt_id);
    expect(attempt.state).toBe('lost');
    expect(attempt.settlement).toBeNull();
  });

  it('a renew and a confirmation arriving mid-pass: ownership_lost; the undispatched attempt does not count', async () => {
    const { a, key, id } = await keyedClaim(false, { max_attempts: 1, delay_ms: 0 });
    h.advance(2_500);
    const { hold, pass } = await recoveryBlockedOnKey(key);
    const renew = outcomeCode(h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch')));
    const confirm = outcomeCode(h.store.confirmQuiescence(a.lease.owner));
    await h.untilLockWaits(3);
    await hold.release();
    await pass;
    expect(await renew).toBe('ownership_lost');
    expect(await confirm).toBe('ownership_lost');
    // max_attempts 1, never dispatched: re-queued, not failed (DESIGN §5, §4.1).
    const status = await h.store.status(SCOPE, id);
    expect(status.state).toBe('queued');
    expect(await reasons(id)).toEqual(['submitted', 'claimed', 'lease_expired', 'retry_scheduled']);
  });

  it('a cancel arriving mid-pass: the re-queued task is cancelled at once, history ordered in time', async () => {
    const { key, id } = await keyedClaim(true);
    h.advance(2_500);
    const { hold, pass } = await recoveryBlockedOnKey(key);
    const cancel = outcomeCode(h.store.cancel(SCOPE, id));
    await h.untilLockWaits(2);
    await hold.release();
    await pass;
    expect(await cancel).toBe('ok');
    expect((await h.store.status(SCOPE, id)).state).toBe('cancelled');
    const rows = await historyRows(id);
    expect(rows.map((r) => r.event.reason)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'lease_expired',
      'retry_scheduled',
      'cancelled',
    ]);
    const ats = rows.map((r) => r.event.at);
    expect([...ats].sort((x, y) => x - y)).toEqual(ats);
    expect(await keyActive(key)).toBe(0);
  });

  it('an unconfirmed settlement held to its authority deadline, finalised by recovery while a confirmation waits', async () => {
    const { a, key, id } = await keyedClaim(true);
    await h.store.settle(successCommand(a, 'r40j-held', { v: 1 }, 'unconfirmed'));
    // Past the lease, not yet the authority deadline: still held.
    h.advance(2_500);
    expect((await h.store.recoverExpiredLeases(100)).finalized).toBe(0);
    expect((await h.store.status(SCOPE, id)).state).toBe('active');
    // Past the authority deadline (claim + 300 s + 1 s grace).
    h.advance(300_000);
    const { hold, pass } = await recoveryBlockedOnKey(key);
    const confirm = outcomeCode(h.store.confirmQuiescence(a.lease.owner));
    await h.untilLockWaits(2);
    await hold.release();
    expect((await pass).finalized).toBe(1);
    expect(await confirm).toBe('ownership_lost');
    const result = await h.store.result(SCOPE, id);
    expect(result.outcome).toEqual({ state: 'succeeded', output: { v: 1 } });
    expect(await reasons(id)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'succeeded',
    ]);
    expect(await keyActive(key)).toBe(0);
    // The replayed settle is still answered from its receipt.
    const replay = await h.store.settle(successCommand(a, 'r40j-held', { v: 1 }, 'unconfirmed'));
    expect(replay.already_accepted).toBe(true);
  });
});

describe('a settle that waited for the task lock', () => {
  it('past its lease’s expiry is ownership_lost, and recovery records the loss once', async () => {
    const a = await claimedTask(h, 'r40j-wait-settle', { retry: { max_attempts: 2, delay_ms: 0 } });
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    const id = a.lease.owner.task_id;
    const hold = await holdingTask(id);
    const settle = outcomeCode(h.store.settle(failureCommand(a, 'r40j-wait-op')));
    await h.untilLockWaits(1);
    h.advance(2_500);
    await hold.release();
    expect(await settle).toBe('ownership_lost');
    const progress = await h.store.recoverExpiredLeases(100);
    expect(progress.recovered).toBe(1);
    expect(await reasons(id)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'lease_expired',
      'retry_scheduled',
    ]);
  });
});

describe('retention deleting an idle key row while a claim needs it', () => {
  it('the claim waits for the deletion, then takes the key with a row it creates; the limit holds', async () => {
    const scope = { tenant_id: 'acme', namespace: 'r40j-keys' };
    const queue = 'kq';
    const HOUR = 3_600_000;
    await h.store.setRetentionPolicy(scope, { retention_ms: HOUR });
    // A finished task of the key (to be retired) and two queued ones.
    const first = await h.store.submit(
      submitCommand('kfirst', { ...scope, queue, concurrency_key: 'k', timeout_ms: 10 * HOUR }),
    );
    const session = await h.store.openSession({ scope, queue, concurrency: 2 });
    const { reply } = await h.store.acquire(
      { ...acquireCommand(session.id, 0, 1, queue), scope },
      { recordEmpty: true },
    );
    if (reply.disposition !== 'assigned') throw new Error('unassigned');
    await h.store.settle(successCommand(reply.assignment, 'kfirst-op'));
    expect(reply.assignment.lease.owner.task_id).toBe(first.snapshot.task_id);
    h.advance(2 * HOUR);
    const second = await h.store.submit(
      submitCommand('ksecond', { ...scope, queue, concurrency_key: 'k' }),
    );
    await h.store.submit(submitCommand('kthird', { ...scope, queue, concurrency_key: 'k' }));
    const fresh = await h.store.openSession({ scope, queue, concurrency: 2 });
    const cutoff = (await h.store.now()) - HOUR;
    const sql = postgres(h.db.url, { max: 1, onnotice: () => {} });
    try {
      let claims: Promise<string[]> | undefined;
      await sql.begin(async (tx) => {
        const locked = await lockRetiredTasks(tx, scope, cutoff, 10);
        expect(locked).toEqual([first.snapshot.task_id]);
        await collectRetiredRows(tx, scope, cutoff, locked, 10);
        // Two polls on two replicas while the key row's deletion is uncommitted.
        claims = Promise.all(
          [b, c].map(async (store, slot) => {
            const out = await store.acquire(
              { ...acquireCommand(fresh.id, slot, 1, queue), scope },
              { recordEmpty: true },
            );
            return out.reply.disposition === 'assigned'
              ? out.reply.assignment.lease.owner.task_id
              : 'empty';
          }),
        );
        await h.untilLockWaits(1);
      });
      const got = await (claims as Promise<string[]>);
      // Exactly one of the key's two queued tasks runs (limit 1).
      expect(got.filter((g) => g !== 'empty')).toHaveLength(1);
      expect(second.created).toBe(true);
      const [row] = await h.sql`select active from concurrency_keys
        where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}
          and concurrency_key = 'k'`;
      expect(Number(row?.active)).toBe(1);
    } finally {
      await sql.end();
    }
  });
});

describe('recovery with more expired leases than one batch, some tasks held by live traffic', () => {
  it('passes stay bounded, held tasks are skipped without waiting, and the rest is drained', async () => {
    const queue = 'r40j-bulk';
    const n = 230;
    const submitted = await h.store.submitBatch(
      Array.from({ length: n }, (_, i) =>
        submitCommand(`r40j-bulk-${i}`, { queue, retry: { max_attempts: 3, delay_ms: 60_000 } }),
      ),
    );
    for (const item of submitted) if (!item.ok) throw item.error;
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: n });
    const replies = await h.store.acquireBatch(
      Array.from({ length: n }, (_, slot) => acquireCommand(session.id, slot, 1, queue)),
      { recordEmpty: true },
    );
    const owners: LeaseOwner[] = replies.map((r) => {
      if (!r.ok || r.value.reply.disposition !== 'assigned') throw new Error('unassigned');
      return r.value.reply.assignment.lease.owner;
    });
    h.advance(2_500);
    // Live traffic holds three of the tasks for the whole drain.
    const held = await Promise.all(owners.slice(0, 3).map((o) => holdingTask(o.task_id)));
    const passes: number[] = [];
    const drain = async (store: PostgresTaskStore) => {
      for (;;) {
        const p = await store.recoverExpiredLeases(100);
        passes.push(p.scanned);
        expect(p.scanned).toBeLessThanOrEqual(100);
        if (!p.has_more) return;
      }
    };
    await Promise.all([drain(b), drain(c)]);
    const [row] = await h.sql`select
      count(*) filter (where state = 'queued')::int as queued,
      count(*) filter (where state = 'active')::int as active
      from tasks where queue = ${queue}`;
    expect({ queued: Number(row?.queued), active: Number(row?.active) }).toEqual({
      queued: n - 3,
      active: 3,
    });
    await Promise.all(held.map((x) => x.release()));
    const last = await h.store.recoverExpiredLeases(100);
    expect(last.recovered).toBe(3);
    const [lost] = await h.sql`select count(*)::int as n from task_history hh
      join tasks t using (tenant_id, namespace, task_id)
      where t.queue = ${queue} and hh.reason = 'lease_expired'`;
    expect(Number(lost?.n)).toBe(n);
  });
});
