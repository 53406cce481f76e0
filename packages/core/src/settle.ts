import {
  type AttemptReport,
  type AttemptState,
  ContractError,
  type LeaseOwner,
  retryDelayMs,
  type SettleCommand,
  type SettleReply,
  type TaskFailure,
  type TaskState,
  type Timestamp,
} from '@ledgence/contracts';
import { DEFAULT_LIFECYCLE_CONFIG, type LifecycleConfig } from './config.js';
import { isRecordedCommand } from './digest.js';
import { type HistoryEntry, recordHistory } from './history.js';
import { leaseLive, ownershipLost, requireOwnedAttempt } from './lease.js';
import type { AttemptRow, HistoryRow, SettlementDecision, TaskRow } from './rows.js';
import { minSubmitTimeoutMs } from './submit.js';

/** What a settle-side transition wrote (nothing when it replayed) and its reply. */
export interface SettleSideResult<R> {
  /** Whether anything is to be written; false for a replay. */
  changed: boolean;
  /** The task afterwards: terminal, re-queued, or still active awaiting cleanup. */
  task: TaskRow;
  /** The attempt afterwards. */
  attempt: AttemptRow;
  /** The records written. */
  history: HistoryRow[];
  /** The operation's reply. */
  reply: R;
}

/**
 * The retry delay after a failed attempt: the policy's delay for the number of
 * dispatched attempts so far, jittered deterministically from the run and
 * task ids, so replicas and restarts agree (a3s seed).
 */
export function retryDelayFor(task: TaskRow): number {
  return retryDelayMs(task.retry, Math.max(1, task.dispatch_count), [task.run_id, task.task_id]);
}

/** Whether the retry budget has room: only attempts granted dispatch count (DESIGN §4.1). */
export function attemptsRemain(task: TaskRow): boolean {
  return task.dispatch_count < task.retry.max_attempts;
}

/** The part of the lifecycle configuration that decides whether a retry could ever run. */
export type RetryConfig = Pick<LifecycleConfig, 'leaseSafetyMarginMs'>;

/**
 * Whether an attempt of `task` can be granted dispatch: its execution budget must leave the
 * worker's dispatch renewal a window above the lease safety margin ({@link minSubmitTimeoutMs}).
 * Submit refuses shorter budgets, but a task stored by an earlier version, or before the operator
 * raised LEDGENCE_LEASE_SAFETY_MARGIN_MS, has one; its refused attempts do not count against
 * max_attempts, so retrying it could re-queue it for ever: its failure is final instead.
 */
export function dispatchPossible(task: TaskRow, config: RetryConfig): boolean {
  return task.timeout_ms >= minSubmitTimeoutMs(config);
}

/** Whether a failed or lost attempt is retried: budget left, and a retry that could run. */
export function retriable(task: TaskRow, config: RetryConfig): boolean {
  return attemptsRemain(task) && dispatchPossible(task, config);
}

/**
 * What a report means for the task (DESIGN §5 Settle): a settlement while
 * cancel is requested cancels; success succeeds; an application error or an
 * execution failure retries when `retryable !== false` and attempts remain,
 * and fails otherwise.
 */
export function decideSettlement(
  task: TaskRow,
  report: AttemptReport,
  config: RetryConfig = DEFAULT_LIFECYCLE_CONFIG,
): SettlementDecision {
  if (task.cancel_requested_at !== null) return { kind: 'cancel' };
  let failure: TaskFailure;
  let retryable: boolean;
  if (report.kind === 'completed') {
    const outcome = report.report.outcome;
    if (outcome.kind === 'success') return { kind: 'succeed', output: outcome.output };
    failure = { kind: 'application', error: outcome.error };
    retryable = outcome.error.retryable !== false;
  } else {
    failure = { kind: 'execution', error: report.report };
    retryable = report.report.retryable;
  }
  if (retryable && retriable(task, config)) {
    return { kind: 'retry', delay_ms: retryDelayFor(task), failure };
  }
  return { kind: 'fail', failure };
}

/**
 * The decision to apply now for one held while cleanup was unconfirmed: a
 * cancel requested since then wins over a retry (a cancelled task is never
 * retried), while an outcome already known — success or final failure — stands.
 */
export function heldDecision(task: TaskRow, held: SettlementDecision): SettlementDecision {
  return held.kind === 'retry' && task.cancel_requested_at !== null ? { kind: 'cancel' } : held;
}

const ATTEMPT_STATE_OF: Record<SettlementDecision['kind'], AttemptState> = {
  succeed: 'succeeded',
  fail: 'failed',
  retry: 'failed',
  cancel: 'cancelled',
};

/**
 * Applies a decision: the attempt finishes, and the task becomes terminal or
 * is re-queued after the retry delay. Shared by settle, confirm-quiescence and
 * recovery, so an outcome is applied the same way whichever path ends it.
 */
