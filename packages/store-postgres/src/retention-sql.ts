/**
 * The retention SQL of the store (seed `RetentionPolicy`, `RetentionProgress`), kept beside
 * `hot-sql.ts` for the same review: each statement with its locking choice and the index it
 * relies on.
 *
 * Retention shares tables with the hot path, so it must never queue behind a hot row: it locks
 * tasks with `SKIP LOCKED` (a task another transaction holds is simply left for a later pass),
 * locks tasks before their deliveries (the order every other path uses), and runs under a short
 * transaction-local `lock_timeout` as a second guard. The retirement rule is core
 * `retired(task, subscriptions, cutoff)`: terminal before the cutoff, and no subscription
 * protects it (`subscriptionProtects`: unfinished, or finished at or after the cutoff).
 *
 * Scope columns are compared `COLLATE "C"`, matching the `tasks_retention` index, so the walk
 * over namespaces is in byte order whatever the database's default collation.
 */
import type { Scope } from '@ledgence/contracts';
import type { RetentionPolicyRow } from '@ledgence/core';
import { type DbRow, num } from './codec.js';
import type { Tx } from './hot-sql.js';

/** Store time and the namespace's own policy row (absent: the default applies). */
export interface PolicyAt {
  now: number;
  policy: RetentionPolicyRow | undefined;
  /** The namespace's retiring floor (core `retiringFloor`); `null` before any policy was set. */
  retiringBefore: number | null;
}

/**
 * Store time and the namespace's policy row, in one round trip. `lockTimeoutMs`, when given,
 * also sets this transaction's `lock_timeout` (`set_config(…, true)` is `SET LOCAL`), so a
 * collection fails fast rather than queue behind a hot row it did not expect to meet.
 * No row lock (a policy change between passes only moves the next pass's cutoff).
 * Index: the `retention_policies` primary key.
 */
export async function loadPolicyAt(
  tx: Tx,
  scope: Scope,
  clockOffsetMs: number,
  lockTimeoutMs?: number,
): Promise<PolicyAt> {
  const timeout = lockTimeoutMs === undefined ? null : `${lockTimeoutMs}ms`;
  const [row] = await tx`
    select (extract(epoch from clock_timestamp()) * 1000)::bigint + ${clockOffsetMs}::bigint as now,
      p.retention_ms, p.updated_at, p.retiring_before,
      case when ${timeout}::text is not null
        then set_config('lock_timeout', ${timeout}::text, true) end as lock_timeout
    from (select 1) as one
    left join retention_policies p on p.tenant_id = ${scope.tenant_id}
      and p.namespace = ${scope.namespace}`;
  return {
    now: num(row?.now),
    policy: row?.retention_ms == null ? undefined : policyRow(scope, row),
    retiringBefore: row?.retiring_before == null ? null : num(row.retiring_before),
  };
}

function policyRow(scope: Scope, row: DbRow): RetentionPolicyRow {
  return {
    tenant_id: scope.tenant_id,
    namespace: scope.namespace,
    retention_ms: num(row.retention_ms),
    updated_at: num(row.updated_at),
  };
}

/**
 * Sets a namespace's policy (upsert) at store time `now`, with the retiring floor the caller
 * derived from the policy it replaces (core `retiringFloor`); returns the stored row, whose
 * `updated_at` stays the stored one when the policy is the one already set.
 * Lock: the policy row (concurrent setters serialise; last writer wins; the floor only rises,
 * so a setter that raced past another's insert cannot lower it). Index: primary key.
 */
export async function upsertPolicy(
  tx: Tx,
  scope: Scope,
  retentionMs: number,
  now: number,
  retiringBefore: number,
): Promise<RetentionPolicyRow> {
  const [row] = await tx`
    insert into retention_policies as p (tenant_id, namespace, retention_ms, updated_at,
      retiring_before)
    values (${scope.tenant_id}, ${scope.namespace}, ${retentionMs}::bigint, ${now}::bigint,
      ${retiringBefore}::bigint)
    on conflict (tenant_id, namespace) do update
      set retention_ms = excluded.retention_ms,
        -- The same policy again is the same answer (DESIGN §1.3): its time is when it was set.
        updated_at = case when p.retention_ms = excluded.retention_ms then p.updated_at
          else excluded.updated_at end,
        retiring_before = greatest(p.retiring_before, excluded.retiring_before)
    returning retention_ms, updated_at`;
  return policyRow(scope, row ?? {});
}

