/**
 * The acquire protocol of one consumer slot, as a pure state machine (no
 * I/O, no clock): which session and sequence the next poll uses, and what
 * each reply or failure means. The worker runtime feeds it events and acts on
 * the effects it returns.
 *
 * The rules (DESIGN §4.1, §5 Acquire), and how this SDK resyncs:
 *
 * 1. A slot's cursor lives on one session. Its first poll is sequence 1; each
 *    *completed* poll (a reply with a disposition) advances it by exactly one.
 * 2. A poll whose reply was lost (network error, timeout, 5xx, `unavailable`)
 *    stays *pending* and is re-sent with the same session and sequence. The
 *    server either never saw it (then it is the next poll) or replays it (the
 *    same assignment with fresh authority, `ownership_lost`, or `empty`), so a
 *    lost reply never loses or duplicates a task.
 * 3. `consumer_busy` did not advance the cursor (the slot still holds a live
 *    attempt on the server, e.g. a settlement that was given up on): the same
 *    sequence is retried after a backoff, until that lease ends.
 * 4. `session_expired` / `session_not_found`: the cursor is gone with its
 *    session. The slot drops its pending poll (an assignment it may have
 *    carried expires with its lease and is recovered without counting an
 *    attempt, since dispatch was never granted), and restarts at sequence 1
 *    on the worker's next session.
 * 5. `sequence_conflict`: the slot's cursor and the server's disagree, and the
 *    server's `last` cannot be learnt. The slot abandons that session's
 *    cursor: it asks for a new session and restarts at sequence 1 there. It
 *    never guesses a sequence. Other slots keep replaying any pending poll on
 *    the old session first, then move over.
 * 6. A slot moves to the worker's current session only with no pending poll,
 *    so no reply is ever abandoned while its session still answers.
 * 7. Anything else (`invalid_input`, `unauthorized`, `forbidden`, a reply that
 *    breaks the contract) is fatal for the worker: retrying cannot fix it.
 */
import type { AcquireReply, Assignment, AttemptRef } from '@ledgence/contracts';
import { ProblemError, TransportError } from './errors.js';

/** Where a slot is in its cycle. */
export type SlotPhase = 'idle' | 'polling' | 'holding';

/** The replay state of one consumer slot. */
export interface SlotState {
  /** The slot's consumer id (0..concurrency-1). */
  readonly consumerId: number;
  /** The session the slot's cursor lives on; `null` before the first poll. */
  readonly sessionId: string | null;
  /** The sequence of the last completed poll on `sessionId` (0: none). */
  readonly last: number;
  /** An unacknowledged poll's sequence on `sessionId`, re-sent as is; `null`: none. */
  readonly pending: number | null;
  /** A session whose cursor this slot gave up on; never polled again. */
  readonly abandoned: string | null;
  readonly phase: SlotPhase;
  /** Consecutive failed polls, for backoff. */
  readonly failures: number;
  /**
   * Sessions lost in a row (`session_gone`, `sequence_conflict`) without a completed poll. Kept
   * apart from `failures`: the failed polls of an outage that outlasted the session do not make
   * its first loss a repeated one.
   */
  readonly losses: number;
}

/** The command a slot sends: which session and which sequence. */
export interface PollCommand {
  readonly sessionId: string;
  readonly consumerId: number;
  readonly sequence: number;
  /** Whether this re-sends a pending poll (a possible replay on the server). */
  readonly replay: boolean;
}

/** How a failed poll is classified (see {@link classifyPollError}). */
export type PollFailure =
  | 'transport'
  | 'aborted'
  | 'consumer_busy'
  | 'session_gone'
  | 'sequence_conflict'
  | 'fatal';

/** What the runtime must do after an event. */
export type SlotEffect =
  | { kind: 'none' }
  | { kind: 'run'; assignment: Assignment }
  | { kind: 'lost'; attempt: AttemptRef }
  | { kind: 'backoff'; failures: number }
  | { kind: 'new_session'; staleSessionId: string; losses: number }
  | { kind: 'fatal'; message: string };

/** A transition's result. */
export interface SlotStep {
  readonly slot: SlotState;
  readonly effect: SlotEffect;
}

/** A fresh slot with no cursor. */
export function initialSlot(consumerId: number): SlotState {
  return {
    consumerId,
    sessionId: null,
    last: 0,
    pending: null,
    abandoned: null,
    phase: 'idle',
    failures: 0,
    losses: 0,
  };
}

