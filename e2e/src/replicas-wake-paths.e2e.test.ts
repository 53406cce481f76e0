/**
 * Waking parked polls across replicas by every path that makes work claimable — a delayed task
 * coming due, a retry's backoff ending, a lease expiry recovered by the other replica, a
 * concurrency slot freed there — and through the LISTEN connection's failures.
 * Two (or three) real server processes on one database; the rescan is ten minutes, so only a
 * LISTEN hint (or a learned due time) can answer a parked poll before its 20 s wait ends.
 */
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { SHORT_TIMINGS, Stack, sleep, until } from './test/harness.js';
import {
  call,
  claimNext,
  HINTS_ONLY_ENV,
  openSession,
  parkedPoll,
  pollBody,
  settleBody,
  submitTask,
  TASKS_BASE,
  taskBody,
  WAIT_MS,
} from './test/wire.js';

/** "Promptly": far under the wait, a generous bound for a loaded 2-core machine. */
const PROMPT_MS = 5_000;

/** Fails the attempt `assignment` holds with an application error (a retry, when one is left). */
function failBody(assignment: Assignment) {
  return settleBody(assignment, {
    kind: 'application_error',
    error: { code: 'boom', message: 'x' },
  });
}

const stack = new Stack('replicas_wake_paths');
let a: ServerProcess;
let b: ServerProcess;
let admin: PostgresTaskStore;
let sql: PostgresTaskStore['sql'];

beforeAll(async () => {
  await stack.open();
  // A never runs recovery within a test (maintenance hourly): a lease expiry is recovered on B.
  // A's stdout is kept, at info level, to see what it tells the operator.
  a = await startServerProcess(
    {
      DATABASE_URL: stack.databaseUrl,
      ...SHORT_TIMINGS,
      ...HINTS_ONLY_ENV,
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '3600000',
      LEDGENCE_LOG_LEVEL: 'info',
    },
    { captureStdout: true },
  );
  stack.servers.push(a);
  b = await stack.start(HINTS_ONLY_ENV);
  admin = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
  sql = admin.sql;
}, 120_000);
afterAll(async () => {
  await admin?.close();
  await stack.close();
});

async function wakePids(): Promise<{ pid: number; query: string }[]> {
  return sql<{ pid: number; query: string }[]>`
    select pid, query from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'`;
}

/** The pid of A's wake connection: the one whose client port is not B's. Found by elimination. */
async function listening(n: number): Promise<void> {
  await until(
    async () => {
      const rows = await wakePids();
      return rows.length === n && rows.every((r) => /listen|select 1/i.test(r.query));
    },
    30_000,
    `${n} LISTEN connections`,
  );
}

describe('a poll parked on A is woken by changes made through B', () => {
  it('a delayed task submitted through B comes due (2 s delay) and reaches the poll on A', async () => {
    const queue = 'q1-delayed';
    const parked = parkedPoll(a.url, queue, WAIT_MS);
    await sleep(300);
    const t0 = performance.now();
    await submitTask(b.url, taskBody('delayed-1', queue, { delay_ms: 2_000 }));
    const { reply, ms } = await parked;
    const sinceSubmit = performance.now() - t0;
    expect(reply.disposition).toBe('assigned');
    expect(sinceSubmit).toBeGreaterThanOrEqual(1_900);
    expect(sinceSubmit).toBeLessThan(2_000 + PROMPT_MS);
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a retry with a 1.5 s backoff settled through B reaches the poll on A when due', async () => {
    const queue = 'q1-retry-delay';
    await submitTask(
      b.url,
      taskBody('retry-delay-1', queue, { retry: { max_attempts: 3, delay_ms: 1_500 } }),
    );
    const first = await claimNext(b.url, queue);
    const parked = parkedPoll(a.url, queue, WAIT_MS);
    await sleep(300);
    const t0 = performance.now();
    const settled = await call<{ task_state: string }>(b.url, '/v1/worker/settle', failBody(first));
    expect(settled.body.task_state).toBe('queued');
    const { reply } = await parked;
    const sinceSettle = performance.now() - t0;
    expect(reply.disposition).toBe('assigned');
    expect(sinceSettle).toBeLessThan(1_500 + PROMPT_MS);
  }, 60_000);

  it('a lease expiry recovered by B (A runs no recovery) re-queues onto the poll parked on A', async () => {
    const queue = 'q1-expiry-on-b';
    const id = await submitTask(
      b.url,
      taskBody('expiry-b-1', queue, { retry: { max_attempts: 3, delay_ms: 0 } }),
    );
    await claimNext(b.url, queue, false); // never renewed: the 1 s lease expires
    const { reply, ms } = await parkedPoll(a.url, queue, WAIT_MS);
    expect(reply.disposition).toBe('assigned');
    if (reply.disposition === 'assigned') expect(reply.assignment.lease.owner.task_id).toBe(id);
    expect(ms).toBeLessThan(PROMPT_MS);
  }, 60_000);

  it('a batch poll on A over one session is woken by a batch submit through B', async () => {
    const queue = 'q1-batch';
    const sid = await openSession(a.url, queue, 4);
    const started = performance.now();
    const parked = call<{ replies: AcquireReply[] }>(
      a.url,
      `/v1/worker/acquire:batch?wait_ms=${WAIT_MS}`,
      {
        commands: [0, 1, 2, 3].map((c) => pollBody(sid, queue, c, 1)),
      },
    );
    await sleep(300);
    const res = await call(b.url, `${TASKS_BASE}/tasks:batch`, {
      commands: [taskBody('batch-a', queue), taskBody('batch-b', queue)],
    });
    expect([200, 201, 207]).toContain(res.status);
    const { body } = await parked;
    expect(performance.now() - started).toBeLessThan(PROMPT_MS);
    expect(body.replies.filter((r) => r.disposition === 'assigned').length).toBeGreaterThanOrEqual(
      1,
    );
  }, 60_000);
});