/**
 * Age candidates of a namespace (terminal before `cutoff`), counted up to `limit` (the caller
 * asks one more than it reports, to answer `truncated`), with the oldest terminal time.
 * No locks (a read). Index: `tasks_retention` (tenant C, namespace C, terminal_at, task_id)
 * WHERE terminal_at IS NOT NULL, range `terminal_at < cutoff`, stopped by the inner LIMIT.
 */
export async function countCandidates(
  tx: Tx,
  scope: Scope,
  cutoff: number,
  limit: number,
): Promise<{ count: number; oldest: number | null }> {
  const [row] = await tx`
    select count(*)::int as n, min(terminal_at) as oldest from (
      select t.terminal_at from tasks t
      where t.tenant_id collate "C" = ${scope.tenant_id} and t.namespace collate "C" = ${scope.namespace}
        and t.terminal_at is not null and t.terminal_at < ${cutoff}::bigint
      order by t.terminal_at, t.task_id
      limit ${limit}
    ) as candidates`;
  return { count: num(row?.n), oldest: row?.oldest == null ? null : num(row.oldest) };
}

/**
 * Namespaces holding terminal tasks or worker sessions that expired before `expiredBefore`, in
 * (tenant, namespace) byte order after `after` (exclusive), at most `limit`: over
 * {@link retentionWalk}, each walked namespace kept when the oldest of its terminal tasks or of
 * its sessions (one descent of `tasks_retention`, one of `worker_sessions_retention`) qualifies.
 * Each probe is a scalar subquery for the oldest row ({@link oldestTerminal}).
 * Sessions count: a namespace whose tasks are all gone (or never ended) still collects its
 * expired sessions. No locks (a read).
 */
export async function selectRetentionScopes(
  tx: Tx,
  after: Scope | undefined,
  limit: number,
  expiredBefore: number,
): Promise<Scope[]> {
  const rows = await tx`
    ${retentionWalk(tx, after)}
    select w.tenant_id, w.namespace from walk w
    where (${oldestTerminal(tx)}) is not null
      or (${oldestSession(tx)}) < ${expiredBefore}::bigint
    limit ${limit}`;
  return rows.map((row) => ({
    tenant_id: String(row.tenant_id),
    namespace: String(row.namespace),
  }));
}

/**
 * The namespaces of the retention walk that have something to collect at store time `now`: a
 * terminal task older than the namespace's cutoff, or a worker session that expired before it —
 * the cutoff being core `retentionCutoff`, `greatest(now − retention_ms, retiring_before)` with
 * the namespace's policy row or `defaultRetentionMs`, as `collectRetired` computes it (so the
 * retiring floor of a lengthened policy still makes its namespace due). The walk goes on past
 * namespaces with nothing due within this one statement, until `limit` due ones are found or the
 * walk ends: a round over thousands of namespaces of young terminal tasks is one read, not a
 * collection transaction per namespace. Each walked namespace costs the walk's step, a probe of
 * the `retention_policies` primary key and one descent of `tasks_retention` and of
 * `worker_sessions_retention` (their oldest row compared with the cutoff). Subscriptions are not
 * consulted: a namespace whose only candidates are protected is still listed, and its
 * collection decides. No locks (a read).
 */
export async function selectDueRetentionScopes(
  tx: Tx,
  after: Scope | undefined,
  limit: number,
  now: number,
  defaultRetentionMs: number,
): Promise<Scope[]> {
  const rows = await tx`
    ${retentionWalk(tx, after)}
    select w.tenant_id, w.namespace from walk w
    cross join lateral (
      select greatest(${now}::bigint - coalesce(p.retention_ms, ${defaultRetentionMs}::bigint),
        p.retiring_before) as cutoff
      from (select 1) as one
      left join retention_policies p on p.tenant_id = w.tenant_id collate "default"
        and p.namespace = w.namespace collate "default"
    ) as c
    where (${oldestTerminal(tx)}) < c.cutoff or (${oldestSession(tx)}) < c.cutoff
    limit ${limit}`;
  return rows.map((row) => ({
    tenant_id: String(row.tenant_id),
    namespace: String(row.namespace),
  }));
}

