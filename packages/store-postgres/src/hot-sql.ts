/**
 * The hot SQL of the store, in one place for review (DESIGN §7, §7.1): every statement claim,
 * renew, settle and recovery run, each a named function with its locking choice and the index it
 * relies on. Batches and single commands share these shapes: rows travel as parallel arrays
 * through `unnest`, so one statement text serves any batch size, and postgres.js prepares each
 * text once per connection (`prepare: true`, its default) — a fixed, small set of plans.
 *
 * Completion callbacks and retention have their own reviewed modules beside this one
 * (`completion-sql.ts`, `retention-sql.ts`); the terminal hook there runs inside the lifecycle
 * transactions these statements serve.
 *
 * Nothing here decides a lifecycle rule: statements load rows under lock, and write the rows the
 * core's pure transitions returned. All run inside a transaction the caller opened.
 *
 * Arrays are passed as JS arrays and cast in SQL (`::text[]`, `::bigint[]`); booleans travel as
 * `int[]` (postgres.js mis-infers boolean arrays), JSON as text cast to `json`/`jsonb`.
 */
import type { AttemptRow, CursorRow, HistoryRow, TaskRow } from '@ledgence/core';
import type postgres from 'postgres';
import {
  type DbRow,
  inputColumn,
  jsonText,
  jsonValueText,
  lastRenewalColumn,
  num,
  outcomeColumn,
  settlementColumn,
} from './codec.js';

/** The handle every statement runs on: a connection reserved for one open transaction. */
export type Tx = postgres.Sql | postgres.TransactionSql;

/** The NOTIFY channel of wake hints (DESIGN §5: a wake is only a hint; the rescan decides). */
export const WAKE_CHANNEL = 'ledgence_wake';

/**
 * Awaits statements sent together on one transaction's connection (postgres.js pipelines them;
 * PostgreSQL runs them in order) and fails with the first failure only once every one has
 * settled. `Promise.all` would fail at the first: the caller's ROLLBACK could then overtake a
 * statement of the same transaction not yet sent, which would run after it, outside any
 * transaction (autocommit).
 */
export async function pipelined<T extends readonly unknown[] | []>(
  statements: T,
): Promise<{ -readonly [K in keyof T]: Awaited<T[K]> }> {
  const settled = await Promise.allSettled(statements);
  for (const outcome of settled) if (outcome.status === 'rejected') throw outcome.reason;
  return settled.map((s) => (s as PromiseFulfilledResult<unknown>).value) as {
    -readonly [K in keyof T]: Awaited<T[K]>;
  };
}

/** A task identity in a scope, the unit most statements take in arrays. */
export interface TaskRef {
  tenant_id: string;
  namespace: string;
  task_id: string;
}

/** An attempt identity in a scope. */
export interface AttemptKeyRef extends TaskRef {
  attempt_id: string;
}

function column<T, R>(rows: readonly T[], pick: (row: T) => R): R[] {
  return rows.map(pick);
}

/**
 * Store time in UTC ms. `clock_timestamp()`, not `now()`: the transaction may have waited for a
 * row lock, and decisions must use the time at which they are taken. Read once per transaction.
 */
export async function storeNow(tx: Tx): Promise<number> {
  const [row] = await tx`select (extract(epoch from clock_timestamp()) * 1000)::bigint as now`;
  return num(row?.now);
}

/**
 * Serialises polls of one consumer slot (two concurrent first polls would both see no cursor),
 * and returns store time read AFTER the locks were granted (one round trip for both). Lock:
 * `pg_advisory_xact_lock` per slot, taken in key order so that batches cannot deadlock, released
 * at commit. No index: advisory locks are not table rows, so no cursor row has to exist.
 */
export async function lockConsumerSlots(tx: Tx, slotKeys: readonly string[]): Promise<number> {
  const [row] = await tx`
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now from (
      select count(pg_advisory_xact_lock(k)) from (
        select hashtextextended(s, 0) as k from unnest(${slotKeys as string[]}::text[]) as s
        order by 1
      ) as ordered
    ) as locked`;
  return num(row?.now);
}

/**
 * Everything a poll needs about its slot, in one round trip: the session, the slot's cursor and
 * the attempt the cursor last assigned, each as a JSON row (`row_to_json`; null when absent),
 * one result row per requested slot with its 1-based `ordinality`. No row locks: the slot's
 * advisory lock is held, and the session and attempt are only read. Indexes: the primary keys
 * of `worker_sessions`, `consumer_cursors` and `attempts`.
 *
 * The attempt is a scalar subquery, not a third join: as a join, on tables never analyzed (a
 * fresh database, the first minutes of every install) the generic plan probed the attempts key
 * with tenant and namespace only and filtered the rest, reading every attempt of the namespace
 * per slot, and a 20 000-task drain decayed to ~80 tasks/s (bench/README.md). In the subquery
 * all four key columns are plain parameters, so every plan probes the whole key.
 */
export async function loadSlots(
  tx: Tx,
  slots: readonly {
    tenant_id: string;
    namespace: string;
    worker_session_id: string;
    consumer_id: number;
  }[],
): Promise<DbRow[]> {
  return tx`
    select k.ordinality, row_to_json(s) as session, row_to_json(c) as cursor,
      (select row_to_json(a) from attempts a
        where a.tenant_id = k.tenant_id and a.namespace = k.namespace
          and a.task_id = c.assignment->>'task_id'
          and a.attempt_id = c.assignment->>'attempt_id') as attempt
    from unnest(${column(slots, (k) => k.tenant_id)}::text[],
                ${column(slots, (k) => k.namespace)}::text[],
                ${column(slots, (k) => k.worker_session_id)}::text[],
                ${column(slots, (k) => k.consumer_id)}::int[])
      with ordinality as k(tenant_id, namespace, worker_session_id, consumer_id, ordinality)
    left join worker_sessions s on s.tenant_id = k.tenant_id and s.namespace = k.namespace
      and s.session_id = k.worker_session_id
    left join consumer_cursors c on c.tenant_id = k.tenant_id and c.namespace = k.namespace
      and c.worker_session_id = k.worker_session_id and c.consumer_id = k.consumer_id`;
}

/**
 * Attempts by primary key, without a lock of their own: every attempt write happens under its
 * task's row lock, so a caller holding the task lock reads a stable attempt.
 */
