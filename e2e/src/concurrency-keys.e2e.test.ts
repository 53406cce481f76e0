/**
 * Concurrency keys (DESIGN §4 `concurrency_key`/`concurrency_limit`, §5 Acquire;
 * worker README "a task is claimed only while fewer than its own `concurrency_limit` tasks of its
 * key are active in the namespace") under real load, with real SDK workers on two replicas of one
 * database. Handlers count the tasks of each key running at once (across both replicas and both
 * queues of the namespace); a monitor reads, in one statement, each key's row against its active
 * tasks. Every exit from `active` is taken: success, application failure (retried and final),
 * crash, budget timeout, cancel of a queued and of an active task, lease expiry of a raw claim
 * and of a SIGKILLed worker process, and a deaf handler reported `unconfirmed`.
 */
import type { TaskResult, TaskSnapshot } from '@ledgence/contracts';
import { ApplicationError, type Worker } from '@ledgence/worker';
import { afterEach, expect, it } from 'vitest';
import {
  client,
  historyOf,
  idsOf,
  NAMESPACE,
  settled,
  shortWorker,
  sleep,
  TENANT,
  until,
} from './test/harness.js';
import { replicaPair } from './test/replicas.js';
import { claimNext } from './test/wire.js';
import { startWorkerProcess, type WorkerProcess } from './test/worker-process.js';

const env = {
  // A 1 s execution budget is allowed (margin + 500 ≤ 1 000).
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '100',
  LEDGENCE_CLEANUP_GRACE_MS: '8000',
};
const pair = replicaPair('concurrency_keys', { env });

const workers: Worker[] = [];
const processes: WorkerProcess[] = [];
const monitors = new Set<{ stop(): Promise<string[]> }>();
afterEach(async () => {
  await Promise.all([...monitors].map((m) => m.stop().catch(() => [])));
  monitors.clear();
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  await Promise.all(processes.splice(0).map((p) => p.stop('SIGKILL')));
});

function worker(url: string, queue: string, concurrency: number): Worker {
  const w = shortWorker(url, queue, { concurrency, abortGraceMs: 200 });
  workers.push(w);
  return w;
}

/** Per-key running handlers and the most seen at once. */
class Counter {
  readonly running = new Map<string, number>();
  readonly most = new Map<string, number>();
  enter(key: string): void {
    const n = (this.running.get(key) ?? 0) + 1;
    this.running.set(key, n);
    this.most.set(key, Math.max(this.most.get(key) ?? 0, n));
  }
  leave(key: string): void {
    this.running.set(key, (this.running.get(key) ?? 0) - 1);
  }
}

/**
 * Each key's broken promises, read in one statement: a count that is not its active tasks, or
 * more active tasks than the key's (single) limit.
 */
async function violations(prefix: string): Promise<string[]> {
  const rows = await pair.sql`
    with t as (
      select concurrency_key as key, count(*) filter (where state = 'active')::int as n,
        max(concurrency_limit)::int as lim
      from tasks
      where tenant_id = ${TENANT} and namespace = ${NAMESPACE}
        and concurrency_key like ${`${prefix}%`}
      group by concurrency_key
    ), k as (
      select concurrency_key as key, active from concurrency_keys
      where tenant_id = ${TENANT} and namespace = ${NAMESPACE}
        and concurrency_key like ${`${prefix}%`}
    )
    select coalesce(t.key, k.key) as key, coalesce(k.active, 0)::int as active,
      coalesce(t.n, 0)::int as n, coalesce(t.lim, 0)::int as lim
    from t full join k on k.key = t.key`;
  const found: string[] = [];
  for (const row of rows) {
    const active = Number(row.active);
    const n = Number(row.n);
    if (active !== n) found.push(`${row.key}: row says ${active}, ${n} active tasks`);
    if (n > Number(row.lim)) found.push(`${row.key}: ${n} active tasks, limit ${row.lim}`);
  }
  return found;
}

