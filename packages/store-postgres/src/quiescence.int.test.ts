/**
 * Cleanup confirmation against the real store on two replicas (two stores, their own pools, one
 * database and one movable clock): a settlement reported `unconfirmed` holds its task `active`
 * until the confirmation or the authority deadline, whichever comes first, and its outcome is
 * applied once — one `retry_scheduled`, one concurrency-key slot given back — whichever replica
 * and path apply it. A confirmation that comes too late is refused the same way whether or not
 * recovery has run yet.
 */
import type { Assignment, LeaseOwner } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';

let h: Harness;
let a: PostgresTaskStore;
let b: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('quiescence');
  a = h.store;
  b = h.makeStore();
});
afterAll(() => h.close());

/** A retryable application error, reported `unconfirmed`, of `assignment`. */
function unconfirmedError(assignment: Assignment) {
  const owner = assignment.lease.owner;
  return {
    owner,
    operation_id: `op-${owner.attempt_id}`,
    report: {
      kind: 'completed' as const,
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: {
          kind: 'application_error' as const,
          error: { code: 'e', message: 'deaf', retryable: true },
        },
      },
    },
    quiescence: 'unconfirmed' as const,
    processing_trace: null,
  };
}

/**
 * A keyed task (limit 1) claimed, dispatched and settled `unconfirmed` on replica `a`, and a
 * second task of the same key waiting (unless `second` is false); returns the first's assignment and the session.
 */
