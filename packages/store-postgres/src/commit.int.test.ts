/**
 * A lifecycle or submit transaction sends COMMIT behind its last writes instead of after their answers
 * (store.ts `Finish`, issue #7): one round trip less per transaction; a claim also reads its
 * tasks' data with them (`selectClaimable`), and a submit's insert reads store time itself (a
 * lone insert is sent without BEGIN and COMMIT: explain.int.test.ts). This test counts the round trips;
 * the other side, that a write failing in front of that COMMIT commits nothing and leaves the
 * connection usable, is failure.int.test.ts ("a pipelined write that fails undoes …").
 */
import net from 'node:net';
import type { Assignment } from '@ledgence/contracts';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
/** One connection, so every transaction below runs on the same session. */
let store: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('commit');
  store = h.makeStore(1);
  // postgres.js prepares a statement with a round trip of its own the first time a connection
  // runs it; a first lifecycle leaves only steady-state traffic for the counted one.
  await lifecycle('warm-up');
  await store.submit(submitCommand('warm-up-0', { queue: 'warm-up' })); // a replay's lookups
  await store.submit(submitCommand('warm-up-k', { queue: 'warm-up', concurrency_key: 'k' }));
});
afterAll(() => h.close());

/**
 * The round trips to PostgreSQL while `body` runs on the one-connection `store`: the socket
 * writes that follow an answer (bytes read since the write before). Writes between two answers
 * are one trip: postgres.js writes a statement past 1 KiB at once and smaller ones together.
 */
async function roundTrips(body: () => Promise<unknown>): Promise<number> {
  const port = Number(new URL(h.db.url).port || 5432);
  const original = net.Socket.prototype.write;
  let trips = 0;
  let readAtLastWrite = -1;
  net.Socket.prototype.write = function (this: net.Socket, ...args: unknown[]) {
    if (this.remotePort === port && this.bytesRead !== readAtLastWrite) {
      trips += 1;
      readAtLastWrite = this.bytesRead;
    }
    return (original as (...a: unknown[]) => boolean).apply(this, args);
  } as typeof original;
  try {
    await body();
    return trips;
  } finally {
    net.Socket.prototype.write = original;
  }
}

/** One task of a queue of its own through claim, dispatch renewal and settle, counted. */
async function lifecycle(queue: string) {
  await store.submit(submitCommand(`${queue}-0`, { queue }));
  const session = await store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  let assignment: Assignment | undefined;
  const claim = await roundTrips(async () => {
    const { reply } = await store.acquire(acquireCommand(session.id, 0, 1, queue), {
      recordEmpty: true,
    });
    if (reply.disposition === 'assigned') assignment = reply.assignment;
  });
  expect(assignment?.event.data).toEqual({ key: `${queue}-0` });
  const a = assignment as Assignment;
  const renew = await roundTrips(() => store.renew(renewCommand(a.lease.owner, 1, 'dispatch')));
  const settle = await roundTrips(() => store.settle(successCommand(a, `op-${queue}`)));
  return { trips: { claim, renew, settle }, taskId: a.lease.owner.task_id };
}

it('a lifecycle takes six round trips: claim 2, dispatch renewal 2, settle 2', async () => {
  const { trips, taskId } = await lifecycle('trips');
  // Claim: BEGIN with the slot reads and the claim select, which brings the task's data; the
  // writes with COMMIT (before: the select a trip of its own, 3; before that a data read of its
  // own and COMMIT a step of its own, 5).
  // Renew and settle: BEGIN with the lock and the attempt read; the writes with COMMIT (before:
  // 3 each).
  expect(trips).toEqual({ claim: 2, renew: 2, settle: 2 });
  const [row] = await h.sql<{ state: string }[]>`
    select state from tasks where task_id = ${taskId}`;
  expect(row?.state).toBe('succeeded');
});

it('a submit takes one round trip, its insert reading store time; a replay looks up after', async () => {
  const command = submitCommand('trips-submit', { queue: 'trips-submit' });
  let first: Awaited<ReturnType<PostgresTaskStore['submit']>> | undefined;
  const submit = await roundTrips(async () => {
    first = await store.submit(command);
  });
  expect(submit).toBe(1);
  expect(first?.created).toBe(true);
  // A submit that is more than its insert is a transaction, still in one round trip: BEGIN,
  // the insert, the concurrency key's row and COMMIT sent together.
  const keyed = await roundTrips(() =>
    store.submit(submitCommand('trips-keyed', { queue: 'trips-submit', concurrency_key: 'k' })),
  );
  expect(keyed).toBe(1);
  // The replay's insert skips the held key (and has committed when it answers); the task and
  // its payload are read after it, one round trip each.
  let replay: Awaited<ReturnType<PostgresTaskStore['submit']>> | undefined;
  const replayed = await roundTrips(async () => {
    replay = await store.submit(command);
  });
  expect(replayed).toBe(3);
  expect(replay).toEqual({ created: false, snapshot: first?.snapshot });
  const [count] = await h.sql<{ n: number }[]>`
    select count(*)::int as n from tasks where idempotency_key = 'trips-submit'`;
  expect(count?.n).toBe(1);
});
