/**
 * Submit idempotency where the wire or retention interferes: a submit sent as ONE statement (no
 * BEGIN/COMMIT: no concurrency key, no available_at, no failpoints) whose reply is lost after
 * PostgreSQL committed it, and replays of a key whose task retention collects.
 */
import { withGroupCommit } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore } from './store.js';
import { CONFIG, type Harness, harness, SCOPE, submitCommand } from './testdata/fixtures.js';
import { startPgProxy } from './testing/pg-proxy.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('submit_replay');
});
afterAll(() => h.close());

describe('a one-statement submit whose reply was lost after PostgreSQL committed it', () => {
  it('coalesced single submits whose one-statement insert committed but whose reply was lost are each answered unavailable, as alone, never as a replay of themselves (created: false)', async () => {
    const proxy = await startPgProxy(h.db.url);
    const store = createPostgresTaskStore({ url: proxy.url, max: 2, config: CONFIG });
    const grouped = withGroupCommit(store, { maxInFlight: 1 });
    try {
      await store.now();
      // Occupy the one in-flight slot so the next two singles are grouped into one batch.
      const blocker = grouped.submit(submitCommand('gc-blocker', { queue: 'gc' }));
      const first = grouped.submit(submitCommand('gc-1', { queue: 'gc' }));
      const second = grouped.submit(submitCommand('gc-2', { queue: 'gc' }));
      proxy.loseReplyCarrying('SELECT 2');
      await blocker.catch(() => undefined);
      const outcomes = await Promise.all(
        [first, second].map((p) =>
          p.then(
            (o) => `created:${o.created}`,
            (e: { code?: string }) => e.code ?? '?',
          ),
        ),
      );
      expect(proxy.lostReplies()).toBe(1);
      // The lost statement committed both tasks, once each.
      const [row] = await h.sql`
        select count(*)::int as n from tasks where idempotency_key in ('gc-1', 'gc-2')`;
      expect(row?.n).toBe(2);
      // Alone, each would be `unavailable` (its outcome unknown); so is each item of the batch,
      // never retried on another connection and answered as a replay of itself.
      expect(outcomes).toEqual(['unavailable', 'unavailable']);
    } finally {
      await store.close();
      await proxy.close();
    }
  });
});

describe('replay after retention collected the task', () => {
  it('the key is free again: a replay creates a new task (documents the behaviour)', async () => {
    const command = submitCommand('retired-key', { queue: 'retired' });
    const first = await h.store.submit(command);
    await h.store.cancel(SCOPE, first.snapshot.task_id);
    h.advance(CONFIG.terminalRetentionMs + 60_000);
    let removed = 0;
    for (;;) {
      const progress = await h.store.collectRetired(SCOPE);
      removed += progress.tasks_removed;
      if (!progress.has_more) break;
    }
    expect(removed).toBeGreaterThanOrEqual(1);
    const again = await h.store.submit(command);
    expect(again.created).toBe(true);
    expect(again.snapshot.task_id).not.toBe(first.snapshot.task_id);
  });
});

describe('a replay racing retention of its task', () => {
  it('a task collected between the replay’s key lookup and its payload read is submitted anew (as when collected before the lookup), not 503', async () => {
    const command = submitCommand('race-retired-key', { queue: 'race-retired' });
    const first = await h.store.submit(command);
    await h.store.cancel(SCOPE, first.snapshot.task_id);
    h.advance(CONFIG.terminalRetentionMs + 60_000);
    const proxy = await startPgProxy(h.db.url);
    const store = createPostgresTaskStore({ url: proxy.url, max: 2, config: CONFIG });
    try {
      await store.now();
      const held = proxy.holdRequestCarrying('from task_payloads p');
      const replay = store.submit(command).then(
        (o) => ({ created: o.created, task_id: o.snapshot.task_id }),
        (e: { code?: string; message?: string }) => ({ error: e.code, message: e.message }),
      );
      // The insert skipped the key and the lookup found the task; its payload read is held.
      const release = await held;
      let removed = 0;
      for (;;) {
        const progress = await h.store.collectRetired(SCOPE);
        removed += progress.tasks_removed;
        if (!progress.has_more) break;
      }
      expect(removed).toBeGreaterThanOrEqual(1);
      release();
      const outcome = await replay;
      expect(outcome).toMatchObject({ created: true });
    } finally {
      await store.close();
      await proxy.close();
    }
  });
});
