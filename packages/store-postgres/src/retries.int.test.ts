/**
 * What happens to a task between attempts and at its time limits (DESIGN §5) — backoff, attempt
 * budget, execution budget, cleanup grace and quiescence, claim order (a batch in submission
 * order), and history times that never go back although a claim or a recovery pass waited.
 * Controlled clock (`harness.advance`), real PostgreSQL.
 */
import type { Assignment, RecordedHistoryEvent, SettleCommand } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('retries');
});
afterAll(() => h.close());

async function session(queue: string, concurrency = 1) {
  return h.store.openSession({ scope: SCOPE, queue, concurrency });
}

async function poll(
  queue: string,
  sid: string,
  consumer: number,
  sequence: number,
): Promise<Assignment | null> {
  const { reply } = await h.store.acquire(acquireCommand(sid, consumer, sequence, queue), {
    recordEmpty: true,
  });
  if (reply.disposition === 'empty') return null;
  if (reply.disposition !== 'assigned') throw new Error(`got ${reply.disposition}`);
  return reply.assignment;
}

/**
 * Takes `table`'s ACCESS EXCLUSIVE lock in another session and holds it: every statement that
 * reads the table waits until the returned function releases it (a deterministic wait).
 */
async function holdTableLock(table: 'attempts' | 'worker_sessions'): Promise<() => Promise<void>> {
  const holder = await h.sql.reserve();
  await holder`begin`;
  await holder.unsafe(`lock table ${table} in access exclusive mode`);
  return async () => {
    await holder`commit`;
    holder.release();
  };
}

/** A task submitted alone on its queue, claimed by a fresh session and granted dispatch. */
async function dispatched(command: ReturnType<typeof submitCommand>) {
  const queue = command.input.queue;
  const s = await session(queue);
  const { snapshot } = await h.store.submit(command);
  const a = (await poll(queue, s.id, 0, 1)) as Assignment;
  await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
  return { snapshot, a };
}

async function history(taskId: string): Promise<RecordedHistoryEvent[]> {
  return h.store.history(SCOPE, taskId, 0);
}

