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
  CompletionRetryCommand,
  CompletionSubscribeCommand,
  CompletionSubscription,
  ContractError,
  LeaseOwner,
  OpenSessionCommand,
  RecordedHistoryEvent,
  RecoveryProgress,
  RenewCommand,
  RetentionPolicy,
  RetentionPreview,
  RetentionProgress,
  Scope,
  SetRetentionPolicyCommand,
  SettleCommand,
  SettleReply,
  SubmitCommand,
  TaskListQuery,
  TaskPage,
  TaskResult,
  TaskSnapshot,
  TaskState,
  TaskStatus,
  TerminalTaskState,
  Timestamp,
  WorkerSession,
} from '@ledgence/contracts';
import type { DeliveryReport } from './completion.js';

/** One item of a batch answer: its own reply or its own rejection, in request order. */
export type ItemResult<T> = { ok: true; value: T } | { ok: false; error: ContractError };

/** A submit's reply and whether it created the task (201) or found it (200). */
export interface SubmitOutcome {
  /** True when this submit created the task (201), false when it found it (200). */
  created: boolean;
  /** The task as it stands after the submit. */
  snapshot: TaskSnapshot;
}

/**
 * How an acquire treats a new poll that finds nothing. A long poll probes with
 * `recordEmpty: false` (the slot's sequence is not consumed, so probing again
 * is a new poll), and records the empty answer only when it finally replies.
 */
export interface AcquireStoreOptions {
  /** Whether an `empty` answer to a new poll advances the slot's cursor. */
  recordEmpty: boolean;
  /**
   * Whether a new poll may claim a task (default true). False: every new poll is answered
   * `empty` (recorded as `recordEmpty` says) and replays as usual — a shutting-down server ends
   * its long polls with `empty` (DESIGN §11) without taking a task no worker could then run.
   */
  claim?: boolean;
  /**
   * Bytes the batch's reply already holds from an earlier call of the same request (a long
   * poll's probe, whose claims the reply carries beside this call's): new claims stop before
   * the whole reply passes ACQUIRE_BATCH_REPLY_MAX_BYTES. Default 0.
   */
  replyBytesUsed?: number;
}