export async function loadAttempts(tx: Tx, keys: readonly AttemptKeyRef[]): Promise<DbRow[]> {
  return tx`
    select a.* from attempts a
    join unnest(${column(keys, (k) => k.tenant_id)}::text[],
                ${column(keys, (k) => k.namespace)}::text[],
                ${column(keys, (k) => k.task_id)}::text[],
                ${column(keys, (k) => k.attempt_id)}::text[]) as k(tenant_id, namespace, task_id, attempt_id)
      on a.tenant_id = k.tenant_id and a.namespace = k.namespace
     and a.task_id = k.task_id and a.attempt_id = k.attempt_id`;
}

/**
 * {@link loadAttempts} plus store time in the same round trip, for steps that already hold their
 * tasks' row locks (renew, settle, confirm): time is read after the locks were granted. Always
 * returns at least one row (the outer `select 1`); rows without an attempt carry only the time.
 */
export async function loadAttemptsAt(
  tx: Tx,
  keys: readonly AttemptKeyRef[],
): Promise<{ now: number; rows: DbRow[] }> {
  const rows = await tx`
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as store_now, a.*
    from (select 1) as one
    left join (
      attempts a
      join unnest(${column(keys, (k) => k.tenant_id)}::text[],
                  ${column(keys, (k) => k.namespace)}::text[],
                  ${column(keys, (k) => k.task_id)}::text[],
                  ${column(keys, (k) => k.attempt_id)}::text[])
        as k(tenant_id, namespace, task_id, attempt_id)
        on a.tenant_id = k.tenant_id and a.namespace = k.namespace
       and a.task_id = k.task_id and a.attempt_id = k.attempt_id
    ) on true`;
  return {
    now: Math.max(...rows.map((row) => num(row.store_now))),
    rows: rows.filter((row) => row.attempt_id !== null),
  };
}

/** Tasks by primary key, unlocked (replays and reads that write nothing). */
export async function loadTasks(tx: Tx, keys: readonly TaskRef[]): Promise<DbRow[]> {
  return tx`
    select t.* from tasks t
    join unnest(${column(keys, (k) => k.tenant_id)}::text[],
                ${column(keys, (k) => k.namespace)}::text[],
                ${column(keys, (k) => k.task_id)}::text[]) as k(tenant_id, namespace, task_id)
      on t.tenant_id = k.tenant_id and t.namespace = k.namespace and t.task_id = k.task_id`;
}

/**
 * Locks tasks for a lifecycle step (renew, settle, confirm, cancel). Lock: `FOR UPDATE OF t`,
 * waiting; rows are locked in primary-key order (the LockRows node sits above the sort), so two
 * batches over overlapping tasks cannot deadlock. Index: the primary key, one probe per task.
 */
export async function lockTasks(tx: Tx, keys: readonly TaskRef[]): Promise<DbRow[]> {
  return tx`
    select t.* from tasks t
    join unnest(${column(keys, (k) => k.tenant_id)}::text[],
                ${column(keys, (k) => k.namespace)}::text[],
                ${column(keys, (k) => k.task_id)}::text[]) as k(tenant_id, namespace, task_id)
      on t.tenant_id = k.tenant_id and t.namespace = k.namespace and t.task_id = k.task_id
    order by t.tenant_id, t.namespace, t.task_id
    for update of t`;
}

/** Application data (and optionally outputs) of tasks, by primary key; only replies read them. */
export async function loadPayloads(tx: Tx, keys: readonly TaskRef[]): Promise<DbRow[]> {
  return tx`
    select p.tenant_id, p.namespace, p.task_id, p.data, p.output from task_payloads p
    join unnest(${column(keys, (k) => k.tenant_id)}::text[],
                ${column(keys, (k) => k.namespace)}::text[],
                ${column(keys, (k) => k.task_id)}::text[]) as k(tenant_id, namespace, task_id)
      on p.tenant_id = k.tenant_id and p.namespace = k.namespace and p.task_id = k.task_id`;
}

/**
 * How many tasks a claim select asks for, and from which store time they must be available.
 * `later`: a known time and count (a claim's second or third round, after refusals by
 * concurrency keys). `first`: the first round, sent in the claim's opening round trip beside the
 * slot locks and reads (issue #7: a claim in 2 round trips, not 3) — before the server knows the
 * slots' cursors, so store time is read by the statement itself and the count is the polls that
 * are new by their slot's cursor (`sequence` = the cursor's + 1, or 1 without a cursor), counted
 * in SQL from the same cursors the server then classifies. A replay or a sequence conflict asks
 * for nothing; a poll the server rejects later (expired session, busy slot) may have asked for
 * one task too many — the caller leaves it unwritten and wakes the queue at commit.
 */
export type ClaimBound =
  | { round: 'later'; now: number; limit: number }
  | { round: 'first'; clockOffsetMs: number; polls: readonly PollSlot[] };

/** A poll's slot and sequence, as {@link ClaimBound} counts new polls. */
export interface PollSlot {
  worker_session_id: string;
  consumer_id: number;
  sequence: number;
}

/**
 * The best claimable tasks of a queue (DESIGN §5 Acquire): queued, available, and whose
 * concurrency key (if any) is under its limit by the committed count; ordered priority desc,
 * available_at, task_id. Lock: `FOR UPDATE SKIP LOCKED` — concurrent claimers take different
 * rows instead of queueing on the first one. Index: the partial `tasks_acquire`
 * (tenant_id, namespace, queue, priority desc, available_at, task_id) WHERE state = 'queued',
 * read one priority at a time: `priorities` walks the queue's distinct priorities, highest
 * first, one index descent each (a loose index scan), and for each the lateral select reads the
 * range `available_at <= now` in order, LIMIT stopping it and the outer LIMIT stopping the walk
 * (a nested loop keeps the walk's order, which is the claim order). One range over the whole
 * queue instead would be ordered by priority first, so `available_at <= now` could only filter
 * it: a queue holding 100 000 tasks delayed to tomorrow made every poll of it, empty or not,
 * read all 100 000 entries (41 ms on PostgreSQL 15; 18's skip scan avoids it, 15–17 do not).
 * The key check is a filter and only a pre-filter: {@link takeConcurrencySlot} decides.
 * In the first round, store time and the count are uncorrelated subqueries (InitPlans,
 * evaluated once before the walk), so the plan is the same walk (explain.int.test.ts). The count
 * reads each poll's cursor unlocked — the slot's advisory lock, taken by the statement before it
 * in the same round trip, serialises its polls — by a scalar subquery on all four columns of
 * `consumer_cursors`' primary key: a probe whatever the table's statistics (as a join, a
 * never-analyzed table can get a plan that reads every cursor of the namespace; see
 * {@link loadSlots}; fresh-plans.int.test.ts checks it).
 * Each row brings its application data (`payload_data`; not locked), probed by `task_payloads`'
 * primary key: a claim needs no payload read of its own (issue #7, one round trip). The task id
 * is compared in the default collation, the payload key's: compared in `tasks.task_id`'s `C`
 * the key cannot be used, and the generic plan hash-joined a sequential scan of every payload
 * (bench/README.md; fresh-plans.int.test.ts checks the plan).
 */
