import type { Assignment, Authority } from '@ledgence/contracts';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { TransportError } from './errors.js';
import {
  clockTick,
  dispatchDecision,
  initialLease,
  type LeaseState,
  maySettle,
  nextRenew,
  renewDueIn,
  renewFailed,
  renewReplied,
  renewResendDelay,
  renewRetryDelay,
} from './lease.js';
import { owner, problemErrorOf } from './testdata/fixtures.js';

function authority(overrides: Partial<Authority> = {}): Authority {
  return {
    owner,
    expires_at: 31_000,
    remaining_ms: 30_000,
    execution_remaining_ms: 300_000,
    renew_sequence: 0,
    cancel_requested: false,
    dispatch_allowed: false,
    ...overrides,
  };
}

const assignment = { authority: authority() } as unknown as Assignment;

function send(lease: LeaseState, intent: 'dispatch' | 'keep_alive') {
  const next = nextRenew(lease, intent);
  if (next === null) throw new Error('lease lost');
  return next;
}

describe('lease protocol', () => {
  it('starts at renew sequence 0 with a conservative local expiry', () => {
    const lease = initialLease(assignment, 1_000);
    expect(lease).toMatchObject({
      acknowledged: 0,
      pending: null,
      expiresAtLocal: 31_000,
      executionEndsAtLocal: 301_000,
      dispatchAllowed: false,
      dispatchAnswered: false,
      lost: null,
    });
  });

  it('asks for dispatch with sequence 1, then keeps alive with 2, 3…', () => {
    let lease = initialLease(assignment, 0);
    const dispatch = send(lease, 'dispatch');
    expect(dispatch.command).toEqual({ owner, sequence: 1, intent: 'dispatch' });
    lease = renewReplied(
      dispatch.lease,
      authority({ renew_sequence: 1, dispatch_allowed: true }),
      100,
    ).lease;
    expect(lease).toMatchObject({ acknowledged: 1, pending: null, dispatchAnswered: true });
    expect(dispatchDecision(lease)).toEqual({ kind: 'run' });
    const beat = send(lease, 'keep_alive');
    expect(beat.command).toEqual({ owner, sequence: 2, intent: 'keep_alive' });
  });

  it('re-sends a renew verbatim after a lost reply, whatever intent is asked next', () => {
    const lease = initialLease(assignment, 0);
    const dispatch = send(lease, 'dispatch');
    const failed = renewFailed(dispatch.lease, new TransportError('x', { reason: 'timeout' }));
    expect(failed.effect).toEqual({ kind: 'retry' });
    const again = send(failed.lease, 'keep_alive');
    expect(again.command).toEqual({ owner, sequence: 1, intent: 'dispatch' });
  });

  it('extends the local expiry from the send time of the answered renew', () => {
    const lease = send(initialLease(assignment, 0), 'dispatch').lease;
    const step = renewReplied(lease, authority({ renew_sequence: 1, remaining_ms: 30_000 }), 5_000);
    expect(step.lease.expiresAtLocal).toBe(35_000);
  });

  it('signals cancellation once, when the authority first reports it', () => {
    let lease = send(initialLease(assignment, 0), 'dispatch').lease;
    let step = renewReplied(lease, authority({ renew_sequence: 1, dispatch_allowed: true }), 0);
    expect(step.effect).toEqual({ kind: 'none' });
    lease = send(step.lease, 'keep_alive').lease;
    step = renewReplied(
      lease,
      authority({ renew_sequence: 2, dispatch_allowed: true, cancel_requested: true }),
      0,
    );
    expect(step.effect).toEqual({ kind: 'cancel' });
    lease = send(step.lease, 'keep_alive').lease;
    step = renewReplied(lease, authority({ renew_sequence: 3, cancel_requested: true }), 0);
    expect(step.effect).toEqual({ kind: 'none' });
  });

  it('loses the lease on ownership_lost and sends nothing more, settlement included', () => {
    const lease = send(initialLease(assignment, 0), 'dispatch').lease;
    const step = renewFailed(lease, problemErrorOf('ownership_lost'));
    expect(step.effect).toEqual({ kind: 'lost', why: 'ownership_lost' });
    expect(nextRenew(step.lease, 'keep_alive')).toBeNull();
    expect(maySettle(step.lease)).toBe(false);
  });

  it('stops renewing after a sequence conflict, but may still settle', () => {
    const lease = send(initialLease(assignment, 0), 'dispatch').lease;
    for (const code of ['sequence_conflict', 'conflict'] as const) {
      const step = renewFailed(lease, problemErrorOf(code));
      expect(step.effect).toEqual({ kind: 'lost', why: 'renew_conflict' });
      expect(maySettle(step.lease)).toBe(true);
    }
  });

  it('retries on unavailable', () => {
    const lease = send(initialLease(assignment, 0), 'dispatch').lease;
    expect(renewFailed(lease, problemErrorOf('unavailable')).effect).toEqual({ kind: 'retry' });
  });

  it('is lost locally once the estimated expiry passes without a renewal', () => {
    const lease = initialLease(assignment, 0);
    expect(clockTick(lease, 29_999).effect).toEqual({ kind: 'none' });
    const step = clockTick(lease, 30_000);
    expect(step.effect).toEqual({ kind: 'lost', why: 'expired' });
    expect(maySettle(step.lease)).toBe(true);
  });

  it('waits for an in-flight dispatch answer past the local expiry, then follows it', () => {
    // The local estimate starts at the acquire's send: after a long poll it can run out
    // before the dispatch answer arrives. Nothing runs before that answer, so it decides.
    const asked = send(initialLease(assignment, 0), 'dispatch').lease;
    expect(clockTick(asked, 30_000).effect).toEqual({ kind: 'none' });
    const granted = renewReplied(
      asked,
      authority({ renew_sequence: 1, dispatch_allowed: true, remaining_ms: 30_000 }),
      29_000,
    );
    expect(granted.lease).toMatchObject({
      lost: null,
      dispatchAllowed: true,
      expiresAtLocal: 59_000,
    });
    expect(clockTick(granted.lease, 58_999).effect).toEqual({ kind: 'none' });
    expect(clockTick(granted.lease, 59_000).effect).toEqual({ kind: 'lost', why: 'expired' });
    // The server's own word still ends it.
    expect(renewFailed(asked, problemErrorOf('ownership_lost')).effect).toEqual({
      kind: 'lost',
      why: 'ownership_lost',
    });
    // A keep-alive in flight does not hold the clock: user code may be running.
    const running = send(granted.lease, 'keep_alive').lease;
    expect(clockTick(running, 59_000).effect).toEqual({ kind: 'lost', why: 'expired' });
  });

  it('is due for renewal halfway through the time the lease has left', () => {
    // A 1 s lease granted at local time 0: due at 500 ms, whatever the heartbeat period.
    const lease = initialLease({ authority: authority({ remaining_ms: 1_000 }) } as Assignment, 0);
    expect(renewDueIn(lease, 0)).toBe(500);
    expect(renewDueIn(lease, 600)).toBe(200);
    expect(renewDueIn(lease, 1_200)).toBe(0);
    // A renewal answered at 400 ms with 1 s left moves the due time with the expiry.
    const renewed = renewReplied(
      send(lease, 'dispatch').lease,
      authority({ renew_sequence: 1, remaining_ms: 1_000 }),
      400,
    ).lease;
    expect(renewDueIn(renewed, 400)).toBe(500);
  });

  it("retries a failed renewal by the lease's due time, however long the backoff has grown", () => {
    // A 1 s lease granted at local time 0, its renewal failing at 100 ms with a 5 s backoff.
    const lease = initialLease({ authority: authority({ remaining_ms: 1_000 }) } as Assignment, 0);
    expect(renewRetryDelay(5_000, 10_000, lease, 100)).toBe(450);
    expect(renewRetryDelay(200, 10_000, lease, 100)).toBe(200);
    expect(renewRetryDelay(5_000, 300, lease, 100)).toBe(300);
    expect(renewRetryDelay(5_000, 10_000, lease, 1_200)).toBe(0);
  });

  it('sends an unanswered renewal again halfway to expiry, and past it at the heartbeat pace, never every few ms', () => {
    // A 1 s lease granted at local time 0, its dispatch renewal sent and unanswered.
    const lease = send(
      initialLease({ authority: authority({ remaining_ms: 1_000 }) } as Assignment, 0),
      'dispatch',
    ).lease;
    expect(renewResendDelay(lease, 100, 250, 50)).toBe(450);
    expect(renewResendDelay(lease, 980, 250, 50)).toBe(50);
    // Past the local expiry only the server's answer ends the lease: at the due time, 0 from
    // then on, this was a copy every 50 ms.
    expect(renewResendDelay(lease, 1_200, 250, 50)).toBe(250);
    expect(renewResendDelay(lease, 60_000, 250, 50)).toBe(250);
    expect(renewResendDelay(lease, 1_200, 10, 50)).toBe(50);
  });

  it('refuses to run user code when dispatch is not granted', () => {
    const base = send(initialLease(assignment, 0), 'dispatch').lease;
    // `base` after the dispatch renewal's reply, granting `granted`.
    const answered = (granted: Partial<Authority>) =>
      renewReplied(base, authority({ renew_sequence: 1, ...granted }), 0).lease;
    const cancelled = answered({ cancel_requested: true });
    expect(dispatchDecision(cancelled)).toMatchObject({
      kind: 'refuse',
      failure: 'cancelled',
      retryable: false,
    });
    const tooLate = answered({ execution_remaining_ms: 10 });
    expect(dispatchDecision(tooLate)).toMatchObject({
      kind: 'refuse',
      failure: 'timed_out',
      retryable: true,
    });
    // A replayed grant with a cancel requested since: still not run.
    const both = answered({ dispatch_allowed: true, cancel_requested: true });
    expect(dispatchDecision(both)).toMatchObject({ kind: 'refuse', failure: 'cancelled' });
  });
});

