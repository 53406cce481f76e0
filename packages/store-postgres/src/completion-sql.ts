/**
 * The completion-callback SQL of the store (DESIGN §8), kept beside `hot-sql.ts` for the same
 * review: each statement with its locking choice and the index it relies on.
 *
 * Locks (seed `CompletionStore`): registration and the terminal hook run under the task's row
 * lock, so no subscription can slip in between a task turning terminal and its deliveries
 * becoming due. Leasing and reporting lock only delivery rows, and never lock a task afterwards.
 * Every path that locks both takes the task first (tasks → deliveries), as retention does.
 *
 * The lease and report statements apply the core's `leaseDelivery` and `reportDelivery` set-based
 * in SQL (one statement each, on the sender's hot path); `completion.int.test.ts` checks them
 * against the core functions row by row.
 */
import { COMPLETION_MAX_ATTEMPTS, type Scope, type TerminalTaskState } from '@ledgence/contracts';
import {
  type CompletionLease,
  DELIVERY_LEASE_EXPIRED_ERROR,
  type DeliveryNext,
  type SubscriptionRow,
} from '@ledgence/core';
import { type DbRow, num } from './codec.js';
import type { TaskRef, Tx } from './hot-sql.js';

/** A task that just became terminal, with the time it did (the hook's `now`). */
export interface TerminalTaskRef extends TaskRef {
  terminal_at: number;
}

/**
 * The terminal hook (core `markDue`): the waiting deliveries of tasks that became terminal in
 * this transaction become due at the task's `terminal_at` (the transition's own store time).
 * One statement per transaction, whatever the batch size. Lock: the delivery rows, without a
 * wait in practice — the caller holds each task's row lock (which registration and redelivery
 * also take first), and senders never lock waiting rows. Index: `completion_deliveries_task`
 * (tenant_id, namespace, task_id), one probe per task; `state = 'waiting'` filters the few rows.
 */
export async function markDeliveriesDue(tx: Tx, tasks: readonly TerminalTaskRef[]): Promise<void> {
  await tx`
    update completion_deliveries d set state = 'due', next_attempt_at = v.terminal_at
    from unnest(${tasks.map((t) => t.tenant_id)}::text[], ${tasks.map((t) => t.namespace)}::text[],
                ${tasks.map((t) => t.task_id)}::text[], ${tasks.map((t) => t.terminal_at)}::bigint[])
      as v(tenant_id, namespace, task_id, terminal_at)
    where d.tenant_id = v.tenant_id and d.namespace = v.namespace and d.task_id = v.task_id
      and d.state = 'waiting'`;
}

/**
 * A task's subscriptions with their deliveries, oldest first. No lock of its own: the caller
 * holds the task's row lock, under which every subscription of the task is created.
 * Index: the unique `completion_subscriptions_key` (its prefix is the task), then the
 * deliveries' primary key.
 */
export async function loadSubscriptions(tx: Tx, task: TaskRef): Promise<DbRow[]> {
  return tx`
    select s.*, d.state, d.generation, d.attempts, d.next_attempt_at, d.delivered_at,
      d.finished_at, d.last_status_code, d.last_error
    from completion_subscriptions s
    join completion_deliveries d on d.tenant_id = s.tenant_id and d.namespace = s.namespace
      and d.subscription_id = s.subscription_id
    where s.tenant_id = ${task.tenant_id} and s.namespace = ${task.namespace}
      and s.task_id = ${task.task_id}
    order by s.created_at, s.subscription_id`;
}

/**
 * A task's subscriptions for the list route, from one snapshot: one row with no subscription
 * columns when the task has none, no row at all when there is no such task. Every row carries
 * `store_now`, the database clock read by this same statement (without the store's offset): the
 * time a lost last try is judged at (core `expireLostTry`) must not be read by a later statement,
 * or a report committed in between — within its lease, so the row is `delivered` for good — would
 * be judged by the clock after it against the row from before it, and shown `exhausted`.
 * No locks (a read). Indexes: the tasks primary key, then as {@link loadSubscriptions}.
 */