export async function selectClaimable(
  tx: Tx,
  scope: { tenant_id: string; namespace: string },
  queue: string,
  bound: ClaimBound,
  excluded: readonly string[],
): Promise<DbRow[]> {
  const availableBy =
    bound.round === 'later'
      ? tx`${bound.now}`
      : tx`(select (extract(epoch from clock_timestamp()) * 1000)::bigint + ${bound.clockOffsetMs}::bigint)`;
  const limit =
    bound.round === 'later'
      ? tx`${bound.limit}`
      : tx`(select count(*) from unnest(
            ${column(bound.polls, (s) => s.worker_session_id)}::text[],
            ${column(bound.polls, (s) => s.consumer_id)}::int[],
            ${column(bound.polls, (s) => s.sequence)}::bigint[])
              as s(worker_session_id, consumer_id, sequence)
          where s.sequence = 1 + coalesce((select c.sequence from consumer_cursors c
            where c.tenant_id = ${scope.tenant_id} and c.namespace = ${scope.namespace}
              and c.worker_session_id = s.worker_session_id
              and c.consumer_id = s.consumer_id), 0))`;
  const queued = tx`t.tenant_id = ${scope.tenant_id} and t.namespace = ${scope.namespace}
      and t.queue = ${queue} and t.state = 'queued'`;
  return tx`
    with recursive priorities(priority) as (
      (select t.priority from tasks t where ${queued}
        order by t.priority desc nulls last limit 1)
      union all
      select (select t.priority from tasks t where ${queued} and t.priority < p.priority
          order by t.priority desc nulls last limit 1)
      from priorities p where p.priority is not null
    )
    select c.* from priorities p cross join lateral (
      select t.*, pl.data as payload_data from tasks t
      left join task_payloads pl on pl.tenant_id = t.tenant_id and pl.namespace = t.namespace
        and pl.task_id = t.task_id collate "default"
      where ${queued} and t.priority = p.priority and t.available_at <= ${availableBy}
        and t.task_id <> all(${excluded as string[]}::text[])
        and (t.concurrency_key is null or not exists (
          select 1 from concurrency_keys k
          where k.tenant_id = t.tenant_id and k.namespace = t.namespace
            and k.concurrency_key = t.concurrency_key and k.active >= t.concurrency_limit))
      order by t.available_at, t.task_id
      limit ${limit}
      for update of t skip locked
    ) c
    where p.priority is not null
    limit ${limit}`;
}

/**
 * When a queue's next queued task comes due: the earliest `available_at` after `after` (the
 * empty poll's store time), or null, with store time read by the statement itself (`store_now`,
 * plus `clockOffsetMs`). Asked only by a probe that claimed nothing and is about to park: nothing
 * NOTIFYs at a due time, so this is how a parked poll learns when to look again. Not locked and
 * not filtered by concurrency keys: a due task held back by a key or another claim's lock is
 * the rescan's matter, and a hint too early costs one probe. Index: `tasks_acquire`, walked as
 * {@link selectClaimable} walks it — one descent per distinct priority, then one more per
 * priority to the first entry past `after` (`available_at > after order by available_at limit
 * 1` within a priority is a range of the index). A plain `min(available_at)` over the queue
 * would read every delayed entry, the ones the claim select learned to skip
 * (explain.int.test.ts).
 */
export async function selectNextDue(
  tx: Tx,
  scope: { tenant_id: string; namespace: string },
  queue: string,
  after: number,
  clockOffsetMs: number,
): Promise<{ at: number; observedAt: number } | undefined> {
  const queued = tx`t.tenant_id = ${scope.tenant_id} and t.namespace = ${scope.namespace}
      and t.queue = ${queue} and t.state = 'queued'`;
  const [row] = await tx`
    with recursive priorities(priority) as (
      (select t.priority from tasks t where ${queued}
        order by t.priority desc nulls last limit 1)
      union all
      select (select t.priority from tasks t where ${queued} and t.priority < p.priority
          order by t.priority desc nulls last limit 1)
      from priorities p where p.priority is not null
    )
    select min(d.available_at) as next_due_at,
      (extract(epoch from clock_timestamp()) * 1000)::bigint + ${clockOffsetMs}::bigint
        as store_now
    from priorities p cross join lateral (
      select t.available_at from tasks t
      where ${queued} and t.priority = p.priority and t.available_at > ${after}::bigint
      order by t.available_at
      limit 1
    ) d
    where p.priority is not null`;
  if (row === undefined || row.next_due_at === null) return undefined;
  return { at: num(row.next_due_at), observedAt: num(row.store_now) };
}

/**
 * Takes one slot of a concurrency key for a claim, if the key is under `limit`. Lock: the key's
 * row, waiting — claimers of one key serialise here, and after a wait PostgreSQL re-evaluates
 * `active < limit` against the row the other claimer committed, so the limit holds under any
 * concurrency (a plain `count(*) < limit` in the SKIP LOCKED select would let two claimers both
 * pass). An upsert, so a key row that does not exist yet (rows loaded outside `submit`) is
 * created holding this claim. Index: the primary key of `concurrency_keys`.
 *
 * Also returns store time read after the upsert (the aggregate consumes it first), since the wait
 * may outlast a lease: the poll's decisions after it must not use the time read before it.
 */
