import type { AcquireReply, Assignment } from '@ledgence/contracts';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ProtocolError, TransportError } from './errors.js';
import {
  beginPoll,
  classifyPollError,
  initialSlot,
  type PollCommand,
  pollFailed,
  pollReplied,
  released,
  type SlotState,
} from './slot.js';
import { problemErrorOf } from './testdata/fixtures.js';

const fakeAssignment = (attempt: string) => ({ attempt }) as unknown as Assignment;

function start(slot: SlotState, session: string | null): { slot: SlotState; command: PollCommand } {
  const started = beginPoll(slot, session);
  if (started === null) throw new Error('slot could not poll');
  return started;
}

const empty = (sequence: number): AcquireReply => ({ disposition: 'empty', sequence });

describe('slot protocol', () => {
  it('starts at sequence 1 and advances by exactly one per completed poll', () => {
    let slot = initialSlot(0);
    const sequences: number[] = [];
    for (let i = 0; i < 4; i++) {
      const started = start(slot, 'S1');
      sequences.push(started.command.sequence);
      expect(started.command.replay).toBe(false);
      slot = pollReplied(started.slot, empty(started.command.sequence)).slot;
    }
    expect(sequences).toEqual([1, 2, 3, 4]);
    expect(slot.last).toBe(4);
  });

  it('re-sends the same sequence after a lost reply, then advances', () => {
    let started = start(initialSlot(0), 'S1');
    let slot = pollReplied(started.slot, empty(1)).slot;
    started = start(slot, 'S1');
    expect(started.command.sequence).toBe(2);
    const failed = pollFailed(started.slot, 'transport');
    expect(failed.effect).toEqual({ kind: 'backoff', failures: 1 });
    const again = start(failed.slot, 'S1');
    expect(again.command).toEqual({ sessionId: 'S1', consumerId: 0, sequence: 2, replay: true });
    slot = pollReplied(again.slot, {
      disposition: 'assigned',
      sequence: 2,
      assignment: fakeAssignment('a1'),
    }).slot;
    expect(slot).toMatchObject({ last: 2, pending: null, phase: 'holding', failures: 0 });
  });

  it('keeps the sequence pending when the runtime aborted the poll', () => {
    const started = start(initialSlot(3), 'S1');
    const step = pollFailed(started.slot, 'aborted');
    expect(step.effect).toEqual({ kind: 'none' });
    expect(start(step.slot, 'S1').command).toMatchObject({ sequence: 1, replay: true });
  });

  it('holds an assignment until released, and polls the next sequence after', () => {
    const started = start(initialSlot(0), 'S1');
    const step = pollReplied(started.slot, {
      disposition: 'assigned',
      sequence: 1,
      assignment: fakeAssignment('a1'),
    });
    expect(step.effect).toEqual({ kind: 'run', assignment: fakeAssignment('a1') });
    expect(beginPoll(step.slot, 'S1')).toBeNull();
    expect(start(released(step.slot), 'S1').command.sequence).toBe(2);
  });

  it('advances past a replayed poll whose attempt is no longer owned', () => {
    const started = start(initialSlot(0), 'S1');
    const failed = pollFailed(started.slot, 'transport').slot;
    const replay = start(failed, 'S1');
    const step = pollReplied(replay.slot, {
      disposition: 'ownership_lost',
      sequence: 1,
      assignment: { task_id: 't', attempt_id: 'a' },
    });
    expect(step.effect).toEqual({ kind: 'lost', attempt: { task_id: 't', attempt_id: 'a' } });
    expect(step.slot).toMatchObject({ phase: 'idle', last: 1, pending: null });
    expect(start(step.slot, 'S1').command.sequence).toBe(2);
  });

  it('retries the same sequence after consumer_busy (the cursor did not advance)', () => {
    const slot = pollReplied(start(initialSlot(0), 'S1').slot, empty(1)).slot;
    const busy = pollFailed(start(slot, 'S1').slot, 'consumer_busy');
    expect(busy.effect.kind).toBe('backoff');
    expect(start(busy.slot, 'S1').command).toMatchObject({ sequence: 2, replay: true });
  });

  it('abandons a conflicting cursor: new session, sequence 1, never the old session', () => {
    let slot = pollReplied(start(initialSlot(1), 'S1').slot, empty(1)).slot;
    const step = pollFailed(start(slot, 'S1').slot, 'sequence_conflict');
    expect(step.effect).toEqual({ kind: 'new_session', staleSessionId: 'S1', losses: 1 });
    slot = step.slot;
    expect(beginPoll(slot, 'S1')).toBeNull();
    expect(start(slot, 'S2').command).toEqual({
      sessionId: 'S2',
      consumerId: 1,
      sequence: 1,
      replay: false,
    });
  });

  it('restarts at 1 on a new session after session_expired, dropping the pending poll', () => {
    let slot = initialSlot(0);
    for (let i = 1; i <= 3; i++) slot = pollReplied(start(slot, 'S1').slot, empty(i)).slot;
    const step = pollFailed(start(slot, 'S1').slot, 'session_gone');
    expect(step.effect).toEqual({ kind: 'new_session', staleSessionId: 'S1', losses: 1 });
    expect(step.slot.pending).toBeNull();
    expect(beginPoll(step.slot, 'S1')).toBeNull();
    expect(start(step.slot, 'S2').command).toMatchObject({ sessionId: 'S2', sequence: 1 });
  });

  it('counts sessions lost in a row apart from failed polls; a completed poll resets the count', () => {
    // An outage: two polls fail, and the session expires meanwhile. Its loss is the first.
    let slot = start(initialSlot(0), 'S1').slot;
    slot = pollFailed(slot, 'transport').slot;
    slot = pollFailed(start(slot, 'S1').slot, 'transport').slot;
    const first = pollFailed(start(slot, 'S1').slot, 'session_gone');
    expect(first.effect).toEqual({ kind: 'new_session', staleSessionId: 'S1', losses: 1 });
    expect(first.slot.failures).toBe(3);
    // Polls misrouted to a deployment that never heard of the sessions: losses in a row.
    const second = pollFailed(start(first.slot, 'S2').slot, 'session_gone');
    expect(second.effect).toEqual({ kind: 'new_session', staleSessionId: 'S2', losses: 2 });
    const third = pollFailed(start(second.slot, 'S3').slot, 'sequence_conflict');
    expect(third.effect).toMatchObject({ kind: 'new_session', losses: 3 });
    const done = pollReplied(start(third.slot, 'S4').slot, empty(1)).slot;
    expect(done).toMatchObject({ failures: 0, losses: 0 });
    const again = pollFailed(start(done, 'S4').slot, 'session_gone');
    expect(again.effect).toMatchObject({ kind: 'new_session', losses: 1 });
  });

  it('replays a pending poll on its own session before moving to a new one', () => {
    const started = start(initialSlot(0), 'S1');
    const failed = pollFailed(started.slot, 'transport').slot;
    const replay = start(failed, 'S2');
    expect(replay.command).toMatchObject({ sessionId: 'S1', sequence: 1, replay: true });
    const done = pollReplied(replay.slot, empty(1)).slot;
    expect(start(done, 'S2').command).toMatchObject({ sessionId: 'S2', sequence: 1 });
  });

  it('treats a reply for another sequence as fatal', () => {
    const started = start(initialSlot(0), 'S1');
    expect(pollReplied(started.slot, empty(7)).effect.kind).toBe('fatal');
  });

  it('does not poll without a session', () => {
    expect(beginPoll(initialSlot(0), null)).toBeNull();
  });

  it('classifies errors', () => {
    expect(classifyPollError(new TransportError('x', { reason: 'network' }))).toBe('transport');
    expect(classifyPollError(problemErrorOf('unavailable'))).toBe('transport');
    expect(classifyPollError(problemErrorOf('consumer_busy'))).toBe('consumer_busy');
    expect(classifyPollError(problemErrorOf('session_expired'))).toBe('session_gone');
    expect(classifyPollError(problemErrorOf('session_not_found'))).toBe('session_gone');
    expect(classifyPollError(problemErrorOf('sequence_conflict'))).toBe('sequence_conflict');
    expect(classifyPollError(problemErrorOf('unauthorized'))).toBe('fatal');
    expect(classifyPollError(problemErrorOf('invalid_input'))).toBe('fatal');
    expect(classifyPollError(new ProtocolError('bad reply'))).toBe('fatal');
    expect(classifyPollError(new Error('anything'), true)).toBe('aborted');
  });
});

