/**
 * Retry policy and attempt counting along whole chains of attempts (review r50c; DESIGN §4.1
 * Defaults / Attempt counting, §5 Settle / Lease expiry), checking
 * that the task's state, counters, available_at, history and attempts agree at every step.
 */
import {
  type Assignment,
  DEFAULT_RETRY_DELAY_MS,
  DEFAULT_RETRY_MAX_DELAY_MS,
  retryDelayMs,
  type SettleCommand,
} from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('review_r50c');
});
afterAll(() => h.close());

/** Claims the next task of `queue` with a fresh one-slot session; null when empty. */
async function claim(queue: string): Promise<Assignment | null> {
  const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(s.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition === 'empty') return null;
  if (reply.disposition !== 'assigned') throw new Error(`got ${reply.disposition}`);
  return reply.assignment;
}

async function mustClaim(queue: string): Promise<Assignment> {
  const a = await claim(queue);
  if (a === null) throw new Error(`nothing to claim on ${queue}`);
  return a;
}

async function advanceTo(at: number): Promise<void> {
  const now = await h.store.now();
  if (now < at) h.advance(at - now);
}

async function recoverAll(): Promise<void> {
  for (;;) {
    const p = await h.store.recoverExpiredLeases();
    if (!p.has_more) return;
  }
}

async function events(taskId: string) {
  return (await h.store.history(SCOPE, taskId, 0)).map((r) => ({
    reason: r.event.reason,
    attempt_id: r.event.attempt_id,
    at: r.event.at,
  }));
}