export async function listSubscriptionRows(tx: Tx, task: TaskRef): Promise<DbRow[]> {
  return tx`
    select clock.store_now, s.*, d.state, d.generation, d.attempts, d.next_attempt_at,
      d.delivered_at, d.finished_at, d.last_status_code, d.last_error
    from (select (extract(epoch from clock_timestamp()) * 1000)::bigint as store_now) as clock,
      tasks t
    left join (
      completion_subscriptions s
      join completion_deliveries d on d.tenant_id = s.tenant_id and d.namespace = s.namespace
        and d.subscription_id = s.subscription_id
    ) on s.tenant_id = t.tenant_id and s.namespace = t.namespace and s.task_id = t.task_id
    where t.tenant_id = ${task.tenant_id} and t.namespace = ${task.namespace}
      and t.task_id = ${task.task_id}
    order by s.created_at, s.subscription_id`;
}

/**
 * A new subscription and its delivery, in one statement. The caller holds the task's row lock,
 * so the key check and the per-task limit it applied cannot race; the unique
 * `completion_subscriptions_key` stays as a backstop.
 */
export async function insertSubscription(tx: Tx, row: SubscriptionRow): Promise<void> {
  await tx`
    with subscription as (
      insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
        subscription_key, destination, event_id, created_at)
      values (${row.tenant_id}, ${row.namespace}, ${row.subscription_id}, ${row.task_id},
        ${row.subscription_key}, ${row.destination}, ${row.event_id}, ${row.created_at})
    )
    insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
      generation, attempts, next_attempt_at, delivered_at, finished_at, last_status_code,
      last_error)
    values (${row.tenant_id}, ${row.namespace}, ${row.subscription_id}, ${row.task_id},
      ${row.state}, ${row.generation}, ${row.attempts}, ${row.next_attempt_at}::bigint,
      ${row.delivered_at}::bigint, ${row.finished_at}::bigint, ${row.last_status_code}::int,
      ${row.last_error}::text)`;
}

/** The task a subscription belongs to, as {@link lockSubscriptionTask} locks it. */
export interface SubscriptionTaskRow {
  tenant_id: string;
  namespace: string;
  task_id: string;
  queue: string;
  state: string;
}

/**
 * Locks the task a subscription belongs to, found through the immutable subscription row:
 * redelivery takes the task lock first (tasks → deliveries, as everywhere). Lock: `FOR UPDATE OF
 * t`, waiting (a terminal task's row is never hot; a queued one's lock makes a claim skip it, so
 * the caller hints its queue). Index: both primary keys.
 */
export async function lockSubscriptionTask(
  tx: Tx,
  scope: Scope,
  subscriptionId: string,
): Promise<SubscriptionTaskRow[]> {
  return tx<SubscriptionTaskRow[]>`
    select t.tenant_id, t.namespace, t.task_id, t.queue, t.state from completion_subscriptions s
    join tasks t on t.tenant_id = s.tenant_id and t.namespace = s.namespace
      and t.task_id = s.task_id
    where s.tenant_id = ${scope.tenant_id} and s.namespace = ${scope.namespace}
      and s.subscription_id = ${subscriptionId}
    for update of t`;
}

/**
 * One subscription with its delivery, the delivery row locked (after its task's, which the
 * caller holds). Lock: `FOR UPDATE OF d`, waiting — a sender's lease or report holds it for one
 * statement at most. Index: both primary keys.
 */
export async function lockSubscription(
  tx: Tx,
  scope: Scope,
  subscriptionId: string,
): Promise<DbRow[]> {
  return tx`
    select s.*, d.state, d.generation, d.attempts, d.next_attempt_at, d.delivered_at,
      d.finished_at, d.last_status_code, d.last_error
    from completion_subscriptions s
    join completion_deliveries d on d.tenant_id = s.tenant_id and d.namespace = s.namespace
      and d.subscription_id = s.subscription_id
    where s.tenant_id = ${scope.tenant_id} and s.namespace = ${scope.namespace}
      and s.subscription_id = ${subscriptionId}
    for update of d`;
}

