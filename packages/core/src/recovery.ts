import type { RecoveryProgress, Timestamp } from '@ledgence/contracts';
import { DEFAULT_LIFECYCLE_CONFIG } from './config.js';
import type { AttemptRow, HistoryRow, SettlementDecision, TaskRow } from './rows.js';
import {
  applyDecision,
  heldDecision,
  type RetryConfig,
  retriable,
  retryDelayFor,
} from './settle.js';

/** How recovering one expired lease ended. */
export type RecoveryOutcome = 'requeued' | 'failed' | 'cancelled' | 'finalized';

/** What recovering one expired lease wrote. */
export interface RecoveryResult {
  /** How it ended. */
  outcome: RecoveryOutcome;
  /** The task after recovery: re-queued or terminal. */
  task: TaskRow;
  /** The attempt, now finished (`lost`, or its held decision applied). */
  attempt: AttemptRow;
  /** The records written: `lease_expired` (unless a held decision applied), then the outcome's. */
  history: HistoryRow[];
}

/**
 * Recovers an attempt whose lease expired at store time (DESIGN §5 Lease
 * expiry), or returns `null` when it is not (or no longer) expired — the
 * store re-checks under the row lock, so recovery racing a late settle or
 * renew yields exactly one outcome.
 *
 * A settled attempt awaiting cleanup takes its recorded decision. Otherwise
 * the attempt is `lost` (`lease_expired`): with cancel requested the task is
 * cancelled; with dispatched attempts at `max_attempts` it fails with
 * `lease_expired`, as it does when no attempt of it could ever be granted dispatch
 * (`dispatchPossible`); else it is re-queued after the retry delay. An attempt never
 * granted dispatch did not count against `max_attempts`.
 */
export function recoverExpiredLease(
  task: TaskRow,
  attempt: AttemptRow,
  now: Timestamp,
  config: RetryConfig = DEFAULT_LIFECYCLE_CONFIG,
): RecoveryResult | null {
  if (
    attempt.state !== 'active' ||
    attempt.lease_expires_at > now ||
    task.current_attempt_id !== attempt.attempt_id
  ) {
    return null;
  }
  if (attempt.pending !== null) {
    const held = heldDecision(task, attempt.pending);
    return { outcome: 'finalized', ...applyDecision(task, attempt, held, now) };
  }
  const lost: AttemptRow = { ...attempt, state: 'lost', finished_at: now };
  const decision: SettlementDecision =
    task.cancel_requested_at !== null
      ? { kind: 'cancel' }
      : retriable(task, config)
        ? {
            kind: 'retry',
            delay_ms: retryDelayFor(task),
            failure: { kind: 'lease_expired', attempts: task.attempt_count },
          }
        : { kind: 'fail', failure: { kind: 'lease_expired', attempts: task.attempt_count } };
  const applied = applyDecision(task, lost, decision, now, [['lease_expired', attempt.attempt_id]]);
  // applyDecision finishes the attempt by the decision's kind; a lost lease stays `lost`.
  const outcome: RecoveryOutcome =
    decision.kind === 'cancel' ? 'cancelled' : decision.kind === 'retry' ? 'requeued' : 'failed';
  return {
    outcome,
    task: applied.task,
    attempt: { ...applied.attempt, state: 'lost' },
    history: applied.history,
  };
}

/** The progress of a recovery pass before any candidate is handled. */
export function startRecoveryProgress(scanned: number, hasMore: boolean): RecoveryProgress {
  return {
    scanned,
    recovered: 0,
    requeued: 0,
    failed: 0,
    cancelled: 0,
    finalized: 0,
    has_more: hasMore,
  };
}

/**
 * Counts one candidate's result into a pass's progress, the same way in every
 * store: a lost attempt by what it did to its task, a held settlement as
 * `finalized`, and a candidate a late settle or renew won (`null`) not at all.
 */
export function countRecovery(progress: RecoveryProgress, result: RecoveryResult | null): void {
  if (result === null) return;
  if (result.outcome === 'finalized') {
    progress.finalized += 1;
    return;
  }
  progress.recovered += 1;
  progress[result.outcome] += 1;
}
