/**
 * Retention edges — preview vs collection, idempotency keys freed while submits
 * race a collection, expired sessions holding live attempts, session backlogs, policy bounds.
 */
import {
  ContractError,
  MAX_RETENTION_MS,
  MIN_RETENTION_MS,
  type Scope,
  type SubmitCommand,
} from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

const HOUR = 3_600_000;
const DAY = 24 * HOUR;

let h: Harness;
beforeAll(async () => {
  h = await harness('retention_edges', lifecycleConfig({ ...CONFIG, sessionValidityMs: 60_000 }));
});
afterAll(async () => {
  await h.close();
});

function cmd(scope: Scope, key: string, extra: Record<string, unknown> = {}): SubmitCommand {
  return submitCommand(key, { tenant_id: scope.tenant_id, namespace: scope.namespace, ...extra });
}

async function terminalTask(scope: Scope, key: string): Promise<string> {
  const { snapshot } = await h.store.submit(cmd(scope, key));
  expect(await h.store.cancel(scope, snapshot.task_id)).toBe('cancelled');
  return snapshot.task_id;
}

async function count(table: string, scope: Scope, where = 'true', params: unknown[] = []) {
  const [row] = await h.sql.unsafe(
    `select count(*)::int as n from ${table} where tenant_id = $1 and namespace = $2 and ${where}`,
    [scope.tenant_id, scope.namespace, ...params] as never[],
  );
  return Number(row?.n);
}

describe('preview and the collection that follows', () => {
  it('preview counts exactly what a collection removes when nothing protects a task', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'agree' };
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    for (let i = 0; i < 7; i += 1) await terminalTask(scope, `old-${i}`);
    // A live task, however old, is never a candidate.
    await h.store.submit(cmd(scope, 'live'));
    h.advance(MIN_RETENTION_MS + 1_000);
    for (let i = 0; i < 2; i += 1) await terminalTask(scope, `young-${i}`);
    const preview = await h.store.previewRetention(scope, 5);
    expect(preview).toMatchObject({ candidates: 5, truncated: true });
    const full = await h.store.previewRetention(scope);
    expect(full).toMatchObject({ candidates: 7, truncated: false });
    const first = await h.store.collectRetired(scope, 5);
    expect(first).toMatchObject({ tasks_removed: 5, has_more: true });
    expect(first.cutoff).toBeGreaterThanOrEqual(full.cutoff);
    const second = await h.store.collectRetired(scope, 5);
    expect(second).toMatchObject({ tasks_removed: 2, has_more: false });
    expect(await h.store.previewRetention(scope)).toMatchObject({
      candidates: 0,
      truncated: false,
    });
    expect(await count('tasks', scope)).toBe(3);
  });

  it('works at MAX_RETENTION_MS and after shortening it to MIN_RETENTION_MS', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'maxpol' };
    const set = await h.store.setRetentionPolicy(scope, { retention_ms: MAX_RETENTION_MS });
    expect(set.retention_ms).toBe(MAX_RETENTION_MS);
    await terminalTask(scope, 'a');
    h.advance(2 * HOUR);
    const preview = await h.store.previewRetention(scope);
    // The default policy (7 days) replaced by this one left its cutoff as the floor.
    expect(preview.cutoff).toBeGreaterThanOrEqual(preview.as_of - MAX_RETENTION_MS);
    expect(preview.cutoff).toBeLessThanOrEqual(preview.as_of - MIN_RETENTION_MS);
    expect(preview.candidates).toBe(0);
    expect((await h.store.collectRetired(scope)).tasks_removed).toBe(0);
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    expect((await h.store.previewRetention(scope)).candidates).toBe(1);
    expect((await h.store.collectRetired(scope)).tasks_removed).toBe(1);
    expect(
      await outcomeCode(h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS - 1 })),
    ).toBe('invalid_input');
    expect(
      await outcomeCode(h.store.setRetentionPolicy(scope, { retention_ms: MAX_RETENTION_MS + 1 })),
    ).toBe('invalid_input');
    expect((await h.store.retentionPolicy(scope)).retention_ms).toBe(MIN_RETENTION_MS);
  });
});