/** Every mutable column of one delivery (redelivery). The caller holds the row. Index: PK. */
export async function writeDelivery(tx: Tx, row: SubscriptionRow): Promise<void> {
  await tx`
    update completion_deliveries set state = ${row.state}, generation = ${row.generation},
      attempts = ${row.attempts}, next_attempt_at = ${row.next_attempt_at}::bigint,
      delivered_at = ${row.delivered_at}::bigint, finished_at = ${row.finished_at}::bigint,
      last_status_code = ${row.last_status_code}::int, last_error = ${row.last_error}::text
    where tenant_id = ${row.tenant_id} and namespace = ${row.namespace}
      and subscription_id = ${row.subscription_id}`;
}

/** Which deliveries a sender may lease (the `only` of `CompletionStore.leaseDeliveries`). */
export interface DeliveryLeaseFilter {
  /** The sender's aliases: their deliveries are leased as soon as they are leasable. */
  destinations: readonly string[];
  /** How long a delivery to any other alias must have been leasable first. */
  otherDestinationsAfterMs: number;
}

/**
 * Leases up to `limit` leasable deliveries (core `deliveryLeasable` + `leaseDelivery`), oldest
 * first, in ONE statement, and returns the leases that start a try with their terminal task's
 * facts. A delivering row whose sender's lease ran out after the generation's last try becomes
 * `exhausted` instead (it uses up its place in the batch and is not returned).
 *
 * With `only`, a row to an alias outside `only.destinations` is leasable once it has been for
 * `only.otherDestinationsAfterMs` (its `next_attempt_at` that long ago), and a lost last try
 * always is (exhausting it sends nothing). Without it, every leasable row is: the same SQL with
 * a wait of 0, whose first OR branch then always holds, so the subscription probe never runs.
 *
 * Lock: `FOR UPDATE OF d SKIP LOCKED` on delivery rows only — concurrent senders (every replica
 * runs one) take disjoint rows and never wait. The CASEs and the alias filter read the locked
 * row's current version (a row that changed since the snapshot is rechecked). The alias is
 * read from the immutable subscription row without locking it; the task facts come from a plain
 * join afterwards: no task lock (seed `CompletionStore`), and they are immutable once the task
 * is terminal. A due delivery's task always exists (retention never removes a task with an
 * unfinished delivery), so the inner join drops nothing.
 * Index: the partial `completion_deliveries_lease` (next_attempt_at, subscription_id) WHERE
 * state IN ('due', 'delivering'), walked in order and stopped by LIMIT; the alias filter probes
 * the subscriptions' primary key only for rows leasable for less than the wait (rows older than
 * it pass on the first OR branch), so the walk passes over at most the other aliases' rows that
 * fell due within the wait — rows the replicas that have those aliases normally lease as they
 * fall due (only their backlog within the wait is walked again on each call).
 * Then the primary keys of deliveries, subscriptions and tasks.
 */
