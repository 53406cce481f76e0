import type { AcquireCommand, Scope } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { withGroupCommit } from './group-commit.js';
import type { TaskStore } from './ports.js';
import { createTaskService } from './service.js';
import {
  acquireCommand,
  createMemoryTaskStore,
  freshScope,
  type MemoryTaskStore,
  openSessionCommand,
  settleSuccess,
  submitCommand,
  TEST_QUEUE,
} from './testing/index.js';

/** Counts calls per method of a real store, to observe batching; answers stay the store's. */
function counting(store: TaskStore): { store: TaskStore; calls: Record<string, number> } {
  const calls: Record<string, number> = {};
  const counted = new Proxy(store, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        calls[String(name)] = (calls[String(name)] ?? 0) + 1;
        return value.apply(target, args);
      };
    },
  });
  return { store: counted, calls };
}

async function sessionWithSlots(store: MemoryTaskStore, scope: Scope, concurrency: number) {
  const session = await store.openSession(openSessionCommand(scope, { concurrency }));
  const poll = (slot: number, sequence: number): AcquireCommand =>
    acquireCommand(session, slot, sequence);
  return { session, poll };
}

describe('withGroupCommit', () => {
  it('answers concurrent acquisitions through shared batches, each with its own reply', async () => {
    const memory = createMemoryTaskStore();
    const scope = freshScope();
    for (let i = 0; i < 12; i++)
      await memory.submit(submitCommand(scope, { idempotency_key: `k${i}` }));
    const { store: observed, calls } = counting(memory);
    const grouped = withGroupCommit(observed, { maxBatch: 8, maxInFlight: 1 });
    const { poll } = await sessionWithSlots(memory, scope, 12);
    const outcomes = await Promise.all(
      Array.from({ length: 12 }, (_, slot) =>
        grouped.acquire(poll(slot, 1), { recordEmpty: true }),
      ),
    );
    const taskIds = outcomes.map((o) =>
      o.reply.disposition === 'assigned' ? o.reply.assignment.lease.owner.task_id : null,
    );
    expect(new Set(taskIds).size).toBe(12);
    expect(taskIds).not.toContain(null);
    outcomes.forEach((o, slot) => {
      expect(o.reply.sequence).toBe(1);
      if (o.reply.disposition === 'assigned') {
        expect(o.reply.assignment.lease.owner.consumer_id).toBe(slot);
      }
    });
    // The first call runs alone; the others queue behind it and share batches of ≤ 8.
    expect(calls.acquire).toBe(1);
    expect(calls.acquireBatch).toBe(2);
  });

  it('groups concurrent submits of one scope, each answered as alone', async () => {
    const memory = createMemoryTaskStore();
    const scope = freshScope();
    const { store: observed, calls } = counting(memory);
    const grouped = withGroupCommit(observed, { maxBatch: 8, maxInFlight: 1 });
    const outcomes = await Promise.allSettled([
      grouped.submit(submitCommand(scope, { idempotency_key: 'a' })),
      grouped.submit(submitCommand(scope, { idempotency_key: 'b' })),
      grouped.submit(submitCommand(scope, { idempotency_key: 'b' })),
      grouped.submit(submitCommand(scope, { idempotency_key: 'c' })),
    ]);
    const values = outcomes.map((o) => (o.status === 'fulfilled' ? o.value : null));
    expect(values.map((v) => v?.created)).toEqual([true, true, false, true]);
    // The same key in one batch is a replay of the first: the same task.
    expect(values[2]?.snapshot.task_id).toBe(values[1]?.snapshot.task_id);
    expect(calls.submit).toBe(1);
    expect(calls.submitBatch).toBe(1);
  });

  it('answers each item of a batch with its own error', async () => {
    const memory = createMemoryTaskStore();
    const scope = freshScope();
    await memory.submit(submitCommand(scope));
    const grouped = withGroupCommit(memory, { maxInFlight: 1 });
    const { poll } = await sessionWithSlots(memory, scope, 3);
    const [first, gap, second] = await Promise.allSettled([
      grouped.acquire(poll(0, 1), { recordEmpty: true }),
      grouped.acquire(poll(1, 5), { recordEmpty: true }),
      grouped.acquire(poll(2, 1), { recordEmpty: true }),
    ]);
    expect(first.status).toBe('fulfilled');
    expect(second.status).toBe('fulfilled');
    expect(gap).toMatchObject({ status: 'rejected', reason: { code: 'sequence_conflict' } });
  });

  it('retries each item alone when a whole batch fails', async () => {
    const memory = createMemoryTaskStore();
    const scope = freshScope();
    for (let i = 0; i < 3; i++)
      await memory.submit(submitCommand(scope, { idempotency_key: `k${i}` }));
    let failures = 0;
    const flaky = new Proxy(memory as TaskStore, {
      get(target, name, receiver) {
        if (name === 'acquireBatch' && failures === 0) {
          return async () => {
            failures += 1;
            throw new Error('connection reset');
          };
        }
        const value = Reflect.get(target, name, receiver);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const grouped = withGroupCommit(flaky, { maxInFlight: 1 });
    const { poll } = await sessionWithSlots(memory, scope, 3);
    const outcomes = await Promise.all(
      [0, 1, 2].map((slot) => grouped.acquire(poll(slot, 1), { recordEmpty: true })),
    );
    expect(failures).toBe(1);
    expect(outcomes.map((o) => o.reply.disposition)).toEqual(['assigned', 'assigned', 'assigned']);
  });
});

describe('createTaskService long polls', () => {
  const rescanIntervalMs = 10;

  it('parks an empty poll until work arrives, then assigns it', async () => {
    const store = createMemoryTaskStore();
    const service = createTaskService({ store, rescanIntervalMs, longPollMaxMs: 5_000 });
    const scope = freshScope();
    const { poll } = await sessionWithSlots(store, scope, 1);
    const parked = service.acquire(poll(0, 1), { waitMs: 5_000 });
    await new Promise((resolve) => setTimeout(resolve, 30));
    await store.submit(submitCommand(scope));
    const reply = await parked;
    expect(reply.disposition).toBe('assigned');
  });

  it('records the empty answer when the wait ends, so the next sequence follows on', async () => {
    const store = createMemoryTaskStore();
    const service = createTaskService({ store, rescanIntervalMs, longPollMaxMs: 40 });
    const scope = freshScope();
    const { poll } = await sessionWithSlots(store, scope, 1);
    // Asked for far more than the maximum: clamped to 40 ms.
    expect(await service.acquire(poll(0, 1), { waitMs: 60_000 })).toEqual({
      disposition: 'empty',
      sequence: 1,
    });
    await store.submit(submitCommand(scope));
    expect((await service.acquire(poll(0, 2))).disposition).toBe('assigned');
  });

  it('consumes nothing when the caller goes away', async () => {
    const store = createMemoryTaskStore();
    const service = createTaskService({ store, rescanIntervalMs, longPollMaxMs: 5_000 });
    const scope = freshScope();
    const { poll } = await sessionWithSlots(store, scope, 1);
    const disconnect = new AbortController();
    const parked = service.acquire(poll(0, 1), { waitMs: 5_000, signal: disconnect.signal });
    disconnect.abort();
    await parked;
    await store.submit(submitCommand(scope));
    // The same sequence is still a new poll: the slot's sequence was not consumed.
    expect((await service.acquire(poll(0, 1))).disposition).toBe('assigned');
  });

  it('a batch parks until one slot is assigned and records the others as empty', async () => {
    const store = createMemoryTaskStore();
    const service = createTaskService({ store, rescanIntervalMs, longPollMaxMs: 5_000 });
    const scope = freshScope();
    const { poll } = await sessionWithSlots(store, scope, 3);
    const parked = service.acquireBatch([poll(0, 1), poll(1, 1), poll(2, 1)], { waitMs: 5_000 });
    await new Promise((resolve) => setTimeout(resolve, 30));
    await store.submit(submitCommand(scope));
    const replies = await parked;
    const dispositions = replies.map((r) => (r.ok ? r.value.disposition : r.error.code));
    expect(dispositions.filter((d) => d === 'assigned')).toHaveLength(1);
    expect(dispositions.filter((d) => d === 'empty')).toHaveLength(2);
    // The empty slots' sequence 1 was recorded: sequence 2 is their next poll, not a gap.
    for (const slot of [0, 1, 2].filter((i) => dispositions[i] === 'empty')) {
      const next = await store.acquire(poll(slot, 2), { recordEmpty: true });
      expect(next.reply).toEqual({ disposition: 'empty', sequence: 2 });
    }
  });

  it('answers parked polls with a recorded empty when the service is closing', async () => {
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
    closing.abort();
    expect(await parked).toEqual({ disposition: 'empty', sequence: 1 });
    // Recorded: the same sequence now replays the empty answer.
    await store.submit(submitCommand(scope));
    expect((await store.acquire(poll(0, 1), { recordEmpty: true })).reply.disposition).toBe(
      'empty',
    );
  });

  it('refuses new polls once closing, consuming nothing, but still serves settlements', async () => {
    const store = createMemoryTaskStore();
    const closing = new AbortController();
    const service = createTaskService({ store, rescanIntervalMs, closing: closing.signal });
    const scope = freshScope();
    await store.submit(submitCommand(scope));
    const { poll } = await sessionWithSlots(store, scope, 2);
    const claimed = await service.acquire(poll(0, 1));
    if (claimed.disposition !== 'assigned') throw new Error('expected an assignment');
    await store.submit(submitCommand(scope));
    closing.abort();
    await expect(service.acquire(poll(1, 1))).rejects.toMatchObject({
      code: 'unavailable',
      reason: 'shutting_down',
    });
    await expect(service.acquireBatch([poll(1, 1)])).rejects.toMatchObject({ code: 'unavailable' });
    const owner = claimed.assignment.lease.owner;
    await service.renew({ owner, sequence: 1, intent: 'dispatch' });
    const settled = await service.settle(settleSuccess(claimed.assignment, 'done'));
    expect(settled.task_state).toBe('succeeded');
    // The refused poll consumed nothing: on a live store the same sequence is a new poll.
    expect((await store.acquire(poll(1, 1), { recordEmpty: true })).reply.disposition).toBe(
      'assigned',
    );
  });

  it('waits for a result to become terminal', async () => {
    const store = createMemoryTaskStore();
    const service = createTaskService({ store, rescanIntervalMs, longPollMaxMs: 5_000 });
    const scope = freshScope();
    const { snapshot } = await store.submit(submitCommand(scope));
    const waiting = service.result(scope, snapshot.task_id, { waitMs: 5_000 });
    await new Promise((resolve) => setTimeout(resolve, 30));
    await store.cancel(scope, snapshot.task_id);
    expect((await waiting).outcome).toEqual({ state: 'cancelled' });
    expect((await service.result(scope, snapshot.task_id)).status.queue).toBe(TEST_QUEUE);
  });
});
