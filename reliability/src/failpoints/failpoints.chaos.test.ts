/**
 * T2, crash points (issue #8): for every failpoint of `FAILPOINTS`, a server
 * process armed with it dies of SIGKILL at that exact point, a replacement
 * starts on the same database and port, the SDK (client or worker) retries,
 * and the system converges: one task per idempotency key, one accepted
 * settlement per finished task, one recovery per expired lease, every
 * callback delivered with the same event id. Prints `failpoints covered N/M`.
 *
 * Each point runs on a database of its own (its own server pair), so one
 * point's crash — say, in the recovery loop — cannot fire on another run's
 * lease; runs go a few at a time to fit the two-core budget.
 */
import type { AcquireReply, WorkerSession } from '@ledgence/contracts';
import { FAILPOINT_NAMES, type FailpointName } from '@ledgence/core';
import { historyOf, NAMESPACE, reasons, settled, TENANT, until } from '@ledgence/e2e/harness';
import type { Client } from '@ledgence/worker';
import { afterAll, describe, expect, it } from 'vitest';
import { type CrashRun, crashRun, Receiver, type RunEnv } from './test/crash-run.js';

/**
 * A lease long enough that a replacement starts well within it: a worker
 * interrupted mid-protocol converges by replaying (the path under test), not
 * by losing its lease. Recovery runs keep the harness's 1 s lease. The
 * product's default (30 s): 10 s was once too short with five runs starting
 * servers at once on two cores (CI, 2026-12-02: `settle.before_commit` ran its
 * handler twice, the lease having expired before the retried settle landed).
 */
const LONG_LEASE: RunEnv = { LEDGENCE_LEASE_DURATION_MS: '30000' };

/** Points that fired (the armed process died there), for the coverage line. */
const fired = new Set<FailpointName>();

const count = (all: readonly string[], reason: string) => all.filter((r) => r === reason).length;

async function tasksOf(client: Client, queue: string): Promise<string[]> {
  const ids: string[] = [];
  for await (const page of client.list({ queue })) ids.push(...page.tasks.map((t) => t.task_id));
  return ids;
}

/** Submit: the retried submit finds the task, and the key never yields a second one. */
async function submitConverges(run: CrashRun): Promise<void> {
  const input = { queue: 'submit', program: 'echo', data: { n: 1 } };
  const [first] = await Promise.all([
    run.client.submit(input, { idempotencyKey: 'once' }),
    run.crashed(),
  ]);
  const again = await run.client.submit(input, { idempotencyKey: 'once' });
  expect(again.task_id).toBe(first.task_id);
  expect(await tasksOf(run.client, 'submit')).toEqual([first.task_id]);
}

/** Acquire, renew, settle: the worker retries through the restart; one accepted settlement. */
async function workConverges(run: CrashRun): Promise<void> {
  const task = await run.client.submit({ queue: 'work', program: 'echo', data: { n: 7 } });
  run.work('work');
  await run.crashed();
  const [result] = await settled(run.client, [task.task_id]);
  expect(result?.outcome).toMatchObject({ state: 'succeeded' });
  const history = reasons(await historyOf(run.client, task.task_id));
  expect(count(history, 'report_accepted')).toBe(1);
  expect(count(history, 'succeeded')).toBe(1);
  // The lease outlives the restart, so the one attempt runs the handler exactly once.
  expect(run.executions(), `history: ${history.join(', ')}`).toBe(1);
}

/**
 * A budget short against the handler, a cleanup grace long against the run: the handler
 * ignores the end of its budget, the worker reports it `timed_out` (unconfirmed) and confirms
 * quiescence when it returns, which is where the point fires.
 */
const QUIESCENCE: RunEnv = {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '60000',
};

/**
 * Quiescence: the worker's confirmation crosses the crash and is retried to the replacement;
 * cleanup is confirmed once and the held decision (a final timeout) applied once.
 */
