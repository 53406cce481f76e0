import {
  ACQUIRE_BATCH_REPLY_MAX_BYTES,
  type AcquireCommand,
  type AcquireReply,
  ContractError,
  type Timestamp,
  utf8ByteLength,
} from '@ledgence/contracts';
import type { LifecycleConfig } from './config.js';
import { recordHistory } from './history.js';
import { leaseLive } from './lease.js';
import type { AttemptRow, CursorRow, HistoryRow, SessionRow, TaskRow } from './rows.js';
import { requireLiveSession } from './session.js';
import { assignmentAt } from './views.js';

/**
 * How a poll relates to its slot's cursor: `new` (sequence `last + 1`; first
 * poll 1) may claim a task; `replay` (sequence `last`) answers from the
 * cursor. Anything else was rejected while classifying.
 */
export type PollKind = { kind: 'new' } | { kind: 'replay'; cursor: CursorRow };

/**
 * Checks a poll against its session and its slot, in DESIGN §4.1's order:
 * session exists in scope (404) and is live (410); the queue is the session's
 * and the consumer is one of its slots (400); then the sequence (409
 * `sequence_conflict`); then a new poll needs a free slot (409 `consumer_busy`).
 *
 * @param slotAttempt - the attempt the cursor last assigned, if any.
 */
export function classifyPoll(
  session: SessionRow | null,
  cursor: CursorRow | null,
  slotAttempt: AttemptRow | null,
  command: AcquireCommand,
  now: Timestamp,
): PollKind {
  const live = requireLiveSession(session, command.scope, command.worker_session_id, now);
  if (command.queue !== live.queue) {
    throw new ContractError('invalid_input', `$.queue must be the session's queue`, {
      reason: 'queue_mismatch',
      path: '$.queue',
    });
  }
  if (command.consumer_id >= live.concurrency) {
    throw new ContractError(
      'invalid_input',
      `$.consumer_id must be below the session's concurrency (${live.concurrency})`,
      { reason: 'consumer_out_of_range', path: '$.consumer_id' },
    );
  }
  const last = cursor?.sequence ?? 0;
  if (cursor !== null && command.sequence === last) return { kind: 'replay', cursor };
  if (command.sequence !== last + 1) {
    throw new ContractError(
      'sequence_conflict',
      `acquire sequence ${command.sequence} is neither the last (${last}) nor the next (${last + 1})`,
    );
  }
  // A slot holds at most one live attempt. An attempt whose lease lapsed no
  // longer occupies it, even before recovery has marked it lost.
  if (slotAttempt !== null && leaseLive(slotAttempt, now)) {
    throw new ContractError(
      'consumer_busy',
      `consumer ${command.consumer_id} still holds attempt ${slotAttempt.attempt_id}; settle it first`,
    );
  }
  return { kind: 'new' };
}

/**
 * The answer to a replayed poll: the same assignment with freshly sampled
 * authority, `ownership_lost` if that attempt is no longer owned, or `empty`
 * again (DESIGN §5 Acquire).
 */
export function replayPoll(
  cursor: CursorRow,
  task: TaskRow | null,
  attempt: AttemptRow | null,
  now: Timestamp,
): AcquireReply {
  const sequence = cursor.sequence;
  if (cursor.assignment === null) return { disposition: 'empty', sequence };
  if (
    task === null ||
    attempt === null ||
    !leaseLive(attempt, now) ||
    attempt.settlement !== null
  ) {
    return { disposition: 'ownership_lost', sequence, assignment: cursor.assignment };
  }
  return { disposition: 'assigned', sequence, assignment: assignmentAt(task, attempt, now) };
}

/** A new poll that found nothing: the cursor advances to it, recording no assignment. */
export function emptyPoll(command: AcquireCommand): { cursor: CursorRow; reply: AcquireReply } {
  return {
    cursor: cursorFor(command, null),
    reply: { disposition: 'empty', sequence: command.sequence },
  };
}

/** Identifiers a store issues for a new attempt. */
export interface ClaimIds {
  /** The new attempt's id. */
  attempt_id: string;
  /** The id of its lease, part of the fencing owner. */
  lease_id: string;
}

