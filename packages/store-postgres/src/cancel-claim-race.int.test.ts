/**
 * Cancel racing claims, renewals and settlements on many connections at once (DESIGN §5 Cancel):
 * whatever the interleaving, a task cancelled while queued is never claimed afterwards, a task
 * claimed before its cancel ends cancelled when its worker settles, and each task records
 * exactly one terminal event.
 */
import type { TaskState } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
beforeAll(async () => {
  h = await harness('cancelclaim');
});
afterAll(async () => {
  await h.close();
});

describe('cancel racing claims', () => {
  it('no task is claimed after its cancel, and every task ends cancelled once', async () => {
    const queue = 'ccr';
    const count = 60;
    const ids: string[] = [];
    for (let i = 0; i < count; i += 1) {
      const { snapshot } = await h.store.submit(submitCommand(`ccr-${i}`, { queue }));
      ids.push(snapshot.task_id);
    }
    const canceller = h.makeStore(4);
    let claims = 0;
    const cancelReplies = new Map<string, TaskState>();
    const poll = async (store: PostgresTaskStore, slots: number) => {
      const session = await store.openSession({ scope: SCOPE, queue, concurrency: slots });
      const sequences = new Array<number>(slots).fill(0);
      for (let round = 0; round < 20; round += 1) {
        await Promise.all(
          sequences.map(async (_, slot) => {
            sequences[slot] = (sequences[slot] ?? 0) + 1;
            const { reply } = await store.acquire(
              acquireCommand(session.id, slot, sequences[slot] as number, queue),
              { recordEmpty: true },
            );
            if (reply.disposition !== 'assigned') return;
            claims += 1;
            const owner = reply.assignment.lease.owner;
            await store.renew(renewCommand(owner, 1, 'dispatch'));
            await store.settle(successCommand(reply.assignment, `op-${owner.attempt_id}`));
          }),
        );
      }
    };
    await Promise.all([
      poll(h.makeStore(4), 4),
      poll(h.makeStore(4), 4),
      (async () => {
        for (const id of ids) cancelReplies.set(id, await canceller.cancel(SCOPE, id));
      })(),
      (async () => {
        for (const id of [...ids].reverse()) await canceller.cancel(SCOPE, id);
      })(),
    ]);
    // The two sides did meet: some tasks were claimed, some cancelled while queued.
    expect(claims).toBeGreaterThan(0);
    expect([...cancelReplies.values()]).toContain('cancelled');
    for (const id of ids) {
      const events = await h.store.history(SCOPE, id, 0);
      const reasons = events.map((e) => e.event.reason);
      const terminal = reasons.filter((r) => ['succeeded', 'failed', 'cancelled'].includes(r));
      expect(terminal.length, `${id}: ${reasons.join(',')}`).toBe(1);
      const cancelledAt = reasons.indexOf('cancelled');
      const requestedAt = reasons.indexOf('cancel_requested');
      // Nothing is claimed after the task was cancelled or its cancel requested.
      const firstCancel = requestedAt === -1 ? cancelledAt : requestedAt;
      if (firstCancel !== -1) {
        expect(reasons.slice(firstCancel).includes('claimed'), `${id}: ${reasons.join(',')}`).toBe(
          false,
        );
      }
      // Every task was cancelled, and every claimed one settled: none is left open.
      const status = await h.store.status(SCOPE, id);
      if (status.state === 'succeeded') {
        // Settled before the cancel came: the cancel answered the terminal state.
        expect(requestedAt).toBe(-1);
        expect(cancelReplies.get(id)).toBe('succeeded');
      } else {
        expect(status.state).toBe('cancelled');
      }
    }
  });
});
