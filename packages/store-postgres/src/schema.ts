/**
 * The Drizzle schema of the Ledgence store (DESIGN §7). drizzle-kit generates the committed
 * migrations in `drizzle/` from this file; what Drizzle cannot express (the `C` collation of
 * task ids, fillfactor and per-table autovacuum settings) is hand-added to the generated SQL.
 *
 * Every table carries `tenant_id, namespace` first in its primary key, and every query the store
 * issues is scoped by both. Timestamps are UTC milliseconds from store time (`bigint`, read as a
 * JS number: every value is below 2^53). Structured fields are `jsonb`; fields that may carry
 * application JSON (`data`, `output`, settlements, outcomes) are `json`, because `jsonb` rejects
 * the `\u0000` escape that valid application JSON may contain (a request must never fail on
 * content alone) and `json` keeps the submitted bytes as they were.
 */
import { sql } from 'drizzle-orm';
import {
  bigint,
  boolean,
  index,
  integer,
  json,
  jsonb,
  pgTable,
  primaryKey,
  text,
  uniqueIndex,
} from 'drizzle-orm/pg-core';

const ms = (name: string) => bigint(name, { mode: 'number' });

/**
 * One task's scheduling record: the hot row claim, renew and settle lock and update. Application
 * data lives in {@link taskPayloads}, so these rows stay narrow and are never rewritten with it.
 */
export const tasks = pgTable(
  'tasks',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    /** `COLLATE "C"` (hand-added): ties order by UTF-8 bytes, as task cursors promise. */
    task_id: text('task_id').notNull(),
    run_id: text('run_id').notNull(),
    idempotency_key: text('idempotency_key').notNull(),
    /** Null since migration 0002: a replay compares the command rebuilt from the row. */
    command_digest: text('command_digest'),
    /** The accepted `SubmitTask` without `data` (which is in `task_payloads`). */
    input: jsonb('input').notNull(),
    origin_trace: jsonb('origin_trace'),
    queue: text('queue').notNull(),
    program: jsonb('program').notNull(),
    retry: jsonb('retry').notNull(),
    timeout_ms: ms('timeout_ms').notNull(),
    priority: integer('priority').notNull(),
    concurrency_key: text('concurrency_key'),
    concurrency_limit: integer('concurrency_limit'),
    labels: jsonb('labels').notNull(),
    state: text('state').notNull(),
    submitted_at: ms('submitted_at').notNull(),
    available_at: ms('available_at').notNull(),
    terminal_at: ms('terminal_at'),
    attempt_count: integer('attempt_count').notNull(),
    dispatch_count: integer('dispatch_count').notNull(),
    current_attempt_id: text('current_attempt_id'),
    cancel_requested_at: ms('cancel_requested_at'),
    /** The terminal outcome; a success's `output` is kept in `task_payloads.output`. */
    outcome: json('outcome'),
    history_sequence: integer('history_sequence').notNull(),
    /** Reserved for workflows (DESIGN §9); the listing filter already matches on it. */
    workflow_id: text('workflow_id'),
  },
  (t) => [
    primaryKey({ columns: [t.tenant_id, t.namespace, t.task_id] }),
    uniqueIndex('tasks_idempotency_key').on(t.tenant_id, t.namespace, t.idempotency_key),
    // DESIGN §7: ready work only. The acquisition select walks it in claim order.
    index('tasks_acquire')
      .on(t.tenant_id, t.namespace, t.queue, t.priority.desc(), t.available_at, t.task_id)
      .where(sql`state = 'queued'`),
    // Keyset listing in (submitted_at desc, task_id desc) order.
    index('tasks_listing').on(t.tenant_id, t.namespace, t.submitted_at.desc(), t.task_id.desc()),
    // Retention (seed `RetentionPolicy`): terminal tasks only, oldest first per namespace (ties
    // by task id), and the namespaces' walk in byte order (a loose index scan), hence the `C`
    // collation of its scope columns whatever the database's default. `terminal_at` is written
    // once, by the terminal transition, which rewrites `state` (already indexed through
    // `tasks_acquire`'s predicate) anyway: updates that were HOT stay HOT.
    index('tasks_retention')
      .on(sql`"tenant_id" collate "C"`, sql`"namespace" collate "C"`, t.terminal_at, t.task_id)
      .where(sql`terminal_at is not null`),
  ],
);