/** An acquire's reply and whether the store recorded it (always, unless an unrecorded empty). */
export interface AcquireOutcome {
  /** The poll's answer. */
  reply: AcquireReply;
  /** Whether the cursor now holds this poll (false only for an unrecorded `empty`). */
  recorded: boolean;
  /**
   * On an unrecorded `empty` only (a long poll's probe, which parks next): the earliest
   * `available_at` after the probe's store time among its queue's queued tasks (`at`), and the
   * store time that was read at (`observedAt`). Nothing NOTIFYs when a delayed task or a retry
   * comes due, so without it a parked poll would find such a task only at its next rescan. Only
   * when to look again: the next probe decides. Absent when no queued task of the queue is
   * delayed; tasks already due but held back (a full concurrency key, locked by another claim)
   * are no due-time matter and never counted.
   */
  nextDue?: { at: Timestamp; observedAt: Timestamp };
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
  /**
   * The scope of a session by its id alone (ids are unique), within `tenant` when given; `null`
   * when there is none, live or not. For a session extended without naming its scope.
   */
  sessionScope(sessionId: string, tenant: string | undefined): Promise<Scope | null>;

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
  /**
   * Gives back claims whose poll reply could not be delivered: settles each like
   * {@link TaskStore.settleBatch}, except an attempt renewed meanwhile, which is refused as
   * `conflict` and left to its worker (`handBackAttempt`, checked under the task's lock).
   */
  handBackBatch(commands: readonly SettleCommand[]): Promise<ItemResult<SettleReply>[]>;

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

/** A subscribe's reply and whether it created the subscription (201) or found it by key (200). */
export interface SubscribeOutcome {
  /** True when this call created the subscription (201), false when found by key (200). */
  created: boolean;
  /** The subscription with its delivery state. */
  subscription: CompletionSubscription;
}

/**
 * One leased delivery try: which event goes where, fenced by `generation` and
 * `attempt` (the try's ordinal). `queue`, `run_id`, `state` and `terminal_at`
 * are the terminal task's immutable facts the event is built from, so every
 * try and every generation posts the same bytes.
 */
export interface CompletionLease {
  /** The task's scope (`ldgtenant`, `ldgnamespace`). */
  scope: Scope;
  /** The leased subscription; named again in the report. */
  subscription_id: string;
  /** The terminal task the event is about. */
  task_id: string;
  /** The destination alias to post to; the sender resolves it to a URL and secret. */
  destination: string;
  /** The CloudEvent `id` and `webhook-id`, the same on every try and generation. */
  event_id: string;
  /** The delivery generation leased; fences the report. */
  generation: number;
  /** This try's 1-based ordinal within the generation; fences the report. */
  attempt: number;
  /** When the lease ends: a report after this may find the row taken by another sender. */
  lease_expires_at: Timestamp;
  /** The task's queue (the event's `source`, `ldgqueue`). */
  queue: string;
  /** The task's run id (`data.run_id`). */
  run_id: string;
  /** The terminal state (`data.state`). */
  state: TerminalTaskState;
  /** When the task became terminal: the event's `time`. */
  terminal_at: Timestamp;
}

/**
 * Completion subscriptions and their deliveries (seed: `CompletionStore`).
 * Registration and the terminal hook share the task's row lock (a store marks
 * waiting subscriptions due in the transaction of every terminal transition);
 * delivery leasing locks only subscription rows and never locks tasks
 * afterwards. Every mutation is one transaction, with store time.
 */
export interface CompletionStore {
  /**
   * Subscribes a task (404 `not_found` if it does not exist in `scope`) to a
   * destination alias the caller has checked; idempotent by `subscription_key`.
   */
  subscribe(
    scope: Scope,
    taskId: string,
    command: CompletionSubscribeCommand,
  ): Promise<SubscribeOutcome>;
  /** A task's subscriptions with their delivery state, oldest first (404 if no such task). */
  listSubscriptions(scope: Scope, taskId: string): Promise<CompletionSubscription[]>;
  /** Redelivery under DESIGN §8's generation rule (404 if no such subscription in `scope`). */
  redeliver(
    scope: Scope,
    subscriptionId: string,
    command: CompletionRetryCommand,
  ): Promise<CompletionSubscription>;
  /**
   * Leases up to `limit` due deliveries (and deliveries whose sender's lease
   * ran out) for `leaseMs`, oldest due first, skipping rows another sender
   * holds (`FOR UPDATE SKIP LOCKED`). Each lease starts one try.
   *
   * `only` restricts a sender to the deliveries it can send: those to one of
   * its `destinations` aliases, once due; those to any other alias only once
   * they have been leasable for `otherDestinationsAfterMs` (store time) —
   * replicas mid-way through a configuration change leave each other's
   * deliveries alone, yet an alias no replica has still ends `exhausted`
   * rather than due forever. A try whose sender's lease ran out after the
   * generation's last try is exhausted whatever its alias (no POST follows).
   * Without `only`, every leasable delivery is leased.
   */
  leaseDeliveries(
    limit: number,
    leaseMs: number,
    only?: { destinations: readonly string[]; otherDestinationsAfterMs: number },
  ): Promise<CompletionLease[]>;
  /** Records one try's outcome; `false` when the report was stale and changed nothing. */
  reportDelivery(report: DeliveryReport): Promise<boolean>;
  /**
   * Records several tries' outcomes in one transaction, each exactly as
   * {@link reportDelivery} would: answers, report by report, whether it
   * changed its row. For a sender whose tries end together (a window aborted
   * at shutdown): one commit instead of one per try. At most one report per
   * subscription in a call.
   */
  reportDeliveries(reports: readonly DeliveryReport[]): Promise<boolean[]>;
  /** Deliveries due now and not leased (for metrics), counted up to `limit`. */
  dueBacklog(limit: number): Promise<number>;
}

/**
 * Retention (seed: `RetentionStore`): per-namespace policies, a bounded
 * preview and bounded collection transactions that never wait on a hot row.
 */
export interface RetentionStore {
  /** The namespace's policy: its own, or the store's default. */
  retentionPolicy(scope: Scope): Promise<RetentionPolicy>;
  /** Sets the namespace's policy. */
  setRetentionPolicy(scope: Scope, command: SetRetentionPolicyCommand): Promise<RetentionPolicy>;
  /** Counts the age candidates of the next collection, up to `limit` (≤ MAX_RETENTION_BATCH). */
  previewRetention(scope: Scope, limit?: number): Promise<RetentionPreview>;
  /**
   * Namespaces that hold terminal tasks, in (tenant, namespace) byte order,
   * after `after` (exclusive), at most `limit`: the retention loop's walk.
   */
  retentionScopes(after: Scope | undefined, limit: number): Promise<Scope[]>;
  /**
   * One bounded transaction: removes up to `limit` (≤ MAX_RETENTION_BATCH)
   * retired tasks of `scope` with their attempts, history, payloads and
   * finished subscriptions, and up to `limit` worker sessions that expired
   * before the cutoff with their consumer cursors. Rows another transaction
   * holds are skipped, never waited for.
   */
  collectRetired(scope: Scope, limit?: number): Promise<RetentionProgress>;
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
   * Registers interest in `topic` from now on. A waiter watches *before* it
   * looks (probes the store) and parks on the watch after: a hint that arrives
   * between the look and the park — the change committed after the probe's
   * snapshot — is kept for the watch instead of being dropped, which would
   * leave the waiter to the periodic rescan. The caller closes the watch.
   */
  watch(topic: WakeTopic): WakeWatch;
}

/** One waiter's interest in a {@link WakeTopic}, from {@link WakeSource.watch}. */
export interface WakeWatch {
  /**
   * Resolves at once if a hint for the topic arrived since the watch began or
   * since the previous `next` resolved; otherwise when one arrives, after
   * `timeoutMs`, or when `signal` aborts — whichever comes first. Never rejects.
   * One `next` at a time: a waiter parks, then probes, then parks again.
   */
  next(timeoutMs: number, signal?: AbortSignal): Promise<void>;
  /** Ends the interest (a pending `next` resolves). Idempotent. */
  close(): void;
}