function timedOut(a: Assignment, op: string): SettleCommand {
  return {
    owner: a.lease.owner,
    operation_id: op,
    report: {
      kind: 'failed',
      report: { kind: 'timed_out', message: 'no budget', retryable: true },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

describe('max_attempts 1: only the dispatched attempt counts, along a chain of every kind of uncounted attempt', () => {
  it('lost before dispatch, then refused dispatch for budget, then dispatched and lost: fails lease_expired reporting attempt_count 3', async () => {
    const queue = 'r50c-chain';
    const { snapshot } = await h.store.submit(
      submitCommand('r50c-chain', {
        queue,
        timeout_ms: 1_000,
        retry: { max_attempts: 1, delay_ms: 700 },
      }),
    );
    const id = snapshot.task_id;

    // 1: claimed, never renewed, lease expires → re-queued with the retry delay from recovery.
    const a1 = await mustClaim(queue);
    expect(a1.event.ldgattempt).toBe(1);
    await advanceTo(a1.lease.expires_at + 1);
    await recoverAll();
    let status = await h.store.status(SCOPE, id);
    let history = await events(id);
    const expired1 = history.find((e) => e.reason === 'lease_expired');
    expect(status).toMatchObject({ state: 'queued', attempt_count: 1, max_attempts: 1 });
    expect(status.available_at).toBe((expired1?.at ?? Number.NaN) + 700);
    expect(history.map((e) => e.reason)).toEqual([
      'submitted',
      'claimed',
      'lease_expired',
      'retry_scheduled',
    ]);
    expect((await h.store.inspectAttempt(SCOPE, id, a1.lease.owner.attempt_id)).state).toBe('lost');
    expect((await h.store.result(SCOPE, id)).outcome).toEqual({ state: 'pending' });

    // 2: claimed, dispatch refused for budget, settled timed_out retryable → re-queued, uncounted.
    await advanceTo(status.available_at);
    const a2 = await mustClaim(queue);
    expect(a2.event.ldgattempt).toBe(2);
    h.advance(1_000 - CONFIG.leaseSafetyMarginMs);
    const refused = await h.store.renew(renewCommand(a2.lease.owner, 1, 'dispatch'));
    expect(refused.dispatch_allowed).toBe(false);
    const reply2 = await h.store.settle(timedOut(a2, 'r50c-chain-2'));
    expect(reply2.task_state).toBe('queued');
    status = await h.store.status(SCOPE, id);
    const att2 = await h.store.inspectAttempt(SCOPE, id, a2.lease.owner.attempt_id);
    expect(att2.execution_may_have_started).toBe(false);
    expect(status.available_at).toBe((att2.finished_at ?? Number.NaN) + 700);
    expect(status.attempt_count).toBe(2);

    // 3: dispatched, lease expires → the only dispatched attempt: failed lease_expired, attempts 3.
    await advanceTo(status.available_at);
    const a3 = await mustClaim(queue);
    expect(a3.event.ldgattempt).toBe(3);
    expect(
      (await h.store.renew(renewCommand(a3.lease.owner, 1, 'dispatch'))).dispatch_allowed,
    ).toBe(true);
    await advanceTo(a3.lease.expires_at + 1);
    await recoverAll();
    const result = await h.store.result(SCOPE, id);
    expect(result.status).toMatchObject({ state: 'failed', attempt_count: 3, max_attempts: 1 });
    expect(result.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'lease_expired', attempts: 3 },
    });
    history = await events(id);
    expect(history.map((e) => [e.reason, e.attempt_id])).toEqual([
      ['submitted', null],
      ['claimed', a1.lease.owner.attempt_id],
      ['lease_expired', a1.lease.owner.attempt_id],
      ['retry_scheduled', a1.lease.owner.attempt_id],
      ['claimed', a2.lease.owner.attempt_id],
      ['report_accepted', a2.lease.owner.attempt_id],
      ['retry_scheduled', a2.lease.owner.attempt_id],
      ['claimed', a3.lease.owner.attempt_id],
      ['dispatch_authorized', a3.lease.owner.attempt_id],
      ['lease_expired', a3.lease.owner.attempt_id],
      ['failed', a3.lease.owner.attempt_id],
    ]);
    expect(result.status.terminal_at).toBe(history.at(-1)?.at);
  });
});

describe('the default policy on the lease-expiry path', () => {
  it('each dispatched lost attempt re-queues with the jittered delay of its count, from recovery time; an undispatched one in between uses the same count; the third dispatched fails', async () => {
    const queue = 'r50c-default-lost';
    const { snapshot } = await h.store.submit(submitCommand('r50c-default-lost', { queue }));
    const id = snapshot.task_id;
    const policy = {
      max_attempts: 3,
      delay_ms: DEFAULT_RETRY_DELAY_MS,
      backoff: 'exponential',
      max_delay_ms: DEFAULT_RETRY_MAX_DELAY_MS,
    } as const;
    const plan: { dispatch: boolean; counted: number }[] = [
      { dispatch: true, counted: 1 },
      { dispatch: false, counted: 1 },
      { dispatch: true, counted: 2 },
    ];
    for (const [i, step] of plan.entries()) {
      await advanceTo((await h.store.status(SCOPE, id)).available_at);
      const a = await mustClaim(queue);
      expect(a.event.ldgattempt).toBe(i + 1);
      if (step.dispatch) {
        expect(
          (await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'))).dispatch_allowed,
        ).toBe(true);
      }
      h.advance(CONFIG.leaseDurationMs + 1);
      await recoverAll();
      const status = await h.store.status(SCOPE, id);
      expect(status.state).toBe('queued');
      const att = await h.store.inspectAttempt(SCOPE, id, a.lease.owner.attempt_id);
      expect(att.state).toBe('lost');
      const delay = status.available_at - (att.finished_at ?? Number.NaN);
      expect(delay).toBe(retryDelayMs(policy, step.counted, [snapshot.run_id, snapshot.task_id]));
      expect(delay).toBeGreaterThanOrEqual(1);
      expect(delay).toBeLessThanOrEqual(1_000 * 2 ** (step.counted - 1));
    }
    await advanceTo((await h.store.status(SCOPE, id)).available_at);
    const last = await mustClaim(queue);
    expect(last.event.ldgattempt).toBe(4);
    await h.store.renew(renewCommand(last.lease.owner, 1, 'dispatch'));
    h.advance(CONFIG.leaseDurationMs + 1);
    await recoverAll();
    const result = await h.store.result(SCOPE, id);
    expect(result.status).toMatchObject({ state: 'failed', attempt_count: 4, max_attempts: 3 });
    expect(result.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'lease_expired', attempts: 4 },
    });
  });
});
