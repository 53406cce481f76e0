/**
 * Retention's rules where they meet concurrency and policy changes (seed `RetentionPolicy`):
 * a subscribe or redelivery that commits while a collection runs keeps its task; records that
 * were retiring keep being collected after the policy is lengthened; a namespace whose only
 * garbage is expired worker sessions is still reached.
 */
import { ContractError, MAX_RETENTION_MS, MIN_RETENTION_MS, type Scope } from '@ledgence/contracts';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectRetiredRows, lockRetiredTasks } from './retention-sql.js';
import type { PostgresTaskStore } from './store.js';
import { type Harness, harness, submitCommand } from './testdata/fixtures.js';

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
/** Old protected tasks ahead of a race's target in the retention walk: they widen its window. */
const PROTECTED = 150_000;

let h: Harness;
let other: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('retention_rules');
  other = h.makeStore(2);
});
afterAll(async () => {
  await h.close();
});

/** `count` old terminal tasks `<prefix><n>` in `scope`, each protected by a pending delivery. */
async function seedProtected(scope: Scope, prefix: string, count: number): Promise<void> {
  await h.sql`
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
      input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
      available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
    select ${scope.tenant_id}, ${scope.namespace}, ${prefix} || g, 'run_' || g, ${prefix} || g,
      'x', '{}', 'old', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000, 0, '{}',
      'succeeded', 1, 1, 10 + g, 0, 0, '{"state":"succeeded"}', 0
    from generate_series(1, ${count}::int) as g`;
  await h.sql`
    insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
      subscription_key, destination, event_id, created_at)
    select ${scope.tenant_id}, ${scope.namespace}, 'sub_' || ${prefix} || g, ${prefix} || g, 'k',
      'billing', 'evt_' || ${prefix} || g, 1
    from generate_series(1, ${count}::int) as g`;
  await h.sql`
    insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
      generation, attempts, next_attempt_at)
    select ${scope.tenant_id}, ${scope.namespace}, 'sub_' || ${prefix} || g, ${prefix} || g,
      'due', 1, 0, 9e15::bigint
    from generate_series(1, ${count}::int) as g`;
  await h.sql`analyze`;
}

/** A subscription of `taskId` whose callback was delivered long ago: it protects nothing. */
async function deliveredLongAgo(scope: Scope, taskId: string, subscriptionId: string) {
  await h.sql`
    insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
      subscription_key, destination, event_id, created_at)
    values (${scope.tenant_id}, ${scope.namespace}, ${subscriptionId}, ${taskId}, 'k', 'billing',
      ${`evt_${subscriptionId}`}, 1)`;
  await h.sql`
    insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
      generation, attempts, delivered_at, finished_at, last_status_code)
    values (${scope.tenant_id}, ${scope.namespace}, ${subscriptionId}, ${taskId}, 'delivered', 1,
      1, 1, 1, 200)`;
}

/** A task submitted and cancelled in `scope`: terminal now. */
async function terminalTask(scope: Scope, key: string): Promise<string> {
  const { snapshot } = await h.store.submit(
    submitCommand(key, { tenant_id: scope.tenant_id, namespace: scope.namespace }),
  );
  expect(await h.store.cancel(scope, snapshot.task_id)).toBe('cancelled');
  return snapshot.task_id;
}

/** Resolves once a retention collection statement is running on the server. */
async function collectionRunning(): Promise<void> {
  const end = Date.now() + 10_000;
  for (;;) {
    const [row] = await h.sql`
      select count(*)::int as n from pg_stat_activity
      where state = 'active' and query like '%for update of t skip locked%'
        and pid <> pg_backend_pid()`;
    if (Number(row?.n) > 0) return;
    if (Date.now() > end) throw new Error('the collection statement was never seen running');
  }
}

async function rowCount(table: string, scope: Scope, taskId: string): Promise<number> {
  const [row] = await h.sql.unsafe(
    `select count(*)::int as n from ${table}
     where tenant_id = $1 and namespace = $2 and task_id = $3`,
    [scope.tenant_id, scope.namespace, taskId],
  );
  return Number(row?.n);
}