export async function leaseDeliveryRows(
  tx: Tx,
  clockOffsetMs: number,
  limit: number,
  leaseMs: number,
  only?: DeliveryLeaseFilter,
): Promise<CompletionLease[]> {
  const destinations = only?.destinations ?? [];
  const otherAfterMs = only?.otherDestinationsAfterMs ?? 0;
  const rows = await tx`
    with clock as materialized (
      select (extract(epoch from clock_timestamp()) * 1000)::bigint + ${clockOffsetMs}::bigint as now
    ), picked as (
      -- lost: a sender's lease ran out after the generation's last try (computed from the
      -- locked version: LockRows re-projects a row that changed after the snapshot).
      select d.tenant_id, d.namespace, d.subscription_id,
        d.state = 'delivering' and d.attempts >= ${COMPLETION_MAX_ATTEMPTS}::int as lost
      from completion_deliveries d
      where d.state in ('due', 'delivering') and d.next_attempt_at <= (select now from clock)
        and (d.next_attempt_at <= (select now from clock) - ${otherAfterMs}::bigint
          or (d.state = 'delivering' and d.attempts >= ${COMPLETION_MAX_ATTEMPTS}::int)
          -- A scalar subquery, not EXISTS: the planner turns EXISTS into a hashed subplan,
          -- a sequential scan of all subscriptions on every call (seen in EXPLAIN).
          or (select s.destination from completion_subscriptions s
              where s.tenant_id = d.tenant_id and s.namespace = d.namespace
                and s.subscription_id = d.subscription_id)
            = any(${destinations as string[]}::text[]))
      order by d.next_attempt_at, d.subscription_id
      limit ${limit}
      for update of d skip locked
    ), leased as (
      update completion_deliveries d set
        state = case when p.lost then 'exhausted' else 'delivering' end,
        attempts = case when p.lost then d.attempts else d.attempts + 1 end,
        next_attempt_at = case when p.lost then null else c.now + ${leaseMs}::bigint end,
        finished_at = case when p.lost then c.now else d.finished_at end,
        -- The lost try got no answer: an earlier try's status would misdescribe it.
        last_status_code = case when p.lost then null else d.last_status_code end,
        last_error = case when p.lost then ${DELIVERY_LEASE_EXPIRED_ERROR}::text else d.last_error end
      from picked p, clock c
      where d.tenant_id = p.tenant_id and d.namespace = p.namespace
        and d.subscription_id = p.subscription_id
      returning d.tenant_id, d.namespace, d.subscription_id, d.task_id, d.state, d.generation,
        d.attempts, d.next_attempt_at
    )
    select l.*, s.destination, s.event_id, t.queue, t.run_id, t.state as task_state,
      t.terminal_at
    from leased l
    join completion_subscriptions s on s.tenant_id = l.tenant_id and s.namespace = l.namespace
      and s.subscription_id = l.subscription_id
    join tasks t on t.tenant_id = l.tenant_id and t.namespace = l.namespace
      and t.task_id = l.task_id
    where l.state = 'delivering'
    order by l.next_attempt_at, l.subscription_id`;
  return rows.map((row) => ({
    scope: { tenant_id: String(row.tenant_id), namespace: String(row.namespace) },
    subscription_id: String(row.subscription_id),
    task_id: String(row.task_id),
    destination: String(row.destination),
    event_id: String(row.event_id),
    generation: num(row.generation),
    attempt: num(row.attempts),
    lease_expires_at: num(row.next_attempt_at),
    queue: String(row.queue),
    run_id: String(row.run_id),
    state: row.task_state as TerminalTaskState,
    terminal_at: num(row.terminal_at),
  }));
}

/** One try's outcome as the report statement takes it. */
export interface DeliveryOutcome {
  scope: Scope;
  subscription_id: string;
  generation: number;
  attempt: number;
  next: DeliveryNext;
  status_code: number | null;
  error: string | null;
}

/**
 * Records tries' outcomes (core `reportDelivery`, row by row) in ONE statement, each fenced: it
 * changes its row only while it is `delivering` the reported generation's try `attempt`, so a
 * stale report (the lease ran out and another sender took the row, or a redelivery moved on)
 * matches nothing. A `due` report of the generation's last try exhausts the delivery instead (no
 * try beyond COMPLETION_MAX_ATTEMPTS), and a report of the last try after its lease ended is
 * stale (the views have shown it exhausted since: core `expireLostTry`). Answers, report by
 * report, whether its row changed.
 *
 * One statement for many because a sender's tries often end together — above all at shutdown,
 * when a whole window is aborted at once and must be reported within what is left of the budget
 * (one transaction each did not fit on a loaded machine: server-lifecycle.e2e).
 *
 * Lock: the delivery rows, by the UPDATE itself; it waits only for another sender's statement on
 * the same row, which exists only once a lease ran out and another sender took the row. Two such
 * statements locking two rows in opposite orders would deadlock; PostgreSQL aborts one, whose
 * reports are then retried within their leases (the sender's rule for any failed report). No
 * task lock. Index: the deliveries' primary key, one probe per report — or, when the statistics
 * say few rows are leased, one walk of the partial `completion_deliveries_lease` (the planner's
 * choice; either way no sequential scan: explain.int.test.ts).
 */