function appError(a: Assignment, op: string, retryable?: boolean): SettleCommand {
  const owner = a.lease.owner;
  return {
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: {
          kind: 'application_error',
          error:
            retryable === undefined
              ? { code: 'E', message: 'm' }
              : { code: 'E', message: 'm', retryable },
        },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

describe('backoff', () => {
  it('fixed: each retry is available exactly delay_ms after the failure, at store time', async () => {
    const queue = 'fixed';
    const s = await session(queue);
    const { snapshot } = await h.store.submit(
      submitCommand('fixed', { queue, retry: { max_attempts: 3, delay_ms: 7_000 } }),
    );
    let seq = 0;
    for (let n = 1; n <= 2; n += 1) {
      seq += 1;
      const a = await poll(queue, s.id, 0, seq);
      expect(a).not.toBeNull();
      await h.store.renew(renewCommand((a as Assignment).lease.owner, 1, 'dispatch'));
      await h.store.settle(failureCommand(a as Assignment, `fixed-${n}`));
      const hist = await history(snapshot.task_id);
      const last = hist[hist.length - 1];
      expect(last?.event.reason).toBe('retry_scheduled');
      const st = await h.store.status(SCOPE, snapshot.task_id);
      expect(st.state).toBe('queued');
      expect(st.available_at - (last?.event.at ?? 0)).toBe(7_000);
      // not claimable early
      seq += 1;
      expect(await poll(queue, s.id, 0, seq)).toBeNull();
      h.advance(7_100);
    }
  });

  it('exponential: delay in 1..min(delay·2^(n−1), max), n = dispatched attempts', async () => {
    const queue = 'expo';
    const s = await session(queue);
    const { snapshot } = await h.store.submit(
      submitCommand('expo', {
        queue,
        retry: { max_attempts: 5, delay_ms: 1_000, backoff: 'exponential', max_delay_ms: 3_000 },
      }),
    );
    let seq = 0;
    const caps = [1_000, 2_000, 3_000, 3_000];
    for (let n = 1; n <= 4; n += 1) {
      seq += 1;
      const a = (await poll(queue, s.id, 0, seq)) as Assignment;
      expect(a).not.toBeNull();
      expect(a.event.ldgattempt).toBe(n);
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      await h.store.settle(failureCommand(a, `expo-${n}`));
      const hist = await history(snapshot.task_id);
      const last = hist[hist.length - 1];
      const st = await h.store.status(SCOPE, snapshot.task_id);
      const delay = st.available_at - (last?.event.at ?? 0);
      expect(delay).toBeGreaterThanOrEqual(1);
      expect(delay).toBeLessThanOrEqual(caps[n - 1] as number);
      h.advance(3_100);
    }
    seq += 1;
    const a5 = (await poll(queue, s.id, 0, seq)) as Assignment;
    await h.store.renew(renewCommand(a5.lease.owner, 1, 'dispatch'));
    await h.store.settle(failureCommand(a5, 'expo-5'));
    const st = await h.store.status(SCOPE, snapshot.task_id);
    expect(st.state).toBe('failed');
    expect(st.attempt_count).toBe(5);
  });
});

describe('attempt budget', () => {
  it('non-dispatched lost attempts do not count; the task fails after max_attempts dispatched', async () => {
    const queue = 'budget';
    const s = await session(queue);
    const { snapshot } = await h.store.submit(
      submitCommand('budget', { queue, retry: { max_attempts: 2, delay_ms: 0 } }),
    );
    // attempt 1: never dispatched, lost
    const a1 = (await poll(queue, s.id, 0, 1)) as Assignment;
    h.advance(CONFIG.leaseDurationMs + 10);
    await h.store.recoverExpiredLeases();
    // attempt 2: dispatched, fails
    const a2 = (await poll(queue, s.id, 0, 2)) as Assignment;
    expect(a2.event.ldgattempt).toBe(2);
    await h.store.renew(renewCommand(a2.lease.owner, 1, 'dispatch'));
    await h.store.settle(appError(a2, 'b2'));
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('queued');
    // attempt 3: dispatched, fails → exhausted
    const a3 = (await poll(queue, s.id, 0, 3)) as Assignment;
    await h.store.renew(renewCommand(a3.lease.owner, 1, 'dispatch'));
    await h.store.settle(appError(a3, 'b3'));
    const res = await h.store.result(SCOPE, snapshot.task_id);
    expect(res.status.state).toBe('failed');
    expect(res.status.attempt_count).toBe(3);
    expect(res.outcome).toMatchObject({ state: 'failed', failure: { kind: 'application' } });
    expect(a1.lease.owner.task_id).toBe(snapshot.task_id);
  });

  it('non-retryable failures fail at once', async () => {
    const queue = 'nonretry';
    const s = await session(queue, 2);
    const t1 = await h.store.submit(
      submitCommand('nr1', { queue, retry: { max_attempts: 5, delay_ms: 0 } }),
    );
    const a = (await poll(queue, s.id, 0, 1)) as Assignment;
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    await h.store.settle(appError(a, 'nr1', false));
    expect((await h.store.status(SCOPE, t1.snapshot.task_id)).state).toBe('failed');
    const t2 = await h.store.submit(
      submitCommand('nr2', { queue, retry: { max_attempts: 5, delay_ms: 0 } }),
    );
    const b = (await poll(queue, s.id, 1, 1)) as Assignment;
    await h.store.renew(renewCommand(b.lease.owner, 1, 'dispatch'));
    await h.store.settle(failureCommand(b, 'nr2', false));
    expect((await h.store.status(SCOPE, t2.snapshot.task_id)).state).toBe('failed');
  });
});

describe('execution budget', () => {
  it('reports remaining budget, refuses dispatch within the margin, ends the lease at the authority deadline', async () => {
    const queue = 'budget2';
    const s = await session(queue);
    const { snapshot } = await h.store.submit(
      submitCommand('eb', { queue, timeout_ms: 3_000, retry: { max_attempts: 1, delay_ms: 0 } }),
    );
    const a = (await poll(queue, s.id, 0, 1)) as Assignment;
    const claimedAt = a.attempt_deadline - 3_000;
    expect(a.authority.execution_remaining_ms).toBeLessThanOrEqual(3_000);
    expect(a.lease.expires_at).toBe(claimedAt + CONFIG.leaseDurationMs);
    h.advance(1_500);
    const k1 = await h.store.renew(renewCommand(a.lease.owner, 1, 'keep_alive'));
    expect(k1.execution_remaining_ms).toBeLessThanOrEqual(1_500);
    expect(k1.execution_remaining_ms).toBeGreaterThan(1_000);
    h.advance(1_100);
    // < 500 ms of budget left: dispatch refused
    const d = await h.store.renew(renewCommand(a.lease.owner, 2, 'dispatch'));
    expect(d.dispatch_allowed).toBe(false);
    // lease capped at authority deadline
    expect(d.expires_at).toBe(a.attempt_deadline + CONFIG.cleanupGraceMs);
    h.advance(1_000);
    const k3 = await h.store.renew(renewCommand(a.lease.owner, 3, 'keep_alive'));
    expect(k3.execution_remaining_ms).toBe(0);
    h.advance(1_000);
    expect(await outcomeCode(h.store.renew(renewCommand(a.lease.owner, 4)))).toBe('ownership_lost');
    await h.store.recoverExpiredLeases();
    // never dispatched: requeued although max_attempts is 1
    const st = await h.store.status(SCOPE, snapshot.task_id);
    expect(st.state).toBe('queued');
  });
});

describe('cleanup grace and quiescence', () => {
  it('holds an unconfirmed failure until confirmation; confirms exactly once', async () => {
    const queue = 'q1';
    const { snapshot, a } = await dispatched(
      submitCommand('q1', {
        queue,
        timeout_ms: 5_000,
        retry: { max_attempts: 3, delay_ms: 2_000 },
      }),
    );
    await h.store.settle({ ...failureCommand(a, 'q1'), quiescence: 'unconfirmed' });
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('active');
    // past the normal lease, before the authority deadline: still held
    h.advance(CONFIG.leaseDurationMs + 500);
    await h.store.recoverExpiredLeases();
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('active');
    // foreign owner
    const foreign = { ...a.lease.owner, lease_id: 'lease_other' };
    expect(await outcomeCode(h.store.confirmQuiescence(foreign))).toBe('ownership_lost');
    const missing = { ...a.lease.owner, attempt_id: 'attempt_missing' };
    expect(await outcomeCode(h.store.confirmQuiescence(missing))).toBe('not_found');
    expect(await h.store.confirmQuiescence(a.lease.owner)).toBe('queued');
    const n = (await history(snapshot.task_id)).length;
    expect(await h.store.confirmQuiescence(a.lease.owner)).toBe('queued');
    const hist = await history(snapshot.task_id);
    expect(hist.length).toBe(n);
    expect(hist.map((e) => e.event.reason)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'cleanup_confirmed',
      'retry_scheduled',
    ]);
    const st = await h.store.status(SCOPE, snapshot.task_id);
    expect(st.available_at - (hist[hist.length - 1]?.event.at ?? 0)).toBe(2_000);
    for (let i = 1; i < hist.length; i += 1) {
      expect(hist[i]?.event.at).toBeGreaterThanOrEqual(hist[i - 1]?.event.at ?? 0);
    }
  });

  it('an unconfirmed settlement never confirmed takes its outcome at the authority deadline', async () => {
    const queue = 'q2';
    const { snapshot, a } = await dispatched(
      submitCommand('q2', { queue, timeout_ms: 2_000, retry: { max_attempts: 1, delay_ms: 0 } }),
    );
    await h.store.settle({ ...failureCommand(a, 'q2'), quiescence: 'unconfirmed' });
    const deadline = a.attempt_deadline + CONFIG.cleanupGraceMs;
    const now0 = await h.store.now();
    h.advance(deadline - now0 - 200);
    await h.store.recoverExpiredLeases();
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('active');
    h.advance(400);
    const p = await h.store.recoverExpiredLeases();
    expect(p.finalized).toBe(1);
    const res = await h.store.result(SCOPE, snapshot.task_id);
    expect(res.status.state).toBe('failed');
    expect(res.outcome).toMatchObject({ state: 'failed', failure: { kind: 'execution' } });
    // A late confirmation is refused as it is before recovery ran, and changes nothing.
    await expect(h.store.confirmQuiescence(a.lease.owner)).rejects.toMatchObject({
      code: 'ownership_lost',
    });
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('failed');
  });
});

describe('claim order', () => {
  it('priority desc, then available_at, then task id; delayed tasks wait', async () => {
    const queue = 'order';
    const s = await session(queue, 8);
    const low = await h.store.submit(submitCommand('o-low', { queue, priority: -5 }));
    const high = await h.store.submit(submitCommand('o-high', { queue, priority: 10 }));
    const delayedHigh = await h.store.submit(
      submitCommand('o-dh', { queue, priority: 50, delay_ms: 60_000 }),
    );
    const mid1 = await h.store.submit(submitCommand('o-m1', { queue, priority: 0 }));
    const mid2 = await h.store.submit(submitCommand('o-m2', { queue, priority: 0 }));
    const now = await h.store.now();
    const past = await h.store.submit(
      submitCommand('o-past', { queue, priority: 0, available_at: now - 10_000 }),
    );
    const got: string[] = [];
    for (let c = 0; c < 6; c += 1) {
      const a = await poll(queue, s.id, c, 1);
      got.push(a?.lease.owner.task_id ?? 'none');
    }
    expect(got).toEqual([
      high.snapshot.task_id,
      past.snapshot.task_id,
      mid1.snapshot.task_id,
      mid2.snapshot.task_id,
      low.snapshot.task_id,
      'none',
    ]);
    expect(delayedHigh.snapshot.state).toBe('queued');
  });

  it('a burst of equal-priority tasks is claimed FIFO', async () => {
    const queue = 'burst';
    const s = await session(queue, 20);
    const ids: string[] = [];
    for (let i = 0; i < 20; i += 1) {
      ids.push((await h.store.submit(submitCommand(`burst-${i}`, { queue }))).snapshot.task_id);
    }
    const got: string[] = [];
    for (let c = 0; c < 20; c += 1) {
      got.push((await poll(queue, s.id, c, 1))?.lease.owner.task_id ?? 'none');
    }
    expect(got).toEqual(ids);
  });
});

describe('claim order of a batch', () => {
  it('claims the tasks of one submit batch (equal priority, same store time) in submission order', async () => {
    const queue = 'batchfifo';
    const s = await session(queue, 1);
    const commands = Array.from({ length: 40 }, (_, i) => submitCommand(`bf-${i}`, { queue }));
    const results = await h.store.submitBatch(commands);
    const ids = results.map((r) => {
      if (!r.ok) throw r.error;
      return r.value.snapshot.task_id;
    });
    const got: string[] = [];
    for (let seq = 1; seq <= ids.length; seq += 1) {
      const a = (await poll(queue, s.id, 0, seq)) as Assignment;
      got.push(a.lease.owner.task_id);
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      await h.store.settle(successCommand(a, `bf-${seq}`));
    }
    expect(got).toEqual(ids);
  });
});

describe('quiescence at and after the authority deadline', () => {
  it('a confirmation after the authority deadline is too late: the outcome is the deadline’s, with no cleanup_confirmed', async () => {
    const queue = 'late-confirm';
    const { snapshot, a } = await dispatched(
      submitCommand('late-confirm', {
        queue,
        timeout_ms: 2_000,
        retry: { max_attempts: 1, delay_ms: 0 },
      }),
    );
    await h.store.settle({ ...failureCommand(a, 'late-confirm'), quiescence: 'unconfirmed' });
    const deadline = a.attempt_deadline + CONFIG.cleanupGraceMs;
    h.advance(deadline - (await h.store.now()) + 100);
    // The lease ended at the authority deadline; no recovery pass has run yet. The worker's
    // confirmation arrives now: the stale owner must not change what the deadline decided.
    await outcomeCode(h.store.confirmQuiescence(a.lease.owner));
    await h.store.recoverExpiredLeases();
    const reasons = (await history(snapshot.task_id)).map((e) => e.event.reason);
    expect(reasons).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'failed',
    ]);
    const attempt = await h.store.inspectAttempt(SCOPE, snapshot.task_id, a.lease.owner.attempt_id);
    expect(attempt.quiescence).toBe('unconfirmed');
    expect(attempt.state).toBe('failed');
  });

  it('cancel requested while a retry awaits cleanup: the task is cancelled, not retried', async () => {
    const queue = 'cancel-pending';
    const { snapshot, a } = await dispatched(
      submitCommand('cancel-pending', { queue, retry: { max_attempts: 3, delay_ms: 0 } }),
    );
    await h.store.settle({ ...failureCommand(a, 'cp'), quiescence: 'unconfirmed' });
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    expect(await h.store.confirmQuiescence(a.lease.owner)).toBe('cancelled');
  });

  it('a keep-alive while cleanup is pending keeps the lease at the authority deadline and grants no dispatch', async () => {
    const queue = 'pending-renew';
    const s = await session(queue);
    await h.store.submit(submitCommand('pending-renew', { queue, timeout_ms: 10_000 }));
    const a = (await poll(queue, s.id, 0, 1)) as Assignment;
    await h.store.renew(renewCommand(a.lease.owner, 1, 'keep_alive'));
    await h.store.settle({ ...successCommand(a, 'pr'), quiescence: 'unconfirmed' });
    const r = await h.store.renew(renewCommand(a.lease.owner, 2, 'dispatch'));
    expect(r.dispatch_allowed).toBe(false);
    expect(r.expires_at).toBe(a.attempt_deadline + CONFIG.cleanupGraceMs);
  });
});

