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
import type {
  AcquireReply,
  Authority,
  CompletionSubscription,
  SettleBatchReply,
  SettleReply,
  WorkerSession,
} from '@ledgence/contracts';
import { MIN_RETENTION_MS } from '@ledgence/contracts';
import { FAILPOINT_NAMES, type FailpointName } from '@ledgence/core';
import {
  historyOf,
  NAMESPACE,
  reasons,
  settled,
  sleep,
  TENANT,
  until,
} from '@ledgence/e2e/harness';
import { type Client, ProblemError } from '@ledgence/worker';
import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { type CrashRun, crashRun, Receiver, type RunEnv } from './test/crash-run.js';
import {
  acquire,
  ok,
  openSession,
  post,
  postThroughRestart,
  SCOPE,
  successOf,
} from './test/raw.js';

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
  // One claim, never lost: an assignment whose reply the crash cut off is replayed to the
  // worker's retried poll (same session, slot and sequence), not left to expire.
  expect(count(history, 'claimed'), history.join(', ')).toBe(1);
  expect(count(history, 'lease_expired'), history.join(', ')).toBe(0);
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

/**
 * Subscribe: the task is finished first, so the subscription is inserted due at once — the
 * insert the crash cuts off. The client's retry (same subscription key) reaches the replacement;
 * the task has one subscription, delivered, with one event id.
 */
async function subscribeConverges(run: CrashRun, receiver: Receiver): Promise<void> {
  const task = await run.client.submit({ queue: 'subscribe', program: 'echo', data: null });
  run.work('subscribe');
  await settled(run.client, [task.task_id]);
  const options = { destination: 'hooks', subscriptionKey: 'once' };
  const [subscription] = await Promise.all([
    run.client.subscribe(task.task_id, options),
    run.crashed(),
  ]);
  const again = await run.client.subscribe(task.task_id, options);
  expect(again.id).toBe(subscription.id);
  expect(again.event_id).toBe(subscription.event_id);
  await until(
    async () => (await run.client.subscriptions(task.task_id))[0]?.state === 'delivered',
    60_000,
    'delivery',
  );
  const all = await run.client.subscriptions(task.task_id);
  expect(all.map((s) => [s.id, s.generation])).toEqual([[subscription.id, 1]]);
  expect(new Set(receiver.received.map((r) => r.id))).toEqual(new Set([subscription.event_id]));
  expect(new Set(receiver.received.map((r) => r.body)).size).toBe(1);
}

/**
 * A task of `queue` run to its end with one subscription (`hooks`, key `once`) delivered once;
 * `current` reads the subscription as the server has it now.
 */
async function deliveredSubscription(run: CrashRun, queue: string) {
  const task = await run.client.submit({ queue, program: 'echo', data: null });
  const subscription = await run.client.subscribe(task.task_id, {
    destination: 'hooks',
    subscriptionKey: 'once',
  });
  run.work(queue);
  const current = async () => (await run.client.subscriptions(task.task_id))[0];
  await until(async () => (await current())?.state === 'delivered', 60_000, 'first delivery');
  return { task, subscription, current };
}

/** Waits until the subscription `current` reads is delivered at `generation`. */
async function generationDelivered(
  current: () => Promise<CompletionSubscription | undefined>,
  generation: number,
): Promise<void> {
  await until(
    async () => {
      const now = await current();
      return now?.generation === generation && now.state === 'delivered';
    },
    60_000,
    `generation ${generation} delivered`,
  );
}

/**
 * Redeliver: a delivered subscription is redelivered through the crash; the retried request
 * (naming generation 1) lands on the replacement as the first one or as its replay. Exactly one
 * new generation, delivered, with the subscription's one event id.
 */
async function redeliverConverges(run: CrashRun, receiver: Receiver): Promise<void> {
  const { subscription, current } = await deliveredSubscription(run, 'redeliver');
  const [redelivered] = await Promise.all([
    run.client.redeliver(subscription.id, 1),
    run.crashed(),
  ]);
  expect(redelivered.generation).toBe(2);
  expect((await run.client.redeliver(subscription.id, 1)).generation).toBe(2);
  await generationDelivered(current, 2);
  expect((await current())?.generation).toBe(2);
  const ids = receiver.received.map((r) => r.id);
  expect(new Set(ids)).toEqual(new Set([subscription.event_id]));
  expect(new Set(receiver.received.map((r) => r.body)).size).toBe(1);
  expect(ids.length, `${ids.length} POSTs`).toBeGreaterThanOrEqual(2);
}