/** The server side of one attempt's renew sequence (DESIGN §4.1 Renew). */
class RenewModel {
  sequence = 0;
  last: string | null = null;
  conflicts = 0;
  extensions = 0;

  renew(command: { sequence: number; intent: string }): Authority {
    const bytes = JSON.stringify(command);
    if (command.sequence === this.sequence && this.last !== null) {
      if (bytes !== this.last) this.conflicts += 1;
    } else if (command.sequence !== this.sequence + 1) {
      this.conflicts += 1;
    } else {
      this.sequence = command.sequence;
      this.last = bytes;
      this.extensions += 1;
    }
    return authority({ renew_sequence: this.sequence, dispatch_allowed: this.sequence >= 1 });
  }
}

describe('renew retry delay', () => {
  it('never retries an unanswered dispatch renew without delay once the local expiry has passed', () => {
    const fresh = initialLease({ authority: authority({ remaining_ms: 1_000 }) } as Assignment, 0);
    const sent = send(fresh, 'dispatch');
    // Still held past its local expiry: only the server's answer ends it.
    expect(clockTick(sent.lease, 5_000).lease.lost).toBeNull();
    expect(renewRetryDelay(150, 250, sent.lease, 5_000)).toBe(150);
    expect(renewRetryDelay(5_000, 250, sent.lease, 5_000)).toBe(250);
  });
});

