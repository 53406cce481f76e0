/**
 * An acquire batch's reply is bounded (ACQUIRE_BATCH_REPLY_MAX_BYTES): the claim stops before its
 * assignments would pass the bound, answers the slots left `empty` and leaves their tasks queued,
 * so a reply is never too large to encode after its claims were written.
 */
import {
  ACQUIRE_BATCH_REPLY_MAX_BYTES,
  type AcquireReply,
  SUBMISSION_DATA_MAX_BYTES,
} from '@ledgence/contracts';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('acquire_reply');
});
afterAll(() => h.close());

it('stops claiming before the replies pass the bound, and leaves the rest queued for later polls', async () => {
  const queue = 'large';
  // Tasks of the largest data a submit takes: a little more than a mebibyte each as assignments.
  const data = 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2);
  const tasks = Math.ceil(ACQUIRE_BATCH_REPLY_MAX_BYTES / SUBMISSION_DATA_MAX_BYTES) + 4;
  for (let i = 0; i < tasks; i += 1) {
    await h.store.submit(submitCommand(`large-${i}`, { queue, data }));
  }
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: tasks });
  const poll = (sequence: number) =>
    h.store.acquireBatch(
      Array.from({ length: tasks }, (_, slot) => acquireCommand(session.id, slot, sequence, queue)),
      { recordEmpty: true },
    );
  const replies = (await poll(1)).map((r) => {
    if (!r.ok) throw r.error;
    return r.value.reply;
  });
  const assigned = replies.filter((r) => r.disposition === 'assigned');
  const bytes = Buffer.byteLength(JSON.stringify(assigned));
  expect(bytes).toBeLessThanOrEqual(ACQUIRE_BATCH_REPLY_MAX_BYTES);
  // As many as fit: one more would have passed the bound.
  const one = Buffer.byteLength(JSON.stringify(assigned[0] as AcquireReply));
  expect(bytes + one).toBeGreaterThan(ACQUIRE_BATCH_REPLY_MAX_BYTES);
  expect(assigned.length).toBeLessThan(tasks);
  const [queued] = await h.sql`
    select count(*)::int as n from tasks where queue = ${queue} and state = 'queued'`;
  expect(queued?.n).toBe(tasks - assigned.length);
  // The slots answered empty poll again and get the tasks left.
  const emptySlots = replies.flatMap((r, slot) => (r.disposition === 'empty' ? [slot] : []));
  const again = await h.store.acquireBatch(
    emptySlots.map((slot) => acquireCommand(session.id, slot, 2, queue)),
    { recordEmpty: true },
  );
  expect(again.filter((r) => r.ok && r.value.reply.disposition === 'assigned')).toHaveLength(
    tasks - assigned.length,
  );
});