async function heldTask(key: string, second = true) {
  const queue = `qr-${key}`;
  const session = await a.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const keyed = { queue, concurrency_key: key, concurrency_limit: 1 };
  await a.submit(
    submitCommand(`${key}-1`, {
      ...keyed,
      timeout_ms: 2_000,
      retry: { max_attempts: 3, delay_ms: 0 },
    }),
  );
  if (second) await a.submit(submitCommand(`${key}-2`, keyed));
  const { reply } = await a.acquire(acquireCommand(session.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error(`got ${reply.disposition}`);
  const assignment = reply.assignment;
  await a.renew(renewCommand(assignment.lease.owner, 1, 'dispatch'));
  await a.settle(unconfirmedError(assignment));
  return { assignment, session, queue };
}

async function reasonsOf(taskId: string): Promise<string[]> {
  return (await a.history(SCOPE, taskId, 0)).map((e) => e.event.reason);
}

function count(items: string[], item: string): number {
  return items.filter((x) => x === item).length;
}

/** Claims on a fresh session of `queue`: how many tasks one poll per slot of 2 takes. */
async function claimable(queue: string): Promise<number> {
  const session = await b.openSession({ scope: SCOPE, queue, concurrency: 2 });
  let taken = 0;
  for (const consumer of [0, 1]) {
    const { reply } = await b.acquire(acquireCommand(session.id, consumer, 1, queue), {
      recordEmpty: true,
    });
    if (reply.disposition === 'assigned') taken += 1;
  }
  return taken;
}

function deadlineOf(assignment: Assignment): number {
  return assignment.attempt_deadline + CONFIG.cleanupGraceMs;
}

/** How far the shared clock was moved: store time is the database's clock plus this. */
let advanced = 0;

async function storeNow(): Promise<number> {
  const [row] = await h.sql`select (extract(epoch from clock_timestamp()) * 1000)::float8 as now`;
  return Number(row?.now) + advanced;
}

/** Moves the shared clock to `ms` past `at` (store time; `ms` may be negative). */
async function advanceTo(at: number, ms: number): Promise<void> {
  const by = Math.ceil(Math.max(0, at + ms - (await storeNow())));
  advanced += by;
  h.advance(by);
}

describe('cleanup confirmation on two replicas', () => {
  it('the task is held active, its key slot taken, until the confirmation; then the outcome applies once', async () => {
    const { assignment, queue } = await heldTask('held');
    const owner: LeaseOwner = assignment.lease.owner;
    expect((await a.status(SCOPE, owner.task_id)).state).toBe('active');
    // The key's slot stays with the held attempt: the other task of the key waits.
    expect(await claimable(queue)).toBe(0);
    expect(await b.confirmQuiescence(owner)).toBe('queued');
    // Once more, on the other replica: answered, nothing applied twice.
    expect(await a.confirmQuiescence(owner)).toBe('queued');
    await a.recoverExpiredLeases();
    const reasons = await reasonsOf(owner.task_id);
    expect(count(reasons, 'cleanup_confirmed')).toBe(1);
    expect(count(reasons, 'retry_scheduled')).toBe(1);
    // The slot is free once: one of the key's two tasks is claimed, not both.
    expect(await claimable(queue)).toBe(1);
  });

  for (const order of ['confirm first', 'recovery first'] as const) {
    it(`past the authority deadline, ${order}: the confirmation is ownership_lost and the deadline's outcome applies once`, async () => {
      const { assignment, queue } = await heldTask(`late-${order.split(' ')[0]}`);
      const owner = assignment.lease.owner;
      await advanceTo(deadlineOf(assignment), 10);
      let confirmed: string;
      if (order === 'confirm first') {
        confirmed = await outcomeCode(b.confirmQuiescence(owner));
        await a.recoverExpiredLeases();
      } else {
        await a.recoverExpiredLeases();
        confirmed = await outcomeCode(b.confirmQuiescence(owner));
      }
      // The same answer whichever ran first: the worker is told its confirmation came too late
      // (not a state reading as if it had been taken).
      expect(confirmed).toBe('ownership_lost');
      const reasons = await reasonsOf(owner.task_id);
      expect(reasons).not.toContain('cleanup_confirmed');
      expect(count(reasons, 'retry_scheduled')).toBe(1);
      const attempt = await a.inspectAttempt(SCOPE, owner.task_id, owner.attempt_id);
      expect(attempt.quiescence).toBe('unconfirmed');
      expect(await claimable(queue)).toBe(1);
    });
  }

  it('a late confirmation after the task was claimed again is ownership_lost, not the new attempt’s state', async () => {
    const { assignment, session, queue } = await heldTask('reclaimed', false);
    const owner = assignment.lease.owner;
    await advanceTo(deadlineOf(assignment), 10);
    await b.recoverExpiredLeases();
    await a.extendSession(SCOPE, session.id);
    const { reply } = await a.acquire(acquireCommand(session.id, 0, 2, queue), {
      recordEmpty: true,
    });
    expect(reply.disposition === 'assigned' && reply.assignment.event.ldgtaskid).toBe(
      owner.task_id,
    );
    expect((await a.status(SCOPE, owner.task_id)).state).toBe('active');
    expect(await outcomeCode(b.confirmQuiescence(owner))).toBe('ownership_lost');
  });

  it('recovery and a confirmation racing on two replicas just before the deadline: confirmed once', async () => {
    for (let round = 0; round < 5; round += 1) {
      const { assignment } = await heldTask(`race-before-${round}`);
      const owner = assignment.lease.owner;
      await advanceTo(deadlineOf(assignment), -200);
      const [confirmed] = await Promise.all([
        outcomeCode(b.confirmQuiescence(owner)),
        a.recoverExpiredLeases(),
      ]);
      expect(confirmed).toBe('ok');
      const reasons = await reasonsOf(owner.task_id);
      expect(count(reasons, 'cleanup_confirmed')).toBe(1);
      expect(count(reasons, 'retry_scheduled')).toBe(1);
    }
  });

  it('recovery and a confirmation racing on two replicas past the deadline: one outcome, never confirmed', async () => {
    for (let round = 0; round < 5; round += 1) {
      const { assignment } = await heldTask(`race-after-${round}`);
      const owner = assignment.lease.owner;
      await advanceTo(deadlineOf(assignment), 10);
      const [confirmed] = await Promise.all([
        outcomeCode(b.confirmQuiescence(owner)),
        a.recoverExpiredLeases(),
      ]);
      expect(confirmed).toBe('ownership_lost');
      // A pass that met the task locked by the confirmation skipped it; the next one takes it.
      await a.recoverExpiredLeases();
      await b.recoverExpiredLeases();
      const reasons = await reasonsOf(owner.task_id);
      expect(reasons).not.toContain('cleanup_confirmed');
      expect(count(reasons, 'retry_scheduled')).toBe(1);
    }
  });
});
