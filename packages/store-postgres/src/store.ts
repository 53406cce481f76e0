/**
 * `TaskStore` on PostgreSQL (DESIGN §7). Every operation is one transaction: it reads store time
 * once, loads the rows it needs under lock, applies the core's pure transition, writes what the
 * transition returned (only changed rows), NOTIFYs once, and replies after commit. Lifecycle rules
 * live only in `@ledgence/core`; this file moves rows between the tables and the transitions.
 *
 * Batches (DESIGN §7.1 group commit) run the same code over many items in one transaction with
 * set-based statements; each item's transition is applied on its own, in request order, against
 * the state the items before it left, so each gets the reply it would have got alone. An item
 * whose transition rejects writes nothing and does not affect its neighbours; if the shared
 * transaction itself fails (deadlock, serialization, lost connection), the items are retried one
 * by one, each in its own transaction.
 */
import {
  type AcquireCommand,
  type AttemptSnapshot,
  type Authority,
  type CompletionRetryCommand,
  type CompletionSubscribeCommand,
  type CompletionSubscription,
  ContractError,
  decodeTaskCursor,
  fitText,
  HISTORY_PAGE_LIMIT,
  type LeaseOwner,
  MAX_COMPLETION_BATCH,
  MAX_RECOVERY_BATCH,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
  MESSAGE_MAX_BYTES,
  MIN_RETENTION_MS,
  type OpenSessionCommand,
  type RecordedHistoryEvent,
  type RecoveryProgress,
  type RenewCommand,
  type RetentionPolicy,
  type RetentionPreview,
  type RetentionProgress,
  type Scope,
  type SetRetentionPolicyCommand,
  type SettleCommand,
  type SettleReply,
  type SubmitCommand,
  TASK_LIST_DEFAULT_LIMIT,
  TASK_LIST_MAX_LIMIT,
  type TaskListQuery,
  type TaskPage,
  type TaskResult,
  type TaskSnapshot,
  type TaskState,
  type TaskStatus,
  type Timestamp,
  type WorkerSession,
} from '@ledgence/contracts';
import {
  type AcquireOutcome,
  AcquireReplyBudget,
  type AcquireStoreOptions,
  type AttemptRow,
  attemptSnapshot,
  type CompletionLease,
  type CompletionStore,
  type CursorRow,
  cancelTask,
  claimTask,
  classifyPoll,
  completionSubscription,
  confirmQuiescence,
  countRecovery,
  DEFAULT_LIFECYCLE_CONFIG,
  type DeliveryReport,
  emptyPoll,
  expireLostTry,
  extendSession,
  type FailpointStoreOperation,
  type Failpoints,
  type HistoryRow,
  handBackAttempt,
  type ItemResult,
  type LifecycleConfig,
  NO_FAILPOINTS,
  newId,
  openSession,
  type RetentionPolicyRow,
  type RetentionStore,
  recordedHistoryEvent,
  recoverExpiredLease,
  redeliverSubscription,
  renewLease,
  replayPoll,
  requireIntegerArgument,
  requireLiveSession,
  retentionCutoff,
  retentionPolicyView,
  retiringFloor,
  type SessionRow,
  type SubmitIds,
  type SubmitOutcome,
  type SubscribeOutcome,
  settleAttempt,
  startRecoveryProgress,
  submitTask,
  subscribeTask,
  subscriptionNotFound,
  type TaskRow,
  type TaskStore,
  taskNotFound,
  taskPage,
  taskResult,
  taskSnapshot,
  taskStatus,
  workerSession,
} from '@ledgence/core';
import postgres from 'postgres';
import {
  attemptFromDb,
  attemptKey,
  cursorFromDb,
  type DbRow,
  jsonColumn,
  type LoadedPayload,
  num,
  scopedKey,
  sessionFromDb,
  subscriptionFromDb,
  taskFromDb,
  taskKey,
} from './codec.js';
import {
  countDueBacklog,
  type DeliveryLeaseFilter,
  insertSubscription,
  leaseDeliveryRows,
  listSubscriptionRows,
  loadSubscriptions,
  lockSubscription,
  lockSubscriptionTask,
  markDeliveriesDue,
  reportDeliveryRows,
  type TerminalTaskRef,
  writeDelivery,
} from './completion-sql.js';
import {
  type AttemptKeyRef,
  ensureConcurrencyKeys,
  insertAttempts,
  insertHistory,
  insertSubmitted,
  loadAttempts,
  loadAttemptsAt,
  loadPayloads,
  loadSlots,
  loadTasks,
  loadTasksByIdempotencyKey,
  lockConsumerSlots,
  lockExpiredLeases,
  lockTasks,
  notifyWake,
  type PollSlot,
  pipelined,
  queueDepths,
  releaseConcurrencySlots,
  renewAttempts,
  type SubmitClock,
  selectClaimable,
  selectNextDue,
  storeNow,
  type TaskRef,
  type Tx,
  takeConcurrencySlot,
  takeConcurrencySlotNoWait,
  updateAttempts,
  updateTasks,
  upsertCursors,
  WAKE_PAYLOAD_MAX_BYTES,
  writeOutputs,
} from './hot-sql.js';
import { type MigrationStatus, migrationStatus } from './migrate.js';
import { reconnectBackoffSeconds } from './reconnect.js';
import {
  collectRetiredRows,
  countCandidates,
  loadPolicyAt,
  lockRetiredTasks,
  selectDueRetentionScopes,
  selectRetentionScopes,
  upsertPolicy,
} from './retention-sql.js';
import { analyzeTables, STORE_TABLES, tablesNeedingStatistics } from './statistics.js';

/** Options of {@link createPostgresTaskStore}. */
export interface PostgresTaskStoreOptions {
  /** postgres:// URL; the store makes (and on `close()` ends) its own pool. */
  url?: string;
  /** Or a postgres.js client the caller owns (not ended by `close()`). */
  sql?: postgres.Sql;
  /** Lease timings; defaults to the contract limits. */
  config?: LifecycleConfig;
  /** Pool size when the store makes its own pool (default 10). */
  max?: number;
  /**
   * PostgreSQL `lock_timeout` of the store's own pool (default 5 000): an operation waiting
   * longer for a row lock fails as `unavailable` (retryable) instead of hanging its caller.
   */
  lockTimeoutMs?: number;
  /**
   * PostgreSQL `idle_in_transaction_session_timeout` of the store's own pool (default 30 000):
   * a transaction whose process froze (SIGSTOP, a stalled event loop) is ended by the server,
   * so its row locks cannot stall the other replicas. The store never waits on anything but
   * the database inside a transaction, so a healthy process never comes near it.
   */
  idleInTransactionTimeoutMs?: number;
  /**
   * How long a connection of the store's own pool that awaits a reply may receive nothing
   * before it is destroyed and what it holds fails as `unavailable` (default 60 000; our
   * postgres.js patch's `wire_timeout`). A database whose address moved at a failover, or a NAT
   * that forgot the flow, leaves a connection that neither answers nor closes: without this its
   * operations hung until TCP's retransmissions gave up, ~15 minutes. Far above any statement
   * the store runs (lock waits end at `lockTimeoutMs`).
   */
  wireTimeoutMs?: number;
  /**
   * Most time an operation waits for a connection of the pool before it fails as `unavailable`
   * (default 5 000). While PostgreSQL is down, the pool's connections keep reconnecting and the
   * operations waiting for one queued without end: requests, `/readyz` included, hung for the
   * outage (clients long gone by then) and then all ran at once. Bounded, each is a prompt 503
   * its client retries. Far above the wait of a busy but healthy pool.
   */
  connectionWaitMs?: number;
  /**
   * TEST ONLY: milliseconds added to store time, read at every operation, so tests can move
   * time forward (lease expiry, retry delays) without sleeping. Never set it in production:
   * store time must be the database clock (DESIGN §1.2).
   */
  clockOffsetMs?: () => number;
  /**
   * PostgreSQL `lock_timeout` of a retention collection (default 200), set locally in its
   * transaction: collection skips rows others hold (`SKIP LOCKED`), and this is the second guard
   * that it never queues behind a hot row for longer (it fails as `unavailable` and the next
   * pass tries again).
   */
  retentionLockTimeoutMs?: number;
  /**
   * TEST ONLY: crash points around the commit of the operations of FAILPOINT_STORE_OPERATIONS
   * (`<op>.before_commit`, `<op>.after_commit`; see `FAILPOINTS` in `@ledgence/core`). Default:
   * none armed, which costs one branch per transaction.
   */
  failpoints?: Failpoints;
}

/**
 * Names the operation a transaction runs for its failpoints; `when` (default: always) says
 * whether this run counts, so an empty recovery pass or an empty poll does not use up a point
 * armed for a transaction that changed something.
 */
interface TxFailpoint<T> {
  op: FailpointStoreOperation;
  when?: (result: T) => boolean;
}

/**
 * A {@link TaskStore}, {@link CompletionStore} and {@link RetentionStore} on PostgreSQL, with its
 * client and a way to release it.
 */
export interface PostgresTaskStore extends TaskStore, CompletionStore, RetentionStore {
  /** The postgres.js client the store runs on, for tests and tools. */
  readonly sql: postgres.Sql;
  /**
   * Which migrations the database has and lacks (readiness), read through the store's
   * transaction runner, so a probe answered while PostgreSQL restarts fails as `unavailable`.
   */
  migrationStatus(): Promise<MigrationStatus>;
  /** Ends the pool if the store created it; a caller-supplied client is left open. */
  close(): Promise<void>;
  /**
   * Non-terminal task counts by queue and state over every tenant and namespace (for metrics):
   * the `limit` deepest queues, and the rest summed under `queue: null`. A read-only snapshot
   * that takes no row locks and reads no terminal rows.
   */
  queueDepths(limit: number): Promise<QueueDepth[]>;
  /**
   * Analyzes each of the store's tables that holds rows and was never analyzed (nor vacuumed) or,
   * while still small, has doubled in size since it last was, so the planner stops tying key
   * lookups between the primary key and other indexes, and plans made while a table was tiny (a
   * sequential scan of it per batch) are replaced as it grows (`statistics.ts`); returns the
   * tables analyzed. A maintenance pass: the server runs it every maintenance interval. Once a
   * table has been analyzed at 256 pages or more it is autovacuum's, and the pass is one catalog
   * read.
   */
  analyzeGrowingTables(): Promise<string[]>;
  /**
   * The retention walk's namespaces (as `retentionScopes`: byte order, after `after`, at most
   * `limit`) that have something to collect now — a terminal task older than the namespace's
   * cutoff (its policy, or the default, and its retiring floor) or a worker session that expired
   * before it — passing over the others within one read: the server's retention round, so a
   * round over many namespaces with nothing due costs no transaction per namespace.
   */
  dueRetentionScopes(after: Scope | undefined, limit: number): Promise<Scope[]>;
}

/** One row of {@link PostgresTaskStore.queueDepths}. */
export interface QueueDepth {
  /** The queue; `null` for the sum of the queues beyond the limit. */
  queue: string | null;
  /** A non-terminal task state. */
  state: 'queued' | 'active';
  /** Tasks of the queue (or queues) in that state. */
  count: number;
}

/**
 * Creates the PostgreSQL task store. The schema must be migrated first ({@link migrate}).
 *
 * @example
 * ```ts
 * const store = createPostgresTaskStore({ url: process.env.DATABASE_URL });
 * const { snapshot } = await store.submit(command);
 * await store.close();
 * ```
 */
export function createPostgresTaskStore(options: PostgresTaskStoreOptions): PostgresTaskStore {
  return new PgTaskStore(options);
}

/** A backend failure: never an empty acquisition or lost ownership (DESIGN §1.1). */
function unavailable(error: unknown): ContractError {
  const detail = error instanceof Error ? error.message : String(error);
  return new ContractError('unavailable', `the task store is unavailable: ${detail}`, {
    cause: error,
  });
}

// The failpoints of the transactions that have them (see TxFailpoint). Acquire and recovery
// count only runs that claimed or recovered something: empty polls and idle recovery passes run
// all the time and would fire a point before the transition it is armed for.
/**
 * The rows a claim examines per poll it serves, at most, across its select rounds (each row it
 * examines is locked `FOR UPDATE`, its lock written to the WAL): enough for a backlog grouped by
 * concurrency key with a few tasks per key before the next (32 polls over keys of 5 tasks each
 * examine ~160 rows; claim-rounds.int.test.ts), linear in the polls whatever the backlog.
 */