export function applyDecision(
  task: TaskRow,
  attempt: AttemptRow,
  decision: SettlementDecision,
  now: Timestamp,
  leading: readonly HistoryEntry[] = [],
): { task: TaskRow; attempt: AttemptRow; history: HistoryRow[] } {
  const finished: AttemptRow = {
    ...attempt,
    state: ATTEMPT_STATE_OF[decision.kind],
    pending: null,
    finished_at: now,
  };
  const base: TaskRow = { ...task, current_attempt_id: null };
  let next: TaskRow;
  let reason: HistoryEntry[0];
  switch (decision.kind) {
    case 'succeed':
      next = terminal(base, { state: 'succeeded', output: decision.output }, now);
      reason = 'succeeded';
      break;
    case 'fail':
      next = terminal(base, { state: 'failed', failure: decision.failure }, now);
      reason = 'failed';
      break;
    case 'cancel':
      next = terminal(base, { state: 'cancelled' }, now);
      reason = 'cancelled';
      break;
    case 'retry':
      next = { ...base, state: 'queued', available_at: now + decision.delay_ms };
      reason = 'retry_scheduled';
      break;
  }
  const recorded = recordHistory(next, now, [...leading, [reason, attempt.attempt_id]]);
  return { task: recorded.task, attempt: finished, history: recorded.history };
}

/**
 * A result that changed the rows. Spelled out: `{ changed, ...applied, reply }` adds `reply`
 * after a spread, V8's slow path (bench/README.md, "Objects built by spread").
 */
function changedBy<R>(
  applied: { task: TaskRow; attempt: AttemptRow; history: HistoryRow[] },
  reply: R,
): SettleSideResult<R> {
  return {
    changed: true,
    task: applied.task,
    attempt: applied.attempt,
    history: applied.history,
    reply,
  };
}

function terminal(
  task: TaskRow,
  outcome: NonNullable<TaskRow['outcome']>,
  now: Timestamp,
): TaskRow {
  return { ...task, state: outcome.state, outcome, terminal_at: now };
}

/**
 * Seed `validate_task_output`: "The lifecycle core verifies the report's activation identity
 * against the acquired task before acceptance." Workflows (DESIGN §9) are not built, so no task
 * is a workflow activation: a report naming one does not describe this task.
 */
function sameReport(command: SettleCommand, attempt: AttemptRow): void {
  if (command.report.kind !== 'completed') return;
  const identity = command.report.report.context.identity;
  if (
    identity.task_id !== attempt.task_id ||
    identity.attempt_id !== attempt.attempt_id ||
    identity.activation_id !== undefined
  ) {
    throw new ContractError(
      'invalid_input',
      '$.report.report.context.identity must name the owner’s task and attempt, and no workflow activation (the task is not one)',
      { reason: 'identity_mismatch', path: '$.report.report.context.identity' },
    );
  }
}

/**
 * Settles an attempt exactly once (DESIGN §5 Settle). A settlement already
 * recorded for the attempt answers first: the same `operation_id` with the
 * same canonical command replays its receipt (`already_accepted: true`, even
 * after the lease ended); anything else is `409 conflict`. Otherwise the owner
 * must hold a live lease (else `ownership_lost`). `report_accepted` is always
 * recorded; with `quiescence: confirmed` the decision applies at once, with
 * `unconfirmed` the task stays active until cleanup is confirmed or the authority deadline.
 */
export function settleAttempt(
  loadedTask: TaskRow | null,
  loadedAttempt: AttemptRow | null,
  command: SettleCommand,
  now: Timestamp,
  config: RetryConfig = DEFAULT_LIFECYCLE_CONFIG,
): SettleSideResult<SettleReply> {
  const { task, attempt } = requireOwnedAttempt(loadedTask, loadedAttempt, command.owner);
  if (attempt.settlement !== null) {
    if (
      attempt.settlement.receipt.operation_id === command.operation_id &&
      isRecordedCommand(attempt.settlement.command, attempt.settlement_digest, command)
    ) {
      const reply = {
        receipt: attempt.settlement.receipt,
        already_accepted: true,
        task_state: task.state,
      };
      return { changed: false, task, attempt, history: [], reply };
    }
    throw new ContractError(
      'conflict',
      attempt.settlement.receipt.operation_id === command.operation_id
        ? `operation ${command.operation_id} was already used with a different settlement`
        : `attempt ${attempt.attempt_id} already has a different settlement`,
    );
  }
  if (!leaseLive(attempt, now)) throw ownershipLost(command.owner, 'has expired or ended');
  sameReport(command, attempt);
  const receipt = {
    operation_id: command.operation_id,
    task_id: attempt.task_id,
    attempt_id: attempt.attempt_id,
    accepted_at: now,
  };
  const settled: AttemptRow = {
    ...attempt,
    settlement: { command, receipt },
    settlement_digest: null,
    quiescence: command.quiescence,
  };
  const decision = decideSettlement(task, command.report, config);
  const accepted: HistoryEntry = ['report_accepted', attempt.attempt_id];
  if (command.quiescence === 'unconfirmed') {
    const recorded = recordHistory(task, now, [accepted]);
    return {
      changed: true,
      task: recorded.task,
      // DESIGN §5: the task stays active until cleanup is confirmed or the authority deadline,
      // not merely until this lease would have lapsed: the abandoned code may still run, and the
      // worker that reported it stops renewing. Recovery then applies the decision at that time.
      attempt: { ...settled, pending: decision, lease_expires_at: attempt.authority_deadline },
      history: recorded.history,
      reply: { receipt, already_accepted: false, task_state: recorded.task.state },
    };
  }
  const applied = applyDecision(task, settled, decision, now, [accepted]);
  return changedBy(applied, { receipt, already_accepted: false, task_state: applied.task.state });
}