export async function reportDeliveryRows(
  tx: Tx,
  clockOffsetMs: number,
  outcomes: readonly DeliveryOutcome[],
): Promise<boolean[]> {
  const column = <T>(pick: (outcome: DeliveryOutcome) => T): T[] => outcomes.map(pick);
  const rows = await tx`
    with clock as (
      select (extract(epoch from clock_timestamp()) * 1000)::bigint + ${clockOffsetMs}::bigint as now
    ), decided as (
      select r.*, clock.now,
        case when r.next_state = 'due' and r.attempt >= ${COMPLETION_MAX_ATTEMPTS}::int
          then 'exhausted' else r.next_state end as state
      from unnest(
        ${column((o) => o.scope.tenant_id)}::text[], ${column((o) => o.scope.namespace)}::text[],
        ${column((o) => o.subscription_id)}::text[], ${column((o) => o.generation)}::int[],
        ${column((o) => o.attempt)}::int[], ${column((o) => o.next.state)}::text[],
        ${column((o) => (o.next.state === 'due' ? Math.max(0, o.next.delay_ms) : 0))}::bigint[],
        ${column((o) => o.status_code)}::int[], ${column((o) => o.error)}::text[]
      ) with ordinality as r(tenant_id, namespace, subscription_id, generation, attempt,
          next_state, delay_ms, status_code, error, ord)
      cross join clock
    )
    update completion_deliveries d set
      state = x.state,
      next_attempt_at = case when x.state = 'due' then x.now + x.delay_ms end,
      delivered_at = case when x.state = 'delivered' then x.now else d.delivered_at end,
      finished_at = case when x.state = 'due' then d.finished_at else x.now end,
      last_status_code = x.status_code,
      last_error = x.error
    from decided x
    where d.tenant_id = x.tenant_id and d.namespace = x.namespace
      and d.subscription_id = x.subscription_id and d.state = 'delivering'
      and d.generation = x.generation and d.attempts = x.attempt
      and (d.attempts < ${COMPLETION_MAX_ATTEMPTS}::int or d.next_attempt_at > x.now)
    returning x.ord`;
  const changed = outcomes.map(() => false);
  for (const row of rows) changed[num(row.ord) - 1] = true;
  return changed;
}

/**
 * Deliveries due now and not leased, counted up to `limit` (the LIMIT inside the subquery stops
 * the walk, so a huge backlog costs no more than `limit` index entries). No locks (a metrics
 * read). Index: the partial `completion_deliveries_lease`, range `next_attempt_at <= now`, with
 * the state as a filter. A `delivering` row past its lease (a sender gone mid-try) is due again,
 * as {@link leaseDeliveryRows} takes it at once, unless it was the last try (that lease records
 * it exhausted, never posts it).
 */
export async function countDueBacklog(
  tx: Tx,
  clockOffsetMs: number,
  limit: number,
): Promise<number> {
  const [row] = await tx`
    select count(*)::int as n from (
      select 1 from completion_deliveries d
      where (d.state = 'due'
          or (d.state = 'delivering' and d.attempts < ${COMPLETION_MAX_ATTEMPTS}::int))
        and d.next_attempt_at <= (
          select (extract(epoch from clock_timestamp()) * 1000)::bigint + ${clockOffsetMs}::bigint)
      limit ${limit}
    ) as due`;
  return num(row?.n);
}
