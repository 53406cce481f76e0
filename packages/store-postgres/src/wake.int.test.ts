import { createTaskService, type TaskStore, type WakeTopic } from '@ledgence/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
beforeAll(async () => {
  h = await harness('wake');
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
});
afterAll(async () => {
  await wake.close();
  await h.close();
});

const TIMEOUT = 20_000;

async function timed(promise: Promise<void>): Promise<number> {
  const started = performance.now();
  await promise;
  return performance.now() - started;
}

/** One park on a fresh watch of `topic`: resolves on a hint, the timeout or the abort. */
async function waitOnce(topic: WakeTopic, timeoutMs: number, signal?: AbortSignal) {
  const watch = wake.watch(topic);
  try {
    await watch.next(timeoutMs, signal);
  } finally {
    watch.close();
  }
}

it('a submit on another store instance wakes a waiter on its queue', async () => {
  const other = h.makeStore(1);
  const waiting = timed(waitOnce({ kind: 'queue', scope: SCOPE, queue: 'wq' }, TIMEOUT));
  const unrelated = waitOnce({ kind: 'queue', scope: SCOPE, queue: 'elsewhere' }, 200);
  await other.submit(submitCommand('wake-1', { queue: 'wq' }));
  // Resolved by the hint, i.e. before its timeout.
  expect(await waiting).toBeLessThan(TIMEOUT);
  await unrelated;
});

/** A task submitted on `queue`, claimed and granted dispatch: ready to be settled. */
async function dispatchedTask(key: string, queue: string) {
  const { snapshot } = await h.store.submit(submitCommand(key, { queue }));
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
  await h.store.renew(renewCommand(reply.assignment.lease.owner, 1, 'dispatch'));
  return { snapshot, assignment: reply.assignment };
}

it('a task becoming terminal wakes its result waiters', async () => {
  const { snapshot, assignment } = await dispatchedTask('wake-2', 'wt');
  const waiting = timed(
    waitOnce({ kind: 'task', scope: SCOPE, task_id: snapshot.task_id }, TIMEOUT),
  );
  await h.makeStore(1).settle(successCommand(assignment, 'w'));
  expect(await waiting).toBeLessThan(TIMEOUT);
});

it('an abort ends the wait', async () => {
  const controller = new AbortController();
  const waiting = timed(
    waitOnce({ kind: 'queue', scope: SCOPE, queue: 'never' }, TIMEOUT, controller.signal),
  );
  controller.abort();
  expect(await waiting).toBeLessThan(TIMEOUT);
});

it('a hint that arrives while the waiter is not parked is kept for its next park', async () => {
  const topic: WakeTopic = { kind: 'queue', scope: SCOPE, queue: 'kept' };
  const watch = wake.watch(topic);
  // Another watch of the topic tells when the hint has been delivered.
  const delivered = waitOnce(topic, TIMEOUT);
  await h.store.submit(submitCommand('wake-kept', { queue: 'kept' }));
  await delivered;
  expect(await timed(watch.next(TIMEOUT))).toBeLessThan(TIMEOUT);
  watch.close();
});

it('closing a watch ends its pending park', async () => {
  const watch = wake.watch({ kind: 'queue', scope: SCOPE, queue: 'closed-watch' });
  const parked = timed(watch.next(TIMEOUT));
  watch.close();
  expect(await parked).toBeLessThan(TIMEOUT);
});

it('holds at most maxWaiters watches; one beyond is not woken, and a closed one frees its place', async () => {
  const bounded = createPostgresWakeSource({ url: h.db.url, maxWaiters: 1 });
  await bounded.ready();
  const topic: WakeTopic = { kind: 'queue', scope: SCOPE, queue: 'bounded' };
  const held = bounded.watch(topic);
  const beyond = bounded.watch(topic);
  await h.store.submit(submitCommand('wake-bounded-1', { queue: 'bounded' }));
  // The held watch is woken by the hint; the same NOTIFY would have marked the other one too.
  expect(await timed(held.next(TIMEOUT))).toBeLessThan(TIMEOUT);
  // Not registered, so no hint was kept for it: its park lasts its whole timeout.
  expect(await timed(beyond.next(200))).toBeGreaterThanOrEqual(195);
  held.close();
  const next = bounded.watch(topic);
  await h.store.submit(submitCommand('wake-bounded-2', { queue: 'bounded' }));
  expect(await timed(next.next(TIMEOUT))).toBeLessThan(TIMEOUT);
  next.close();
  beyond.close();
  await bounded.close();
});

