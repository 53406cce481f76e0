/**
 * DESIGN §11 "SIGTERM = stop accepting, finish in-flight requests, end long polls
 * with `empty`"; TaskServiceOptions.closing: "parked waits stop parking and answer as if their
 * wait had ended (an acquire records and returns `empty`)"; refuseWhileClosing: "A closing server
 * takes no new work". A poll parked when shutdown begins must not claim a task then.
 */
import type { AcquireCommand, Scope } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { createTaskService } from './service.js';
import {
  acquireCommand,
  createMemoryTaskStore,
  freshScope,
  type MemoryTaskStore,
  openSessionCommand,
  submitCommand,
} from './testing/index.js';

async function sessionWithSlots(store: MemoryTaskStore, scope: Scope, concurrency: number) {
  const session = await store.openSession(openSessionCommand(scope, { concurrency }));
  const poll = (slot: number, sequence: number): AcquireCommand =>
    acquireCommand(session, slot, sequence);
  return { session, poll };
}

describe('a parked poll when the service starts closing, with a task ready that no hint announced yet', () => {
  it('acquire: answers empty and claims nothing', async () => {
    const store = createMemoryTaskStore();
    const closing = new AbortController();
    const service = createTaskService({
      store,
      rescanIntervalMs: 60_000,
      longPollMaxMs: 60_000,
      closing: closing.signal,
    });
    const scope = freshScope();
    const { poll } = await sessionWithSlots(store, scope, 1);
    const parked = service.acquire(poll(0, 1), { waitMs: 60_000 });
    await new Promise((resolve) => setTimeout(resolve, 20));
    // Committed by another replica a moment before the signal; its NOTIFY is still on its way.
    const { snapshot } = await store.submit(submitCommand(scope));
    closing.abort();
    const reply = await parked;
    const status = await store.status(scope, snapshot.task_id);
    expect({ disposition: reply.disposition, state: status.state }).toEqual({
      disposition: 'empty',
      state: 'queued',
    });
  });

  it('acquire:batch: answers every slot empty and claims nothing', async () => {
    const store = createMemoryTaskStore();
    const closing = new AbortController();
    const service = createTaskService({
      store,
      rescanIntervalMs: 60_000,
      longPollMaxMs: 60_000,
      closing: closing.signal,
    });
    const scope = freshScope();
    const { poll } = await sessionWithSlots(store, scope, 2);
    const parked = service.acquireBatch([poll(0, 1), poll(1, 1)], { waitMs: 60_000 });
    await new Promise((resolve) => setTimeout(resolve, 20));
    await store.submit(submitCommand(scope, { idempotency_key: 'a' }));
    await store.submit(submitCommand(scope, { idempotency_key: 'b' }));
    closing.abort();
    const replies = await parked;
    expect(replies.map((r) => (r.ok ? r.value.disposition : r.error.code))).toEqual([
      'empty',
      'empty',
    ]);
  });
});
