/**
 * The order and timing in which queued tasks are handed out (DESIGN §4 `priority`,
 * `available_at`, `concurrency_key`; §5 Acquire, Settle, Cancel, Lease expiry): behaviour that
 * holds, kept as tests. Priority and FIFO over the single and batch acquire paths, delayed tasks
 * and retry backoff at store time, where a retried task queues, concurrency keys beside priority
 * (no head-of-line blocking, limits under concurrent claimers, tasks of one key declaring
 * different limits), queue and scope isolation, and parked polls meeting due, retried and
 * cancelled delayed tasks. Real PostgreSQL, the harness's movable store clock.
 */
import {
  type AcquireCommand,
  type AcquireReply,
  type Assignment,
  MAX_SUBMIT_BATCH,
  retryDelayMs,
  type Scope,
  type SubmitTask,
} from '@ledgence/contracts';
import { createTaskService, type TaskService } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
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
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
beforeAll(async () => {
  h = await harness('ordering');
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
});
afterAll(async () => {
  await wake.close();
  await h.close();
});

const OTHER_NAMESPACE: Scope = { tenant_id: SCOPE.tenant_id, namespace: 'staging' };
const OTHER_TENANT: Scope = { tenant_id: 'globex', namespace: SCOPE.namespace };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function session(queue: string, concurrency = 1, scope: Scope = SCOPE) {
  return h.store.openSession({ scope, queue, concurrency });
}

async function submit(key: string, input: Partial<SubmitTask> = {}): Promise<string> {
  return (await h.store.submit(submitCommand(key, input))).snapshot.task_id;
}

/** Submits `count` tasks of `input` in submit batches; their ids in submission order. */
async function submitMany(prefix: string, count: number, input: Partial<SubmitTask>) {
  const ids: string[] = [];
  for (let start = 0; start < count; start += MAX_SUBMIT_BATCH) {
    const commands = Array.from({ length: Math.min(MAX_SUBMIT_BATCH, count - start) }, (_, i) =>
      submitCommand(`${prefix}-${start + i}`, input),
    );
    for (const result of await h.store.submitBatch(commands)) {
      if (!result.ok) throw result.error;
      ids.push(result.value.snapshot.task_id);
    }
  }
  return ids;
}

/** The task id a reply assigned, or its disposition. */
function taskOf(reply: AcquireReply): string {
  return reply.disposition === 'assigned'
    ? reply.assignment.lease.owner.task_id
    : reply.disposition;
}

function assignmentOf(reply: AcquireReply): Assignment {
  if (reply.disposition !== 'assigned')
    throw new Error(`expected an assignment, got ${reply.disposition}`);
  return reply.assignment;
}

async function poll(command: AcquireCommand, store: PostgresTaskStore = h.store) {
  return (await store.acquire(command, { recordEmpty: true })).reply;
}

async function pollBatch(commands: AcquireCommand[], store: PostgresTaskStore = h.store) {
  return (await store.acquireBatch(commands, { recordEmpty: true })).map((r) => {
    if (!r.ok) throw r.error;
    return r.value.reply;
  });
}

/** Moves the store clock so that it reads about `at` (plus the real time the next calls take). */
async function advanceTo(at: number): Promise<void> {
  const now = await h.store.now();
  if (at > now) h.advance(at - now);
}

async function claimedAt(taskId: string, scope: Scope = SCOPE): Promise<number[]> {
  return (await h.store.history(scope, taskId, 0))
    .filter((e) => e.event.reason === 'claimed')
    .map((e) => e.event.at);
}

function service(rescanIntervalMs: number): TaskService {
  return createTaskService({ store: h.store, wake, rescanIntervalMs, longPollMaxMs: 20_000 });
}

