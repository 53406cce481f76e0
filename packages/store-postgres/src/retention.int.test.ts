/**
 * Retention on PostgreSQL at scale (seed `RetentionPolicy`, `RetentionProgress`): 50 000
 * retired tasks are removed in bounded transactions while an acquire/subscribe/settle workload
 * keeps running on another queue of the same namespace with a 500 ms `lock_timeout`, so any
 * wait on a retention lock beyond that fails the workload. Protected and live rows survive, and
 * the counts retention reports are exact.
 */
import type { Assignment, RetentionProgress, Scope } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore, type PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

const DAY = 86_400_000;
const RETIRED = 50_000;
const SCOPE: Scope = { tenant_id: 'acme', namespace: 'retire' };

let h: Harness;
let workloadStore: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('retention');
  // The workload's own pool: a lock wait beyond 500 ms fails its operation (and the test).
  workloadStore = createPostgresTaskStore({
    url: h.db.url,
    config: CONFIG,
    max: 4,
    lockTimeoutMs: 500,
  });
});
afterAll(async () => {
  await workloadStore.close();
  await h.close();
});

/**
 * Seeds, set-based, `count` terminal tasks `<prefix><n>` terminal at `terminalAt`, each with one
 * attempt, two history records and a payload.
 */
async function seedTerminal(prefix: string, count: number, terminalAt: number): Promise<void> {
  await h.sql`
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
      input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
      available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, ${prefix} || g, 'run_' || g, ${prefix} || g,
      'x', '{}', 'old', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000, 0, '{}',
      'succeeded', ${terminalAt}::bigint - 10, ${terminalAt}::bigint - 10,
      ${terminalAt}::bigint + g, 1, 1, '{"state":"succeeded"}', 2
    from generate_series(1, ${count}::int) as g`;
  await h.sql`
    insert into attempts (tenant_id, namespace, task_id, attempt_id, ordinal, lease_id,
      generation, worker_session_id, consumer_id, state, claimed_at, deadline,
      authority_deadline, lease_expires_at, renew_sequence, dispatch_allowed, quiescence,
      finished_at)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, ${prefix} || g, 'att_' || g, 1, 'lse_' || g,
      1, 'ses_old', 0, 'succeeded', 1, 2, 3, 2, 1, true, 'confirmed', 2
    from generate_series(1, ${count}::int) as g`;
  await h.sql`
    insert into task_history (tenant_id, namespace, task_id, sequence, at, reason)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, ${prefix} || g, s, 1, 'submitted'
    from generate_series(1, ${count}::int) as g, generate_series(1, 2) as s`;
  await h.sql`
    insert into task_payloads (tenant_id, namespace, task_id, data)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, ${prefix} || g, '{"n":1}'
    from generate_series(1, ${count}::int) as g`;
}

/** One subscription per task `<prefix>1..count`, its delivery in `state`, finished at `finishedAt`. */
async function seedDeliveries(
  prefix: string,
  count: number,
  state: 'due' | 'delivered',
  finishedAt: number | null,
): Promise<void> {
  await h.sql`
    insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
      subscription_key, destination, event_id, created_at)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub_' || ${prefix} || g, ${prefix} || g, 'k',
      'billing', 'evt_' || ${prefix} || g, 1
    from generate_series(1, ${count}::int) as g`;
  await h.sql`
    insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
      generation, attempts, next_attempt_at, delivered_at, finished_at)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub_' || ${prefix} || g, ${prefix} || g,
      ${state}, 1, 1, case when ${state} = 'due' then 9e15::bigint end, ${finishedAt}::bigint,
      ${finishedAt}::bigint
    from generate_series(1, ${count}::int) as g`;
}

async function count(table: string, where = 'true'): Promise<number> {
  const [row] = await h.sql.unsafe(
    `select count(*)::int as n from ${table} where tenant_id = $1 and namespace = $2 and ${where}`,
    [SCOPE.tenant_id, SCOPE.namespace],
  );
  return Number(row?.n);
}

/**
 * Rounds of submit → acquire → subscribe → settle on queue `work`, until `stop()`; every
 * operation's failure is counted, never thrown, so the test can assert there were none.
 */