/** Application JSON off the hot row: written at submit (`data`) and at success (`output`). */
export const taskPayloads = pgTable(
  'task_payloads',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    task_id: text('task_id').notNull(),
    data: json('data').notNull(),
    output: json('output'),
  },
  (t) => [primaryKey({ columns: [t.tenant_id, t.namespace, t.task_id] })],
);

/**
 * Attempts and their leases. Renewals update `lease_expires_at`, `renew_sequence`,
 * `last_renewal` and `dispatch_allowed`, none of which is indexed, so they are HOT updates.
 */
export const attempts = pgTable(
  'attempts',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    task_id: text('task_id').notNull(),
    attempt_id: text('attempt_id').notNull(),
    ordinal: integer('ordinal').notNull(),
    lease_id: text('lease_id').notNull(),
    generation: integer('generation').notNull(),
    worker_session_id: text('worker_session_id').notNull(),
    consumer_id: integer('consumer_id').notNull(),
    state: text('state').notNull(),
    claimed_at: ms('claimed_at').notNull(),
    deadline: ms('deadline').notNull(),
    authority_deadline: ms('authority_deadline').notNull(),
    lease_expires_at: ms('lease_expires_at').notNull(),
    renew_sequence: ms('renew_sequence').notNull(),
    last_renewal: jsonb('last_renewal'),
    dispatch_allowed: boolean('dispatch_allowed').notNull(),
    quiescence: text('quiescence').notNull(),
    settlement: json('settlement'),
    settlement_digest: text('settlement_digest'),
    pending: json('pending'),
    finished_at: ms('finished_at'),
  },
  (t) => [
    primaryKey({ columns: [t.tenant_id, t.namespace, t.task_id, t.attempt_id] }),
    // Recovery scans active attempts only. The key is the immutable authority deadline, not
    // `lease_expires_at`: indexing the column every renewal rewrites would end HOT updates, and
    // the active set is small (bounded by worker slots), so filtering it on the lease is cheap.
    index('attempts_active').on(t.authority_deadline).where(sql`state = 'active'`),
  ],
);

/** Worker sessions: one queue, `concurrency` consumer slots, a validity. */
export const workerSessions = pgTable(
  'worker_sessions',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    session_id: text('session_id').notNull(),
    queue: text('queue').notNull(),
    concurrency: integer('concurrency').notNull(),
    created_at: ms('created_at').notNull(),
    expires_at: ms('expires_at').notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.tenant_id, t.namespace, t.session_id] }),
    // Retention's walk over namespaces (a loose index scan in byte order, as `tasks_retention`)
    // must reach a namespace whose only garbage is expired sessions, and collects them oldest
    // first. A session's expiry moves when it is extended, but sessions are few and small.
    index('worker_sessions_retention').on(
      sql`"tenant_id" collate "C"`,
      sql`"namespace" collate "C"`,
      t.expires_at,
    ),
  ],
);

/** The replay state of each consumer slot: its last completed poll. */
export const consumerCursors = pgTable(
  'consumer_cursors',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    worker_session_id: text('worker_session_id').notNull(),
    consumer_id: integer('consumer_id').notNull(),
    sequence: ms('sequence').notNull(),
    command: jsonb('command').notNull(),
    assignment: jsonb('assignment'),
  },
  (t) => [primaryKey({ columns: [t.tenant_id, t.namespace, t.worker_session_id, t.consumer_id] })],
);

/** Per-task history, numbered gaplessly under the task's row lock. */
export const taskHistory = pgTable(
  'task_history',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    task_id: text('task_id').notNull(),
    sequence: integer('sequence').notNull(),
    attempt_id: text('attempt_id'),
    at: ms('at').notNull(),
    reason: text('reason').notNull(),
  },
  (t) => [primaryKey({ columns: [t.tenant_id, t.namespace, t.task_id, t.sequence] })],
);