const CLAIM_ROWS_PER_POLL = 8;

const SUBMIT_POINT: TxFailpoint<unknown> = { op: 'submit' };
const RENEW_POINT: TxFailpoint<unknown> = { op: 'renew' };
const SETTLE_POINT: TxFailpoint<unknown> = { op: 'settle' };
const CANCEL_POINT: TxFailpoint<unknown> = { op: 'cancel' };
const QUIESCENCE_POINT: TxFailpoint<unknown> = { op: 'quiescence' };
const ACQUIRE_POINT: TxFailpoint<ItemResult<AcquireOutcome>[]> = {
  op: 'acquire',
  when: (results) =>
    results.some((r) => r.ok && r.value.recorded && r.value.reply.disposition === 'assigned'),
};
const RECOVERY_POINT: TxFailpoint<RecoveryProgress> = {
  op: 'recovery',
  when: (progress) => progress.scanned > 0,
};
// A refusal commits too (refusalAsItem), but was never a crash point: only an accepted call.
const SUBSCRIBE_POINT: TxFailpoint<ItemResult<unknown>> = { op: 'subscribe', when: (r) => r.ok };
const REDELIVER_POINT: TxFailpoint<ItemResult<unknown>> = { op: 'redeliver', when: (r) => r.ok };
const SESSION_OPEN_POINT: TxFailpoint<unknown> = { op: 'session_open' };
const SESSION_EXTEND_POINT: TxFailpoint<unknown> = { op: 'session_extend' };
const RETENTION_POLICY_POINT: TxFailpoint<unknown> = { op: 'retention_policy' };
// As recovery: only a pass that removed something (the maintenance loop runs all the time).
const RETENTION_COLLECT_POINT: TxFailpoint<RetentionProgress> = {
  op: 'retention_collect',
  when: (progress) => progress.tasks_removed > 0 || progress.sessions_removed > 0,
};
// As acquire: only a lease that took something (the sender polls all the time).
const DELIVERY_LEASE_POINT: TxFailpoint<CompletionLease[]> = {
  op: 'delivery_lease',
  when: (leases) => leases.length > 0,
};

/**
 * Sends a transaction's last statements with its COMMIT behind them, in one round trip, and
 * resolves `true` once committed (issue #7: one round trip less for every lifecycle
 * transaction). With a failpoint armed it only sends them and resolves `false`: the COMMIT
 * follows the body. The body writes nothing after it; a read after it runs outside the
 * transaction when it resolved `true`. If a statement fails, PostgreSQL has aborted the
 * transaction and answers the COMMIT with a rollback; the failure is thrown, as from
 * `pipelined`.
 */
type Finish = (last: readonly Promise<unknown>[]) => Promise<boolean>;

/** One submit transaction's answers, and the items to submit again in a transaction of their own. */
interface SubmitTxOutcome {
  results: ItemResult<SubmitOutcome>[];
  /**
   * Indexes of items whose key the insert found held, by a task that was gone when looked up
   * (deleted by retention in between): a new submit inserts them.
   */
  rerun: number[];
}

type ScopedCursor = CursorRow & { tenant_id: string; namespace: string };

/** The writes of one transaction, collected while transitions run, flushed set-based. */
class Changes {
  readonly tasks = new Map<string, { before: TaskRow; after: TaskRow }>();
  readonly newAttempts: AttemptRow[] = [];
  readonly renewed = new Map<string, AttemptRow>();
  readonly updated = new Map<string, AttemptRow>();
  readonly history: HistoryRow[] = [];
  readonly cursors = new Map<string, ScopedCursor>();
  readonly hints = new Map<string, object>();
  /** Concurrency slots given back, by key (see {@link addRelease}). */
  readonly releases = new Map<string, SlotRelease>();

  task(before: TaskRow, after: TaskRow): void {
    const key = taskKey(after.tenant_id, after.namespace, after.task_id);
    const entry = this.tasks.get(key);
    if (entry === undefined) this.tasks.set(key, { before, after });
    else entry.after = after;
  }

  hint(hint: object): void {
    this.hints.set(JSON.stringify(hint), hint);
  }
}

/** Slots of one concurrency key given back by a transaction. */
interface SlotRelease {
  tenant_id: string;
  namespace: string;
  key: string;
  count: number;
}

/** The lock identity of a task's concurrency key: its scope and name. */
function concurrencyKeyOf(task: TaskRow): string {
  return scopedKey(task.tenant_id, task.namespace, task.concurrency_key ?? '');
}

/** Counts one slot of `task`'s concurrency key (if it has one) as given back. */
function addRelease(releases: Map<string, SlotRelease>, task: TaskRow): void {
  if (task.concurrency_key === null) return;
  const key = concurrencyKeyOf(task);
  const entry = releases.get(key);
  if (entry) entry.count += 1;
  else {
    releases.set(key, {
      tenant_id: task.tenant_id,
      namespace: task.namespace,
      key: task.concurrency_key,
      count: 1,
    });
  }
}