/**
 * The oldest terminal time of the walked namespace `w`: one descent of `tasks_retention`. A
 * scalar subquery ordered by the index's third column, not an EXISTS: PostgreSQL drops an
 * EXISTS's ORDER BY and LIMIT, and plans a namespace of mostly terminal tasks as a sequential
 * scan of tasks expected to stop early.
 */
function oldestTerminal(tx: Tx) {
  return tx`
    select t.terminal_at from tasks t
    where t.tenant_id collate "C" = w.tenant_id and t.namespace collate "C" = w.namespace
      and t.terminal_at is not null
    order by t.terminal_at
    limit 1`;
}

/** The earliest session expiry of the walked namespace `w`: one descent of `worker_sessions_retention`. */
function oldestSession(tx: Tx) {
  return tx`
    select s.expires_at from worker_sessions s
    where s.tenant_id collate "C" = w.tenant_id and s.namespace collate "C" = w.namespace
    order by s.expires_at
    limit 1`;
}

/**
 * The retention walk, a `with recursive walk(tenant_id, namespace)` clause for a select to
 * filter: every namespace holding a terminal task or a worker session, in (tenant, namespace)
 * byte order after `after` (exclusive) — a loose index scan, a recursive CTE whose every step is
 * one descent of `tasks_retention` and one of `worker_sessions_retention` to the next distinct
 * (tenant, namespace), the lesser of the two taken — so its cost is one step per namespace
 * walked, not the number of rows. The session step names no expiry bound: a bound on
 * `expires_at` (the index's third column) is no part of the descent, so each step would read
 * every later namespace's live sessions until an expired one — quadratic in namespaces and
 * sessions. A select evaluates the walk lazily, so a `limit` on it ends the walk. Without
 * `after`, the walk starts past ('', ''), below every valid scope (scope text is never empty).
 */
function retentionWalk(tx: Tx, after: Scope | undefined) {
  return tx`
    with recursive walk(tenant_id, namespace) as (
      (select n.tenant_id, n.namespace from (
        select ${after?.tenant_id ?? ''}::text collate "C" as tenant_id,
          ${after?.namespace ?? ''}::text collate "C" as namespace) as w
       cross join lateral (${nextRetentionScope(tx)}) as n)
      union all
      (select n.tenant_id, n.namespace from walk w
       cross join lateral (${nextRetentionScope(tx)}) as n)
    )`;
}

/** One step of {@link retentionWalk}: the next scope after `w`'s, from either index. */
function nextRetentionScope(tx: Tx) {
  return tx`
    select c.tenant_id, c.namespace from (
      (select t.tenant_id collate "C" as tenant_id, t.namespace collate "C" as namespace
       from tasks t
       where t.terminal_at is not null
         and (t.tenant_id collate "C", t.namespace collate "C") > (w.tenant_id, w.namespace)
       order by 1, 2
       limit 1)
      union all
      (select s.tenant_id collate "C", s.namespace collate "C"
       from worker_sessions s
       where (s.tenant_id collate "C", s.namespace collate "C") > (w.tenant_id, w.namespace)
       order by 1, 2
       limit 1)
    ) as c
    order by 1, 2
    limit 1`;
}

/** Exact counts of one collection statement. */
export interface CollectedCounts {
  tasks: number;
  attempts: number;
  history: number;
  subscriptions: number;
  sessions: number;
  /** Concurrency-key rows of the removed tasks' keys that no task held any more. */
  keys: number;
}

/**
 * The protection check of a retired task `t` at `cutoff` (core `subscriptionProtects`): no
 * delivery unfinished, or finished at or after the cutoff. `NOT EXISTS (… OFFSET 0)`: the OFFSET
 * keeps the planner from turning it into an anti join, which would read every candidate (and
 * every unfinished delivery) and sort them before the LIMIT; as a per-row check it probes
 * `completion_deliveries_task` only for the rows the walk reaches.
 */
