/**
 * Operations on a task while a retention collection that holds it is open, forced
 * deterministically: the collection's two statements run in an explicit transaction on a
 * connection of the test's own, and the operations are started between them / before COMMIT.
 * Each answer must be the pre- or the post-deletion answer (the snapshot, or not_found), a
 * reused idempotency key makes a new task only once the old one is gone, and nothing of the task
 * is left half-deleted.
 */
import { ContractError, MIN_RETENTION_MS, type Scope } from '@ledgence/contracts';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectRetiredRows, lockRetiredTasks } from './retention-sql.js';
import type { PostgresTaskStore } from './store.js';
import { type Harness, harness, submitCommand } from './testdata/fixtures.js';

const HOUR = 3_600_000;
let h: Harness;
let other: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('retention_interleave');
  other = h.makeStore(8);
});
afterAll(async () => {
  await h.close();
});

async function code(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
    return 'ok';
  } catch (error) {
    if (error instanceof ContractError) return error.code;
    throw error;
  }
}

async function waitingOnLocks(n: number): Promise<void> {
  const end = Date.now() + 10_000;
  for (;;) {
    const [row] = await h.sql`
      select count(*)::int as n from pg_stat_activity
      where wait_event_type = 'Lock' and datname = current_database()`;
    if (Number(row?.n) >= n) return;
    if (Date.now() > end) throw new Error(`only ${row?.n} of ${n} waiting on locks`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function leftovers(scope: Scope, taskId: string): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const table of [
    'tasks',
    'task_payloads',
    'attempts',
    'task_history',
    'completion_subscriptions',
    'completion_deliveries',
  ]) {
    const [row] = await h.sql.unsafe(
      `select count(*)::int as n from ${table} where tenant_id = $1 and namespace = $2 and task_id = $3`,
      [scope.tenant_id, scope.namespace, taskId],
    );
    out[table] = Number(row?.n);
  }
  return out;
}

async function terminal(scope: Scope, key: string): Promise<string> {
  const { snapshot } = await h.store.submit(
    submitCommand(key, { tenant_id: scope.tenant_id, namespace: scope.namespace }),
  );
  expect(await h.store.cancel(scope, snapshot.task_id)).toBe('cancelled');
  return snapshot.task_id;
}

describe.each(['commit', 'rollback'] as const)(
  'operations racing a collection that ends in %s',
  (end) => {
    it('answers before or after the deletion, never half of it', async () => {
      const scope: Scope = { tenant_id: 'acme', namespace: `inter_${end}` };
      await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
      const taskId = await terminal(scope, 'reused');
      h.advance(2 * HOUR);
      const cutoff = (await h.store.now()) - HOUR;
      const sql = postgres(h.db.url, { max: 1, onnotice: () => {} });
      try {
        let blocked: Promise<Record<string, string | number>> | undefined;
        const reads: Record<string, unknown> = {};
        await sql
          .begin(async (tx) => {
            const locked = await lockRetiredTasks(tx, scope, cutoff, 10);
            expect(locked).toEqual([taskId]);
            // Writers that lock the task wait for the collection.
            const waiters = {
              cancel: code(other.cancel(scope, taskId)),
              subscribe: code(
                other.subscribe(scope, taskId, { subscription_key: 's', destination: 'billing' }),
              ),
            };
            await waitingOnLocks(2);
            const removed = await collectRetiredRows(tx, scope, cutoff, locked, 10);
            expect(removed.tasks).toBe(1);
            // A resubmit of its key now waits on the uncommitted delete of the key's row.
            const resubmit = other.submit(
              submitCommand('reused', { tenant_id: scope.tenant_id, namespace: scope.namespace }),
            );
            await waitingOnLocks(3);
            // Readers see the last committed state: the whole task.
            reads.status = (await other.status(scope, taskId)).state;
            reads.result = (await other.result(scope, taskId)).outcome?.state;
            reads.history = (await other.history(scope, taskId, 0)).length;
            reads.subscriptions = (await other.listSubscriptions(scope, taskId)).length;
            blocked = (async () => ({
              ...(Object.fromEntries(
                await Promise.all(
                  Object.entries(waiters).map(async ([k, v]) => [k, await v] as const),
                ),
              ) as Record<string, string>),
              resubmit: await resubmit.then(
                (o) =>
                  o.created
                    ? `created ${o.snapshot.task_id === taskId ? 'same' : 'new'}`
                    : `replay ${o.snapshot.task_id === taskId ? 'same' : 'new'}`,
                (e: unknown) => (e instanceof ContractError ? e.code : String(e)),
              ),
            }))();
            if (end === 'rollback') throw new Error('rollback');
          })
          .catch((error: unknown) => {
            if (!(error instanceof Error && error.message === 'rollback')) throw error;
          });
        expect(reads).toEqual({
          status: 'cancelled',
          result: 'cancelled',
          history: 2,
          subscriptions: 0,
        });
        const answers = await blocked;
        const left = await leftovers(scope, taskId);
        if (end === 'commit') {
          expect(answers).toEqual({
            cancel: 'not_found',
            subscribe: 'not_found',
            resubmit: 'created new',
          });
          expect(left).toEqual({
            tasks: 0,
            task_payloads: 0,
            attempts: 0,
            task_history: 0,
            completion_subscriptions: 0,
            completion_deliveries: 0,
          });
          expect(await code(other.status(scope, taskId))).toBe('not_found');
        } else {
          expect(answers).toEqual({ cancel: 'ok', subscribe: 'ok', resubmit: 'replay same' });
          expect(left).toMatchObject({ tasks: 1, task_payloads: 1, completion_subscriptions: 1 });
        }
      } finally {
        await sql.end();
      }
    });
  },
);
