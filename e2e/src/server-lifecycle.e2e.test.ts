/**
 * Operating the server while work is in flight (DESIGN §11, README "Running the
 * server", packages/callbacks README "The sender"): rolling restarts of two replicas with SDK
 * workers and completion subscriptions, SIGTERM with a callback POST in flight, restarts with
 * changed settings.
 */
import { MAX_COMPLETION_BATCH } from '@ledgence/contracts';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
import type { Client, Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  historyOf,
  idsOf,
  perAttempt,
  portOf,
  Stack,
  settled,
  shortWorker,
  sleep,
  until,
  watchUnhandledRejections,
} from './test/harness.js';
import { startReceiver } from './test/receiver.js';
import { startBalancer } from './test/replicas.js';

const SECRET = `whsec_${Buffer.alloc(32, 9).toString('base64')}`;

function destinations(url: string, timeoutMs: number, alias = 'billing') {
  return JSON.stringify({ [alias]: { url, secret: SECRET, timeout_ms: timeoutMs } });
}

const stack = new Stack('server_lifecycle');
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];
const closers: (() => Promise<void>)[] = [];

beforeAll(async () => {
  await stack.open();
}, 60_000);
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
  await Promise.all(closers.splice(0).map((c) => c()));
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

/**
 * `count` workers of 3 slots on `queue` through `url`, each handler taking `pauseMs`: how many
 * times each task ran, their run() promises, and the failures of those that gave up (rejected).
 */
function drainingWorkers(url: string, queue: string, count: number, pauseMs: number) {
  const runs = new Map<string, number>();
  const gaveUp: unknown[] = [];
  const running: Promise<void>[] = [];
  for (let w = 0; w < count; w += 1) {
    const worker = shortWorker(url, queue, { concurrency: 3 });
    worker.register('work', async (_data, ctx) => {
      runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1);
      await sleep(pauseMs);
      return null;
    });
    workers.push(worker);
    running.push(worker.run().catch((error: unknown) => void gaveUp.push(error)));
  }
  return { runs, gaveUp, running };
}

/** Every task of `ids` succeeded, with exactly one settlement accepted in its history. */
async function expectEachSucceededOnce(c: Client, ids: string[]): Promise<void> {
  const results = await settled(c, ids, 180_000);
  expect(
    results.filter((r) => r.outcome.state !== 'succeeded').map((r) => r.status.task_id),
  ).toEqual([]);
  const doubly: string[] = [];
  for (const id of ids) {
    const reports = [...perAttempt(await historyOf(c, id), 'report_accepted').values()].reduce(
      (a, b) => a + b,
      0,
    );
    if (reports !== 1) doubly.push(`${id}: ${reports}`);
  }
  expect(doubly).toEqual([]);
}

describe('a rolling restart of two replicas while workers drain subscribed tasks', () => {
  it('every task ends once, every callback is delivered under its event id, no worker gives up, both stops exit 0', async () => {
    // Slow enough answers that tries are in flight when a replica is stopped.
    const receiver = await startReceiver(() => 150);
    closers.push(receiver.close);
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiver.url, 3_000),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      LEDGENCE_COMPLETION_LEASE_MS: '1000',
    };
    const replicas: ServerProcess[] = await Promise.all([stack.start(env), stack.start(env)]);
    const balancer = await startBalancer(() => replicas.map((r) => r.url));
    closers.push(balancer.close);
    const c = client(balancer.url);
    const queue = 'rolling';
    const total = 200;
    const ids = idsOf(
      await c.submitBatch(
        Array.from({ length: total }, (_, i) => ({ queue, program: 'work', data: { i } })),
      ),
    );
    const eventIds = new Map<string, string>();
    for (const id of ids) {
      const s = await c.subscribe(id, { destination: 'billing' });
      eventIds.set(id, s.event_id);
    }
    const { runs, gaveUp, running } = drainingWorkers(balancer.url, queue, 3, 30);
    const exits: (number | string)[] = [];
    for (const index of [0, 1]) {
      await until(async () => runs.size >= 50 * (index + 1), 120_000, 'work under way');
      const victim = replicas[index] as ServerProcess;
      exits.push(await victim.stop('SIGTERM'));
      replicas[index] = await stack.start({ ...env, PORT: portOf(victim.url) });
    }
    await expectEachSucceededOnce(c, ids);
    expect(exits).toEqual([0, 0]);
    expect(gaveUp).toEqual([]);
    await until(
      () => new Set(receiver.posts.map((p) => p.id)).size >= total,
      120_000,
      'every event posted',
    );
    const posted = new Set(receiver.posts.map((p) => p.id));
    expect([...eventIds.values()].filter((e) => !posted.has(e))).toEqual([]);
    // Every subscription ends delivered (a try aborted by a stop is redelivered).
    const notDelivered: string[] = [];
    await until(
      async () => {
        notDelivered.length = 0;
        for (const id of ids) {
          const [s] = await c.subscriptions(id);
          if (s?.state !== 'delivered') notDelivered.push(`${id}: ${s?.state}`);
        }
        return notDelivered.length === 0;
      },
      120_000,
      'every subscription delivered',
    ).catch(() => {});
    expect(notDelivered).toEqual([]);
    // Repeats carry the same bytes.
    const bodies = new Map<string, string>();
    for (const p of receiver.posts) {
      const b = bodies.get(p.id);
      if (b === undefined) bodies.set(p.id, p.body);
      else expect(p.body).toBe(b);
    }
    await Promise.all(workers.map((w) => w.stop()));
    await Promise.all(running);
    expect(gaveUp).toEqual([]);
  }, 400_000);
});

