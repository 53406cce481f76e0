/**
 * Retry policy and scheduling against a real PostgreSQL (controlled store clock).
 * DESIGN §4.1 Defaults / Attempt counting, §5 Settle / Lease expiry: the default policy end to
 * end, `available_at` = the attempt's stored finish time + the policy's delay on every path that
 * re-queues (settle, confirm-quiescence, lease expiry after a timeout), and the budget counting
 * only dispatched attempts on the timeout path.
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
  failureCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('retry_policy');
});
afterAll(() => h.close());

const sequences = new Map<string, number>();

/** Claims the next task of `queue` with a fresh slot poll; null when empty. */
async function claim(queue: string): Promise<Assignment | null> {
  let sid = [...sequences.keys()].find((k) => k.startsWith(`${queue}|`));
  if (sid === undefined) {
    const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    sid = `${queue}|${s.id}`;
    sequences.set(sid, 0);
  }
  const seq = (sequences.get(sid) ?? 0) + 1;
  sequences.set(sid, seq);
  const { reply } = await h.store.acquire(
    acquireCommand(sid.slice(queue.length + 1), 0, seq, queue),
    { recordEmpty: true },
  );
  if (reply.disposition === 'empty') return null;
  if (reply.disposition !== 'assigned') throw new Error(`got ${reply.disposition}`);
  return reply.assignment;
}

async function claimAndDispatch(queue: string): Promise<Assignment> {
  const a = await claim(queue);
  if (a === null) throw new Error(`nothing to claim on ${queue}`);
  const authority = await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
  expect(authority.dispatch_allowed).toBe(true);
  return a;
}

async function advanceTo(at: number): Promise<void> {
  const now = await h.store.now();
  if (now < at) h.advance(at - now);
}

function unconfirmedFailure(a: Assignment, op: string): SettleCommand {
  return { ...failureCommand(a, op), quiescence: 'unconfirmed' };
}

const DEFAULT_POLICY = {
  max_attempts: 3,
  delay_ms: DEFAULT_RETRY_DELAY_MS,
  backoff: 'exponential',
  max_delay_ms: DEFAULT_RETRY_MAX_DELAY_MS,
} as const;

describe('an absent retry policy (DESIGN §4.1 Defaults)', () => {
  it('is {max_attempts 3, delay_ms 1000, exponential, max_delay_ms 60000}: jittered delays under caps 1000 and 2000, failed after the third dispatched attempt', async () => {
    expect(DEFAULT_RETRY_DELAY_MS).toBe(1_000);
    expect(DEFAULT_RETRY_MAX_DELAY_MS).toBe(60_000);
    const queue = 'rp-default';
    const { snapshot } = await h.store.submit(submitCommand('rp-default', { queue }));
    expect((await h.store.status(SCOPE, snapshot.task_id)).max_attempts).toBe(3);
    const caps = [1_000, 2_000];
    for (let n = 1; n <= 2; n += 1) {
      await advanceTo((await h.store.status(SCOPE, snapshot.task_id)).available_at);
      const a = await claimAndDispatch(queue);
      const reply = await h.store.settle(failureCommand(a, `rp-default-${n}`));
      expect(reply.task_state).toBe('queued');
      const attempt = await h.store.inspectAttempt(
        SCOPE,
        snapshot.task_id,
        a.lease.owner.attempt_id,
      );
      const status = await h.store.status(SCOPE, snapshot.task_id);
      const delay = status.available_at - (attempt.finished_at ?? Number.NaN);
      expect(delay).toBe(retryDelayMs(DEFAULT_POLICY, n, [snapshot.run_id, snapshot.task_id]));
      expect(delay).toBeGreaterThanOrEqual(1);
      expect(delay).toBeLessThanOrEqual(caps[n - 1] as number);
    }
    await advanceTo((await h.store.status(SCOPE, snapshot.task_id)).available_at);
    const last = await claimAndDispatch(queue);
    const reply = await h.store.settle(failureCommand(last, 'rp-default-3'));
    expect(reply.task_state).toBe('failed');
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.status.attempt_count).toBe(3);
    expect(result.outcome).toMatchObject({ state: 'failed', failure: { kind: 'execution' } });
  });

  it('a given retry without backoff is fixed: every delay is exactly delay_ms after the stored finish time', async () => {
    const queue = 'rp-fixed';
    const { snapshot } = await h.store.submit(
      submitCommand('rp-fixed', { queue, retry: { max_attempts: 3, delay_ms: 4_321 } }),
    );
    for (let n = 1; n <= 2; n += 1) {
      await advanceTo((await h.store.status(SCOPE, snapshot.task_id)).available_at);
      const a = await claimAndDispatch(queue);
      await h.store.settle(failureCommand(a, `rp-fixed-${n}`));
      const attempt = await h.store.inspectAttempt(
        SCOPE,
        snapshot.task_id,
        a.lease.owner.attempt_id,
      );
      const status = await h.store.status(SCOPE, snapshot.task_id);
      expect(status.available_at - (attempt.finished_at ?? Number.NaN)).toBe(4_321);
    }
  });
});