async function workload(stop: () => boolean) {
  const stats = { rounds: 0, tasks: [] as string[], errors: [] as unknown[] };
  const session = await workloadStore.openSession({ scope: SCOPE, queue: 'work', concurrency: 8 });
  let sequence = 0;
  while (!stop() || stats.rounds < 5) {
    try {
      const submitted = await workloadStore.submitBatch(
        Array.from({ length: 8 }, (_, i) =>
          submitCommand(`work-${stats.rounds}-${i}`, { ...SCOPE, queue: 'work' }),
        ),
      );
      for (const item of submitted) if (!item.ok) stats.errors.push(item.error);
      sequence += 1;
      const polls = Array.from({ length: 8 }, (_, slot) =>
        acquireCommand(session.id, slot, sequence, 'work', SCOPE),
      );
      const assignments: Assignment[] = [];
      for (const item of await workloadStore.acquireBatch(polls, { recordEmpty: true })) {
        if (!item.ok) stats.errors.push(item.error);
        else if (item.value.reply.disposition === 'assigned')
          assignments.push(item.value.reply.assignment);
      }
      const first = assignments[0];
      if (first !== undefined) {
        await workloadStore.subscribe(SCOPE, first.lease.owner.task_id, {
          subscription_key: 'w',
          destination: 'billing',
        });
      }
      const settled = await workloadStore.settleBatch(
        assignments.map((a, i) => successCommand(a, `op-${i}`)),
      );
      for (const item of settled) if (!item.ok) stats.errors.push(item.error);
      stats.tasks.push(...assignments.map((a) => a.lease.owner.task_id));
    } catch (error) {
      stats.errors.push(error);
    }
    stats.rounds += 1;
  }
  return stats;
}

