/**
 * Time limits and the retry policy at their edges (DESIGN §4.1, §5), on the real
 * store with a movable clock (`harness.advance`) and real PostgreSQL.
 */
import {
  type Assignment,
  RETRY_MAX_DELAY_MS,
  type SettleCommand,
  type TaskResult,
} from '@ledgence/contracts';
import { lifecycleConfig, MIN_DISPATCH_WINDOW_MS } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore } from './store.js';
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
/** A store whose safety margin is 1 s: the least timeout_ms it accepts is 1 500. */
let tight: Harness;
beforeAll(async () => {
  h = await harness('budget_edges');
  tight = await harness(
    'budget_edges_tight',
    lifecycleConfig({ ...CONFIG, leaseSafetyMarginMs: 1_000 }),
  );
});
afterAll(async () => {
  await h?.close();
  await tight?.close();
});

let sessions = 0;
async function claim(x: Harness, queue: string): Promise<Assignment> {
  const s = await x.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  sessions += 1;
  const { reply } = await x.store.acquire(acquireCommand(s.id, 0, 1, queue), { recordEmpty: true });
  if (reply.disposition !== 'assigned') throw new Error(`poll ${sessions}: ${reply.disposition}`);
  return reply.assignment;
}

function timedOut(a: Assignment, op: string): SettleCommand {
  return {
    owner: a.lease.owner,
    operation_id: op,
    report: {
      kind: 'failed',
      report: {
        kind: 'timed_out',
        message: 'dispatch was refused: too little execution budget remained',
        retryable: true,
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

describe('the least execution budget a store accepts: its margin + MIN_DISPATCH_WINDOW_MS', () => {
  it('is accepted, and a dispatch renewal 1 ms after the claim is granted; 1 ms less is refused', async () => {
    const queue = 'tight-min';
    const least = 1_000 + MIN_DISPATCH_WINDOW_MS;
    expect(
      await outcomeCode(
        tight.store.submit(submitCommand('tight-short', { timeout_ms: least - 1 })),
      ),
    ).toBe('invalid_input');
    await tight.store.submit(
      submitCommand('tight-min', {
        queue,
        timeout_ms: least,
        retry: { max_attempts: 1, delay_ms: 0 },
      }),
    );
    const a = await claim(tight, queue);
    // Any real round trip takes a millisecond at least: the renewal still finds more than the
    // margin left.
    tight.advance(1);
    const d = await tight.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    expect(d.dispatch_allowed).toBe(true);
  });

  it('a task stored with less (by a store with a shorter margin) fails at its refused attempt instead of re-queuing for ever', async () => {
    const queue = 'tight-stored';
    // Accepted by a replica whose margin is 500 ms (or an earlier version): 1 ms over its margin.
    const earlier = createPostgresTaskStore({
      url: tight.db.url,
      config: lifecycleConfig({ ...CONFIG, leaseSafetyMarginMs: 500 }),
    });
    let taskId: string;
    try {
      const { snapshot } = await earlier.submit(
        submitCommand('tight-stored', {
          queue,
          timeout_ms: 1_001,
          retry: { max_attempts: 1, delay_ms: 0 },
        }),
      );
      taskId = snapshot.task_id;
    } finally {
      await earlier.close();
    }
    const states: string[] = [];
    for (let round = 1; round <= 5; round += 1) {
      const a = await claim(tight, queue);
      // The dispatch renewal arrives 1 ms of store time after the claim: 1 000 ms of budget
      // left, not more than this store's margin — refused.
      tight.advance(1);
      const d = await tight.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      expect(d.dispatch_allowed).toBe(false);
      // What the worker SDK reports for it (worker/src/lease.ts dispatchDecision).
      const reply = await tight.store.settle(timedOut(a, `refused-${round}`));
      states.push(reply.task_state);
      if (reply.task_state !== 'queued') break;
    }
    // Before the fix: queued after every round, attempt_count 5 for max_attempts 1.
    expect(states).toEqual(['failed']);
    expect((await tight.store.status(SCOPE, taskId)).attempt_count).toBe(1);
  });
});

describe('a settlement near the deadlines', () => {
  it('after the attempt deadline but within the cleanup grace, a success is accepted and the task succeeds', async () => {
    const queue = 'late-success';
    const { snapshot } = await h.store.submit(
      submitCommand('late-success', {
        queue,
        timeout_ms: 3_000,
        retry: { max_attempts: 1, delay_ms: 0 },
      }),
    );
    const a = await claim(h, queue);
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    h.advance(1_900);
    await h.store.renew(renewCommand(a.lease.owner, 2));
    h.advance(1_300); // past the attempt deadline (3 000), within the grace (1 000)
    const k = await h.store.renew(renewCommand(a.lease.owner, 3));
    expect(k.execution_remaining_ms).toBe(0);
    expect(k.expires_at).toBe(a.attempt_deadline + CONFIG.cleanupGraceMs);
    const reply = await h.store.settle(successCommand(a, 'late-ok'));
    expect(reply.task_state).toBe('succeeded');
    const result = (await h.store.result(SCOPE, snapshot.task_id)) as TaskResult;
    expect(result.outcome).toMatchObject({ state: 'succeeded' });
  });

  it('after the lease expired at store time, before recovery ran, a settlement is ownership_lost and recovery fails the last dispatched attempt lease_expired, reporting attempt_count', async () => {
    const queue = 'late-lost';
    const { snapshot } = await h.store.submit(
      submitCommand('late-lost', {
        queue,
        timeout_ms: 10_000,
        retry: { max_attempts: 1, delay_ms: 0 },
      }),
    );
    // A first attempt lost before its dispatch: it does not count, but attempt_count does.
    const first = await claim(h, queue);
    h.advance(CONFIG.leaseDurationMs + 1);
    await h.store.recoverExpiredLeases();
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('queued');
    const second = await claim(h, queue);
    await h.store.renew(renewCommand(second.lease.owner, 1, 'dispatch'));
    h.advance(CONFIG.leaseDurationMs + 1);
    expect(await outcomeCode(h.store.settle(successCommand(second, 'too-late')))).toBe(
      'ownership_lost',
    );
    expect(await outcomeCode(h.store.settle(failureCommand(first, 'stale')))).toBe(
      'ownership_lost',
    );
    await h.store.recoverExpiredLeases();
    const result = (await h.store.result(SCOPE, snapshot.task_id)) as TaskResult;
    expect(result.status).toMatchObject({ state: 'failed', attempt_count: 2, max_attempts: 1 });
    expect(result.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'lease_expired', attempts: 2 },
    });
    const reasons = (await h.store.history(SCOPE, snapshot.task_id, 0)).map((e) => e.event.reason);
    expect(reasons).toEqual([
      'submitted',
      'claimed',
      'lease_expired',
      'retry_scheduled',
      'claimed',
      'dispatch_authorized',
      'lease_expired',
      'failed',
    ]);
  });
});

describe('retry delays at their bounds', () => {
  it('a fixed delay of RETRY_MAX_DELAY_MS puts the retry exactly that far after the failure, by store time', async () => {
    const queue = 'max-fixed';
    const { snapshot } = await h.store.submit(
      submitCommand('max-fixed', {
        queue,
        timeout_ms: 10_000,
        retry: { max_attempts: 2, delay_ms: RETRY_MAX_DELAY_MS },
      }),
    );
    const a = await claim(h, queue);
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    const reply = await h.store.settle(failureCommand(a, 'max-fixed-1'));
    expect(reply.task_state).toBe('queued');
    const status = await h.store.status(SCOPE, snapshot.task_id);
    expect(status.available_at).toBe(reply.receipt.accepted_at + RETRY_MAX_DELAY_MS);
  });

  it('an exponential policy whose delay_ms equals max_delay_ms: every retry within 1..max_delay_ms', async () => {
    const queue = 'max-exp';
    const { snapshot } = await h.store.submit(
      submitCommand('max-exp', {
        queue,
        timeout_ms: 10_000,
        retry: { max_attempts: 4, delay_ms: 700, backoff: 'exponential', max_delay_ms: 700 },
      }),
    );
    const delays: number[] = [];
    for (let n = 1; n <= 3; n += 1) {
      const a = await claim(h, queue).catch(async () => {
        h.advance(700);
        return claim(h, queue);
      });
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      const reply = await h.store.settle(failureCommand(a, `max-exp-${n}`));
      const status = await h.store.status(SCOPE, snapshot.task_id);
      delays.push(status.available_at - reply.receipt.accepted_at);
      h.advance(700);
    }
    for (const d of delays) {
      expect(d).toBeGreaterThanOrEqual(1);
      expect(d).toBeLessThanOrEqual(700);
    }
    const last = await claim(h, queue);
    await h.store.renew(renewCommand(last.lease.owner, 1, 'dispatch'));
    const reply = await h.store.settle(failureCommand(last, 'max-exp-4'));
    expect(reply.task_state).toBe('failed');
    expect((await h.store.status(SCOPE, snapshot.task_id)).attempt_count).toBe(4);
  });
});
