/**
 * A complete in-memory `TaskStore`, `CompletionStore` and `RetentionStore`,
 * built only from the core's pure transitions: every operation loads the rows
 * it needs, applies one transition and writes what the transition returned. JavaScript runs each
 * operation to completion between awaits, so an operation is as atomic as a
 * PostgreSQL transaction under the task's row lock. No lifecycle rule lives
 * here; the store only decides what a database would: which rows to load,
 * which queued task is the best eligible one, and how to page.
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
  HISTORY_PAGE_LIMIT,
  type LeaseOwner,
  MAX_COMPLETION_BATCH,
  MAX_RECOVERY_BATCH,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
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
  type TaskFilters,
  type TaskListQuery,
  type TaskPage,
  type TaskPosition,
  type TaskResult,
  type TaskSnapshot,
  type TaskState,
  type TaskStatus,
  type Timestamp,
  type WorkerSession,
} from '@ledgence/contracts';
import { AcquireReplyBudget, claimTask, classifyPoll, emptyPoll, replayPoll } from '../acquire.js';
import { cancelTask } from '../cancel.js';
import {
  completionSubscription,
  type DeliveryReport,
  deliveryLeasable,
  expireLostTry,
  isTerminalState,
  leaseDelivery,
  markDue,
  redeliverSubscription,
  reportDelivery as reportDeliveryOf,
  subscribeTask,
} from '../completion.js';
import { type LifecycleConfig, lifecycleConfig } from '../config.js';
import { newId } from '../ids.js';
import { requireIntegerArgument, subscriptionNotFound, taskNotFound } from '../not-found.js';
import type {
  AcquireOutcome,
  AcquireStoreOptions,
  CompletionLease,
  CompletionStore,
  ItemResult,
  RetentionStore,
  SubmitOutcome,
  SubscribeOutcome,
  TaskStore,
} from '../ports.js';
import { countRecovery, recoverExpiredLease, startRecoveryProgress } from '../recovery.js';
import { renewLease } from '../renew.js';
import {
  retentionCandidate,
  retentionCutoff,
  retentionPolicyView,
  retired,
  retiringFloor,
} from '../retention.js';
import type {
  AttemptRow,
  CursorRow,
  HistoryRow,
  RetentionPolicyRow,
  SessionRow,
  SubscriptionRow,
  TaskRow,
} from '../rows.js';
import {
  extendSession as extendSessionRow,
  openSession as openSessionRow,
  requireLiveSession,
  workerSession,
} from '../session.js';
import {
  confirmQuiescence as confirmQuiescenceOf,
  handBackAttempt,
  settleAttempt,
} from '../settle.js';
import { submitTask } from '../submit.js';
import {
  attemptSnapshot,
  recordedHistoryEvent,
  taskPage,
  taskResult,
  taskSnapshot,
  taskStatus,
} from '../views.js';

/** Options of {@link createMemoryTaskStore}. */
export interface MemoryTaskStoreOptions {
  /** Lease timings; unset fields take the contract defaults (DESIGN §12). */
  config?: Partial<LifecycleConfig>;
  /**
   * The store's clock in UTC ms (default `Date.now`). A test passes a
   * controllable clock to make every timestamp exact; {@link MemoryTaskStore.advance}
   * moves whichever clock is used forward.
   */
  now?: () => Timestamp;
}

/**
 * An in-memory {@link TaskStore}, {@link CompletionStore} and
 * {@link RetentionStore} whose clock a test can move forward.
 */
export interface MemoryTaskStore extends TaskStore, CompletionStore, RetentionStore {
  /** The lease timings the store applies. */
  readonly config: LifecycleConfig;
  /**
   * Moves store time forward by `ms` (an offset added to the clock), so
   * leases, sessions and retry delays expire without waiting.
   */
  advance(ms: number): void;
}

/** Map keys: JSON arrays cannot collide the way joined strings could. */
const keyOf = (...parts: readonly (string | number)[]): string => JSON.stringify(parts);
const scopeKey = (scope: Scope, ...rest: readonly (string | number)[]): string =>
  keyOf(scope.tenant_id, scope.namespace, ...rest);

