/**
 * Claim ordering and fairness under concurrency, over raw HTTP on two replicas of
 * one database (DESIGN §4 concurrency_key/limit, priority, delay_ms; §5 Acquire, Settle, Cancel,
 * Lease expiry; §7). Several worker sessions poll one queue at once (single acquire and
 * acquire:batch, with and without wait), settle with success, retryable failure and never
 * (lease expiry), while a canceller cancels queued and active tasks. Checked afterwards from
 * the database: no 5xx reply; per key, the attempts' [claimed_at, finished_at) intervals never
 * overlap more than the key's limit; no claim before the task was due (first attempt: its
 * available_at; a retry: the previous attempt's finish + the fixed delay); no claim after a
 * queued cancel; every key row back to 0.
 */
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { expect, it } from 'vitest';
import { prng, sleep } from './test/harness.js';
import { replicaPair } from './test/replicas.js';
import {
  call,
  openSession,
  pollBody,
  SCOPE,
  settleBody,
  TASKS_BASE,
  taskBody,
} from './test/wire.js';

const pair = replicaPair('claim_fairness', {
  env: { LEDGENCE_LEASE_DURATION_MS: '1000', LEDGENCE_RESCAN_INTERVAL_MS: '100' },
});

const RETRY_DELAY = 300;

interface Stats {
  statuses: Map<number, number>;
  fivexx: string[];
}

function note(stats: Stats, what: string, status: number, body: unknown): void {
  stats.statuses.set(status, (stats.statuses.get(status) ?? 0) + 1);
  if (status >= 500) stats.fivexx.push(`${what} ${status} ${JSON.stringify(body).slice(0, 300)}`);
}

/** Until no task of `queue` is queued or active (read from the database), or 60 s. */
async function untilSettled(queue: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const [row] = await pair.sql`
      select count(*)::int as open from tasks
      where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace} and queue = ${queue}
        and state in ('queued', 'active')`;
    if (Number(row?.open) === 0 || Date.now() > deadline) return;
    await sleep(100);
  }
}

