/**
 * Replicas: several server processes on one database, as behind a load balancer.
 * Every wake below crosses processes: the change commits through replica A, the parked poll waits
 * on replica B, whose rescan is far beyond the wait — only B's LISTEN can answer it early.
 */
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, sleep, TENANT, until } from './test/harness.js';

const scope = { tenant_id: TENANT, namespace: NAMESPACE };
const base = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;

async function call<T>(url: string, path: string, body?: unknown) {
  const response = await fetch(`${url}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as T };
}

function task(key: string, queue: string, extra: Record<string, unknown> = {}) {
  return {
    idempotency_key: key,
    input: { ...scope, queue, program: { name: 'noop' }, data: { key }, ...extra },
  };
}

async function submit(url: string, body: unknown): Promise<string> {
  const { status, body: snapshot } = await call<{ task_id: string }>(url, `${base}/tasks`, body);
  expect(status).toBe(201);
  return snapshot.task_id;
}

async function session(url: string, queue: string, concurrency = 1) {
  const { body } = await call<{ id: string }>(url, '/v1/worker/sessions', {
    scope,
    queue,
    concurrency,
  });
  return body.id;
}

function poll(sessionId: string, queue: string, consumer: number, sequence: number) {
  return { scope, queue, worker_session_id: sessionId, consumer_id: consumer, sequence };
}

/** The long poll of these tests; the rescan is ten minutes. */
const WAIT_MS = 20_000;
const ENV = {
  LEDGENCE_RESCAN_INTERVAL_MS: '600000',
  LEDGENCE_LONG_POLL_WAIT_MS: String(WAIT_MS),
};

/** A parked single poll on `url`; resolves with the reply and how long it took. */
async function parkedPoll(url: string, queue: string) {
  const id = await session(url, queue);
  const started = performance.now();
  const reply = await call<AcquireReply>(
    url,
    `/v1/worker/acquire?wait_ms=${WAIT_MS}`,
    poll(id, queue, 0, 1),
  );
  return { reply: reply.body, ms: performance.now() - started };
}

/** Claims the next task of `queue` on `url` (no wait) and, with `dispatch`, grants dispatch. */
async function claim(url: string, queue: string, dispatch = true): Promise<Assignment> {
  const id = await session(url, queue);
  const { body } = await call<AcquireReply>(url, '/v1/worker/acquire', poll(id, queue, 0, 1));
  if (body.disposition !== 'assigned') throw new Error(`nothing to claim: ${JSON.stringify(body)}`);
  if (dispatch) {
    const renewed = await call<{ dispatch_allowed: boolean }>(url, '/v1/worker/renew', {
      owner: body.assignment.lease.owner,
      sequence: 1,
      intent: 'dispatch',
    });
    expect(renewed.body.dispatch_allowed).toBe(true);
  }
  return body.assignment;
}

function settleBody(a: Assignment, outcome: unknown) {
  const owner = a.lease.owner;
  return {
    owner,
    operation_id: `settle-${owner.attempt_id}`,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome,
      },
    },
    quiescence: 'confirmed',
  };
}

const stack = new Stack('replicas_wake');
let a: ServerProcess;
let b: ServerProcess;
let admin: PostgresTaskStore;
let sql: PostgresTaskStore['sql'];

beforeAll(async () => {
  await stack.open();
  [a, b] = await Promise.all([stack.start(ENV), stack.start(ENV)]);
  admin = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
  sql = admin.sql;
}, 120_000);
afterAll(async () => {
  await admin.close();
  await stack.close();
});

describe('a parked poll on replica B is woken by a change committed through replica A', () => {
  it('a batch poll, by a submit', async () => {
    const queue = 'wake-batch';
    const id = await session(b.url, queue, 2);
    const started = performance.now();
    const parked = call<{ replies: AcquireReply[] }>(
      b.url,
      `/v1/worker/acquire:batch?wait_ms=${WAIT_MS}`,
      { commands: [poll(id, queue, 0, 1), poll(id, queue, 1, 1)] },
    );
    await sleep(300);
    await submit(a.url, task('batch-1', queue));
    const { body } = await parked;
    expect(body.replies.some((r) => r.disposition === 'assigned')).toBe(true);
    expect(performance.now() - started).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a retry re-queue (settled failed through A)', async () => {
    const queue = 'wake-retry';
    await submit(a.url, task('retry-1', queue, { retry: { max_attempts: 2, delay_ms: 0 } }));
    const first = await claim(a.url, queue);
    const parked = parkedPoll(b.url, queue);
    await sleep(300);
    const settled = await call<{ task_state: string }>(
      a.url,
      '/v1/worker/settle',
      settleBody(first, { kind: 'application_error', error: { code: 'boom', message: 'x' } }),
    );
    expect(settled.body.task_state).toBe('queued');
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a concurrency slot freed by a settle through A', async () => {
    const queue = 'wake-slot';
    const key = { concurrency_key: 'slot', concurrency_limit: 1 };
    await submit(a.url, task('slot-1', queue, key));
    const holder = await claim(a.url, queue);
    await submit(a.url, task('slot-2', queue, key));
    const parked = parkedPoll(b.url, queue);
    await sleep(300);
    const cancelled = await call<{ state: string }>(
      a.url,
      `${base}/tasks/${holder.lease.owner.task_id}/cancel`,
      {},
    );
    expect(cancelled.status).toBe(200);
    await call(a.url, '/v1/worker/settle', settleBody(holder, { kind: 'success', output: null }));
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a lease expiry re-queue by recovery', async () => {
    const queue = 'wake-expiry';
    await submit(a.url, task('expiry-1', queue, { retry: { max_attempts: 3, delay_ms: 0 } }));
    await claim(a.url, queue, false);
    const { reply, ms } = await parkedPoll(b.url, queue);
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);
});

describe('a result wait on replica B is woken by a terminal transition committed through A', () => {
  async function resultWait(taskId: string) {
    const started = performance.now();
    const { body } = await call<{ outcome: { state: string } }>(
      b.url,
      `${base}/tasks/${taskId}/result?wait_ms=${WAIT_MS}`,
    );
    return { state: body.outcome.state, ms: performance.now() - started };
  }

  it('a cancel of a queued task', async () => {
    const id = await submit(a.url, task('result-cancel', 'result-cancel'));
    const waiting = resultWait(id);
    await sleep(300);
    await call(a.url, `${base}/tasks/${id}/cancel`, {});
    const { state, ms } = await waiting;
    expect(state).toBe('cancelled');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a settle', async () => {
    const id = await submit(a.url, task('result-settle', 'result-settle'));
    const assignment = await claim(a.url, 'result-settle');
    const waiting = resultWait(id);
    await sleep(300);
    await call(a.url, '/v1/worker/settle', settleBody(assignment, { kind: 'success', output: 1 }));
    const { state, ms } = await waiting;
    expect(state).toBe('succeeded');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);

  it('a lease expiry with no attempt left (recovery)', async () => {
    const id = await submit(
      a.url,
      task('result-expiry', 'result-expiry', { retry: { max_attempts: 1, delay_ms: 0 } }),
    );
    await claim(a.url, 'result-expiry');
    const { state, ms } = await resultWait(id);
    expect(state).toBe('failed');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 60_000);
});

describe("replica B's LISTEN connection cut", () => {
  it('reconnects: a later submit through A still wakes a poll parked on B', async () => {
    const before = await sql<{ pid: number }[]>`
      select pid from pg_stat_activity
      where datname = current_database() and application_name = 'ledgence-wake'`;
    expect(before.length).toBe(2);
    await sql`select pg_terminate_backend(pid) from pg_stat_activity
      where datname = current_database() and application_name = 'ledgence-wake'`;
    await until(
      async () => {
        const rows = await sql<{ pid: number; query: string }[]>`
        select pid, query from pg_stat_activity
        where datname = current_database() and application_name = 'ledgence-wake'`;
        return (
          rows.length === 2 &&
          rows.every((r) => !before.some((o) => o.pid === r.pid) && /listen/i.test(r.query))
        );
      },
      60_000,
      'both LISTEN connections back',
    );
    const pairs: [ServerProcess, ServerProcess][] = [
      [a, b],
      [b, a],
    ];
    for (const [i, [from, to]] of pairs.entries()) {
      const queue = `wake-after-cut-${i}`;
      const parked = parkedPoll(to.url, queue);
      await sleep(300);
      await submit(from.url, task(`after-cut-${i}`, queue));
      const { reply, ms } = await parked;
      expect(reply.disposition).toBe('assigned');
      expect(ms).toBeLessThan(WAIT_MS);
    }
  }, 120_000);
});