/**
 * Starts a poll of an idle slot. Replays a pending poll on its own session;
 * otherwise moves to `currentSessionId` when it differs (restarting at 1) and
 * takes `last + 1`. Returns `null` when the slot cannot poll now: it is not
 * idle, or the only session on offer is one it abandoned.
 */
export function beginPoll(
  slot: SlotState,
  currentSessionId: string | null,
): { slot: SlotState; command: PollCommand } | null {
  if (slot.phase !== 'idle') return null;
  if (slot.pending !== null && slot.sessionId !== null) {
    return {
      slot: { ...slot, phase: 'polling' },
      command: {
        sessionId: slot.sessionId,
        consumerId: slot.consumerId,
        sequence: slot.pending,
        replay: true,
      },
    };
  }
  if (currentSessionId === null || currentSessionId === slot.abandoned) return null;
  const moving = slot.sessionId !== currentSessionId;
  const sequence = moving ? 1 : slot.last + 1;
  return {
    slot: {
      ...slot,
      sessionId: currentSessionId,
      last: moving ? 0 : slot.last,
      pending: sequence,
      phase: 'polling',
    },
    command: { sessionId: currentSessionId, consumerId: slot.consumerId, sequence, replay: false },
  };
}

/** A poll completed: the cursor advances to its sequence, and an assignment is held. */
export function pollReplied(slot: SlotState, reply: AcquireReply): SlotStep {
  if (slot.phase !== 'polling' || slot.pending === null) {
    return { slot, effect: { kind: 'fatal', message: 'a poll reply arrived for an idle slot' } };
  }
  if (reply.sequence !== slot.pending) {
    return {
      slot,
      effect: {
        kind: 'fatal',
        message: `the server answered poll ${slot.pending} of consumer ${slot.consumerId} with sequence ${reply.sequence}`,
      },
    };
  }
  const advanced = { ...slot, last: slot.pending, pending: null, failures: 0, losses: 0 };
  switch (reply.disposition) {
    case 'assigned':
      return {
        slot: { ...advanced, phase: 'holding' },
        effect: { kind: 'run', assignment: reply.assignment },
      };
    case 'ownership_lost':
      return {
        slot: { ...advanced, phase: 'idle' },
        effect: { kind: 'lost', attempt: reply.assignment },
      };
    default:
      return { slot: { ...advanced, phase: 'idle' }, effect: { kind: 'none' } };
  }
}

/** A poll failed; see the module rules for what each failure does to the cursor. */
export function pollFailed(slot: SlotState, failure: PollFailure, message = ''): SlotStep {
  const idle: SlotState = { ...slot, phase: slot.phase === 'polling' ? 'idle' : slot.phase };
  switch (failure) {
    case 'aborted':
      // The reply may still have been produced: keep the sequence pending.
      return { slot: idle, effect: { kind: 'none' } };
    case 'transport':
    case 'consumer_busy': {
      const failures = slot.failures + 1;
      return { slot: { ...idle, failures }, effect: { kind: 'backoff', failures } };
    }
    case 'session_gone':
    case 'sequence_conflict': {
      const stale = slot.sessionId ?? '';
      const losses = slot.losses + 1;
      return {
        slot: {
          ...idle,
          pending: null,
          last: 0,
          // A vanished session cannot be polled anyway, and a conflicting
          // cursor must not be: the slot would conflict forever. Either way it
          // waits for the worker's next session.
          abandoned: slot.sessionId,
          failures: slot.failures + 1,
          losses,
        },
        effect: { kind: 'new_session', staleSessionId: stale, losses },
      };
    }
    default:
      return { slot: idle, effect: { kind: 'fatal', message } };
  }
}

/** The slot's attempt is finished (settled, released or lost): the slot may poll again. */
export function released(slot: SlotState): SlotState {
  return slot.phase === 'holding' ? { ...slot, phase: 'idle' } : slot;
}

/**
 * Classifies a failed poll (a whole request's error, or one batch item's
 * problem). `aborted`: the runtime cancelled it (stop), so the sequence stays
 * pending for a drain replay.
 */
export function classifyPollError(error: unknown, aborted = false): PollFailure {
  if (aborted) return 'aborted';
  if (error instanceof TransportError) return 'transport';
  if (error instanceof ProblemError) {
    switch (error.code) {
      case 'unavailable':
        return 'transport';
      case 'consumer_busy':
        return 'consumer_busy';
      case 'session_expired':
      case 'session_not_found':
        return 'session_gone';
      case 'sequence_conflict':
        return 'sequence_conflict';
      default:
        return 'fatal';
    }
  }
  return 'fatal';
}
