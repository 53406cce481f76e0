/**
 * Claim rounds and concurrency keys without any contention. DESIGN §5 Acquire: a new poll picks
 * "the best eligible task (… concurrency key under its limit …)"; DESIGN §7.1: grouped polls are
 * each answered "exactly [as] the reply it would have got alone". A claim's select round over a
 * backlog grouped by key (the usual bulk submit per customer) meets mostly one key: it wins one
 * task and is refused the rest by its own transaction's slot. Until 2026-12-05 the claim gave up
 * after three rounds, so a batch of N polls got three tasks and N−3 `empty` replies while
 * eligible tasks of other keys waited behind (a long-poll batch hid it: the service records its
 * empties with a second claim; a poll with `wait_ms=0`, or single polls grouped, did not).
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
  h = await harness('claim_rounds');
});
afterAll(() => h.close());

function taskOf(reply: AcquireReply): string {
  return reply.disposition === 'assigned'
    ? reply.assignment.lease.owner.task_id
    : reply.disposition;
}

/**
 * A backlog grouped by key: `perKey` tasks of each key (limit 1), keys in claim order (priority
 * falling by key, FIFO within), then one unkeyed task last. Returns the first task id of each
 * key and the unkeyed task's id.
 */
async function groupedBacklog(queue: string, keys: string[], perKey: number) {
  const heads: string[] = [];
  for (const [k, key] of keys.entries()) {
    for (let i = 0; i < perKey; i += 1) {
      const { snapshot } = await h.store.submit(
        submitCommand(`${queue}-${key}-${i}`, {
          queue,
          priority: 50 - k,
          concurrency_key: `${queue}-${key}`,
        }),
      );
      if (i === 0) heads.push(snapshot.task_id);
    }
  }
  const { snapshot } = await h.store.submit(
    submitCommand(`${queue}-plain`, { queue, priority: -50 }),
  );
  return { heads, plain: snapshot.task_id };
}

/** The active count of each of the queue's key rows. */
async function activeKeys(queue: string) {
  const rows = await h.sql`select concurrency_key, active from concurrency_keys
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
      and concurrency_key like ${`${queue}-%`} order by 1`;
  return rows.map((r) => [r.concurrency_key as string, Number(r.active)]);
}

describe('a poll batch over a backlog grouped by concurrency key, nothing else claiming', () => {
  it('answers each of its polls with an eligible task of another key while there is one, not empty (acquire batch, wait 0)', async () => {
    const queue = 'r40g-grouped-batch';
    // Keys sort in claim order (a < b < c < d), so every key row is taken upward (no NoWait path).
    const { heads, plain } = await groupedBacklog(queue, ['a', 'b', 'c', 'd'], 5);
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 5 });
    const replies = await h.store.acquireBatch(
      [0, 1, 2, 3, 4].map((c) => acquireCommand(session.id, c, 1, queue)),
      { recordEmpty: true },
    );
    const got = replies.map((r) => {
      if (!r.ok) throw r.error;
      return taskOf(r.value.reply);
    });
    // Alone, five polls one after another take a0, b0, c0, d0 and the unkeyed task: each key
    // holds one slot, nobody else claims (it was [a0, b0, c0, 'empty', 'empty']).
    expect(got).toEqual([...heads, plain]);
    expect(await activeKeys(queue)).toEqual(['a', 'b', 'c', 'd'].map((k) => [`${queue}-${k}`, 1]));
  });

  it('the same polls one at a time each get a task: the batch is not answered as its polls alone', async () => {
    const queue = 'r40g-grouped-single';
    const { heads, plain } = await groupedBacklog(queue, ['a', 'b', 'c', 'd'], 5);
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 5 });
    const got: string[] = [];
    for (const c of [0, 1, 2, 3, 4]) {
      const { reply } = await h.store.acquire(acquireCommand(session.id, c, 1, queue), {
        recordEmpty: true,
      });
      got.push(taskOf(reply));
    }
    // The reference the batch above and the grouped polls below are held to.
    expect(got).toEqual([...heads, plain]);
  });

  it('five single polls coalesced by group commit are each answered as alone (DESIGN §7.1)', async () => {
    const queue = 'r40g-grouped-gc';
    const { heads, plain } = await groupedBacklog(queue, ['a', 'b', 'c', 'd'], 5);
    const sessions = [];
    for (let i = 0; i < 6; i += 1) {
      sessions.push(await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 }));
    }
    const grouped = withGroupCommit(h.makeStore(2), { maxInFlight: 1 });
    // As claim-eligible.int.test.ts does: a poll with a sequence gap, held on the sessions table,
    // keeps the queue's only batch in flight while the five real polls arrive, so they go as one.
    const holder = await h.sql.reserve();
    await holder`begin`;
    await holder`lock table worker_sessions in access exclusive mode`;
    const gap = outcomeCode(
      grouped.acquire(acquireCommand(sessions[5]?.id as string, 0, 9, queue), {
        recordEmpty: true,
      }),
    );
    await h.untilLockWaits(1);
    const polls = sessions
      .slice(0, 5)
      .map((s) => grouped.acquire(acquireCommand(s.id, 0, 1, queue), { recordEmpty: true }));
    await holder`commit`;
    holder.release();
    expect(await gap).toBe('sequence_conflict');
    const got = (await Promise.all(polls)).map((o) => taskOf(o.reply));
    // Alone, each of them would have got a task (test above); two of them were `empty`.
    expect(got.filter((t) => t === 'empty')).toEqual([]);
    expect(new Set(got)).toEqual(new Set([...heads, plain]));
  });

  it('serves a batch of 32 polls from 40 keys of 5 tasks each, within the rows a claim may examine', async () => {
    const queue = 'r40g-grouped-wide';
    const keys = Array.from({ length: 40 }, (_, k) => `k${String(k).padStart(2, '0')}`);
    const { heads } = await groupedBacklog(queue, keys, 5);
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 32 });
    const replies = await h.store.acquireBatch(
      Array.from({ length: 32 }, (_, c) => acquireCommand(session.id, c, 1, queue)),
      { recordEmpty: true },
    );
    const got = replies.map((r) => {
      if (!r.ok) throw r.error;
      return taskOf(r.value.reply);
    });
    // Each round of `need` rows wins one task per five: 32 wins examine ~160 rows, inside the
    // bound of 8 per poll (256). The first 32 keys' heads, in claim order.
    expect(got).toEqual(heads.slice(0, 32));
  });
});