describe('priority and FIFO', () => {
  it('priority desc over the full range, FIFO within a priority, whether single polls or batches take them', async () => {
    const queue = 'rev-prio-mixed';
    const priorities = [0, 100, -100, 0, 1, -1, 100, 0, -100, 1, 0, 100, -1, 0, 1];
    // Two submit batches: within one, tasks share available_at and the task id decides; the
    // second batch's are available later.
    const submitted: { id: string; priority: number }[] = [];
    for (const part of [priorities.slice(0, 8), priorities.slice(8)]) {
      const offset = submitted.length;
      const results = await h.store.submitBatch(
        part.map((priority, i) => submitCommand(`rev-pm-${offset + i}`, { queue, priority })),
      );
      for (const [i, result] of results.entries()) {
        if (!result.ok) throw result.error;
        submitted.push({ id: result.value.snapshot.task_id, priority: part[i] as number });
      }
    }
    // A stable sort keeps submission order within a priority: FIFO.
    const expected = [...submitted].sort((a, b) => b.priority - a.priority).map((t) => t.id);
    const s = await session(queue, priorities.length);
    const slots = (from: number, to: number) =>
      Array.from({ length: to - from }, (_, i) => acquireCommand(s.id, from + i, 1, queue));
    const got: string[] = [];
    got.push(taskOf(await poll(acquireCommand(s.id, 0, 1, queue))));
    got.push(...(await pollBatch(slots(1, 4))).map(taskOf));
    got.push(taskOf(await poll(acquireCommand(s.id, 4, 1, queue))));
    got.push(...(await pollBatch(slots(5, 10))).map(taskOf));
    got.push(taskOf(await poll(acquireCommand(s.id, 10, 1, queue))));
    got.push(...(await pollBatch(slots(11, 15))).map(taskOf));
    expect(got).toEqual(expected);
  });

  it('within one batch the polls get the best tasks in request order, whatever their consumer ids', async () => {
    const queue = 'rev-prio-batch';
    const low = await submit('rev-pb-1', { queue, priority: 1 });
    const top = await submit('rev-pb-4', { queue, priority: 4 });
    const mid = await submit('rev-pb-2', { queue, priority: 2 });
    const high = await submit('rev-pb-3', { queue, priority: 3 });
    const s = await session(queue, 4);
    const other = await session(queue, 1);
    const replies = await pollBatch([
      acquireCommand(s.id, 2, 1, queue),
      acquireCommand(other.id, 0, 1, queue),
      acquireCommand(s.id, 3, 1, queue),
      acquireCommand(s.id, 0, 1, queue),
      acquireCommand(s.id, 1, 1, queue),
    ]);
    expect(replies.map(taskOf)).toEqual([top, high, mid, low, 'empty']);
  });
});

describe('delayed tasks', () => {
  it('a delayed task is not handed out before store time reaches its available_at, and is after', async () => {
    const queue = 'rev-delay';
    const { snapshot } = await h.store.submit(
      submitCommand('rev-delay', { queue, delay_ms: 30_000, priority: 100 }),
    );
    expect(snapshot.available_at - snapshot.submitted_at).toBe(30_000);
    const s = await session(queue, 1);
    expect(taskOf(await poll(acquireCommand(s.id, 0, 1, queue)))).toBe('empty');
    // Margins of seconds: real time passes too between moving the clock and polling.
    await advanceTo(snapshot.available_at - 5_000);
    expect(taskOf(await poll(acquireCommand(s.id, 0, 2, queue)))).toBe('empty');
    await advanceTo(snapshot.available_at);
    expect(taskOf(await poll(acquireCommand(s.id, 0, 3, queue)))).toBe(snapshot.task_id);
    const [at] = await claimedAt(snapshot.task_id);
    expect(at).toBeGreaterThanOrEqual(snapshot.available_at);
  });

  it('tasks coming due are handed out by priority, then by due time, not by submission order', async () => {
    const queue = 'rev-due';
    const lateHigh = await submit('rev-due-late-high', { queue, delay_ms: 30_000, priority: 5 });
    const midLow = await submit('rev-due-mid-low', { queue, delay_ms: 20_000 });
    const earlyLow = await submit('rev-due-early-low', { queue, delay_ms: 10_000 });
    const base = await h.store.now();
    const s = await session(queue, 6);
    await advanceTo(base + 15_000);
    expect(taskOf(await poll(acquireCommand(s.id, 0, 1, queue)))).toBe(earlyLow);
    expect(taskOf(await poll(acquireCommand(s.id, 1, 1, queue)))).toBe('empty');
    await advanceTo(base + 35_000);
    // Submitted now, available now: after every task that came due before it.
    const fresh = await submit('rev-due-fresh', { queue });
    const got = await pollBatch([
      acquireCommand(s.id, 2, 1, queue),
      acquireCommand(s.id, 3, 1, queue),
      acquireCommand(s.id, 4, 1, queue),
      acquireCommand(s.id, 5, 1, queue),
    ]);
    expect(got.map(taskOf)).toEqual([lateHigh, midLow, fresh, 'empty']);
  });

  it('a delayed task cancelled while it waits is never handed out once its time has passed', async () => {
    const queue = 'rev-delay-cancel';
    const { snapshot } = await h.store.submit(
      submitCommand('rev-delay-cancel', { queue, delay_ms: 1_000 }),
    );
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    await advanceTo(snapshot.available_at + 1_000);
    const s = await session(queue, 1);
    expect(taskOf(await poll(acquireCommand(s.id, 0, 1, queue)))).toBe('empty');
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('cancelled');
  });
});