/**
 * Gives back a claim whose poll reply could not be delivered (the service's hand-back, DESIGN §5
 * "a client disconnect ends the wait without consuming a task"): settles it as
 * {@link settleAttempt} does, except that a re-queued task takes back its place in the queue —
 * its own due time, no retry delay: no worker saw the task, so nothing failed that a delay should
 * space out, and the next poll may take it at once. Unless its attempt has been renewed: a
 * renewal means the reply did reach a worker — the hand-back answers a late copy of a delivered
 * poll — and, once dispatch is granted, that worker runs the task: settling under it would count
 * the attempt and refuse the worker's own result. Checked here, under the task's lock, because
 * the caller's reading of the reply came from an earlier transaction, and a renewal may commit in
 * between. Refused as `409 conflict`, writing nothing.
 */
export function handBackAttempt(
  loadedTask: TaskRow | null,
  loadedAttempt: AttemptRow | null,
  command: SettleCommand,
  now: Timestamp,
  config: RetryConfig = DEFAULT_LIFECYCLE_CONFIG,
): SettleSideResult<SettleReply> {
  const { task, attempt } = requireOwnedAttempt(loadedTask, loadedAttempt, command.owner);
  if (attempt.renew_sequence > 0) {
    throw new ContractError(
      'conflict',
      `attempt ${attempt.attempt_id} was renewed by its worker; it is not given back`,
    );
  }
  const settled = settleAttempt(loadedTask, loadedAttempt, command, now, config);
  if (!settled.changed || settled.task.state !== 'queued') return settled;
  // The claim left `available_at` as it was, so this is the place the task held before it.
  return changedBy(
    {
      task: { ...settled.task, available_at: task.available_at },
      attempt: settled.attempt,
      history: settled.history,
    },
    settled.reply,
  );
}

/**
 * Confirms that required cleanup is done for a settled attempt whose report
 * said `unconfirmed`, applying its decision (`cleanup_confirmed`). Confirming
 * again, or an attempt settled `confirmed`, answers the task's state and
 * changes nothing; confirming before any settlement is `409 conflict`, and
 * after the authority deadline `409 ownership_lost` (recovery applies it),
 * before recovery ran and after.
 */
export function confirmQuiescence(
  loadedTask: TaskRow | null,
  loadedAttempt: AttemptRow | null,
  owner: LeaseOwner,
  now: Timestamp,
): SettleSideResult<TaskState> {
  const { task, attempt } = requireOwnedAttempt(loadedTask, loadedAttempt, owner);
  if (attempt.pending === null) {
    if (attempt.settlement === null) {
      if (!leaseLive(attempt, now)) throw ownershipLost(owner, 'has expired or ended');
      throw new ContractError(
        'conflict',
        `attempt ${attempt.attempt_id} has no settlement to confirm; settle it first`,
      );
    }
    // Settled `unconfirmed` and no longer held: recovery applied the outcome at the authority
    // deadline, unconfirmed. A confirmation now is as late as one that came before recovery ran
    // (below), and is answered the same, whichever ran first; answering the task's state would
    // read as taken, and be the state of a later attempt once the task was claimed again.
    if (attempt.quiescence === 'unconfirmed') {
      throw ownershipLost(owner, 'held its cleanup past the deadline');
    }
    return { changed: false, task, attempt, history: [], reply: task.state };
  }
  // The hold ends at the authority deadline (the lease was set to it at settle): from then on
  // the decision is recovery's to apply (its outcome's record only: neither `lease_expired` nor
  // `cleanup_confirmed`, see recovery.ts), and a confirmation is as stale as
  // any other call of an expired owner (DESIGN §1.6, §5) — whichever of the two runs first.
  if (!leaseLive(attempt, now)) throw ownershipLost(owner, 'held its cleanup past the deadline');
  const applied = applyDecision(
    task,
    { ...attempt, quiescence: 'confirmed' },
    heldDecision(task, attempt.pending),
    now,
    [['cleanup_confirmed', attempt.attempt_id]],
  );
  return changedBy(applied, applied.task.state);
}
