/**
 * Tenant and namespace scoping of every statement: every row of scope A is copied, ids and all, into two
 * other scopes — another tenant with the same namespace name, and the same tenant with another
 * namespace — so every task id, attempt id, lease id, session id, cursor, subscription id, event
 * id, idempotency key, concurrency key and queue name collides across the three. Then the whole
 * lifecycle runs in scope A (submit replay, reads, acquire, renew, settle, the terminal hook,
 * completion lease/report/redeliver, cancel, session extension, a concurrency key that is full
 * in the other scopes, recovery, retention) and the copies must come out byte for byte as they
 * went in, while scope A's reads answer A's data only.
 */
import type { Assignment, Scope } from '@ledgence/contracts';
import { MIN_RETENTION_MS } from '@ledgence/contracts';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  SCOPED_TABLES,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

const A: Scope = SCOPE;
const OTHER_TENANT: Scope = { tenant_id: 'beta', namespace: SCOPE.namespace };
const OTHER_NAMESPACE: Scope = { tenant_id: SCOPE.tenant_id, namespace: 'stage' };
const COPIES = [OTHER_TENANT, OTHER_NAMESPACE];

let h: Harness;
beforeAll(async () => {
  h = await harness('scope_collision');
});
afterAll(() => h.close());

/** Copies every row of `from` into `to`, keeping every id, and marks the copy's payloads. */
async function copyScope(from: Scope, to: Scope): Promise<void> {
  for (const table of SCOPED_TABLES) {
    await h.sql.unsafe(
      `insert into ${table}
       select (jsonb_populate_record(null::${table},
         to_jsonb(x) || jsonb_build_object('tenant_id', $3::text, 'namespace', $4::text))).*
       from ${table} x where tenant_id = $1 and namespace = $2`,
      [from.tenant_id, from.namespace, to.tenant_id, to.namespace],
    );
  }
  // What the copy's own rows would say: its scope inside the JSON, and data of its own.
  await h.sql`
    update tasks set input = jsonb_set(jsonb_set(input, '{tenant_id}', to_jsonb(tenant_id)),
      '{namespace}', to_jsonb(namespace))
    where tenant_id = ${to.tenant_id} and namespace = ${to.namespace}`;
  await h.sql`
    update consumer_cursors set command = jsonb_set(command, '{scope}',
      jsonb_build_object('tenant_id', tenant_id, 'namespace', namespace))
    where tenant_id = ${to.tenant_id} and namespace = ${to.namespace}`;
  await h.sql`
    update task_payloads set data = json_build_object('owner', tenant_id || '/' || namespace)
    where tenant_id = ${to.tenant_id} and namespace = ${to.namespace}`;
  // The copies' leases outlive everything this test does, so recovery has nothing of theirs to
  // take: any change to them would be a cross-scope write.
  await h.sql`
    update attempts set lease_expires_at = lease_expires_at + 864000000000,
      authority_deadline = authority_deadline + 864000000000,
      deadline = deadline + 864000000000
    where tenant_id = ${to.tenant_id} and namespace = ${to.namespace}`;
  await h.sql`
    update worker_sessions set expires_at = expires_at + 864000000000
    where tenant_id = ${to.tenant_id} and namespace = ${to.namespace}`;
}

/** Every row of a scope, table by table, as text (exact comparison). */
async function dump(scope: Scope): Promise<Record<string, string[]>> {
  const out: Record<string, string[]> = {};
  for (const table of SCOPED_TABLES) {
    const rows = await h.sql.unsafe(
      `select to_jsonb(x)::text as r from ${table} x
       where tenant_id = $1 and namespace = $2 order by 1`,
      [scope.tenant_id, scope.namespace],
    );
    out[table] = rows.map((row) => String(row.r));
  }
  return out;
}

