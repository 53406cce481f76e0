import {
  type Authority,
  ContractError,
  canonicalEqual,
  type RenewCommand,
  type Timestamp,
} from '@ledgence/contracts';
import type { LifecycleConfig } from './config.js';
import { type HistoryEntry, recordHistory } from './history.js';
import { authorityAt, leaseLive, ownershipLost, requireOwnedAttempt } from './lease.js';
import type { AttemptRow, HistoryRow, TaskRow } from './rows.js';

/** What a renewal wrote (nothing when it replayed) and its reply. */
export interface RenewResult {
  /** Whether anything is to be written; false for a replayed sequence. */
  changed: boolean;
  /** The task (its `dispatch_count` advanced when dispatch was granted). */
  task: TaskRow;
  /** The attempt with its renewed lease and sequence. */
  attempt: AttemptRow;
  /** `dispatch_authorized` on the first granted dispatch; otherwise empty. */
  history: HistoryRow[];
  /** The current authority. */
  reply: Authority;
}

/**
 * Renews a lease. The owner must hold a live lease (else `ownership_lost`);
 * `sequence == last` returns the current authority without extending twice
 * (the same sequence with another intent is `409 conflict`); `last + 1`
 * extends the lease to `min(now + lease, authority deadline)`; anything else
 * is `409 sequence_conflict`. Intent `dispatch` is granted only if cancel was
 * not requested and more than the safety margin of execution budget remains;
 * the first grant records `dispatch_authorized` and counts the attempt
 * against `max_attempts`. Heartbeats append no history.
 */
export function renewLease(
  loadedTask: TaskRow | null,
  loadedAttempt: AttemptRow | null,
  command: RenewCommand,
  now: Timestamp,
  config: LifecycleConfig,
): RenewResult {
  const { task, attempt } = requireOwnedAttempt(loadedTask, loadedAttempt, command.owner);
  if (!leaseLive(attempt, now)) throw ownershipLost(command.owner, 'has expired or ended');
  if (command.sequence === attempt.renew_sequence && attempt.last_renewal !== null) {
    if (!canonicalEqual(attempt.last_renewal, command)) {
      throw new ContractError(
        'conflict',
        `renew sequence ${command.sequence} was already used with a different intent`,
      );
    }
    return { changed: false, task, attempt, history: [], reply: authorityAt(task, attempt, now) };
  }
  if (command.sequence !== attempt.renew_sequence + 1) {
    throw new ContractError(
      'sequence_conflict',
      `renew sequence ${command.sequence} is neither the last (${attempt.renew_sequence}) nor the next (${attempt.renew_sequence + 1})`,
    );
  }
  const grant =
    command.intent === 'dispatch' &&
    !attempt.dispatch_allowed &&
    task.cancel_requested_at === null &&
    attempt.settlement === null &&
    attempt.deadline - now > config.leaseSafetyMarginMs;
  const renewed: AttemptRow = {
    ...attempt,
    renew_sequence: command.sequence,
    last_renewal: command,
    // A settlement awaiting cleanup already holds the lease to the authority deadline; a
    // keep-alive must not shorten it.
    lease_expires_at:
      attempt.pending !== null
        ? attempt.lease_expires_at
        : Math.min(now + config.leaseDurationMs, attempt.authority_deadline),
    dispatch_allowed: attempt.dispatch_allowed || grant,
  };
  const entries: HistoryEntry[] = grant ? [['dispatch_authorized', attempt.attempt_id]] : [];
  const counted: TaskRow = grant ? { ...task, dispatch_count: task.dispatch_count + 1 } : task;
  const { task: next, history } = recordHistory(counted, now, entries);
  return {
    changed: true,
    task: next,
    attempt: renewed,
    history,
    reply: authorityAt(next, renewed, now),
  };
}
