/**
 * Maintenance run by two replicas at once (DESIGN §1.7: every replica runs recovery and retention,
 * `SKIP LOCKED` instead of a leader): two stores (their own pools, one database and one movable
 * clock) recover the same expired leases, collect the same namespace, and recover while claimers
 * take the concurrency-key slots recovery frees. Each lease is lost once, each retired record
 * removed once, and a key's count stays equal to its active tasks, without a deadlock or error.
 */
import type { Assignment } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';

let h: Harness;
let b: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('replicas_maintenance');
  b = h.makeStore(4);
});
afterAll(() => h.close());

/** Claims `n` tasks of `queue` with one session of `n` slots, in one batch. */
async function claimAll(queue: string, n: number): Promise<Assignment[]> {
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: n });
  const replies = await h.store.acquireBatch(
    Array.from({ length: n }, (_, slot) => acquireCommand(session.id, slot, 1, queue)),
    { recordEmpty: true },
  );
  return replies.map((r) => {
    if (!r.ok || r.value.reply.disposition !== 'assigned') throw new Error('unassigned');
    return r.value.reply.assignment;
  });
}

/** `count` of a table's rows in the test scope whose task is on `queue`. */
async function onQueue(queue: string, where: string): Promise<number> {
  const [row] = await h.sql.unsafe(
    `select count(*)::int as n from tasks t where t.queue = $1 and ${where}`,
    [queue],
  );
  return Number(row?.n);
}

describe('maintenance on two replicas at once', () => {
  it('two recoverers over 250 expired keyed leases: each lost once, every key slot freed', async () => {
    const queue = 'rk';
    const n = 250;
    const submitted = await h.store.submitBatch(
      Array.from({ length: n }, (_, i) =>
        submitCommand(`rk-${i}`, {
          queue,
          concurrency_key: `rk${i % 5}`,
          concurrency_limit: 100,
          retry: { max_attempts: 3, delay_ms: 1 },
        }),
      ),
    );
    for (const item of submitted) if (!item.ok) throw item.error;
    const assigned = await claimAll(queue, n);
    // Half granted dispatch (their lost attempt counts), half never (it does not).
    await Promise.all(
      assigned
        .filter((_, i) => i % 2 === 0)
        .map((a) => h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'))),
    );
    h.advance(5_000);
    const drain = async (store: PostgresTaskStore) => {
      for (;;) if (!(await store.recoverExpiredLeases(100)).has_more) return;
    };
    await Promise.all([drain(h.store), drain(b), drain(h.store), drain(b)]);
    const keys = await h.sql`select active from concurrency_keys
      where concurrency_key like 'rk%' order by concurrency_key`;
    expect(keys.map((k) => Number(k.active))).toEqual([0, 0, 0, 0, 0]);
    expect(
      await onQueue(
        queue,
        `(select count(*) from task_history hh where hh.tenant_id = t.tenant_id
          and hh.namespace = t.namespace and hh.task_id = t.task_id
          and hh.reason = 'lease_expired') = 1`,
      ),
    ).toBe(n);
    expect(await onQueue(queue, `t.state = 'queued' and t.current_attempt_id is null`)).toBe(n);
  });

  it('two collectors over 2 500 retired tasks and 300 expired sessions: each removed once', async () => {
    const scope = { tenant_id: 'acme', namespace: 'ret2' };
    await h.sql`
      insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
        input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
        available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
      select ${scope.tenant_id}, ${scope.namespace}, 'rt' || g, 'run_' || g, 'rt' || g,
        'x', '{}', 'old', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000, 0, '{}',
        'succeeded', 1, 1, 10 + g, 0, 0, '{"state":"succeeded"}', 0
      from generate_series(1, 2500) as g`;
    await h.sql`
      insert into worker_sessions (tenant_id, namespace, session_id, queue, concurrency,
        created_at, expires_at)
      select ${scope.tenant_id}, ${scope.namespace}, 'ss' || g, 'q', 1, 1, 5 + g
      from generate_series(1, 300) as g`;
    const drain = async (store: PostgresTaskStore) => {
      const removed = { tasks: 0, sessions: 0 };
      for (;;) {
        const progress = await store.collectRetired(scope, 100);
        removed.tasks += progress.tasks_removed;
        removed.sessions += progress.sessions_removed;
        if (!progress.has_more) return removed;
      }
    };
    // A collector may stop while the other still holds rows it skipped: a second round ends it.
    const rounds = [
      ...(await Promise.all([drain(h.store), drain(b)])),
      ...(await Promise.all([drain(h.store), drain(b)])),
    ];
    expect(rounds.reduce((sum, r) => sum + r.tasks, 0)).toBe(2_500);
    expect(rounds.reduce((sum, r) => sum + r.sessions, 0)).toBe(300);
  });

  it('recovery on two replicas while claimers take the freed key slots', async () => {
    const queue = 'rc2';
    const key = 'rc2k';
    const submitted = await h.store.submitBatch(
      Array.from({ length: 40 }, (_, i) =>
        submitCommand(`rc2-${i}`, {
          queue,
          concurrency_key: key,
          concurrency_limit: 3,
          retry: { max_attempts: 100, delay_ms: 0 },
        }),
      ),
    );
    for (const item of submitted) if (!item.ok) throw item.error;
    const replicas = [h.store, b];
    const sessions = await Promise.all(
      replicas.map((s) => s.openSession({ scope: SCOPE, queue, concurrency: 4 })),
    );
    const errors: unknown[] = [];
    for (let round = 1; round <= 15; round += 1) {
      const claims = replicas.map(async (store, i) => {
        const session = sessions[i]?.id as string;
        const replies = await store.acquireBatch(
          Array.from({ length: 4 }, (_, slot) => acquireCommand(session, slot, round, queue)),
          { recordEmpty: true },
        );
        for (const reply of replies) if (!reply.ok) errors.push(reply.error);
      });
      const recoveries = replicas.map((store) => store.recoverExpiredLeases(100));
      for (const outcome of await Promise.allSettled([...claims, ...recoveries])) {
        if (outcome.status === 'rejected') errors.push(outcome.reason);
      }
      const [row] = await h.sql`
        select (select active from concurrency_keys where concurrency_key = ${key}) as active,
          (select count(*)::int from tasks where concurrency_key = ${key} and state = 'active') as n`;
      expect(Number(row?.active)).toBe(Number(row?.n));
      expect(Number(row?.n)).toBeLessThanOrEqual(3);
      // Past every lease: the next round's polls are new, and recovery has work.
      h.advance(3_000);
    }
    expect(errors).toEqual([]);
  });
});
