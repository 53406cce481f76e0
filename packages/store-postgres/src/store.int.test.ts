import type { Assignment } from '@ledgence/contracts';
import { commandDigest } from '@ledgence/core';
import { withKeysReversed } from '@ledgence/core/testing';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore, SUBMIT_CHUNK } from './store.js';
import {
  acquireCommand,
  CONFIG,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('store');
});
afterAll(() => h.close());

/**
 * A store on a connection of its own that runs `before` ahead of the first lookup of
 * submitted keys (the statement of `loadTasksByIdempotencyKey`), to step between a submit's
 * insert and that lookup. The lookup runs on a reserved connection after a transaction's
 * COMMIT, or on the pool after a submit that was one statement: both are intercepted.
 */
function storeBeforeFirstLookup(before: () => Promise<void>) {
  let fired = false;
  const client = postgres(h.db.url, { max: 1, onnotice: () => {} });
  const lookupTrap: ProxyHandler<postgres.Sql> = {
    apply(query, self, args) {
      const text = Array.isArray(args[0]) ? args[0].join('$') : '';
      if (fired || !text.includes('t.idempotency_key = k.key')) {
        return Reflect.apply(query, self, args);
      }
      fired = true;
      return before().then(() => Reflect.apply(query, self, args));
    },
  };
  const intercepting = new Proxy(client, {
    ...lookupTrap,
    get(target, property, receiver) {
      if (property !== 'reserve') return Reflect.get(target, property, receiver);
      return async () => new Proxy(await target.reserve(), lookupTrap);
    },
  });
  return {
    store: createPostgresTaskStore({ sql: intercepting, config: CONFIG }),
    close: () => client.end(),
  };
}

async function session(queue = 'q', concurrency = 2) {
  return h.store.openSession({ scope: SCOPE, queue, concurrency });
}

