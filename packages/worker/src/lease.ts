/**
 * One held lease, as a pure state machine: the renew sequence, the local
 * estimate of when the lease ends, and the authority last seen (cancel
 * requested, dispatch granted). The runtime sends the commands it yields and
 * feeds back replies, failures and the clock.
 *
 * Rules (DESIGN §4.1, §5 Renew):
 * - An assignment starts at renew sequence 0. The first renew is sequence 1
 *   with intent `dispatch`; user code runs only if it is granted.
 * - Each acknowledged renew advances the sequence by one. A renew whose reply
 *   was lost stays pending and is re-sent *verbatim* (same sequence, same
 *   intent: the server answers the same sequence with another intent with
 *   409 `conflict`), so it is replayed, never applied twice.
 * - The local expiry is `send time + remaining_ms` of the last reply: the
 *   server sampled its clock after the request left, so the real expiry is
 *   never earlier than this estimate (no clock sync needed).
 * - `ownership_lost` / `not_found`: the lease is gone; nothing more is sent
 *   for it, settlement included (the server would refuse it).
 * - `sequence_conflict` / `conflict` on a renew cannot happen when only this
 *   machine renews; if it does, the lease can no longer be extended: the
 *   handler is aborted, but its settlement is still attempted while the
 *   lease may be live.
 * - The lease is lost locally when its estimated expiry passes without a
 *   successful renewal — except while the dispatch renew is unanswered: no
 *   user code runs before that answer, and the answer is the server's own
 *   word on the lease (granted with a fresh expiry, or `ownership_lost`).
 *   The local estimate starts when the acquire was *sent*, so after a long
 *   poll it can run out before a granted dispatch arrives; giving up then
 *   would waste an attempt the server counted.
 * - The heartbeat period is the worker's setting, the lease duration the
 *   server's: a lease is renewed at the latest halfway through the time it
 *   has left, even when that comes before the next periodic heartbeat (a
 *   worker left at the default 10 s period keeps a server's 1 s leases).
 */
import type {
  Assignment,
  Authority,
  LeaseOwner,
  RenewCommand,
  RenewIntent,
} from '@ledgence/contracts';
import { ProblemError, TransportError } from './errors.js';

/** Why a lease stopped being held. */
export type LeaseLoss = 'ownership_lost' | 'expired' | 'renew_conflict';

/** The renew state of one held lease. */
export interface LeaseState {
  readonly owner: LeaseOwner;
  /** The last renew sequence the server acknowledged. */
  readonly acknowledged: number;
  /** A renew sent without an answer, to be re-sent verbatim. */
  readonly pending: { readonly sequence: number; readonly intent: RenewIntent } | null;
  /**
   * Local monotonic clock (ms, `performance.now()`) by which the lease has surely not expired on
   * the server: a wall-clock step can neither stretch nor shorten it.
   */
  readonly expiresAtLocal: number;
  /** Local monotonic clock (ms) when the execution budget ends; known after a renew reply. */
  readonly executionEndsAtLocal: number;
  readonly cancelRequested: boolean;
  readonly dispatchAllowed: boolean;
  /** Whether a reply to the dispatch renew has arrived. */
  readonly dispatchAnswered: boolean;
  /** Why the lease is no longer held; `null` while held. */
  readonly lost: LeaseLoss | null;
}

/** What the runtime must do after an event. */
export type LeaseEffect =
  | { kind: 'none' }
  | { kind: 'cancel' }
  | { kind: 'lost'; why: LeaseLoss }
  | { kind: 'retry' };

/** A transition's result. */
export interface LeaseStep {
  readonly lease: LeaseState;
  readonly effect: LeaseEffect;
}

/**
 * The lease of a fresh assignment.
 *
 * @param sentAt - local time the acquire request was sent.
 */
export function initialLease(assignment: Assignment, sentAt: number): LeaseState {
  const authority = assignment.authority;
  return {
    owner: authority.owner,
    acknowledged: authority.renew_sequence,
    pending: null,
    expiresAtLocal: sentAt + authority.remaining_ms,
    executionEndsAtLocal: sentAt + authority.execution_remaining_ms,
    cancelRequested: authority.cancel_requested,
    dispatchAllowed: authority.dispatch_allowed,
    dispatchAnswered: authority.dispatch_allowed,
    lost: null,
  };
}

/**
 * The next renew to send: the pending one verbatim, else `acknowledged + 1`
 * with `intent`. `null` once the lease is lost.
 */
export function nextRenew(
  lease: LeaseState,
  intent: RenewIntent,
): { lease: LeaseState; command: RenewCommand } | null {
  if (lease.lost !== null) return null;
  const pending = lease.pending ?? { sequence: lease.acknowledged + 1, intent };
  return {
    lease: { ...lease, pending },
    command: { owner: lease.owner, sequence: pending.sequence, intent: pending.intent },
  };
}

/**
 * A renew was answered with the current authority.
 *
 * @param sentAt - local time the renew request was sent.
 */