export async function takeConcurrencySlot(
  tx: Tx,
  scope: { tenant_id: string; namespace: string },
  key: string,
  limit: number,
): Promise<{ taken: boolean; now: number }> {
  const [row] = await tx`
    with taken as (
      insert into concurrency_keys as k (tenant_id, namespace, concurrency_key, active)
      values (${scope.tenant_id}, ${scope.namespace}, ${key}, 1)
      on conflict (tenant_id, namespace, concurrency_key) do update set active = k.active + 1
        where k.active < ${limit}
      returning 1
    )
    select count(*)::int as taken, (extract(epoch from clock_timestamp()) * 1000)::bigint as now
    from taken`;
  return { taken: num(row?.taken) === 1, now: num(row?.now) };
}

/**
 * {@link takeConcurrencySlot} for a key ordered below one the transaction holds: the key's row is
 * taken only if no other transaction holds it (`SKIP LOCKED`), so the claim never waits on it and
 * cannot close a deadlock cycle. Not taken when the row is busy or at `limit`. A row this
 * statement's snapshot does not show (retention deletes idle keys' rows while queued tasks of the
 * key may remain) is created holding the claim; `on conflict do nothing` makes a row committed
 * since then a refusal, for a later poll. The one wait left: a concurrent first claim or submit
 * of the same absent key, uncommitted — a cycle only if that claim then waits for a key this one
 * holds, or that submit for a key row this one creates (a submit passes over rows that exist:
 * {@link ensureConcurrencyKeys}), which PostgreSQL breaks by aborting one (the grouped poll is
 * then answered alone).
 */
export async function takeConcurrencySlotNoWait(
  tx: Tx,
  scope: { tenant_id: string; namespace: string },
  key: string,
  limit: number,
): Promise<{ taken: boolean; now: number }> {
  const [row] = await tx`
    with free as (
      select k.tenant_id, k.namespace, k.concurrency_key from concurrency_keys k
      where k.tenant_id = ${scope.tenant_id} and k.namespace = ${scope.namespace}
        and k.concurrency_key = ${key}
      for update skip locked
    ), taken as (
      update concurrency_keys k set active = k.active + 1 from free f
      where k.tenant_id = f.tenant_id and k.namespace = f.namespace
        and k.concurrency_key = f.concurrency_key and k.active < ${limit}
      returning 1
    ), created as (
      insert into concurrency_keys (tenant_id, namespace, concurrency_key, active)
      select ${scope.tenant_id}, ${scope.namespace}, ${key}, 1
      where not exists (select 1 from concurrency_keys k
        where k.tenant_id = ${scope.tenant_id} and k.namespace = ${scope.namespace}
          and k.concurrency_key = ${key})
      on conflict do nothing
      returning 1
    )
    select ((select count(*) from taken) + (select count(*) from created))::int as taken,
      (extract(epoch from clock_timestamp()) * 1000)::bigint as now`;
  return { taken: num(row?.taken) === 1, now: num(row?.now) };
}

/**
 * Gives back concurrency slots of tasks that left `active` (settled, recovered, or won for a poll
 * that was then refused). Lock: the key rows, in the order given — the caller sorts them in the
 * order claims lock keys (store.ts `KeyLockOrder`) — taken by `locked` before any is updated: an
 * UPDATE joined to the list locks rows in whatever order its plan visits them, and two
 * transactions locking two keys in opposite orders deadlock. Index: PK.
 */
export async function releaseConcurrencySlots(
  tx: Tx,
  releases: readonly { tenant_id: string; namespace: string; key: string; count: number }[],
): Promise<void> {
  await tx`
    with v as (
      select * from unnest(${column(releases, (r) => r.tenant_id)}::text[],
                           ${column(releases, (r) => r.namespace)}::text[],
                           ${column(releases, (r) => r.key)}::text[],
                           ${column(releases, (r) => r.count)}::int[])
        with ordinality as v(tenant_id, namespace, key, n, ord)
    ), locked as (
      select k.tenant_id, k.namespace, k.concurrency_key, v.n from concurrency_keys k
      join v on k.tenant_id = v.tenant_id and k.namespace = v.namespace
        and k.concurrency_key = v.key
      order by v.ord
      for update of k
    )
    update concurrency_keys k set active = greatest(0, k.active - l.n)
    from locked l
    where k.tenant_id = l.tenant_id and k.namespace = l.namespace
      and k.concurrency_key = l.concurrency_key`;
}

/**
 * Creates the missing concurrency-key rows of a submit's new tasks, once the transaction's inserts
 * are sent: one `(key, task)` entry per keyed task the submit meant to create, and a key's row is
 * created only if one of its tasks was inserted (the tasks primary key finds this transaction's
 * rows: their ids are fresh) — a task the insert skipped (its idempotency key held: a replay or
 * a `conflict`) writes nothing, or a refused submit would leave a row that retention, deleting
 * only the keys of tasks it collects, never removes (submit-key-rows.int.test.ts).
 *
 * Lock: none on a key row the statement's snapshot shows — `not exists` passes it over before
 * the insert, whose `on conflict` check would otherwise wait out a claim or settle updating it;
 * a submit that had created one new row and then waited so for a claim's key closed a cycle with
 * a claim creating that new row without waiting (`takeConcurrencySlotNoWait`). The rows it
 * creates, until commit, and a wait on a key row another transaction is creating (the `on
 * conflict` check waits that one out: a cycle only with a claim that creates a missing key row
 * and then waits for another this submit creates). Rows are inserted in the order given (`with
 * ordinality … order by`, which the function scan already yields: no sort): the caller passes
 * them in the order claims lock key rows (store.ts `KeyLockOrder`), all of a submit's keys in
 * one statement behind its inserts (store.ts `sendConcurrencyKeys`). Two submits creating the
 * same new keys in different orders, or chunk by chunk (as before), each held a key the other
 * then waited for: a deadlock, which PostgreSQL broke after `deadlock_timeout` (1 s) by aborting
 * one, whose batch was then retried item by item (submit-deadlock.int.test.ts). A key named by
 * several tasks comes once per task; `on conflict do nothing` skips its repeats.
 * Index: the tasks primary key, and the primary key of `concurrency_keys` for `not exists` and as
 * the conflict arbiter.
 */