async function quiescenceConverges(run: CrashRun): Promise<void> {
  const task = await run.client.submit({
    queue: 'quiesce',
    program: 'deaf',
    data: { ms: 3_000 },
    timeout_ms: 1_500,
    retry: { max_attempts: 1, delay_ms: 0 },
  });
  run.work('quiesce');
  await run.crashed();
  const [result] = await settled(run.client, [task.task_id]);
  expect(result?.outcome).toMatchObject({
    state: 'failed',
    failure: { kind: 'execution', error: { kind: 'timed_out' } },
  });
  const history = reasons(await historyOf(run.client, task.task_id));
  expect(count(history, 'report_accepted')).toBe(1);
  expect(count(history, 'cleanup_confirmed')).toBe(1);
  expect(count(history, 'lease_expired')).toBe(0);
}

/**
 * Cancel: a queued task cancelled through the crash; the client's retry reaches the replacement,
 * a repeated cancel answers the same, and the cancellation is recorded once.
 */
async function cancelConverges(run: CrashRun): Promise<void> {
  const queued = await run.client.submit({ queue: 'cancel', program: 'echo', data: null });
  const [state] = await Promise.all([run.client.cancel(queued.task_id), run.crashed()]);
  expect(state).toBe('cancelled');
  expect(await run.client.cancel(queued.task_id)).toBe('cancelled');
  const history = reasons(await historyOf(run.client, queued.task_id));
  expect(history).toEqual(['submitted', 'cancelled']);
}