async function claim(
  queue: string,
  sessionId: string,
  consumer: number,
  seq: number,
): Promise<Assignment> {
  const { reply } = await h.store.acquire(acquireCommand(sessionId, consumer, seq, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned')
    throw new Error(`expected assigned, got ${reply.disposition}`);
  return reply.assignment;
}

describe('submit', () => {
  it('inserts once, replays the same command, rejects a different one', async () => {
    const first = await h.store.submit(
      submitCommand('s1', { queue: 'sub', data: { a: [1, 'x\u0000y'] } }),
    );
    expect(first.created).toBe(true);
    expect(first.snapshot.state).toBe('queued');
    expect(first.snapshot.input.data).toEqual({ a: [1, 'x\u0000y'] });
    const again = await h.store.submit(
      submitCommand('s1', { queue: 'sub', data: { a: [1, 'x\u0000y'] } }),
    );
    expect(again.created).toBe(false);
    expect(again.snapshot).toEqual(first.snapshot);
    expect(await outcomeCode(h.store.submit(submitCommand('s1', { queue: 'sub', data: 2 })))).toBe(
      'conflict',
    );
    const history = await h.store.history(SCOPE, first.snapshot.task_id, 0);
    expect(history.map((e) => e.event.reason)).toEqual(['submitted']);
  });

  it('records no digest of a submit; a task recorded with one by an earlier version compares by it', async () => {
    const command = submitCommand('digest', { queue: 'digest' });
    const { snapshot } = await h.store.submit(command);
    const digestOf = async () =>
      (
        await h.sql<{ command_digest: string | null }[]>`
          select command_digest from tasks where task_id = ${snapshot.task_id}`
      )[0]?.command_digest;
    expect(await digestOf()).toBeNull();
    // As an earlier version recorded it: the digest of the command decides a replay.
    await h.sql`update tasks set command_digest = ${commandDigest(command)}
      where task_id = ${snapshot.task_id}`;
    expect((await h.store.submit(command)).created).toBe(false);
    // Another command's digest: the same command is now a conflict, though the row's input is
    // the command's own — the digest, not the rebuilt command, was compared.
    await h.sql`update tasks set command_digest = ${commandDigest(submitCommand('other'))}
      where task_id = ${snapshot.task_id}`;
    expect(await outcomeCode(h.store.submit(command))).toBe('conflict');
    expect((await h.store.submitBatch([command]))[0]).toMatchObject({
      ok: false,
      error: { code: 'conflict' },
    });
  });

  it('stamps new tasks with the store time their insert read: alone, batched, in chunks', async () => {
    // A store whose clock runs a day ahead: the insert adds the offset to the time it reads.
    const DAY = 86_400_000;
    const ahead = createPostgresTaskStore({
      url: h.db.url,
      config: CONFIG,
      clockOffsetMs: () => DAY,
    });
    try {
      const before = await ahead.now();
      // One statement each (a lone submit; a small batch with a replay inside it), then a
      // transaction of two chunks.
      const lone = await ahead.submit(submitCommand('at-lone', { queue: 'at', delay_ms: 5_000 }));
      const small = await ahead.submitBatch([
        submitCommand('at-small', { queue: 'at' }),
        submitCommand('at-small', { queue: 'at' }),
      ]);
      const chunked = await ahead.submitBatch(
        Array.from({ length: SUBMIT_CHUNK + 2 }, (_, i) =>
          submitCommand(`at-chunk-${i}`, { queue: 'at', delay_ms: i }),
        ),
      );
      const after = await ahead.now();
      const snapshots = [
        lone.snapshot,
        ...[...small, ...chunked].map((r) => (r.ok ? r.value.snapshot : null)),
      ];
      expect(before - Date.now()).toBeGreaterThan(DAY - 60_000);
      for (const snapshot of snapshots) {
        expect(snapshot?.submitted_at).toBeGreaterThanOrEqual(before);
        expect(snapshot?.submitted_at).toBeLessThanOrEqual(after);
      }
      expect(lone.snapshot.available_at).toBe(lone.snapshot.submitted_at + 5_000);
      expect(await ahead.inspect(SCOPE, lone.snapshot.task_id)).toEqual(lone.snapshot);
      // The replay inside the batch answers the task the batch created, at the same times.
      expect(small.map((r) => r.ok && r.value.created)).toEqual([true, false]);
      expect(small[1]?.ok && small[1].value.snapshot).toEqual(
        small[0]?.ok && small[0].value.snapshot,
      );
      // One transaction: every chunk's tasks share its store time.
      const chunkTimes = new Set(chunked.map((r) => r.ok && r.value.snapshot.submitted_at));
      expect(chunkTimes.size).toBe(1);
      const last = chunked.at(-1);
      expect(last?.ok && last.value.snapshot.available_at - last.value.snapshot.submitted_at).toBe(
        SUBMIT_CHUNK + 1,
      );
      if (last?.ok)
        expect(await ahead.inspect(SCOPE, last.value.snapshot.task_id)).toEqual(
          last.value.snapshot,
        );
      // Stored rows and their `submitted` history entries hold what was answered.
      const rows = await h.sql<
        { task_id: string; submitted_at: string; available_at: string; at: string }[]
      >`
        select t.task_id, t.submitted_at, t.available_at, h.at from tasks t
        join task_history h using (tenant_id, namespace, task_id)
        where t.queue = 'at' and h.reason = 'submitted'`;
      const answered = new Map(snapshots.map((snapshot) => [snapshot?.task_id, snapshot]));
      expect(rows).toHaveLength(answered.size);
      for (const row of rows) {
        const snapshot = answered.get(row.task_id);
        expect([Number(row.submitted_at), Number(row.available_at), Number(row.at)]).toEqual([
          snapshot?.submitted_at,
          snapshot?.available_at,
          snapshot?.submitted_at,
        ]);
      }
    } finally {
      await ahead.close();
    }
  });

  it('concurrent submits of one key create one task', async () => {
    const results = await Promise.all(
      Array.from({ length: 6 }, () => h.store.submit(submitCommand('race', { queue: 'sub' }))),
    );
    expect(results.filter((r) => r.created)).toHaveLength(1);
    expect(new Set(results.map((r) => r.snapshot.task_id)).size).toBe(1);
  });

  it('submitBatch answers each item alone', async () => {
    const results = await h.store.submitBatch([
      submitCommand('b1', { queue: 'sub' }),
      submitCommand('s1', { queue: 'sub', data: 'different' }),
      submitCommand('b1', { queue: 'sub' }),
    ]);
    expect(results[0]?.ok && results[0].value.created).toBe(true);
    expect(results[1]?.ok === false && results[1].error.code).toBe('conflict');
    expect(results[2]?.ok && results[2].value.created).toBe(false);
  });

  it('answers keys a stored task holds from that task, whatever their place in a batch', async () => {
    // Insert first: these keys are skipped by the insert and answered after it (DESIGN §5).
    const stored = await h.store.submit(submitCommand('held', { queue: 'sub', data: 1 }));
    const farFuture = Number.MAX_SAFE_INTEGER;
    const results = await h.store.submitBatch([
      submitCommand('held', { queue: 'sub', data: 2 }), // conflict with the stored task
      submitCommand('fresh', { queue: 'sub' }),
      submitCommand('held', { queue: 'sub', data: 1 }), // replay, after a conflicting item
      submitCommand('held', { queue: 'sub', data: 1, available_at: farFuture }), // conflict
      submitCommand('nowhere', { queue: 'sub', available_at: farFuture }), // invalid, no task
      submitCommand('fresh', { queue: 'sub' }), // replay of an item of this batch
    ]);
    expect(results.map((r) => (r.ok ? r.value.created : r.error.code))).toEqual([
      'conflict',
      true,
      false,
      'conflict',
      'invalid_input',
      false,
    ]);
    expect(results[2]?.ok && results[2].value.snapshot).toEqual(stored.snapshot);
    const fresh = results[1]?.ok ? results[1].value.snapshot : undefined;
    expect(results[5]?.ok && results[5].value.snapshot.task_id).toBe(fresh?.task_id);
    // The skipped rows left nothing behind: one history record each (the replay above returned
    // the stored data unchanged).
    const history = await h.store.history(SCOPE, stored.snapshot.task_id, 0);
    expect(history.map((e) => e.event.reason)).toEqual(['submitted']);
    const freshHistory = await h.store.history(SCOPE, fresh?.task_id ?? '', 0);
    expect(freshHistory.map((e) => e.event.reason)).toEqual(['submitted']);
  });

  it('submits again a key whose task is deleted between the insert and its lookup; the rest keep their answers', async () => {
    // The lookup of a skipped key runs after the COMMIT (store.ts `submitTx`); here the held
    // task is deleted right before it, as retention could.
    const held = await h.store.submit(submitCommand('released', { queue: 'sub' }));
    const deletes: string[] = [];
    const racing = storeBeforeFirstLookup(async () => {
      const rows = await h.sql`
        delete from tasks where idempotency_key = 'released' returning task_id`;
      deletes.push(...rows.map((row) => String(row.task_id)));
    });
    try {
      const results = await racing.store.submitBatch([
        submitCommand('before-released', { queue: 'sub' }),
        submitCommand('released', { queue: 'sub' }),
        submitCommand('after-released', { queue: 'sub' }),
      ]);
      expect(deletes).toEqual([held.snapshot.task_id]);
      // All three created: the first and last by the batch's committed insert (not replays of
      // it), the released key by a submit of its own.
      expect(results.map((r) => r.ok && r.value.created)).toEqual([true, true, true]);
      const ids = results.map((r) => (r.ok ? r.value.snapshot.task_id : ''));
      expect(ids[1]).not.toBe(held.snapshot.task_id);
      const rows = await h.sql<{ idempotency_key: string; task_id: string }[]>`
        select idempotency_key, task_id from tasks
        where idempotency_key in ('before-released', 'released', 'after-released')`;
      expect(Object.fromEntries(rows.map((row) => [row.idempotency_key, row.task_id]))).toEqual({
        'before-released': ids[0],
        released: ids[1],
        'after-released': ids[2],
      });
    } finally {
      await racing.close();
    }
  });

  it('a lookup that fails after the commit fails only its own items, retryably', async () => {
    const held = await h.store.submit(submitCommand('looked-up', { queue: 'sub' }));
    const failing = storeBeforeFirstLookup(() => Promise.reject(new Error('connection lost')));
    try {
      const results = await failing.store.submitBatch([
        submitCommand('beside-lookup', { queue: 'sub' }),
        submitCommand('looked-up', { queue: 'sub' }),
      ]);
      expect(results[0]?.ok && results[0].value.created).toBe(true);
      expect(results[1]?.ok ? 'ok' : [results[1]?.error.code, results[1]?.error.retryable]).toEqual(
        ['unavailable', true],
      );
      // The retry the error asks for answers the replay.
      expect(await h.store.submit(submitCommand('looked-up', { queue: 'sub' }))).toEqual({
        created: false,
        snapshot: held.snapshot,
      });
      const fresh = results[0]?.ok ? results[0].value.snapshot : undefined;
      expect((await h.store.status(SCOPE, fresh?.task_id ?? '')).state).toBe('queued');
    } finally {
      await failing.close();
    }
  });

  it('answers a batch sent in several insert chunks as one, whatever chunk an item is in', async () => {
    // SUBMIT_CHUNK items per insert statement (store.ts): positions chosen across chunk borders.
    const size = SUBMIT_CHUNK * 2 + 100;
    const stored = await h.store.submit(submitCommand('chunks-held', { queue: 'chunks' }));
    const commands = Array.from({ length: size }, (_, i) =>
      submitCommand(`chunks-${i}`, { queue: 'chunks' }),
    );
    const first = 10;
    const replayAt = SUBMIT_CHUNK + 50; // the same key and command as item `first`
    const conflictAt = 2 * SUBMIT_CHUNK + 20; // the same key as item `first`, other data
    const heldAt = SUBMIT_CHUNK * 2 - 1; // last item of the second chunk
    commands[replayAt] = submitCommand(`chunks-${first}`, { queue: 'chunks' });
    commands[conflictAt] = submitCommand(`chunks-${first}`, { queue: 'chunks', data: 'other' });
    commands[heldAt] = submitCommand('chunks-held', { queue: 'chunks' });
    const results = await h.store.submitBatch(commands);
    const answers = results.map((r) => (r.ok ? r.value.created : r.error.code));
    const special = new Set([replayAt, conflictAt, heldAt]);
    expect(answers.filter((_, i) => !special.has(i))).toEqual(
      Array.from({ length: size - 3 }, () => true),
    );
    expect([answers[replayAt], answers[conflictAt], answers[heldAt]]).toEqual([
      false,
      'conflict',
      false,
    ]);
    const idOf = (i: number) => (results[i]?.ok ? results[i].value.snapshot.task_id : `none ${i}`);
    expect(idOf(replayAt)).toBe(idOf(first));
    expect(idOf(heldAt)).toBe(stored.snapshot.task_id);
    // Every created task has its payload and exactly one history record; nothing else was
    // written for the batch's repeated keys.
    const [counts] = await h.sql<{ tasks: number; payloads: number; history: number }[]>`
      select (select count(*)::int from tasks where queue = 'chunks') as tasks,
        (select count(*)::int from task_payloads p join tasks t using (tenant_id, namespace, task_id)
          where t.queue = 'chunks') as payloads,
        (select count(*)::int from task_history hi join tasks t using (tenant_id, namespace, task_id)
          where t.queue = 'chunks') as history`;
    expect(counts).toEqual({ tasks: size - 2, payloads: size - 2, history: size - 2 });
  });

  it('rolls back every chunk of a batch when a later chunk fails, then answers it item by item', async () => {
    // A trigger fails the insert of one key in the second chunk, while the third is being
    // built. Were the first chunk committed on its own, the item-by-item retry after the
    // failure would answer it as replays (created: false); as one transaction it was rolled
    // back and is created by the retry.
    await h.sql.unsafe(`
      create function chunks_fail() returns trigger language plpgsql as $$
      begin raise exception 'chunks_fail'; end $$;
      create trigger chunks_fail before insert on task_payloads for each row
        when (new.data::text = '"fail"') execute function chunks_fail()`);
    try {
      const size = SUBMIT_CHUNK * 2 + 100;
      const failAt = SUBMIT_CHUNK + 50;
      const commands = Array.from({ length: size }, (_, i) =>
        submitCommand(`rollback-${i}`, { queue: 'rollback', data: i === failAt ? 'fail' : i }),
      );
      const results = await h.store.submitBatch(commands);
      const answers = results.map((r) => (r.ok ? r.value.created : r.error.code));
      expect(answers[failAt]).toBe('unavailable');
      expect(answers.filter((_, i) => i !== failAt)).toEqual(
        Array.from({ length: size - 1 }, () => true),
      );
      const [row] = await h.sql<{ n: number }[]>`
        select count(*)::int as n from tasks where queue = 'rollback'`;
      expect(row?.n).toBe(size - 1);
    } finally {
      await h.sql.unsafe(`
        drop trigger chunks_fail on task_payloads;
        drop function chunks_fail()`);
    }
  });

  it('a foreign scope cannot see a task', async () => {
    const { snapshot } = await h.store.submit(submitCommand('scoped', { queue: 'sub' }));
    const other = { tenant_id: 'other', namespace: 'prod' };
    expect(await outcomeCode(h.store.status(other, snapshot.task_id))).toBe('not_found');
    expect(await outcomeCode(h.store.cancel(other, snapshot.task_id))).toBe('not_found');
    expect(await outcomeCode(h.store.history(other, snapshot.task_id, 0))).toBe('not_found');
  });
});

describe('lifecycle', () => {
  it('claims, renews with dispatch, settles, and replays', async () => {
    const { snapshot } = await h.store.submit(submitCommand('life', { queue: 'life' }));
    const s = await session('life');
    const assignment = await claim('life', s.id, 0, 1);
    expect(assignment.event.data).toEqual({ key: 'life' });
    expect(assignment.authority.dispatch_allowed).toBe(false);
    // Replay of the same poll: same assignment.
    const replay = await h.store.acquire(acquireCommand(s.id, 0, 1, 'life'), { recordEmpty: true });
    expect(replay.reply.disposition).toBe('assigned');
    // A new poll while the slot is busy.
    expect(
      await outcomeCode(h.store.acquire(acquireCommand(s.id, 0, 2, 'life'), { recordEmpty: true })),
    ).toBe('consumer_busy');
    const owner = assignment.lease.owner;
    const auth = await h.store.renew(renewCommand(owner, 1, 'dispatch'));
    expect(auth.dispatch_allowed).toBe(true);
    expect((await h.store.renew(renewCommand(owner, 1, 'dispatch'))).renew_sequence).toBe(1);
    expect(await outcomeCode(h.store.renew(renewCommand(owner, 3)))).toBe('sequence_conflict');
    const settled = await h.store.settle(successCommand(assignment, 'op1', { out: null }));
    expect(settled.already_accepted).toBe(false);
    expect(settled.task_state).toBe('succeeded');
    const replayed = await h.store.settle(successCommand(assignment, 'op1', { out: null }));
    expect(replayed.already_accepted).toBe(true);
    expect(await outcomeCode(h.store.settle(successCommand(assignment, 'op2')))).toBe('conflict');
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.outcome).toEqual({ state: 'succeeded', output: { out: null } });
    const history = await h.store.history(SCOPE, snapshot.task_id, 0);
    expect(history.map((e) => e.event.reason)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'succeeded',
    ]);
    expect(history.map((e) => e.sequence)).toEqual([1, 2, 3, 4, 5]);
    const attempt = await h.store.inspectAttempt(SCOPE, snapshot.task_id, owner.attempt_id);
    expect(attempt.state).toBe('succeeded');
    expect(attempt.execution_may_have_started).toBe(true);
    // After settling, the slot is free for the next poll, which finds nothing.
    const next = await h.store.acquire(acquireCommand(s.id, 0, 2, 'life'), { recordEmpty: false });
    expect(next).toEqual({ reply: { disposition: 'empty', sequence: 2 }, recorded: false });
  });

  it('replays a settlement read back from its row by canonical equality, and conflicts on any difference', async () => {
    await h.store.submit(submitCommand('canon', { queue: 'canon' }));
    const s = await session('canon');
    const assignment = await claim('canon', s.id, 0, 1);
    await h.store.renew(renewCommand(assignment.lease.owner, 1, 'dispatch'));
    // Values a JSON round trip could alter if it were not exact: numbers in exponent form, -0,
    // U+2028, an astral character, a NUL, deep nesting, keys in non-sorted order.
    const output = { z: [1e21, -0, 1.5e-7, '\u2028😀\u0000'], a: { y: [{ k: null }], b: true } };
    const command = successCommand(assignment, 'op-canon', output);
    expect((await h.store.settle(command)).already_accepted).toBe(false);
    const [row] = await h.sql<{ settlement_digest: string | null }[]>`
      select settlement_digest from attempts where attempt_id = ${assignment.lease.owner.attempt_id}`;
    expect(row?.settlement_digest).toBeNull();
    // The same command, also with its keys in reverse order: replays.
    for (const again of [command, withKeysReversed(command)]) {
      expect(await h.store.settle(again)).toMatchObject({
        already_accepted: true,
        task_state: 'succeeded',
      });
    }
    // One value deep inside differs, or the quiescence: the same operation id, another command.
    for (const other of [
      successCommand(assignment, 'op-canon', { ...output, a: { y: [{ k: 0 }], b: true } }),
      successCommand(assignment, 'op-canon', output, 'unconfirmed'),
    ]) {
      expect(await outcomeCode(h.store.settle(other))).toBe('conflict');
    }
  });

  it('a JSON null output is distinct from pending', async () => {
    const { snapshot } = await h.store.submit(submitCommand('nullout', { queue: 'nullout' }));
    expect((await h.store.result(SCOPE, snapshot.task_id)).outcome).toEqual({ state: 'pending' });
    const s = await session('nullout');
    const a = await claim('nullout', s.id, 0, 1);
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    await h.store.settle(successCommand(a, 'n', null));
    expect((await h.store.result(SCOPE, snapshot.task_id)).outcome).toEqual({
      state: 'succeeded',
      output: null,
    });
  });

  it('retries a failure, then fails when attempts run out', async () => {
    const { snapshot } = await h.store.submit(
      submitCommand('retry', { queue: 'retry', retry: { max_attempts: 2, delay_ms: 1000 } }),
    );
    const s = await session('retry');
    const a1 = await claim('retry', s.id, 0, 1);
    await h.store.renew(renewCommand(a1.lease.owner, 1, 'dispatch'));
    expect((await h.store.settle(failureCommand(a1, 'f1'))).task_state).toBe('queued');
    const early = await h.store.acquire(acquireCommand(s.id, 0, 2, 'retry'), { recordEmpty: true });
    expect(early.reply.disposition).toBe('empty');
    h.advance(1_000);
    const a2 = await claim('retry', s.id, 0, 3);
    expect(a2.event.ldgattempt).toBe(2);
    await h.store.renew(renewCommand(a2.lease.owner, 1, 'dispatch'));
    expect((await h.store.settle(failureCommand(a2, 'f2'))).task_state).toBe('failed');
    const status = await h.store.status(SCOPE, snapshot.task_id);
    expect(status.attempt_count).toBe(2);
  });

  it('cancels queued at once and active on request', async () => {
    const queued = await h.store.submit(submitCommand('cq', { queue: 'cancel' }));
    expect(await h.store.cancel(SCOPE, queued.snapshot.task_id)).toBe('cancelled');
    expect(await h.store.cancel(SCOPE, queued.snapshot.task_id)).toBe('cancelled');
    const active = await h.store.submit(submitCommand('ca', { queue: 'cancel' }));
    const s = await session('cancel');
    const a = await claim('cancel', s.id, 0, 1);
    expect(await h.store.cancel(SCOPE, active.snapshot.task_id)).toBe('active');
    const auth = await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    expect(auth.cancel_requested).toBe(true);
    expect(auth.dispatch_allowed).toBe(false);
    expect((await h.store.settle(failureCommand(a, 'c'))).task_state).toBe('cancelled');
  });

  it('recovers an expired lease, and the stale owner is fenced', async () => {
    const { snapshot } = await h.store.submit(submitCommand('expire', { queue: 'expire' }));
    const s = await session('expire');
    const a = await claim('expire', s.id, 0, 1);
    h.advance(2_500);
    expect(await outcomeCode(h.store.renew(renewCommand(a.lease.owner, 1)))).toBe('ownership_lost');
    const progress = await h.store.recoverExpiredLeases();
    expect(progress).toMatchObject({
      scanned: 1,
      recovered: 1,
      requeued: 1,
      failed: 0,
      cancelled: 0,
    });
    expect(await outcomeCode(h.store.settle(successCommand(a, 'late')))).toBe('ownership_lost');
    const status = await h.store.status(SCOPE, snapshot.task_id);
    expect(status.state).toBe('queued');
    const history = await h.store.history(SCOPE, snapshot.task_id, 0);
    expect(history.map((e) => e.event.reason)).toEqual([
      'submitted',
      'claimed',
      'lease_expired',
      'retry_scheduled',
    ]);
    expect(await h.store.recoverExpiredLeases()).toMatchObject({ scanned: 0, has_more: false });
  });

  it('recovers in bounded passes and reports has_more exactly', async () => {
    const s = await session('bounded', 5);
    for (let i = 0; i < 5; i += 1)
      await h.store.submit(submitCommand(`bounded-${i}`, { queue: 'bounded' }));
    for (let i = 0; i < 5; i += 1) await claim('bounded', s.id, i, 1);
    h.advance(2_500);
    expect(await h.store.recoverExpiredLeases(2)).toMatchObject({ scanned: 2, has_more: true });
    expect(await h.store.recoverExpiredLeases(2)).toMatchObject({ scanned: 2, has_more: true });
    expect(await h.store.recoverExpiredLeases(2)).toEqual({
      scanned: 1,
      recovered: 1,
      requeued: 1,
      failed: 0,
      cancelled: 0,
      finalized: 0,
      has_more: false,
    });
    expect(await outcomeCode(h.store.recoverExpiredLeases(0))).toBe('invalid_input');
  });

  it('an unconfirmed settlement takes its recorded outcome at the authority deadline', async () => {
    const { snapshot } = await h.store.submit(submitCommand('fin', { queue: 'fin' }));
    const s = await session('fin');
    const a = await claim('fin', s.id, 0, 1);
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    const reply = await h.store.settle({
      ...failureCommand(a, 'x', false),
      quiescence: 'unconfirmed',
    });
    expect(reply.task_state).toBe('active');
    const held = await h.store.inspectAttempt(SCOPE, snapshot.task_id, a.lease.owner.attempt_id);
    const step = held.authority_deadline - (await h.store.now());
    h.advance(step);
    // Not lost: its recorded outcome is applied and counted as finalized.
    expect(await h.store.recoverExpiredLeases()).toMatchObject({
      scanned: 1,
      recovered: 0,
      failed: 0,
      finalized: 1,
    });
    const result = await h.store.result(SCOPE, snapshot.task_id);
    expect(result.outcome.state).toBe('failed');
  });

  it('quiescence unconfirmed holds the task active until confirmed', async () => {
    const { snapshot } = await h.store.submit(submitCommand('quiet', { queue: 'quiet' }));
    const s = await session('quiet');
    const a = await claim('quiet', s.id, 0, 1);
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    const reply = await h.store.settle(successCommand(a, 'q1', 1, 'unconfirmed'));
    expect(reply.task_state).toBe('active');
    expect(await h.store.confirmQuiescence(a.lease.owner)).toBe('succeeded');
    expect(await h.store.confirmQuiescence(a.lease.owner)).toBe('succeeded');
    expect((await h.store.result(SCOPE, snapshot.task_id)).outcome).toEqual({
      state: 'succeeded',
      output: 1,
    });
  });

  it('sessions: unknown, expired, extended', async () => {
    expect(
      await outcomeCode(h.store.acquire(acquireCommand('ses_nope', 0, 1), { recordEmpty: true })),
    ).toBe('session_not_found');
    const s = await session('q', 1);
    h.advance(61_000);
    expect(
      await outcomeCode(h.store.acquire(acquireCommand(s.id, 0, 1), { recordEmpty: true })),
    ).toBe('session_expired');
    expect(await outcomeCode(h.store.extendSession(SCOPE, s.id))).toBe('session_expired');
    const fresh = await session('q', 1);
    const extended = await h.store.extendSession(SCOPE, fresh.id);
    expect(extended.expires_at).toBeGreaterThanOrEqual(fresh.expires_at);
  });
});

