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

it('a submit on another store instance wakes a waiter on its queue', async () => {
  const other = h.makeStore(1);
  const waiting = timed(wake.wait({ kind: 'queue', scope: SCOPE, queue: 'wq' }, TIMEOUT));
  const unrelated = wake.wait({ kind: 'queue', scope: SCOPE, queue: 'elsewhere' }, 200);
  await other.submit(submitCommand('wake-1', { queue: 'wq' }));
  // Resolved by the hint, i.e. before its timeout.
  expect(await waiting).toBeLessThan(TIMEOUT);
  await unrelated;
});

it('a task becoming terminal wakes its result waiters', async () => {
  const { snapshot } = await h.store.submit(submitCommand('wake-2', { queue: 'wt' }));
  const session = await h.store.openSession({ scope: SCOPE, queue: 'wt', concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, 'wt'), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
  await h.store.renew(renewCommand(reply.assignment.lease.owner, 1, 'dispatch'));
  const waiting = timed(
    wake.wait({ kind: 'task', scope: SCOPE, task_id: snapshot.task_id }, TIMEOUT),
  );
  await h.makeStore(1).settle(successCommand(reply.assignment, 'w'));
  expect(await waiting).toBeLessThan(TIMEOUT);
});

it('an abort ends the wait', async () => {
  const controller = new AbortController();
  const waiting = timed(
    wake.wait({ kind: 'queue', scope: SCOPE, queue: 'never' }, TIMEOUT, controller.signal),
  );
  controller.abort();
  expect(await waiting).toBeLessThan(TIMEOUT);
});

it('a reconnection wakes every waiter (hints may have been lost meanwhile)', async () => {
  const waiting = timed(wake.wait({ kind: 'queue', scope: SCOPE, queue: 'quiet' }, TIMEOUT));
  await h.sql`
    select pg_terminate_backend(pid) from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'`;
  expect(await waiting).toBeLessThan(TIMEOUT);
  // And hints flow again on the new connection.
  for (let i = 0; ; i += 1) {
    const next = timed(wake.wait({ kind: 'queue', scope: SCOPE, queue: 'again' }, 1_000));
    await h.store.submit(submitCommand(`wake-again-${i}`, { queue: 'again' }));
    if ((await next) < 1_000) break;
    expect(i).toBeLessThan(10);
  }
});
