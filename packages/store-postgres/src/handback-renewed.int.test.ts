/**
 * The hand-back of an undelivered poll reply (core service.ts `handBackUndelivered`) skips an
 * assignment someone renewed. It reads `renew_sequence` from the replayed reply, then settles in
 * a transaction of its own: a worker's dispatch renewal committed between the two must still be
 * seen (the store re-checks under the task's lock, `handBackAttempt`), or the hand-back settles
 * the attempt the worker now runs, its own settlement is refused and its result lost. The
 * interleaving is forced with a row lock held by another transaction: the worker's renewal
 * queues on the task row first, the hand-back's settlement second.
 */
import { ContractError } from '@ledgence/contracts';
import { createTaskService } from '@ledgence/core';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
let holders: postgres.Sql;
beforeAll(async () => {
  h = await harness('handback_renewed');
  holders = postgres(h.db.url, { max: 2, onnotice: () => {} });
});
afterAll(async () => {
  await holders.end();
  await h.close();
});

describe('hand-back of a replayed poll whose client left', () => {
  it('never settles an attempt whose worker was granted dispatch before the hand-back committed', async () => {
    const queue = 'handback-renewed';
    const service = createTaskService({ store: h.store });
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(
      submitCommand('handback-renewed-1', { queue, retry: { max_attempts: 1, delay_ms: 1000 } }),
    );
    // The worker's poll, answered: the worker holds the assignment.
    const poll = acquireCommand(session.id, 0, 1, queue);
    const first = await service.acquire(poll);
    if (first.disposition !== 'assigned') throw new Error(`not assigned: ${first.disposition}`);
    const assignment = first.assignment;
    const owner = assignment.lease.owner;

    // Another transaction holds the task row for a moment (any writer of the task would).
    const holder = await holders.reserve();
    await holder`begin`;
    await holder`select 1 from tasks where task_id = ${owner.task_id} for update`;

    // The worker asks for dispatch: its renewal waits for the task row.
    const renewed = h.store.renew(renewCommand(owner, 1, 'dispatch'));
    await h.untilLockWaits(1);
    // A late copy of the same poll arrives; its client has gone. The replay reads the
    // assignment unrenewed (renew_sequence 0) and the hand-back's settlement queues behind.
    const gone = new AbortController();
    gone.abort();
    const late = service.acquire(poll, { signal: gone.signal });
    await h.untilLockWaits(2);
    await holder`commit`;
    holder.release();

    // Granted: a renewal of an attempt the hand-back had settled first would be refused.
    const authority = await renewed;
    expect(authority.dispatch_allowed).toBe(true); // user code may run from here on
    // The late copy is answered as a replay of the assignment (its client never reads it).
    expect((await late).disposition).toBe('assigned');

    // The worker ran the task and settles it: its result must be taken.
    let settled: string;
    try {
      await h.store.settle(successCommand(assignment, 'handback-renewed-op'));
      settled = 'ok';
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
      settled = `${error.code}: ${error.message}`;
    }
    const status = await h.store.status(SCOPE, owner.task_id);
    expect({ settled, state: status.state }).toEqual({ settled: 'ok', state: 'succeeded' });
  });
});