it('a reconnection wakes every waiter (hints may have been lost meanwhile)', async () => {
  const waiting = timed(waitOnce({ kind: 'queue', scope: SCOPE, queue: 'quiet' }, TIMEOUT));
  await h.sql`
    select pg_terminate_backend(pid) from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'`;
  expect(await waiting).toBeLessThan(TIMEOUT);
  // And hints flow again on the new connection.
  for (let i = 0; ; i += 1) {
    const next = timed(waitOnce({ kind: 'queue', scope: SCOPE, queue: 'again' }, 1_000));
    await h.store.submit(submitCommand(`wake-again-${i}`, { queue: 'again' }));
    if ((await next) < 1_000) break;
    expect(i).toBeLessThan(10);
  }
});

/**
 * A store that, right after the first probe of the given kind came back empty, lets another
 * store commit the change that probe missed and waits until that change's hint has reached
 * `wake` — before returning the empty result. It reproduces the window between a long poll's
 * empty probe and its park in which a hint used to be dropped (nothing waited yet), leaving the
 * poll to the fallback rescan.
 */
function racingStore(
  probe: 'acquire' | 'acquireBatch' | 'result',
  topic: WakeTopic,
  commit: () => Promise<unknown>,
): TaskStore {
  let raced = false;
  return new Proxy(h.store, {
    get(target, property) {
      const value = Reflect.get(target, property, target);
      if (property !== probe || typeof value !== 'function') {
        return typeof value === 'function' ? value.bind(target) : value;
      }
      return async (...args: unknown[]) => {
        const outcome = await value.apply(target, args);
        if (!raced) {
          raced = true;
          const delivered = waitOnce(topic, TIMEOUT);
          await commit();
          await delivered;
        }
        return outcome;
      };
    },
  });
}

/** A service whose rescan would come long after any poll below has given up. */
function serviceOver(store: TaskStore) {
  return createTaskService({ store, wake, rescanIntervalMs: 60_000, longPollMaxMs: 20_000 });
}

/**
 * The polls below wait this long. A poll that parked past the hint is answered only when this
 * runs out (its last probe then finds the work), so an answer before it means the hint woke it.
 */
const RACE_WAIT_MS = 5_000;

it('a submit whose hint arrives between a poll’s empty probe and its park still wakes it', async () => {
  const topic: WakeTopic = { kind: 'queue', scope: SCOPE, queue: 'race-one' };
  const session = await h.store.openSession({ scope: SCOPE, queue: 'race-one', concurrency: 1 });
  const submitter = h.makeStore(1);
  const service = serviceOver(
    racingStore('acquire', topic, () =>
      submitter.submit(submitCommand('race-one', { queue: 'race-one' })),
    ),
  );
  const started = performance.now();
  const reply = await service.acquire(acquireCommand(session.id, 0, 1, 'race-one'), {
    waitMs: RACE_WAIT_MS,
  });
  expect(reply.disposition).toBe('assigned');
  expect(performance.now() - started).toBeLessThan(RACE_WAIT_MS);
  await submitter.close();
});

it('the batch poll is woken the same way', async () => {
  const topic: WakeTopic = { kind: 'queue', scope: SCOPE, queue: 'race-batch' };
  const session = await h.store.openSession({
    scope: SCOPE,
    queue: 'race-batch',
    concurrency: 2,
  });
  const submitter = h.makeStore(1);
  const service = serviceOver(
    racingStore('acquireBatch', topic, () =>
      submitter.submit(submitCommand('race-batch', { queue: 'race-batch' })),
    ),
  );
  const started = performance.now();
  const results = await service.acquireBatch(
    [
      acquireCommand(session.id, 0, 1, 'race-batch'),
      acquireCommand(session.id, 1, 1, 'race-batch'),
    ],
    { waitMs: RACE_WAIT_MS },
  );
  const dispositions = results.map((r) => (r.ok ? r.value.disposition : r.error.code)).sort();
  expect(dispositions).toEqual(['assigned', 'empty']);
  expect(performance.now() - started).toBeLessThan(RACE_WAIT_MS);
  await submitter.close();
});

it('a result wait is woken by a settle whose hint arrives between its probe and its park', async () => {
  const { snapshot, assignment } = await dispatchedTask('race-result', 'race-r');
  const settler = h.makeStore(1);
  const topic: WakeTopic = { kind: 'task', scope: SCOPE, task_id: snapshot.task_id };
  const service = serviceOver(
    racingStore('result', topic, () => settler.settle(successCommand(assignment, 'w'))),
  );
  const started = performance.now();
  const result = await service.result(SCOPE, snapshot.task_id, { waitMs: RACE_WAIT_MS });
  expect(result.outcome.state).toBe('succeeded');
  expect(performance.now() - started).toBeLessThan(RACE_WAIT_MS);
  await settler.close();
});
