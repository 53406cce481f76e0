/**
 * Settlement exactly once under grouping (DESIGN §5 Settle, §7.1 group commit): several items for
 * one attempt in a batch, a batch that fails as a whole and is answered item by item, concurrent
 * batches over the same attempts, late settles, replays and attempt counting.
 */
import type { Assignment, RecordedHistoryEvent } from '@ledgence/contracts';
import { createFailpoints, parseFailpoints } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  claimedTask,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('settle_batch');
});
afterAll(() => h.close());

let n = 0;
async function claim(extra: Parameters<typeof claimedTask>[2] = {}): Promise<Assignment> {
  n += 1;
  return claimedTask(h, `rs-${n}`, extra);
}

async function dispatch(a: Assignment): Promise<void> {
  const authority = await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
  expect(authority.dispatch_allowed).toBe(true);
}

async function history(taskId: string): Promise<RecordedHistoryEvent[]> {
  return h.store.history(SCOPE, taskId, 0);
}

function gapless(events: RecordedHistoryEvent[]): void {
  expect(events.map((e) => e.sequence)).toEqual(events.map((_, i) => i + 1));
}

const answer = (r: { ok: boolean; value?: unknown; error?: { code: string } }) =>
  r.ok ? { ok: r.value } : { error: r.error?.code };

describe('settle batches with several items for one attempt', () => {
  it('the same command twice in one batch: accepted once, then replayed', async () => {
    const a = await claim();
    await dispatch(a);
    const cmd = successCommand(a, 'dup-op', { v: 1 });
    const results = await h.store.settleBatch([cmd, cmd]);
    expect(results.map((r) => r.ok)).toEqual([true, true]);
    const [first, second] = results.map((r) => (r.ok ? r.value : null));
    expect(first?.already_accepted).toBe(false);
    expect(second?.already_accepted).toBe(true);
    expect(second?.receipt).toEqual(first?.receipt);
    const events = await history(a.lease.owner.task_id);
    gapless(events);
    expect(events.filter((e) => e.event.reason === 'report_accepted')).toHaveLength(1);
    expect(await h.store.settle(cmd)).toEqual({ ...first, already_accepted: true });
  });

  it('two different settlements of one attempt in one batch: the second is 409 conflict', async () => {
    const a = await claim({ retry: { max_attempts: 3, delay_ms: 0 } });
    await dispatch(a);
    const results = await h.store.settleBatch([
      failureCommand(a, 'op-fail'),
      successCommand(a, 'op-succeed'),
      successCommand(a, 'op-fail'),
    ]);
    expect(results.map(answer).map((r) => ('error' in r ? r.error : 'ok'))).toEqual([
      'ok',
      'conflict',
      'conflict',
    ]);
    const status = await h.store.status(SCOPE, a.lease.owner.task_id);
    expect(status.state).toBe('queued');
    const events = await history(a.lease.owner.task_id);
    gapless(events);
    expect(events.map((e) => e.event.reason)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'retry_scheduled',
    ]);
  });

  it('items on different tasks keep per-task history gapless', async () => {
    const a = await claim();
    const b = await claim({ retry: { max_attempts: 3, delay_ms: 0 } });
    await dispatch(a);
    await dispatch(b);
    const results = await h.store.settleBatch([
      successCommand(a, 'x'),
      failureCommand(b, 'y'),
      successCommand(a, 'x'),
      failureCommand(b, 'y'),
    ]);
    expect(results.every((r) => r.ok)).toBe(true);
    gapless(await history(a.lease.owner.task_id));
    gapless(await history(b.lease.owner.task_id));
  });
});

describe('settle against lease expiry', () => {
  it('a settle after the lease expired at store time (before recovery) is ownership_lost', async () => {
    const a = await claim();
    await dispatch(a);
    const attempt = await h.store.inspectAttempt(
      SCOPE,
      a.lease.owner.task_id,
      a.lease.owner.attempt_id,
    );
    const now = await h.store.now();
    h.advance(attempt.lease.expires_at - now);
    try {
      expect(await outcomeCode(h.store.settle(successCommand(a, 'late')))).toBe('ownership_lost');
      expect(
        await outcomeCode(
          h.store.settleBatch([successCommand(a, 'late')]).then((r) => {
            if (!r[0]?.ok) throw r[0]?.error;
          }),
        ),
      ).toBe('ownership_lost');
    } finally {
      h.advance(-(attempt.lease.expires_at - now));
    }
  });
});