describe('a subscribe or redelivery racing a collection', () => {
  // Both races share one namespace: its protected tasks are never collected, and each target
  // comes after them in the walk (terminal later).
  const scope: Scope = { tenant_id: 'acme', namespace: 'race' };
  beforeAll(async () => {
    await seedProtected(scope, 'p_', PROTECTED);
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
  });

  it('keeps a task whose subscription committed while the collection ran', async () => {
    const target = await terminalTask(scope, 'subscribed');
    h.advance(2 * HOUR);
    const collecting = h.store.collectRetired(scope);
    await collectionRunning();
    // Retention may win the task lock first: then the subscribe finds no task.
    const subscribed = await other
      .subscribe(scope, target, { subscription_key: 'late', destination: 'billing' })
      .catch((error: unknown) => error);
    const progress = await collecting;
    const left = {
      removed: progress.tasks_removed,
      tasks: await rowCount('tasks', scope, target),
      subscriptions: await rowCount('completion_subscriptions', scope, target),
      deliveries: await rowCount('completion_deliveries', scope, target),
    };
    if (subscribed instanceof ContractError && subscribed.code === 'not_found') {
      expect(left).toEqual({ removed: 1, tasks: 0, subscriptions: 0, deliveries: 0 });
      return;
    }
    if (subscribed instanceof Error) throw subscribed;
    // Acknowledged with a pending callback, which protects the task whatever its age.
    expect(subscribed).toMatchObject({ created: true, subscription: { state: 'due' } });
    expect(left).toEqual({ removed: 0, tasks: 1, subscriptions: 1, deliveries: 1 });
  });

  it('keeps a task whose redelivery committed while the collection ran', async () => {
    const target = await terminalTask(scope, 'redelivered');
    await deliveredLongAgo(scope, target, 'sub_redelivered');
    h.advance(2 * HOUR);
    const collecting = h.store.collectRetired(scope);
    await collectionRunning();
    const redelivered = await other
      .redeliver(scope, 'sub_redelivered', { generation: 1 })
      .catch((error: unknown) => error);
    const progress = await collecting;
    const left = {
      removed: progress.tasks_removed,
      tasks: await rowCount('tasks', scope, target),
      deliveries: await rowCount('completion_deliveries', scope, target),
    };
    if (redelivered instanceof ContractError && redelivered.code === 'not_found') {
      expect(left).toEqual({ removed: 1, tasks: 0, deliveries: 0 });
      return;
    }
    if (redelivered instanceof Error) throw redelivered;
    expect(redelivered).toMatchObject({ state: 'due', generation: 2 });
    expect(left).toEqual({ removed: 0, tasks: 1, deliveries: 1 });
  });

  it('decides in the statement after the locks: a delivery committed after them protects', async () => {
    // The interleaving the races above can only hope to hit, made certain: the collection's
    // first statement has locked the target, then a pending delivery of it commits (a direct
    // insert: a real subscribe would wait for the lock), then the second statement runs.
    const fresh: Scope = { tenant_id: 'acme', namespace: 'race_steps' };
    const kept = await terminalTask(fresh, 'kept');
    const gone = await terminalTask(fresh, 'gone');
    h.advance(2 * HOUR);
    const cutoff = (await h.store.now()) - HOUR;
    const sql = postgres(h.db.url, { max: 1, onnotice: () => {} });
    try {
      const removed = await sql.begin(async (tx) => {
        const locked = await lockRetiredTasks(tx, fresh, cutoff, 10);
        expect([...locked].sort()).toEqual([kept, gone].sort());
        await h.sql`
          insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
            subscription_key, destination, event_id, created_at)
          values (${fresh.tenant_id}, ${fresh.namespace}, 'sub_kept', ${kept}, 'k', 'billing',
            'evt_kept', 1)`;
        await h.sql`
          insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id,
            state, generation, attempts, next_attempt_at)
          values (${fresh.tenant_id}, ${fresh.namespace}, 'sub_kept', ${kept}, 'due', 1, 0, 1)`;
        return collectRetiredRows(tx, fresh, cutoff, locked, 10);
      });
      expect(removed.tasks).toBe(1);
      expect(await rowCount('tasks', fresh, kept)).toBe(1);
      expect(await rowCount('completion_deliveries', fresh, kept)).toBe(1);
      expect(await rowCount('tasks', fresh, gone)).toBe(0);
    } finally {
      await sql.end();
    }
  });
});