/** Samples {@link violations} until stopped. */
function monitor(prefix: string): { stop(): Promise<string[]> } {
  const seen = new Set<string>();
  let running = true;
  const loop = (async () => {
    while (running) {
      for (const v of await violations(prefix)) seen.add(v);
      await sleep(15);
    }
  })();
  const handle = {
    async stop() {
      running = false;
      monitors.delete(handle);
      await loop;
      for (const v of await violations(prefix)) seen.add(v);
      return [...seen];
    },
  };
  monitors.add(handle);
  return handle;
}

async function keyRows(prefix: string): Promise<Record<string, number>> {
  const rows = await pair.sql`
    select concurrency_key as key, active from concurrency_keys
    where tenant_id = ${TENANT} and namespace = ${NAMESPACE} and concurrency_key like ${`${prefix}%`}`;
  return Object.fromEntries(rows.map((r) => [String(r.key), Number(r.active)]));
}

type Kind = 'ok' | 'apperr' | 'crash' | 'fail' | 'timeout' | 'cancel';
interface Data {
  kind: Kind;
  key: string | null;
  ms?: number;
}

const EXPECTED: Record<Kind, string> = {
  ok: 'succeeded',
  apperr: 'succeeded',
  crash: 'succeeded',
  fail: 'failed',
  timeout: 'succeeded',
  cancel: 'cancelled',
};