/**
 * Session extend, over raw HTTP: the extension crosses the crash and is re-sent unchanged to
 * the replacement. The session must come out usable — extended (200) and able to claim work —
 * whether the first extension was rolled back or committed.
 */
async function sessionExtendConverges(run: CrashRun): Promise<void> {
  const session = await openSession(run.url, 'extend');
  const path = `/v1/worker/sessions/${session.id}/extend`;
  const [extended] = await Promise.all([
    postThroughRestart<WorkerSession>(run.url, path, { scope: SCOPE }),
    run.crashed(),
  ]);
  expect(extended.status, JSON.stringify(extended.body)).toBe(200);
  expect(extended.body.id).toBe(session.id);
  expect(extended.body.expires_at).toBeGreaterThanOrEqual(session.expires_at);
  const task = await run.client.submit({ queue: 'extend', program: 'echo', data: null });
  const assignment = await acquire(run.url, session, 'extend');
  expect(assignment.lease.owner.task_id).toBe(task.task_id);
  const settle = successOf(assignment.lease.owner, 'extend-1', null);
  ok('/v1/worker/settle', await post(run.url, '/v1/worker/settle', settle));
  const [result] = await settled(run.client, [task.task_id]);
  expect(result?.outcome).toMatchObject({ state: 'succeeded' });
}

/**
 * Retention policy: a PUT crosses the crash and is re-sent unchanged to the replacement; it
 * answers the policy set, a GET shows it, and the same PUT again answers the same policy.
 */