describe('retention at scale', () => {
  it(`removes ${RETIRED} retired tasks in bounded passes while a workload runs`, async () => {
    const now = await h.store.now();
    const old = now - 10 * DAY;
    let started = performance.now();
    await seedTerminal('tsk_old_', RETIRED, old);
    // Old terminal tasks a subscription protects: one still due, one finished only an hour ago.
    await seedTerminal('tsk_pending_', 20, old);
    await seedDeliveries('tsk_pending_', 20, 'due', null);
    await seedTerminal('tsk_recent_', 20, old);
    await seedDeliveries('tsk_recent_', 20, 'delivered', now - 3_600_000);
    // Old tasks whose delivery finished long ago: collected with their subscriptions.
    await seedTerminal('tsk_done_', 20, old);
    await seedDeliveries('tsk_done_', 20, 'delivered', old + 60_000);
    // Young terminal tasks, and live ones.
    await seedTerminal('tsk_young_', 100, now - DAY);
    for (let i = 0; i < 10; i += 1)
      await h.store.submit(submitCommand(`live-${i}`, { ...SCOPE, queue: 'live' }));
    // Sessions that expired long ago (with cursors), and a live one.
    await h.sql`
      insert into worker_sessions (tenant_id, namespace, session_id, queue, concurrency,
        created_at, expires_at)
      select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'ses_old_' || g, 'old', 1,
        ${old}::bigint, ${old}::bigint + g
      from generate_series(1, 30) as g`;
    await h.sql`
      insert into consumer_cursors (tenant_id, namespace, worker_session_id, consumer_id,
        sequence, command)
      select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'ses_old_' || g, 0, 1, '{}'
      from generate_series(1, 30) as g`;
    const live = await h.store.openSession({ scope: SCOPE, queue: 'live', concurrency: 1 });
    await h.sql`analyze`;
    console.log(
      `[retention] seeded ${RETIRED + 160} terminal tasks in ${(performance.now() - started).toFixed(0)} ms`,
    );

    const preview = await h.store.previewRetention(SCOPE);
    expect(preview).toMatchObject({
      candidates: 1_000,
      truncated: true,
      oldest_terminal_at: old + 1,
    });

    let collecting = true;
    const running = workload(() => !collecting);
    const passes: RetentionProgress[] = [];
    started = performance.now();
    try {
      for (;;) {
        const progress = await h.store.collectRetired(SCOPE);
        passes.push(progress);
        if (!progress.has_more) break;
      }
    } finally {
      collecting = false;
    }
    const elapsed = performance.now() - started;
    const work = await running;

    const total = (pick: (p: RetentionProgress) => number) =>
      passes.reduce((sum, p) => sum + pick(p), 0);
    const removed = RETIRED + 20;
    console.log(
      `[retention] ${passes.length} collectRetired passes removed ${total((p) => p.tasks_removed)} ` +
        `tasks in ${elapsed.toFixed(0)} ms (${((total((p) => p.tasks_removed) / elapsed) * 1000).toFixed(0)} tasks/s, ` +
        `${(elapsed / passes.length).toFixed(0)} ms per pass); concurrent workload: ` +
        `${work.rounds} rounds, ${work.tasks.length} tasks settled, ${work.errors.length} errors`,
    );
    expect(work.errors).toEqual([]);
    expect(passes.length).toBeGreaterThanOrEqual(50);
    expect(passes.every((p) => p.tasks_removed <= 1_000)).toBe(true);
    expect(total((p) => p.tasks_removed)).toBe(removed);
    expect(total((p) => p.attempts_removed)).toBe(removed);
    expect(total((p) => p.history_removed)).toBe(removed * 2);
    expect(total((p) => p.subscriptions_removed)).toBe(20);
    expect(total((p) => p.sessions_removed)).toBe(30);

    // Retired rows are gone everywhere; protected, young and live ones are all there.
    expect(await count('tasks', `task_id like 'tsk_old_%' or task_id like 'tsk_done_%'`)).toBe(0);
    expect(await count('attempts', `task_id like 'tsk_old_%'`)).toBe(0);
    expect(await count('task_history', `task_id like 'tsk_old_%'`)).toBe(0);
    expect(await count('task_payloads', `task_id like 'tsk_old_%'`)).toBe(0);
    expect(await count('completion_subscriptions', `task_id like 'tsk_done_%'`)).toBe(0);
    expect(await count('completion_deliveries', `task_id like 'tsk_done_%'`)).toBe(0);
    expect(
      await count('tasks', `task_id like 'tsk_pending_%' or task_id like 'tsk_recent_%'`),
    ).toBe(40);
    expect(
      await count(
        'completion_deliveries',
        `task_id like 'tsk_pending_%' or task_id like 'tsk_recent_%'`,
      ),
    ).toBe(40);
    expect(
      await count('attempts', `task_id like 'tsk_pending_%' or task_id like 'tsk_recent_%'`),
    ).toBe(40);
    expect(await count('tasks', `task_id like 'tsk_young_%'`)).toBe(100);
    expect(await count('tasks', `queue = 'live' and state = 'queued'`)).toBe(10);
    expect(await count('worker_sessions', `session_id like 'ses_old_%'`)).toBe(0);
    expect(await count('consumer_cursors', `worker_session_id like 'ses_old_%'`)).toBe(0);
    expect(await count('worker_sessions', `session_id = '${live.id}'`)).toBe(1);

    // Every workload task settled, with its history; the subscribed ones are due.
    expect(work.tasks.length).toBeGreaterThan(0);
    expect(await count('tasks', `queue = 'work' and state <> 'succeeded'`)).toBe(0);
    expect(await count('tasks', `queue = 'work' and state = 'succeeded'`)).toBe(work.tasks.length);
    expect(await count('completion_deliveries', `state = 'waiting'`)).toBe(0);

    // Nothing retired is left: another pass removes nothing and says so.
    const last = await h.store.collectRetired(SCOPE);
    expect(last).toMatchObject({ tasks_removed: 0, sessions_removed: 0, has_more: false });
  });

  it('skips a retired task another transaction holds, without waiting for it', async () => {
    const now = await h.store.now();
    await seedTerminal('tsk_held_', 3, now - 10 * DAY);
    const held = h.makeStore(1);
    // Hold the oldest one's row lock in an open transaction while retention runs.
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let locked: () => void = () => {};
    const isLocked = new Promise<void>((resolve) => {
      locked = resolve;
    });
    const holder = held.sql.begin(async (tx) => {
      await tx`select 1 from tasks where task_id = 'tsk_held_1' for update`;
      locked();
      await released;
    });
    await isLocked;
    const started = performance.now();
    const progress = await h.store.collectRetired(SCOPE);
    const elapsed = performance.now() - started;
    release();
    await holder;
    // Had it waited for the held row, its 200 ms lock_timeout would have failed the pass.
    console.log(`[retention] a pass beside a held retired task took ${elapsed.toFixed(0)} ms`);
    expect(progress.tasks_removed).toBe(2);
    expect(await count('tasks', `task_id like 'tsk_held_%'`)).toBe(1);
    expect((await h.store.collectRetired(SCOPE)).tasks_removed).toBe(1);
  });

  it('lists namespaces with terminal tasks in byte order, from a loose index scan', async () => {
    const scopes = await h.store.retentionScopes(undefined, 100);
    expect(scopes).toContainEqual(SCOPE);
    const keys = scopes.map((s) => Buffer.from(`${s.tenant_id}\u0000${s.namespace}`));
    for (let i = 1; i < keys.length; i += 1) {
      expect(Buffer.compare(keys[i - 1] as Buffer, keys[i] as Buffer)).toBeLessThan(0);
    }
    expect(await h.store.retentionScopes(SCOPE, 100)).toEqual(
      scopes.slice(
        scopes.findIndex(
          (s) => s.namespace === SCOPE.namespace && s.tenant_id === SCOPE.tenant_id,
        ) + 1,
      ),
    );
  });
});