it('two replicas, two queues, four workers: every exit path frees its key’s slot, no key ever runs past its limit, other keys and unkeyed work are not starved', async () => {
  const P = 'ck-mix-';
  const LIMITS: Record<string, number> = { [`${P}k1`]: 1, [`${P}k2`]: 2, [`${P}k3`]: 3 };
  const HOT = `${P}hot`;
  LIMITS[HOT] = 1;
  const queues = ['ck-qa', 'ck-qb'];
  const counter = new Counter();
  const starts = new Map<string, number>();
  const ends = new Map<string, number>();
  const onStart = new Map<string, () => void>();
  const ca = client(pair.a.url);
  const cb = client(pair.b.url);

  const handler = async (
    raw: unknown,
    ctx: { taskId: string; attempt: number; signal: AbortSignal },
  ) => {
    const data = raw as Data;
    const key = data.key ?? '(none)';
    counter.enter(key);
    starts.set(`${data.key}:${ctx.taskId}:${ctx.attempt}`, performance.now());
    try {
      if (!starts.has(`first:${ctx.taskId}`)) starts.set(`first:${ctx.taskId}`, performance.now());
      onStart.get(ctx.taskId)?.();
      const waitAbort = (ms: number) =>
        new Promise<void>((resolve) => {
          if (ctx.signal.aborted) return resolve();
          const t = setTimeout(resolve, ms);
          ctx.signal.addEventListener('abort', () => {
            clearTimeout(t);
            resolve();
          });
        });
      switch (data.kind) {
        case 'ok':
          await waitAbort(data.ms ?? 30);
          break;
        case 'apperr':
          await waitAbort(20);
          if (ctx.attempt === 1) throw new ApplicationError('transient', 'try again');
          break;
        case 'crash':
          await waitAbort(20);
          if (ctx.attempt === 1) throw new Error('boom');
          break;
        case 'fail':
          await waitAbort(20);
          throw new ApplicationError('fatal', 'no', { retryable: false });
        case 'timeout':
          if (ctx.attempt === 1) {
            await waitAbort(30_000);
            throw ctx.signal.reason;
          }
          break;
        case 'cancel':
          await waitAbort(30_000);
          throw ctx.signal.reason;
      }
      if (ctx.signal.aborted) throw ctx.signal.reason;
      return { ok: true };
    } finally {
      counter.leave(key);
      ends.set(ctx.taskId, performance.now());
    }
  };

  const watch = monitor(P);
  // The hot key: a long backlog at the highest priority, limit 1, on both queues.
  const hotTasks: { queue: string; data: Data; priority: number; concurrency_key: string }[] = [];
  for (let i = 0; i < 24; i += 1) {
    hotTasks.push({
      queue: queues[i % 2] as string,
      data: { kind: 'ok', key: HOT, ms: 120 },
      priority: 50,
      concurrency_key: HOT,
    });
  }
  const kinds: Kind[] = ['ok', 'ok', 'apperr', 'crash', 'ok', 'fail', 'cancel', 'ok', 'timeout'];
  const others: {
    queue: string;
    program: string;
    data: Data;
    concurrency_key?: string;
    concurrency_limit?: number;
    timeout_ms?: number;
    retry: { max_attempts: number; delay_ms: number };
  }[] = [];
  let n = 0;
  for (const key of [`${P}k1`, `${P}k2`, `${P}k3`, null]) {
    for (let i = 0; i < 18; i += 1) {
      const kind = kinds[i % kinds.length] as Kind;
      others.push({
        queue: queues[n++ % 2] as string,
        program: 'mix',
        data: { kind, key },
        ...(key === null ? {} : { concurrency_key: key, concurrency_limit: LIMITS[key] as number }),
        ...(kind === 'timeout' ? { timeout_ms: 1_000 } : {}),
        retry: { max_attempts: 3, delay_ms: 50 },
      });
    }
  }

  // Submits: the hot backlog and half of the rest as batches through A, the rest one by one
  // through B, all before any worker runs.
  const hotIds = idsOf(
    await ca.submitBatch(
      hotTasks.map((t) => ({
        ...t,
        program: 'mix',
        concurrency_limit: 1,
        retry: { max_attempts: 3, delay_ms: 50 },
      })),
    ),
  );
  const batchPart = others.filter((_, i) => i % 2 === 0);
  const singlePart = others.filter((_, i) => i % 2 === 1);
  const batchIds = idsOf(await ca.submitBatch(batchPart));
  const singleIds: string[] = [];
  for (const t of singlePart) singleIds.push(((await cb.submit(t)) as TaskSnapshot).task_id);
  const otherIds = [...batchIds, ...singleIds];
  const otherData = [...batchPart, ...singlePart];
  const kindOf = new Map<string, Data>();
  for (const [i, id] of otherIds.entries()) kindOf.set(id, (otherData[i] as { data: Data }).data);
  for (const id of hotIds) kindOf.set(id, { kind: 'ok', key: HOT });

  // Cancels: half the `cancel` tasks at once (queued, behind their key), the others once they run.
  const cancelIds = otherIds.filter((id) => kindOf.get(id)?.kind === 'cancel');
  const queuedCancels = cancelIds.filter((_, i) => i % 2 === 0);
  for (const id of queuedCancels) {
    const state = await ca.cancel(id);
    expect(state).toBeDefined();
  }
  for (const id of cancelIds.filter((_, i) => i % 2 === 1)) {
    onStart.set(id, () => void cb.cancel(id));
  }

  for (const url of [pair.a.url, pair.b.url]) {
    for (const queue of queues) {
      const w = worker(url, queue, 4).register('mix', handler);
      void w.run();
    }
  }

  const all = [...hotIds, ...otherIds];
  const results: TaskResult[] = await settled(ca, all, 120_000);
  const problems = await watch.stop();

  const wrong: string[] = [];
  results.forEach((r, i) => {
    const id = all[i] as string;
    const data = kindOf.get(id) as Data;
    if (r.outcome.state !== EXPECTED[data.kind]) {
      wrong.push(`${id} ${data.kind}/${data.key}: ${JSON.stringify(r.outcome)}`);
    }
  });
  expect(wrong).toEqual([]);
  expect(problems).toEqual([]);
  for (const [key, limit] of Object.entries(LIMITS)) {
    expect(counter.most.get(key) ?? 0, key).toBeLessThanOrEqual(limit);
  }
  // Every slot given back.
  for (const [key, active] of Object.entries(await keyRows(P))) expect(active, key).toBe(0);

  // No starvation: while the hot key's backlog (ranked above everything) waits on its limit,
  // every other key and the unkeyed work start running: each began before the hot key's last task.
  const lastHotStart = Math.max(
    ...hotIds.map((id) => starts.get(`first:${id}`) ?? Number.POSITIVE_INFINITY),
  );
  const late: string[] = [];
  for (const key of [`${P}k1`, `${P}k2`, `${P}k3`, null]) {
    const firsts = otherIds
      .filter((id) => kindOf.get(id)?.key === key)
      .map((id) => starts.get(`first:${id}`) ?? Number.POSITIVE_INFINITY);
    if (Math.min(...firsts) > lastHotStart) late.push(String(key));
  }
  expect(late).toEqual([]);
}, 180_000);