describe('listing', () => {
  it('pages in (submitted_at desc, task_id desc) order with filters', async () => {
    const submitted: { task_id: string; submitted_at: number }[] = [];
    for (let i = 0; i < 7; i += 1) {
      const { snapshot } = await h.store.submit(
        submitCommand(`list${i}`, { queue: 'list', labels: { team: i % 2 ? 'a' : 'b', env: 'x' } }),
      );
      submitted.push(snapshot);
    }
    const all: string[] = [];
    let cursor: string | undefined;
    for (;;) {
      const page = await h.store.listTasks(SCOPE, {
        filters: { queue: 'list' },
        limit: 3,
        ...(cursor ? { cursor } : {}),
      });
      all.push(...page.tasks.map((t) => t.task_id));
      if (page.next_cursor === undefined) break;
      cursor = page.next_cursor;
    }
    expect(all).toHaveLength(7);
    expect(new Set(all).size).toBe(7);
    // Store time orders the listing, task ids only break its ties: two submits within one
    // millisecond of the server's clock can get ids in either order (UUIDv7's random bits).
    const expected = [...submitted]
      .sort((a, b) =>
        a.submitted_at !== b.submitted_at
          ? b.submitted_at - a.submitted_at
          : a.task_id < b.task_id
            ? 1
            : -1,
      )
      .map((t) => t.task_id);
    expect(all).toEqual(expected);
    const labelled = await h.store.listTasks(SCOPE, {
      filters: { queue: 'list', labels: { team: 'a', env: 'x' } },
    });
    expect(labelled.tasks).toHaveLength(3);
    expect(labelled.next_cursor).toBeUndefined();
    const none = await h.store.listTasks(SCOPE, { filters: { workflow_id: 'wf' } });
    expect(none.tasks).toEqual([]);
    const page = await h.store.listTasks(SCOPE, { filters: { queue: 'list' }, limit: 2 });
    expect(
      await outcomeCode(
        h.store.listTasks(SCOPE, {
          filters: { queue: 'other' },
          cursor: page.next_cursor as string,
        }),
      ),
    ).toBe('invalid_input');
  });
});