describe('retries', () => {
  /** Claims the only available task of `queue` on a fresh session and grants it dispatch. */
  async function claimAndDispatch(queue: string): Promise<Assignment> {
    const s = await session(queue, 1);
    const a = assignmentOf(await poll(acquireCommand(s.id, 0, 1, queue)));
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    return a;
  }

  it('a failed attempt with a fixed delay is retried at store time settle + delay, not before', async () => {
    const queue = 'rev-retry-fixed';
    const id = await submit('rev-retry-fixed', {
      queue,
      retry: { max_attempts: 3, delay_ms: 20_000 },
    });
    const a = await claimAndDispatch(queue);
    await h.store.settle(failureCommand(a, 'rev-rf-1'));
    const snapshot = await h.store.inspect(SCOPE, id);
    const scheduled = (await h.store.history(SCOPE, id, 0)).find(
      (e) => e.event.reason === 'retry_scheduled',
    );
    expect(snapshot.state).toBe('queued');
    expect(snapshot.available_at).toBe((scheduled?.event.at ?? 0) + 20_000);
    const s = await session(queue, 1);
    await advanceTo(snapshot.available_at - 5_000);
    expect(taskOf(await poll(acquireCommand(s.id, 0, 1, queue)))).toBe('empty');
    await advanceTo(snapshot.available_at);
    expect(taskOf(await poll(acquireCommand(s.id, 0, 2, queue)))).toBe(id);
    const claims = await claimedAt(id);
    expect(claims).toHaveLength(2);
    expect(claims[1]).toBeGreaterThanOrEqual(snapshot.available_at);
  });

  it('exponential backoff: the retry is due after the deterministic full-jitter delay of the failed attempt', async () => {
    const queue = 'rev-retry-exp';
    const policy = {
      max_attempts: 4,
      delay_ms: 1_000,
      backoff: 'exponential' as const,
      max_delay_ms: 8_000,
    };
    const id = await submit('rev-retry-exp', { queue, retry: policy });
    const due: number[] = [];
    for (let attempt = 1; attempt <= 2; attempt += 1) {
      const before = await h.store.inspect(SCOPE, id);
      await advanceTo(before.available_at);
      const a = await claimAndDispatch(queue);
      await h.store.settle(failureCommand(a, `rev-re-${attempt}`));
      const after = await h.store.inspect(SCOPE, id);
      const scheduled = (await h.store.history(SCOPE, id, 0))
        .filter((e) => e.event.reason === 'retry_scheduled')
        .at(-1);
      due.push(after.available_at - (scheduled?.event.at ?? 0));
      expect(after.available_at - (scheduled?.event.at ?? 0)).toBe(
        retryDelayMs(policy, attempt, [after.run_id, id]),
      );
    }
    // Within the doubling caps 1 000 and 2 000 of the first two failed attempts.
    expect(due[0]).toBeGreaterThanOrEqual(1);
    expect(due[0]).toBeLessThanOrEqual(1_000);
    expect(due[1]).toBeLessThanOrEqual(2_000);
  });

  it('a retried task queues by its retry time: behind every task available before it, ahead of later ones', async () => {
    const queue = 'rev-retry-place';
    const retried = await submit('rev-rp-retried', {
      queue,
      retry: { max_attempts: 3, delay_ms: 10_000 },
    });
    const a = await claimAndDispatch(queue);
    const before = await submit('rev-rp-before', { queue });
    await h.store.settle(failureCommand(a, 'rev-rp'));
    const failedAt = await h.store.now();
    await advanceTo(failedAt + 5_000);
    const during = await submit('rev-rp-during', { queue });
    await advanceTo(failedAt + 15_000);
    const after = await submit('rev-rp-after', { queue });
    const s = await session(queue, 5);
    const got = await pollBatch(
      Array.from({ length: 5 }, (_, c) => acquireCommand(s.id, c, 1, queue)),
    );
    // DESIGN §5 orders by available_at: a retry does not keep its first place in line.
    expect(got.map(taskOf)).toEqual([before, during, retried, after, 'empty']);
  });

  it('a task re-queued by lease expiry queues by its new available_at (the retry delay after recovery)', async () => {
    const queue = 'rev-retry-lost';
    const lost = await submit('rev-rl-lost', { queue, retry: { max_attempts: 3, delay_ms: 0 } });
    const s = await session(queue, 1);
    // Claimed and never granted dispatch: the attempt will not count against max_attempts.
    assignmentOf(await poll(acquireCommand(s.id, 0, 1, queue)));
    const before = await submit('rev-rl-before', { queue });
    h.advance(CONFIG.leaseDurationMs + 100);
    expect((await h.store.recoverExpiredLeases()).recovered).toBeGreaterThanOrEqual(1);
    const after = await submit('rev-rl-after', { queue });
    const snapshot = await h.store.inspect(SCOPE, lost);
    expect(snapshot.state).toBe('queued');
    const s2 = await session(queue, 3);
    const got = await pollBatch(
      Array.from({ length: 3 }, (_, c) => acquireCommand(s2.id, c, 1, queue)),
    );
    expect(got.map(taskOf)).toEqual([before, lost, after]);
  });
});

