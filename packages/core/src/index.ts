/**
 * @module @ledgence/core
 *
 * The lifecycle core of Ledgence: the pure state transitions of DESIGN §5
 * (submit, sessions, replay-safe acquisition, renew with intents, settle with
 * idempotent operation ids and quiescence, cancel, lease-expiry recovery,
 * retry scheduling, history), the ports a store implements (`TaskStore`,
 * `WakeSource`), and the `TaskService` built on them. A transition takes the
 * loaded rows, the command and store time, and returns the rows to write and
 * the reply; it never does I/O. No SQL, no HTTP.
 *
 * @example
 * ```ts
 * import { lifecycleConfig, submitTask } from '@ledgence/core';
 *
 * const command = {
 *   idempotency_key: 'order-42',
 *   input: { tenant_id: 'acme', namespace: 'prod', queue: 'email',
 *            program: { name: 'send-email' }, data: { to: 'ada@example.com' } },
 * };
 * const now = Date.UTC(2026, 10, 29);
 * const config = lifecycleConfig();
 * const result = submitTask(null, command, now, { task_id: 'tsk_1', run_id: 'run_1' }, config);
 * console.log(result.created, result.task.state, result.history[0]?.reason);
 * // → true queued submitted
 * console.log(config.leaseDurationMs); // → 30000
 * ```
 */

// Moved to contracts so the worker SDK (which installs alone) logs its retrying loops alike;
// re-exported here for the server's and the callback sender's loops.
export {
  FAILURE_LOG_INTERVAL_MS,
  type FailureRun,
  type FailureRunOptions,
  type FailureVerdict,
  failureRun,
} from '@ledgence/contracts';
export {
  AcquireReplyBudget,
  type ClaimIds,
  type ClaimResult,
  claimTask,
  classifyPoll,
  emptyPoll,
  type PollKind,
  replayPoll,
} from './acquire.js';
export { type CancelResult, cancelTask } from './cancel.js';
export {
  completionSubscription,
  DELIVERY_LEASE_EXPIRED_ERROR,
  type DeliveryNext,
  type DeliveryReport,
  deliveryLeasable,
  expireLostTry,
  isTerminalState,
  leaseDelivery,
  markDue,
  type RedeliverResult,
  redeliverSubscription,
  reportDelivery,
  type SubscribeIds,
  type SubscribeResult,
  subscribeTask,
} from './completion.js';
export {
  type CompletionService,
  type CompletionServiceOptions,
  createCompletionService,
} from './completion-service.js';
export { DEFAULT_LIFECYCLE_CONFIG, type LifecycleConfig, lifecycleConfig } from './config.js';
export { commandDigest } from './digest.js';
export {
  createFailpoints,
  FAILPOINT_NAMES,
  FAILPOINT_STORE_OPERATIONS,
  FAILPOINTS,
  type FailpointAction,
  FailpointError,
  type FailpointName,
  type FailpointRouteOperation,
  type FailpointSetting,
  FailpointSpecError,
  type FailpointStoreOperation,
  type Failpoints,
  type FailpointsOptions,
  NO_FAILPOINTS,
  parseFailpoints,
} from './failpoints.js';
export { type GroupCommitOptions, withGroupCommit } from './group-commit.js';
export { type HistoryEntry, recordHistory } from './history.js';
export { type IdKind, newId } from './ids.js';
export {
  attemptNotFound,
  authorityAt,
  leaseLive,
  leaseOf,
  leaseOwner,
  type OwnerAttemptColumns,
  type OwnerScopeColumns,
  ownerMatches,
  ownershipLost,
  requireOwnedAttempt,
} from './lease.js';
export { requireIntegerArgument, subscriptionNotFound, taskNotFound } from './not-found.js';
export type {
  AcquireOutcome,
  AcquireStoreOptions,
  CompletionLease,
  CompletionStore,
  ItemResult,
  RetentionStore,
  SubmitOutcome,
  SubscribeOutcome,
  TaskStore,
  WakeSource,
  WakeTopic,
  WakeWatch,
} from './ports.js';
export {
  countRecovery,
  type RecoveryOutcome,
  type RecoveryResult,
  recoverExpiredLease,
  startRecoveryProgress,
} from './recovery.js';
export { type RenewResult, renewLease } from './renew.js';
export {
  retentionCandidate,
  retentionCutoff,
  retentionPolicyView,
  retired,
  retiringFloor,
  subscriptionProtects,
} from './retention.js';
export type {
  AttemptRow,
  CursorRow,
  HistoryRow,
  RetentionPolicyRow,
  SessionRow,
  SettlementDecision,
  SubscriptionRow,
  TaskRow,
} from './rows.js';
export {
  createTaskService,
  type TaskService,
  type TaskServiceOptions,
  type WaitOptions,
} from './service.js';
export { extendSession, openSession, requireLiveSession, workerSession } from './session.js';
export {
  applyDecision,
  attemptsRemain,
  confirmQuiescence,
  decideSettlement,
  dispatchPossible,
  handBackAttempt,
  heldDecision,
  type RetryConfig,
  retryDelayFor,
  type SettleSideResult,
  settleAttempt,
} from './settle.js';
export {
  MIN_DISPATCH_WINDOW_MS,
  minSubmitTimeoutMs,
  type SubmitIds,
  type SubmitResult,
  submitTask,
} from './submit.js';
export {
  assignmentAt,
  attemptSnapshot,
  invocationEvent,
  recordedHistoryEvent,
  taskPage,
  taskResult,
  taskSnapshot,
  taskStatus,
} from './views.js';