export async function ensureConcurrencyKeys(
  tx: Tx,
  keys: readonly { tenant_id: string; namespace: string; key: string; task_id: string }[],
): Promise<void> {
  await tx`
    insert into concurrency_keys (tenant_id, namespace, concurrency_key, active)
    select v.tenant_id, v.namespace, v.key, 0
    from unnest(${column(keys, (k) => k.tenant_id)}::text[],
                ${column(keys, (k) => k.namespace)}::text[],
                ${column(keys, (k) => k.key)}::text[],
                ${column(keys, (k) => k.task_id)}::text[])
      with ordinality as v(tenant_id, namespace, key, task_id, ord)
    where exists (select 1 from tasks t
        where t.tenant_id = v.tenant_id and t.namespace = v.namespace and t.task_id = v.task_id)
      and not exists (select 1 from concurrency_keys k
        where k.tenant_id = v.tenant_id and k.namespace = v.namespace
          and k.concurrency_key = v.key)
    order by v.ord
    on conflict do nothing`;
}

/** New attempts (claims). Plain insert: the attempt id is fresh. */
export async function insertAttempts(tx: Tx, rows: readonly AttemptRow[]): Promise<void> {
  await tx`
    insert into attempts (tenant_id, namespace, task_id, attempt_id, ordinal, lease_id, generation,
      worker_session_id, consumer_id, state, claimed_at, deadline, authority_deadline,
      lease_expires_at, renew_sequence, last_renewal, dispatch_allowed, quiescence, settlement,
      settlement_digest, pending, finished_at)
    select v.tenant_id, v.namespace, v.task_id, v.attempt_id, v.ordinal, v.lease_id, v.generation,
      v.worker_session_id, v.consumer_id, v.state, v.claimed_at, v.deadline, v.authority_deadline,
      v.lease_expires_at, v.renew_sequence, v.last_renewal::jsonb, v.dispatch_allowed = 1,
      v.quiescence, v.settlement::json, v.settlement_digest, v.pending::json, v.finished_at
    from unnest(
      ${column(rows, (r) => r.tenant_id)}::text[], ${column(rows, (r) => r.namespace)}::text[],
      ${column(rows, (r) => r.task_id)}::text[], ${column(rows, (r) => r.attempt_id)}::text[],
      ${column(rows, (r) => r.ordinal)}::int[], ${column(rows, (r) => r.lease_id)}::text[],
      ${column(rows, (r) => r.generation)}::int[],
      ${column(rows, (r) => r.worker_session_id)}::text[],
      ${column(rows, (r) => r.consumer_id)}::int[], ${column(rows, (r) => r.state)}::text[],
      ${column(rows, (r) => r.claimed_at)}::bigint[], ${column(rows, (r) => r.deadline)}::bigint[],
      ${column(rows, (r) => r.authority_deadline)}::bigint[],
      ${column(rows, (r) => r.lease_expires_at)}::bigint[],
      ${column(rows, (r) => r.renew_sequence)}::bigint[],
      ${column(rows, lastRenewalColumn)}::text[],
      ${column(rows, (r) => (r.dispatch_allowed ? 1 : 0))}::int[],
      ${column(rows, (r) => r.quiescence)}::text[],
      ${column(rows, settlementColumn)}::text[],
      ${column(rows, (r) => r.settlement_digest)}::text[],
      ${column(rows, (r) => jsonText(r.pending))}::text[],
      ${column(rows, (r) => r.finished_at)}::bigint[]
    ) as v(tenant_id, namespace, task_id, attempt_id, ordinal, lease_id, generation,
      worker_session_id, consumer_id, state, claimed_at, deadline, authority_deadline,
      lease_expires_at, renew_sequence, last_renewal, dispatch_allowed, quiescence, settlement,
      settlement_digest, pending, finished_at)`;
}

/**
 * A renewal's attempt write: only the lease columns, none of them indexed, so the update is HOT.
 * Lock: the task row is held by the caller. Index: the attempts primary key.
 */
export async function renewAttempts(tx: Tx, rows: readonly AttemptRow[]): Promise<void> {
  await tx`
    update attempts a set lease_expires_at = v.lease_expires_at,
      renew_sequence = v.renew_sequence, last_renewal = v.last_renewal::jsonb,
      dispatch_allowed = v.dispatch_allowed = 1
    from unnest(
      ${column(rows, (r) => r.tenant_id)}::text[], ${column(rows, (r) => r.namespace)}::text[],
      ${column(rows, (r) => r.task_id)}::text[], ${column(rows, (r) => r.attempt_id)}::text[],
      ${column(rows, (r) => r.lease_expires_at)}::bigint[],
      ${column(rows, (r) => r.renew_sequence)}::bigint[],
      ${column(rows, lastRenewalColumn)}::text[],
      ${column(rows, (r) => (r.dispatch_allowed ? 1 : 0))}::int[]
    ) as v(tenant_id, namespace, task_id, attempt_id, lease_expires_at, renew_sequence,
      last_renewal, dispatch_allowed)
    where a.tenant_id = v.tenant_id and a.namespace = v.namespace
      and a.task_id = v.task_id and a.attempt_id = v.attempt_id`;
}

/**
 * A settle/confirm/recovery attempt write: every mutable column. Lock: the task row is held by
 * the caller. Index: the attempts primary key.
 */
export async function updateAttempts(tx: Tx, rows: readonly AttemptRow[]): Promise<void> {
  await tx`
    update attempts a set state = v.state, lease_expires_at = v.lease_expires_at,
      renew_sequence = v.renew_sequence, last_renewal = v.last_renewal::jsonb,
      dispatch_allowed = v.dispatch_allowed = 1, quiescence = v.quiescence,
      settlement = v.settlement::json, settlement_digest = v.settlement_digest,
      pending = v.pending::json, finished_at = v.finished_at
    from unnest(
      ${column(rows, (r) => r.tenant_id)}::text[], ${column(rows, (r) => r.namespace)}::text[],
      ${column(rows, (r) => r.task_id)}::text[], ${column(rows, (r) => r.attempt_id)}::text[],
      ${column(rows, (r) => r.state)}::text[],
      ${column(rows, (r) => r.lease_expires_at)}::bigint[],
      ${column(rows, (r) => r.renew_sequence)}::bigint[],
      ${column(rows, lastRenewalColumn)}::text[],
      ${column(rows, (r) => (r.dispatch_allowed ? 1 : 0))}::int[],
      ${column(rows, (r) => r.quiescence)}::text[],
      ${column(rows, settlementColumn)}::text[],
      ${column(rows, (r) => r.settlement_digest)}::text[],
      ${column(rows, (r) => jsonText(r.pending))}::text[],
      ${column(rows, (r) => r.finished_at)}::bigint[]
    ) as v(tenant_id, namespace, task_id, attempt_id, state, lease_expires_at, renew_sequence,
      last_renewal, dispatch_allowed, quiescence, settlement, settlement_digest, pending,
      finished_at)
    where a.tenant_id = v.tenant_id and a.namespace = v.namespace
      and a.task_id = v.task_id and a.attempt_id = v.attempt_id`;
}