describe('a policy lengthened while records are retiring', () => {
  it('keeps collecting what was retiring, and keeps what was not', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'relax' };
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    const retiring: string[] = [];
    for (let i = 0; i < 3; i += 1) retiring.push(await terminalTask(scope, `retiring-${i}`));
    h.advance(2 * HOUR);
    // Ended after the old cutoff: not retiring yet when the policy is lengthened.
    const young = await terminalTask(scope, 'young');
    h.advance(1_000);
    // Retirement has started: one bounded transaction removed one, and more are retiring.
    expect(await h.store.collectRetired(scope, 1)).toMatchObject({
      tasks_removed: 1,
      has_more: true,
    });
    const setAt = await h.store.now();
    await h.store.setRetentionPolicy(scope, { retention_ms: 30 * DAY });
    // The cutoff is the old policy's as of the change, not `now − 30 days`.
    const preview = await h.store.previewRetention(scope);
    expect(preview.retention_ms).toBe(30 * DAY);
    expect(preview.candidates).toBe(2);
    expect(preview.cutoff).toBeGreaterThanOrEqual(setAt - MIN_RETENTION_MS);
    expect(preview.cutoff).toBeLessThanOrEqual(preview.as_of - MIN_RETENTION_MS);
    expect((await h.store.collectRetired(scope, 10)).tasks_removed).toBe(2);
    for (const taskId of retiring) expect(await rowCount('tasks', scope, taskId)).toBe(0);
    // Later passes leave the young task to its 30 days.
    h.advance(2 * DAY);
    expect((await h.store.collectRetired(scope, 10)).tasks_removed).toBe(0);
    expect(await rowCount('tasks', scope, young)).toBe(1);
    expect((await h.store.retentionPolicy(scope)).retention_ms).toBe(30 * DAY);
  });

  it('counts the default policy as the one replaced when a namespace sets its first', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'first_policy' };
    const old = await terminalTask(scope, 'old');
    // Past the default retention of the harness's config: retiring under the default policy.
    const defaultMs = (await h.store.retentionPolicy(scope)).retention_ms;
    h.advance(defaultMs + HOUR);
    await h.store.setRetentionPolicy(scope, {
      retention_ms: Math.min(defaultMs * 2, MAX_RETENTION_MS),
    });
    expect((await h.store.collectRetired(scope, 10)).tasks_removed).toBe(1);
    expect(await rowCount('tasks', scope, old)).toBe(0);
  });
});

describe('a namespace whose only garbage is expired sessions', () => {
  it('is listed by the walk over namespaces, and its sessions are collected', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'sessions_only' };
    const session = await h.store.openSession({ scope, queue: 'q', concurrency: 1 });
    const defaultMs = (await h.store.retentionPolicy(scope)).retention_ms;
    h.advance(defaultMs + DAY);
    // A session opened now, in another namespace, has not expired: that namespace is skipped.
    const fresh: Scope = { tenant_id: 'acme', namespace: 'sessions_fresh' };
    await h.store.openSession({ scope: fresh, queue: 'q', concurrency: 1 });
    const scopes = await h.store.retentionScopes(undefined, 100);
    expect(scopes).toContainEqual(scope);
    expect(scopes).not.toContainEqual(fresh);
    expect((await h.store.collectRetired(scope)).sessions_removed).toBe(1);
    const [left] = await h.sql`
      select count(*)::int as n from worker_sessions where session_id = ${session.id}`;
    expect(left?.n).toBe(0);
  });
});
