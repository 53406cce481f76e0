/**
 * Group commit answers each item as it would have been answered alone (DESIGN §7.1), on real
 * PostgreSQL: a batch whose COMMIT may have been applied but whose reply was lost answers every
 * item `unavailable` — as alone — and each item's retry converges on what was committed, exactly
 * once; coalesced single polls never lose a task to their neighbours' reply bytes.
 */
import type { Assignment } from '@ledgence/contracts';
import { createFailpoints, parseFailpoints, withGroupCommit } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore, type PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  claimedTask,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import { startPgProxy } from './testing/pg-proxy.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('group_commit');
});
afterAll(() => h.close());

let n = 0;
async function claim(): Promise<Assignment> {
  n += 1;
  const assignment = await claimedTask(h, `rg-${n}`);
  await h.store.renew(renewCommand(assignment.lease.owner, 1, 'dispatch'));
  return assignment;
}

function storeWith(spec: string): PostgresTaskStore {
  return createPostgresTaskStore({
    url: h.db.url,
    max: 2,
    config: CONFIG,
    failpoints: createFailpoints(parseFailpoints(spec)),
  });
}

/** The code of each failed item, or `ok`. */
const codes = (results: readonly { ok: boolean; error?: { code: string } }[]) =>
  results.map((r) => (r.ok ? 'ok' : (r.error?.code ?? '?')));

describe('a batch whose COMMIT was applied but whose reply was lost', () => {
  it('settle (after_commit failpoint): every item unavailable, as alone; retries replay, once each', async () => {
    const a = await claim();
    const b = await claim();
    const alone = await claim();
    const lone = storeWith('settle.after_commit=error*1');
    try {
      expect(await outcomeCode(lone.settle(successCommand(alone, 'alone')))).toBe('unavailable');
    } finally {
      await lone.close();
    }
    const store = storeWith('settle.after_commit=error*1');
    try {
      const results = await store.settleBatch([
        successCommand(a, 'op-a'),
        successCommand(b, 'op-b'),
      ]);
      expect(codes(results)).toEqual(['unavailable', 'unavailable']);
      for (const [t, op] of [
        [a, 'op-a'],
        [b, 'op-b'],
      ] as const) {
        const retried = await store.settle(successCommand(t, op));
        expect(retried.already_accepted).toBe(true);
        const events = await h.store.history(SCOPE, t.lease.owner.task_id, 0);
        expect(events.filter((e) => e.event.reason === 'report_accepted')).toHaveLength(1);
      }
    } finally {
      await store.close();
    }
  });

  it('settle (the connection lost after COMMIT): every item unavailable, committed once', async () => {
    const a = await claim();
    const b = await claim();
    const proxy = await startPgProxy(h.db.url);
    const store = createPostgresTaskStore({ url: proxy.url, max: 2, config: CONFIG });
    try {
      await store.now(); // warm a connection (its COMMIT passes: not armed yet)
      proxy.loseReplyCarrying('COMMIT');
      const results = await store.settleBatch([
        successCommand(a, 'op-a'),
        successCommand(b, 'op-b'),
      ]);
      expect(proxy.lostReplies()).toBe(1);
      expect(codes(results)).toEqual(['unavailable', 'unavailable']);
      for (const t of [a, b]) {
        const events = await h.store.history(SCOPE, t.lease.owner.task_id, 0);
        expect(events.filter((e) => e.event.reason === 'report_accepted')).toHaveLength(1);
      }
    } finally {
      await store.close();
      await proxy.close();
    }
  });

  it('submit (the connection lost after COMMIT): every item unavailable; the retry finds each task once', async () => {
    const proxy = await startPgProxy(h.db.url);
    const store = createPostgresTaskStore({ url: proxy.url, max: 2, config: CONFIG });
    try {
      await store.now();
      proxy.loseReplyCarrying('COMMIT');
      // A concurrency key keeps the submit an explicit transaction with a COMMIT.
      const commands = [
        submitCommand('lost-s1', { queue: 'lost-s', concurrency_key: 'k1', concurrency_limit: 1 }),
        submitCommand('lost-s2', { queue: 'lost-s', concurrency_key: 'k2', concurrency_limit: 1 }),
      ];
      const results = await store.submitBatch(commands);
      expect(proxy.lostReplies()).toBe(1);
      expect(codes(results)).toEqual(['unavailable', 'unavailable']);
      const retried = await store.submitBatch(commands);
      expect(retried.map((r) => (r.ok ? r.value.created : r.error.code))).toEqual([false, false]);
      const [row] = await h.sql`
        select count(*)::int as n from tasks where idempotency_key in ('lost-s1', 'lost-s2')`;
      expect(row?.n).toBe(2);
    } finally {
      await store.close();
      await proxy.close();
    }
  });

  it('acquire (after_commit failpoint): every poll unavailable; its retry replays the committed claim', async () => {
    const queue = 'lost-acq';
    await h.store.submit(submitCommand('la-1', { queue }));
    await h.store.submit(submitCommand('la-2', { queue }));
    const s1 = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const s2 = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const store = storeWith('acquire.after_commit=error*1');
    try {
      const polls = [acquireCommand(s1.id, 0, 1, queue), acquireCommand(s2.id, 0, 1, queue)];
      const results = await store.acquireBatch(polls, { recordEmpty: true });
      expect(codes(results)).toEqual(['unavailable', 'unavailable']);
      const retried = await store.acquireBatch(polls, { recordEmpty: true });
      const assigned = retried.map((r) =>
        r.ok && r.value.reply.disposition === 'assigned' ? r.value.reply.assignment : null,
      );
      expect(assigned.every((x) => x !== null)).toBe(true);
      const rows = await h.sql`
        select task_id, attempt_id from attempts
        where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
          and task_id in ${h.sql(assigned.map((x) => x?.lease.owner.task_id ?? ''))}`;
      // One attempt per task: the committed claims, replayed, not claimed again.
      expect(rows).toHaveLength(2);
      expect(new Set(rows.map((r) => r.attempt_id))).toEqual(
        new Set(assigned.map((x) => x?.lease.owner.attempt_id)),
      );
    } finally {
      await store.close();
    }
  });
});

describe('coalesced single acquisitions (withGroupCommit)', () => {
  it('a single poll that alone would be assigned must not be answered empty (recorded) because coalesced neighbours filled the batch reply budget', async () => {
    const queue = 'budget';
    const polls = 20;
    const big = 'x'.repeat(1_000_000); // under SUBMISSION_DATA_MAX_BYTES (1 MiB)
    for (let i = 0; i < polls; i += 1) {
      await h.store.submit(submitCommand(`big-${i}`, { queue, data: { big, i } }));
    }
    const sessions = [];
    for (let i = 0; i < polls; i += 1) {
      sessions.push(await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 }));
    }
    const grouped = withGroupCommit(h.makeStore(4), { maxInFlight: 1 });
    // The first poll runs alone; the other 19, issued while it runs, are coalesced into one batch.
    const replies = await Promise.all(
      sessions.map((s) =>
        grouped.acquire(acquireCommand(s.id, 0, 1, queue), { recordEmpty: true }),
      ),
    );
    const dispositions = replies.map((r) => r.reply.disposition);
    const left = await h.sql`
      select count(*)::int as n from tasks
      where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and queue = ${queue} and state = 'queued'`;
    // Every poll alone would have been assigned (20 polls, 20 queued tasks, one per poll).
    expect({ dispositions, queuedLeft: left[0]?.n }).toEqual({
      dispositions: Array(polls).fill('assigned'),
      queuedLeft: 0,
    });
  }, 60_000);
});