/**
 * The scheduling columns of tasks a transition changed; the immutable submission and the payload
 * are never rewritten. Lock: the caller holds each row (`FOR UPDATE` or `SKIP LOCKED`). Index:
 * the primary key. Updates that leave `state` and `available_at` alone are HOT.
 */
export async function updateTasks(tx: Tx, rows: readonly TaskRow[]): Promise<void> {
  await tx`
    update tasks t set state = v.state, available_at = v.available_at,
      terminal_at = v.terminal_at, attempt_count = v.attempt_count,
      dispatch_count = v.dispatch_count, current_attempt_id = v.current_attempt_id,
      cancel_requested_at = v.cancel_requested_at, outcome = v.outcome::json,
      history_sequence = v.history_sequence
    from unnest(
      ${column(rows, (r) => r.tenant_id)}::text[], ${column(rows, (r) => r.namespace)}::text[],
      ${column(rows, (r) => r.task_id)}::text[], ${column(rows, (r) => r.state)}::text[],
      ${column(rows, (r) => r.available_at)}::bigint[],
      ${column(rows, (r) => r.terminal_at)}::bigint[],
      ${column(rows, (r) => r.attempt_count)}::int[],
      ${column(rows, (r) => r.dispatch_count)}::int[],
      ${column(rows, (r) => r.current_attempt_id)}::text[],
      ${column(rows, (r) => r.cancel_requested_at)}::bigint[],
      ${column(rows, (r) => outcomeColumn(r.outcome))}::text[],
      ${column(rows, (r) => r.history_sequence)}::int[]
    ) as v(tenant_id, namespace, task_id, state, available_at, terminal_at, attempt_count,
      dispatch_count, current_attempt_id, cancel_requested_at, outcome, history_sequence)
    where t.tenant_id = v.tenant_id and t.namespace = v.namespace and t.task_id = v.task_id`;
}

/** A success's output, written once into the payload row (never by claim or renew). */
export async function writeOutputs(
  tx: Tx,
  rows: readonly (TaskRef & { output: unknown })[],
): Promise<void> {
  await tx`
    update task_payloads p set output = v.output::json
    from unnest(${column(rows, (r) => r.tenant_id)}::text[],
                ${column(rows, (r) => r.namespace)}::text[],
                ${column(rows, (r) => r.task_id)}::text[],
                ${column(rows, (r) => jsonValueText(r.output))}::text[])
      as v(tenant_id, namespace, task_id, output)
    where p.tenant_id = v.tenant_id and p.namespace = v.namespace and p.task_id = v.task_id`;
}

/** History records; sequences were assigned by the transitions under the task lock. */
export async function insertHistory(tx: Tx, rows: readonly HistoryRow[]): Promise<void> {
  await tx`
    insert into task_history (tenant_id, namespace, task_id, sequence, attempt_id, at, reason)
    select * from unnest(
      ${column(rows, (r) => r.tenant_id)}::text[], ${column(rows, (r) => r.namespace)}::text[],
      ${column(rows, (r) => r.task_id)}::text[], ${column(rows, (r) => r.sequence)}::int[],
      ${column(rows, (r) => r.attempt_id)}::text[], ${column(rows, (r) => r.at)}::bigint[],
      ${column(rows, (r) => r.reason)}::text[])`;
}

/** A slot's cursor after a poll. The slot's advisory lock is held; upsert on the primary key. */
export async function upsertCursors(
  tx: Tx,
  rows: readonly (CursorRow & { tenant_id: string; namespace: string })[],
): Promise<void> {
  await tx`
    insert into consumer_cursors (tenant_id, namespace, worker_session_id, consumer_id, sequence,
      command, assignment)
    select v.tenant_id, v.namespace, v.worker_session_id, v.consumer_id, v.sequence,
      v.command::jsonb, v.assignment::jsonb
    from unnest(
      ${column(rows, (r) => r.tenant_id)}::text[], ${column(rows, (r) => r.namespace)}::text[],
      ${column(rows, (r) => r.worker_session_id)}::text[],
      ${column(rows, (r) => r.consumer_id)}::int[], ${column(rows, (r) => r.sequence)}::bigint[],
      ${column(rows, (r) => jsonText(r.command))}::text[],
      ${column(rows, (r) => jsonText(r.assignment))}::text[]
    ) as v(tenant_id, namespace, worker_session_id, consumer_id, sequence, command, assignment)
    on conflict (tenant_id, namespace, worker_session_id, consumer_id) do update
      set sequence = excluded.sequence, command = excluded.command,
          assignment = excluded.assignment`;
}

/**
 * Existing tasks holding idempotency keys. No lock: a replayed submit only reads (a lock would
 * also hide a queued task from SKIP LOCKED claimers while it is held); a concurrent first submit
 * of the same key is caught by the insert's ON CONFLICT and answered by a retry.
 * Index: the unique `tasks_idempotency_key`.
 */
export async function loadTasksByIdempotencyKey(
  tx: Tx,
  keys: readonly { tenant_id: string; namespace: string; idempotency_key: string }[],
): Promise<DbRow[]> {
  return tx`
    select t.* from tasks t
    join unnest(${column(keys, (k) => k.tenant_id)}::text[],
                ${column(keys, (k) => k.namespace)}::text[],
                ${column(keys, (k) => k.idempotency_key)}::text[]) as k(tenant_id, namespace, key)
      on t.tenant_id = k.tenant_id and t.namespace = k.namespace and t.idempotency_key = k.key`;
}