describe('concurrency keys beside priority', () => {
  it('a key at its limit holds back neither other keys nor unkeyed tasks, however many of its tasks rank first (single polls)', async () => {
    const queue = 'rev-hol-single';
    const hot = await submitMany('rev-hs-hot', 300, {
      queue,
      priority: 100,
      concurrency_key: 'rev-hs-hot',
    });
    const other = await submit('rev-hs-other', {
      queue,
      priority: -100,
      concurrency_key: 'rev-hs-aaa',
    });
    const plain = await submit('rev-hs-plain', { queue, priority: -50 });
    const s = await session(queue, 5);
    const first = await poll(acquireCommand(s.id, 0, 1, queue));
    expect(taskOf(first)).toBe(hot[0]);
    expect(taskOf(await poll(acquireCommand(s.id, 1, 1, queue)))).toBe(plain);
    expect(taskOf(await poll(acquireCommand(s.id, 2, 1, queue)))).toBe(other);
    expect(taskOf(await poll(acquireCommand(s.id, 3, 1, queue)))).toBe('empty');
    await h.store.settle(successCommand(assignmentOf(first), 'rev-hs-done'));
    expect(taskOf(await poll(acquireCommand(s.id, 4, 1, queue)))).toBe(hot[1]);
  });

  it('the same in one batch: the blocked key’s backlog does not leave the batch’s other slots empty', async () => {
    const queue = 'rev-hol-batch';
    const hot = await submitMany('rev-hb-hot', 40, {
      queue,
      priority: 100,
      concurrency_key: 'rev-hb-hot',
    });
    // A key sorting above the hot one (see claim-eligible.int.test.ts for below).
    const other = await submit('rev-hb-other', {
      queue,
      priority: -100,
      concurrency_key: 'rev-hb-zzz',
    });
    const plain = await submit('rev-hb-plain', { queue, priority: -50 });
    const s = await session(queue, 4);
    const got = await pollBatch(
      Array.from({ length: 4 }, (_, c) => acquireCommand(s.id, c, 1, queue)),
    );
    expect(got.map(taskOf)).toEqual([hot[0], plain, other, 'empty']);
  });

  it('keys of several limits with mixed priorities: no limit exceeded under 4 stores claiming in batches, every task claimed once', async () => {
    const queue = 'rev-keys-race';
    const limits: Record<string, number> = { 'rev-kr-1': 1, 'rev-kr-2': 2, 'rev-kr-3': 3 };
    const keyOf = new Map<string, string | null>();
    const keys = [...Object.keys(limits), null];
    const commands = Array.from({ length: 120 }, (_, i) => {
      const key = keys[i % keys.length] ?? null;
      return submitCommand(`rev-kr-${i}`, {
        queue,
        priority: (i * 7) % 5,
        ...(key === null ? {} : { concurrency_key: key, concurrency_limit: limits[key] }),
      });
    });
    for (const [i, result] of (await h.store.submitBatch(commands)).entries()) {
      if (!result.ok) throw result.error;
      keyOf.set(result.value.snapshot.task_id, commands[i]?.input.concurrency_key ?? null);
    }
    // Held from the reply (after the claim committed) until the settle is sent (before it
    // commits): inside the span the store holds the slot, so a count above the limit here is
    // one in the store.
    const holding = new Map<string, number>();
    let maxOver = 0;
    const claimed: string[] = [];
    const stores = Array.from({ length: 4 }, () => h.makeStore(1));
    await Promise.all(
      stores.map(async (store, n) => {
        const s = await store.openSession({ scope: SCOPE, queue, concurrency: 3 });
        let sequence = 0;
        let idle = 0;
        while (idle < 30 && claimed.length < commands.length) {
          sequence += 1;
          const replies = await pollBatch(
            [0, 1, 2].map((c) => acquireCommand(s.id, c, sequence, queue)),
            store,
          );
          const assignments = replies.filter((r) => r.disposition === 'assigned').map(assignmentOf);
          if (assignments.length === 0) {
            idle += 1;
            await sleep(2);
            continue;
          }
          idle = 0;
          for (const a of assignments) {
            const id = a.lease.owner.task_id;
            claimed.push(id);
            const key = keyOf.get(id);
            if (key == null) continue;
            const count = (holding.get(key) ?? 0) + 1;
            holding.set(key, count);
            maxOver = Math.max(maxOver, count - (limits[key] ?? 0));
          }
          await sleep((n + sequence) % 3);
          for (const a of assignments) {
            const key = keyOf.get(a.lease.owner.task_id);
            if (key != null) holding.set(key, (holding.get(key) ?? 0) - 1);
          }
          for (const r of await store.settleBatch(
            assignments.map((a) => successCommand(a, `rev-kr-${a.lease.owner.attempt_id}`)),
          )) {
            if (!r.ok) throw r.error;
          }
        }
      }),
    );
    await Promise.all(stores.map((s) => s.close()));
    expect(maxOver).toBeLessThanOrEqual(0);
    expect(claimed).toHaveLength(commands.length);
    expect(new Set(claimed).size).toBe(commands.length);
    const rows = await h.sql`select concurrency_key, active from concurrency_keys
      where concurrency_key like 'rev-kr-%' order by 1`;
    expect(rows.map((r) => Number(r.active))).toEqual([0, 0, 0]);
  });

  it('tasks of one key declaring different limits: each claim compares the key’s active count with the claiming task’s own limit', async () => {
    // DESIGN §4 does not say what a key's limit is when its tasks disagree. What the store does:
    // the key row counts active tasks only, and a claim is admitted while that count is below
    // the limit of the task being claimed — so a task submitted as a mutex (limit 1) can run
    // beside a task that declared a larger limit, and a later limit-1 task waits for the key
    // to be empty.
    const queue = 'rev-limit-change';
    const key = 'rev-lc';
    const mutex = await submit('rev-lc-a', { queue, concurrency_key: key, concurrency_limit: 1 });
    const wider = await submit('rev-lc-b', { queue, concurrency_key: key, concurrency_limit: 2 });
    const mutex2 = await submit('rev-lc-c', { queue, concurrency_key: key, concurrency_limit: 1 });
    const widest = await submit('rev-lc-d', { queue, concurrency_key: key, concurrency_limit: 3 });
    const s = await session(queue, 5);
    const a = await poll(acquireCommand(s.id, 0, 1, queue));
    const b = await poll(acquireCommand(s.id, 1, 1, queue));
    const d = await poll(acquireCommand(s.id, 2, 1, queue));
    expect([a, b, d].map(taskOf)).toEqual([mutex, wider, widest]);
    expect(taskOf(await poll(acquireCommand(s.id, 3, 1, queue)))).toBe('empty');
    for (const [n, reply] of [a, b].entries()) {
      await h.store.settle(successCommand(assignmentOf(reply), `rev-lc-${n}`));
    }
    // One task (d) still active: the limit-1 task waits until the key is empty.
    expect(taskOf(await poll(acquireCommand(s.id, 3, 2, queue)))).toBe('empty');
    await h.store.settle(successCommand(assignmentOf(d), 'rev-lc-d'));
    expect(taskOf(await poll(acquireCommand(s.id, 3, 3, queue)))).toBe(mutex2);
  });

  it('a key is shared by the queues of one namespace, and by nothing outside it', async () => {
    const key = 'rev-shared';
    const firstQueue = await submit('rev-sh-1', {
      queue: 'rev-sh-a',
      concurrency_key: key,
    });
    const sameNs = await submit('rev-sh-2', { queue: 'rev-sh-b', concurrency_key: key });
    const otherNs = (
      await h.store.submit(
        submitCommand('rev-sh-3', { ...OTHER_NAMESPACE, queue: 'rev-sh-b', concurrency_key: key }),
      )
    ).snapshot.task_id;
    const otherTenant = (
      await h.store.submit(
        submitCommand('rev-sh-4', { ...OTHER_TENANT, queue: 'rev-sh-b', concurrency_key: key }),
      )
    ).snapshot.task_id;
    const a = await session('rev-sh-a');
    const b = await session('rev-sh-b');
    const bNs = await session('rev-sh-b', 1, OTHER_NAMESPACE);
    const bTenant = await session('rev-sh-b', 1, OTHER_TENANT);
    expect(taskOf(await poll(acquireCommand(a.id, 0, 1, 'rev-sh-a')))).toBe(firstQueue);
    const got = await pollBatch([
      acquireCommand(b.id, 0, 1, 'rev-sh-b'),
      acquireCommand(bNs.id, 0, 1, 'rev-sh-b', OTHER_NAMESPACE),
      acquireCommand(bTenant.id, 0, 1, 'rev-sh-b', OTHER_TENANT),
    ]);
    expect(got.map(taskOf)).toEqual(['empty', otherNs, otherTenant]);
    expect((await h.store.status(SCOPE, sameNs)).state).toBe('queued');
  });
});