/**
 * Active tasks per concurrency key. A claim increments `active` with
 * `UPDATE … WHERE active < limit` (the row lock serialises claimers of one key, and the
 * re-check after a lock wait keeps the limit), and a task leaving `active` decrements it.
 * The row is created (idempotently) when a task naming the key is submitted.
 */
export const concurrencyKeys = pgTable(
  'concurrency_keys',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    concurrency_key: text('concurrency_key').notNull(),
    active: integer('active').notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.tenant_id, t.namespace, t.concurrency_key] })],
);

/**
 * Completion subscriptions (DESIGN §8): the immutable part, one row per subscribed destination
 * of a task. Created under the task's row lock, so at most MAX_COMPLETION_SUBSCRIPTIONS per task
 * and one per `subscription_key` (the unique index also serves listing a task's subscriptions).
 */
export const completionSubscriptions = pgTable(
  'completion_subscriptions',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    subscription_id: text('subscription_id').notNull(),
    task_id: text('task_id').notNull(),
    subscription_key: text('subscription_key').notNull(),
    /** The operator's destination alias, never a URL. */
    destination: text('destination').notNull(),
    /** The webhook id and CloudEvent id, identical across every try and generation. */
    event_id: text('event_id').notNull(),
    created_at: ms('created_at').notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.tenant_id, t.namespace, t.subscription_id] }),
    uniqueIndex('completion_subscriptions_key').on(
      t.tenant_id,
      t.namespace,
      t.task_id,
      t.subscription_key,
    ),
  ],
);

/**
 * The delivery state of each subscription's current generation: the hot, mutable row senders
 * lease and report on (without locking tasks), kept apart from the immutable subscription so
 * those updates rewrite a narrow row. `task_id` is copied here for the terminal hook and
 * retention, which find deliveries by task.
 */
export const completionDeliveries = pgTable(
  'completion_deliveries',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    subscription_id: text('subscription_id').notNull(),
    task_id: text('task_id').notNull(),
    /** waiting | due | delivering | delivered | exhausted. */
    state: text('state').notNull(),
    generation: integer('generation').notNull(),
    /** Tries started in the current generation (a lease starts one). */
    attempts: integer('attempts').notNull(),
    /** `due`: the earliest next try; `delivering`: when the sender's lease ends. */
    next_attempt_at: ms('next_attempt_at'),
    delivered_at: ms('delivered_at'),
    /** When the current generation was delivered or exhausted: the latest callback activity. */
    finished_at: ms('finished_at'),
    last_status_code: integer('last_status_code'),
    last_error: text('last_error'),
  },
  (t) => [
    primaryKey({ columns: [t.tenant_id, t.namespace, t.subscription_id] }),
    // Leasing, oldest due first (ties by id). `delivering` rows stay in it: their `next_attempt_at` is the
    // sender's lease end, after which they are leasable again. Finished and waiting rows,
    // the vast majority, are not in it.
    index('completion_deliveries_lease')
      .on(t.next_attempt_at, t.subscription_id)
      .where(sql`state in ('due', 'delivering')`),
    // The terminal hook and retention find a task's deliveries.
    index('completion_deliveries_task').on(t.tenant_id, t.namespace, t.task_id),
  ],
);

/** A namespace's own retention policy (a namespace without a row uses the server default). */
export const retentionPolicies = pgTable(
  'retention_policies',
  {
    tenant_id: text('tenant_id').notNull(),
    namespace: text('namespace').notNull(),
    retention_ms: ms('retention_ms').notNull(),
    updated_at: ms('updated_at').notNull(),
    // Seed `RetentionPolicy`: "existing retiring records continue physical collection under any
    // later policy". Records older than this (terminal, or expired, before it) were retiring
    // under an earlier policy when this one was set, and stay collectable whatever it says.
    retiring_before: ms('retiring_before'),
  },
  (t) => [primaryKey({ columns: [t.tenant_id, t.namespace] })],
);