async function claim(sessionId: string, consumer: number, seq: number): Promise<Assignment> {
  const { reply } = await h.store.acquire(acquireCommand(sessionId, consumer, seq), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error(`expected assigned: ${reply.disposition}`);
  return reply.assignment;
}

it('operations in one scope never read or write rows of colliding ids in other scopes', async () => {
  // ---- scope A, before the copy: every kind of row exists -------------------------------
  const session = await h.store.openSession({ scope: A, queue: 'q', concurrency: 3 });
  const keyed = await h.store.submit(
    submitCommand('k1', { concurrency_key: 'ck', concurrency_limit: 1, data: { owner: 'A1' } }),
  );
  const plain = await h.store.submit(submitCommand('k2', { data: { owner: 'A2' } }));
  const queued = await h.store.submit(
    submitCommand('k3', { queue: 'later', data: { owner: 'A3' } }),
  );
  const keyedAgain = await h.store.submit(
    submitCommand('k4', { concurrency_key: 'ck', concurrency_limit: 1, data: { owner: 'A4' } }),
  );
  const t1 = keyed.snapshot.task_id;
  const t2 = plain.snapshot.task_id;
  const t3 = queued.snapshot.task_id;
  const t4 = keyedAgain.snapshot.task_id;
  const first = await claim(session.id, 0, 1);
  expect(first.lease.owner.task_id).toBe(t1);
  const second = await claim(session.id, 1, 1);
  expect(second.lease.owner.task_id).toBe(t2);
  const sub1 = await h.store.subscribe(A, t1, { subscription_key: 'sk', destination: 'billing' });
  const sub2 = await h.store.subscribe(A, t2, { subscription_key: 'sk', destination: 'billing' });
  await h.store.setRetentionPolicy(A, { retention_ms: MIN_RETENTION_MS });

  for (const to of COPIES) await copyScope(A, to);
  const before = await Promise.all(COPIES.map(dump));
  // Every table holds colliding rows (else the comparison below would prove nothing).
  for (const copy of before)
    for (const table of SCOPED_TABLES) expect(copy[table]?.length).toBeGreaterThan(0);
  // The copy holds the full key 'ck' (its t1 is active): it must not block A.
  expect(before[0]?.concurrency_keys).toEqual([expect.stringContaining('"active": 1')]);

  // ---- reads in A answer A's rows -----------------------------------------------------
  const replay = await h.store.submit(
    submitCommand('k1', { concurrency_key: 'ck', concurrency_limit: 1, data: { owner: 'A1' } }),
  );
  expect(replay).toMatchObject({ created: false, snapshot: { task_id: t1 } });
  expect((await h.store.inspect(A, t1)).input.data).toEqual({ owner: 'A1' });
  expect((await h.store.inspect(A, t3)).input).toMatchObject(A);
  const listed = await h.store.listTasks(A, { filters: {} });
  expect(listed.tasks.map((t) => t.task_id).sort()).toEqual([t1, t2, t3, t4].sort());
  const [{ n }] = (await h.sql`
    select count(*)::int as n from task_history
    where tenant_id = ${A.tenant_id} and namespace = ${A.namespace} and task_id = ${t1}`) as unknown as [
    { n: number },
  ];
  expect(await h.store.history(A, t1, 0)).toHaveLength(n);
  const attempt = await h.store.inspectAttempt(A, t1, first.lease.owner.attempt_id);
  expect(attempt.lease.owner).toEqual(first.lease.owner);
  expect(attempt.event.data).toEqual({ owner: 'A1' });
  expect(await h.store.listSubscriptions(A, t1)).toEqual([
    expect.objectContaining({ id: sub1.subscription.id, state: 'waiting' }),
  ]);

  // ---- writes in A --------------------------------------------------------------------
  await h.store.renew(renewCommand(first.lease.owner, 1));
  await h.store.extendSession(A, session.id);
  expect(await h.store.cancel(A, t3)).toBe('cancelled');
  await h.store.settle(successCommand(first, 'op-1', { owner: 'A1-out' }));
  // t1 freed A's 'ck': A's t4 is claimable although the copies' 'ck' rows are full.
  const third = await claim(session.id, 0, 2);
  expect(third.lease.owner.task_id).toBe(t4);
  expect(third.event.data).toEqual({ owner: 'A4' });
  await h.store.settle(successCommand(third, 'op-4'));
  // A replayed poll answers from A's cursor.
  const replayed = await h.store.acquire(acquireCommand(session.id, 1, 1), { recordEmpty: true });
  expect(replayed.reply).toMatchObject({ disposition: 'assigned' });
  // t2's lease runs out: recovery takes A's attempt only.
  h.advance(CONFIG.leaseDurationMs + CONFIG.cleanupGraceMs + 1_000);
  const recovered = await h.store.recoverExpiredLeases(100);
  expect(recovered.scanned).toBe(1);

  // Completion: A's subscriptions became due; the copies' stay waiting.
  const leases = await h.store.leaseDeliveries(100, 60_000);
  expect(leases.map((l) => l.scope)).toEqual(leases.map(() => A));
  expect(leases.map((l) => l.subscription_id)).toContain(sub1.subscription.id);
  for (const lease of leases) {
    expect(
      await h.store.reportDelivery({
        scope: lease.scope,
        subscription_id: lease.subscription_id,
        generation: lease.generation,
        attempt: lease.attempt,
        next: { state: 'delivered' },
        status_code: 200,
      }),
    ).toBe(true);
  }
  const redelivered = await h.store.redeliver(A, sub1.subscription.id, { generation: 1 });
  expect(redelivered).toMatchObject({ generation: 2, state: 'due' });
  expect(sub2.subscription.id).not.toBe(sub1.subscription.id);

  // Retention: A's retired tasks and expired session go; nothing of the copies does.
  h.advance(MIN_RETENTION_MS * 2 + CONFIG.sessionValidityMs);
  const collected = await h.store.collectRetired(A);
  expect(collected.tasks_removed).toBeGreaterThan(0);
  expect(collected.sessions_removed).toBe(1);

  // ---- the copies are exactly as they were ----------------------------------------------
  const after = await Promise.all(COPIES.map(dump));
  expect(after).toEqual(before);
  // And their reads still answer their own data.
  expect((await h.store.inspect(OTHER_TENANT, t1)).input.data).toEqual({ owner: 'beta/prod' });
  expect((await h.store.status(OTHER_NAMESPACE, t1)).state).toBe('active');
});