describe('history times', () => {
  it('recovery that waited decides at the time it acts: its history never goes back before an earlier commit', async () => {
    const queue = 'rec-time';
    const s = await session(queue);
    const { snapshot } = await h.store.submit(
      submitCommand('rec-time', { queue, retry: { max_attempts: 3, delay_ms: 0 } }),
    );
    const a = (await poll(queue, s.id, 0, 1)) as Assignment;
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    h.advance(CONFIG.leaseDurationMs + 100);
    // Recovery starts, reads store time, and its select then waits (here behind a table lock
    // another session holds; in production any lock or a slow statement does).
    const release = await holdTableLock('attempts');
    const recovery = h.store.recoverExpiredLeases();
    await h.untilLockWaits();
    // Meanwhile the task is cancelled (a commit that does not touch attempts).
    h.advance(3_000);
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('active');
    await release();
    await recovery;
    const hist = await history(snapshot.task_id);
    expect(hist.map((e) => e.event.reason)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'cancel_requested',
      'lease_expired',
      'cancelled',
    ]);
    for (let i = 1; i < hist.length; i += 1) {
      expect(hist[i]?.event.at).toBeGreaterThanOrEqual(hist[i - 1]?.event.at ?? 0);
    }
    const st = await h.store.status(SCOPE, snapshot.task_id);
    expect(st.terminal_at).toBeGreaterThanOrEqual(st.cancel_requested_at ?? 0);
  });
});

