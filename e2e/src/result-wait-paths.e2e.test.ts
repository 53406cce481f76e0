/**
 * A result wait is answered by every path to a terminal state, on the replica the
 * change went through and on another one. Two server processes on one database, rescan ten
 * minutes (HINTS_ONLY_ENV): only a wake hint can answer a wait before its 20 s.
 * A runs maintenance (recovery) every 100 ms, B never within a test: a lease expiry or an
 * authority deadline is applied by A, and a wait on B hears of it only through LISTEN.
 */
import type { Assignment } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { sleep } from './test/harness.js';
import { killWakeConnections, replicaPair, untilListening } from './test/replicas.js';
import {
  call,
  claimNext,
  HINTS_ONLY_ENV,
  settleBody,
  submitTask,
  TASKS_BASE,
  taskBody,
  WAIT_MS,
} from './test/wire.js';

/** Far under the 20 s wait; generous for a loaded 2-core machine. */
const PROMPT_MS = 5_000;

const TIMINGS = {
  ...HINTS_ONLY_ENV,
  LEDGENCE_CLEANUP_GRACE_MS: '1500',
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
};

const pair = replicaPair(
  'result_wait_paths',
  { env: { ...TIMINGS, LEDGENCE_MAINTENANCE_INTERVAL_MS: '100' } },
  { env: { ...TIMINGS, LEDGENCE_MAINTENANCE_INTERVAL_MS: '3600000' } },
);

interface ResultBody {
  status: { state: string };
  outcome: { state: string; failure?: unknown };
}

/** A result wait on `url`: its reply and how long it took. */
async function resultWait(url: string, taskId: string, waitMs = WAIT_MS) {
  const started = performance.now();
  const reply = await call<ResultBody>(
    url,
    `${TASKS_BASE}/tasks/${taskId}/result?wait_ms=${waitMs}`,
  );
  return { status: reply.status, body: reply.body, ms: performance.now() - started };
}

function failBody(assignment: Assignment, retryable?: boolean) {
  return settleBody(assignment, {
    kind: 'application_error',
    error: {
      code: 'boom',
      message: 'x',
      ...(retryable === undefined ? {} : { retryable }),
    },
  });
}

function unconfirmed(body: ReturnType<typeof settleBody>) {
  return { ...body, quiescence: 'unconfirmed' };
}

const replicas = () =>
  [
    ['the same replica (A)', pair.a],
    ['another replica (B)', pair.b],
  ] as const;