/** Everything one claim writes, and its reply. */
export interface ClaimResult {
  /** The task, now `active` with the new attempt current. */
  task: TaskRow;
  /** The new attempt and its lease. */
  attempt: AttemptRow;
  /** The `claimed` record. */
  history: HistoryRow[];
  /** The slot's cursor, advanced to this poll with its assignment. */
  cursor: CursorRow;
  /** The `assigned` reply. */
  reply: AcquireReply;
}

/**
 * Claims an eligible queued task for a new poll: creates the attempt and its
 * lease (`expires_at = min(now + lease, authority deadline)`), marks the task
 * active, records `claimed` and the cursor. A fresh authority has
 * `renew_sequence: 0` and `dispatch_allowed: false` (DESIGN §4.1).
 *
 * @param task - a queued task with `available_at <= now`, locked by the store.
 */
export function claimTask(
  task: TaskRow,
  command: AcquireCommand,
  now: Timestamp,
  ids: ClaimIds,
  config: LifecycleConfig,
): ClaimResult {
  if (task.state !== 'queued' || task.available_at > now) {
    throw new Error(`claimTask: task ${task.task_id} is not eligible (store selection bug)`);
  }
  const ordinal = task.attempt_count + 1;
  const deadline = now + task.timeout_ms;
  const authorityDeadline = deadline + config.cleanupGraceMs;
  const attempt: AttemptRow = {
    tenant_id: task.tenant_id,
    namespace: task.namespace,
    task_id: task.task_id,
    attempt_id: ids.attempt_id,
    ordinal,
    lease_id: ids.lease_id,
    generation: ordinal,
    worker_session_id: command.worker_session_id,
    consumer_id: command.consumer_id,
    state: 'active',
    claimed_at: now,
    deadline,
    authority_deadline: authorityDeadline,
    lease_expires_at: Math.min(now + config.leaseDurationMs, authorityDeadline),
    renew_sequence: 0,
    last_renewal: null,
    dispatch_allowed: false,
    quiescence: 'unconfirmed',
    settlement: null,
    settlement_digest: null,
    pending: null,
    finished_at: null,
  };
  const claimed: TaskRow = {
    ...task,
    state: 'active',
    attempt_count: ordinal,
    current_attempt_id: ids.attempt_id,
  };
  const { task: next, history } = recordHistory(claimed, now, [['claimed', ids.attempt_id]]);
  return {
    task: next,
    attempt,
    history,
    cursor: cursorFor(command, { task_id: task.task_id, attempt_id: ids.attempt_id }),
    reply: {
      disposition: 'assigned',
      sequence: command.sequence,
      assignment: assignmentAt(next, attempt, now),
    },
  };
}

function cursorFor(command: AcquireCommand, assignment: CursorRow['assignment']): CursorRow {
  return {
    worker_session_id: command.worker_session_id,
    consumer_id: command.consumer_id,
    sequence: command.sequence,
    command,
    assignment,
  };
}

/**
 * The bytes an acquire batch's assignments may still take (ACQUIRE_BATCH_REPLY_MAX_BYTES). A store
 * asks {@link AcquireReplyBudget.admits} before it writes a claim, and answers a poll it refuses
 * `empty`, its task left queued: a reply too large to encode would fail after the claims were
 * written, and fail again on every replay of the same sequences.
 */
export class AcquireReplyBudget {
  #used: number;

  /** @param used - bytes the reply already holds (earlier polls of the same batch). */
  constructor(used = 0) {
    this.#used = used;
  }

  /** Bytes of the assignments and replays counted so far. */
  get used(): number {
    return this.#used;
  }

  /**
   * Counts a reply that must be given whatever its size — a replayed poll answers what it
   * answered before — so that new claims beside it stop before the batch's reply passes the bound.
   */
  count(reply: AcquireReply): void {
    if (reply.disposition === 'empty') return;
    this.#used += utf8ByteLength(JSON.stringify(reply));
  }

  /**
   * Whether `reply` fits beside the assignments admitted so far, and if so counts it. The first
   * always fits: one assignment is bounded by the submit limits, and a batch must make progress.
   */
  admits(reply: AcquireReply): boolean {
    const bytes = utf8ByteLength(JSON.stringify(reply));
    if (this.#used > 0 && this.#used + bytes > ACQUIRE_BATCH_REPLY_MAX_BYTES) return false;
    this.#used += bytes;
    return true;
  }
}