async function retentionPolicyConverges(run: CrashRun): Promise<void> {
  const path = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}/retention-policy`;
  const retention_ms = MIN_RETENTION_MS * 3;
  const put = async () => {
    const end = Date.now() + 60_000;
    for (;;) {
      try {
        const response = await fetch(`${run.url}${path}`, {
          method: 'PUT',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ retention_ms }),
        });
        if (response.status !== 503)
          return { status: response.status, body: await response.json() };
      } catch {
        // The server is gone or not listening yet: the same PUT again.
      }
      if (Date.now() > end) throw new Error('no answer from the replacement');
      await sleep(50);
    }
  };
  const [answer] = await Promise.all([put(), run.crashed()]);
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
  expect(answer.body).toMatchObject({ retention_ms, source: 'namespace' });
  const read = await fetch(`${run.url}${path}`);
  expect(read.status).toBe(200);
  expect(await read.json()).toMatchObject({ retention_ms, source: 'namespace' });
  const again = await put();
  expect(again.status).toBe(200);
  expect(again.body).toMatchObject({ retention_ms, source: 'namespace' });
}

/** Retention for the collection runs: the shortest policy, passes every 100 ms. */
const RETENTION: RunEnv = {
  LEDGENCE_TERMINAL_RETENTION_MS: String(MIN_RETENTION_MS),
  LEDGENCE_RETENTION_INTERVAL_MS: '100',
};

/** The tables holding a task's rows, each with a `task_id` column. */
const TASK_TABLES = ['tasks', 'attempts', 'task_history', 'task_payloads'] as const;

/**
 * Retention collection: a finished task is aged past the policy in the database (nothing else
 * makes a task an hour old within a test), the maintenance pass deletes it and the crash cuts
 * the pass off before or after its commit. The replacement's pass converges: the task is gone
 * (404), and none of its rows are left behind.
 */
async function retentionCollectConverges(run: CrashRun): Promise<void> {
  const task = await run.client.submit({ queue: 'retire', program: 'echo', data: { n: 1 } });
  run.work('retire');
  await settled(run.client, [task.task_id]);
  const sql = postgres(run.databaseUrl, { max: 1, onnotice: () => {} });
  try {
    const left = async (): Promise<number[]> => {
      const counts: number[] = [];
      for (const table of TASK_TABLES) {
        const [row] = await sql`
          select count(*)::int as n from ${sql(table)} where task_id = ${task.task_id}`;
        counts.push(Number(row?.n));
      }
      return counts;
    };
    expect((await left())[0]).toBe(1);
    await sql`
      update tasks set terminal_at = terminal_at - ${2 * MIN_RETENTION_MS}::bigint
      where task_id = ${task.task_id}`;
    await run.crashed();
    await until(async () => (await left()).every((n) => n === 0), 60_000, 'collection');
    const gone = await run.client.status(task.task_id).catch((error: unknown) => error);
    expect(gone).toBeInstanceOf(ProblemError);
    expect((gone as ProblemError).code).toBe('not_found');
  } finally {
    await sql.end();
  }
}

type Drive = (run: CrashRun) => Promise<void>;
type DeliveryDrive = (run: CrashRun, receiver: Receiver) => Promise<void>;

/** How each point is driven. A `Record` over the names: a new point without a scenario does not compile. */
const SCENARIOS: Record<
  FailpointName,
  { env?: RunEnv; drive: Drive } | { delivery: DeliveryDrive }
> = {
  'subscribe.before_commit': { delivery: subscribeConverges },
  'subscribe.after_commit': { delivery: subscribeConverges },
  'redeliver.before_commit': { delivery: redeliverConverges },
  'redeliver.after_commit': { delivery: redeliverConverges },
  // The worker's session open crosses the crash; it opens one on the replacement and works.
  'session_open.before_commit': { env: LONG_LEASE, drive: workConverges },
  'session_open.after_commit': { env: LONG_LEASE, drive: workConverges },
  'session_extend.before_commit': { drive: sessionExtendConverges },
  'session_extend.after_commit': { drive: sessionExtendConverges },
  // Nothing leased survives a crash before the lease's commit: the try is sent after restart.
  'delivery_lease.before_commit': { delivery: deliveryConverges((n) => n >= 1) },
  // Leased, never sent: sent once the lease runs out.
  'delivery_lease.after_commit': { delivery: deliveryConverges((n) => n >= 1) },
  'retention_policy.before_commit': { drive: retentionPolicyConverges },
  'retention_policy.after_commit': { drive: retentionPolicyConverges },
  'retention_collect.before_commit': { env: RETENTION, drive: retentionCollectConverges },
  'retention_collect.after_commit': { env: RETENTION, drive: retentionCollectConverges },
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

/**
 * The single `/v1/worker/renew` and `/v1/worker/settle` routes (the SDK sends batches), over raw
 * HTTP: one task claimed, renewed once (sequence 1) and settled once, each request re-sent
 * unchanged through the crash of whichever of them the point is on. The renewal lands once
 * (a replay answers the same sequence), the settlement is accepted once, and `already_accepted`
 * tells which side of the commit the crash was on.
 */
async function singleRoutesConverge(run: CrashRun, name: FailpointName): Promise<void> {
  const task = await run.client.submit({ queue: 'single', program: 'echo', data: { n: 1 } });
  const session = await openSession(run.url, 'single');
  const { owner } = (await acquire(run.url, session, 'single')).lease;
  const settle = successOf(owner, 'single-1', { n: 1 });
  const drive = async () => {
    const renewed = await postThroughRestart<Authority>(run.url, '/v1/worker/renew', {
      owner,
      sequence: 1,
      intent: 'keep_alive',
    });
    const accepted = await postThroughRestart<SettleReply>(run.url, '/v1/worker/settle', settle);
    return { renewed, accepted };
  };
  const [{ renewed, accepted }] = await Promise.all([drive(), run.crashed()]);
  expect(renewed.status, JSON.stringify(renewed.body)).toBe(200);
  expect(renewed.body.renew_sequence).toBe(1);
  expect(accepted.status, JSON.stringify(accepted.body)).toBe(200);
  expect(accepted.body.task_state).toBe('succeeded');
  expect(accepted.body.already_accepted).toBe(name === 'settle.after_commit');
  // The same settle again is a replay of the one accepted settlement.
  const replay = await post<SettleReply>(run.url, '/v1/worker/settle', settle);
  expect(replay.status).toBe(200);
  expect(replay.body.already_accepted).toBe(true);
  expect(replay.body.receipt).toEqual(accepted.body.receipt);
  const history = reasons(await historyOf(run.client, task.task_id));
  expect(count(history, 'claimed'), history.join(', ')).toBe(1);
  expect(count(history, 'report_accepted')).toBe(1);
  expect(count(history, 'succeeded')).toBe(1);
  expect(count(history, 'lease_expired')).toBe(0);
  const attempt = await run.client.attempt(task.task_id, owner.attempt_id);
  expect(attempt.last_renewal?.sequence).toBe(1);
}

/**
 * The single `/v1/worker/acquire` route (the SDK polls in batches; single polls are coalesced
 * into group claims), over raw HTTP: the poll is re-sent unchanged through the crash. The claim
 * is made once and the retried poll gets it (a replay: same attempt), never a second claim or
 * an assignment left to expire; the same poll again replays the same attempt.
 */
async function singleAcquireConverges(run: CrashRun): Promise<void> {
  const task = await run.client.submit({ queue: 'poll', program: 'echo', data: null });
  const session = await openSession(run.url, 'poll');
  const path = '/v1/worker/acquire?wait_ms=1000';
  const poll = {
    scope: SCOPE,
    queue: 'poll',
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  };
  const [answer] = await Promise.all([
    postThroughRestart<AcquireReply>(run.url, path, poll),
    run.crashed(),
  ]);
  const reply = ok(path, answer);
  if (reply.disposition !== 'assigned') throw new Error(`not assigned: ${JSON.stringify(reply)}`);
  const { owner } = reply.assignment.lease;
  expect(owner.task_id).toBe(task.task_id);
  const again = ok(path, await post<AcquireReply>(run.url, path, poll));
  expect(again.disposition === 'assigned' && again.assignment.lease.owner).toEqual(owner);
  ok('/v1/worker/settle', await post(run.url, '/v1/worker/settle', successOf(owner, 'p-1', 1)));
  const history = reasons(await historyOf(run.client, task.task_id));
  expect(count(history, 'claimed'), history.join(', ')).toBe(1);
  expect(count(history, 'lease_expired')).toBe(0);
  expect(count(history, 'report_accepted')).toBe(1);
  expect(count(history, 'succeeded')).toBe(1);
}

/**
 * Cancel of a running task (the scenario table cancels a queued one): the cancel request
 * crosses the crash, the client's retry reaches the replacement, the worker learns of it at
 * its next renewal and the task ends `cancelled`, the request and the cancellation recorded once.
 */
async function cancelActiveConverges(run: CrashRun): Promise<void> {
  const task = await run.client.submit({
    queue: 'cancel-active',
    program: 'patient',
    data: { ms: 120_000 },
  });
  run.work('cancel-active');
  // Running: its handler started (a cancel before dispatch would never start it).
  await until(() => run.executions() === 1, 30_000, 'the handler running');
  const [state] = await Promise.all([run.client.cancel(task.task_id), run.crashed()]);
  expect(['active', 'cancelled']).toContain(state);
  const [result] = await settled(run.client, [task.task_id]);
  expect(result?.outcome).toMatchObject({ state: 'cancelled' });
  expect(await run.client.cancel(task.task_id)).toBe('cancelled');
  const history = reasons(await historyOf(run.client, task.task_id));
  expect(count(history, 'cancel_requested'), history.join(', ')).toBe(1);
  expect(count(history, 'cancelled'), history.join(', ')).toBe(1);
  expect(count(history, 'lease_expired'), history.join(', ')).toBe(0);
  expect(run.executions()).toBe(1);
}

/**
 * A failed attempt settled through the crash: its failure schedules a retry. The settlement
 * re-sent to the replacement lands once, so the retry is scheduled once and the second attempt
 * succeeds: two claims, two accepted reports, one `retry_scheduled`.
 */
async function retryConverges(run: CrashRun): Promise<void> {
  const task = await run.client.submit({
    queue: 'retry',
    program: 'flaky',
    data: { n: 1 },
    retry: { max_attempts: 3, delay_ms: 0 },
  });
  run.work('retry');
  await run.crashed();
  const [result] = await settled(run.client, [task.task_id]);
  expect(result?.outcome).toMatchObject({ state: 'succeeded' });
  const history = reasons(await historyOf(run.client, task.task_id));
  expect(count(history, 'retry_scheduled'), history.join(', ')).toBe(1);
  expect(count(history, 'claimed'), history.join(', ')).toBe(2);
  expect(count(history, 'report_accepted'), history.join(', ')).toBe(2);
  expect(count(history, 'lease_expired'), history.join(', ')).toBe(0);
  expect(run.executions()).toBe(2);
}

/**
 * The per-item fallback of a failed batch: a settle batch of two whose transaction fails
 * (`settle.before_commit=error*1`, rolled back), so the store settles each item alone — and the
 * process dies right after the first item's commit. The request is re-sent unchanged to the
 * replacement: the committed item replays, the other is accepted; each task settles once.
 */
async function fallbackConverges(run: CrashRun): Promise<void> {
  const first = await run.client.submit({ queue: 'fallback', program: 'echo', data: { n: 1 } });
  const second = await run.client.submit({ queue: 'fallback', program: 'echo', data: { n: 2 } });
  const session = await openSession(run.url, 'fallback', 2);
  const owners = [
    (await acquire(run.url, session, 'fallback', 0)).lease.owner,
    (await acquire(run.url, session, 'fallback', 1)).lease.owner,
  ];
  const commands = owners.map((owner, i) => successOf(owner, `fallback-${i}`, i));
  const [answer] = await Promise.all([
    postThroughRestart<SettleBatchReply>(run.url, '/v1/worker/settle:batch', { commands }),
    run.crashed(),
  ]);
  expect(run.armedStderr()).toContain('failpoint fired: settle.before_commit (error)');
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
  const results = answer.body.results as SettleReply[];
  expect(results.map((r) => r.task_state)).toEqual(['succeeded', 'succeeded']);
  // The first item, settled alone, committed before the crash: it replays.
  expect(results.map((r) => r.already_accepted)).toEqual([true, false]);
  for (const task of [first, second]) {
    const history = reasons(await historyOf(run.client, task.task_id));
    expect(count(history, 'report_accepted'), history.join(', ')).toBe(1);
    expect(count(history, 'succeeded')).toBe(1);
  }
}

/** The SDK's ordinary path with every commit of it failing once with `error` (no crash). */
const WORK_ERRORS = [
  'submit.after_commit',
  'session_open.after_commit',
  'acquire.after_commit',
  'renew.after_commit',
  'settle.after_commit',
] as const satisfies readonly FailpointName[];

/**
 * `error` after each commit of a task's life: the operation committed, yet the caller is told
 * `unavailable` (an outcome unknown) and retries. The retries converge on what was committed:
 * one task, one claim (the acquire replays its assignment), one run, one settlement.
 */
async function workErrorsConverge(run: CrashRun): Promise<void> {
  const task = await run.client.submit(
    { queue: 'errors', program: 'deaf', data: { ms: 1_000 } },
    { idempotencyKey: 'once' },
  );
  run.work('errors');
  const [result] = await settled(run.client, [task.task_id]);
  expect(result?.outcome).toMatchObject({ state: 'succeeded' });
  for (const name of WORK_ERRORS) {
    expect(run.armedStderr()).toContain(`failpoint fired: ${name} (error)`);
  }
  expect(await tasksOf(run.client, 'errors')).toEqual([task.task_id]);
  const history = reasons(await historyOf(run.client, task.task_id));
  expect(count(history, 'claimed'), history.join(', ')).toBe(1);
  expect(count(history, 'lease_expired'), history.join(', ')).toBe(0);
  expect(count(history, 'report_accepted')).toBe(1);
  expect(run.executions()).toBe(1);
}

/** The callback path with each of its commits (and a try's report) failing once with `error`. */
const DELIVERY_ERRORS = [
  'subscribe.after_commit',
  'delivery_lease.before_commit',
  'delivery.after_send',
  'redeliver.after_commit',
] as const satisfies readonly FailpointName[];

/**
 * `error` on the callback path: the subscribe retried after its commit finds its subscription,
 * a failed lease is retried, a try whose report failed is sent again once its lease runs out,
 * a redelivery retried after its commit replays. One subscription, one event id, generation 2.
 */
async function deliveryErrorsConverge(run: CrashRun, receiver: Receiver): Promise<void> {
  const { task, subscription, current } = await deliveredSubscription(run, 'errors');
  expect((await run.client.redeliver(subscription.id, 1)).generation).toBe(2);
  await generationDelivered(current, 2);
  for (const name of DELIVERY_ERRORS) {
    expect(run.armedStderr()).toContain(`failpoint fired: ${name} (error)`);
  }
  const all = await run.client.subscriptions(task.task_id);
  expect(all.map((s) => [s.id, s.generation])).toEqual([[subscription.id, 2]]);
  expect(new Set(receiver.received.map((r) => r.id))).toEqual(new Set([subscription.event_id]));
}

/** Runs `run` with a started receiver and the server environment that names it `hooks`. */
async function withReceiver(
  run: (env: RunEnv, receiver: Receiver) => Promise<void>,
): Promise<void> {
  const receiver = await new Receiver().start();
  try {
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: receiver.destinations(),
      // The sender raises it to the destination timeout + 5 s: the shortest it allows.
      LEDGENCE_COMPLETION_LEASE_MS: '100',
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '20',
    };
    await run(env, receiver);
  } finally {
    await receiver.close();
  }
}

async function runPoint(name: FailpointName): Promise<void> {
  const scenario = SCENARIOS[name];
  if (!('delivery' in scenario)) {
    await crashRun(name, scenario.env ?? {}, fired, scenario.drive);
    return;
  }
  await withReceiver((env, receiver) =>
    crashRun(name, env, fired, (run) => scenario.delivery(run, receiver)),
  );
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

/** Points of the single routes, each crashed while a raw client renews and settles one task. */
const SINGLE_ROUTE_POINTS = [
  'renew.before_commit',
  'renew.after_commit',
  'renew.after_reply',
  'settle.before_commit',
  'settle.after_commit',
  'settle.after_reply',
] as const satisfies readonly FailpointName[];

describe('failpoints: routes the SDK does not take, and the error action', () => {
  // Not part of the coverage line: these points are covered above; this is where else they sit.
  const alsoFired = new Set<FailpointName>();

  describe.concurrent('each path', () => {
    it.each(SINGLE_ROUTE_POINTS)('%s on the single route (raw HTTP)', async (name) => {
      await crashRun(name, LONG_LEASE, alsoFired, (run) => singleRoutesConverge(run, name));
    });

    it.each(['acquire.before_commit', 'acquire.after_commit', 'acquire.after_reply'] as const)(
      '%s on the single route (raw HTTP)',
      async (name) => {
        await crashRun(name, LONG_LEASE, alsoFired, singleAcquireConverges);
      },
    );

    it.each(['cancel.before_commit', 'cancel.after_commit', 'cancel.after_reply'] as const)(
      '%s cancelling a running task',
      async (name) => {
        await crashRun(name, LONG_LEASE, alsoFired, cancelActiveConverges);
      },
    );

    it.each(['settle.before_commit', 'settle.after_commit', 'settle.after_reply'] as const)(
      '%s settling a failed attempt that schedules a retry',
      async (name) => {
        await crashRun(name, LONG_LEASE, alsoFired, retryConverges);
      },
    );

    it('settle.after_commit inside the per-item fallback of a failed settle batch', async () => {
      await crashRun(
        'settle.after_commit',
        LONG_LEASE,
        alsoFired,
        fallbackConverges,
        'settle.before_commit=error*1,settle.after_commit=crash*1',
      );
    });

    // No crash armed: the scenario never waits for one, and the one server keeps running.
    it('error once after each commit of a task: the SDK converges on what was committed', async () => {
      const spec = WORK_ERRORS.map((name) => `${name}=error*1`).join(',');
      await crashRun('submit.after_commit', LONG_LEASE, alsoFired, workErrorsConverge, spec);
    });

    it('error once on each step of the callback path: one subscription, one event id', async () => {
      const spec = DELIVERY_ERRORS.map((name) => `${name}=error*1`).join(',');
      await withReceiver((env, receiver) =>
        crashRun(
          'subscribe.after_commit',
          env,
          alsoFired,
          (run) => deliveryErrorsConverge(run, receiver),
          spec,
        ),
      );
    });
  });
});