describe.each([0, 1])('a result wait answers every terminal path (%#)', (which) => {
  const label = () => replicas()[which]?.[0] ?? '';
  const waiter = () => replicas()[which]?.[1] as ServerProcess;
  const q = (name: string) => `${name}-${which}`;

  /** A task of its own queue, claimed through A, with a result wait parked on the waiter. */
  async function claimedAndAwaited(name: string, extra: Record<string, unknown> = {}) {
    const queue = q(name);
    const id = await submitTask(pair.a.url, taskBody(queue, queue, extra));
    const assignment = await claimNext(pair.a.url, queue);
    const waiting = resultWait(waiter().url, id);
    await sleep(300);
    return { queue, id, assignment, waiting };
  }

  /** The wait answered with `state`, promptly: its time. */
  async function answered(waiting: ReturnType<typeof resultWait>, state: string) {
    const { body, ms } = await waiting;
    expect([label(), body.outcome.state]).toEqual([label(), state]);
    expect(ms).toBeLessThan(PROMPT_MS);
    return ms;
  }

  it.each([
    ['failure with the last attempt (application_error, max_attempts 1)', 1, true],
    ['failure not retryable with attempts left', 5, false],
  ] as const)(
    '%s',
    async (_, maxAttempts, retryable) => {
      const { assignment, waiting } = await claimedAndAwaited(`fail-${maxAttempts}`, {
        retry: { max_attempts: maxAttempts, delay_ms: 0 },
      });
      const settled = await call<{ task_state: string }>(
        pair.a.url,
        '/v1/worker/settle',
        failBody(assignment, retryable),
      );
      expect(settled.body.task_state).toBe('failed');
      await answered(waiting, 'failed');
    },
    60_000,
  );

  it('a retried task: the retry does not answer the wait; its last attempt does', async () => {
    const { queue, assignment, waiting } = await claimedAndAwaited('retry-then-ok', {
      retry: { max_attempts: 2, delay_ms: 0 },
    });
    expect(
      (await call<{ task_state: string }>(pair.a.url, '/v1/worker/settle', failBody(assignment)))
        .body.task_state,
    ).toBe('queued');
    const second = await claimNext(pair.a.url, queue);
    await sleep(300);
    await call(pair.a.url, '/v1/worker/settle', settleBody(second, { kind: 'success', output: 2 }));
    expect(await answered(waiting, 'succeeded')).toBeGreaterThan(500);
  }, 60_000);

  it('cancel of an active task, settled afterwards by its worker', async () => {
    const { id, assignment, waiting } = await claimedAndAwaited('cancel-active');
    const cancelled = await call<{ task_state: string }>(
      pair.a.url,
      `${TASKS_BASE}/tasks/${id}/cancel`,
      {},
    );
    expect(cancelled.body.task_state).toBe('active');
    await sleep(300);
    await call(
      pair.a.url,
      '/v1/worker/settle',
      settleBody(assignment, { kind: 'success', output: 1 }),
    );
    await answered(waiting, 'cancelled');
  }, 60_000);

  it('cancel of an active task whose worker never settles: lease expiry (recovered by A)', async () => {
    const queue = q('cancel-expire');
    const id = await submitTask(
      pair.a.url,
      taskBody(queue, queue, { retry: { max_attempts: 3, delay_ms: 0 } }),
    );
    await claimNext(pair.a.url, queue);
    const waiting = resultWait(waiter().url, id);
    await call(pair.a.url, `${TASKS_BASE}/tasks/${id}/cancel`, {});
    await answered(waiting, 'cancelled');
  }, 60_000);

  it('an unconfirmed settle: pending while held, then answered by confirm_quiescence', async () => {
    const queue = q('unconfirmed-confirm');
    const id = await submitTask(pair.a.url, taskBody(queue, queue, { timeout_ms: 10_000 }));
    const assignment = await claimNext(pair.a.url, queue);
    const settled = await call<{ task_state: string }>(
      pair.a.url,
      '/v1/worker/settle',
      unconfirmed(settleBody(assignment, { kind: 'success', output: 3 })),
    );
    expect(settled.body.task_state).toBe('active');
    // Held: a short wait answers pending after its wait, not before.
    const short = await resultWait(waiter().url, id, 700);
    expect([label(), short.body.outcome.state]).toEqual([label(), 'pending']);
    expect(short.ms).toBeGreaterThanOrEqual(650);
    const waiting = resultWait(waiter().url, id);
    await sleep(300);
    const confirmed = await call<{ task_state: string }>(
      pair.a.url,
      '/v1/worker/quiescence',
      assignment.lease.owner,
    );
    expect(confirmed.body.task_state).toBe('succeeded');
    await answered(waiting, 'succeeded');
  }, 60_000);

  it('an unconfirmed settle never confirmed: answered at the authority deadline (recovered by A)', async () => {
    const queue = q('unconfirmed-deadline');
    const id = await submitTask(
      pair.a.url,
      taskBody(queue, queue, { timeout_ms: 1_000, retry: { max_attempts: 1, delay_ms: 0 } }),
    );
    const assignment = await claimNext(pair.a.url, queue);
    const claimedAt = performance.now();
    const settled = await call<{ task_state: string }>(
      pair.a.url,
      '/v1/worker/settle',
      unconfirmed(settleBody(assignment, { kind: 'success', output: 4 })),
    );
    expect(settled.body.task_state).toBe('active');
    const { body, ms } = await resultWait(waiter().url, id);
    expect([label(), body.status.state]).toEqual([label(), 'succeeded']);
    // The authority deadline is ~2.5 s after the claim (timeout 1 s + grace 1.5 s).
    const sinceClaim = performance.now() - claimedAt;
    expect(sinceClaim).toBeGreaterThan(2_000);
    expect(ms).toBeLessThan(PROMPT_MS + 2_500);
  }, 60_000);

  it('a settle through settle:batch', async () => {
    const { assignment, waiting } = await claimedAndAwaited('batch-settle');
    const reply = await call<{ results: { task_state: string }[] }>(
      pair.a.url,
      '/v1/worker/settle:batch',
      {
        commands: [settleBody(assignment, { kind: 'success', output: 5 })],
      },
    );
    expect(reply.body.results[0]?.task_state).toBe('succeeded');
    await answered(waiting, 'succeeded');
  }, 60_000);
});

describe('a result wait across a cut LISTEN connection', () => {
  it("a wait parked on B is answered when the task is cancelled through A while B's LISTEN is down", async () => {
    await untilListening(pair.sql);
    for (let round = 0; round < 3; round += 1) {
      const id = await submitTask(pair.a.url, taskBody(`cut-${round}`, 'cut-nobody'));
      const waiting = resultWait(pair.b.url, id);
      await sleep(300);
      await killWakeConnections(pair.sql);
      await call(pair.a.url, `${TASKS_BASE}/tasks/${id}/cancel`, {});
      const { body, ms } = await waiting;
      expect([round, body.outcome.state]).toEqual([round, 'cancelled']);
      expect(ms).toBeLessThan(PROMPT_MS);
      await untilListening(pair.sql);
    }
  }, 120_000);
});