describe('submits of a key racing the collection of its task', () => {
  it('each submit replays the old task or creates a new one, never fails; one task per key at the end', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'keyrace' };
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    const N = 60;
    const old = new Map<string, string>();
    for (let i = 0; i < N; i += 1) old.set(`k${i}`, await terminalTask(scope, `k${i}`));
    h.advance(MIN_RETENTION_MS + 1_000);
    const submitter = h.makeStore(4);
    const collector = h.makeStore(2);
    const errors: unknown[] = [];
    const outcomes = new Map<string, { created: boolean; id: string }[]>();
    const collect = (async () => {
      for (;;) {
        const p = await collector.collectRetired(scope, 3);
        if (!p.has_more && p.tasks_removed === 0) return;
      }
    })();
    const singles = [...old.keys()].map(async (key, i) => {
      try {
        const out =
          i % 2 === 0
            ? await submitter.submit(cmd(scope, key))
            : await (async () => {
                const [r] = await submitter.submitBatch([cmd(scope, key)]);
                if (r === undefined || !r.ok) throw r?.error ?? new Error('no result');
                return r.value;
              })();
        const list = outcomes.get(key) ?? [];
        list.push({ created: out.created, id: out.snapshot.task_id });
        outcomes.set(key, list);
      } catch (error) {
        errors.push(error instanceof ContractError ? `${error.code}: ${error.message}` : error);
      }
    });
    await Promise.all([collect, ...singles]);
    // Drain what is left.
    for (;;) {
      const p = await h.store.collectRetired(scope, 100);
      if (!p.has_more) break;
    }
    expect(errors).toEqual([]);
    for (const [key, oldId] of old) {
      const [o] = outcomes.get(key) ?? [];
      expect(o).toBeDefined();
      if (o === undefined) continue;
      if (o.created) expect(o.id).not.toBe(oldId);
      else expect(o.id).toBe(oldId);
      // The old task is gone, its key held by at most the new task.
      expect(await count('tasks', scope, 'task_id = $3', [oldId])).toBe(0);
      expect(await count('tasks', scope, 'idempotency_key = $3', [key])).toBe(o.created ? 1 : 0);
    }
    for (const table of ['attempts', 'task_history', 'task_payloads']) {
      expect(
        await count(
          table,
          scope,
          `not exists (select 1 from tasks t where t.tenant_id = ${table}.tenant_id
            and t.namespace = ${table}.namespace and t.task_id = ${table}.task_id)`,
        ),
      ).toBe(0);
    }
  });
});

describe('a session expired long ago whose attempt is still live', () => {
  it('is collected without disturbing the attempt: renew and settle still work, nothing is orphaned', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'longrun' };
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    const queue = 'long';
    await h.store.submit(cmd(scope, 'long-task', { queue, timeout_ms: 86_400_000 }));
    const session = await h.store.openSession({ scope, queue, concurrency: 1 });
    const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue, scope), {
      recordEmpty: true,
    });
    if (reply.disposition !== 'assigned') throw new Error(reply.disposition);
    const a = reply.assignment;
    let seq = 1;
    expect(
      (await h.store.renew(renewCommand(a.lease.owner, seq, 'dispatch'))).dispatch_allowed,
    ).toBe(true);
    // Keep renewing past session expiry + the policy: lease 2 s, so step 1.5 s at a time is too
    // slow; move the clock in 1 s steps via many renewals would take long, so renew, then move
    // less than the lease each time for a while, then jump to past the cutoff in steps.
    const target = 60_000 + MIN_RETENTION_MS + 10_000;
    let moved = 0;
    while (moved < target) {
      h.advance(1_500);
      moved += 1_500;
      seq += 1;
      await h.store.renew(renewCommand(a.lease.owner, seq));
    }
    const progress = await h.store.collectRetired(scope);
    expect(progress.sessions_removed).toBe(1);
    expect(await count('worker_sessions', scope)).toBe(0);
    expect(await count('consumer_cursors', scope)).toBe(0);
    seq += 1;
    const auth = await h.store.renew(renewCommand(a.lease.owner, seq));
    expect(auth.remaining_ms).toBeGreaterThan(0);
    const settled = await h.store.settle(successCommand(a, 'op-long'));
    expect(settled).toBeDefined();
    expect((await h.store.status(scope, a.lease.owner.task_id)).state).toBe('succeeded');
    expect(await count('consumer_cursors', scope)).toBe(0);
  }, 120_000);
});

describe('a backlog of expired sessions only', () => {
  it('is collected in bounded passes, with has_more while a pass was full, cursors included', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'sessbacklog' };
    await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    for (let i = 0; i < 25; i += 1) {
      const s = await h.store.openSession({ scope, queue: 'sq', concurrency: 1 });
      await h.store.acquire(acquireCommand(s.id, 0, 1, 'sq', scope), { recordEmpty: true });
    }
    expect(await count('consumer_cursors', scope)).toBe(25);
    h.advance(60_000 + MIN_RETENTION_MS + 1_000);
    const passes = [];
    for (;;) {
      const p = await h.store.collectRetired(scope, 10);
      passes.push([p.sessions_removed, p.has_more]);
      if (!p.has_more) break;
    }
    expect(passes).toEqual([
      [10, true],
      [10, true],
      [5, false],
    ]);
    expect(await count('worker_sessions', scope)).toBe(0);
    expect(await count('consumer_cursors', scope)).toBe(0);
  });
});

describe('the preview cutoff as RetentionPreviewSchema documents it', () => {
  // "`cutoff` is `as_of − retention_ms`, or later: what a shorter earlier policy (the server
  // default included) had already retired stays collectable under a longer one."
  it('is as_of − retention_ms without a policy, and the default policy cutoff after a first, longer one', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'doccutoff' };
    const before = await h.store.previewRetention(scope);
    expect(before.cutoff).toBe(before.as_of - before.retention_ms);
    await h.store.setRetentionPolicy(scope, { retention_ms: before.retention_ms + 30 * DAY });
    const after = await h.store.previewRetention(scope);
    expect(after.retention_ms).toBe(before.retention_ms + 30 * DAY);
    // The floor the default left when the policy was set: between the two previews' cutoffs.
    expect(after.cutoff).toBeGreaterThanOrEqual(before.cutoff);
    expect(after.cutoff).toBeLessThanOrEqual(after.as_of - before.retention_ms);
    expect(after.cutoff).toBeGreaterThan(after.as_of - after.retention_ms);
  });
});
