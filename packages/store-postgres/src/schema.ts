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
    command_digest: text('command_digest').notNull(),
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
  (t) => [primaryKey({ columns: [t.tenant_id, t.namespace, t.session_id] })],
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