it('a raw claim that is never renewed holds its key until its lease expires, then the key runs again (other replica)', async () => {
  const P = 'ck-lease-';
  const key = `${P}k`;
  const queue = 'ck-lease';
  const ca = client(pair.a.url);
  const held = (await ca.submit({
    queue,
    program: 'lease',
    data: { i: 0 },
    concurrency_key: key,
    retry: { max_attempts: 3, delay_ms: 0 },
    priority: 10,
  })) as TaskSnapshot;
  const watch = monitor(P);
  // Claimed on A with dispatch granted, never renewed nor settled.
  const assignment = await claimNext(pair.a.url, queue, true);
  expect(assignment.lease.owner.task_id).toBe(held.task_id);
  const rest = idsOf(
    await ca.submitBatch(
      Array.from({ length: 4 }, (_, i) => ({
        queue,
        program: 'lease',
        data: { i: i + 1 },
        concurrency_key: key,
      })),
    ),
  );
  const counter = new Counter();
  const w = worker(pair.b.url, queue, 4).register('lease', async () => {
    counter.enter(key);
    try {
      await sleep(40);
      return null;
    } finally {
      counter.leave(key);
    }
  });
  void w.run();
  const results = await settled(ca, [held.task_id, ...rest], 60_000);
  expect(results.map((r) => r.outcome.state)).toEqual(Array(5).fill('succeeded'));
  expect(await watch.stop()).toEqual([]);
  expect(counter.most.get(key)).toBe(1);
  // The first other task of the key was claimed only after the raw claim's lease expired.
  const heldHistory = await historyOf(ca, held.task_id);
  const expiry = heldHistory.find((e) => e.event.reason === 'lease_expired');
  expect(expiry).toBeDefined();
  for (const id of rest) {
    const claimed = (await historyOf(ca, id)).find((e) => e.event.reason === 'claimed');
    expect(claimed?.event.at ?? 0).toBeGreaterThanOrEqual(expiry?.event.at ?? Infinity);
  }
  expect(await keyRows(P)).toEqual({ [key]: 0 });
}, 90_000);

it('a SIGKILLed worker process’s keyed tasks hold their key until recovery; a worker on the other replica then runs the key within its limit', async () => {
  const P = 'ck-kill-';
  const key = `${P}k`;
  const queue = 'ck-kill';
  const ca = client(pair.a.url);
  const watch = monitor(P);
  // Two that hang on their first attempt (the limit), then six more of the key.
  const hanging = idsOf(
    await ca.submitBatch(
      Array.from({ length: 2 }, (_, i) => ({
        queue,
        program: 'job',
        data: { i, hang_on_attempt: 1 },
        concurrency_key: key,
        concurrency_limit: 2,
        priority: 10,
        retry: { max_attempts: 3, delay_ms: 0 },
      })),
    ),
  );
  const victim = await startWorkerProcess('ck-victim', pair.a.url, queue, { CONCURRENCY: '4' });
  processes.push(victim);
  await until(
    () => hanging.every((id) => victim.lines.some((l) => l.event === 'start' && l.task_id === id)),
    30_000,
    'both hanging tasks running',
  );
  const rest = idsOf(
    await ca.submitBatch(
      Array.from({ length: 6 }, (_, i) => ({
        queue,
        program: 'job',
        data: { i: i + 2, ms: 60 },
        concurrency_key: key,
        concurrency_limit: 2,
      })),
    ),
  );
  // The key is full: the victim, with two idle slots, must not start any of the rest.
  await sleep(300);
  expect(victim.lines.filter((l) => l.event === 'start').map((l) => l.task_id)).toEqual(
    expect.arrayContaining(hanging),
  );
  expect(victim.lines.filter((l) => l.event === 'start')).toHaveLength(2);
  await victim.stop('SIGKILL');

  const counter = new Counter();
  const w = worker(pair.b.url, queue, 4).register('job', async () => {
    counter.enter(key);
    try {
      await sleep(60);
      return null;
    } finally {
      counter.leave(key);
    }
  });
  void w.run();
  const results = await settled(ca, [...hanging, ...rest], 60_000);
  expect(results.map((r) => r.outcome.state)).toEqual(Array(8).fill('succeeded'));
  expect(await watch.stop()).toEqual([]);
  expect(counter.most.get(key) ?? 0).toBeLessThanOrEqual(2);
  expect(await keyRows(P)).toEqual({ [key]: 0 });
}, 90_000);