describe('a settle batch that fails as a whole', () => {
  // Before COMMIT nothing was applied: each item is retried alone and answered. After it the
  // outcome is unknown to the caller (a lost reply): each item is `unavailable`, as alone, and
  // what was committed stands.
  for (const point of ['settle.before_commit', 'settle.after_commit'] as const) {
    it(`${point}: nothing applied twice, each item answered as alone, history gapless`, async () => {
      const a = await claim({ retry: { max_attempts: 3, delay_ms: 0 } });
      const b = await claim();
      await dispatch(a);
      await dispatch(b);
      const store = createPostgresTaskStore({
        url: h.db.url,
        max: 2,
        config: CONFIG,
        failpoints: createFailpoints(parseFailpoints(`${point}=error*1`)),
      });
      try {
        const results = await store.settleBatch([
          failureCommand(a, 'fa'),
          successCommand(b, 'sb'),
          successCommand(b, 'other'),
        ]);
        const answers = results.map((r) => (r.ok ? 'ok' : r.error.code));
        expect(answers).toEqual(
          point === 'settle.before_commit'
            ? ['ok', 'ok', 'conflict']
            : ['unavailable', 'unavailable', 'unavailable'],
        );
        for (const t of [a, b]) {
          const events = await history(t.lease.owner.task_id);
          gapless(events);
          expect(events.filter((e) => e.event.reason === 'report_accepted')).toHaveLength(1);
        }
        expect((await h.store.status(SCOPE, a.lease.owner.task_id)).state).toBe('queued');
        expect((await h.store.status(SCOPE, b.lease.owner.task_id)).state).toBe('succeeded');
      } finally {
        await store.close();
      }
    });
  }
});

describe('replay answers', () => {
  it('a replay returns the stored receipt; task_state is the task state now', async () => {
    const a = await claim({ retry: { max_attempts: 3, delay_ms: 0 } });
    await dispatch(a);
    const cmd = failureCommand(a, 'replay-op');
    const first = await h.store.settle(cmd);
    expect(first.task_state).toBe('queued');
    const queue = a.event.ldgqueue;
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
      recordEmpty: true,
    });
    expect(reply.disposition).toBe('assigned');
    const again = await h.store.settle(cmd);
    expect(again.receipt).toEqual(first.receipt);
    expect(again.already_accepted).toBe(true);
    expect(again.task_state).toBe('active');
  });
});

describe('retry accounting (DESIGN §4.1 attempt counting)', () => {
  it('an attempt never granted dispatch does not count; the delay follows the policy', async () => {
    const a = await claim({
      retry: { max_attempts: 1, delay_ms: 1000, backoff: 'exponential', max_delay_ms: 60_000 },
    });
    // Not dispatched: a retryable failure re-queues even with max_attempts 1.
    const first = await h.store.settle(failureCommand(a, 'nd'));
    expect(first.task_state).toBe('queued');
    const s1 = await h.store.status(SCOPE, a.lease.owner.task_id);
    expect(s1.available_at - first.receipt.accepted_at).toBeGreaterThanOrEqual(1);
    expect(s1.available_at - first.receipt.accepted_at).toBeLessThanOrEqual(1000);
    // Second attempt, dispatched: exhausts the budget.
    h.advance(2000);
    try {
      const queue = a.event.ldgqueue;
      const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
      const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
        recordEmpty: true,
      });
      if (reply.disposition !== 'assigned') throw new Error(reply.disposition);
      await dispatch(reply.assignment);
      const second = await h.store.settle(failureCommand(reply.assignment, 'd'));
      expect(second.task_state).toBe('failed');
      const status = await h.store.status(SCOPE, a.lease.owner.task_id);
      expect(status.attempt_count).toBe(2);
      gapless(await history(a.lease.owner.task_id));
    } finally {
      h.advance(-2000);
    }
  });
});

describe('concurrent settle batches over the same attempts', () => {
  it('reversed orders, different commands: each attempt settled once, no unavailable', async () => {
    const tasks = await Promise.all([claim(), claim(), claim(), claim()]);
    for (const t of tasks) await dispatch(t);
    const other = h.makeStore(4);
    const left = tasks.map((t, i) => successCommand(t, `L${i}`, { side: 'L' }));
    const right = [...tasks].reverse().map((t, i) => successCommand(t, `R${i}`, { side: 'R' }));
    const [l, r] = await Promise.all([h.store.settleBatch(left), other.settleBatch(right)]);
    const codes = [...l, ...r].map((x) => (x.ok ? 'ok' : x.error.code));
    expect(codes.filter((c) => c === 'ok')).toHaveLength(4);
    expect(codes.filter((c) => c === 'conflict')).toHaveLength(4);
    for (const t of tasks) {
      const events = await history(t.lease.owner.task_id);
      gapless(events);
      expect(events.filter((e) => e.event.reason === 'report_accepted')).toHaveLength(1);
      expect(events.filter((e) => e.event.reason === 'succeeded')).toHaveLength(1);
    }
  });
});