describe('queue and scope isolation', () => {
  it('one store batch over sessions of two queues and three scopes: each poll gets its own queue’s task in its own scope', async () => {
    const scopes = [SCOPE, OTHER_NAMESPACE, OTHER_TENANT];
    const own = new Map<string, string>();
    for (const scope of scopes) {
      for (const queue of ['rev-iso-a', 'rev-iso-b']) {
        // Decoys: better tasks on a queue nobody polls, in every scope.
        await h.store.submit(
          submitCommand(`rev-iso-decoy-${scope.namespace}-${scope.tenant_id}-${queue}`, {
            ...scope,
            queue: 'rev-iso-none',
            priority: 100,
          }),
        );
        const { snapshot } = await h.store.submit(
          submitCommand(`rev-iso-${scope.namespace}-${scope.tenant_id}-${queue}`, {
            ...scope,
            queue,
            priority: queue === 'rev-iso-a' ? 0 : 50,
          }),
        );
        own.set(`${scope.tenant_id}/${scope.namespace}/${queue}`, snapshot.task_id);
      }
    }
    const polls: AcquireCommand[] = [];
    const expected: string[] = [];
    for (const scope of scopes) {
      for (const queue of ['rev-iso-a', 'rev-iso-b']) {
        const s = await session(queue, 2, scope);
        polls.push(
          acquireCommand(s.id, 0, 1, queue, scope),
          acquireCommand(s.id, 1, 1, queue, scope),
        );
        expected.push(own.get(`${scope.tenant_id}/${scope.namespace}/${queue}`) ?? '', 'empty');
      }
    }
    const replies = await pollBatch(polls);
    expect(replies.map(taskOf)).toEqual(expected);
    for (const [i, reply] of replies.entries()) {
      if (reply.disposition !== 'assigned') continue;
      const command = polls[i] as AcquireCommand;
      expect(reply.assignment.event).toMatchObject({
        ldgtenant: command.scope.tenant_id,
        ldgnamespace: command.scope.namespace,
        ldgqueue: command.queue,
      });
    }
  });

  it('a poll naming another queue than its session’s is refused and takes nothing', async () => {
    const id = await submit('rev-iso-wrong', { queue: 'rev-iso-wrong' });
    const s = await session('rev-iso-right');
    expect(await outcomeCode(poll(acquireCommand(s.id, 0, 1, 'rev-iso-wrong')))).toBe(
      'invalid_input',
    );
    expect((await h.store.status(SCOPE, id)).state).toBe('queued');
  });
});