it('many sessions on one queue with keys, priorities, delays, retries, cancels: limits, due times and cancels hold, no 5xx', async () => {
  const queue = 'cf-mix';
  const P = 'cf-';
  const LIMITS: Record<string, number> = { [`${P}k1`]: 1, [`${P}k2`]: 2, [`${P}k3`]: 3 };
  const keys = [...Object.keys(LIMITS), null];
  const rand = prng(54);
  const stats: Stats = { statuses: new Map(), fivexx: [] };
  const urls = [pair.a.url, pair.b.url];

  // Tasks: keyed and unkeyed, priorities -2..2, a quarter delayed 200..800 ms, fixed retries.
  const N = 160;
  const bodies = Array.from({ length: N }, (_, i) => {
    const key = keys[i % keys.length] as string | null;
    const extra: Record<string, unknown> = {
      priority: Math.floor(rand() * 5) - 2,
      retry: { max_attempts: 3, delay_ms: RETRY_DELAY },
      data: { i, fail: rand() < 0.3, abandon: rand() < 0.05 },
    };
    if (key !== null) {
      extra.concurrency_key = key;
      extra.concurrency_limit = LIMITS[key];
    }
    if (rand() < 0.25) extra.delay_ms = 200 + Math.floor(rand() * 600);
    return taskBody(`${P}${i}`, queue, extra);
  });
  const ids: string[] = [];
  // Half in batches through A, half one by one through B.
  const batch = bodies.slice(0, N / 2);
  const reply = await call<{ results: { task_id?: string }[] }>(
    pair.a.url,
    `${TASKS_BASE}/tasks:batch`,
    { commands: batch },
  );
  note(stats, 'submit:batch', reply.status, reply.body);
  for (const r of reply.body.results) ids.push(r.task_id as string);
  await Promise.all(
    bodies.slice(N / 2).map(async (b) => {
      const r = await call<{ task_id: string }>(pair.b.url, `${TASKS_BASE}/tasks`, b);
      note(stats, 'submit', r.status, r.body);
      ids.push(r.body.task_id);
    }),
  );

  let stop = false;
  const cancelled = new Set<string>();

  async function runAssignment(
    url: string,
    a: Assignment,
    data: { fail: boolean; abandon: boolean },
  ) {
    const owner = a.lease.owner;
    if (data.abandon && rand() < 0.5) {
      return; // never renewed: the lease expires, the task is re-queued
    }
    const renew = await call<{ dispatch_allowed: boolean; cancel_requested: boolean }>(
      url,
      '/v1/worker/renew',
      { owner, sequence: 1, intent: 'dispatch' },
    );
    note(stats, 'renew', renew.status, renew.body);
    await sleep(Math.floor(rand() * 25));
    const attempt = (a.event as { ldgattempt: number }).ldgattempt;
    const outcome =
      data.fail && attempt === 1
        ? { kind: 'application_error', error: { code: 'flaky', message: 'again' } }
        : { kind: 'success', output: { ok: true } };
    const settle = await call(url, '/v1/worker/settle', settleBody(a, outcome));
    note(stats, 'settle', settle.status, settle.body);
  }

  async function poller(w: number) {
    const url = urls[w % 2] as string;
    const slots = 1 + (w % 3);
    const session = await openSession(url, queue, slots);
    const seq = Array.from({ length: slots }, () => 0);
    const useBatch = w % 2 === 0;
    while (!stop) {
      const wait = rand() < 0.5 ? 0 : 200;
      const assignments: Assignment[] = [];
      if (useBatch) {
        const commands = seq.map((s, slot) => pollBody(session, queue, slot, s + 1));
        const r = await call<{ replies: (AcquireReply | { status: number })[] }>(
          url,
          `/v1/worker/acquire:batch?wait_ms=${wait}`,
          { commands },
        );
        note(stats, 'acquire:batch', r.status, r.body);
        if (r.status !== 200) continue;
        r.body.replies.forEach((item, slot) => {
          if ('disposition' in item) {
            seq[slot] = (seq[slot] as number) + 1;
            if (item.disposition === 'assigned') assignments.push(item.assignment);
          } else if ((item as { status: number }).status >= 500) {
            stats.fivexx.push(`acquire:batch item ${JSON.stringify(item)}`);
          }
        });
      } else {
        for (let slot = 0; slot < slots; slot += 1) {
          const r = await call<AcquireReply>(
            url,
            `/v1/worker/acquire?wait_ms=${wait}`,
            pollBody(session, queue, slot, (seq[slot] as number) + 1),
          );
          note(stats, 'acquire', r.status, r.body);
          if (r.status !== 200) continue;
          seq[slot] = (seq[slot] as number) + 1;
          if (r.body.disposition === 'assigned') assignments.push(r.body.assignment);
        }
      }
      await Promise.all(
        assignments.map((a) => {
          const d = (a.event as { data: { fail: boolean; abandon: boolean } }).data;
          return runAssignment(url, a, d);
        }),
      );
    }
  }

  async function canceller() {
    while (!stop) {
      await sleep(15);
      const id = ids[Math.floor(rand() * ids.length)] as string;
      if (cancelled.has(id) || rand() < 0.6) continue;
      cancelled.add(id);
      const url = urls[Math.floor(rand() * 2)] as string;
      const r = await call(url, `${TASKS_BASE}/tasks/${id}/cancel`, {});
      note(stats, 'cancel', r.status, r.body);
    }
  }

  const workers = Array.from({ length: 6 }, (_, w) => poller(w));
  const cancels = [canceller(), canceller()];
  await untilSettled(queue);
  stop = true;
  await Promise.all([...workers, ...cancels]);

  // 1. No request answered 5xx by its content or by contention.
  expect(stats.fivexx).toEqual([]);

  const tasks = await pair.sql`
    select task_id, state, concurrency_key, concurrency_limit, available_at, submitted_at,
      input->'delay_ms' as delay
    from tasks where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
      and queue = ${queue}`;
  expect(tasks.filter((t) => t.state === 'queued' || t.state === 'active')).toEqual([]);
  const attempts = await pair.sql`
    select a.task_id, a.ordinal, a.state, a.claimed_at::float8 as claimed_at,
      a.finished_at::float8 as finished_at, t.concurrency_key
    from attempts a join tasks t using (tenant_id, namespace, task_id)
    where t.tenant_id = ${SCOPE.tenant_id} and t.namespace = ${SCOPE.namespace}
      and t.queue = ${queue}
    order by a.task_id, a.ordinal`;

  // 2. Per key, never more attempts holding the key at once than its limit.
  const over: string[] = [];
  for (const [key, limit] of Object.entries(LIMITS)) {
    const events: [number, number][] = [];
    for (const a of attempts.filter((x) => x.concurrency_key === key)) {
      events.push([Number(a.claimed_at), 1]);
      events.push([Number(a.finished_at ?? Number.MAX_SAFE_INTEGER), -1]);
    }
    events.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
    let n = 0;
    for (const [at, d] of events) {
      n += d;
      if (n > limit) over.push(`${key} ${n} at ${at}`);
    }
  }
  expect(over).toEqual([]);

  // 3. No claim before due.
  const early: string[] = [];
  const byTask = new Map<string, typeof attempts>();
  for (const a of attempts) {
    const list = byTask.get(a.task_id) ?? ([] as unknown as typeof attempts);
    list.push(a);
    byTask.set(a.task_id, list);
  }
  for (const t of tasks) {
    const list = byTask.get(t.task_id) ?? [];
    const first = list[0];
    const due = Number(t.submitted_at) + Number(t.delay ?? 0);
    if (first !== undefined && Number(first.claimed_at) < due) {
      early.push(`${t.task_id} first claim ${first.claimed_at} < due ${due}`);
    }
    for (let i = 1; i < list.length; i += 1) {
      const prev = list[i - 1];
      const cur = list[i];
      if (prev?.finished_at == null || cur === undefined) continue;
      if (Number(cur.claimed_at) < Number(prev.finished_at) + RETRY_DELAY) {
        early.push(
          `${t.task_id} attempt ${cur.ordinal} at ${cur.claimed_at} < ${prev.finished_at}+${RETRY_DELAY} (${prev.state})`,
        );
      }
    }
  }
  expect(early).toEqual([]);

  // 4. No claim after a queued cancel.
  const history = await pair.sql`
    select h.task_id, h.sequence, h.reason, h.at::float8 as at from task_history h
    join tasks t using (tenant_id, namespace, task_id)
    where t.queue = ${queue} and t.tenant_id = ${SCOPE.tenant_id} and t.namespace = ${SCOPE.namespace}
    order by h.task_id, h.sequence`;
  const afterCancel: string[] = [];
  const seenCancel = new Set<string>();
  for (const h of history) {
    if (h.reason === 'cancelled') seenCancel.add(h.task_id);
    else if (h.reason === 'claimed' && seenCancel.has(h.task_id)) afterCancel.push(h.task_id);
  }
  expect(afterCancel).toEqual([]);

  // 5. Every slot given back.
  const rows = await pair.sql`
    select concurrency_key, active from concurrency_keys
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
      and concurrency_key like ${`${P}%`} and active <> 0`;
  expect(rows.map((r) => `${r.concurrency_key}=${r.active}`)).toEqual([]);
  // Some of everything happened.
  expect(cancelled.size).toBeGreaterThan(0);
  expect(attempts.some((a) => a.ordinal > 1)).toBe(true);
}, 120_000);