describe('SIGTERM while a callback POST to a slow receiver is in flight', () => {
  it('within the budget: the try is finished and recorded delivered, never posted again', async () => {
    // Answers after 1.5 s; the destination allows 5 s and the shutdown 10 s (the default).
    const receiver = await startReceiver(() => 1_500);
    closers.push(receiver.close);
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiver.url, 5_000),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    };
    const a = await stack.start(env);
    const c = client(a.url);
    const task = await c.submit({ queue: 'slow-cb', program: 'never-run', data: {} });
    const s = await c.subscribe(task.task_id, { destination: 'billing' });
    await c.cancel(task.task_id);
    await until(() => receiver.posts.length === 1, 30_000, 'the try in flight');
    expect(await a.stop('SIGTERM')).toBe(0);
    // A replacement with the same settings: nothing left to send.
    const b = await stack.start(env);
    const [view] = await client(b.url).subscriptions(task.task_id);
    expect(view).toMatchObject({ state: 'delivered', attempts: 1, event_id: s.event_id });
    await sleep(1_000);
    expect(receiver.posts.map((p) => p.id)).toEqual([s.event_id]);
  }, 120_000);

  it('past the budget: the try is aborted and reported due (not left delivering), and a replacement posts the same id and bytes', async () => {
    // Never answers within the 1.5 s shutdown budget; the destination allows 20 s.
    const receiver = await startReceiver((_post, seen) => (seen === 0 ? 60_000 : 0));
    closers.push(receiver.close);
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiver.url, 20_000),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '1500',
    };
    const a = await stack.start(env, { captureStdout: true });
    const c = client(a.url);
    const task = await c.submit({ queue: 'hung-cb', program: 'never-run', data: {} });
    const s = await c.subscribe(task.task_id, { destination: 'billing' });
    await c.cancel(task.task_id);
    await until(() => receiver.posts.length === 1, 30_000, 'the try in flight');
    expect(await a.stop('SIGTERM')).toBe(0);
    // README: "when the budget runs out, what held it (... or the callback sender)".
    expect(a.stdout()).toMatch(/the completion sender has not stopped/);
    // Read through the database the server left (no sender runs now).
    const b = await stack.start({
      ...env,
      LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiver.url, 20_000, 'other'),
    });
    const [view] = await client(b.url).subscriptions(task.task_id);
    // README (callbacks): "A try aborted by stop({ signal }) counts as a failed try (reason:
    // 'aborted') and is due again on the usual schedule".
    expect(view).toMatchObject({ state: 'due', attempts: 1 });
    expect(String(view?.last_error)).toMatch(/abort/);
    await b.stop('SIGTERM');
    const c2 = await stack.start(env);
    await until(() => receiver.posts.length >= 2, 60_000, 'the retry');
    expect(receiver.posts[1]?.id).toBe(s.event_id);
    expect(receiver.posts[1]?.body).toBe(receiver.posts[0]?.body);
    await until(
      async () => (await client(c2.url).subscriptions(task.task_id))[0]?.state === 'delivered',
      30_000,
      'delivered',
    );
  }, 120_000);
});

