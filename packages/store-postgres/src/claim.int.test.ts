/**
 * A claim's first select travels with the slot locks and reads (issue #7: a claim in 2 round
 * trips, commit.int.test.ts counts them), before the server has classified the polls. So the
 * select counts the new polls itself, from the locked slots' cursors, and a row it locks for a
 * poll the server then rejects wakes the queue at commit: a concurrent poll that skipped that
 * row while it was locked may have parked.
 */
import type { WakeTopic } from '@ledgence/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { selectClaimable } from './hot-sql.js';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
beforeAll(async () => {
  h = await harness('claim');
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
});
afterAll(async () => {
  await wake.close();
  await h.close();
});

it('the first claim select asks for one task per new poll: none for a replay or a sequence conflict', async () => {
  const queue = 'count';
  for (let i = 0; i < 5; i += 1) await h.store.submit(submitCommand(`count-${i}`, { queue }));
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 3 });
  // Slot 0 has polled once: its cursor holds sequence 1 and task count-0.
  const first = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
    recordEmpty: true,
  });
  expect(first.reply.disposition).toBe('assigned');
  const offered = (polls: { consumer_id: number; sequence: number }[]) =>
    h.sql.begin(async (tx) => {
      const rows = await selectClaimable(
        tx,
        SCOPE,
        queue,
        {
          round: 'first',
          clockOffsetMs: 0,
          polls: polls.map((p) => ({ worker_session_id: session.id, ...p })),
        },
        [],
      );
      return rows.map((row) => row.idempotency_key);
    });
  // A replay of slot 0, slot 1's first poll, and slot 2 jumping to sequence 3: one is new.
  expect(
    await offered([
      { consumer_id: 0, sequence: 1 },
      { consumer_id: 1, sequence: 1 },
      { consumer_id: 2, sequence: 3 },
    ]),
  ).toEqual(['count-1']);
  // Slot 0's next poll is new too: two, in claim order.
  expect(
    await offered([
      { consumer_id: 0, sequence: 2 },
      { consumer_id: 1, sequence: 1 },
      { consumer_id: 2, sequence: 3 },
    ]),
  ).toEqual(['count-1', 'count-2']);
});

it('a poll rejected after the first select (expired session) leaves its task queued and wakes the queue at commit', async () => {
  const queue = 'surplus';
  const topic: WakeTopic = { kind: 'queue', scope: SCOPE, queue };
  // The submit's own hint, delivered before the watch that counts opens.
  const submitted = wake.watch(topic);
  const { snapshot } = await h.store.submit(submitCommand('surplus-0', { queue }));
  await submitted.next(20_000);
  submitted.close();
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  h.advance(CONFIG.sessionValidityMs + 1);

  const watch = wake.watch(topic);
  // The select counts the poll as new (sequence 1, no cursor) and locks the task; the server
  // then finds the session expired.
  await expect(
    h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true }),
  ).rejects.toMatchObject({ code: 'session_expired' });
  const started = performance.now();
  await watch.next(5_000);
  watch.close();
  // Woken by the rejected poll's commit, not by the park's end.
  expect(performance.now() - started).toBeLessThan(5_000);
  const [row] = await h.sql<{ state: string }[]>`
    select state from tasks where task_id = ${snapshot.task_id}`;
  expect(row?.state).toBe('queued');
});