/**
 * Where the times of a submit's rows come from. `readsStoreTime: false`: they carry store time,
 * read by the caller before it built them (a batch with an absolute `available_at`, which must be
 * checked against store time before anything is written). `readsStoreTime: true`: they were built
 * at store time 0 (`submitted_at` 0, `available_at` the delay, history at 0) and the insert adds
 * the store time it reads, plus `offsetMs` (the store's test clock offset; 0 in production).
 */
export type SubmitClock = { readsStoreTime: false } | { readsStoreTime: true; offsetMs: number };

/**
 * New tasks with their payload and history rows, and the wake NOTIFY, in ONE round trip (a
 * statement of data-modifying CTEs). Measured before (bench/README.md, "Changes and their
 * measured effect"): a submit sent begin, an idempotency lookup, store time, three INSERTs, a
 * NOTIFY and commit — 8 round trips for a lone task; now begin with store time, then this with
 * COMMIT behind it: 2.
 *
 * Insert first, look up only on conflict: `ON CONFLICT DO NOTHING` on the unique
 * `tasks_idempotency_key` skips a key that is already held (waiting, if another transaction is
 * inserting it, for that one to end), so the usual all-new submit never runs the idempotency
 * lookup. The caller then looks up only the skipped keys ({@link loadTasksByIdempotencyKey}),
 * after the commit, and answers them as replays or conflicts. Payload and history rows are inserted only for the tasks
 * `ins` returned (joined on the fresh task id), so a skipped task leaves no rows behind.
 *
 * `wake` is the NOTIFY payload (a JSON array of hints), or null when the caller sends it itself;
 * it is sent only if at least one task was inserted (a replay wakes nobody).
 *
 * `clock` says where the rows' times come from (see {@link SubmitClock}): with `readsStoreTime`
 * the rows were built at store time 0 and the statement adds the store time it reads itself, so
 * a submit needs no round trip to read it first — and a submit that is this one statement needs
 * no BEGIN or COMMIT either (the store's `submitTransaction`). Returns the scopes and idempotency
 * keys actually inserted, each with `base`, the store time added to its times (0 when the rows
 * carried store time already). Locks: the new rows only (and the wait above), their idempotency
 * keys taken in the order of `rows` (`with ordinality … order by`, which the function scan
 * already yields: no sort). The caller passes every submit's rows in one order, by idempotency
 * key across all its chunks: two submits inserting the same new keys in different orders each
 * held a key the other then waited for, a deadlock (submit-deadlock.int.test.ts). Payload and
 * history rows have fresh task ids: no other transaction waits for them. Index: the unique
 * `tasks_idempotency_key` as the conflict arbiter.
 */
export async function insertSubmitted(
  tx: Tx,
  rows: readonly TaskRow[],
  history: readonly HistoryRow[],
  wake: string | null,
  clock: SubmitClock,
): Promise<DbRow[]> {
  // `now()`, not `clock_timestamp()`: one value for every chunk of a transaction (its start, the
  // moment BEGIN ran; for a lone statement, its own start), as when store time was read with
  // BEGIN. An insert that waits out a concurrent first submit of a key keeps that earlier time,
  // as it did then.
  const offset = clock.readsStoreTime ? clock.offsetMs : null;
  return tx`
    with clock as (
      select case when ${offset}::bigint is null then 0::bigint
        else (extract(epoch from now()) * 1000)::bigint + ${offset}::bigint end as base
    ), ins as (
      insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
        input, origin_trace, queue, program, retry, timeout_ms, priority, concurrency_key,
        concurrency_limit, labels, state, submitted_at, available_at, terminal_at, attempt_count,
        dispatch_count, current_attempt_id, cancel_requested_at, outcome, history_sequence)
      select v.tenant_id, v.namespace, v.task_id, v.run_id, v.idempotency_key, v.command_digest,
        v.input::jsonb, v.origin_trace::jsonb, v.queue, v.program::jsonb, v.retry::jsonb,
        v.timeout_ms, v.priority, v.concurrency_key, v.concurrency_limit, v.labels::jsonb,
        v.state, clock.base + v.submitted_at, clock.base + v.available_at, v.terminal_at,
        v.attempt_count, v.dispatch_count, v.current_attempt_id, v.cancel_requested_at,
        v.outcome::json, v.history_sequence
      from clock, unnest(
        ${column(rows, (r) => r.tenant_id)}::text[], ${column(rows, (r) => r.namespace)}::text[],
        ${column(rows, (r) => r.task_id)}::text[], ${column(rows, (r) => r.run_id)}::text[],
        ${column(rows, (r) => r.idempotency_key)}::text[],
        ${column(rows, (r) => r.command_digest)}::text[],
        ${column(rows, (r) => inputColumn(r.input))}::text[],
        ${column(rows, (r) => jsonText(r.origin_trace))}::text[],
        ${column(rows, (r) => r.queue)}::text[],
        ${column(rows, (r) => JSON.stringify(r.program))}::text[],
        ${column(rows, (r) => JSON.stringify(r.retry))}::text[],
        ${column(rows, (r) => r.timeout_ms)}::bigint[], ${column(rows, (r) => r.priority)}::int[],
        ${column(rows, (r) => r.concurrency_key)}::text[],
        ${column(rows, (r) => r.concurrency_limit)}::int[],
        ${column(rows, (r) => JSON.stringify(r.labels))}::text[],
        ${column(rows, (r) => r.state)}::text[],
        ${column(rows, (r) => r.submitted_at)}::bigint[],
        ${column(rows, (r) => r.available_at)}::bigint[],
        ${column(rows, (r) => r.terminal_at)}::bigint[],
        ${column(rows, (r) => r.attempt_count)}::int[],
        ${column(rows, (r) => r.dispatch_count)}::int[],
        ${column(rows, (r) => r.current_attempt_id)}::text[],
        ${column(rows, (r) => r.cancel_requested_at)}::bigint[],
        ${column(rows, (r) => outcomeColumn(r.outcome))}::text[],
        ${column(rows, (r) => r.history_sequence)}::int[]
      ) with ordinality as v(tenant_id, namespace, task_id, run_id, idempotency_key,
        command_digest, input, origin_trace, queue, program, retry, timeout_ms, priority,
        concurrency_key, concurrency_limit, labels, state, submitted_at, available_at,
        terminal_at, attempt_count, dispatch_count, current_attempt_id, cancel_requested_at,
        outcome, history_sequence, ord)
      order by v.ord
      on conflict (tenant_id, namespace, idempotency_key) do nothing
      returning tenant_id, namespace, task_id, idempotency_key
    ), payloads as (
      insert into task_payloads (tenant_id, namespace, task_id, data)
      select ins.tenant_id, ins.namespace, ins.task_id, p.data::json
      from unnest(${column(rows, (r) => r.task_id)}::text[],
                  ${column(rows, (r) => jsonValueText(r.input.data))}::text[]) as p(task_id, data)
      join ins on ins.task_id = p.task_id
    ), hist as (
      insert into task_history (tenant_id, namespace, task_id, sequence, attempt_id, at, reason)
      select ins.tenant_id, ins.namespace, ins.task_id, h.sequence, h.attempt_id,
        clock.base + h.at, h.reason
      from clock, unnest(
        ${column(history, (r) => r.task_id)}::text[], ${column(history, (r) => r.sequence)}::int[],
        ${column(history, (r) => r.attempt_id)}::text[], ${column(history, (r) => r.at)}::bigint[],
        ${column(history, (r) => r.reason)}::text[]) as h(task_id, sequence, attempt_id, at, reason)
      join ins on ins.task_id = h.task_id
    ), wake as (
      select count(pg_notify(${WAKE_CHANNEL}, w)) as sent
      from (select ${wake}::text as w from ins limit 1) as one
      where w is not null
    )
    select ins.tenant_id, ins.namespace, ins.idempotency_key, clock.base from ins, wake, clock`;
}