/** Claims one task over raw HTTP and never renews it: its lease runs out. */
async function claimAndAbandon(url: string, queue: string): Promise<string> {
  const scope = { tenant_id: TENANT, namespace: NAMESPACE };
  const post = async <T>(path: string, body: unknown): Promise<T> => {
    const response = await fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
    return (await response.json()) as T;
  };
  const session = await post<WorkerSession>('/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 1,
  });
  const reply = await post<AcquireReply>('/v1/worker/acquire?wait_ms=1000', {
    scope,
    queue,
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  if (reply.disposition !== 'assigned') {
    throw new Error(`expected an assignment, got ${JSON.stringify(reply)}`);
  }
  return reply.assignment.lease.owner.attempt_id;
}

/** Recovery: the expired lease is recovered exactly once, and the task then completes. */
async function recoveryConverges(run: CrashRun): Promise<void> {
  const task = await run.client.submit({ queue: 'recover', program: 'echo', data: null });
  const abandoned = await claimAndAbandon(run.url, 'recover');
  await run.crashed();
  run.work('recover');
  const [result] = await settled(run.client, [task.task_id]);
  expect(result?.outcome).toMatchObject({ state: 'succeeded' });
  const events = await historyOf(run.client, task.task_id);
  const expired = events.filter((e) => e.event.reason === 'lease_expired');
  expect(expired.map((e) => e.event.attempt_id)).toEqual([abandoned]);
  expect(count(reasons(events), 'claimed')).toBe(2);
  expect(count(reasons(events), 'report_accepted')).toBe(1);
}

/**
 * Delivery: the subscription ends `delivered` and every POST the receiver saw
 * carries the subscription's one event id; `sends` says how many POSTs the
 * point implies (at least once: a crash after sending sends again).
 */
function deliveryConverges(sends: (n: number) => boolean) {
  return async (run: CrashRun, receiver: Receiver): Promise<void> => {
    const task = await run.client.submit({ queue: 'deliver', program: 'echo', data: null });
    const subscription = await run.client.subscribe(task.task_id, {
      destination: 'hooks',
      subscriptionKey: 'once',
    });
    run.work('deliver');
    await run.crashed();
    await until(
      async () => (await run.client.subscriptions(task.task_id))[0]?.state === 'delivered',
      60_000,
      'delivery',
    );
    const ids = receiver.received.map((r) => r.id);
    expect(new Set(ids)).toEqual(new Set([subscription.event_id]));
    expect(new Set(receiver.received.map((r) => r.body)).size).toBe(1);
    expect(sends(ids.length), `${ids.length} POSTs`).toBe(true);
  };
}

type Drive = (run: CrashRun) => Promise<void>;
type DeliveryDrive = (run: CrashRun, receiver: Receiver) => Promise<void>;

/** How each point is driven. A `Record` over the names: a new point without a scenario does not compile. */
const SCENARIOS: Record<
  FailpointName,
  { env?: RunEnv; drive: Drive } | { delivery: DeliveryDrive }
> = {
  'submit.before_commit': { drive: submitConverges },
  'submit.after_commit': { drive: submitConverges },
  'submit.after_reply': { drive: submitConverges },
  'acquire.before_commit': { env: LONG_LEASE, drive: workConverges },
  'acquire.after_commit': { env: LONG_LEASE, drive: workConverges },
  'acquire.after_reply': { env: LONG_LEASE, drive: workConverges },
  'renew.before_commit': { env: LONG_LEASE, drive: workConverges },
  'renew.after_commit': { env: LONG_LEASE, drive: workConverges },
  'renew.after_reply': { env: LONG_LEASE, drive: workConverges },
  'settle.before_commit': { env: LONG_LEASE, drive: workConverges },
  'settle.after_commit': { env: LONG_LEASE, drive: workConverges },
  'settle.after_reply': { env: LONG_LEASE, drive: workConverges },
  'quiescence.before_commit': { env: QUIESCENCE, drive: quiescenceConverges },
  'quiescence.after_commit': { env: QUIESCENCE, drive: quiescenceConverges },
  'quiescence.after_reply': { env: QUIESCENCE, drive: quiescenceConverges },
  'cancel.before_commit': { drive: cancelConverges },
  'cancel.after_commit': { drive: cancelConverges },
  'cancel.after_reply': { drive: cancelConverges },
  'recovery.before_commit': { drive: recoveryConverges },
  'recovery.after_commit': { drive: recoveryConverges },
  // Nothing reached the receiver: the try is lost with the lease, and sent after it runs out.
  'delivery.before_send': { delivery: deliveryConverges((n) => n >= 1) },
  // Received, not recorded: sent again (same id) once the lease runs out.
  'delivery.after_send': { delivery: deliveryConverges((n) => n >= 2) },
  // Received and recorded: nothing is sent again.
  'delivery.after_report': { delivery: deliveryConverges((n) => n === 1) },
};

async function runPoint(name: FailpointName): Promise<void> {
  const scenario = SCENARIOS[name];
  if (!('delivery' in scenario)) {
    await crashRun(name, scenario.env ?? {}, fired, scenario.drive);
    return;
  }
  const receiver = await new Receiver().start();
  try {
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: receiver.destinations(),
      // The sender raises it to the destination timeout + 5 s: the shortest it allows.
      LEDGENCE_COMPLETION_LEASE_MS: '100',
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '20',
    };
    await crashRun(name, env, fired, (run) => scenario.delivery(run, receiver));
  } finally {
    await receiver.close();
  }
}

describe('failpoints: a crash at every point converges after a restart', () => {
  // Concurrent up to vitest's maxConcurrency (5): each run mostly waits (process starts, a
  // lease running out), so overlapping them keeps the suite inside its time budget.
  describe.concurrent('each point', () => {
    it.each(FAILPOINT_NAMES)('%s', async (name) => {
      await runPoint(name);
    });
  });

  afterAll(() => {
    const total = FAILPOINT_NAMES.length;
    const covered = FAILPOINT_NAMES.filter((name) => fired.has(name)).length;
    const missing = FAILPOINT_NAMES.filter((name) => !fired.has(name));
    console.log(
      `failpoints covered ${covered}/${total} (${Math.round((covered / total) * 100)} %)` +
        (missing.length > 0 ? `; not hit: ${missing.join(', ')}` : ''),
    );
    expect(missing).toEqual([]);
  });
});