describe('lease protocol (property)', () => {
  it('never conflicts and extends once per acknowledged renew, whatever is lost', () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom(0, 1, 2), { maxLength: 100 }), (fates) => {
        const server = new RenewModel();
        let lease = initialLease(assignment, 0);
        let acknowledged = 0;
        for (const fate of [...fates, 2]) {
          const next = nextRenew(lease, lease.dispatchAnswered ? 'keep_alive' : 'dispatch');
          if (next === null) throw new Error('lease lost');
          lease = next.lease;
          if (fate === 0) {
            lease = renewFailed(lease, new TransportError('lost', { reason: 'network' })).lease;
            continue;
          }
          const reply = server.renew(next.command);
          if (fate === 1) {
            lease = renewFailed(lease, new TransportError('lost', { reason: 'network' })).lease;
            continue;
          }
          lease = renewReplied(lease, reply, 0).lease;
          acknowledged += 1;
        }
        expect(server.conflicts).toBe(0);
        expect(lease.acknowledged).toBe(server.sequence);
        expect(lease.pending).toBeNull();
        // Replays never extended twice: one extension per distinct sequence.
        expect(server.extensions).toBe(server.sequence);
        expect(acknowledged).toBeGreaterThanOrEqual(1);
      }),
      { numRuns: 300 },
    );
  });
});