/**
 * The server side of one consumer cursor (DESIGN §5 Acquire), to check the
 * slot against: `last + 1` is new, `last` replays, anything else conflicts.
 */
class CursorModel {
  last = 0;
  assignment: string | null = null;
  handedOut: string[] = [];
  conflicts = 0;
  #next = 0;

  poll(sequence: number, hasWork: boolean): AcquireReply {
    if (this.last > 0 && sequence === this.last) {
      return this.assignment === null
        ? empty(sequence)
        : { disposition: 'assigned', sequence, assignment: fakeAssignment(this.assignment) };
    }
    if (sequence !== this.last + 1) {
      this.conflicts += 1;
      throw new Error('sequence_conflict');
    }
    this.last = sequence;
    this.assignment = hasWork ? `a${++this.#next}` : null;
    if (this.assignment !== null) this.handedOut.push(this.assignment);
    return this.assignment === null
      ? empty(sequence)
      : { disposition: 'assigned', sequence, assignment: fakeAssignment(this.assignment) };
  }
}

describe('slot protocol (property)', () => {
  it('never conflicts, and runs every assignment exactly once, whatever is lost', () => {
    // Each step: the request is lost before the server (0), processed with the
    // reply lost (1), or answered (2); the server has work or not.
    const step = fc.record({
      fate: fc.constantFrom(0, 1, 2),
      work: fc.boolean(),
    });
    fc.assert(
      fc.property(fc.array(step, { maxLength: 200 }), (steps) => {
        const server = new CursorModel();
        const run: string[] = [];
        let slot = initialSlot(0);
        for (const { fate, work } of [...steps, { fate: 2, work: false }]) {
          if (slot.phase === 'holding') slot = released(slot);
          const started = beginPoll(slot, 'S');
          if (started === null) throw new Error('idle slot could not poll');
          slot = started.slot;
          if (fate === 0) {
            slot = pollFailed(slot, 'transport').slot;
            continue;
          }
          const reply = server.poll(started.command.sequence, work);
          if (fate === 1) {
            slot = pollFailed(slot, 'transport').slot;
            continue;
          }
          const next = pollReplied(slot, reply);
          slot = next.slot;
          if (next.effect.kind === 'run') {
            run.push((next.effect.assignment as unknown as { attempt: string }).attempt);
          }
        }
        expect(server.conflicts).toBe(0);
        // The last step is always answered: every assignment handed out was
        // seen by the slot exactly once (a lost reply is replayed, not re-claimed).
        expect(run).toEqual(server.handedOut);
      }),
      { numRuns: 300 },
    );
  });
});