function compareText(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * The concurrency-key rows a transaction has locked, so that it only ever locks upward: every
 * transaction taking key rows in one order cannot deadlock on them. A claim's rounds select new
 * tasks after earlier rounds took their keys, and a batch claims queue after queue; a key below
 * the highest held (and not held) is only taken without waiting (`takeConcurrencySlotNoWait`).
 */
class KeyLockOrder {
  readonly #held = new Set<string>();
  #highest: string | undefined;

  /** Whether `key` may be locked now: held already, or above every key held. */
  allows(key: string): boolean {
    return this.#held.has(key) || this.#highest === undefined || key > this.#highest;
  }

  took(key: string): void {
    this.#held.add(key);
    if (this.#highest === undefined || key > this.#highest) this.#highest = key;
  }
}

function attemptKeyOf(row: {
  tenant_id: string;
  namespace: string;
  task_id: string;
  attempt_id: string;
}) {
  return attemptKey(row.tenant_id, row.namespace, row.task_id, row.attempt_id);
}

function taskKeyOf(row: { tenant_id: string; namespace: string; task_id: string }) {
  return taskKey(row.tenant_id, row.namespace, row.task_id);
}

const TERMINAL: ReadonlySet<TaskState> = new Set(['succeeded', 'failed', 'cancelled']);

/** Whether a transition changed any column `updateTasks` writes. */
function schedulingChanged(a: TaskRow, b: TaskRow): boolean {
  return (
    a.state !== b.state ||
    a.available_at !== b.available_at ||
    a.terminal_at !== b.terminal_at ||
    a.attempt_count !== b.attempt_count ||
    a.dispatch_count !== b.dispatch_count ||
    a.current_attempt_id !== b.current_attempt_id ||
    a.cancel_requested_at !== b.cancel_requested_at ||
    a.history_sequence !== b.history_sequence ||
    a.outcome !== b.outcome
  );
}

function uniqueBy<T>(items: readonly T[], key: (item: T) => string): T[] {
  const seen = new Map<string, T>();
  for (const item of items) if (!seen.has(key(item))) seen.set(key(item), item);
  return [...seen.values()];
}

/*
 * The hot paths build their small records field by field, never as `{ ...ref, more }`: on
 * Node 20's V8 each property an object literal adds after a spread costs ~1 µs (a spread that
 * only overrides existing properties is fast; bench/README.md, "Objects built by spread").
 */

/**
 * A snapshot built at store time 0 ({@link SubmitClock}) moved to the store time `base`. A new
 * task's only times are these two; terminal and cancel times are null.
 */
function snapshotShifted(snapshot: TaskSnapshot, base: Timestamp): TaskSnapshot {
  return {
    ...snapshot,
    submitted_at: snapshot.submitted_at + base,
    available_at: snapshot.available_at + base,
  };
}

function taskRefOf(scope: Scope, taskId: string): TaskRef {
  return { tenant_id: scope.tenant_id, namespace: scope.namespace, task_id: taskId };
}

function attemptRefOf(scope: Scope, taskId: string, attemptId: string): AttemptKeyRef {
  return {
    tenant_id: scope.tenant_id,
    namespace: scope.namespace,
    task_id: taskId,
    attempt_id: attemptId,
  };
}

function scopedCursor(cursor: CursorRow, scope: Scope): ScopedCursor {
  return {
    tenant_id: scope.tenant_id,
    namespace: scope.namespace,
    worker_session_id: cursor.worker_session_id,
    consumer_id: cursor.consumer_id,
    sequence: cursor.sequence,
    command: cursor.command,
    assignment: cursor.assignment,
  };
}

function ownerTaskRef(owner: LeaseOwner): TaskRef {
  return taskRefOf(owner.scope, owner.task_id);
}

function ownerAttemptRef(owner: LeaseOwner): AttemptKeyRef {
  return attemptRefOf(owner.scope, owner.task_id, owner.attempt_id);
}

/** Claim order (DESIGN §5): priority desc, available_at, task_id (bytes; ids are ASCII). */
function claimOrder(a: TaskRow, b: TaskRow): number {
  if (a.priority !== b.priority) return b.priority - a.priority;
  if (a.available_at !== b.available_at) return a.available_at - b.available_at;
  return a.task_id < b.task_id ? -1 : a.task_id > b.task_id ? 1 : 0;
}

function payloadOf(rows: readonly DbRow[]): Map<string, LoadedPayload> {
  const map = new Map<string, LoadedPayload>();
  for (const row of rows) {
    map.set(taskKey(String(row.tenant_id), String(row.namespace), String(row.task_id)), {
      data: jsonColumn(row.data),
      output: jsonColumn(row.output),
    });
  }
  return map;
}

/** A queue in a scope: what a task, a task row or a submitted input names. */
interface QueueRef {
  tenant_id: string;
  namespace: string;
  queue: string;
}

/** The wake hint of a queue that gained ready work. */
function queueHint(task: QueueRef) {
  return { kind: 'queue', tenant: task.tenant_id, namespace: task.namespace, queue: task.queue };
}

/**
 * A body that locked a queued task's row hints its queue, whatever it then decides: a poll whose
 * probe skipped the row (`FOR UPDATE SKIP LOCKED`) meanwhile may have parked
 * (locked-queued-wake.int).
 */
async function hintLockedQueued(tx: Tx, task: QueueRef & { state: string }): Promise<void> {
  if (task.state === 'queued') await notifyWake(tx, [queueHint(task)]);
}

/**
 * `decide`'s result, or the refusal it threw as a value: for a body whose transaction must commit
 * whatever the answer — a wake hint it sends reaches listeners only if it commits
 * ({@link hintLockedQueued}) — and whose caller throws the refusal after COMMIT ({@link itemValue}).
 */
function refusalAsItem<T>(decide: () => T): ItemResult<T> {
  try {
    return { ok: true, value: decide() };
  } catch (error) {
    if (error instanceof ContractError) return { ok: false, error };
    throw error;
  }
}

/** The value of a committed {@link refusalAsItem}, or its refusal thrown. */
function itemValue<T>(item: ItemResult<T>): T {
  if (item.ok) return item.value;
  throw item.error;
}

/** Wakes every queue of the task's namespace (wake.ts). */
function scopeHint(task: QueueRef) {
  return { kind: 'scope', tenant: task.tenant_id, namespace: task.namespace };
}

/**
 * The one NOTIFY payload waking these tasks' queues, or null when it would exceed
 * {@link WAKE_PAYLOAD_MAX_BYTES} (the hints then go out as {@link notifyWake}'s NOTIFYs).
 */
function inlineWake(tasks: readonly QueueRef[]) {
  const hints = new Set(tasks.map((task) => JSON.stringify(queueHint(task))));
  const wake = `[${[...hints].join(',')}]`;
  return Buffer.byteLength(wake) <= WAKE_PAYLOAD_MAX_BYTES ? wake : null;
}

/**
 * Whether a submit of these commands, when it reads store time in its insert, is that one
 * statement and nothing else: one chunk, no concurrency-key rows, its wake inside the insert.
 * The wake is that of every command's queue, a superset of what the insert sends.
 */
function submitIsOneStatement(commands: readonly SubmitCommand[]): boolean {
  return (
    commands.length <= SUBMIT_CHUNK &&
    commands.every((c) => c.input.concurrency_key === undefined) &&
    inlineWake(commands.map((c) => c.input)) !== null
  );
}

/**
 * Tasks per insert statement of a submit. In one statement, a bulk submit's rows were built
 * (then: digests, since dropped, transitions, array parameters: ~20 ms of the server's CPU per
 * 1 000 tasks) and only then inserted (~35–45 ms of PostgreSQL's), one after the other. Sent in
 * chunks, each insert
 * runs while the server builds the next: +17–20 % bulk submit rate (bench/README.md, "Bulk
 * submit in pipelined chunks"). All chunks are one transaction, as before; 100, 250 and 500
 * measured alike.
 */
export const SUBMIT_CHUNK = 250;

/**
 * Sends one chunk of new tasks' insert ({@link insertSubmitted}, with the wake inside it) and
 * behind it, added to `writes`, the wake as separate NOTIFYs when its hints exceed one NOTIFY
 * payload. Hints of several chunks may repeat one another; PostgreSQL delivers identical
 * notifications of one transaction once. Every statement sent is marked handled: the caller's
 * `finish` awaits them all once all have settled and reports the first failure, and until then
 * a failure must not count as unhandled.
 */
function sendSubmitted(
  tx: Tx,
  tasks: readonly TaskRow[],
  history: readonly HistoryRow[],
  clock: SubmitClock,
  writes: Promise<unknown>[],
): Promise<DbRow[]> {
  const wake = inlineWake(tasks);
  const insert = insertSubmitted(tx, tasks, history, wake, clock);
  insert.catch(() => {});
  if (wake === null) {
    const notify = notifyWake(tx, uniqueBy(tasks.map(queueHint), JSON.stringify));
    notify.catch(() => {});
    writes.push(notify);
  }
  return insert;
}

/**
 * Sends the concurrency-key rows of a submit's new tasks ({@link ensureConcurrencyKeys}), added
 * to `writes`: every chunk's in one statement, behind the last chunk's insert, in
 * {@link KeyLockOrder}'s order. With the inserts' idempotency keys taken in key order before
 * them, every submit takes the rows other transactions may be creating in one global order —
 * idempotency keys, then key rows, each ascending — so overlapping submits cannot deadlock on
 * them (submit-deadlock.int.test.ts). Key rows come last, after every idempotency key, so all
 * of them go in one statement without holding back the first chunk's insert; and in the order
 * claims wait for key rows, so a submit and a claim waiting upward cannot close a cycle. Sent
 * before the inserts' answers say which tasks they skipped, so each key goes with its tasks'
 * ids and the statement creates the rows of the inserted ones' keys only. Marked handled, as in
 * {@link sendSubmitted}.
 */
function sendConcurrencyKeys(tx: Tx, tasks: Iterable<TaskRow>, writes: Promise<unknown>[]): void {
  const keyed: {
    lock: string;
    tenant_id: string;
    namespace: string;
    key: string;
    task_id: string;
  }[] = [];
  for (const task of tasks) {
    if (task.concurrency_key === null) continue;
    keyed.push({
      lock: concurrencyKeyOf(task),
      tenant_id: task.tenant_id,
      namespace: task.namespace,
      key: task.concurrency_key,
      task_id: task.task_id,
    });
  }
  if (keyed.length === 0) return;
  const ensure = ensureConcurrencyKeys(
    tx,
    keyed.sort((a, b) => compareText(a.lock, b.lock)),
  );
  ensure.catch(() => {});
  writes.push(ensure);
}

/**
 * The indexes of a submit's commands in the order its inserts take their idempotency keys:
 * by scope and key (`idem`), ties (repeats of a key) in request order, so the first of them
 * is still the one that creates the task. See {@link sendConcurrencyKeys} for why one order.
 */
function idempotencyOrder(
  commands: readonly SubmitCommand[],
  idem: (command: SubmitCommand) => string,
): number[] {
  const keys = commands.map(idem);
  return keys
    .map((_, index) => index)
    .sort((a, b) => compareText(keys[a] as string, keys[b] as string) || a - b);
}

/** The result of one worker-side transition (renew, settle, confirm). */
interface SideResult<R> {
  changed: boolean;
  task: TaskRow;
  attempt: AttemptRow;
  history: HistoryRow[];
  reply: R;
}

class PgTaskStore implements PostgresTaskStore {
  readonly sql: postgres.Sql;
  private readonly owned: boolean;
  private readonly config: LifecycleConfig;
  private readonly offset: () => number;
  private readonly retentionLockTimeoutMs: number;
  private readonly connectionWaitMs: number;
  private readonly failpoints: Failpoints;

  constructor(options: PostgresTaskStoreOptions) {
    if (options.sql !== undefined) {
      this.sql = options.sql;
      this.owned = false;
    } else if (options.url !== undefined) {
      // `wire_timeout` is our postgres.js patch's: its type declarations leave it out.
      const wire = { wire_timeout: (options.wireTimeoutMs ?? 60_000) / 1000 } as object;
      this.sql = postgres(options.url, {
        max: options.max ?? 10,
        onnotice: () => {},
        connect_timeout: 10,
        backoff: reconnectBackoffSeconds,
        ...wire,
        connection: {
          application_name: 'ledgence-store',
          lock_timeout: options.lockTimeoutMs ?? 5_000,
          idle_in_transaction_session_timeout: options.idleInTransactionTimeoutMs ?? 30_000,
        },
      });
      this.owned = true;
    } else {
      throw new TypeError('createPostgresTaskStore needs a url or a sql client');
    }
    this.config = options.config ?? DEFAULT_LIFECYCLE_CONFIG;
    this.offset = options.clockOffsetMs ?? (() => 0);
    this.retentionLockTimeoutMs = options.retentionLockTimeoutMs ?? 200;
    this.connectionWaitMs = options.connectionWaitMs ?? 5_000;
    this.failpoints = options.failpoints ?? NO_FAILPOINTS;
  }

  async close(): Promise<void> {
    if (this.owned) await this.sql.end({ timeout: 5 });
  }

  /**
   * One transaction on a reserved connection; a ContractError passes through (after rollback),
   * any other failure is `unavailable`.
   *
   * Not `sql.begin`: after a failure it always sends ROLLBACK, also on a connection that is
   * gone. Here a lost connection gets no further statement (the server rolls the transaction
   * back when the session ends). That a lost connection fails every statement on it, at once
   * and whenever its backend died, is `patches/postgres@3.4.9.patch` (postgres.js 3.4.9 could
   * hang the transaction forever or throw an uncaught TypeError; connection-loss.int.test.ts).
   *
   * A body whose last step is writes passes them to `finish` (see {@link Finish}), which sends
   * COMMIT behind them instead of after their answers: a round trip less per transaction. With
   * a failpoint armed, COMMIT stays a step of its own, so the crash point before it exists.
   *
   * `failpoint` names the operation for the crash points just before COMMIT and just after it
   * (DESIGN §5 operations; issue #8 T2): the two moments where a dying process leaves the
   * caller without an answer although the outcome is, respectively, rolled back or durable.
   */
  private async transact<T>(
    body: (tx: Tx, startedAt: Timestamp | undefined, finish: Finish) => Promise<T>,
    isolation?: string,
    failpoint?: TxFailpoint<T>,
    timeWithBegin = false,
  ): Promise<T> {
    const connection = await this.reserve();
    // The connection goes back to the pool only once its transaction is known to have ended
    // (COMMIT or ROLLBACK answered). A lost one is already the pool's (the patched driver
    // takes it back on close); any other doubt costs a pooled connection, never a transaction
    // shared with the next caller.
    let ended = false;
    let committed = false;
    let result: T;
    // One branch when no failpoint is armed (every production run).
    const point = failpoint !== undefined && this.failpoints.enabled ? failpoint : undefined;
    const finish: Finish = async (last) => {
      // An armed failpoint needs a moment between the body and COMMIT: the COMMIT below.
      if (point !== undefined) {
        await pipelined(last);
        return false;
      }
      const answers = await pipelined([...last, connection.unsafe('commit')]);
      // A COMMIT of an aborted transaction answers ROLLBACK, not an error.
      const tag = (answers.at(-1) as { command?: string } | undefined)?.command;
      if (tag !== 'COMMIT') throw new Error(`COMMIT was answered with ${tag}`);
      committed = true;
      return true;
    };
    try {
      // BEGIN travels with the body's first statements (postgres.js pipelines queries issued in
      // one turn of the event loop into one write): one round trip less per transaction
      // (bench/README.md). `execute()` sends BEGIN first — a postgres.js query is otherwise sent
      // only when awaited — and PostgreSQL runs the pipeline in order, so the body's statements
      // still run inside the transaction. `timeWithBegin`: store time is read in that same round
      // trip, for a body whose first statement would be that read (submit).
      const begin = connection.unsafe(isolation === undefined ? 'begin' : `begin ${isolation}`);
      begin.execute();
      const run = async () =>
        body(connection, timeWithBegin ? await this.time(connection) : undefined, finish);
      [, result] = await pipelined([begin, run()]);
      if (!committed) {
        if (point !== undefined && (point.when?.(result) ?? true)) {
          this.failpoints.hit(`${point.op}.before_commit`);
        }
        await connection.unsafe('commit');
      }
      ended = true;
    } catch (error) {
      if (!isConnectionLoss(error)) {
        try {
          await connection.unsafe('rollback');
          ended = true;
        } catch (rollbackError) {
          if (error instanceof ContractError) throw error;
          throw unavailable(rollbackError);
        }
      }
      if (error instanceof ContractError) throw error;
      // The connection died with the transaction's COMMIT perhaps sent (it travels with the
      // writes): whether it committed is unknown.
      throw isConnectionLoss(error) ? outcomeUnknown(error) : unavailable(error);
    } finally {
      if (ended) connection.release();
    }
    if (point !== undefined && (point.when?.(result) ?? true)) {
      try {
        this.failpoints.hit(`${point.op}.after_commit`);
      } catch (error) {
        // An `error` failpoint here is a lost reply: committed, yet the caller sees a retryable
        // failure and must converge by retrying (idempotency keys, operation ids, replays).
        throw outcomeUnknown(error);
      }
    }
    return result;
  }

  /**
   * A connection of the pool, waited for at most `connectionWaitMs`, else `unavailable`. A
   * reservation given up on stays in the pool's queue (postgres.js cannot withdraw it): the
   * connection it gets later goes straight back.
   */
  private async reserve(): Promise<postgres.ReservedSql> {
    const pending = this.sql.reserve();
    let timer: NodeJS.Timeout | undefined;
    const gaveUp = new Promise<undefined>((resolve) => {
      timer = setTimeout(resolve, this.connectionWaitMs, undefined);
    });
    let connection: postgres.ReservedSql | undefined;
    try {
      connection = await Promise.race([pending, gaveUp]);
    } catch (error) {
      throw unavailable(error);
    } finally {
      clearTimeout(timer);
    }
    if (connection !== undefined) return connection;
    pending.then(
      (late) => late.release(),
      () => {},
    );
    throw unavailable(
      new Error(`no database connection within ${this.connectionWaitMs} ms (is PostgreSQL up?)`),
    );
  }

  private async time(tx: Tx): Promise<Timestamp> {
    return (await storeNow(tx)) + this.offset();
  }

  async now(): Promise<Timestamp> {
    return this.transact((tx) => this.time(tx), 'read only');
  }

  async migrationStatus(): Promise<MigrationStatus> {
    return this.transact((tx) => migrationStatus(tx as postgres.Sql), 'read only');
  }

  /**
   * Runs a batch in one transaction; if that transaction fails as a whole, runs each item in a
   * transaction of its own, so one bad neighbour or a deadlock costs latency, not answers.
   */
  private async batch<C, R>(
    commands: readonly C[],
    body: (tx: Tx, items: readonly C[], finish: Finish) => Promise<ItemResult<R>[]>,
    failpoint?: TxFailpoint<ItemResult<R>[]>,
  ): Promise<ItemResult<R>[]> {
    if (commands.length === 0) return [];
    try {
      return await this.transact(
        (tx, _at, finish) => body(tx, commands, finish),
        undefined,
        failpoint,
      );
    } catch (error) {
      // Each item answers what it would have alone: a failure of the transaction as a whole
      // (a deadlock, a failing neighbour) is retried item by item, but a commit whose outcome is
      // unknown may have applied every item — alone, each would be `unavailable`, and its retry
      // (operation ids, idempotency keys, sequences) converges on what was committed.
      if (commands.length === 1 || hasUnknownOutcome(error)) {
        return commands.map(() => ({ ok: false, error: asContractError(error) }));
      }
    }
    const results: ItemResult<R>[] = [];
    for (const command of commands) {
      try {
        const [one] = await this.transact(
          (tx, _at, finish) => body(tx, [command], finish),
          undefined,
          failpoint,
        );
        results.push(one ?? { ok: false, error: unavailable(new Error('no result')) });
      } catch (error) {
        results.push({ ok: false, error: asContractError(error) });
      }
    }
    return results;
  }

  private async single<C, R>(
    command: C,
    body: (tx: Tx, items: readonly C[], finish: Finish) => Promise<ItemResult<R>[]>,
    failpoint?: TxFailpoint<ItemResult<R>[]>,
  ): Promise<R> {
    const [result] = await this.transact(
      (tx, _at, finish) => body(tx, [command], finish),
      undefined,
      failpoint,
    );
    if (result === undefined) throw unavailable(new Error('no result'));
    if (!result.ok) throw result.error;
    return result.value;
  }

  /**
   * Writes everything a transaction's transitions produced, then NOTIFYs once. Every statement's
   * parameters are known before the first is sent, so they are sent together: postgres.js
   * pipelines them on the connection (one write, one round trip) and PostgreSQL still runs them
   * one after another in this order, exactly as if each were awaited in turn; a failing one
   * aborts the transaction, so those after it apply nothing (issue #7, bench/README.md: with
   * BEGIN and the reads pipelined too, and COMMIT behind the writes when the caller passes
   * `finish`, a settle transaction takes 2 round trips instead of 10).
   */
  private async flush(tx: Tx, changes: Changes, finish?: Finish): Promise<void> {
    const writes: Promise<void>[] = [];
    if (changes.newAttempts.length > 0) writes.push(insertAttempts(tx, changes.newAttempts));
    const renewOnly = [...changes.renewed].filter(([key]) => !changes.updated.has(key));
    if (renewOnly.length > 0)
      writes.push(
        renewAttempts(
          tx,
          renewOnly.map(([, row]) => row),
        ),
      );
    if (changes.updated.size > 0) writes.push(updateAttempts(tx, [...changes.updated.values()]));

    const changed = [...changes.tasks.values()].filter((e) => schedulingChanged(e.before, e.after));
    if (changed.length > 0)
      writes.push(
        updateTasks(
          tx,
          changed.map((e) => e.after),
        ),
      );
    const outputs: (TaskRef & { output: unknown })[] = [];
    const terminal: TerminalTaskRef[] = [];
    for (const { before, after } of changed) {
      if (
        after.state === 'succeeded' &&
        before.state !== 'succeeded' &&
        after.outcome?.state === 'succeeded'
      ) {
        outputs.push({
          tenant_id: after.tenant_id,
          namespace: after.namespace,
          task_id: after.task_id,
          output: after.outcome.output,
        });
      }
      if (after.state === 'queued' && before.state !== 'queued') changes.hint(queueHint(after));
      if (TERMINAL.has(after.state) && !TERMINAL.has(before.state)) {
        // Every terminal transition sets terminal_at to its own store time: the hook's `now`.
        terminal.push({
          tenant_id: after.tenant_id,
          namespace: after.namespace,
          task_id: after.task_id,
          terminal_at: after.terminal_at ?? 0,
        });
        changes.hint({
          kind: 'task',
          tenant: after.tenant_id,
          namespace: after.namespace,
          task_id: after.task_id,
        });
      }
      if (before.state === 'active' && after.state !== 'active' && after.concurrency_key !== null) {
        addRelease(changes.releases, after);
        // A freed slot may make key-blocked work claimable, on any queue of the namespace: a
        // key belongs to the namespace, not to a queue.
        changes.hint(scopeHint(after));
      }
    }
    if (outputs.length > 0) writes.push(writeOutputs(tx, outputs));
    // DESIGN §8: the terminal hook, in the transaction of the terminal transition, under the
    // task locks this transaction holds (registration takes the same lock, so no subscription
    // can be inserted between the two). One statement, and only when a task became terminal.
    if (terminal.length > 0) writes.push(markDeliveriesDue(tx, terminal));
    if (changes.releases.size > 0) {
      // In key order, the order every transaction locks key rows in (see KeyLockOrder).
      const sorted = [...changes.releases.entries()].sort(([a], [b]) => compareText(a, b));
      writes.push(
        releaseConcurrencySlots(
          tx,
          sorted.map(([, v]) => v),
        ),
      );
    }
    if (changes.history.length > 0) writes.push(insertHistory(tx, changes.history));
    if (changes.cursors.size > 0) writes.push(upsertCursors(tx, [...changes.cursors.values()]));
    if (changes.hints.size > 0) writes.push(notifyWake(tx, [...changes.hints.values()]));
    await (finish === undefined ? pipelined(writes) : finish(writes));
  }

  // ---- submit -------------------------------------------------------------------------------

  async submit(command: SubmitCommand): Promise<SubmitOutcome> {
    // The insert waits out a concurrent first submit of the same key and the lookup after it
    // sees that task; a rerun is left only for a key whose (terminal) task retention deleted
    // between the two statements — the rerun then inserts it anew.
    for (let round = 0; ; round += 1) {
      const { results, rerun } = await this.submitTransaction([command]);
      if (rerun.length > 0) {
        if (round < 2) continue;
        throw unavailable(new Error('the idempotency key was taken and released meanwhile'));
      }
      const [result] = results;
      if (result === undefined) throw unavailable(new Error('no result'));
      if (!result.ok) throw result.error;
      return result.value;
    }
  }

  async submitBatch(commands: readonly SubmitCommand[]): Promise<ItemResult<SubmitOutcome>[]> {
    if (commands.length === 0) return [];
    let outcome: SubmitTxOutcome;
    try {
      outcome = await this.submitTransaction(commands);
    } catch (error) {
      // As in `batch`: a commit whose outcome is unknown is answered as each item alone would be.
      if (hasUnknownOutcome(error)) {
        return commands.map(() => ({ ok: false, error: asContractError(error) }));
      }
      // One by one, each with the single path's race handling.
      const results: ItemResult<SubmitOutcome>[] = [];
      for (const command of commands) results.push(await this.submitAlone(command));
      return results;
    }
    for (const index of outcome.rerun) {
      outcome.results[index] = await this.submitAlone(commands[index] as SubmitCommand);
    }
    return outcome.results;
  }

  /**
   * A submit's one transaction. Its insert reads store time itself (see {@link SubmitClock}),
   * so no round trip reads it first — except for a batch with an absolute `available_at`, which
   * must be checked against store time before anything is written: that one reads it with BEGIN.
   *
   * A submit that is then one statement ({@link submitIsOneStatement}: one chunk, no
   * concurrency-key rows, the wake inline; every single submit without a concurrency key or an
   * absolute `available_at`, and the batches group commit makes of them) is sent alone, without
   * BEGIN and COMMIT:
   * PostgreSQL runs a lone statement as a transaction of its own, all or nothing, with the same
   * NOTIFY at its commit. One statement and round trip for PostgreSQL instead of four statements
   * in two (bench/README.md, "A submit in one statement"). With a failpoint armed, the
   * transaction keeps its COMMIT step, where the crash points are.
   */
  private submitTransaction(commands: readonly SubmitCommand[]): Promise<SubmitTxOutcome> {
    const readsTimeFirst = commands.some((c) => c.input.available_at !== undefined);
    if (!readsTimeFirst && !this.failpoints.enabled && submitIsOneStatement(commands)) {
      return this.submitStatement(commands);
    }
    return this.transact(
      (tx, now, finish) => this.submitTx(tx, commands, readsTimeFirst ? now : undefined, finish),
      undefined,
      SUBMIT_POINT,
      readsTimeFirst,
    );
  }

  /**
   * {@link submitTx} as one statement on the pool, outside an explicit transaction: the insert
   * commits when it returns (so `finish` reports it committed), and the lookups of keys it
   * skipped run after it, as after a COMMIT.
   */
  private async submitStatement(commands: readonly SubmitCommand[]): Promise<SubmitTxOutcome> {
    const committed: Finish = async (last) => {
      await pipelined(last);
      return true;
    };
    // A reserved connection, not the pool's queue: a wait for one is bounded (`reserve`).
    const connection = await this.reserve();
    let lost = false;
    try {
      return await this.submitTx(connection, commands, undefined, committed);
    } catch (error) {
      if (error instanceof ContractError) throw error;
      // The statement commits as it ends: a connection lost before its reply leaves the submit
      // committed or not, so a batch must answer each item as alone would (`submitBatch`).
      lost = isConnectionLoss(error);
      throw lost ? outcomeUnknown(error) : unavailable(error);
    } finally {
      // A lost connection is already the pool's again (see `transact`).
      if (!lost) connection.release();
    }
  }

  private async submitAlone(command: SubmitCommand): Promise<ItemResult<SubmitOutcome>> {
    try {
      return { ok: true, value: await this.submit(command) };
    } catch (error) {
      return { ok: false, error: asContractError(error) };
    }
  }

  /**
   * Insert first, look up only what was not inserted (see {@link insertSubmitted}): the items
   * are answered as if no task held their keys, those tasks are inserted with their payload and
   * history rows and the wake in one statement, and only keys the insert skipped (held by an
   * existing task) or whose items all failed are looked up and re-answered from the stored task
   * (replay or conflict, in the order of the batch, as before). Measured reason: the lookup ran
   * for every submit and, on a table without statistics yet (any fresh database, and the whole
   * benchmark run), PostgreSQL probed it through `tasks_listing` and filtered by key — a scan of
   * the namespace per key, 5.3 s for 1 000 keys over 22 000 tasks (bench/README.md).
   *
   * COMMIT travels behind the insert (`finish`), and BEGIN before it in the same write: a
   * submit is 1 round trip (a lone insert without either: {@link submitTransaction}). The lookup
   * therefore runs after the commit when there is one: it reads only other transactions'
   * committed tasks, which this transaction never touched. A key that is gone by then
   * (retention deleted its terminal task) goes to `rerun`; a lookup that fails leaves its items
   * retryable while the committed ones keep their answers.
   */
  private async submitTx(
    tx: Tx,
    commands: readonly SubmitCommand[],
    storeTime: Timestamp | undefined,
    finish: Finish,
  ): Promise<SubmitTxOutcome> {
    const idem = (c: SubmitCommand) =>
      scopedKey(c.input.tenant_id, c.input.namespace, c.idempotency_key);
    // Without store time, the rows and answers are built at store time 0 and shifted by the
    // store time the insert read (below).
    const clock: SubmitClock =
      storeTime === undefined
        ? { readsStoreTime: true, offsetMs: this.offset() }
        : { readsStoreTime: false };
    const now = storeTime ?? 0;
    // Pass 1: every item answered as if no stored task held its key, a chunk at a time; each
    // chunk's insert is sent as soon as the chunk is answered, so PostgreSQL inserts one chunk
    // while the next is being built (see SUBMIT_CHUNK). Items are taken in idempotency-key
    // order, not request order, and answered at their request index: two submits of the same
    // new keys in different orders deadlocked (see sendConcurrencyKeys).
    const created = new Map<string, TaskRow>();
    const results = new Array<ItemResult<SubmitOutcome>>(commands.length);
    const inserts: Promise<DbRow[]>[] = [];
    const writes: Promise<unknown>[] = [];
    const order = idempotencyOrder(commands, idem);
    // Ids are issued in request order all the same: a task id is time-ordered and breaks ties
    // in the claim order (same priority and `available_at`), so a batch's tasks are claimed in
    // the order they were submitted (retries.int.test.ts, ordering.int.test.ts).
    const ids = commands.map(() => ({ task_id: newId('task'), run_id: newId('run') }));
    for (let from = 0; from < order.length; from += SUBMIT_CHUNK) {
      const tasks: TaskRow[] = [];
      const history: HistoryRow[] = [];
      for (const index of order.slice(from, from + SUBMIT_CHUNK)) {
        const command = commands[index] as SubmitCommand;
        try {
          const result = submitTask(
            created.get(idem(command)) ?? null,
            command,
            now,
            ids[index] as SubmitIds,
            this.config,
          );
          if (result.created) {
            created.set(idem(command), result.task);
            tasks.push(result.task);
            history.push(...result.history);
          }
          results[index] = {
            ok: true,
            value: { created: result.created, snapshot: result.reply },
          };
        } catch (error) {
          if (!(error instanceof ContractError)) throw error;
          results[index] = { ok: false, error };
        }
      }
      if (tasks.length === 0) continue;
      const insert = sendSubmitted(tx, tasks, history, clock, writes);
      inserts.push(insert);
      // Lets postgres.js write the chunk to the socket before the next chunk is built.
      if (from + SUBMIT_CHUNK < order.length) await new Promise(setImmediate);
    }
    sendConcurrencyKeys(tx, created.values(), writes);
    // Each inserted key, with the store time its rows were shifted by.
    const inserted = new Map<string, number>();
    let committed = false;
    if (inserts.length > 0) {
      committed = await finish([...inserts, ...writes]);
      for (const insert of inserts) {
        for (const row of await insert) {
          inserted.set(
            scopedKey(String(row.tenant_id), String(row.namespace), String(row.idempotency_key)),
            num(row.base),
          );
        }
      }
    }
    // Pass 1's answers for inserted keys (the new tasks and their replays within the batch)
    // were built at time 0 when the insert read store time: shift them by it.
    if (clock.readsStoreTime) {
      commands.forEach((command, index) => {
        const result = results[index];
        const base = inserted.get(idem(command));
        if (result?.ok && base !== undefined) {
          result.value = {
            created: result.value.created,
            snapshot: snapshotShifted(result.value.snapshot, base),
          };
        }
      });
    }
    // Pass 2: keys a stored task holds (the insert skipped them), and keys whose items all
    // failed in pass 1 (a stored task would have answered them first: replay or conflict).
    const recheck = commands
      .map((command, index) => ({ command, index, key: idem(command) }))
      .filter(({ key }) => !inserted.has(key));
    const rerun: number[] = [];
    if (recheck.length === 0) return { results, rerun };
    let stored: Map<string, TaskRow>;
    try {
      stored = await this.storedByIdempotencyKey(
        tx,
        uniqueBy(
          recheck.map(({ command }) => command),
          idem,
        ),
      );
    } catch (error) {
      // Before the commit this fails the transaction; after it, only these items.
      if (!committed) throw error;
      for (const { index } of recheck) results[index] = { ok: false, error: unavailable(error) };
      return { results, rerun };
    }
    for (const { command, index, key } of recheck) {
      const existing = stored.get(key);
      if (existing === undefined) {
        // The insert skipped the key, yet no committed task holds it: it was deleted in
        // between (retention); submit it again on its own. Otherwise nothing held the key and
        // pass 1's answer (an error) stands.
        if (created.has(key)) rerun.push(index);
        continue;
      }
      try {
        const result = submitTask(existing, command, now, { task_id: '', run_id: '' }, this.config);
        results[index] = { ok: true, value: { created: result.created, snapshot: result.reply } };
      } catch (error) {
        if (!(error instanceof ContractError)) throw error;
        results[index] = { ok: false, error };
      }
    }
    return { results, rerun };
  }

  /** The stored tasks holding these commands' idempotency keys, with their payloads, by key. */
  private async storedByIdempotencyKey(
    tx: Tx,
    commands: readonly SubmitCommand[],
  ): Promise<Map<string, TaskRow>> {
    const rows = await loadTasksByIdempotencyKey(
      tx,
      commands.map((c) => ({
        tenant_id: c.input.tenant_id,
        namespace: c.input.namespace,
        idempotency_key: c.idempotency_key,
      })),
    );
    const stored = new Map<string, TaskRow>();
    if (rows.length === 0) return stored;
    const payloads = payloadOf(
      await loadPayloads(
        tx,
        rows.map((r) => taskFromDb(r)),
      ),
    );
    for (const row of rows) {
      const task = taskFromDb(row);
      const payload = payloads.get(taskKeyOf(task));
      // Every task has its payload row until retention deletes both, which it can do between
      // these two reads (each statement reads its own snapshot): the key is then as free as
      // if retention had run before the lookup.
      if (payload === undefined) continue;
      stored.set(
        scopedKey(task.tenant_id, task.namespace, task.idempotency_key),
        taskFromDb(row, payload),
      );
    }
    return stored;
  }

  // ---- sessions -----------------------------------------------------------------------------

  async openSession(command: OpenSessionCommand): Promise<WorkerSession> {
    return this.transact(
      async (tx) => {
        const now = await this.time(tx);
        const row = openSession(command, newId('session'), now, this.config);
        await tx`
        insert into worker_sessions (tenant_id, namespace, session_id, queue, concurrency,
          created_at, expires_at)
        values (${row.tenant_id}, ${row.namespace}, ${row.id}, ${row.queue}, ${row.concurrency},
          ${row.created_at}, ${row.expires_at})`;
        return workerSession(row);
      },
      undefined,
      SESSION_OPEN_POINT,
    );
  }

  async extendSession(scope: Scope, sessionId: string): Promise<WorkerSession> {
    return this.transact(
      async (tx) => {
        const rows = await tx`
        select * from worker_sessions
        where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}
          and session_id = ${sessionId}
        for update`;
        const now = await this.time(tx);
        const loaded: SessionRow | null = rows[0] === undefined ? null : sessionFromDb(rows[0]);
        const live = requireLiveSession(loaded, scope, sessionId, now);
        const extended = extendSession(live, now, this.config);
        await tx`
        update worker_sessions set expires_at = ${extended.expires_at}
        where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}
          and session_id = ${sessionId}`;
        return workerSession(extended);
      },
      undefined,
      SESSION_EXTEND_POINT,
    );
  }

  /**
   * Lock: none (a session's scope never changes). Index: the primary key's tenant prefix when the
   * tenant is given; otherwise (development mode) a scan of `worker_sessions`: live sessions,
   * and expired ones retention has not collected yet.
   */
  async sessionScope(sessionId: string, tenant: string | undefined): Promise<Scope | null> {
    return this.transact(async (tx) => {
      const [row] = await tx<{ tenant_id: string; namespace: string }[]>`
        select tenant_id, namespace from worker_sessions
        where session_id = ${sessionId}
          and (${tenant ?? null}::text is null or tenant_id = ${tenant ?? null}::text)
        limit 1`;
      return row === undefined ? null : { tenant_id: row.tenant_id, namespace: row.namespace };
    }, 'read only');
  }

  // ---- acquire ------------------------------------------------------------------------------

  async acquire(command: AcquireCommand, options: AcquireStoreOptions): Promise<AcquireOutcome> {
    return this.single(
      command,
      (tx, items, finish) => this.acquireTx(tx, items, options, finish),
      ACQUIRE_POINT,
    );
  }

  async acquireBatch(
    commands: readonly AcquireCommand[],
    options: AcquireStoreOptions,
  ): Promise<ItemResult<AcquireOutcome>[]> {
    // One reply bound (ACQUIRE_BATCH_REPLY_MAX_BYTES) across the transactions of a batch run
    // poll by poll: what the committed polls before took, after what the reply already holds.
    const spent = { bytes: options.replyBytesUsed ?? 0 };
    const slots = new Set(commands.map(slotKey));
    if (slots.size !== commands.length) {
      // The same slot twice: the second poll depends on the first's claim; run them in order.
      const results: ItemResult<AcquireOutcome>[] = [];
      for (const command of commands) {
        try {
          const value = await this.single(
            command,
            (tx, items, finish) => this.acquireTx(tx, items, options, finish, spent),
            ACQUIRE_POINT,
          );
          results.push({ ok: true, value });
        } catch (error) {
          results.push({ ok: false, error: asContractError(error) });
        }
      }
      return results;
    }
    return this.batch(
      commands,
      // The whole batch starts from what the reply holds; its fallback, poll by poll, shares
      // `spent`.
      (tx, items, finish) =>
        this.acquireTx(
          tx,
          items,
          options,
          finish,
          items.length < commands.length ? spent : undefined,
        ),
      ACQUIRE_POINT,
    );
  }

  private async acquireTx(
    tx: Tx,
    commands: readonly AcquireCommand[],
    options: AcquireStoreOptions,
    finish: Finish,
    spent?: { bytes: number },
  ): Promise<ItemResult<AcquireOutcome>[]> {
    // One statement for every slot's session, cursor and the cursor's attempt (slots are unique
    // within a transaction: acquireBatch runs repeated slots one by one), sent with the slot
    // locks (pipelined: PostgreSQL reads the slots only once the locks are granted).
    const sessions = new Map<string, SessionRow>();
    const cursors = new Map<string, CursorRow>();
    const attempts = new Map<string, AttemptRow>();
    // The polls by queue, each queue's first claim select sent in the same round trip as the
    // slot locks and reads (after them, so it counts new polls from the locked slots' cursors).
    const queues = new Map<string, { first: AcquireCommand; polls: PollSlot[] }>();
    for (const command of commands) {
      const group = queueKey(command.scope, command.queue);
      const poll: PollSlot = {
        worker_session_id: command.worker_session_id,
        consumer_id: command.consumer_id,
        sequence: command.sequence,
      };
      const entry = queues.get(group);
      if (entry === undefined) queues.set(group, { first: command, polls: [poll] });
      else entry.polls.push(poll);
    }
    const [locked, slotRows, ...firstRows] = await pipelined([
      // JSON text: unambiguous, and free of the NUL the in-memory keys use (PostgreSQL text
      // rejects it).
      lockConsumerSlots(tx, [
        ...new Set(
          commands.map((c) =>
            JSON.stringify([
              c.scope.tenant_id,
              c.scope.namespace,
              c.worker_session_id,
              c.consumer_id,
            ]),
          ),
        ),
      ]),
      loadSlots(
        tx,
        commands.map((c) => ({
          tenant_id: c.scope.tenant_id,
          namespace: c.scope.namespace,
          worker_session_id: c.worker_session_id,
          consumer_id: c.consumer_id,
        })),
      ),
      ...(options.claim === false ? [] : [...queues.values()]).map(({ first, polls }) =>
        selectClaimable(
          tx,
          first.scope,
          first.queue,
          { round: 'first', clockOffsetMs: this.offset(), polls },
          [],
        ),
      ),
    ]);
    const firstRoundOf = new Map([...queues.keys()].map((group, i) => [group, firstRows[i] ?? []]));
    const now = locked + this.offset();
    for (const row of slotRows) {
      const command = commands[num(row.ordinality) - 1];
      if (command === undefined) continue;
      if (row.session !== null) {
        const session = sessionFromDb(row.session as DbRow);
        sessions.set(scopedKey(session.tenant_id, session.namespace, session.id), session);
      }
      if (row.cursor !== null) cursors.set(slotKey(command), cursorFromDb(row.cursor as DbRow));
      if (row.attempt !== null) {
        const attempt = attemptFromDb(row.attempt as DbRow);
        attempts.set(attemptKeyOf(attempt), attempt);
      }
    }
    const slotAttempt = (command: AcquireCommand, cursor: CursorRow | null) =>
      cursor?.assignment
        ? (attempts.get(
            attemptKey(
              command.scope.tenant_id,
              command.scope.namespace,
              cursor.assignment.task_id,
              cursor.assignment.attempt_id,
            ),
          ) ?? null)
        : null;

    const results: (ItemResult<AcquireOutcome> | undefined)[] = commands.map(() => undefined);
    const replays: { index: number; cursor: CursorRow; command: AcquireCommand }[] = [];
    const fresh = new Map<string, { index: number; command: AcquireCommand }[]>();
    commands.forEach((command, index) => {
      const session =
        sessions.get(
          scopedKey(command.scope.tenant_id, command.scope.namespace, command.worker_session_id),
        ) ?? null;
      const cursor = cursors.get(slotKey(command)) ?? null;
      try {
        const kind = classifyPoll(session, cursor, slotAttempt(command, cursor), command, now);
        if (kind.kind === 'replay') replays.push({ index, cursor: kind.cursor, command });
        else {
          const group = queueKey(command.scope, command.queue);
          const list = fresh.get(group) ?? [];
          list.push({ index, command });
          fresh.set(group, list);
        }
      } catch (error) {
        if (!(error instanceof ContractError)) throw error;
        results[index] = { ok: false, error };
      }
    });

    // New polls: the best claimable tasks of each queue, from its first-round select (and
    // more rounds only where concurrency keys refused some).
    const winners = new Map<string, TaskRow[]>();
    const changes = new Changes();
    // Store time of the decisions below: a concurrency key's row lock may have waited for another
    // transaction, for longer than a lease, so new leases and replayed authority are sampled after
    // it. (Which polls are new, and `consumer_busy`, were decided at `now`, before any wait.)
    let decidedAt = now;
    const keyLocks = new KeyLockOrder();
    // Not claiming (AcquireStoreOptions.claim): no winners, every new poll is answered empty.
    for (const [group, { first }] of options.claim === false ? [] : queues) {
      const need = fresh.get(group)?.length ?? 0;
      const offered = firstRoundOf.get(group) ?? [];
      const { won, surplus, at } = await this.claimable(tx, first, now, need, offered, keyLocks);
      decidedAt = Math.max(decidedAt, at);
      winners.set(group, won);
      // Rows locked for polls that turned out not to be new (or not yet available at `now`)
      // stay unwritten until COMMIT; a poll that skipped them meanwhile may have parked, so the
      // queue is woken once they are free.
      if (surplus !== undefined) changes.hint(queueHint(surplus));
    }
    // A session may have expired while a key lock was awaited: a new poll is answered as of
    // `decidedAt`, when its lease would start, and an expired session is rejected, never
    // assigned (DESIGN §5). The task it would have got stays queued.
    if (decidedAt > now) {
      for (const [group, polls] of fresh) {
        const live = polls.filter(({ index, command }) => {
          const session = sessions.get(
            scopedKey(command.scope.tenant_id, command.scope.namespace, command.worker_session_id),
          );
          try {
            requireLiveSession(
              session ?? null,
              command.scope,
              command.worker_session_id,
              decidedAt,
            );
            return true;
          } catch (error) {
            if (!(error instanceof ContractError)) throw error;
            results[index] = { ok: false, error };
            return false;
          }
        });
        fresh.set(group, live);
      }
    }
    // Replays answer from the cursor's attempt and its task, unlocked (a replay writes nothing),
    // both read again here: the slot read above may predate a concurrency key's wait, during
    // which the attempt may have been lost and its task claimed by another slot.
    const replayed = replays.flatMap((r) =>
      r.cursor.assignment === null ? [] : [{ scope: r.command.scope, ...r.cursor.assignment }],
    );
    const replayTasks = new Map<string, TaskRow>();
    if (replayed.length > 0) {
      const taskRefs = replayed.map((r) => taskRefOf(r.scope, r.task_id));
      // Claimed tasks come with their data (selectClaimable); only replays read payloads here.
      const [payloadRows, taskRows, attemptRows] = await pipelined([
        loadPayloads(tx, taskRefs),
        loadTasks(tx, taskRefs),
        loadAttempts(
          tx,
          replayed.map((r) => ({ ...taskRefOf(r.scope, r.task_id), attempt_id: r.attempt_id })),
        ),
      ]);
      const payloads = payloadOf(payloadRows);
      for (const row of taskRows) {
        const task = taskFromDb(row);
        replayTasks.set(taskKeyOf(task), taskFromDb(row, payloads.get(taskKeyOf(task)) ?? {}));
      }
      for (const row of attemptRows) {
        const attempt = attemptFromDb(row);
        attempts.set(attemptKeyOf(attempt), attempt);
      }
    }
    // A batch's assignments stop before their reply would pass ACQUIRE_BATCH_REPLY_MAX_BYTES:
    // replays are answered whatever their size and count first; new claims get what is left. A
    // task won past that stays queued, and is given back below with those of rejected polls.
    const budget = new AcquireReplyBudget(spent?.bytes ?? options.replyBytesUsed ?? 0);
    for (const { index, cursor, command } of replays) {
      const task = cursor.assignment
        ? (replayTasks.get(
            taskKey(command.scope.tenant_id, command.scope.namespace, cursor.assignment.task_id),
          ) ?? null)
        : null;
      const reply = replayPoll(cursor, task, slotAttempt(command, cursor), decidedAt);
      budget.count(reply);
      results[index] = { ok: true, value: { reply, recorded: true } };
    }

    const answerEmpty = (index: number, command: AcquireCommand) => {
      const empty = emptyPoll(command);
      if (options.recordEmpty) {
        changes.cursors.set(slotKey(command), scopedCursor(empty.cursor, command.scope));
      }
      results[index] = { ok: true, value: { reply: empty.reply, recorded: options.recordEmpty } };
    };
    for (const [group, polls] of fresh) {
      const queue = winners.get(group) ?? [];
      const passedOver: TaskRow[] = [];
      for (const { index, command } of polls) {
        let picked = queue.shift();
        for (; picked !== undefined; picked = queue.shift()) {
          const claim = claimTask(
            picked,
            command,
            decidedAt,
            { attempt_id: newId('attempt'), lease_id: newId('lease') },
            this.config,
          );
          // Too large beside those admitted: a smaller task may still fit this poll.
          if (!budget.admits(claim.reply)) {
            passedOver.push(picked);
            continue;
          }
          changes.task(picked, claim.task);
          changes.newAttempts.push(claim.attempt);
          changes.history.push(...claim.history);
          changes.cursors.set(slotKey(command), scopedCursor(claim.cursor, command.scope));
          results[index] = { ok: true, value: { reply: claim.reply, recorded: true } };
          break;
        }
        if (picked === undefined) answerEmpty(index, command);
      }
      // Won for a poll whose session expired meanwhile, or past the reply budget: still queued,
      // its key slot given back.
      for (const unused of [...queue, ...passedOver]) {
        addRelease(changes.releases, unused);
        changes.hint(queueHint(unused));
      }
    }
    // A probe that claimed nothing parks next, and nothing NOTIFYs when a delayed task or a
    // retry comes due: it learns when its queue's next task does (AcquireOutcome.nextDue). Only
    // such probes ask — a claim that found work, or a poll answered now, never does — and the
    // read travels with the COMMIT (sent before it, in the same turn), no round trip of its own.
    const answeredEmpty = (polls: readonly { index: number }[]) =>
      polls.length > 0 &&
      polls.every(({ index }) => {
        const result = results[index];
        return result?.ok === true && result.value.reply.disposition === 'empty';
      });
    const parking = options.recordEmpty ? [] : [...fresh].filter(([, p]) => answeredEmpty(p));
    const dueReads = pipelined(
      parking.map(([group]) => {
        const { first } = queues.get(group) as { first: AcquireCommand };
        return selectNextDue(tx, first.scope, first.queue, now, this.offset());
      }),
    );
    // Its failure aborts the transaction: the COMMIT below fails, and that failure is thrown.
    dueReads.catch(() => {});
    await this.flush(tx, changes, finish);
    const due = await dueReads;
    parking.forEach(([, polls], k) => {
      const nextDue = due[k];
      if (nextDue === undefined) return;
      for (const { index } of polls) {
        const result = results[index];
        if (result?.ok) result.value = { ...result.value, nextDue };
      }
    });
    if (spent !== undefined) spent.bytes = budget.used;
    return results.map((r) => r ?? { ok: false, error: unavailable(new Error('unanswered poll')) });
  }

  /**
   * Up to `need` claimable tasks of the command's queue, locked, each holding its concurrency
   * slot, taken from `offered` (the first-round select's rows, in claim order). A task whose key
   * filled up between the select and the slot update is passed over and the select runs again
   * past it, while a round serves a poll (a backlog grouped by key meets one key per round: a
   * round of `need` rows of key `a` wins one and is refused the rest by its own slot) or up to
   * three rounds that serve none (contention on one key is bounded by its limit, and the next
   * poll finds the rest), and while the rounds have examined fewer than
   * {@link CLAIM_ROWS_PER_POLL} rows per poll (each examined row is locked: the work stays
   * linear in the polls). `surplus` is a row the claim locked and leaves unwritten: beyond
   * `need`, available or submitted only after `now` (the select read store time, and the commits,
   * a little later than the claim's `now`), refused by its key without waiting, or refused in a
   * last round that left polls unserved — eligible tasks past it may remain unexamined. Its
   * queue is hinted at commit, so a poll that parked meanwhile (or this one, parking) looks again
   * instead of waiting for the rescan. `at`: store time after the last key lock was granted
   * (`now` when no key was taken).
   */
  private async claimable(
    tx: Tx,
    command: AcquireCommand,
    now: Timestamp,
    need: number,
    offered: readonly DbRow[],
    keyLocks: KeyLockOrder,
  ): Promise<{ won: TaskRow[]; surplus: TaskRow | undefined; at: Timestamp }> {
    const won: TaskRow[] = [];
    const excluded: string[] = [];
    let surplus: TaskRow | undefined;
    let at = now;
    let rows = offered;
    // A task refused by its key in the round that ended the loop, while polls went unserved.
    let refusedLast: TaskRow | undefined;
    let examined = 0;
    let fruitless = 0;
    for (let round = 0; ; round += 1) {
      refusedLast = undefined;
      if (round > 0) {
        rows = await selectClaimable(
          tx,
          command.scope,
          command.queue,
          { round: 'later', now, limit: need - won.length },
          excluded,
        );
      }
      if (rows.length === 0) break;
      examined += rows.length;
      const wonBefore = won.length;
      const tasks: TaskRow[] = [];
      let tooNew = false;
      for (const row of rows) {
        const task = taskFromDb(row, { data: jsonColumn(row.payload_data) });
        // A task submitted after `now` (each statement reads the commits before it, and one
        // with an `available_at` in the past passes the filter) did not exist when this poll
        // decides: claimed at `now`, its history would go back in time. A later poll takes it.
        const existed = task.available_at <= now && task.submitted_at <= now;
        if (existed && tasks.length < need - won.length) tasks.push(task);
        else {
          surplus = task;
          if (!existed) {
            // It took a place of the select's LIMIT: the next round looks past it.
            excluded.push(task.task_id);
            tooNew = true;
          }
        }
      }
      const keyed = tasks
        .filter((t) => t.concurrency_key !== null)
        .map((task) => ({ task, lock: concurrencyKeyOf(task) }))
        .sort((a, b) => compareText(a.lock, b.lock));
      const refused = new Set<string>();
      for (const { task, lock } of keyed) {
        // A key below one this transaction holds cannot be waited for: that would lock out of
        // order, and two claims doing so deadlock (PostgreSQL aborts one). Taken without waiting
        // it closes no cycle — every wait is still upward — so it is taken if its row is free
        // now; left for a later poll, the task was a wrong `empty` for this one (DESIGN §5: the
        // best eligible task; §7.1: a grouped poll answered as alone).
        if (!keyLocks.allows(lock)) {
          const slot = await takeConcurrencySlotNoWait(
            tx,
            command.scope,
            task.concurrency_key as string,
            task.concurrency_limit ?? 1,
          );
          if (slot.taken) {
            keyLocks.took(lock);
            at = Math.max(at, slot.now + this.offset());
          } else {
            refused.add(task.task_id);
            surplus = task;
          }
          continue;
        }
        const slot = await takeConcurrencySlot(
          tx,
          command.scope,
          task.concurrency_key as string,
          task.concurrency_limit ?? 1,
        );
        keyLocks.took(lock);
        at = Math.max(at, slot.now + this.offset());
        if (!slot.taken) refused.add(task.task_id);
      }
      for (const task of tasks) {
        excluded.push(task.task_id);
        if (!refused.has(task.task_id)) won.push(task);
        else refusedLast = task;
      }
      // Refusals leave polls unserved: another round past the refused tasks, within bounds.
      if (refused.size === 0 && !tooNew) break;
      if (won.length === wonBefore) fruitless += 1;
      if (fruitless >= 3 || examined >= CLAIM_ROWS_PER_POLL * need) break;
    }
    // Rounds ran out on refusals with polls unserved: an eligible task past the refused ones may
    // be left for a later poll, and nothing else would wake one parked meanwhile.
    if (refusedLast !== undefined && won.length < need) surplus ??= refusedLast;
    return { won: won.sort(claimOrder), surplus, at };
  }

  // ---- renew / settle / confirm -------------------------------------------------------------

  async renew(command: RenewCommand): Promise<Authority> {
    return this.single(
      command,
      (tx, items, finish) => this.renewTx(tx, items, finish),
      RENEW_POINT,
    );
  }

  async renewBatch(commands: readonly RenewCommand[]): Promise<ItemResult<Authority>[]> {
    return this.batch(
      commands,
      (tx, items, finish) => this.renewTx(tx, items, finish),
      RENEW_POINT,
    );
  }

  private renewTx(
    tx: Tx,
    commands: readonly RenewCommand[],
    finish: Finish,
  ): Promise<ItemResult<Authority>[]> {
    return this.ownerSteps(
      tx,
      finish,
      commands,
      (c) => c.owner,
      'renew',
      (task, attempt, c, now) => renewLease(task, attempt, c, now, this.config),
    );
  }

  async settle(command: SettleCommand): Promise<SettleReply> {
    return this.single(
      command,
      (tx, items, finish) => this.settleTx(tx, items, finish),
      SETTLE_POINT,
    );
  }

  async settleBatch(commands: readonly SettleCommand[]): Promise<ItemResult<SettleReply>[]> {
    return this.batch(
      commands,
      (tx, items, finish) => this.settleTx(tx, items, finish),
      SETTLE_POINT,
    );
  }

  async handBackBatch(commands: readonly SettleCommand[]): Promise<ItemResult<SettleReply>[]> {
    return this.batch(
      commands,
      (tx, items, finish) => this.settleTx(tx, items, finish, handBackAttempt),
      SETTLE_POINT,
    );
  }

  private settleTx(
    tx: Tx,
    commands: readonly SettleCommand[],
    finish: Finish,
    step: typeof settleAttempt = settleAttempt,
  ): Promise<ItemResult<SettleReply>[]> {
    return this.ownerSteps(
      tx,
      finish,
      commands,
      (c) => c.owner,
      'full',
      (task, attempt, c, now) => step(task, attempt, c, now, this.config),
    );
  }

  async confirmQuiescence(owner: LeaseOwner): Promise<TaskState> {
    return this.single(
      owner,
      (tx, items, finish) =>
        this.ownerSteps(
          tx,
          finish,
          items,
          (o) => o,
          'full',
          (task, attempt, o, now) => confirmQuiescence(task, attempt, o, now),
        ),
      QUIESCENCE_POINT,
    );
  }

  /**
   * The shape shared by renew, settle and confirm: lock the owners' tasks (primary-key order),
   * read their attempts, apply each item's transition in order against the state left by the
   * items before it, and write the changed rows once.
   */
  private async ownerSteps<C, R>(
    tx: Tx,
    finish: Finish,
    commands: readonly C[],
    ownerOf: (command: C) => LeaseOwner,
    shape: 'renew' | 'full',
    step: (
      task: TaskRow | null,
      attempt: AttemptRow | null,
      command: C,
      now: Timestamp,
    ) => SideResult<R>,
  ): Promise<ItemResult<R>[]> {
    const owners = commands.map(ownerOf);
    const tasks = new Map<string, TaskRow>();
    // Store time is read with the attempts, after the task locks were granted: a step that
    // waited for a lock decides at the time it acts. Both statements are sent at once
    // (pipelined): PostgreSQL runs the second only when the first is done, so the order holds
    // with one round trip instead of two.
    const [locked, loaded] = await pipelined([
      lockTasks(tx, uniqueBy(owners.map(ownerTaskRef), taskKeyOf)),
      loadAttemptsAt(tx, uniqueBy(owners.map(ownerAttemptRef), attemptKeyOf)),
    ]);
    const changes = new Changes();
    for (const row of locked) {
      const task = taskFromDb(row);
      tasks.set(taskKeyOf(task), task);
      // A queued task here is one a stale owner names (its lease was recovered): no step changes
      // it, but its row was locked, and a poll that skipped it meanwhile may have parked.
      if (task.state === 'queued') changes.hint(queueHint(task));
    }
    const now = loaded.now + this.offset();
    const attempts = new Map<string, AttemptRow>();
    for (const row of loaded.rows) {
      const attempt = attemptFromDb(row);
      attempts.set(attemptKeyOf(attempt), attempt);
    }
    const results: ItemResult<R>[] = [];
    commands.forEach((command, index) => {
      const owner = owners[index] as LeaseOwner;
      const tk = taskKeyOf(ownerTaskRef(owner));
      const ak = attemptKeyOf(ownerAttemptRef(owner));
      const task = tasks.get(tk) ?? null;
      const attempt = attempts.get(ak) ?? null;
      try {
        const result = step(task, attempt, command, now);
        if (result.changed && task !== null) {
          changes.task(task, result.task);
          tasks.set(tk, result.task);
          attempts.set(ak, result.attempt);
          (shape === 'renew' ? changes.renewed : changes.updated).set(ak, result.attempt);
          changes.history.push(...result.history);
        }
        results.push({ ok: true, value: result.reply });
      } catch (error) {
        if (!(error instanceof ContractError)) throw error;
        results.push({ ok: false, error });
      }
    });
    await this.flush(tx, changes, finish);
    return results;
  }

  // ---- cancel -------------------------------------------------------------------------------

  async cancel(scope: Scope, taskId: string): Promise<TaskState> {
    return this.transact(
      async (tx, _at, finish) => {
        const [row] = await lockTasks(tx, [taskRefOf(scope, taskId)]);
        if (row === undefined) throw taskNotFound(taskId);
        const now = await this.time(tx);
        const task = taskFromDb(row);
        const result = cancelTask(task, now);
        if (result.changed) {
          const changes = new Changes();
          changes.task(task, result.task);
          changes.history.push(...result.history);
          await this.flush(tx, changes, finish);
        }
        return result.reply;
      },
      undefined,
      CANCEL_POINT,
    );
  }

  // ---- reads --------------------------------------------------------------------------------

  /**
   * The task with its payload, from one statement (one snapshot). The payload's task id is
   * compared in its own collation, not `tasks.task_id`'s `C`, or the generic plan cannot probe
   * its key and reads every payload (see `selectClaimable`).
   */
  private async readTask(db: Tx, scope: Scope, taskId: string): Promise<TaskRow> {
    const [row] = await db`
      select t.*, p.data as payload_data, p.output as payload_output
      from tasks t
      left join task_payloads p on p.tenant_id = t.tenant_id and p.namespace = t.namespace
        and p.task_id = t.task_id collate "default"
      where t.tenant_id = ${scope.tenant_id} and t.namespace = ${scope.namespace}
        and t.task_id = ${taskId}`;
    if (row === undefined) throw taskNotFound(taskId);
    return taskFromDb(row, {
      data: jsonColumn(row.payload_data),
      output: jsonColumn(row.payload_output),
    });
  }

  async status(scope: Scope, taskId: string): Promise<TaskStatus> {
    return this.transact(async (tx) => taskStatus(await this.readTask(tx, scope, taskId)));
  }

  async result(scope: Scope, taskId: string): Promise<TaskResult> {
    return this.transact(async (tx) => taskResult(await this.readTask(tx, scope, taskId)));
  }

  async inspect(scope: Scope, taskId: string): Promise<TaskSnapshot> {
    return this.transact(async (tx) => taskSnapshot(await this.readTask(tx, scope, taskId)));
  }

  async inspectAttempt(scope: Scope, taskId: string, attemptId: string): Promise<AttemptSnapshot> {
    return this.transact(async (tx) => {
      const task = await this.readTask(tx, scope, taskId);
      const [row] = await loadAttempts(tx, [attemptRefOf(scope, taskId, attemptId)]);
      if (row === undefined) {
        throw new ContractError(
          'not_found',
          `attempt ${attemptId} of task ${taskId} was not found`,
        );
      }
      return attemptSnapshot(task, attemptFromDb(row));
    }, 'isolation level repeatable read read only');
  }

  async history(
    scope: Scope,
    taskId: string,
    afterSequence: number,
  ): Promise<RecordedHistoryEvent[]> {
    return this.transact(async (tx) => {
      const [task] = await tx`
        select 1 from tasks where tenant_id = ${scope.tenant_id}
          and namespace = ${scope.namespace} and task_id = ${taskId}`;
      if (task === undefined) throw taskNotFound(taskId);
      // `sequence` is an `integer` column, but a caller may ask for any sequence in 0..2^53−1
      // (DESIGN §4.1): an untyped parameter would be inferred as `integer` and fail beyond
      // 2^31−1 (a 5xx by content alone). As `bigint` it compares across types in the same
      // btree operator family, so the primary key still serves the range.
      const rows = await tx`
        select * from task_history
        where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}
          and task_id = ${taskId} and sequence > ${afterSequence}::bigint
        order by sequence
        limit ${HISTORY_PAGE_LIMIT}`;
      return rows.map((row) =>
        recordedHistoryEvent({
          tenant_id: String(row.tenant_id),
          namespace: String(row.namespace),
          task_id: String(row.task_id),
          sequence: num(row.sequence),
          attempt_id: row.attempt_id === null ? null : String(row.attempt_id),
          at: num(row.at),
          reason: row.reason as HistoryRow['reason'],
        }),
      );
    }, 'isolation level repeatable read read only');
  }

  async listTasks(scope: Scope, query: TaskListQuery): Promise<TaskPage> {
    const filters = query.filters;
    const position =
      query.cursor === undefined || query.cursor === null
        ? null
        : decodeTaskCursor(query.cursor, scope, filters);
    const limit = query.limit ?? TASK_LIST_DEFAULT_LIMIT;
    if (!Number.isSafeInteger(limit) || limit < 1 || limit > TASK_LIST_MAX_LIMIT) {
      throw new ContractError('invalid_input', `$.limit must be 1..${TASK_LIST_MAX_LIMIT}`, {
        reason: 'schema',
        path: '$.limit',
      });
    }
    return this.transact(async (tx) => {
      const sql = tx;
      const empty = sql``;
      const rows = await sql`
        select * from tasks
        where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}
          ${filters.state != null ? sql`and state = ${filters.state}` : empty}
          ${filters.queue != null ? sql`and queue = ${filters.queue}` : empty}
          ${filters.program != null ? sql`and program->>'name' = ${filters.program}` : empty}
          ${filters.labels != null ? sql`and labels @> ${JSON.stringify(filters.labels)}::text::jsonb` : empty}
          ${filters.submitted_from != null ? sql`and submitted_at >= ${filters.submitted_from}` : empty}
          ${filters.submitted_until != null ? sql`and submitted_at < ${filters.submitted_until}` : empty}
          ${filters.workflow_id != null ? sql`and workflow_id = ${filters.workflow_id}` : empty}
          ${
            position !== null
              ? sql`and (submitted_at, task_id) < (${position.submitted_at}, ${position.task_id})`
              : empty
          }
        order by submitted_at desc nulls last, task_id desc nulls last
        limit ${limit + 1}`;
      // The row beyond the page tells whether another page follows.
      return taskPage(
        scope,
        filters,
        rows.map((row) => taskFromDb(row)),
        limit,
      );
    });
  }

  // ---- metrics ------------------------------------------------------------------------------

  async queueDepths(limit: number): Promise<QueueDepth[]> {
    if (!Number.isSafeInteger(limit) || limit < 1) {
      throw new RangeError('queueDepths limit must be a positive integer');
    }
    // Through `transact` for its lost-connection handling; read only, as it writes nothing.
    const rows = await this.transact((tx) => queueDepths(tx, limit), 'read only');
    return rows.map((row) => ({
      queue: row.queue === null ? null : String(row.queue),
      state: row.state === 'active' ? 'active' : 'queued',
      count: num(row.count),
    }));
  }

  async analyzeGrowingTables(): Promise<string[]> {
    try {
      const tables = await tablesNeedingStatistics(this.sql, STORE_TABLES);
      await analyzeTables(this.sql, tables);
      return tables;
    } catch (error) {
      throw unavailable(error);
    }
  }

  // ---- recovery -----------------------------------------------------------------------------

  async recoverExpiredLeases(limit: number = MAX_RECOVERY_BATCH): Promise<RecoveryProgress> {
    if (!Number.isSafeInteger(limit) || limit < 1) {
      throw new ContractError('invalid_input', 'recovery limit must be a positive integer', {
        reason: 'schema',
        path: '$.limit',
      });
    }
    // One bounded transaction: at most MAX_RECOVERY_BATCH leases per call (DESIGN §1.5).
    const bounded = Math.min(MAX_RECOVERY_BATCH, limit);
    return this.transact(
      async (tx, _at, finish) => {
        const expiredBy = await this.time(tx);
        // One row past the bound answers `has_more` exactly; it is locked until commit, not touched.
        const found = await lockExpiredLeases(tx, expiredBy, bounded + 1);
        const rows = found.slice(0, bounded);
        // Decided at the store time the rows were read, not `expiredBy`: a transition committed in
        // between (a cancel request, say) is seen, and what recovery records must come after it.
        const now = found.reduce(
          (at, row) => Math.max(at, num(row.read_at) + this.offset()),
          expiredBy,
        );
        const progress = startRecoveryProgress(rows.length, found.length > bounded);
        if (rows.length === 0) return progress;
        const tasks = rows.map((row) => taskFromDb(row));
        // Re-read the attempts under the task locks: the select's attempt rows are from its
        // snapshot, and a settle or renew may have committed just before the lock was granted.
        const refs = rows.map((row, i) => {
          const task = tasks[i] as TaskRow;
          return attemptRefOf(task, task.task_id, String(row.expired_attempt_id));
        });
        const attempts = new Map<string, AttemptRow>();
        for (const row of await loadAttempts(tx, refs)) {
          const attempt = attemptFromDb(row);
          attempts.set(attemptKeyOf(attempt), attempt);
        }
        const changes = new Changes();
        tasks.forEach((task, i) => {
          const attempt = attempts.get(attemptKeyOf(refs[i] as AttemptKeyRef));
          if (attempt === undefined) return;
          const result = recoverExpiredLease(task, attempt, now, this.config);
          countRecovery(progress, result);
          if (result === null) return; // a late settle or renew won the race
          changes.task(task, result.task);
          changes.updated.set(attemptKeyOf(attempt), result.attempt);
          changes.history.push(...result.history);
        });
        await this.flush(tx, changes, finish);
        return progress;
      },
      undefined,
      RECOVERY_POINT,
    );
  }

  // ---- completion subscriptions (DESIGN §8) --------------------------------------------------

  async subscribe(
    scope: Scope,
    taskId: string,
    command: CompletionSubscribeCommand,
  ): Promise<SubscribeOutcome> {
    const outcome = await this.transact(
      async (tx) => {
        // The task's row lock, as the terminal hook holds it: a subscription is either inserted
        // before a concurrent terminal transition (which then marks it due) or sees the task
        // terminal (and is due at once), never neither.
        const [row] = await lockTasks(tx, [taskRefOf(scope, taskId)]);
        if (row === undefined) throw taskNotFound(taskId);
        const now = await this.time(tx);
        const task = taskFromDb(row);
        const existing = (await loadSubscriptions(tx, task)).map((r) => subscriptionFromDb(r));
        const decided = refusalAsItem(() =>
          subscribeTask(task, existing, command, now, {
            subscription_id: newId('subscription'),
            event_id: newId('event'),
          }),
        );
        if (decided.ok && decided.value.created) await insertSubscription(tx, decided.value.row);
        await hintLockedQueued(tx, task);
        return decided;
      },
      undefined,
      SUBSCRIBE_POINT,
    );
    const { created, row } = itemValue(outcome);
    return { created, subscription: completionSubscription(row) };
  }

  async listSubscriptions(scope: Scope, taskId: string): Promise<CompletionSubscription[]> {
    return this.transact(async (tx) => {
      // Store time from the statement that read the rows: a clock read by a statement of its
      // own could follow a report committed after the rows' snapshot (listSubscriptionRows).
      const rows = await listSubscriptionRows(tx, taskRefOf(scope, taskId));
      const [first] = rows;
      if (first === undefined) throw taskNotFound(taskId);
      const now = num(first.store_now) + this.offset();
      // A lost last try is shown as the next lease will write it, without writing it here.
      return rows
        .filter((row) => row.subscription_id !== null)
        .map((row) => completionSubscription(expireLostTry(subscriptionFromDb(row), now)));
    }, 'read only');
  }

  async redeliver(
    scope: Scope,
    subscriptionId: string,
    command: CompletionRetryCommand,
  ): Promise<CompletionSubscription> {
    const outcome = await this.transact(
      async (tx) => {
        // Task first, then the delivery: the lock order of registration, the terminal hook and
        // retention, so none of them can deadlock with a redelivery.
        const [taskRow] = await lockSubscriptionTask(tx, scope, subscriptionId);
        if (taskRow === undefined) throw subscriptionNotFound(subscriptionId);
        const [row] = await lockSubscription(tx, scope, subscriptionId);
        if (row === undefined) throw subscriptionNotFound(subscriptionId);
        const now = await this.time(tx);
        const decided = refusalAsItem(() =>
          redeliverSubscription(subscriptionFromDb(row), command, now),
        );
        if (decided.ok && decided.value.changed) await writeDelivery(tx, decided.value.row);
        await hintLockedQueued(tx, taskRow);
        return decided;
      },
      undefined,
      REDELIVER_POINT,
    );
    return completionSubscription(itemValue(outcome).row);
  }

  async leaseDeliveries(
    limit: number,
    leaseMs: number,
    only?: DeliveryLeaseFilter,
  ): Promise<CompletionLease[]> {
    requireIntegerArgument(limit, 1, MAX_COMPLETION_BATCH, '$.limit');
    requireIntegerArgument(leaseMs, 1, Number.MAX_SAFE_INTEGER, '$.lease_ms');
    if (only !== undefined) {
      const after = only.otherDestinationsAfterMs;
      requireIntegerArgument(after, 0, Number.MAX_SAFE_INTEGER, '$.other_destinations_after_ms');
    }
    return this.transact(
      (tx) => leaseDeliveryRows(tx, this.offset(), limit, leaseMs, only),
      undefined,
      DELIVERY_LEASE_POINT,
    );
  }

  async reportDelivery(report: DeliveryReport): Promise<boolean> {
    const [changed] = await this.reportDeliveries([report]);
    return changed === true;
  }

  async reportDeliveries(reports: readonly DeliveryReport[]): Promise<boolean[]> {
    if (reports.length === 0) return [];
    const outcomes = reports.map((report) => ({
      scope: report.scope,
      subscription_id: report.subscription_id,
      generation: report.generation,
      attempt: report.attempt,
      next: report.next,
      status_code: report.status_code ?? null,
      error: report.error === undefined ? null : fitText(report.error, MESSAGE_MAX_BYTES),
    }));
    return this.transact((tx) => reportDeliveryRows(tx, this.offset(), outcomes));
  }

  async dueBacklog(limit: number): Promise<number> {
    requireIntegerArgument(limit, 1, Number.MAX_SAFE_INTEGER, '$.limit');
    return this.transact((tx) => countDueBacklog(tx, this.offset(), limit), 'read only');
  }

  // ---- retention (seed `RetentionPolicy`, `RetentionProgress`) -------------------------------

  /** A namespace's policy: its own row, or this store's default (`terminalRetentionMs`). */
  private policyView(row: RetentionPolicyRow | undefined): RetentionPolicy {
    return retentionPolicyView(row, this.config.terminalRetentionMs);
  }

  async retentionPolicy(scope: Scope): Promise<RetentionPolicy> {
    return this.transact(
      async (tx) => this.policyView((await loadPolicyAt(tx, scope, this.offset())).policy),
      'read only',
    );
  }

  async setRetentionPolicy(
    scope: Scope,
    command: SetRetentionPolicyCommand,
  ): Promise<RetentionPolicy> {
    requireIntegerArgument(
      command.retention_ms,
      MIN_RETENTION_MS,
      MAX_RETENTION_MS,
      '$.retention_ms',
    );
    return this.transact(
      async (tx) => {
        // The row is not locked: the upsert keeps the highest floor, so concurrent setters cannot
        // lower it whatever order they commit in.
        const at = await loadPolicyAt(tx, scope, this.offset());
        const floor = retiringFloor(
          at.now,
          this.policyView(at.policy).retention_ms,
          at.retiringBefore,
        );
        return this.policyView(await upsertPolicy(tx, scope, command.retention_ms, at.now, floor));
      },
      undefined,
      RETENTION_POLICY_POINT,
    );
  }

  async previewRetention(
    scope: Scope,
    limit: number = MAX_RETENTION_BATCH,
  ): Promise<RetentionPreview> {
    requireIntegerArgument(limit, 1, MAX_RETENTION_BATCH, '$.limit');
    return this.transact(async (tx) => {
      const at = await loadPolicyAt(tx, scope, this.offset());
      const policy = this.policyView(at.policy);
      const cutoff = retentionCutoff(at.now, policy.retention_ms, at.retiringBefore);
      // One past the limit answers `truncated` exactly.
      const found = await countCandidates(tx, scope, cutoff, limit + 1);
      const preview: RetentionPreview = {
        retention_ms: policy.retention_ms,
        as_of: at.now,
        cutoff,
        candidates: Math.min(found.count, limit),
        truncated: found.count > limit,
      };
      if (found.oldest !== null) preview.oldest_terminal_at = found.oldest;
      return preview;
    }, 'isolation level repeatable read read only');
  }

  async retentionScopes(after: Scope | undefined, limit: number): Promise<Scope[]> {
    requireIntegerArgument(limit, 1, MAX_RETENTION_BATCH, '$.limit');
    return this.transact(async (tx) => {
      // No namespace's cutoff is later than `now − MIN_RETENTION_MS` (a floor is some earlier
      // policy's cutoff): sessions expired after that cannot be collected anywhere yet.
      const expiredBefore = retentionCutoff(await this.time(tx), MIN_RETENTION_MS);
      return selectRetentionScopes(tx, after, limit, expiredBefore);
    }, 'read only');
  }

  async dueRetentionScopes(after: Scope | undefined, limit: number): Promise<Scope[]> {
    requireIntegerArgument(limit, 1, MAX_RETENTION_BATCH, '$.limit');
    return this.transact(async (tx) => {
      const now = await this.time(tx);
      return selectDueRetentionScopes(tx, after, limit, now, this.config.terminalRetentionMs);
    }, 'read only');
  }

  async collectRetired(
    scope: Scope,
    limit: number = MAX_RETENTION_BATCH,
  ): Promise<RetentionProgress> {
    requireIntegerArgument(limit, 1, MAX_RETENTION_BATCH, '$.limit');
    // One bounded transaction (seed `RetentionProgress`): at most `limit` tasks and `limit`
    // sessions, under a short local lock_timeout, skipping whatever another transaction holds.
    return this.transact(
      async (tx) => {
        const at = await loadPolicyAt(tx, scope, this.offset(), this.retentionLockTimeoutMs);
        const policy = this.policyView(at.policy);
        const cutoff = retentionCutoff(at.now, policy.retention_ms, at.retiringBefore);
        // Two statements: the second's snapshot is taken after the first's locks are held, so a
        // subscribe or redelivery that committed in between still protects its task.
        const locked = await lockRetiredTasks(tx, scope, cutoff, limit);
        const removed = await collectRetiredRows(tx, scope, cutoff, locked, limit);
        return {
          cutoff,
          tasks_removed: removed.tasks,
          attempts_removed: removed.attempts,
          history_removed: removed.history,
          subscriptions_removed: removed.subscriptions,
          sessions_removed: removed.sessions,
          // A full pass may have left more behind; a short one found everything it could.
          has_more: locked.length === limit || removed.sessions === limit,
        };
      },
      undefined,
      RETENTION_COLLECT_POINT,
    );
  }
}

/** The key of a scope's queue: polls of one queue share a claim select. */
function queueKey(scope: Scope, queue: string): string {
  return scopedKey(scope.tenant_id, scope.namespace, queue);
}

/** The key of a poll's consumer slot. */
function slotKey(command: AcquireCommand): string {
  const { scope, worker_session_id, consumer_id } = command;
  return scopedKey(scope.tenant_id, scope.namespace, `${worker_session_id}\u0000${consumer_id}`);
}

const CONNECTION_LOSS = new Set([
  'CONNECTION_CLOSED',
  'CONNECTION_DESTROYED',
  'CONNECTION_ENDED',
  'CONNECT_TIMEOUT',
  'ECONNRESET',
  'EPIPE',
  '57P01', // admin_shutdown: pg_terminate_backend, server shutdown
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now
]);

/**
 * Whether a failure means the connection is gone (rather than the statement failing): the
 * driver's connection codes, SQLSTATE class 08 (connection exception) and 57P0x (shutdown).
 */
function isConnectionLoss(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return (
    typeof code === 'string' &&
    (CONNECTION_LOSS.has(code) || code.startsWith('08') || code.startsWith('57P'))
  );
}

/** Failures after which a transaction may or may not have committed (see {@link outcomeUnknown}). */
const UNKNOWN_OUTCOMES = new WeakSet<ContractError>();

/**
 * `unavailable` for a failure that leaves the transaction's outcome unknown: the connection died
 * once COMMIT may have been sent, or the reply after COMMIT was lost (the `after_commit`
 * failpoint). A batch must not retry its items on another connection then (see `batch`).
 */
function outcomeUnknown(error: unknown): ContractError {
  const failure = unavailable(error);
  UNKNOWN_OUTCOMES.add(failure);
  return failure;
}

function hasUnknownOutcome(error: unknown): boolean {
  return error instanceof ContractError && UNKNOWN_OUTCOMES.has(error);
}

function asContractError(error: unknown): ContractError {
  return error instanceof ContractError ? error : unavailable(error);
}