describe('a concurrency slot freed by recovery on B wakes a key-blocked poll on A (another queue)', () => {
  for (const cancelFirst of [false, true]) {
    it(cancelFirst
      ? 'cancel-requested holder, lease expiry → cancelled'
      : 'lease expiry → re-queued', async () => {
      const key = { concurrency_key: `k-${cancelFirst}`, concurrency_limit: 1 };
      const holderQueue = `q1b-holder-${cancelFirst}`;
      const waiterQueue = `q1b-waiter-${cancelFirst}`;
      const holderId = await submitTask(
        b.url,
        taskBody(`holder-${cancelFirst}`, holderQueue, {
          ...key,
          retry: { max_attempts: 3, delay_ms: 0 },
        }),
      );
      await claimNext(b.url, holderQueue, cancelFirst); // never renewed after: the 1 s lease expires
      const waiterId = await submitTask(b.url, taskBody(`waiter-${cancelFirst}`, waiterQueue, key));
      if (cancelFirst) {
        const c = await call(b.url, `${TASKS_BASE}/tasks/${holderId}/cancel`, {});
        expect(c.status).toBe(200);
      }
      const { reply, ms } = await parkedPoll(a.url, waiterQueue, WAIT_MS);
      expect(reply.disposition).toBe('assigned');
      if (reply.disposition === 'assigned')
        expect(reply.assignment.lease.owner.task_id).toBe(waiterId);
      expect(ms).toBeLessThan(PROMPT_MS);
    }, 60_000);
  }
});

describe("A's LISTEN connection killed", () => {
  it('a poll parked on A across the kill, for work submitted through B right after, is answered promptly', async () => {
    await listening(2);
    for (let round = 0; round < 5; round += 1) {
      const queue = `q2-deaf-${round}`;
      const parked = parkedPoll(a.url, queue, WAIT_MS);
      await sleep(300);
      // Kill every wake connection (A's and B's): work then arrives while both are deaf.
      await sql`select pg_terminate_backend(pid) from pg_stat_activity
        where datname = current_database() and application_name = 'ledgence-wake'`;
      await submitTask(b.url, taskBody(`deaf-${round}`, queue));
      const { reply, ms } = await parked;
      expect(reply.disposition, `round ${round}`).toBe('assigned');
      expect(ms, `round ${round}`).toBeLessThan(PROMPT_MS);
      await listening(2);
    }
  }, 180_000);

  it('killed repeatedly while it reconnects (LISTEN in flight): it comes back and hints flow', async () => {
    await listening(2);
    const end = performance.now() + 3_000;
    while (performance.now() < end) {
      await sql`select pg_terminate_backend(pid) from pg_stat_activity
        where datname = current_database() and application_name = 'ledgence-wake'`;
      await sleep(Math.floor(Math.random() * 60));
    }
    await listening(2);
    const queue = 'q2-after-storm';
    const parked = parkedPoll(a.url, queue, WAIT_MS);
    await sleep(300);
    await submitTask(b.url, taskBody('after-storm', queue));
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(PROMPT_MS);
  }, 120_000);

  it('the operator is told: A logs the LISTEN lost, and back', async () => {
    await listening(2);
    // A's JSON log is captured (its start line is there).
    expect(a.stdout()).toContain('listening');
    const before = a.stdout().length;
    await sql`select pg_terminate_backend(pid) from pg_stat_activity
      where datname = current_database() and application_name = 'ledgence-wake'`;
    await listening(2);
    await sleep(1_000);
    const lines = a
      .stdout()
      .slice(before)
      .split('\n')
      .filter((l) => l.trim() !== '');
    const told = lines.filter((l) => /"msg":"wake LISTEN (lost|works again)/.test(l));
    expect(
      told.map((l) => JSON.parse(l).level),
      `A's stdout after the kill:\n${lines.join('\n')}`,
    ).toEqual([40, 30]);
  }, 60_000);
});