function unprotected(tx: Tx, cutoff: number) {
  return tx`not exists (
    select 1 from completion_deliveries d
    -- "default": tasks.task_id is "C", which would win the comparison and miss the index.
    where d.tenant_id = t.tenant_id and d.namespace = t.namespace
      and d.task_id = t.task_id collate "default"
      and (d.state not in ('delivered', 'exhausted') or d.finished_at is null
        or d.finished_at >= ${cutoff}::bigint)
    offset 0)`;
}

/**
 * The first statement of a namespace's collection: locks up to `limit` retired tasks — terminal
 * before `cutoff`, oldest first, unprotected as far as this statement's snapshot shows — and
 * returns their ids. Lock: `FOR UPDATE OF t SKIP LOCKED` — a task another transaction holds is
 * skipped, never waited for. Index: `tasks_retention`, walked in order from the oldest and
 * stopped by LIMIT.
 *
 * The protection seen here is only a pre-filter: the snapshot is taken before the locks are
 * granted, and a subscribe or redelivery (which lock the task but do not update it, so nothing
 * re-checks the row) may commit in between. {@link collectRetiredRows}, a later statement with
 * a later snapshot, decides.
 */
export async function lockRetiredTasks(
  tx: Tx,
  scope: Scope,
  cutoff: number,
  limit: number,
): Promise<string[]> {
  const rows = await tx`
    select t.task_id from tasks t
    where t.tenant_id collate "C" = ${scope.tenant_id} and t.namespace collate "C" = ${scope.namespace}
      and t.terminal_at is not null and t.terminal_at < ${cutoff}::bigint
      and ${unprotected(tx, cutoff)}
    order by t.terminal_at, t.task_id
    limit ${limit}
    for update of t skip locked`;
  return rows.map((row) => String(row.task_id));
}

/**
 * The second statement of a namespace's collection, in ONE statement of data-modifying CTEs
 * (they share one snapshot, taken after {@link lockRetiredTasks} holds its locks; every delete
 * names the victims it removes):
 *
 * - `victims`: the locked tasks still unprotected at `cutoff`. Every writer of a subscription or
 *   delivery takes the task lock first, so what this snapshot shows is final until commit: a
 *   subscribe or redelivery that committed before the lock is seen here and keeps its task.
 *   Index: the tasks primary key, one probe per id.
 * - their attempts, history, payloads, deliveries and subscriptions, then the tasks, each by
 *   `task_id = ANY(<the victims' ids>)` within the scope: an index scan of each table's
 *   primary key or task index (the primary keys of attempts, task_history and task_payloads,
 *   `completion_deliveries_task`, `completion_subscriptions_key`) — a join on the CTE would
 *   let the planner hash-join against a sequential scan of the whole table. Lock: rows of
 *   tasks this transaction holds; every writer of them takes the task lock first, and a
 *   finished delivery is never locked by a sender (it leases only due/delivering rows).
 * - `idle_keys`: the victims' concurrency keys that no task holds (`active = 0`), `FOR UPDATE
 *   SKIP LOCKED` — a key a claim or settle holds is left for a later collection, never waited
 *   for — and deleted, so a namespace's key rows stay as many as its keys still in use (one
 *   key per user or entity would otherwise grow the table for ever). A queued task of a deleted
 *   key is unaffected: a claim's upsert creates the row again (`takeConcurrencySlot`, and
 *   `takeConcurrencySlotNoWait` for a key that is absent), and the claim select reads a missing
 *   row as a free key. Index: the concurrency_keys primary key.
 * - `expired`: up to `limit` sessions of the namespace that expired before `cutoff`, oldest
 *   first, `FOR UPDATE SKIP LOCKED`, with their consumer cursors. Index:
 *   `worker_sessions_retention`, then the consumer_cursors primary key.
 */