describe('SIGTERM with a window of callback tries hanging past the budget', () => {
  it('every aborted try is reported for a retry before the exit: none is left delivering until its lease runs out', async () => {
    const receiver = await startReceiver(() => 120_000);
    closers.push(receiver.close);
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiver.url, 20_000),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '1500',
    };
    const a = await stack.start(env);
    const c = client(a.url);
    // A whole window: aborted together, its tries are reported in one statement (the sender's
    // reportsTogether); one transaction each left most of them delivering on a loaded machine.
    const total = MAX_COMPLETION_BATCH;
    const ids = idsOf(
      await c.submitBatch(
        Array.from({ length: total }, (_, i) => ({
          queue: 'hung-many',
          program: 'x',
          data: { i },
        })),
      ),
    );
    for (const id of ids) await c.subscribe(id, { destination: 'billing' });
    for (const id of ids) await c.cancel(id);
    await until(() => receiver.posts.length === total, 60_000, 'every try in flight');
    expect(await a.stop('SIGTERM')).toBe(0);
    const admin = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
    try {
      const rows = await admin.sql<{ state: string; n: number }[]>`
        select state, count(*)::int as n from completion_deliveries
        where task_id = any(${ids}) group by state order by state`;
      // server.ts: "once it is spent, ... tries still in flight aborted (each reported for a
      // retry)"; callbacks README: "tries still in flight are aborted and reported for a retry".
      expect(Object.fromEntries(rows.map((r) => [r.state, r.n]))).toEqual({ due: total });
    } finally {
      await admin.close();
    }
  }, 120_000);
});

describe('workers pointed straight at one server restarted twice, with a changed lease duration', () => {
  it('every task succeeds with one accepted settlement, and no worker gives up', async () => {
    let server = await stack.start();
    const port = portOf(server.url);
    const c = client(server.url);
    const queue = 'direct-restart';
    const total = 120;
    const ids = idsOf(
      await c.submitBatch(
        Array.from({ length: total }, (_, i) => ({ queue, program: 'work', data: { i } })),
      ),
    );
    const { runs, gaveUp } = drainingWorkers(server.url, queue, 2, 40);
    const settings = [
      { LEDGENCE_LEASE_DURATION_MS: '4000', LEDGENCE_RENEW_INTERVAL_MS: '1000' },
      { LEDGENCE_LEASE_DURATION_MS: '1000', LEDGENCE_RENEW_INTERVAL_MS: '250' },
    ];
    const exits: (number | string)[] = [];
    for (const [i, env] of settings.entries()) {
      await until(() => runs.size >= 30 * (i + 1), 120_000, 'work under way');
      exits.push(await server.stop('SIGTERM'));
      await sleep(300);
      server = await stack.start({ ...env, PORT: port });
    }
    await expectEachSucceededOnce(c, ids);
    expect(exits).toEqual([0, 0]);
    expect(gaveUp).toEqual([]);
  }, 300_000);
});

describe('a restart that removes an alias while its delivery is due, then a restart that restores it', () => {
  it('the delivery is tried once the grace has passed and fails as "destination not configured"; once restored it is delivered under the same id', async () => {
    const receiver = await startReceiver();
    closers.push(receiver.close);
    const withBilling = {
      LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiver.url, 1_000),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
      LEDGENCE_COMPLETION_LEASE_MS: '100',
    };
    const without = {
      ...withBilling,
      LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiver.url, 1_000, 'other'),
    };
    let server = await stack.start(without);
    const port = portOf(server.url);
    // Subscribed through a replica that has the alias, then it is gone.
    const a = await stack.start(withBilling);
    const c = client(a.url);
    const task = await c.submit({ queue: 'alias-gone', program: 'x', data: {} });
    const s = await c.subscribe(task.task_id, { destination: 'billing' });
    expect(await a.stop('SIGTERM')).toBe(0);
    const cs = client(server.url);
    await cs.cancel(task.task_id);
    // Lease max(100, 1 000 + 5 000) ms, grace 4 leases: the first try after ~24 s.
    await until(
      async () => ((await cs.subscriptions(task.task_id))[0]?.attempts ?? 0) >= 1,
      90_000,
      'a try by the replica without the alias',
    );
    const [view] = await cs.subscriptions(task.task_id);
    expect(view?.last_error).toMatch(/destination not configured/);
    expect(['due', 'exhausted']).toContain(view?.state);
    // (Deliveries left over by earlier tests on this database may go out through A.)
    expect(receiver.posts.filter((p) => p.id === s.event_id)).toEqual([]);
    expect(await server.stop('SIGTERM')).toBe(0);
    server = await stack.start({ ...withBilling, PORT: port });
    await until(
      () => receiver.posts.some((p) => p.id === s.event_id),
      60_000,
      'delivered once restored',
    );
    await until(
      async () => (await cs.subscriptions(task.task_id))[0]?.state === 'delivered',
      30_000,
      'recorded delivered',
    );
  }, 200_000);
});
