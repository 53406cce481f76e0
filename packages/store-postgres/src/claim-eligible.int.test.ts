/**
 * A claim answers a poll with the best eligible task (DESIGN §5 Acquire), never `empty` while an
 * eligible task is queued and no other claimer competes for it: behind a concurrency key sorting
 * below one the claim holds, and beside a task appearing while the claim runs. Each test here
 * failed before its fix; the order that holds is in ordering.int.test.ts.
 */
import type { AcquireReply } from '@ledgence/contracts';
import { withGroupCommit } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  outcomeCode,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('claim_eligible');
});
afterAll(() => h.close());

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The task id a reply assigned, or its disposition. */
function taskOf(reply: AcquireReply): string {
  return reply.disposition === 'assigned'
    ? reply.assignment.lease.owner.task_id
    : reply.disposition;
}

/**
 * Holds `worker_sessions`' ACCESS EXCLUSIVE lock in another session: a poll reads its store time
 * (after its slot locks), then waits here to read its session, and only then runs its claim
 * select — a deterministic stretch between the two, which is microseconds without the lock.
 */
async function holdSessionsTable(): Promise<() => Promise<void>> {
  const holder = await h.sql.reserve();
  await holder`begin`;
  await holder`lock table worker_sessions in access exclusive mode`;
  return async () => {
    await holder`commit`;
    holder.release();
  };
}

describe('a batch over two concurrency keys', () => {
  it('takes an eligible task whose key sorts below a key it already took, rather than answering empty', async () => {
    const queue = 'rev-keyorder';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
    // Two tasks of key "rev-kb" (limit 1) ahead of one of key "rev-ka": the first round of the
    // batch's claim takes b1 and is refused b2 (its own claim holds kb's only slot); the second
    // round finds a1, eligible (ka has no active task) and uncontended.
    const b1 = await h.store.submit(
      submitCommand('rev-b1', { queue, priority: 10, concurrency_key: 'rev-kb' }),
    );
    await h.store.submit(
      submitCommand('rev-b2', { queue, priority: 9, concurrency_key: 'rev-kb' }),
    );
    const a1 = await h.store.submit(
      submitCommand('rev-a1', { queue, priority: 0, concurrency_key: 'rev-ka' }),
    );
    const replies = await h.store.acquireBatch(
      [acquireCommand(session.id, 0, 1, queue), acquireCommand(session.id, 1, 1, queue)],
      { recordEmpty: true },
    );
    const got = replies.map((r) => {
      if (!r.ok) throw r.error;
      return taskOf(r.value.reply);
    });
    // DESIGN §5: a new poll picks the best eligible task. a1 was eligible and nobody else was
    // claiming; the second slot was answered `empty` because "ka" sorts below "kb", which the
    // transaction already held (store.ts KeyLockOrder), although taking a1's key row without
    // waiting could not deadlock.
    expect(got).toEqual([b1.snapshot.task_id, a1.snapshot.task_id]);
  });
});

describe('single polls coalesced by group commit (DESIGN §7.1)', () => {
  it('two single polls grouped into one claim are each answered as alone, whatever the order of their tasks’ keys', async () => {
    const queue = 'rev-group-keys';
    const first = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const second = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const b1 = await h.store.submit(
      submitCommand('rev-g-b1', { queue, priority: 10, concurrency_key: 'rev-g-kb' }),
    );
    await h.store.submit(
      submitCommand('rev-g-b2', { queue, priority: 9, concurrency_key: 'rev-g-kb' }),
    );
    const a1 = await h.store.submit(
      submitCommand('rev-g-a1', { queue, priority: 0, concurrency_key: 'rev-g-ka' }),
    );
    const grouped = withGroupCommit(h.makeStore(2), { maxInFlight: 1 });
    // A poll with a sequence gap runs alone and takes nothing; held on the sessions table, it
    // keeps the queue's only batch in flight while the two real polls arrive, so they go as one.
    const release = await holdSessionsTable();
    const gap = outcomeCode(
      grouped.acquire(acquireCommand(first.id, 0, 5, queue), { recordEmpty: true }),
    );
    await h.untilLockWaits(1);
    const polls = [first, second].map((s) =>
      grouped.acquire(acquireCommand(s.id, 0, 1, queue), { recordEmpty: true }),
    );
    await release();
    expect(await gap).toBe('sequence_conflict');
    const got = (await Promise.all(polls)).map((o) => taskOf(o.reply));
    // Alone, the first poll takes b1 and the second (b2 then blocked by b1's key) takes a1.
    expect(got).toEqual([b1.snapshot.task_id, a1.snapshot.task_id]);
  });
});

describe('a better task that appears while a poll runs', () => {
  it('a task submitted between a poll’s clock read and its claim select does not make the poll miss the task that was eligible', async () => {
    const queue = 'rev-late-submit';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const older = await h.store.submit(submitCommand('rev-older', { queue, priority: 0 }));
    const release = await holdSessionsTable();
    const poll = h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true });
    await h.untilLockWaits(1);
    // Submitted after the poll's store time: the claim select (which reads the commits before
    // it) ranks it first, LIMIT 1, and the store then sets it aside as too new.
    await h.store.submit(submitCommand('rev-newer', { queue, priority: 10 }));
    await release();
    const { reply } = await poll;
    // The older task was eligible at the poll's time and still is: `empty` is wrong.
    expect(taskOf(reply)).toBe(older.snapshot.task_id);
  });

  it('a task coming due between a poll’s clock read and its claim select does not make the poll miss the task that was eligible', async () => {
    const queue = 'rev-late-due';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const older = await h.store.submit(submitCommand('rev-due-older', { queue, priority: 0 }));
    const due = await h.store.submit(
      submitCommand('rev-due-soon', { queue, priority: 10, delay_ms: 400 }),
    );
    const release = await holdSessionsTable();
    const poll = h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true });
    await h.untilLockWaits(1);
    // Real time, not the harness offset: the poll's statements already carry theirs.
    while ((await h.store.now()) <= due.snapshot.available_at + 50) await sleep(50);
    await release();
    const { reply } = await poll;
    // If the poll read its clock before the delayed task was due, it must get the older task;
    // had it read it after (a very slow start), the delayed one. Never `empty`.
    expect([older.snapshot.task_id, due.snapshot.task_id]).toContain(taskOf(reply));
  });
});