describe('parked polls and due times', () => {
  it('a parked poll gets a delayed task once it is due, never before', async () => {
    const queue = 'rev-park-due';
    const s = await session(queue, 1);
    const { snapshot } = await h.store.submit(
      submitCommand('rev-park-due', { queue, delay_ms: 400 }),
    );
    const reply = await service(100).acquire(acquireCommand(s.id, 0, 1, queue), { waitMs: 10_000 });
    expect(taskOf(reply)).toBe(snapshot.task_id);
    const [at] = await claimedAt(snapshot.task_id);
    expect(at).toBeGreaterThanOrEqual(snapshot.available_at);
  });

  it('a retry coming due is handed to a poll parked before the failure, never before its time', async () => {
    const queue = 'rev-park-retry';
    const id = await submit('rev-park-retry', { queue, retry: { max_attempts: 2, delay_ms: 400 } });
    const first = await session(queue, 1);
    const a = assignmentOf(await poll(acquireCommand(first.id, 0, 1, queue)));
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    const second = await session(queue, 1);
    const parked = service(100).acquire(acquireCommand(second.id, 0, 1, queue), {
      waitMs: 10_000,
    });
    await sleep(100);
    await h.store.settle(failureCommand(a, 'rev-park-retry'));
    const { available_at } = await h.store.inspect(SCOPE, id);
    expect(taskOf(await parked)).toBe(id);
    const claims = await claimedAt(id);
    expect(claims[1]).toBeGreaterThanOrEqual(available_at);
  });

  it('a delayed task cancelled while a poll is parked is never handed to it', async () => {
    const queue = 'rev-park-cancel';
    const s = await session(queue, 1);
    const { snapshot } = await h.store.submit(
      submitCommand('rev-park-cancel', { queue, delay_ms: 1_000 }),
    );
    const parked = service(50).acquire(acquireCommand(s.id, 0, 1, queue), { waitMs: 2_000 });
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    expect(taskOf(await parked)).toBe('empty');
    expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('cancelled');
  });
});