export function renewReplied(lease: LeaseState, authority: Authority, sentAt: number): LeaseStep {
  if (lease.lost === 'ownership_lost') return { lease, effect: { kind: 'none' } };
  const answered = lease.pending;
  const wasDispatch = answered?.intent === 'dispatch';
  const next: LeaseState = {
    ...lease,
    acknowledged: Math.max(lease.acknowledged, authority.renew_sequence),
    pending: answered !== null && authority.renew_sequence >= answered.sequence ? null : answered,
    expiresAtLocal: Math.max(lease.expiresAtLocal, sentAt + authority.remaining_ms),
    executionEndsAtLocal: sentAt + authority.execution_remaining_ms,
    cancelRequested: lease.cancelRequested || authority.cancel_requested,
    dispatchAllowed: authority.dispatch_allowed,
    dispatchAnswered: lease.dispatchAnswered || wasDispatch || authority.dispatch_allowed,
  };
  const effect: LeaseEffect =
    authority.cancel_requested && !lease.cancelRequested ? { kind: 'cancel' } : { kind: 'none' };
  return { lease: next, effect };
}

/** A renew failed; see the module rules. */
export function renewFailed(lease: LeaseState, error: unknown): LeaseStep {
  if (lease.lost !== null) return { lease, effect: { kind: 'none' } };
  if (error instanceof TransportError) return { lease, effect: { kind: 'retry' } };
  if (error instanceof ProblemError) {
    switch (error.code) {
      case 'unavailable':
        return { lease, effect: { kind: 'retry' } };
      case 'ownership_lost':
      case 'not_found':
        return lost(lease, 'ownership_lost');
      default:
        return lost(lease, 'renew_conflict');
    }
  }
  return lost(lease, 'renew_conflict');
}

/**
 * The clock moved: past the local expiry without a renewal, the lease is
 * lost — unless the dispatch renew is in flight (see the module rules).
 */
export function clockTick(lease: LeaseState, now: number): LeaseStep {
  if (lease.lost === null && !awaitingDispatch(lease) && now >= lease.expiresAtLocal) {
    return lost(lease, 'expired');
  }
  return { lease, effect: { kind: 'none' } };
}

function lost(lease: LeaseState, why: LeaseLoss): LeaseStep {
  return { lease: { ...lease, lost: why, pending: null }, effect: { kind: 'lost', why } };
}

/**
 * How long from `now` until this lease must be renewed whatever the heartbeat
 * period: half the time left before its local expiry, so a renewal whose
 * first send is lost still has time to be re-sent.
 */
export function renewDueIn(lease: LeaseState, now: number): number {
  return Math.max(0, Math.floor((lease.expiresAtLocal - now) / 2));
}

/**
 * How long after a failed renewal to send it again: the backoff's delay, but never later than the
 * heartbeat period, nor than the lease's due time ({@link renewDueIn}) — a backoff grown over a
 * few failures must not carry the retry past a short lease's expiry once the server is back.
 */
export function renewRetryDelay(
  backoffMs: number,
  renewIntervalMs: number,
  lease: LeaseState,
  now: number,
): number {
  const due = renewDueIn(lease, now);
  // Past its local expiry a lease is still held only while its dispatch renew is unanswered
  // (see clockTick), and then only the server's answer ends it: the due time, 0 from then on,
  // must not turn the retries into a loop without delay against a server that is down.
  if (due === 0 && awaitingDispatch(lease)) return Math.min(backoffMs, renewIntervalMs);
  return Math.min(backoffMs, renewIntervalMs, due);
}

/**
 * How long until an unanswered renewal is sent again, verbatim (the server replays it, so it
 * never extends twice): halfway through the time the lease has left ({@link renewDueIn}), at
 * least `minMs`. Past the local expiry, where only an unanswered dispatch renew still holds the
 * lease, the heartbeat period: the due time, 0 from then on, made it a copy every `minMs`, each a
 * new request while the earlier ones were still open — a hundred at once per slot against a
 * server that does not answer.
 */
export function renewResendDelay(
  lease: LeaseState,
  now: number,
  renewIntervalMs: number,
  minMs: number,
): number {
  const due = renewDueIn(lease, now);
  if (due === 0 && awaitingDispatch(lease)) return Math.max(renewIntervalMs, minMs);
  return Math.max(due, minMs);
}

/** Whether the dispatch renew is sent and not yet answered (the local expiry is not trusted). */
export function awaitingDispatch(lease: LeaseState): boolean {
  return !lease.dispatchAnswered && lease.pending?.intent === 'dispatch';
}

/** Whether a settlement is still worth sending: not when the server said the lease is gone. */
export function maySettle(lease: LeaseState): boolean {
  return lease.lost !== 'ownership_lost';
}

/** The outcome of the dispatch request. */
export type DispatchDecision =
  | { kind: 'run' }
  | { kind: 'refuse'; failure: 'cancelled' | 'timed_out'; retryable: boolean; message: string };

/**
 * Whether user code may start, from the authority answering the dispatch
 * renew. Not granted because cancel was requested → report `cancelled` (the
 * server cancels the task whatever the report). Not granted otherwise → the
 * execution budget was within the server's safety margin: report `timed_out`,
 * retryable; an attempt refused dispatch does not count against
 * `max_attempts`.
 */
export function dispatchDecision(lease: LeaseState): DispatchDecision {
  if (lease.dispatchAllowed && !lease.cancelRequested) return { kind: 'run' };
  if (lease.cancelRequested) {
    return {
      kind: 'refuse',
      failure: 'cancelled',
      retryable: false,
      message: 'cancellation was requested before the handler started',
    };
  }
  return {
    kind: 'refuse',
    failure: 'timed_out',
    retryable: true,
    message: 'dispatch was refused: too little execution budget remained to start the handler',
  };
}
