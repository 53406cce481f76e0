/**
 * Two promises of the delivery contract (seed 000) end to end in the real store: a task's history
 * records, in order and without gaps, every step of an attempt that is held for cleanup, and a held
 * settlement takes its outcome at the authority deadline.
 */
import type { RecordedHistoryEvent } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CONFIG,
  claimedTask,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('delivery_history');
});
afterAll(() => h.close());

function shape(history: RecordedHistoryEvent[]) {
  return history.map((e) => [e.sequence, e.event.reason, e.event.attempt_id]);
}

describe('seed 000 HistoryEvent: "Per-task ordering is assigned under the same task lock; heartbeat renewals do not append history rows"', () => {
  it('dispatch, heartbeats, unconfirmed report, cancel request, confirmation: gapless ordered records with their attempt, heartbeats absent', async () => {
    const a = await claimedTask(h, 'hist');
    const o = a.lease.owner;
    await h.store.renew(renewCommand(o, 1, 'dispatch'));
    await h.store.renew(renewCommand(o, 2));
    await h.store.renew(renewCommand(o, 3, 'dispatch')); // already granted: nothing new
    await h.store.renew(renewCommand(o, 3, 'dispatch')); // replay
    const reply = await h.store.settle(successCommand(a, 'hist', { v: 1 }, 'unconfirmed'));
    // seed SettleReply: "A report can be recorded while required cleanup is still outstanding."
    expect(reply.task_state).toBe('active');
    await h.store.renew(renewCommand(o, 4));
    expect(await h.store.cancel(SCOPE, o.task_id)).toBe('active');
    expect(await h.store.confirmQuiescence(o)).toBe('succeeded');
    const history = await h.store.history(SCOPE, o.task_id, 0);
    expect(shape(history)).toEqual([
      [1, 'submitted', null],
      [2, 'claimed', o.attempt_id],
      [3, 'dispatch_authorized', o.attempt_id],
      [4, 'report_accepted', o.attempt_id],
      [5, 'cancel_requested', o.attempt_id],
      [6, 'cleanup_confirmed', o.attempt_id],
      [7, 'succeeded', o.attempt_id],
    ]);
    for (const e of history) expect(e.event.task_id).toBe(o.task_id);
    const at = history.map((e) => e.event.at);
    expect([...at].sort((x, y) => x - y)).toEqual(at);
    const attempt = await h.store.inspectAttempt(SCOPE, o.task_id, o.attempt_id);
    expect(attempt).toMatchObject({
      state: 'succeeded',
      quiescence: 'confirmed',
      execution_may_have_started: true,
      last_renewal: renewCommand(o, 4),
    });
    expect(attempt.settlement?.receipt.operation_id).toBe('hist');
    // history(after_sequence) returns only the records after it.
    expect(shape(await h.store.history(SCOPE, o.task_id, 5)).map(([s]) => s)).toEqual([6, 7]);
  });
});

describe('seed 000 Quiescence: a held settlement takes its outcome at the authority deadline', () => {
  it('recovery applies the held success once; the confirmation after it is ownership_lost; records end with the outcome', async () => {
    const a = await claimedTask(h, 'held-deadline');
    const o = a.lease.owner;
    await h.store.renew(renewCommand(o, 1, 'dispatch'));
    await h.store.settle(successCommand(a, 'held-deadline', { v: 2 }, 'unconfirmed'));
    h.advance(a.attempt_deadline + CONFIG.cleanupGraceMs - (await h.store.now()) + 10);
    const progress = await h.store.recoverExpiredLeases();
    expect(progress.finalized).toBeGreaterThanOrEqual(1);
    expect(await outcomeCode(h.store.confirmQuiescence(o))).toBe('ownership_lost');
    const result = await h.store.result(SCOPE, o.task_id);
    expect(result.outcome).toEqual({ state: 'succeeded', output: { v: 2 } });
    const reasons = (await h.store.history(SCOPE, o.task_id, 0)).map((e) => e.event.reason);
    expect(reasons).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'succeeded',
    ]);
    const attempt = await h.store.inspectAttempt(SCOPE, o.task_id, o.attempt_id);
    expect(attempt).toMatchObject({ state: 'succeeded', quiescence: 'unconfirmed' });
  });
});