it('a deaf handler past its budget is reported unconfirmed and keeps its key until it returns: the next task of the key never runs beside it', async () => {
  const P = 'ck-deaf-';
  const key = `${P}k`;
  const queue = 'ck-deaf';
  const ca = client(pair.a.url);
  const watch = monitor(P);
  const counter = new Counter();
  const deaf = (await ca.submit({
    queue,
    program: 'deaf',
    data: { deaf: true },
    concurrency_key: key,
    timeout_ms: 1_000,
    retry: { max_attempts: 1, delay_ms: 0 },
    priority: 10,
  })) as TaskSnapshot;
  const next = idsOf(
    await ca.submitBatch(
      Array.from({ length: 3 }, (_, i) => ({
        queue,
        program: 'deaf',
        data: { deaf: false, i },
        concurrency_key: key,
      })),
    ),
  );
  const handler = async (raw: unknown) => {
    counter.enter(key);
    try {
      // Ignores its signal: runs 2.5 s on a 1 s budget (within the 8 s cleanup grace).
      await sleep((raw as { deaf: boolean }).deaf ? 2_500 : 30);
      return null;
    } finally {
      counter.leave(key);
    }
  };
  // Workers on both replicas, so the next task could be taken by the other process' slots.
  for (const url of [pair.a.url, pair.b.url])
    void worker(url, queue, 3).register('deaf', handler).run();
  const results = await settled(ca, [deaf.task_id, ...next], 60_000);
  expect(results[0]?.outcome.state).toBe('failed');
  expect(results.slice(1).map((r) => r.outcome.state)).toEqual(Array(3).fill('succeeded'));
  expect(await watch.stop()).toEqual([]);
  expect(counter.most.get(key)).toBe(1);
  expect(await keyRows(P)).toEqual({ [key]: 0 });
}, 90_000);

it('a key belongs to its namespace (and tenant): the same key name with limit 1 runs at once in three scopes', async () => {
  const key = 'ck-scoped';
  const queue = 'ck-scoped';
  const scopes = [
    { tenant: TENANT, namespace: NAMESPACE },
    { tenant: TENANT, namespace: `${NAMESPACE}-other` },
    { tenant: `${TENANT}-other`, namespace: NAMESPACE },
  ];
  let running = 0;
  let most = 0;
  const ids: { c: ReturnType<typeof client>; id: string }[] = [];
  for (const [i, scope] of scopes.entries()) {
    const c = new (await import('@ledgence/worker')).Client({
      url: i % 2 === 0 ? pair.a.url : pair.b.url,
      tenant: scope.tenant,
      namespace: scope.namespace,
      retries: 5,
    });
    const t = (await c.submit({
      queue,
      program: 'scoped',
      data: null,
      concurrency_key: key,
    })) as TaskSnapshot;
    ids.push({ c, id: t.task_id });
    const w = shortWorker(i % 2 === 0 ? pair.b.url : pair.a.url, queue, {
      tenant: scope.tenant,
      namespace: scope.namespace,
    }).register('scoped', async () => {
      running += 1;
      most = Math.max(most, running);
      // Wait (bounded) for the other scopes' tasks of the same key name to run beside this one.
      await until(() => most === scopes.length, 15_000, 'all scopes running').catch(() => {});
      running -= 1;
      return null;
    });
    workers.push(w);
    void w.run();
  }
  for (const { c, id } of ids) {
    const [r] = await settled(c, [id], 60_000);
    expect(r?.outcome.state).toBe('succeeded');
  }
  expect(most).toBe(scopes.length);
}, 90_000);

