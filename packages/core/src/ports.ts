/**
 * The ports the lifecycle core needs from the outside world. A store
 * implements {@link TaskStore}; each operation is one complete, transactional
 * single-task lifecycle step that applies the core's pure transitions under
 * the task's row lock. Nothing here knows SQL or HTTP.
 */
import type {
  AcquireCommand,
  AcquireReply,
  AttemptSnapshot,
  Authority,
  ContractError,
  LeaseOwner,
  OpenSessionCommand,
  RecordedHistoryEvent,
  RecoveryProgress,
  RenewCommand,
  Scope,
  SettleCommand,
  SettleReply,
  SubmitCommand,
  TaskListQuery,
  TaskPage,
  TaskResult,
  TaskSnapshot,
  TaskState,
  TaskStatus,
  Timestamp,
  WorkerSession,
} from '@ledgence/contracts';

/** One item of a batch answer: its own reply or its own rejection, in request order. */
export type ItemResult<T> = { ok: true; value: T } | { ok: false; error: ContractError };

/** A submit's reply and whether it created the task (201) or found it (200). */
export interface SubmitOutcome {
  created: boolean;
  snapshot: TaskSnapshot;
}

/**
 * How an acquire treats a new poll that finds nothing. A long poll probes with
 * `recordEmpty: false` (the slot's sequence is not consumed, so probing again
 * is a new poll), and records the empty answer only when it finally replies.
 */
export interface AcquireStoreOptions {
  recordEmpty: boolean;
}

/** An acquire's reply and whether the store recorded it (always, unless an unrecorded empty). */
export interface AcquireOutcome {
  reply: AcquireReply;
  recorded: boolean;
}

/**
 * Persistence boundary for complete single-task lifecycle operations (seed:
 * `TaskStore`). Every mutation is one transaction that replies only after it
 * committed; a backend failure is a `ContractError('unavailable')`, never an
 * empty acquisition or lost ownership. Store time is the only clock.
 *
 * Batch operations answer every item on its own, in order; items share a
 * transaction only where that cannot change any item's outcome.
 */
export interface TaskStore {
  /** Store time (UTC ms): the clock every lifecycle decision uses. */
  now(): Promise<Timestamp>;

  /** Insert-or-return by `(tenant, namespace, idempotency_key)`. */
  submit(command: SubmitCommand): Promise<SubmitOutcome>;
  /** Many submits; each item succeeds or fails alone. */
  submitBatch(commands: readonly SubmitCommand[]): Promise<ItemResult<SubmitOutcome>[]>;

  /** Issues a session valid for the session validity. */
  openSession(command: OpenSessionCommand): Promise<WorkerSession>;
  /** Pushes a live session's expiry to `now + validity`. */
  extendSession(scope: Scope, sessionId: string): Promise<WorkerSession>;

  /** One replay-safe poll of one consumer slot (DESIGN §5 Acquire), without waiting. */
  acquire(command: AcquireCommand, options: AcquireStoreOptions): Promise<AcquireOutcome>;
  /** Polls of several slots, sharing one statement and one commit where possible. */
  acquireBatch(
    commands: readonly AcquireCommand[],
    options: AcquireStoreOptions,
  ): Promise<ItemResult<AcquireOutcome>[]>;

  /** Renews a lease (heartbeat or dispatch request). */
  renew(command: RenewCommand): Promise<Authority>;
  /** Many renewals in one transaction; each answered on its own. */
  renewBatch(commands: readonly RenewCommand[]): Promise<ItemResult<Authority>[]>;

  /** Settles an attempt exactly once. */
  settle(command: SettleCommand): Promise<SettleReply>;
  /** Many settlements in one transaction; each answered on its own. */
  settleBatch(commands: readonly SettleCommand[]): Promise<ItemResult<SettleReply>[]>;

  /** Confirms cleanup of a settled attempt whose report said `unconfirmed`. */
  confirmQuiescence(owner: LeaseOwner): Promise<TaskState>;
  /** Cancels a task; terminal tasks answer their state unchanged. */
  cancel(scope: Scope, taskId: string): Promise<TaskState>;

  /** Compact scheduling metadata without application payloads. */
  status(scope: Scope, taskId: string): Promise<TaskStatus>;
  /** Task metadata and its logical outcome from one consistent snapshot. */
  result(scope: Scope, taskId: string): Promise<TaskResult>;
  /** The full scheduling record. */
  inspect(scope: Scope, taskId: string): Promise<TaskSnapshot>;
  /** One attempt as recorded. */
  inspectAttempt(scope: Scope, taskId: string, attemptId: string): Promise<AttemptSnapshot>;
  /** At most 100 ordered history records after `afterSequence`. */
  history(scope: Scope, taskId: string, afterSequence: number): Promise<RecordedHistoryEvent[]>;
  /** One bounded page in descending (submitted_at, task_id) order; each page its own snapshot. */
  listTasks(scope: Scope, query: TaskListQuery): Promise<TaskPage>;

  /** Recovers up to `limit` expired leases in bounded transactions and reports progress. */
  recoverExpiredLeases(limit?: number): Promise<RecoveryProgress>;
}

/** What a waiter waits for: ready work on a queue, or a task becoming terminal. */
export type WakeTopic =
  | { kind: 'queue'; scope: Scope; queue: string }
  | { kind: 'task'; scope: Scope; task_id: string };

/**
 * Optional adapter-to-service wake port (seed: `AcquisitionWake`). A wake is a
 * hint that carries identities only: it never grants authority or carries a
 * reply, and the rescan that follows decides. Implementations return promptly
 * without network I/O and bound the interests they retain; a periodic rescan
 * remains necessary even when hints are delivered.
 */
export interface WakeSource {
  /**
   * Resolves when a hint for `topic` arrives, after `timeoutMs`, or when
   * `signal` aborts — whichever comes first. Never rejects.
   */
  wait(topic: WakeTopic, timeoutMs: number, signal?: AbortSignal): Promise<void>;
}
