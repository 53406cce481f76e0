/**
 * A parked poll looks again when a task of its queue comes due: nothing announces a due time
 * (no hint is sent when a delay or a retry's backoff ends), so an empty probe reports the queue's
 * next due time (`AcquireOutcome.nextDue`) and the park ends then. The PostgreSQL store's side,
 * with its real wake source: packages/store-postgres/src/due-wake.int.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { withGroupCommit } from './group-commit.js';
import type { TaskStore } from './ports.js';
import { createTaskService } from './service.js';
import {
  acquireCommand,
  createMemoryTaskStore,
  freshScope,
  openSessionCommand,
  submitCommand,
} from './testing/index.js';

describe('the memory store reports when its queue next has a task come due', () => {
  it('on an unrecorded empty only: the earliest delayed task of the queue, whatever its priority or key', async () => {
    let now = 1_000_000;
    const store = createMemoryTaskStore({ now: () => now });
    const scope = freshScope();
    const session = await store.openSession(openSessionCommand(scope, { concurrency: 1 }));
    const probe = () => store.acquire(acquireCommand(session, 0, 1), { recordEmpty: false });
    expect((await probe()).nextDue).toBeUndefined();
    await store.submit(submitCommand(scope, { priority: 9, delay_ms: 5_000 }));
    await store.submit(submitCommand(scope, { priority: -9, delay_ms: 3_000 }));
    // Another queue's sooner task is not this queue's due time.
    await store.submit(submitCommand(scope, { queue: 'elsewhere', delay_ms: 1_000 }));
    expect((await probe()).nextDue).toEqual({ at: now + 3_000, observedAt: now });
    // A poll answered now does not park: nothing to report.
    expect(
      (await store.acquire(acquireCommand(session, 0, 1), { recordEmpty: true })).nextDue,
    ).toBeUndefined();
    // Once due, the task is claimed, and a claim reports no due time.
    now += 3_000;
    const claimed = await store.acquire(acquireCommand(session, 0, 2), { recordEmpty: false });
    expect(claimed.reply.disposition).toBe('assigned');
    expect(claimed.nextDue).toBeUndefined();
  });
});

describe('a parked poll with no hint to wake it', () => {
  const cases: [string, boolean, (store: TaskStore) => TaskStore][] = [
    ['a single poll', false, (store) => store],
    ['a batch', true, (store) => store],
    ['a single poll through group commit', false, (store) => withGroupCommit(store)],
  ];
  it.each(cases)(
    '%s is answered when a delayed task comes due, long before its rescan',
    async (_, batched, wrap) => {
      const memory = createMemoryTaskStore();
      // No wake source and a rescan past the wait: only the due time can end the park early (the
      // final probe at the end of the wait would find the task too).
      const WAIT = 3_000;
      const service = createTaskService({
        store: wrap(memory),
        rescanIntervalMs: 60_000,
        longPollMaxMs: WAIT,
      });
      const scope = freshScope();
      const session = await memory.openSession(openSessionCommand(scope, { concurrency: 1 }));
      const { snapshot } = await memory.submit(submitCommand(scope, { delay_ms: 200 }));
      const poll = acquireCommand(session, 0, 1);
      const started = performance.now();
      const reply = batched
        ? await service.acquireBatch([poll], { waitMs: WAIT }).then(([item]) => {
            if (!item?.ok) throw new Error('expected a reply');
            return item.value;
          })
        : await service.acquire(poll, { waitMs: WAIT });
      const elapsed = performance.now() - started;
      if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
      expect(reply.assignment.lease.owner.task_id).toBe(snapshot.task_id);
      expect(elapsed).toBeLessThan(WAIT / 2);
    },
  );
});
