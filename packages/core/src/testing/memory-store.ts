/**
 * A complete in-memory `TaskStore`, built only from the core's pure
 * transitions: every operation loads the rows it needs, applies one
 * transition and writes what the transition returned. JavaScript runs each
 * operation to completion between awaits, so an operation is as atomic as a
 * PostgreSQL transaction under the task's row lock. No lifecycle rule lives
 * here; the store only decides what a database would: which rows to load,
 * which queued task is the best eligible one, and how to page.
 */
import {
  type AcquireCommand,
  type AttemptSnapshot,
  type Authority,
  ContractError,
  decodeTaskCursor,
  encodeTaskCursor,
  HISTORY_PAGE_LIMIT,
  type LeaseOwner,
  MAX_RECOVERY_BATCH,
  type OpenSessionCommand,
  type RecordedHistoryEvent,
  type RecoveryProgress,
  type RenewCommand,
  type Scope,
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
import { claimTask, classifyPoll, emptyPoll, replayPoll } from '../acquire.js';
import { cancelTask } from '../cancel.js';
import { type LifecycleConfig, lifecycleConfig } from '../config.js';
import { commandDigest } from '../digest.js';
import { newId } from '../ids.js';
import type {
  AcquireOutcome,
  AcquireStoreOptions,
  ItemResult,
  SubmitOutcome,
  TaskStore,
} from '../ports.js';
import { countRecovery, recoverExpiredLease, startRecoveryProgress } from '../recovery.js';
import { renewLease } from '../renew.js';
import type { AttemptRow, CursorRow, HistoryRow, SessionRow, TaskRow } from '../rows.js';
import {
  extendSession as extendSessionRow,
  openSession as openSessionRow,
  requireLiveSession,
  workerSession,
} from '../session.js';
import { confirmQuiescence as confirmQuiescenceOf, settleAttempt } from '../settle.js';
import { submitTask } from '../submit.js';
import {
  attemptSnapshot,
  recordedHistoryEvent,
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

/** An in-memory {@link TaskStore} whose clock a test can move forward. */
export interface MemoryTaskStore extends TaskStore {
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

function taskNotFound(taskId: string): ContractError {
  return new ContractError('not_found', `task ${taskId} was not found`);
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
  const loadAttempt = (scope: Scope, taskId: string, attemptId: string): AttemptRow | null => {
    const attempt = attempts.get(attemptKey(scope, taskId, attemptId));
    return attempt === undefined ? null : copy(attempt);
  };
  const loadOwned = (owner: LeaseOwner): { task: TaskRow | null; attempt: AttemptRow | null } => ({
    task: loadTask(owner.scope, owner.task_id),
    attempt: loadAttempt(owner.scope, owner.task_id, owner.attempt_id),
  });

  /** Writes what one transition returned, as one unit. */
  const write = (rows: {
    task?: TaskRow;
    attempt?: AttemptRow;
    history?: readonly HistoryRow[];
    cursor?: CursorRow;
  }): void => {
    if (rows.task !== undefined) {
      tasks.set(taskKey(scopeOf(rows.task), rows.task.task_id), copy(rows.task));
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

  const submit = async (command: SubmitCommand): Promise<SubmitOutcome> => {
    const now = clock();
    const scope = { tenant_id: command.input.tenant_id, namespace: command.input.namespace };
    const idempotencyKey = scopeKey(scope, command.idempotency_key);
    const existingKey = taskByIdempotencyKey.get(idempotencyKey);
    const existing = existingKey === undefined ? null : copy(tasks.get(existingKey) ?? null);
    const result = submitTask(existing, command, commandDigest(command), now, {
      task_id: newId('task'),
      run_id: newId('run'),
    });
    if (result.created) {
      write({ task: result.task, history: result.history });
      taskByIdempotencyKey.set(idempotencyKey, taskKey(scope, result.task.task_id));
    }
    return { created: result.created, snapshot: copy(result.reply) };
  };

  const acquire = async (
    command: AcquireCommand,
    acquireOptions: AcquireStoreOptions,
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
      return { reply: copy(reply), recorded: true };
    }
    const candidate = selectEligible(command, now);
    if (candidate !== null) {
      const claim = claimTask(
        candidate,
        command,
        now,
        { attempt_id: newId('attempt'), lease_id: newId('lease') },
        config,
      );
      write(claim);
      return { reply: copy(claim.reply), recorded: true };
    }
    const empty = emptyPoll(command);
    // An unrecorded empty poll leaves the slot's sequence unconsumed, so the
    // same sequence is a new poll again (AcquireStoreOptions).
    if (!acquireOptions.recordEmpty) return { reply: empty.reply, recorded: false };
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

  const settle = async (command: SettleCommand): Promise<SettleReply> => {
    const now = clock();
    const { task, attempt } = loadOwned(command.owner);
    const result = settleAttempt(task, attempt, command, commandDigest(command), now);
    if (result.changed) write(result);
    return copy(result.reply);
  };

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
      const result = recoverExpiredLease(copy(candidate.task), copy(candidate.attempt), now);
      if (result !== null) write(result);
      countRecovery(progress, result);
    }
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

    acquire,

    acquireBatch: (commands, acquireOptions) =>
      eachItem(commands, (command) => acquire(command, acquireOptions)),

    renew,

    renewBatch: (commands) => eachItem(commands, renew),

    settle,

    settleBatch: (commands) => eachItem(commands, settle),

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
      const page = selected.slice(0, limit);
      const last = page.at(-1);
      const reply: TaskPage = { tasks: page.map((task) => copy(taskStatus(task))) };
      if (selected.length > limit && last !== undefined) {
        reply.next_cursor = encodeTaskCursor(scope, filters, {
          submitted_at: last.submitted_at,
          task_id: last.task_id,
        });
      }
      return reply;
    },

    recoverExpiredLeases,
  };
  return store;
}