/**
 * Expired leases to recover, with their tasks locked. Lock: `FOR UPDATE OF t SKIP LOCKED` on the
 * task (never on the attempt: settle locks the task first, so recovery must too, or the two
 * would deadlock); a task busy in another transaction (a late settle or renew) is skipped and
 * reconsidered by the next pass. Index: the partial `attempts_active` (state = 'active'), which
 * holds only in-flight attempts; the lease filter runs over that small set; tasks by primary key.
 * The returned task row is the locked, current version; the caller re-reads the attempt.
 * `read_at` is the database clock as each row was produced (without the store's offset): later
 * than any transition the row shows, so the caller decides at it.
 */
export async function lockExpiredLeases(tx: Tx, now: number, limit: number): Promise<DbRow[]> {
  return tx`
    select t.*, a.attempt_id as expired_attempt_id,
      (extract(epoch from clock_timestamp()) * 1000)::bigint as read_at
    from attempts a
    join tasks t on t.tenant_id = a.tenant_id and t.namespace = a.namespace
      and t.task_id = a.task_id
    where a.state = 'active' and a.lease_expires_at <= ${now}
    order by a.lease_expires_at
    limit ${limit}
    for update of t skip locked`;
}

/**
 * Non-terminal task counts per queue and state, for the `/metrics` queue depth gauge: the `limit`
 * queues holding the most tasks (ties by name), each with its `queued` and `active` counts, and
 * every other queue summed into rows whose `queue` is null, so a scrape returns at most
 * 2 × (limit + 1) rows however many queues exist. Tenants and namespaces are summed over: they are
 * not metric labels (unbounded). Lock: none — a plain snapshot read; it takes no row lock, so it
 * never blocks a claim, renew or settle, nor waits for one (the counts are those of its snapshot,
 * which is all a gauge sample promises). Indexes: queued tasks through the partial `tasks_acquire`
 * (state = 'queued'; it holds the queue column, so an index-only scan once vacuum has set the
 * visibility map), active tasks through the partial `attempts_active` joined to tasks by primary
 * key — an active task has exactly its current attempt active (a settled attempt awaiting cleanup
 * stays `active` too), and no index on tasks holds the active ones. Terminal rows are never read;
 * the cost is linear in the backlog (queued plus in flight), once per scrape.
 */
export async function queueDepths(tx: Tx, limit: number): Promise<DbRow[]> {
  return tx`
    with depth as (
      select queue, 'queued' as state, count(*) as n from tasks
      where state = 'queued'
      group by queue
      union all
      select t.queue, 'active', count(*) from attempts a
      join tasks t on t.tenant_id = a.tenant_id and t.namespace = a.namespace
        and t.task_id = a.task_id
      where a.state = 'active' and t.state = 'active' and t.current_attempt_id = a.attempt_id
      group by t.queue
    ), ranked as (
      select queue, row_number() over (order by sum(n) desc, queue) as rank
      from depth
      group by queue
    )
    select case when r.rank <= ${limit} then d.queue end as queue, d.state,
      sum(d.n)::bigint as count
    from depth d join ranked r on r.queue = d.queue
    group by 1, 2
    order by 1 nulls last, 2`;
}

/**
 * The largest wake NOTIFY payload sent, in UTF-8 bytes. PostgreSQL refuses a payload of 8000
 * bytes or more ("payload string too long") and aborts the transaction; counted in UTF-16 code
 * units, as before, hints of queue names outside ASCII could pass the bound at up to three times
 * its bytes, and a batch of them failed whole and fell back to one transaction per item.
 */
export const WAKE_PAYLOAD_MAX_BYTES = 7900;

/**
 * One NOTIFY per transaction on {@link WAKE_CHANNEL}, carrying every hint as a JSON array
 * (split only if it would exceed {@link WAKE_PAYLOAD_MAX_BYTES}). Delivered at commit.
 */
export async function notifyWake(tx: Tx, hints: readonly object[]): Promise<void> {
  const chunks: string[][] = [[]];
  let size = 2;
  for (const hint of hints) {
    const text = JSON.stringify(hint);
    const bytes = Buffer.byteLength(text);
    if (size + bytes + 1 > WAKE_PAYLOAD_MAX_BYTES && (chunks.at(-1) as string[]).length > 0) {
      chunks.push([]);
      size = 2;
    }
    (chunks.at(-1) as string[]).push(text);
    size += bytes + 1;
  }
  // Sent together (pipelined, in order), so a caller's writes and these NOTIFYs share one round
  // trip (see the store's `flush`).
  await pipelined(
    chunks
      .filter((chunk) => chunk.length > 0)
      .map((chunk) => tx`select pg_notify(${WAKE_CHANNEL}, ${`[${chunk.join(',')}]`})`),
  );
}
