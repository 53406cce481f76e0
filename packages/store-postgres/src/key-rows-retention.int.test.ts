/**
 * Concurrency-key rows do not outlive their keys' use: retention, collecting a namespace's retired
 * tasks, deletes the rows of their keys that no task holds (`active = 0`), so one key per user or
 * entity does not grow `concurrency_keys` for ever. A queued task of a key whose row is gone is
 * still claimed, by the waiting claim and by the claim that takes a key without waiting (a key
 * sorting below one it holds), which creates the row again — and the key's limit still holds.
 */
import {
  type AcquireReply,
  type Assignment,
  MIN_RETENTION_MS,
  type Scope,
} from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

const HOURS = 3_600_000;
// Each collection moves the clock past the shortest retention (an hour): leases, sessions and
// the tasks' time limits outlast the test's collections, so only retention changes anything.
const LONG = lifecycleConfig({
  leaseDurationMs: 6 * HOURS,
  cleanupGraceMs: 6 * HOURS,
  sessionValidityMs: 6 * HOURS,
});

let h: Harness;
beforeAll(async () => {
  h = await harness('key_rows_retention', LONG);
});
afterAll(() => h.close());

/** A namespace of its own per test: its retention collects only that test's tasks. */
function scopeOf(namespace: string): Scope {
  return { tenant_id: 'acme', namespace };
}

function assignmentOf(reply: AcquireReply): Assignment {
  if (reply.disposition !== 'assigned')
    throw new Error(`expected an assignment, got ${reply.disposition}`);
  return reply.assignment;
}

/** The key rows of `scope`, as `key → active`. */
async function keyRows(scope: Scope): Promise<Record<string, number>> {
  const rows = await h.sql`select concurrency_key, active from concurrency_keys
    where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}
    order by concurrency_key`;
  return Object.fromEntries(rows.map((r) => [String(r.concurrency_key), Number(r.active)]));
}

/** Submits a task of `key` (limit `limit`) on `queue` in `scope`; returns its id. */
async function submitKeyed(
  scope: Scope,
  queue: string,
  name: string,
  key: string,
  extra: Record<string, unknown> = {},
): Promise<string> {
  const outcome = await h.store.submit(
    submitCommand(name, { ...scope, queue, concurrency_key: key, timeout_ms: 6 * HOURS, ...extra }),
  );
  return outcome.snapshot.task_id;
}

/** Polls slot `slot` of `sessionId` with `sequence` (recording an empty). */
async function poll(
  scope: Scope,
  sessionId: string,
  slot: number,
  sequence: number,
  queue: string,
) {
  const command = { ...acquireCommand(sessionId, slot, sequence, queue), scope };
  return (await h.store.acquire(command, { recordEmpty: true })).reply;
}

/** Runs retention in `scope` with the shortest policy, past it: every terminal task is retired. */
async function collect(scope: Scope): Promise<void> {
  await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
  h.advance(MIN_RETENTION_MS + 1_000);
  for (;;) if (!(await h.store.collectRetired(scope)).has_more) return;
}

describe('retention and concurrency-key rows', () => {
  it('deletes the rows of the collected tasks’ keys that no task holds, and keeps a held key’s', async () => {
    const scope = scopeOf('ck-ret-1');
    const queue = 'q';
    await submitKeyed(scope, queue, 'idle-1', 'idle');
    await submitKeyed(scope, queue, 'held-1', 'held', { concurrency_limit: 2 });
    await submitKeyed(scope, queue, 'held-2', 'held', { concurrency_limit: 2 });
    const session = await h.store.openSession({ scope, queue, concurrency: 3 });
    const claimed = [0, 1, 2].map(async (slot) =>
      assignmentOf(await poll(scope, session.id, slot, 1, queue)),
    );
    const [idle, held, stillHeld] = await Promise.all(claimed);
    if (idle === undefined || held === undefined || stillHeld === undefined)
      throw new Error('three claims');
    await h.store.settle(successCommand(idle, 'ck-idle-1'));
    await h.store.settle(successCommand(held, 'ck-held-1'));
    expect(await keyRows(scope)).toEqual({ held: 1, idle: 0 });
    await collect(scope);
    // `idle`'s only task was collected and nothing holds it; `held` still has an active task.
    expect(await keyRows(scope)).toEqual({ held: 1 });
    await h.store.settle(successCommand(stillHeld, 'ck-held-2'));
    await collect(scope);
    expect(await keyRows(scope)).toEqual({});
  });

  it('a queued task of a key whose row was deleted is claimed, and the key’s limit of 1 holds', async () => {
    const scope = scopeOf('ck-ret-2');
    const queue = 'q';
    await submitKeyed(scope, queue, 'first', 'k');
    const session = await h.store.openSession({ scope, queue, concurrency: 2 });
    const first = assignmentOf(await poll(scope, session.id, 0, 1, queue));
    await h.store.settle(successCommand(first, 'ck-first'));
    // Queued before the collection, its key's row already existed: the submit left it alone.
    const second = await submitKeyed(scope, queue, 'second', 'k');
    const third = await submitKeyed(scope, queue, 'third', 'k');
    await collect(scope);
    expect(await keyRows(scope)).toEqual({});
    const claimed = assignmentOf(await poll(scope, session.id, 0, 2, queue));
    expect(claimed.lease.owner.task_id).toBe(second);
    expect(await keyRows(scope)).toEqual({ k: 1 });
    // The recreated row counts the claim: the next task of the key waits.
    expect((await poll(scope, session.id, 1, 1, queue)).disposition).toBe('empty');
    await h.store.settle(successCommand(claimed, 'ck-second'));
    expect(assignmentOf(await poll(scope, session.id, 1, 2, queue)).lease.owner.task_id).toBe(
      third,
    );
  });

  it('a key sorting below one the claim holds, its row deleted, is taken without waiting and its row created', async () => {
    const scope = scopeOf('ck-ret-3');
    const queue = 'q';
    // As in claim-eligible.int: the batch's first round takes b1 and is refused b2 (kb's only
    // slot is its own); its second round takes a1, whose key sorts below kb, without waiting.
    const b1 = await submitKeyed(scope, queue, 'b1', 'kb', { priority: 10 });
    await submitKeyed(scope, queue, 'b2', 'kb', { priority: 9 });
    const a1 = await submitKeyed(scope, queue, 'a1', 'ka', { priority: 0 });
    // As retention leaves it when ka's earlier tasks were collected while a1 waited.
    await h.sql`delete from concurrency_keys
      where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}
        and concurrency_key = 'ka'`;
    const session = await h.store.openSession({ scope, queue, concurrency: 2 });
    const replies = await h.store.acquireBatch(
      [0, 1].map((slot) => ({ ...acquireCommand(session.id, slot, 1, queue), scope })),
      { recordEmpty: true },
    );
    const got = replies.map((r) => {
      if (!r.ok) throw r.error;
      return assignmentOf(r.value.reply).lease.owner.task_id;
    });
    expect(got).toEqual([b1, a1]);
    expect(await keyRows(scope)).toEqual({ ka: 1, kb: 1 });
  });
});