it('a worker stopped with grace 0 hands its keyed tasks back; another replica’s worker runs the key within its limit', async () => {
  const P = 'ck-stop-';
  const key = `${P}k`;
  const queue = 'ck-stop';
  const ca = client(pair.a.url);
  const watch = monitor(P);
  const ids = idsOf(
    await ca.submitBatch(
      Array.from({ length: 8 }, (_, i) => ({
        queue,
        program: 'stop',
        data: { i },
        concurrency_key: key,
        concurrency_limit: 2,
        retry: { max_attempts: 3, delay_ms: 0 },
      })),
    ),
  );
  const first = new Counter();
  const w1 = worker(pair.a.url, queue, 4).register('stop', async (_d, ctx) => {
    first.enter(key);
    try {
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      throw ctx.signal.reason;
    } finally {
      first.leave(key);
    }
  });
  void w1.run();
  await until(() => (first.running.get(key) ?? 0) === 2, 30_000, 'two running');
  await sleep(300);
  expect(first.most.get(key)).toBe(2);
  await w1.stop({ graceMs: 0 });
  const second = new Counter();
  const w2 = worker(pair.b.url, queue, 4).register('stop', async () => {
    second.enter(key);
    try {
      await sleep(40);
      return null;
    } finally {
      second.leave(key);
    }
  });
  void w2.run();
  const results = await settled(ca, ids, 60_000);
  expect(results.map((r) => r.outcome.state)).toEqual(Array(8).fill('succeeded'));
  expect(await watch.stop()).toEqual([]);
  expect(second.most.get(key) ?? 0).toBeLessThanOrEqual(2);
  expect(await keyRows(P)).toEqual({ [key]: 0 });
}, 90_000);

it('a keyed task waiting out its retry backoff holds no slot: the next task of its limit-1 key runs meanwhile', async () => {
  const P = 'ck-backoff-';
  const key = `${P}k`;
  const queue = 'ck-backoff';
  const ca = client(pair.a.url);
  const ran: string[] = [];
  const first = (await ca.submit({
    queue,
    program: 'b',
    data: { name: 'first' },
    concurrency_key: key,
    priority: 10,
    retry: { max_attempts: 2, delay_ms: 60_000 },
  })) as TaskSnapshot;
  const w = worker(pair.b.url, queue, 2).register('b', async (raw) => {
    const { name } = raw as { name: string };
    ran.push(name);
    if (name === 'first') throw new ApplicationError('again', 'later');
    return null;
  });
  void w.run();
  await until(async () => (await ca.status(first.task_id)).attempt_count === 1 && ran.length === 1);
  await until(async () => (await ca.status(first.task_id)).state === 'queued');
  const second = (await ca.submit({
    queue,
    program: 'b',
    data: { name: 'second' },
    concurrency_key: key,
  })) as TaskSnapshot;
  const [r] = await settled(ca, [second.task_id], 30_000);
  expect(r?.outcome.state).toBe('succeeded');
  expect((await ca.status(first.task_id)).state).toBe('queued');
  expect(ran).toEqual(['first', 'second']);
  await ca.cancel(first.task_id);
  expect(await keyRows(P)).toEqual({ [key]: 0 });
}, 60_000);