/** PostgreSQL compares `text` under the C collation by UTF-8 bytes; so does this. */
function compareBytes(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

/** A batch limit: `1..max`. */
const requireLimit = (limit: number, max: number): number =>
  requireIntegerArgument(limit, 1, max, '$.limit');

/** Oldest first: (created_at, subscription_id bytes), the listing order of a task's subscriptions. */
function subscriptionOrder(a: SubscriptionRow, b: SubscriptionRow): number {
  return a.created_at - b.created_at || compareBytes(a.subscription_id, b.subscription_id);
}

/** (tenant, namespace) in UTF-8 byte order: the retention walk's order. */
function scopeOrder(a: Scope, b: Scope): number {
  return compareBytes(a.tenant_id, b.tenant_id) || compareBytes(a.namespace, b.namespace);
}

function sameScope(row: { tenant_id: string; namespace: string }, scope: Scope): boolean {
  return row.tenant_id === scope.tenant_id && row.namespace === scope.namespace;
}

/** Whether a task matches every given filter (DESIGN §4.1 Filters). */
function matches(task: TaskRow, filters: TaskFilters): boolean {
  if (filters.state != null && task.state !== filters.state) return false;
  if (filters.queue != null && task.queue !== filters.queue) return false;
  if (filters.program != null && task.program.name !== filters.program) return false;
  if (filters.labels != null) {
    for (const [key, value] of Object.entries(filters.labels)) {
      if (task.labels[key] !== value) return false;
    }
  }
  if (filters.submitted_from != null && task.submitted_at < filters.submitted_from) return false;
  if (filters.submitted_until != null && task.submitted_at >= filters.submitted_until) {
    return false;
  }
  // No task belongs to a workflow until workflows land (DESIGN §9), so a
  // workflow filter matches nothing rather than being ignored.
  if (filters.workflow_id != null) return false;
  return true;
}

/** Descending (submitted_at, task_id bytes): the listing's keyset order. */
function listingOrder(a: TaskRow, b: TaskRow): number {
  return b.submitted_at - a.submitted_at || compareBytes(b.task_id, a.task_id);
}

/** Whether `task` comes strictly after `position` in the listing order. */
function after(task: TaskRow, position: TaskPosition): boolean {
  return (
    task.submitted_at < position.submitted_at ||
    (task.submitted_at === position.submitted_at &&
      compareBytes(task.task_id, position.task_id) < 0)
  );
}

/** Acquisition order: priority desc, then available_at, then task_id (DESIGN §5 Acquire). */
function acquisitionOrder(a: TaskRow, b: TaskRow): number {
  return (
    b.priority - a.priority || a.available_at - b.available_at || compareBytes(a.task_id, b.task_id)
  );
}

/** Runs each item on its own: a rejection answers that item and never its neighbours. */
async function eachItem<C, R>(
  commands: readonly C[],
  run: (command: C) => Promise<R>,
): Promise<ItemResult<R>[]> {
  const results: ItemResult<R>[] = [];
  for (const command of commands) {
    try {
      results.push({ ok: true, value: await run(command) });
    } catch (error) {
      // Only expected rejections are item answers; anything else is a bug
      // (or, in a real store, `unavailable`) and must not be swallowed.
      if (!(error instanceof ContractError)) throw error;
      results.push({ ok: false, error });
    }
  }
  return results;
}

/**
 * A complete in-memory {@link TaskStore} made of the core's pure transitions:
 * the fast reference for unit tests and for the HTTP layer's tests. Replies
 * are copies, so a caller mutating one cannot change the store.
 *
 * @example
 * ```ts
 * const store = createMemoryTaskStore({ config: { leaseDurationMs: 1_000 } });
 * await store.submit(command);
 * store.advance(1_001); // every lease granted so far has now expired
 * ```
 */
export function createMemoryTaskStore(options: MemoryTaskStoreOptions = {}): MemoryTaskStore {
  const config = lifecycleConfig(options.config);
  const baseClock = options.now ?? Date.now;
  let offset = 0;
  const clock = (): Timestamp => baseClock() + offset;

  const tasks = new Map<string, TaskRow>();
  const taskByIdempotencyKey = new Map<string, string>();
  const attempts = new Map<string, AttemptRow>();
  const sessions = new Map<string, SessionRow>();
  const cursors = new Map<string, CursorRow>();
  const histories = new Map<string, HistoryRow[]>();
  /** By `scopeKey(scope, subscription_id)`: a subscription id is only found in its own scope. */
  const subscriptions = new Map<string, SubscriptionRow>();
  /** Task key → the keys of its subscriptions, the index the terminal hook reads. */
  const subscriptionsOfTask = new Map<string, Set<string>>();
  /** By `scopeKey(scope)`: a namespace's own retention policy. */
  const policies = new Map<string, RetentionPolicyRow>();
  /** Each namespace's retiring floor (core `retiringFloor`), as the PostgreSQL store keeps it. */
  const retiringFloors = new Map<string, Timestamp>();

  // Rows are copied in and out, as a database would serialise them: neither
  // a transition's caller nor a test can reach into stored state.
  const copy = <T>(value: T): T => structuredClone(value);

  const taskKey = (scope: Scope, taskId: string): string => scopeKey(scope, taskId);
  const attemptKey = (scope: Scope, taskId: string, attemptId: string): string =>
    scopeKey(scope, taskId, attemptId);
  const cursorKey = (sessionId: string, consumerId: number): string => keyOf(sessionId, consumerId);
  const scopeOf = (row: { tenant_id: string; namespace: string }): Scope => ({
    tenant_id: row.tenant_id,
    namespace: row.namespace,
  });

  const loadTask = (scope: Scope, taskId: string): TaskRow | null => {
    const task = tasks.get(taskKey(scope, taskId));
    return task === undefined ? null : copy(task);
  };
  const requireTask = (scope: Scope, taskId: string): TaskRow => {
    const task = loadTask(scope, taskId);
    if (task === null) throw taskNotFound(taskId);
    return task;
  };
  /** A task's subscriptions (copies), oldest first. */
  const loadSubscriptions = (scope: Scope, taskId: string): SubscriptionRow[] => {
    const keys = subscriptionsOfTask.get(taskKey(scope, taskId)) ?? new Set<string>();
    const rows: SubscriptionRow[] = [];
    for (const key of keys) {
      const row = subscriptions.get(key);
      if (row !== undefined) rows.push(copy(row));
    }
    return rows.sort(subscriptionOrder);
  };
  const writeSubscription = (row: SubscriptionRow): void => {
    const key = scopeKey(scopeOf(row), row.subscription_id);
    subscriptions.set(key, copy(row));
    const owner = taskKey(scopeOf(row), row.task_id);
    const keys = subscriptionsOfTask.get(owner) ?? new Set<string>();
    keys.add(key);
    subscriptionsOfTask.set(owner, keys);
  };
  const loadAttempt = (scope: Scope, taskId: string, attemptId: string): AttemptRow | null => {
    const attempt = attempts.get(attemptKey(scope, taskId, attemptId));
    return attempt === undefined ? null : copy(attempt);
  };
  const loadOwned = (owner: LeaseOwner): { task: TaskRow | null; attempt: AttemptRow | null } => ({
    task: loadTask(owner.scope, owner.task_id),
    attempt: loadAttempt(owner.scope, owner.task_id, owner.attempt_id),
  });

  /**
   * Writes what one transition returned, as one unit. Every task row goes
   * through here, so this is also the one place of the terminal hook (DESIGN
   * §8): a task row that turns terminal makes the task's waiting
   * subscriptions due in the same synchronous step, whichever transition
   * (settle, confirmation, cancel, recovery) got it there. The hook's time is
   * the row's `terminal_at`, which the transition set to its own `now`.
   */
  const write = (rows: {
    task?: TaskRow;
    attempt?: AttemptRow;
    history?: readonly HistoryRow[];
    cursor?: CursorRow;
  }): void => {
    if (rows.task !== undefined) {
      const task = rows.task;
      const key = taskKey(scopeOf(task), task.task_id);
      const before = tasks.get(key);
      tasks.set(key, copy(task));
      const becameTerminal =
        isTerminalState(task.state) && (before === undefined || !isTerminalState(before.state));
      if (becameTerminal && task.terminal_at !== null) {
        for (const subscription of loadSubscriptions(scopeOf(task), task.task_id)) {
          writeSubscription(markDue(subscription, task.terminal_at));
        }
      }
    }
    if (rows.attempt !== undefined) {
      const attempt = rows.attempt;
      attempts.set(
        attemptKey(scopeOf(attempt), attempt.task_id, attempt.attempt_id),
        copy(attempt),
      );
    }
    for (const row of rows.history ?? []) {
      const key = taskKey(scopeOf(row), row.task_id);
      const list = histories.get(key) ?? [];
      list.push(copy(row));
      histories.set(key, list);
    }
    if (rows.cursor !== undefined) {
      const cursor = rows.cursor;
      cursors.set(cursorKey(cursor.worker_session_id, cursor.consumer_id), copy(cursor));
    }
  };

  /** The best eligible queued task on the poll's scope and queue, or null. */
  const selectEligible = (command: AcquireCommand, now: Timestamp): TaskRow | null => {
    const active = new Map<string, number>();
    const queued: TaskRow[] = [];
    for (const task of tasks.values()) {
      if (!sameScope(task, command.scope)) continue;
      // Concurrency keys span the whole scope, whatever the queue.
      if (task.state === 'active' && task.concurrency_key !== null) {
        active.set(task.concurrency_key, (active.get(task.concurrency_key) ?? 0) + 1);
      }
      if (task.state === 'queued' && task.queue === command.queue && task.available_at <= now) {
        queued.push(task);
      }
    }
    queued.sort(acquisitionOrder);
    const best = queued.find(
      (task) =>
        task.concurrency_key === null ||
        (active.get(task.concurrency_key) ?? 0) < (task.concurrency_limit ?? 1),
    );
    return best === undefined ? null : copy(best);
  };

  /**
   * The earliest `available_at` after `now` among the queue's queued tasks, whatever their
   * concurrency key: a due task held back is no due-time matter (the PostgreSQL store's
   * `selectNextDue`).
   */
  const nextDueAt = (command: AcquireCommand, now: Timestamp): Timestamp | undefined => {
    let earliest: Timestamp | undefined;
    for (const task of tasks.values()) {
      if (!sameScope(task, command.scope) || task.state !== 'queued') continue;
      if (task.queue !== command.queue || task.available_at <= now) continue;
      if (earliest === undefined || task.available_at < earliest) earliest = task.available_at;
    }
    return earliest;
  };

  const submit = async (command: SubmitCommand): Promise<SubmitOutcome> => {
    const now = clock();
    const scope = { tenant_id: command.input.tenant_id, namespace: command.input.namespace };
    const idempotencyKey = scopeKey(scope, command.idempotency_key);
    const existingKey = taskByIdempotencyKey.get(idempotencyKey);
    const existing = existingKey === undefined ? null : copy(tasks.get(existingKey) ?? null);
    const result = submitTask(
      existing,
      command,
      now,
      { task_id: newId('task'), run_id: newId('run') },
      config,
    );
    if (result.created) {
      write({ task: result.task, history: result.history });
      taskByIdempotencyKey.set(idempotencyKey, taskKey(scope, result.task.task_id));
    }
    return { created: result.created, snapshot: copy(result.reply) };
  };

  const acquire = async (
    command: AcquireCommand,
    acquireOptions: AcquireStoreOptions,
    budget?: AcquireReplyBudget,
  ): Promise<AcquireOutcome> => {
    const now = clock();
    const session = sessions.get(command.worker_session_id);
    const storedCursor = cursors.get(cursorKey(command.worker_session_id, command.consumer_id));
    const cursor = storedCursor === undefined ? null : copy(storedCursor);
    const assigned = cursor?.assignment ?? null;
    const slotAttempt =
      assigned === null ? null : loadAttempt(command.scope, assigned.task_id, assigned.attempt_id);
    const poll = classifyPoll(
      session === undefined ? null : copy(session),
      cursor,
      slotAttempt,
      command,
      now,
    );
    if (poll.kind === 'replay') {
      const ref = poll.cursor.assignment;
      const task = ref === null ? null : loadTask(command.scope, ref.task_id);
      const reply = replayPoll(poll.cursor, task, slotAttempt, now);
      budget?.count(reply);
      return { reply: copy(reply), recorded: true };
    }
    const candidate = acquireOptions.claim === false ? null : selectEligible(command, now);
    if (candidate !== null) {
      const claim = claimTask(
        candidate,
        command,
        now,
        { attempt_id: newId('attempt'), lease_id: newId('lease') },
        config,
      );
      if (budget === undefined || budget.admits(claim.reply)) {
        write(claim);
        return { reply: copy(claim.reply), recorded: true };
      }
    }
    const empty = emptyPoll(command);
    // An unrecorded empty poll leaves the slot's sequence unconsumed, so the
    // same sequence is a new poll again (AcquireStoreOptions).
    if (!acquireOptions.recordEmpty) {
      // A probe that parks next learns when its queue's next task comes due (AcquireOutcome).
      const at = nextDueAt(command, now);
      return at === undefined
        ? { reply: empty.reply, recorded: false }
        : { reply: empty.reply, recorded: false, nextDue: { at, observedAt: now } };
    }
    write({ cursor: empty.cursor });
    return { reply: empty.reply, recorded: true };
  };

  const renew = async (command: RenewCommand): Promise<Authority> => {
    const now = clock();
    const { task, attempt } = loadOwned(command.owner);
    const result = renewLease(task, attempt, command, now, config);
    if (result.changed) write(result);
    return copy(result.reply);
  };

  const settleBy =
    (step: typeof settleAttempt) =>
    async (command: SettleCommand): Promise<SettleReply> => {
      const now = clock();
      const { task, attempt } = loadOwned(command.owner);
      const result = step(task, attempt, command, now, config);
      if (result.changed) write(result);
      return copy(result.reply);
    };
  const settle = settleBy(settleAttempt);
  const handBack = settleBy(handBackAttempt);

  const recoverExpiredLeases = async (limit?: number): Promise<RecoveryProgress> => {
    const bound = limit ?? MAX_RECOVERY_BATCH;
    if (!Number.isSafeInteger(bound) || bound < 1) {
      throw new ContractError('invalid_input', 'recovery limit must be a positive integer', {
        reason: 'schema',
        path: '$.limit',
      });
    }
    const now = clock();
    const expired: { task: TaskRow; attempt: AttemptRow }[] = [];
    for (const task of tasks.values()) {
      if (task.state !== 'active' || task.current_attempt_id === null) continue;
      const attempt = attempts.get(
        attemptKey(scopeOf(task), task.task_id, task.current_attempt_id),
      );
      if (attempt !== undefined && attempt.state === 'active' && attempt.lease_expires_at <= now) {
        expired.push({ task, attempt });
      }
    }
    // Oldest expiry first, as a store scanning an index on lease expiry would.
    expired.sort(
      (a, b) =>
        a.attempt.lease_expires_at - b.attempt.lease_expires_at ||
        compareBytes(a.task.task_id, b.task.task_id),
    );
    const batch = expired.slice(0, Math.min(bound, MAX_RECOVERY_BATCH));
    const progress = startRecoveryProgress(batch.length, expired.length > batch.length);
    for (const candidate of batch) {
      const result = recoverExpiredLease(
        copy(candidate.task),
        copy(candidate.attempt),
        now,
        config,
      );
      if (result !== null) write(result);
      countRecovery(progress, result);
    }
    return progress;
  };

  const subscribe = async (
    scope: Scope,
    taskId: string,
    command: CompletionSubscribeCommand,
  ): Promise<SubscribeOutcome> => {
    const now = clock();
    const task = requireTask(scope, taskId);
    const result = subscribeTask(task, loadSubscriptions(scope, taskId), command, now, {
      subscription_id: newId('subscription'),
      event_id: newId('event'),
    });
    if (result.created) writeSubscription(result.row);
    return { created: result.created, subscription: copy(completionSubscription(result.row)) };
  };

  const redeliver = async (
    scope: Scope,
    subscriptionId: string,
    command: CompletionRetryCommand,
  ): Promise<CompletionSubscription> => {
    const now = clock();
    const stored = subscriptions.get(scopeKey(scope, subscriptionId));
    if (stored === undefined) throw subscriptionNotFound(subscriptionId);
    const result = redeliverSubscription(copy(stored), command, now);
    if (result.changed) writeSubscription(result.row);
    return copy(completionSubscription(result.row));
  };

  /** The lease of a row `leaseDelivery` just moved to `delivering`, with its terminal task's facts. */
  const completionLease = (row: SubscriptionRow): CompletionLease => {
    const task = tasks.get(taskKey(scopeOf(row), row.task_id));
    // A delivery is only ever due once its task is terminal, and retention
    // never removes a task whose delivery is pending: anything else is a bug.
    if (task === undefined || !isTerminalState(task.state) || task.terminal_at === null) {
      throw new Error(
        `subscription ${row.subscription_id} is leasable but its task is not terminal`,
      );
    }
    if (row.next_attempt_at === null) {
      throw new Error(`leased subscription ${row.subscription_id} has no lease expiry`);
    }
    return {
      scope: scopeOf(row),
      subscription_id: row.subscription_id,
      task_id: row.task_id,
      destination: row.destination,
      event_id: row.event_id,
      generation: row.generation,
      attempt: row.attempts,
      lease_expires_at: row.next_attempt_at,
      queue: task.queue,
      run_id: task.run_id,
      state: task.state,
      terminal_at: task.terminal_at,
    };
  };

  const leaseDeliveries: CompletionStore['leaseDeliveries'] = async (limit, leaseMs, only) => {
    requireLimit(limit, MAX_COMPLETION_BATCH);
    requireIntegerArgument(leaseMs, 1, Number.MAX_SAFE_INTEGER, '$.lease_ms');
    if (only !== undefined) {
      const after = only.otherDestinationsAfterMs;
      requireIntegerArgument(after, 0, Number.MAX_SAFE_INTEGER, '$.other_destinations_after_ms');
    }
    const now = clock();
    const mine = new Set(only?.destinations);
    const otherBefore = now - (only?.otherDestinationsAfterMs ?? 0);
    // The PostgreSQL store's rule (completion-sql.ts): the sender's aliases once leasable, any
    // other once leasable for the wait, and a lost last try (leasing exhausts it) at once.
    const mayLease = (row: SubscriptionRow): boolean =>
      only === undefined ||
      mine.has(row.destination) ||
      (row.next_attempt_at ?? now) <= otherBefore ||
      leaseDelivery(row, now, leaseMs).state === 'exhausted';
    const leasable: SubscriptionRow[] = [];
    for (const row of subscriptions.values()) {
      if (deliveryLeasable(row, now) && mayLease(row)) leasable.push(row);
    }
    // Oldest due first, as an index on next_attempt_at would yield them. Like
    // a `LIMIT` in SQL, rows that turn out exhausted still use up the batch.
    leasable.sort(
      (a, b) =>
        (a.next_attempt_at ?? 0) - (b.next_attempt_at ?? 0) ||
        compareBytes(a.subscription_id, b.subscription_id),
    );
    const leases: CompletionLease[] = [];
    for (const row of leasable.slice(0, limit)) {
      const leased = leaseDelivery(copy(row), now, leaseMs);
      writeSubscription(leased);
      if (leased.state === 'delivering') leases.push(completionLease(leased));
    }
    return leases;
  };

  const reportOne = (report: DeliveryReport, now: number): boolean => {
    const stored = subscriptions.get(scopeKey(report.scope, report.subscription_id));
    // A subscription that no longer exists makes the report as stale as one
    // another sender overtook: it changes nothing.
    if (stored === undefined) return false;
    const next = reportDeliveryOf(copy(stored), report, now);
    if (next === undefined) return false;
    writeSubscription(next);
    return true;
  };

  const reportDelivery = async (report: DeliveryReport): Promise<boolean> =>
    reportOne(report, clock());
  // One synchronous step, as atomic as the SQL store's transaction, at one store time.
  const reportDeliveries = async (reports: readonly DeliveryReport[]): Promise<boolean[]> => {
    const now = clock();
    return reports.map((report) => reportOne(report, now));
  };

  const dueBacklog = async (limit: number): Promise<number> => {
    requireIntegerArgument(limit, 1, Number.MAX_SAFE_INTEGER, '$.limit');
    const now = clock();
    let count = 0;
    for (const row of subscriptions.values()) {
      if (count >= limit) break;
      if (row.state === 'due' && row.next_attempt_at !== null && row.next_attempt_at <= now) {
        count += 1;
      }
    }
    return count;
  };

  const retentionPolicy = (scope: Scope): RetentionPolicy =>
    retentionPolicyView(policies.get(scopeKey(scope)), config.terminalRetentionMs);
  const cutoffOf = (scope: Scope, now: Timestamp): Timestamp =>
    retentionCutoff(
      now,
      retentionPolicy(scope).retention_ms,
      retiringFloors.get(scopeKey(scope)) ?? null,
    );

  /** The namespace's terminal tasks, oldest terminal first (terminal_at, task_id bytes). */
  const terminalTasks = (scope: Scope): TaskRow[] => {
    const found: TaskRow[] = [];
    for (const task of tasks.values()) {
      if (sameScope(task, scope) && isTerminalState(task.state)) found.push(task);
    }
    return found.sort(
      (a, b) => (a.terminal_at ?? 0) - (b.terminal_at ?? 0) || compareBytes(a.task_id, b.task_id),
    );
  };

  const previewRetention = async (
    scope: Scope,
    limit: number = MAX_RETENTION_BATCH,
  ): Promise<RetentionPreview> => {
    requireLimit(limit, MAX_RETENTION_BATCH);
    const now = clock();
    const policy = retentionPolicy(scope);
    const cutoff = cutoffOf(scope, now);
    const candidates = terminalTasks(scope).filter((task) => retentionCandidate(task, cutoff));
    const preview: RetentionPreview = {
      retention_ms: policy.retention_ms,
      as_of: now,
      cutoff,
      candidates: Math.min(candidates.length, limit),
      truncated: candidates.length > limit,
    };
    const oldest = candidates[0]?.terminal_at;
    if (oldest != null) preview.oldest_terminal_at = oldest;
    return preview;
  };

  const retentionScopes = async (after: Scope | undefined, limit: number): Promise<Scope[]> => {
    requireLimit(limit, MAX_RETENTION_BATCH);
    const found = new Map<string, Scope>();
    for (const task of tasks.values()) {
      if (isTerminalState(task.state)) found.set(scopeKey(task), scopeOf(task));
    }
    // Namespaces with sessions no cutoff can have reached yet are left out, as in PostgreSQL.
    const expiredBefore = retentionCutoff(clock(), MIN_RETENTION_MS);
    for (const session of sessions.values()) {
      if (session.expires_at < expiredBefore) found.set(scopeKey(session), scopeOf(session));
    }
    return [...found.values()]
      .filter((scope) => after === undefined || scopeOrder(scope, after) > 0)
      .sort(scopeOrder)
      .slice(0, limit);
  };

  const collectRetired = async (
    scope: Scope,
    limit: number = MAX_RETENTION_BATCH,
  ): Promise<RetentionProgress> => {
    requireLimit(limit, MAX_RETENTION_BATCH);
    const cutoff = cutoffOf(scope, clock());
    const progress: RetentionProgress = {
      cutoff,
      tasks_removed: 0,
      attempts_removed: 0,
      history_removed: 0,
      subscriptions_removed: 0,
      sessions_removed: 0,
      has_more: false,
    };

    const removedTasks = new Set<string>();
    for (const task of terminalTasks(scope)) {
      if (removedTasks.size >= limit) break;
      if (!retired(task, loadSubscriptions(scope, task.task_id), cutoff)) continue;
      const key = taskKey(scope, task.task_id);
      removedTasks.add(key);
      tasks.delete(key);
      taskByIdempotencyKey.delete(scopeKey(scope, task.idempotency_key));
      progress.history_removed += histories.get(key)?.length ?? 0;
      histories.delete(key);
      for (const subscriptionKey of subscriptionsOfTask.get(key) ?? []) {
        subscriptions.delete(subscriptionKey);
        progress.subscriptions_removed += 1;
      }
      subscriptionsOfTask.delete(key);
    }
    // Attempts are keyed by (scope, task, attempt): one pass finds them all.
    for (const [key, attempt] of attempts) {
      if (removedTasks.has(taskKey(scopeOf(attempt), attempt.task_id))) {
        attempts.delete(key);
        progress.attempts_removed += 1;
      }
    }
    progress.tasks_removed = removedTasks.size;

    const expired = [...sessions.values()]
      .filter((session) => sameScope(session, scope) && session.expires_at < cutoff)
      .sort((a, b) => a.expires_at - b.expires_at || compareBytes(a.id, b.id))
      .slice(0, limit);
    const removedSessions = new Set(expired.map((session) => session.id));
    for (const id of removedSessions) sessions.delete(id);
    for (const [key, cursor] of cursors) {
      if (removedSessions.has(cursor.worker_session_id)) cursors.delete(key);
    }
    progress.sessions_removed = removedSessions.size;

    // A full pass may have left more behind; a short one found everything it could.
    progress.has_more = progress.tasks_removed === limit || progress.sessions_removed === limit;
    return progress;
  };

  const store: MemoryTaskStore = {
    config,

    advance(ms: number): void {
      if (!Number.isFinite(ms) || ms < 0) {
        throw new RangeError('advance(ms) needs a finite, non-negative duration');
      }
      offset += ms;
    },

    async now(): Promise<Timestamp> {
      return clock();
    },

    submit,

    submitBatch: (commands) => eachItem(commands, submit),

    async openSession(command: OpenSessionCommand): Promise<WorkerSession> {
      const row = openSessionRow(command, newId('session'), clock(), config);
      sessions.set(row.id, copy(row));
      return workerSession(copy(row));
    },

    async extendSession(scope: Scope, sessionId: string): Promise<WorkerSession> {
      const now = clock();
      const stored = sessions.get(sessionId);
      const live = requireLiveSession(
        stored === undefined ? null : copy(stored),
        scope,
        sessionId,
        now,
      );
      const extended = extendSessionRow(live, now, config);
      sessions.set(extended.id, copy(extended));
      return workerSession(copy(extended));
    },

    async sessionScope(sessionId: string, tenant: string | undefined): Promise<Scope | null> {
      const stored = sessions.get(sessionId);
      if (stored === undefined || (tenant !== undefined && stored.tenant_id !== tenant))
        return null;
      return { tenant_id: stored.tenant_id, namespace: stored.namespace };
    },

    acquire,

    acquireBatch: (commands, acquireOptions) => {
      const budget = new AcquireReplyBudget(acquireOptions.replyBytesUsed ?? 0);
      return eachItem(commands, (command) => acquire(command, acquireOptions, budget));
    },

    renew,

    renewBatch: (commands) => eachItem(commands, renew),

    settle,

    settleBatch: (commands) => eachItem(commands, settle),

    handBackBatch: (commands) => eachItem(commands, handBack),

    async confirmQuiescence(owner: LeaseOwner): Promise<TaskState> {
      const now = clock();
      const { task, attempt } = loadOwned(owner);
      const result = confirmQuiescenceOf(task, attempt, owner, now);
      if (result.changed) write(result);
      return result.reply;
    },

    async cancel(scope: Scope, taskId: string): Promise<TaskState> {
      const now = clock();
      const result = cancelTask(requireTask(scope, taskId), now);
      if (result.changed) write(result);
      return result.reply;
    },

    async status(scope: Scope, taskId: string): Promise<TaskStatus> {
      return copy(taskStatus(requireTask(scope, taskId)));
    },

    async result(scope: Scope, taskId: string): Promise<TaskResult> {
      return copy(taskResult(requireTask(scope, taskId)));
    },

    async inspect(scope: Scope, taskId: string): Promise<TaskSnapshot> {
      return copy(taskSnapshot(requireTask(scope, taskId)));
    },

    async inspectAttempt(
      scope: Scope,
      taskId: string,
      attemptId: string,
    ): Promise<AttemptSnapshot> {
      const task = requireTask(scope, taskId);
      const attempt = loadAttempt(scope, taskId, attemptId);
      if (attempt === null) {
        throw new ContractError(
          'not_found',
          `attempt ${attemptId} of task ${taskId} was not found`,
        );
      }
      return copy(attemptSnapshot(task, attempt));
    },

    async history(
      scope: Scope,
      taskId: string,
      afterSequence: number,
    ): Promise<RecordedHistoryEvent[]> {
      requireTask(scope, taskId);
      const rows = histories.get(taskKey(scope, taskId)) ?? [];
      return rows
        .filter((row) => row.sequence > afterSequence)
        .slice(0, HISTORY_PAGE_LIMIT)
        .map((row) => copy(recordedHistoryEvent(row)));
    },

    async listTasks(scope: Scope, query: TaskListQuery): Promise<TaskPage> {
      const limit = query.limit ?? TASK_LIST_DEFAULT_LIMIT;
      if (!Number.isSafeInteger(limit) || limit < 1 || limit > TASK_LIST_MAX_LIMIT) {
        throw new ContractError('invalid_input', `$.limit must be 1..${TASK_LIST_MAX_LIMIT}`, {
          reason: 'schema',
          path: '$.limit',
        });
      }
      const filters = query.filters;
      const position = query.cursor == null ? null : decodeTaskCursor(query.cursor, scope, filters);
      const selected: TaskRow[] = [];
      for (const task of tasks.values()) {
        if (!sameScope(task, scope) || !matches(task, filters)) continue;
        if (position !== null && !after(task, position)) continue;
        selected.push(task);
      }
      selected.sort(listingOrder);
      // One row beyond the page tells whether another page exists, so the
      // last page carries no cursor.
      return copy(taskPage(scope, filters, selected.slice(0, limit + 1), limit));
    },

    recoverExpiredLeases,

    subscribe,

    async listSubscriptions(scope: Scope, taskId: string): Promise<CompletionSubscription[]> {
      requireTask(scope, taskId);
      const now = clock();
      // Read-only, as in the PostgreSQL store: a lost last try shows as the next lease writes it.
      return loadSubscriptions(scope, taskId).map((row) =>
        copy(completionSubscription(expireLostTry(row, now))),
      );
    },

    redeliver,

    leaseDeliveries,

    reportDelivery,
    reportDeliveries,

    dueBacklog,

    async retentionPolicy(scope: Scope): Promise<RetentionPolicy> {
      return copy(retentionPolicy(scope));
    },

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
      const now = clock();
      const key = scopeKey(scope);
      const floor = retiringFloor(
        now,
        retentionPolicy(scope).retention_ms,
        retiringFloors.get(key) ?? null,
      );
      retiringFloors.set(key, Math.max(floor, retiringFloors.get(key) ?? floor));
      const stored = policies.get(key);
      const row: RetentionPolicyRow = {
        tenant_id: scope.tenant_id,
        namespace: scope.namespace,
        retention_ms: command.retention_ms,
        // The same policy again is the same answer (DESIGN §1.3): its time is when it was set.
        updated_at: stored?.retention_ms === command.retention_ms ? stored.updated_at : now,
      };
      policies.set(key, copy(row));
      return copy(retentionPolicyView(row, config.terminalRetentionMs));
    },

    previewRetention,

    retentionScopes,

    collectRetired,
  };
  return store;
}