describe('claim times', () => {
  it('a claim that waited decides at the time it acts: never claimed before the task was submitted', async () => {
    const queue = 'claim-time';
    const s = await session(queue);
    // The poll's slot read waits (here behind a table lock another session holds).
    const release = await holdTableLock('worker_sessions');
    const polling = h.store.acquire(acquireCommand(s.id, 0, 1, queue), { recordEmpty: true });
    await h.untilLockWaits();
    // Meanwhile a task is submitted that is already available (an available_at in the past).
    const now = await h.store.now();
    const { snapshot } = await h.store.submit(
      submitCommand('claim-time', { queue, available_at: now - 60_000 }),
    );
    await new Promise((r) => setTimeout(r, 50));
    await release();
    const first = (await polling).reply;
    // The poll decided at the store time it read before its wait, when the task did not exist:
    // it leaves the task to the next poll rather than claim it in the past.
    const reply =
      first.disposition === 'assigned'
        ? first
        : (await h.store.acquire(acquireCommand(s.id, 0, 2, queue), { recordEmpty: true })).reply;
    expect(reply.disposition).toBe('assigned');
    if (reply.disposition !== 'assigned') return;
    const hist = await history(snapshot.task_id);
    expect(hist.map((e) => e.event.reason)).toEqual(['submitted', 'claimed']);
    expect(hist[1]?.event.at).toBeGreaterThanOrEqual(hist[0]?.event.at ?? 0);
    // The execution budget starts when the attempt was created, not before the task existed.
    expect(reply.assignment.attempt_deadline - 5 * 60_000).toBeGreaterThanOrEqual(
      snapshot.submitted_at,
    );
  });
});