export async function collectRetiredRows(
  tx: Tx,
  scope: Scope,
  cutoff: number,
  locked: readonly string[],
  limit: number,
): Promise<CollectedCounts> {
  const { tenant_id: tenant, namespace } = scope;
  const [row] = await tx`
    with victims as (
      select t.task_id, t.concurrency_key from tasks t
      where t.tenant_id = ${tenant} and t.namespace = ${namespace}
        and t.task_id = any(${locked as string[]}::text[])
        and ${unprotected(tx, cutoff)}
    ), ids as (
      -- Default collation, the collation of every task_id index but the tasks primary key's
      -- (where the column's own "C" wins the comparison).
      select coalesce(array_agg(task_id collate "default"), '{}') as task_ids from victims
    ), attempts_gone as (
      delete from attempts a
      where a.tenant_id = ${tenant} and a.namespace = ${namespace}
        and a.task_id = any((select task_ids from ids)::text[])
      returning 1
    ), history_gone as (
      delete from task_history h
      where h.tenant_id = ${tenant} and h.namespace = ${namespace}
        and h.task_id = any((select task_ids from ids)::text[])
      returning 1
    ), payloads_gone as (
      delete from task_payloads p
      where p.tenant_id = ${tenant} and p.namespace = ${namespace}
        and p.task_id = any((select task_ids from ids)::text[])
      returning 1
    ), deliveries_gone as (
      delete from completion_deliveries d
      where d.tenant_id = ${tenant} and d.namespace = ${namespace}
        and d.task_id = any((select task_ids from ids)::text[])
      returning 1
    ), subscriptions_gone as (
      delete from completion_subscriptions s
      where s.tenant_id = ${tenant} and s.namespace = ${namespace}
        and s.task_id = any((select task_ids from ids)::text[])
      returning 1
    ), tasks_gone as (
      delete from tasks t
      where t.tenant_id = ${tenant} and t.namespace = ${namespace}
        and t.task_id = any((select task_ids from ids)::text[])
      returning 1
    ), idle_keys as (
      select k.concurrency_key from concurrency_keys k
      where k.tenant_id = ${tenant} and k.namespace = ${namespace}
        and k.concurrency_key = any((select coalesce(array_agg(distinct v.concurrency_key), '{}')
          from victims v where v.concurrency_key is not null)::text[])
        and k.active = 0
      for update of k skip locked
    ), keys_gone as (
      delete from concurrency_keys k
      where k.tenant_id = ${tenant} and k.namespace = ${namespace}
        and k.concurrency_key = any((select coalesce(array_agg(concurrency_key), '{}')
          from idle_keys)::text[])
      returning 1
    ), expired as (
      select coalesce(array_agg(session_id), '{}') as session_ids from (
        select w.session_id from worker_sessions w
        where w.tenant_id collate "C" = ${tenant} and w.namespace collate "C" = ${namespace}
          and w.expires_at < ${cutoff}::bigint
        order by w.expires_at
        limit ${limit}
        for update of w skip locked
      ) as locked
    ), cursors_gone as (
      delete from consumer_cursors c
      where c.tenant_id = ${tenant} and c.namespace = ${namespace}
        and c.worker_session_id = any((select session_ids from expired)::text[])
      returning 1
    ), sessions_gone as (
      delete from worker_sessions w
      where w.tenant_id = ${tenant} and w.namespace = ${namespace}
        and w.session_id = any((select session_ids from expired)::text[])
      returning 1
    )
    select (select count(*) from tasks_gone)::int as tasks,
      (select count(*) from attempts_gone)::int as attempts,
      (select count(*) from history_gone)::int as history,
      (select count(*) from payloads_gone)::int as payloads,
      (select count(*) from deliveries_gone)::int as deliveries,
      (select count(*) from subscriptions_gone)::int as subscriptions,
      (select count(*) from sessions_gone)::int as sessions,
      (select count(*) from cursors_gone)::int as cursors,
      (select count(*) from keys_gone)::int as keys`;
  const counts = row as DbRow | undefined;
  return {
    tasks: num(counts?.tasks),
    attempts: num(counts?.attempts),
    history: num(counts?.history),
    subscriptions: num(counts?.subscriptions),
    sessions: num(counts?.sessions),
    keys: num(counts?.keys),
  };
}
