/**
 * Reads while writes happen, against real server processes on one database.
 *
 * - Task list walks filtered by state, queue and submission-time bounds while tasks of the same
 *   labels are submitted, claimed, retried, settled and cancelled concurrently (DESIGN §4: cursors
 *   carry the TaskPosition, submitted_at desc then task_id desc; seed 001 `TaskPage`: each page a
 *   coherent committed view, later pages later snapshots; `TaskFilters`: from inclusive, until
 *   exclusive). Promised and tested: no task twice in one walk; every task that matched for the
 *   whole walk is returned; each page's statuses match the filters.
 * - Single reads under churn (seed 000 `TaskService::result`: "one consistent snapshot"): a
 *   status, result or snapshot reply never mixes two moments; and reads one after another (on
 *   two replicas of one database) never go back in time.
 */
import type { TaskFilters, TaskResult, TaskSnapshot, TaskStatus } from '@ledgence/contracts';
import { Client, silentLogger, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  NAMESPACE,
  Stack,
  shortWorker,
  TENANT,
  until,
  watchUnhandledRejections,
} from './test/harness.js';

const stack = new Stack('r46d_reads');
let a: ServerProcess;
let b: ServerProcess;
const unhandled = watchUnhandledRejections();

beforeAll(async () => {
  await stack.open();
  [a, b] = await Promise.all([stack.start(), stack.start()]);
}, 120_000);
afterEach(() => {
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

function clientOf(url: string): Client {
  return new Client({
    url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    backoff: { baseMs: 10, maxMs: 50 },
  });
}

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);

/** One walk by hand, a new page size each page, running `between` (real writes) between pages. */
async function walk(
  c: Client,
  filters: TaskFilters,
  between: (page: number) => Promise<void>,
): Promise<{ ids: string[]; statuses: TaskStatus[]; pages: number }> {
  const ids: string[] = [];
  const statuses: TaskStatus[] = [];
  let cursor: string | undefined;
  let pages = 0;
  for (;;) {
    const iterator = c.list({ ...filters, limit: 1 + (pages % 3), cursor });
    const { value: page } = await iterator.next();
    await iterator.return(undefined);
    if (page === undefined) break;
    pages += 1;
    for (const t of page.tasks) {
      ids.push(t.task_id);
      statuses.push(t);
    }
    await between(pages);
    if (page.next_cursor === undefined) break;
    cursor = page.next_cursor;
  }
  return { ids, statuses, pages };
}

function duplicates(ids: string[]): string[] {
  const seen = new Set<string>();
  return ids.filter((id) => {
    if (seen.has(id)) return true;
    seen.add(id);
    return false;
  });
}

/** Listing order: submitted_at desc, then task_id bytes desc. */
function inListingOrder(statuses: TaskStatus[]): boolean {
  for (let i = 1; i < statuses.length; i++) {
    const p = statuses[i - 1] as TaskStatus;
    const q = statuses[i] as TaskStatus;
    if (p.submitted_at < q.submitted_at) return false;
    if (
      p.submitted_at === q.submitted_at &&
      Buffer.compare(Buffer.from(p.task_id), Buffer.from(q.task_id)) <= 0
    ) {
      return false;
    }
  }
  return true;
}

describe('list walks filtered by state, queue and time while tasks change state', () => {
  it('state=queued and state=succeeded walks: every task that matched throughout is listed once, while a worker claims, retries and settles tasks of the same labels', async () => {
    const ca = clientOf(a.url);
    const cb = clientOf(b.url);
    const labels = { walk: 'r46d-state' };
    const idle = 'r46d-idle'; // no worker: its tasks stay queued
    const busy = 'r46d-busy';
    const stableQueued: string[] = [];
    const busyIds: string[] = [];
    // Interleave idle and busy tasks, singles and batches (batches share one submitted_at).
    for (let round = 0; round < 6; round++) {
      const batch = await ca.submitBatch([
        ...Array.from({ length: 4 }, (_, i) => ({ queue: idle, program: 'p', data: i, labels })),
        ...Array.from({ length: 4 }, (_, i) => ({
          queue: busy,
          program: 'flaky',
          data: i,
          labels,
          retry: { max_attempts: 5, delay_ms: 0 },
        })),
      ]);
      for (const t of batch) {
        if (t instanceof Error) throw t;
        (t.input.queue === idle ? stableQueued : busyIds).push(t.task_id);
      }
      stableQueued.push((await cb.submit({ queue: idle, program: 'p', labels })).task_id);
      busyIds.push(
        (
          await cb.submit({
            queue: busy,
            program: 'flaky',
            labels,
            retry: { max_attempts: 5, delay_ms: 0 },
          })
        ).task_id,
      );
    }
    // A worker on each replica: each task fails its first attempt, then succeeds.
    const workers: Worker[] = [a, b].map((s) =>
      shortWorker(s.url, busy, { concurrency: 2, pollWaitMs: 200 }),
    );
    for (const w of workers) {
      w.register('flaky', async (data, ctx) => {
        if (ctx.attempt === 1) throw new Error('first try fails');
        return data;
      });
    }
    const running = workers.map((w) => w.run());
    try {
      // The first busy tasks succeed before the walks: they are succeeded throughout.
      const stableSucceeded = busyIds.slice(0, 20);
      for (const id of stableSucceeded) {
        let r = await ca.result(id, { waitMs: 5_000 });
        while (r.outcome.state === 'pending') r = await ca.result(id, { waitMs: 5_000 });
        expect(r.outcome.state).toBe('succeeded');
      }
      // Churn between pages: new busy tasks (claimed, retried, settled by the workers while
      // the walk goes on) and cancels of freshly submitted idle tasks.
      let n = 0;
      const churn = async (): Promise<void> => {
        n += 1;
        await ca.submit({
          queue: busy,
          program: 'flaky',
          data: n,
          labels,
          retry: { max_attempts: 5, delay_ms: 0 },
        });
        const fresh = await cb.submit({ queue: idle, program: 'p', data: n, labels });
        if (n % 2 === 0) await ca.cancel(fresh.task_id);
      };

      const queued = await walk(cb, { labels, state: 'queued' }, churn);
      expect(duplicates(queued.ids)).toEqual([]);
      expect(stableQueued.filter((id) => !queued.ids.includes(id))).toEqual([]);
      expect(queued.statuses.filter((s) => s.state !== 'queued')).toEqual([]);
      expect(inListingOrder(queued.statuses)).toBe(true);

      const succeeded = await walk(ca, { labels, state: 'succeeded' }, churn);
      expect(duplicates(succeeded.ids)).toEqual([]);
      expect(stableSucceeded.filter((id) => !succeeded.ids.includes(id))).toEqual([]);
      expect(succeeded.statuses.filter((s) => s.state !== 'succeeded')).toEqual([]);
      expect(inListingOrder(succeeded.statuses)).toBe(true);
      expect(succeeded.pages).toBeGreaterThan(5);
    } finally {
      await Promise.all(workers.map((w) => w.stop({ graceMs: 1_000 })));
      await Promise.all(running);
    }
  }, 120_000);

  it('submitted_from (inclusive) and submitted_until (exclusive) at the exact submitted_at of a batch, while the tasks inside are cancelled mid-walk', async () => {
    const c = clientOf(a.url);
    const labels = { walk: 'r46d-time' };
    const queue = 'r46d-time';
    const groups: { at: number; ids: string[] }[] = [];
    for (let g = 0; g < 5; g++) {
      const batch = await c.submitBatch(
        Array.from({ length: 5 }, (_, i) => ({ queue, program: 'p', data: [g, i], labels })),
      );
      const ids = batch.map((t) => {
        if (t instanceof Error) throw t;
        return t.task_id;
      });
      const at = (batch[0] as TaskSnapshot).submitted_at;
      for (const t of batch) expect((t as TaskSnapshot).submitted_at).toBe(at);
      groups.push({ at, ids });
    }
    // Distinct submission times per group (a later batch gets a later store time, or the same).
    const from = groups[1] as { at: number; ids: string[] };
    const until_ = groups[3] as { at: number; ids: string[] };
    expect(from.at).toBeLessThan(until_.at);
    const expected = groups
      .filter((g) => g.at >= from.at && g.at < until_.at)
      .flatMap((g) => g.ids)
      .sort();
    expect(expected).toEqual(expect.arrayContaining([...from.ids]));
    // Cancel every listed-or-not task of the range mid-walk, and submit more (later times).
    const toCancel = [...expected];
    const result = await walk(
      c,
      { labels, queue, submitted_from: from.at, submitted_until: until_.at },
      async () => {
        const id = toCancel.shift();
        if (id !== undefined) await c.cancel(id);
        await c.submit({ queue, program: 'p', labels });
      },
    );
    expect(duplicates(result.ids)).toEqual([]);
    expect([...result.ids].sort()).toEqual(expected);
    expect(inListingOrder(result.statuses)).toBe(true);
    for (const s of result.statuses) {
      expect(s.submitted_at).toBeGreaterThanOrEqual(from.at);
      expect(s.submitted_at).toBeLessThan(until_.at);
    }
  }, 60_000);
});

describe('single reads under churn', () => {
  it('status, result and snapshot each answer one moment, and successive reads on two replicas never go back', async () => {
    const ca = clientOf(a.url);
    const cb = clientOf(b.url);
    const queue = 'r46d-reads';
    const ids: string[] = [];
    for (let i = 0; i < 24; i++) {
      ids.push(
        (
          await ca.submit({
            queue,
            program: 'flaky',
            data: i,
            retry: { max_attempts: 4, delay_ms: 0 },
          })
        ).task_id,
      );
    }
    const workers = [a, b].map((s) =>
      shortWorker(s.url, queue, { concurrency: 3, pollWaitMs: 200 }),
    );
    for (const w of workers) {
      w.register('flaky', async (data, ctx) => {
        const n = data as number;
        if (ctx.attempt < 1 + (n % 3)) throw new Error('again');
        if (n % 5 === 0) throw Object.assign(new Error('final'), { retryable: false });
        return n;
      });
    }
    const running = workers.map((w) => w.run());
    const problems: string[] = [];
    const rank = { queued: 0, active: 0, succeeded: 1, failed: 1, cancelled: 1 } as const;
    try {
      let done = false;
      const readers = ids.map(async (id, i) => {
        let lastCount = 0;
        let wasTerminal = false;
        let lastTerminal: unknown = null;
        if (i % 4 === 3) {
          // Some are cancelled while running.
          await ca.cancel(id);
        }
        while (!done) {
          const c = (i + lastCount) % 2 === 0 ? ca : cb;
          const which = lastCount % 3;
          let state: string;
          let count: number;
          let terminalAt: number | null;
          if (which === 0) {
            const s: TaskStatus = await c.status(id);
            state = s.state;
            count = s.attempt_count;
            terminalAt = s.terminal_at;
          } else if (which === 1) {
            const r: TaskResult = await c.result(id);
            state = r.status.state;
            count = r.status.attempt_count;
            terminalAt = r.status.terminal_at;
            const pending = r.outcome.state === 'pending';
            if (pending === TERMINAL.has(state)) {
              problems.push(`${id}: result outcome ${r.outcome.state} with status ${state}`);
            }
            if (!pending && r.outcome.state !== state) {
              problems.push(`${id}: outcome ${r.outcome.state} vs status ${state}`);
            }
          } else {
            const s: TaskSnapshot = await c.snapshot(id);
            state = s.state;
            count = s.attempt_count;
            terminalAt = s.terminal_at;
            if ((s.current_attempt_id !== null) !== (state === 'active')) {
              problems.push(`${id}: snapshot ${state} with current ${s.current_attempt_id}`);
            }
            if (state === 'active' && count < 1) problems.push(`${id}: active with no attempt`);
          }
          if ((terminalAt !== null) !== TERMINAL.has(state)) {
            problems.push(`${id}: ${state} with terminal_at ${terminalAt}`);
          }
          if (count < lastCount) problems.push(`${id}: attempt_count ${lastCount} → ${count}`);
          if (wasTerminal && rank[state as keyof typeof rank] === 0) {
            problems.push(`${id}: terminal then ${state}`);
          }
          if (wasTerminal && TERMINAL.has(state) && terminalAt !== lastTerminal) {
            problems.push(`${id}: terminal_at changed ${lastTerminal} → ${terminalAt}`);
          }
          lastCount = Math.max(lastCount, count);
          if (TERMINAL.has(state)) {
            wasTerminal = true;
            lastTerminal = terminalAt;
          }
          if (wasTerminal && lastCount > 0 && which === 2) return;
        }
      });
      await until(
        async () => {
          for (const id of ids) if (!TERMINAL.has((await ca.status(id)).state)) return false;
          return true;
        },
        60_000,
        'every task terminal',
      );
      done = true;
      await Promise.all(readers);
    } finally {
      await Promise.all(workers.map((w) => w.stop({ graceMs: 1_000 })));
      await Promise.all(running);
    }
    expect(problems).toEqual([]);
  }, 120_000);
});
