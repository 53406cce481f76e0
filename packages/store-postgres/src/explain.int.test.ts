/**
 * The hot statements, as the store really issues them (captured through postgres.js `debug`),
 * EXPLAINed over 100 000 terminal and 1 000 queued tasks: acquisition walks the partial index,
 * recovery the active-attempts index, renew/settle probe primary keys — no sequential scans.
 */
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { attemptFromDb, taskFromDb } from './codec.js';
import { renewAttempts, updateTasks, WAKE_CHANNEL } from './hot-sql.js';
import { createPostgresTaskStore, type PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import type { TestDatabase } from './testing/database.js';
import { createMigratedTestDatabase } from './testing/migrated.js';

let db: TestDatabase;
let sql: postgres.Sql;
let store: PostgresTaskStore;
let offset = 0;
let capturing = false;
const captured: { query: string; params: unknown[] }[] = [];

beforeAll(async () => {
  db = await createMigratedTestDatabase('explain');
  sql = postgres(db.url, { max: 1, onnotice: () => {} });
  await sql`
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
      input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
      available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
    select 'acme', 'prod', 'tsk_done_' || lpad(g::text, 8, '0'), 'run_' || g, 'done-' || g, 'x',
      '{}', 'q', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000, 0, '{}',
      'succeeded', g, g, g + 1, 1, 1, '{"state":"succeeded"}', 5
    from generate_series(1, 100000) as g`;
  await sql`
    insert into attempts (tenant_id, namespace, task_id, attempt_id, ordinal, lease_id,
      generation, worker_session_id, consumer_id, state, claimed_at, deadline,
      authority_deadline, lease_expires_at, renew_sequence, dispatch_allowed, quiescence,
      finished_at)
    select 'acme', 'prod', 'tsk_done_' || lpad(g::text, 8, '0'), 'att_' || g, 1, 'lse_' || g, 1,
      'ses_x', 0, 'succeeded', g, g + 1000, g + 2000, g + 1000, 1, true, 'confirmed', g + 10
    from generate_series(1, 100000) as g`;
  await sql`
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
      input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
      available_at, attempt_count, dispatch_count, history_sequence)
    select 'acme', 'prod', 'tsk_ready_' || lpad(g::text, 8, '0'), 'run_r' || g, 'ready-' || g,
      'x', '{"tenant_id":"acme","namespace":"prod","queue":"q","program":{"name":"p"}}', 'q',
      '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000, g % 3, '{}', 'queued',
      200000 + g, 200000 + g, 0, 0, 1
    from generate_series(1, 1000) as g`;
  // Every task has its payload row, the terminal ones too (a table of 1 000 rows would let the
  // planner prefer reading it whole to probing its key).
  await sql`
    insert into task_payloads (tenant_id, namespace, task_id, data)
    select tenant_id, namespace, task_id, '{"n":1}' from tasks`;
  await sql`
    insert into task_history (tenant_id, namespace, task_id, sequence, at, reason)
    select 'acme', 'prod', 'tsk_done_' || lpad(g::text, 8, '0'), s, g, 'submitted'
    from generate_series(1, 100000) as g, generate_series(1, 2) as s`;
  // A finished delivery for every terminal task, and 500 due ones: leasing must find the due
  // rows through its partial index without reading the finished ones.
  await sql`
    insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
      subscription_key, destination, event_id, created_at)
    select 'acme', 'prod', 'sub_' || g, 'tsk_done_' || lpad(g::text, 8, '0'), 'k', 'billing',
      'evt_' || g, g
    from generate_series(1, 100000) as g`;
  await sql`
    insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
      generation, attempts, next_attempt_at, delivered_at, finished_at)
    select 'acme', 'prod', 'sub_' || g, 'tsk_done_' || lpad(g::text, 8, '0'),
      case when g > 99500 then 'due' else 'delivered' end, 1, 1,
      case when g > 99500 then g end, case when g <= 99500 then g + 5 end,
      case when g <= 99500 then g + 5 end
    from generate_series(1, 100000) as g`;
  // Worker sessions: 20 000 long expired in acme/prod, and live ones in 100 other namespaces,
  // which retention's walk over namespaces must pass over through its index.
  await sql`
    insert into worker_sessions (tenant_id, namespace, session_id, queue, concurrency,
      created_at, expires_at)
    select 'acme', 'prod', 'ses_old_' || g, 'q', 1, g, g + 60000
    from generate_series(1, 20000) as g
    union all
    select 'acme', 'live_' || (g % 100), 'ses_live_' || g, 'q', 1, g, 9e15::bigint
    from generate_series(1, 20000) as g`;
  // A key per user or entity: 20 000 idle concurrency-key rows, which retention's collection
  // must probe by key for the keys of the tasks it removes.
  await sql`
    insert into concurrency_keys (tenant_id, namespace, concurrency_key, active)
    select 'acme', 'prod', 'key_' || g, 0 from generate_series(1, 20000) as g`;
  // DESIGN §7.1: ANALYZE after bulk loads, where the planner would otherwise guess.
  await sql`analyze`;
  const client = postgres(db.url, {
    max: 2,
    onnotice: () => {},
    debug: (_connection, query, params) => {
      if (capturing) captured.push({ query, params: [...params] });
    },
  });
  store = createPostgresTaskStore({ sql: client, config: CONFIG, clockOffsetMs: () => offset });
});

afterAll(async () => {
  await store.sql.end();
  await sql.end();
  await db.drop();
});

async function explain(query: string, params: unknown[]): Promise<string> {
  const rows = await sql.unsafe(`explain ${query}`, params as postgres.ParameterOrJSON<never>[]);
  return rows.map((row) => String(row['QUERY PLAN'])).join('\n');
}

/** The first word of a captured statement, lower case: `begin`, `with`, `commit`, … */
function firstWord(statement: { query: string }): string {
  return statement.query.trim().split(/\s+/)[0]?.toLowerCase() ?? '';
}

/** The store-time read (`storeNow` in hot-sql.ts). */
const STORE_TIME = /^\s*select \(extract\(epoch from clock_timestamp\(\)\)/;

/** The statements `body` sent, by first word; the store-time read as `time`. */
async function statementsOf(body: () => Promise<unknown>): Promise<string[]> {
  const start = captured.length;
  capturing = true;
  try {
    await body();
  } finally {
    capturing = false;
  }
  return captured.slice(start).map((c) => (STORE_TIME.test(c.query) ? 'time' : firstWord(c)));
}

/** Pages a statement reads, by EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back. */
async function pagesOf(statement: { query: string; params: unknown[] }): Promise<number> {
  let pages = -1;
  await sql
    .begin(async (tx) => {
      const rows = await tx.unsafe(
        `explain (analyze, buffers, format json) ${statement.query}`,
        statement.params as postgres.ParameterOrJSON<never>[],
      );
      const explained = rows[0]?.['QUERY PLAN'] as { Plan: Record<string, number> }[] | undefined;
      const plan = explained?.[0]?.Plan ?? {};
      pages = (plan['Shared Hit Blocks'] ?? 0) + (plan['Shared Read Blocks'] ?? 0);
      throw new Error('rollback');
    })
    .catch((error: unknown) => {
      if (!(error instanceof Error && error.message === 'rollback')) throw error;
    });
  return pages;
}

function statementsMatching(pattern: RegExp) {
  return captured.filter((c) => pattern.test(c.query));
}

/**
 * Rows `body` updated in `table` and how many of those were HOT, from the per-transaction
 * counters of one transaction that is then rolled back. Keep `body` to a few updates: many more
 * inside ONE transaction would fill the page with versions that cannot be pruned until it ends,
 * and a full page forces a non-HOT update.
 */
async function updateCounts(
  table: string,
  body: (tx: postgres.TransactionSql) => Promise<void>,
): Promise<unknown> {
  class Rollback extends Error {
    constructor(readonly stats: unknown) {
      super('rollback');
    }
  }
  return sql
    .begin(async (tx) => {
      await body(tx);
      const [stats] = await tx`
        select pg_stat_get_xact_tuples_updated(${table}::regclass)::int as updated,
               pg_stat_get_xact_tuples_hot_updated(${table}::regclass)::int as hot`;
      throw new Rollback(stats);
    })
    .catch((error: unknown) => (error instanceof Rollback ? error.stats : error));
}

describe('EXPLAIN of the hot statements', () => {
  it('counts round trips of a grouped claim and settle of 8 tasks', async () => {
    for (let i = 0; i < 8; i += 1)
      await store.submit(submitCommand(`grouped-${i}`, { queue: 'g' }));
    const session = await store.openSession({ scope: SCOPE, queue: 'g', concurrency: 8 });
    const start = captured.length;
    capturing = true;
    const replies = await store.acquireBatch(
      Array.from({ length: 8 }, (_, slot) => acquireCommand(session.id, slot, 1, 'g')),
      { recordEmpty: true },
    );
    const assignments = replies.flatMap((r) =>
      r.ok && r.value.reply.disposition === 'assigned' ? [r.value.reply.assignment] : [],
    );
    expect(assignments).toHaveLength(8);
    const settled = await store.settleBatch(assignments.map((a, i) => successCommand(a, `g${i}`)));
    capturing = false;
    expect(settled.every((r) => r.ok)).toBe(true);
    const trips = captured.length - start;
    const commits = captured.slice(start).filter((c) => /^\s*commit/i.test(c.query)).length;
    console.log(
      `[explain] 8 tasks claimed and settled through the batch path: ${trips} round trips ` +
        `(${(trips / 8).toFixed(2)} per task), ${commits} commits (${(commits / 8).toFixed(2)} per task)`,
    );
  });

  it('submit: one insert statement, the idempotency lookup only for a held key', async () => {
    const start = captured.length;
    capturing = true;
    const first = await store.submit(submitCommand('explain-submit'));
    const fresh = captured.slice(start);
    const replayStart = captured.length;
    const again = await store.submit(submitCommand('explain-submit'));
    capturing = false;
    const replay = captured.slice(replayStart);
    expect(first.created).toBe(true);
    expect(again.created).toBe(false);
    const lookup = /t\.idempotency_key = k\.key/;
    // The insert alone: it reads store time itself, and a lone statement needs no BEGIN or
    // COMMIT; no lookup for a new key.
    expect(fresh.map(firstWord)).toEqual(['with']);
    expect(fresh.some((c) => lookup.test(c.query))).toBe(false);
    const insert = fresh[0];
    const insertPlan = await explain(insert?.query ?? '', insert?.params ?? []);
    expect(insertPlan).toMatch(/Conflict Arbiter Indexes: tasks_idempotency_key/);
    expect(insertPlan).not.toMatch(/Seq Scan on tasks/);
    // Rows go in in the order given (idempotency-key order, against deadlocks between
    // submits), which the function scan yields: no sort.
    expect(insertPlan).not.toMatch(/Sort/);
    // A held key: the insert skips it, then one lookup through the unique index.
    const held = replay.find((c) => lookup.test(c.query));
    expect(held).toBeDefined();
    const lookupPlan = await explain(held?.query ?? '', held?.params ?? []);
    expect(lookupPlan).toMatch(/tasks_idempotency_key/);
    expect(lookupPlan).not.toMatch(/Seq Scan on tasks/);
  });

  it('submit: a transaction only where the insert is not all of it', async () => {
    // A concurrency key's row is a second statement: BEGIN in front, COMMIT behind, all in one
    // round trip (commit.int.test.ts).
    expect(
      await statementsOf(() =>
        store.submit(submitCommand('explain-keyed', { concurrency_key: 'explain-key' })),
      ),
    ).toEqual(['begin', 'with', 'insert', 'commit']);
    // The key row: created only for an inserted task (its primary key) and an absent key (the
    // key's primary key, passing over a row a claim holds), in the order given.
    const [keyRow] = statementsMatching(/insert into concurrency_keys/).slice(-1);
    const keyPlan = await explain(keyRow?.query ?? '', keyRow?.params ?? []);
    expect(keyPlan).toMatch(/Index Only Scan using tasks_tenant_id_namespace_task_id_pk on tasks/);
    expect(keyPlan).toMatch(
      /Index Only Scan using concurrency_keys_tenant_id_namespace_concurrency_key_pk/,
    );
    expect(keyPlan).not.toMatch(/Seq Scan|Sort/);
    // An absolute available_at is checked against store time first, read with BEGIN.
    const now = await store.now();
    expect(
      await statementsOf(() =>
        store.submit(submitCommand('explain-at', { available_at: now + 60_000 })),
      ),
    ).toEqual(['begin', 'time', 'with', 'commit']);
    // A batch group commit makes of single submits is the insert alone too.
    expect(
      await statementsOf(() =>
        store.submitBatch([submitCommand('explain-b1'), submitCommand('explain-b2')]),
      ),
    ).toEqual(['with']);
  });

  it('submit: a wake over one NOTIFY in bytes goes out as NOTIFYs of its own, the batch still one transaction', async () => {
    // 50 queues named in a two-byte letter: the hints are ~6 300 characters but ~9 300 UTF-8
    // bytes, over PostgreSQL's 8000-byte payload limit. Counted in characters, the insert
    // carried them inline, PostgreSQL refused the NOTIFY, and the batch fell back to one
    // transaction per item.
    const queues = Array.from({ length: 50 }, (_, i) => `${'é'.repeat(60)}${i}`);
    const received = new Set<string>();
    const listener = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      await listener.listen(WAKE_CHANNEL, (payload) => {
        for (const hint of JSON.parse(payload) as { queue: string }[]) received.add(hint.queue);
      });
      let results: Awaited<ReturnType<typeof store.submitBatch>> = [];
      const statements = await statementsOf(async () => {
        results = await store.submitBatch(
          queues.map((queue, i) => submitCommand(`explain-wide-${i}`, { queue })),
        );
      });
      expect(results.every((r) => r.ok && r.value.created)).toBe(true);
      expect(statements).toEqual(['begin', 'with', 'select', 'select', 'commit']);
      for (let waited = 0; received.size < queues.length && waited < 5_000; waited += 20) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      expect([...received].sort()).toEqual([...queues].sort());
    } finally {
      await listener.end();
    }
  });

  it('a poll reads the due part of its queue, and an empty one its next due time, however many of its tasks are delayed', async () => {
    // 20 000 tasks delayed far ahead in queue `later`, a quarter of them at a higher priority
    // than the one due task. One range over the queue is ordered by priority first, so
    // `available_at <= now` could only filter it, entry by entry: ~330 pages read by every
    // poll on PostgreSQL 15–17 (18's skip scan avoided it), and more with every delayed task.
    await sql`
      insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key,
        command_digest, input, queue, program, retry, timeout_ms, priority, labels, state,
        submitted_at, available_at, attempt_count, dispatch_count, history_sequence)
      select 'acme', 'prod', 'tsk_later_' || lpad(g::text, 8, '0'), 'run_l' || g,
        'later-' || g, 'x', '{}', 'later', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}',
        300000, case when g % 4 = 0 then 5 else 0 end, '{}', 'queued', 300000 + g,
        9000000000000 + g, 0, 0, 1
      from generate_series(1, 20000) as g`;
    await sql`
      insert into task_payloads (tenant_id, namespace, task_id, data)
      select tenant_id, namespace, task_id, 'null' from tasks where queue = 'later'`;
    await sql`analyze tasks`;
    const session = await store.openSession({ scope: SCOPE, queue: 'later', concurrency: 2 });
    const nextDue = /min\(d\.available_at\)/;
    /**
     * Pages the claim select of one empty poll of `later` reads, and those its read of the
     * queue's next due time reads (a probe that parks learns when to look again), each by
     * EXPLAIN ANALYZE, rolled back.
     */
    const pagesOfPoll = async (
      consumer: number,
      sequence: number,
    ): Promise<{ claim: number; due: number }> => {
      const start = captured.length;
      capturing = true;
      // A probe: an empty poll left unrecorded, so the statement asks for a task again when
      // explained (the poll's cursor has not moved).
      const outcome = await store.acquire(acquireCommand(session.id, consumer, sequence, 'later'), {
        recordEmpty: false,
      });
      capturing = false;
      expect(outcome.reply.disposition).toBe('empty');
      // The earliest of both priorities' delayed tasks (g = 1, priority 0; g = 4 is priority 5's).
      expect(outcome.nextDue?.at).toBe(9_000_000_000_001);
      const mine = captured.slice(start);
      const claim = mine.find((c) => /skip locked/i.test(c.query));
      const due = mine.find((c) => nextDue.test(c.query));
      if (claim === undefined || due === undefined) throw new Error('statements not captured');
      // No round trip of its own: the due-time read goes out with the COMMIT, just before it.
      expect(mine.slice(-2).map((c) => c === due || firstWord(c))).toEqual([true, 'commit']);
      const plan = await explain(due.query, due.params);
      expect(plan).toMatch(/tasks_acquire/);
      expect(plan).not.toMatch(/Seq Scan/);
      return { claim: await pagesOf(claim), due: await pagesOf(due) };
    };
    const empty = await pagesOfPoll(0, 1);
    console.log(
      `[explain] an empty probe of a queue of 20 000 delayed tasks reads ${empty.claim} pages ` +
        `to claim and ${empty.due} to learn its next due time`,
    );
    expect(empty.claim).toBeLessThan(40);
    expect(empty.due).toBeLessThan(40);
    // A due task at the lower priority: found behind the 5 000 delayed higher-priority ones. A
    // probe that claims reads no due time: the hot path of a claim is unchanged.
    const due = await store.submit(submitCommand('later-due', { queue: 'later' }));
    const claimStart = captured.length;
    capturing = true;
    const { reply, nextDue: claimedDue } = await store.acquire(
      acquireCommand(session.id, 0, 1, 'later'),
      { recordEmpty: false },
    );
    capturing = false;
    expect(reply.disposition === 'assigned' && reply.assignment.lease.owner.task_id).toBe(
      due.snapshot.task_id,
    );
    expect(claimedDue).toBeUndefined();
    expect(captured.slice(claimStart).filter((c) => nextDue.test(c.query))).toEqual([]);
    // The other slot's poll, empty again.
    const again = await pagesOfPoll(1, 1);
    expect(again.claim).toBeLessThan(40);
    expect(again.due).toBeLessThan(40);
    // Settled, so no lease of this test is left for the recovery statement of the next.
    if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
    await store.settle(successCommand(reply.assignment, 'later-due'));
    // Gone again: the tests after this one read the queued tasks of the set-up.
    await sql`delete from task_payloads where task_id like 'tsk_later_%'`;
    await sql`delete from tasks where task_id like 'tsk_later_%'`;
  });

  it('plans use indexes, never a sequential scan of tasks or attempts', async () => {
    const session = await store.openSession({ scope: SCOPE, queue: 'q', concurrency: 1 });
    const claimStart = captured.length;
    capturing = true;
    const { reply } = await store.acquire(acquireCommand(session.id, 0, 1), { recordEmpty: true });
    capturing = false;
    if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
    // Round trips of one claim, begin and commit included.
    const claimStatements = captured.length - claimStart;
    // Highest priority first (g % 3 == 2), then the earliest available.
    expect(reply.assignment.lease.owner.task_id).toBe('tsk_ready_00000002');

    capturing = true;
    const beforeRenew = captured.length;
    await store.renew(renewCommand(reply.assignment.lease.owner, 1, 'dispatch'));
    const renewStatements = captured.length - beforeRenew;
    await store.settle(successCommand(reply.assignment, 'op'));
    const settleStatements = captured.length - beforeRenew - renewStatements;
    console.log(
      `[explain] round trips, begin and commit included: renew (dispatch) ${renewStatements}, ` +
        `settle (success) ${settleStatements}`,
    );
    // An expired lease for the recovery statement to find.
    await store.submit(submitCommand('expiring'));
    const second = await store.acquire(acquireCommand(session.id, 0, 2), { recordEmpty: true });
    expect(second.reply.disposition).toBe('assigned');
    offset += 10_000;
    const progress = await store.recoverExpiredLeases();
    capturing = false;
    expect(progress.recovered).toBe(1);

    const terminalHook = statementsMatching(/update completion_deliveries d set state = 'due'/);
    expect(terminalHook.length).toBeGreaterThan(0);
    for (const statement of terminalHook) {
      const plan = await explain(statement.query, statement.params);
      expect(plan).toMatch(/Index Scan using completion_deliveries_task/);
      expect(plan).not.toMatch(/Seq Scan on completion_deliveries/);
    }

    const acquireSelect = statementsMatching(/skip locked/i).find((c) => /t\.queue/.test(c.query));
    const recoverySelect = statementsMatching(/lease_expires_at <=/);
    const lockByKey = statementsMatching(/for update of t\s*$/i);
    const attemptUpdates = statementsMatching(/update attempts/);
    expect(acquireSelect).toBeDefined();
    expect(recoverySelect.length).toBeGreaterThan(0);
    expect(lockByKey.length).toBeGreaterThan(0);
    expect(attemptUpdates.length).toBeGreaterThan(0);

    const acquirePlan = await explain(acquireSelect?.query ?? '', acquireSelect?.params ?? []);
    expect(acquirePlan).toMatch(/Index Scan using tasks_acquire on tasks/);
    expect(acquirePlan).not.toMatch(/Seq Scan on tasks/);

    for (const statement of recoverySelect) {
      const plan = await explain(statement.query, statement.params);
      expect(plan).toMatch(/attempts_active/);
      expect(plan).not.toMatch(/Seq Scan on (tasks|attempts)/);
    }
    let checked = 0;
    for (const statement of [
      ...lockByKey,
      ...attemptUpdates,
      ...statementsMatching(/update tasks/),
      ...statementsMatching(/row_to_json|store_now/),
    ]) {
      checked += 1;
      const plan = await explain(statement.query, statement.params);
      expect(plan).not.toMatch(/Seq Scan on (tasks|attempts)/);
    }
    expect(checked).toBeGreaterThan(5);
    console.log(
      `[explain] round trips of one single-slot claim, begin and commit included: ${claimStatements}`,
    );
  });

  it('a renewal is a HOT update of the attempt row (no index touched)', async () => {
    const [row] = await sql`select * from attempts where state = 'succeeded' limit 1`;
    if (row === undefined) throw new Error('no attempt');
    const attempt = attemptFromDb(row);
    const counts = await updateCounts('attempts', async (tx) => {
      for (let i = 1; i <= 5; i += 1) {
        await renewAttempts(tx, [
          { ...attempt, renew_sequence: attempt.renew_sequence + i, lease_expires_at: i },
        ]);
      }
    });
    expect(counts).toEqual({ updated: 5, hot: 5 });
  });

  it('a task update that keeps state and terminal_at stays HOT beside tasks_retention', async () => {
    // A first granted dispatch rewrites the task's counters and history sequence, not its
    // state, availability or terminal time: none of the indexed columns.
    // The first queued row from the table's start: a sequential scan of a large table may
    // start where the last one left off (synchronize_seqscans), on a page with no room left.
    // Every version a transaction writes stays on the page until it ends, so the page needs
    // room for all three: the earlier tests' dead versions are vacuumed away first (a CI run
    // saw the fifth of five updates find the page full: 4 of 5 HOT).
    await sql`vacuum tasks`;
    const [row] = await sql.begin(async (tx) => {
      await tx`set local synchronize_seqscans = off`;
      return tx`select * from tasks where state = 'queued' limit 1`;
    });
    if (row === undefined) throw new Error('no task');
    const task = taskFromDb(row);
    const counts = await updateCounts('tasks', async (tx) => {
      for (let i = 1; i <= 3; i += 1) {
        await updateTasks(tx, [
          {
            ...task,
            dispatch_count: task.dispatch_count + i,
            history_sequence: task.history_sequence + i,
          },
        ]);
      }
    });
    expect(counts).toEqual({ updated: 3, hot: 3 });
  });

  it('leasing walks the partial lease index; the backlog count too', async () => {
    const start = captured.length;
    capturing = true;
    const leases = await store.leaseDeliveries(100, 30_000);
    const backlog = await store.dueBacklog(1_000);
    capturing = false;
    expect(leases).toHaveLength(100);
    expect(backlog).toBe(400);
    const [lease] = captured
      .slice(start)
      .filter((c) => /for update of d skip locked/.test(c.query));
    const [count] = captured.slice(start).filter((c) => /d\.state = 'due'/.test(c.query));
    if (lease === undefined || count === undefined) throw new Error('statements not captured');
    const leasePlan = await explain(lease.query, lease.params);
    expect(leasePlan).toMatch(/Index Scan using completion_deliveries_lease/);
    expect(leasePlan).not.toMatch(
      /Seq Scan on (completion_deliveries|completion_subscriptions|tasks)/,
    );
    const countPlan = await explain(count.query, count.params);
    expect(countPlan).toMatch(/completion_deliveries_lease/);
    expect(countPlan).not.toMatch(/Seq Scan/);
  });

  it('a window of reports is one statement that reads the deliveries through an index', async () => {
    const leases = await store.leaseDeliveries(100, 30_000);
    expect(leases).toHaveLength(100);
    const start = captured.length;
    capturing = true;
    const changed = await store.reportDeliveries(
      leases.map((lease) => ({
        scope: lease.scope,
        subscription_id: lease.subscription_id,
        generation: lease.generation,
        attempt: lease.attempt,
        next: { state: 'due' as const, delay_ms: 1_000 },
        error: 'aborted',
      })),
    );
    capturing = false;
    expect(changed).toEqual(leases.map(() => true));
    const reports = captured
      .slice(start)
      .filter((c) => /update completion_deliveries d set/.test(c.query));
    expect(reports).toHaveLength(1);
    const plan = await explain(reports[0]?.query ?? '', reports[0]?.params ?? []);
    // Per report a primary-key probe, or one walk of the few leased rows (completion-sql.ts).
    expect(plan).toMatch(
      /Index Scan using completion_deliveries_(tenant_id_namespace_subscription_id_pk|lease)/,
    );
    expect(plan).not.toMatch(/Seq Scan/);
  });

  it('a history read probes task_history by its primary key, its bound a bigint', async () => {
    const start = captured.length;
    capturing = true;
    // Past 2^31−1: the bound is compared as a bigint with the integer column (store.ts).
    const page = await store.history(SCOPE, 'tsk_done_00099999', 2 ** 31);
    capturing = false;
    expect(page).toEqual([]);
    const read = captured.slice(start).find((c) => /from task_history/.test(c.query));
    if (read === undefined) throw new Error('statement not captured');
    const plan = await explain(read.query, read.params);
    expect(plan).toMatch(
      /Index (Only )?Scan using task_history_tenant_id_namespace_task_id_sequence_pk/,
    );
    expect(plan).not.toMatch(/Seq Scan/);
  });

  it('retention walks tasks_retention: scopes, preview and the collection statement', async () => {
    const start = captured.length;
    capturing = true;
    const scopes = await store.retentionScopes(undefined, 10);
    const preview = await store.previewRetention(SCOPE);
    const progress = await store.collectRetired(SCOPE);
    capturing = false;
    expect(scopes).toEqual([SCOPE]);
    expect(preview).toMatchObject({ candidates: 1_000, truncated: true });
    // The oldest 1 000 terminal tasks, each with one attempt, none protected.
    expect(progress).toMatchObject({ tasks_removed: 1_000, attempts_removed: 1_000 });
    const mine = captured.slice(start);
    const plans = async (pattern: RegExp): Promise<string> => {
      const statement = mine.find((c) => pattern.test(c.query));
      if (statement === undefined) throw new Error(`statement not captured: ${pattern}`);
      const plan = await explain(statement.query, statement.params);
      expect(plan).not.toMatch(
        /Seq Scan on (tasks|attempts|task_history|task_payloads|completion_deliveries|completion_subscriptions|worker_sessions)/,
      );
      return plan;
    };
    // The walk descends both retention indexes; preview and the lock walk tasks_retention.
    const walk = await plans(/with recursive walk/);
    expect(walk).toMatch(/tasks_retention/);
    expect(walk).toMatch(/worker_sessions_retention/);
    expect(await plans(/as candidates/)).toMatch(/tasks_retention/);
    expect(await plans(/for update of t skip locked/)).toMatch(/tasks_retention/);
    // The collection re-checks the locked tasks by primary key and finds sessions by expiry.
    const collection = await plans(/with victims as/);
    expect(collection).toMatch(/tasks_pkey|Index Scan using tasks_/);
    expect(collection).toMatch(/worker_sessions_retention/);
    // The victims' idle key rows are found by primary key, one probe per key.
    expect(collection).toMatch(/Index (Only )?Scan using concurrency_keys_\w+ on concurrency_keys/);
    expect(collection).not.toMatch(/Seq Scan on concurrency_keys/);
  });
});