it('heavy contention: submits creating keys, polls, settles and cancels on shared keys never answer 5xx, and no key passes its limit', async () => {
  const queue = 'cf-hot';
  const P = 'cf-h-';
  const KEYS = Array.from(
    { length: 12 },
    (_, i) => `${P}${String.fromCharCode(97 + ((i * 7) % 12))}`,
  );
  const limitOf = (key: string) => 1 + (key.charCodeAt(key.length - 1) % 3);
  const rand = prng(4054);
  const stats: Stats = { statuses: new Map(), fivexx: [] };
  const urls = [pair.a.url, pair.b.url];
  const slow: string[] = [];
  const timed = async <T>(what: string, f: () => Promise<{ status: number; body: T }>) => {
    const t0 = performance.now();
    const r = await f();
    const ms = performance.now() - t0;
    note(stats, what, r.status, r.body);
    if (ms > 900 && !what.startsWith('acquire-wait')) slow.push(`${what} ${Math.round(ms)}ms`);
    return r;
  };
  let stop = false;
  let n = 0;
  const ids: string[] = [];
  const body = () => {
    const i = n++;
    // Keys in a random order within a batch: submits creating the same new keys race.
    const key = rand() < 0.85 ? (KEYS[Math.floor(rand() * KEYS.length)] as string) : null;
    return taskBody(`${P}${i}`, queue, {
      priority: Math.floor(rand() * 3),
      retry: { max_attempts: 2, delay_ms: 50 },
      data: { fail: rand() < 0.2 },
      ...(key === null ? {} : { concurrency_key: key, concurrency_limit: limitOf(key) }),
    });
  };
  async function submitter(s: number) {
    const url = urls[s % 2] as string;
    for (let round = 0; round < 25 && !stop; round += 1) {
      if (rand() < 0.5) {
        const commands = Array.from({ length: 10 }, body);
        const r = await timed('submit:batch', () =>
          call<{ results: { task_id?: string; status?: number }[] }>(
            url,
            `${TASKS_BASE}/tasks:batch`,
            { commands },
          ),
        );
        for (const x of r.body.results ?? []) {
          if (x.task_id) ids.push(x.task_id);
          else if ((x.status ?? 0) >= 500) stats.fivexx.push(`submit item ${JSON.stringify(x)}`);
        }
      } else {
        const r = await timed('submit', () =>
          call<{ task_id: string }>(url, `${TASKS_BASE}/tasks`, body()),
        );
        if (r.body.task_id) ids.push(r.body.task_id);
      }
    }
  }
  async function poller(w: number) {
    const url = urls[w % 2] as string;
    const slots = 2 + (w % 3);
    const session = await openSession(url, queue, slots);
    const seq = Array.from({ length: slots }, () => 0);
    let idle = 0;
    while (!stop || idle < 3) {
      const commands = seq.map((s, slot) => pollBody(session, queue, slot, s + 1));
      const r = await timed('acquire:batch', () =>
        call<{ replies: (AcquireReply | { status: number })[] }>(url, '/v1/worker/acquire:batch', {
          commands,
        }),
      );
      if (r.status !== 200) continue;
      const got: Assignment[] = [];
      r.body.replies.forEach((item, slot) => {
        if ('disposition' in item) {
          seq[slot] = (seq[slot] as number) + 1;
          if (item.disposition === 'assigned') got.push(item.assignment);
        } else if ((item as { status: number }).status >= 500) {
          stats.fivexx.push(`acquire item ${JSON.stringify(item)}`);
        }
      });
      if (got.length === 0) {
        idle = stop ? idle + 1 : 0;
        await sleep(5);
        continue;
      }
      idle = 0;
      const renews = await timed('renew:batch', () =>
        call<{ results: unknown[] }>(url, '/v1/worker/renew:batch', {
          commands: got.map((a) => ({ owner: a.lease.owner, sequence: 1, intent: 'dispatch' })),
        }),
      );
      void renews;
      const settles = got.map((a) => {
        const d = (a.event as { data: { fail: boolean } }).data;
        const attempt = (a.event as { ldgattempt: number }).ldgattempt;
        return settleBody(
          a,
          d.fail && attempt === 1
            ? { kind: 'application_error', error: { code: 'flaky', message: 'again' } }
            : { kind: 'success', output: null },
        );
      });
      const s = await timed('settle:batch', () =>
        call<{ results: { status?: number }[] }>(url, '/v1/worker/settle:batch', {
          commands: settles,
        }),
      );
      for (const x of s.body.results ?? []) {
        if ((x.status ?? 0) >= 500) stats.fivexx.push(`settle item ${JSON.stringify(x)}`);
      }
    }
  }
  async function canceller() {
    while (!stop) {
      await sleep(3);
      if (ids.length === 0) continue;
      const id = ids[Math.floor(rand() * ids.length)] as string;
      if (rand() < 0.7) continue;
      const url = urls[Math.floor(rand() * 2)] as string;
      await timed('cancel', () => call(url, `${TASKS_BASE}/tasks/${id}/cancel`, {}));
    }
  }
  const deadlocksAt = async () =>
    Number(
      (
        await pair.sql`select deadlocks::int as d from pg_stat_database where datname = current_database()`
      )[0]?.d,
    );
  const deadlocksBefore = await deadlocksAt();
  const submitters = Array.from({ length: 6 }, (_, s) => submitter(s));
  const pollers = Array.from({ length: 8 }, (_, w) => poller(w));
  const cancellers = [canceller(), canceller(), canceller()];
  await Promise.all(submitters);
  await untilSettled(queue);
  stop = true;
  await Promise.all([...pollers, ...cancellers]);

  // pg_stat counters are flushed by backends at intervals: give them a moment.
  await sleep(1_500);
  const deadlocks = (await deadlocksAt()) - deadlocksBefore;
  console.log('cf heavy', { deadlocks, slow, statuses: [...stats.statuses], tasks: ids.length });
  expect(stats.fivexx).toEqual([]);
  expect(deadlocks).toBe(0);
  const attempts = await pair.sql`
    select a.claimed_at::float8 as claimed_at, a.finished_at::float8 as finished_at,
      t.concurrency_key, t.concurrency_limit
    from attempts a join tasks t using (tenant_id, namespace, task_id)
    where t.tenant_id = ${SCOPE.tenant_id} and t.namespace = ${SCOPE.namespace}
      and t.queue = ${queue} and t.concurrency_key is not null`;
  const over: string[] = [];
  for (const key of KEYS) {
    const events: [number, number][] = [];
    for (const a of attempts.filter((x) => x.concurrency_key === key)) {
      events.push([Number(a.claimed_at), 1]);
      events.push([Number(a.finished_at ?? Number.MAX_SAFE_INTEGER), -1]);
    }
    events.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
    let c = 0;
    for (const [at, d] of events) {
      c += d;
      if (c > limitOf(key)) over.push(`${key} ${c} at ${at}`);
    }
  }
  expect(over).toEqual([]);
  const rows = await pair.sql`
    select concurrency_key, active from concurrency_keys
    where concurrency_key like ${`${P}%`} and active <> 0`;
  expect(rows.map((r) => `${r.concurrency_key}=${r.active}`)).toEqual([]);
  expect(ids.length).toBeGreaterThan(500);
}, 150_000);