describe('available_at = stored finish time + delay on every re-queuing path', () => {
  it('confirm-quiescence: the retry runs from the confirmation (the attempt’s finish), not from the settle', async () => {
    const queue = 'rp-quiesce';
    const { snapshot } = await h.store.submit(
      submitCommand('rp-quiesce', {
        queue,
        timeout_ms: 60_000,
        retry: { max_attempts: 2, delay_ms: 3_000 },
      }),
    );
    const a = await claimAndDispatch(queue);
    const settled = await h.store.settle(unconfirmedFailure(a, 'rp-q-1'));
    expect(settled.task_state).toBe('active');
    h.advance(700);
    expect(await h.store.confirmQuiescence(a.lease.owner)).toBe('queued');
    const attempt = await h.store.inspectAttempt(SCOPE, snapshot.task_id, a.lease.owner.attempt_id);
    const status = await h.store.status(SCOPE, snapshot.task_id);
    // Store time also runs on the real clock: at least the 700 ms moved, never the settle's time.
    expect(attempt.finished_at).toBeGreaterThanOrEqual(settled.receipt.accepted_at + 700);
    expect(status.available_at).toBe((attempt.finished_at ?? Number.NaN) + 3_000);
  });

  it('timeout: a dispatched attempt silent past its budget is lost at the authority deadline and re-queued finish + delay; the next one exhausts the budget as lease_expired', async () => {
    const queue = 'rp-timeout';
    const timeout = 1_000;
    const { snapshot } = await h.store.submit(
      submitCommand('rp-timeout', {
        queue,
        timeout_ms: timeout,
        retry: { max_attempts: 2, delay_ms: 2_500 },
      }),
    );
    const a1 = await claimAndDispatch(queue);
    const a1Snapshot = await h.store.inspectAttempt(
      SCOPE,
      snapshot.task_id,
      a1.lease.owner.attempt_id,
    );
    // Past the attempt deadline but within cleanup grace: still held, nothing recovered.
    h.advance(timeout + 10);
    expect((await h.store.recoverExpiredLeases()).recovered).toBe(0);
    // Past the authority deadline (claimed + timeout + CLEANUP_GRACE_MS): lost, re-queued.
    h.advance(CONFIG.cleanupGraceMs);
    const progress = await h.store.recoverExpiredLeases();
    expect(progress).toMatchObject({ recovered: 1, requeued: 1 });
    const lost = await h.store.inspectAttempt(SCOPE, snapshot.task_id, a1.lease.owner.attempt_id);
    expect(lost.state).toBe('lost');
    const status = await h.store.status(SCOPE, snapshot.task_id);
    expect(status.state).toBe('queued');
    expect(status.available_at).toBe((lost.finished_at ?? Number.NaN) + 2_500);
    expect(lost.finished_at).toBeGreaterThanOrEqual(a1Snapshot.authority_deadline);
    expect(a1Snapshot.authority_deadline).toBe(a1Snapshot.deadline + CONFIG.cleanupGraceMs);
    // Not claimable a second before available_at (store time also runs on the real clock);
    // claimable at it.
    await advanceTo(status.available_at - 1_000);
    expect(await claim(queue)).toBeNull();
    await advanceTo(status.available_at);
    const a2 = await claimAndDispatch(queue);
    expect(a2.event.ldgattempt).toBe(2);
    h.advance(timeout + CONFIG.cleanupGraceMs + 10);
    expect(await h.store.recoverExpiredLeases()).toMatchObject({ recovered: 1, failed: 1 });
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'lease_expired', attempts: 2 },
    });
  });
});
