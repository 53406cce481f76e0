/**
 * Reading tasks back over the PostgreSQL store: listing pages under concurrent writes, label and
 * time filters, cursors that are garbled, tampered or foreign, history pages, every read against
 * its strict wire schema at each lifecycle state, and the page byte limit (DESIGN §4, §6, §12).
 */
import {
  type Assignment,
  AttemptSnapshotSchema,
  ContractError,
  encodeTaskCursor,
  parseWith,
  type Scope,
  TaskResultSchema,
  TaskSnapshotSchema,
  TaskStatusSchema,
  taskCursorBinding,
} from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

/** The issues a strict wire schema finds in a value, `undefined` when it conforms. */
function schemaIssues(schema: Parameters<typeof parseWith>[0], value: unknown): string | undefined {
  try {
    parseWith(schema, value, 'reply');
    return undefined;
  } catch (error) {
    return String(error);
  }
}

let h: Harness;
beforeAll(async () => {
  h = await harness('views');
});
afterAll(() => h.close());

async function claimOne(queue: string): Promise<Assignment> {
  const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(s.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error(`expected assigned: ${reply.disposition}`);
  return reply.assignment;
}

function byteDesc(a: { submitted_at: number; task_id: string }, b: typeof a): number {
  if (a.submitted_at !== b.submitted_at) return b.submitted_at - a.submitted_at;
  return Buffer.compare(Buffer.from(b.task_id), Buffer.from(a.task_id));
}

async function listAll(
  scope: Scope,
  filters: Record<string, unknown>,
  limit: number,
  between?: () => Promise<void>,
): Promise<{ task_id: string; submitted_at: number }[]> {
  const out: { task_id: string; submitted_at: number }[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await h.store.listTasks(scope, {
      filters,
      limit,
      ...(cursor ? { cursor } : {}),
    });
    out.push(...page.tasks);
    if (page.next_cursor === undefined) break;
    cursor = page.next_cursor;
    if (between) await between();
  }
  return out;
}

describe('listing', () => {
  it('pages a stable set exactly once, in order, while other tasks arrive and change state', async () => {
    // A batch shares one store time: a whole tie group ordered by task id bytes.
    const results = await h.store.submitBatch(
      Array.from({ length: 23 }, (_, i) => submitCommand(`stable-${i}`, { queue: 'rv-page' })),
    );
    const stable = results.map((r) => {
      if (!r.ok) throw r.error;
      return r.value.snapshot;
    });
    let n = 0;
    const seen = await listAll(SCOPE, { queue: 'rv-page' }, 4, async () => {
      n += 1;
      await h.store.submit(submitCommand(`noise-${n}`, { queue: 'rv-page' }));
      // change the state of a stable task between pages
      if (n === 2) await h.store.cancel(SCOPE, stable[5]?.task_id as string);
    });
    const stableIds = new Set(stable.map((s) => s.task_id));
    const seenStable = seen.filter((t) => stableIds.has(t.task_id));
    expect(seenStable).toHaveLength(stable.length);
    expect(new Set(seenStable.map((t) => t.task_id)).size).toBe(stable.length);
    const expected = [...stable].sort(byteDesc).map((t) => t.task_id);
    expect(seenStable.map((t) => t.task_id)).toEqual(expected);
    // whole listing is in order
    const sorted = [...seen].sort(byteDesc);
    expect(seen.map((t) => t.task_id)).toEqual(sorted.map((t) => t.task_id));
  });

  it('filters by labels with special characters, alone and combined', async () => {
    const labels: Record<string, string>[] = [
      { 'a.b': 'x=y&z', 'sp ace': 'v a l', é: '日本', '%2F': '+', 'k"q': 'v\\"' },
      { 'a.b': 'x=y&z', other: '1' },
      { 'a.b': 'x=y', 'sp ace': 'v a l' },
    ];
    const snaps: { task_id: string }[] = [];
    for (const [i, l] of labels.entries()) {
      snaps.push(
        (await h.store.submit(submitCommand(`lab-${i}`, { queue: 'rv-lab', labels: l }))).snapshot,
      );
    }
    const q = async (f: Record<string, unknown>) =>
      (await h.store.listTasks(SCOPE, { filters: { queue: 'rv-lab', ...f } })).tasks
        .map((t) => t.task_id)
        .sort();
    const id = (i: number) => snaps[i]?.task_id as string;
    expect(await q({ labels: { 'a.b': 'x=y&z' } })).toEqual([id(0), id(1)].sort());
    expect(await q({ labels: { 'a.b': 'x=y&z', 'sp ace': 'v a l' } })).toEqual([id(0)]);
    expect(await q({ labels: { é: '日本' } })).toEqual([id(0)]);
    expect(await q({ labels: { 'k"q': 'v\\"' } })).toEqual([id(0)]);
    expect(await q({ labels: { '%2F': '+' } })).toEqual([id(0)]);
    expect(await q({ labels: { 'a.b': 'x=y' } })).toEqual([id(2)]);
    expect(await q({ labels: { 'a.b': 'x' } })).toEqual([]);
    expect(await q({ labels: { 'a.b': 'x=y&z' }, state: 'queued', program: 'prog' })).toEqual(
      [id(0), id(1)].sort(),
    );
    expect(await q({ labels: { 'a.b': 'x=y&z' }, state: 'active' })).toEqual([]);
    expect(await q({ program: 'nope' })).toEqual([]);
  });

  it('submitted_from is inclusive and submitted_until exclusive', async () => {
    const { snapshot } = await h.store.submit(submitCommand('range-0', { queue: 'rv-range' }));
    const at = snapshot.submitted_at;
    const q = async (f: Record<string, unknown>) =>
      (await h.store.listTasks(SCOPE, { filters: { queue: 'rv-range', ...f } })).tasks.length;
    expect(await q({ submitted_from: at })).toBe(1);
    expect(await q({ submitted_from: at + 1 })).toBe(0);
    expect(await q({ submitted_until: at })).toBe(0);
    expect(await q({ submitted_until: at + 1 })).toBe(1);
    expect(await q({ submitted_from: at, submitted_until: at })).toBe(0);
  });

  it('rejects garbled, tampered and foreign cursors with invalid_input, never another error', async () => {
    await h.store.submit(submitCommand('cur-0', { queue: 'rv-cur' }));
    await h.store.submit(submitCommand('cur-1', { queue: 'rv-cur' }));
    const page = await h.store.listTasks(SCOPE, { filters: { queue: 'rv-cur' }, limit: 1 });
    const good = page.next_cursor as string;
    expect(typeof good).toBe('string');
    const binding = taskCursorBinding(SCOPE, { queue: 'rv-cur' });
    const enc = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
    const bad = [
      'x',
      '!!!',

      good.slice(0, -2),
      enc([1, binding, -1, 'a']),
      enc([1, binding, 1.5, 'a']),
      enc([1, binding, 2 ** 60, 'a']),
      enc([1, binding, 0, '']),
      enc([1, binding, 0, 'a\u0000b']),
      enc([1, binding, 0, 'x'.repeat(129)]),
      enc([1, binding, '0', 'a']),
      enc([2, binding, 0, 'a']),
      enc({ a: 1 }),
      enc([1, binding, 0]),
      enc([1, binding, 0, 'a', 5]),
      enc([
        1,
        taskCursorBinding({ tenant_id: 'other', namespace: 'prod' }, { queue: 'rv-cur' }),
        0,
        'a',
      ]),
      encodeTaskCursor(
        { tenant_id: 'acme', namespace: 'staging' },
        { queue: 'rv-cur' },
        {
          submitted_at: 1,
          task_id: 'a',
        },
      ),
      Buffer.from([0xff, 0xfe, 0x5b]).toString('base64url'),
      'A'.repeat(1025),
    ];
    for (const cursor of bad) {
      let error: unknown;
      try {
        await h.store.listTasks(SCOPE, { filters: { queue: 'rv-cur' }, cursor });
      } catch (e) {
        error = e;
      }
      expect(error, cursor).toBeInstanceOf(ContractError);
      expect((error as ContractError).code, cursor).toBe('invalid_input');
    }
    // used with another filter
    expect(
      await outcomeCode(
        h.store.listTasks(SCOPE, { filters: { queue: 'rv-cur', state: 'queued' }, cursor: good }),
      ),
    ).toBe('invalid_input');
    // in another scope
    expect(
      await outcomeCode(
        h.store.listTasks(
          { tenant_id: 'other', namespace: 'prod' },
          { filters: { queue: 'rv-cur' }, cursor: good },
        ),
      ),
    ).toBe('invalid_input');
    // same filters spelled in a different key order, and a new limit: accepted
    const label = await h.store.listTasks(SCOPE, {
      filters: { labels: { b: '2', a: '1' }, queue: 'rv-cur' },
      limit: 1,
    });
    expect(label.tasks).toEqual([]);
    const next = await h.store.listTasks(SCOPE, {
      filters: { queue: 'rv-cur' },
      limit: 5,
      cursor: good,
    });
    expect(next.tasks).toHaveLength(1);
  });
});

describe('history', () => {
  it('pages ≤100 gapless records by after_sequence', async () => {
    const { snapshot } = await h.store.submit(
      submitCommand('hist-long', {
        queue: 'rv-hist',
        retry: { max_attempts: 40, delay_ms: 0 },
      }),
    );
    for (let i = 0; i < 40; i += 1) {
      const a = await claimOne('rv-hist');
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      await h.store.settle(failureCommand(a, `op-${i}`));
    }
    const status = await h.store.status(SCOPE, snapshot.task_id);
    expect(status.state).toBe('failed');
    const first = await h.store.history(SCOPE, snapshot.task_id, 0);
    expect(first).toHaveLength(100);
    expect(first.map((e) => e.sequence)).toEqual(Array.from({ length: 100 }, (_, i) => i + 1));
    const second = await h.store.history(SCOPE, snapshot.task_id, 100);
    expect(second.length).toBeGreaterThan(0);
    expect(second[0]?.sequence).toBe(101);
    const last = second.at(-1)?.sequence as number;
    expect(await h.store.history(SCOPE, snapshot.task_id, last)).toEqual([]);
    expect(await h.store.history(SCOPE, snapshot.task_id, 2 ** 53 - 1)).toEqual([]);
    expect(
      (await h.store.history(SCOPE, snapshot.task_id, last - 1)).map((e) => e.sequence),
    ).toEqual([last]);
    expect(
      await outcomeCode(
        h.store.history({ tenant_id: 'other', namespace: 'prod' }, snapshot.task_id, 0),
      ),
    ).toBe('not_found');
  });
});

describe('snapshots by state', () => {
  it('every read matches its wire schema at each lifecycle state', async () => {
    const check = async (taskId: string) => {
      const snap = await h.store.inspect(SCOPE, taskId);
      const status = await h.store.status(SCOPE, taskId);
      const result = await h.store.result(SCOPE, taskId);
      expect(schemaIssues(TaskSnapshotSchema, snap)).toBeUndefined();
      expect(schemaIssues(TaskStatusSchema, status)).toBeUndefined();
      expect(schemaIssues(TaskResultSchema, result)).toBeUndefined();
      expect(status.state).toBe(snap.state);
      expect(result.status).toEqual(status);
      const terminal = ['succeeded', 'failed', 'cancelled'].includes(snap.state);
      expect(snap.terminal_at === null).toBe(!terminal);
      expect(result.outcome.state).toBe(terminal ? snap.state : 'pending');
      if (snap.state === 'queued') expect(snap.current_attempt_id).toBeNull();
      return { snap, status, result };
    };
    const { snapshot } = await h.store.submit(
      submitCommand('snap-1', { queue: 'rv-snap', retry: { max_attempts: 2, delay_ms: 0 } }),
    );
    await check(snapshot.task_id);
    const a1 = await claimOne('rv-snap');
    const active = await check(snapshot.task_id);
    expect(active.snap.current_attempt_id).toBe(a1.lease.owner.attempt_id);
    expect(active.snap.attempt_count).toBe(1);
    await h.store.renew(renewCommand(a1.lease.owner, 1, 'dispatch'));
    await h.store.settle(failureCommand(a1, 'snap-op-1'));
    const retried = await check(snapshot.task_id);
    expect(retried.snap.state).toBe('queued');
    const att1 = await h.store.inspectAttempt(SCOPE, snapshot.task_id, a1.lease.owner.attempt_id);
    expect(schemaIssues(AttemptSnapshotSchema, att1)).toBeUndefined();
    expect(att1.state).toBe('failed');
    expect(att1.finished_at).not.toBeNull();
    const a2 = await claimOne('rv-snap');
    await h.store.renew(renewCommand(a2.lease.owner, 1, 'dispatch'));
    await h.store.settle(successCommand(a2, 'snap-op-2', { out: 1 }));
    const done = await check(snapshot.task_id);
    expect(done.result.outcome).toEqual({ state: 'succeeded', output: { out: 1 } });
    expect(done.snap.attempt_count).toBe(2);
    const att2 = await h.store.inspectAttempt(SCOPE, snapshot.task_id, a2.lease.owner.attempt_id);
    expect(schemaIssues(AttemptSnapshotSchema, att2)).toBeUndefined();
    expect(att2.state).toBe('succeeded');
    // foreign / unknown
    expect(
      await outcomeCode(h.store.status({ tenant_id: 'zzz', namespace: 'prod' }, snapshot.task_id)),
    ).toBe('not_found');
    expect(await outcomeCode(h.store.status(SCOPE, `${snapshot.task_id}x`))).toBe('not_found');
  });
});

describe('submit reply equals later reads', () => {
  it('the submit reply, its replay and inspect are the same snapshot', async () => {
    const now = await h.store.now();
    const variants: Record<string, unknown>[] = [
      {},
      { delay_ms: 5_000 },
      { available_at: now + 10_000 },
      { available_at: now - 10_000 },
      { labels: { zz: '1', a: '2', mm: '3' }, priority: 5, timeout_ms: 2_000 },
      { retry: { max_attempts: 4, delay_ms: 10, backoff: 'exponential', max_delay_ms: 100 } },
      { concurrency_key: 'ck', concurrency_limit: 2, data: { b: 1, a: [1.5, 'x'] } },
    ];
    for (const [i, extra] of variants.entries()) {
      const command = {
        ...submitCommand(`eq-${i}`, { queue: 'rv-eq', ...extra }),
        origin_trace: { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' },
      };
      const created = await h.store.submit(command);
      const replay = await h.store.submit(command);
      const inspected = await h.store.inspect(SCOPE, created.snapshot.task_id);
      const status = await h.store.status(SCOPE, created.snapshot.task_id);
      expect(replay.snapshot, JSON.stringify(extra)).toEqual(created.snapshot);
      expect(inspected, JSON.stringify(extra)).toEqual(created.snapshot);
      expect(status.available_at).toBe(created.snapshot.available_at);
      expect(status.submitted_at).toBe(created.snapshot.submitted_at);
      const listed = await h.store.listTasks(SCOPE, { filters: { queue: 'rv-eq' }, limit: 1 });
      expect(listed.tasks[0]).toEqual(status);
    }
    // and the same through a batch
    const batch = await h.store.submitBatch([
      submitCommand('eq-b1', { queue: 'rv-eq', delay_ms: 3_000 }),
      submitCommand('eq-b2', { queue: 'rv-eq', available_at: now + 7_000 }),
    ]);
    for (const item of batch) {
      if (!item.ok) throw item.error;
      const inspected = await h.store.inspect(SCOPE, item.value.snapshot.task_id);
      expect(inspected).toEqual(item.value.snapshot);
    }
  });
});

describe('page byte limit', () => {
  it('cuts a page before TASK_PAGE_MAX_BYTES and continues right after it', async () => {
    const labels: Record<string, string> = {};
    for (let i = 0; i < 16; i += 1) labels[`${'k'.repeat(60)}${i}`.slice(-64)] = 'v'.repeat(255);
    const results = await h.store.submitBatch(
      Array.from({ length: 260 }, (_, i) =>
        submitCommand(`big-${i}`, {
          queue: 'rv-big',
          labels,
          program: { name: 'p'.repeat(128), version: 'v'.repeat(128) },
        }),
      ),
    );
    for (const r of results) if (!r.ok) throw r.error;
    const ids = new Set<string>();
    let cursor: string | undefined;
    let pages = 0;
    for (;;) {
      const page = await h.store.listTasks(SCOPE, {
        filters: { queue: 'rv-big' },
        limit: 500,
        ...(cursor ? { cursor } : {}),
      });
      pages += 1;
      expect(Buffer.byteLength(JSON.stringify(page))).toBeLessThanOrEqual(1024 * 1024);
      for (const t of page.tasks) {
        expect(ids.has(t.task_id)).toBe(false);
        ids.add(t.task_id);
      }
      if (page.next_cursor === undefined) break;
      cursor = page.next_cursor;
    }
    expect(ids.size).toBe(260);
    expect(pages).toBeGreaterThan(1);
  });
});
