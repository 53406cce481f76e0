/**
 * A server runs for months: nothing it keeps in memory may grow with the number of distinct
 * tenants, namespaces, queues, sessions or tasks it has served. The real server (startServer, on
 * a database of its own) serves whole lifecycles, each on names it never saw before — session,
 * submit, long-poll acquire woken by the submit, dispatch, settle, a result wait woken by the
 * settle, an empty long poll that parks and ends, a metrics scrape — with its recovery loop
 * running; then no served name may stay reachable (wake watches, group-commit keys, metric label
 * sets, prepared statements, timers and caches all let go of it). Reachability is read from a
 * heap snapshot, which counts what is kept exactly where heap sizes are noise.
 */
import { getHeapSnapshot } from 'node:v8';
import type { AcquireReply, Assignment, WorkerSession } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

interface Reply<T> {
  status: number;
  body: T;
}

let server: RunningServer;
let db: TestDatabase;

async function call<T>(method: string, path: string, body?: unknown): Promise<Reply<T>> {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: (text === '' ? null : JSON.parse(text)) as T };
}

/** One whole lifecycle on a tenant, namespace and queue of its own. */
async function lifecycle(name: string): Promise<void> {
  const scope = { tenant_id: `t-${name}`, namespace: `n-${name}` };
  const queue = `q-${name}`;
  const base = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}`;
  const session = await call<WorkerSession>('POST', '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 1,
  });
  expect(session.status).toBe(200);
  const poll = (sequence: number) => ({
    scope,
    queue,
    worker_session_id: session.body.id,
    consumer_id: 0,
    sequence,
  });
  // The poll parks first (a wake watch on a queue never seen), the submit wakes it.
  const parked = call<AcquireReply>('POST', '/v1/worker/acquire?wait_ms=5000', poll(1));
  const submitted = await call<{ task_id: string }>('POST', `${base}/tasks`, {
    idempotency_key: `k-${name}`,
    input: { ...scope, queue, program: { name: 'p' }, data: { name } },
  });
  expect(submitted.status).toBe(201);
  const acquired = await parked;
  expect(acquired.body.disposition).toBe('assigned');
  const { owner } = (acquired.body as { assignment: Assignment }).assignment.lease;
  const renewed = await call('POST', '/v1/worker/renew', {
    owner,
    sequence: 1,
    intent: 'dispatch',
  });
  expect(renewed.status).toBe(200);
  // A result wait parks on the task (a watch of its own) until the settle wakes it.
  const waiting = call<{ outcome: { state: string } }>(
    'GET',
    `${base}/tasks/${submitted.body.task_id}/result?wait_ms=5000`,
  );
  const settled = await call('POST', '/v1/worker/settle', {
    owner,
    operation_id: `op-${name}`,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: { name } },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  });
  expect(settled.status).toBe(200);
  expect((await waiting).body.outcome.state).toBe('succeeded');
  // An empty long poll that parks until its wait ends.
  const empty = await call<AcquireReply>('POST', '/v1/worker/acquire?wait_ms=30', poll(2));
  expect(empty.body.disposition).toBe('empty');
}

async function round(prefix: string, count: number, parallel: number): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: parallel }, async () => {
      while (next < count) {
        const i = next++;
        await lifecycle(`${prefix}-${i}`);
      }
    }),
  );
  const metrics = await fetch(`${server.url}/metrics`);
  expect(metrics.status).toBe(200);
  await metrics.text();
}

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'long_run' });
  const config = loadConfig(
    {
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '50',
      // Not within the test: a retention round in progress holds a page of namespaces.
      LEDGENCE_RETENTION_INTERVAL_MS: '600000',
      LEDGENCE_RESCAN_INTERVAL_MS: '100',
    },
    (path) => {
      throw new Error(`no file ${path} in this test`);
    },
  );
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
}, 60_000);
afterAll(async () => {
  await server?.stop();
  await db?.drop();
});

/**
 * The served names still reachable in the heap: a heap snapshot (which collects garbage first)
 * lists the text of every reachable string, and each name served carries `marker`.
 */
async function reachableNames(marker: string): Promise<Set<string>> {
  const chunks: Buffer[] = [];
  for await (const chunk of getHeapSnapshot()) chunks.push(chunk as Buffer);
  const snapshot = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { strings: string[] };
  const names = new Set<string>();
  const pattern = new RegExp(`${marker}-\\d+`, 'g');
  for (const text of snapshot.strings) {
    for (const match of text.matchAll(pattern)) names.add(match[0]);
  }
  return names;
}

describe('a server serving ever new tenants, namespaces, queues and sessions', () => {
  it('keeps nothing of a name once its requests have ended (no map, watch, label or timer per name)', async () => {
    const served = 300;
    await round('zqa', served, 20);
    // Another round after it: what a server keeps of its latest requests (a parser's buffer, a
    // connection's last statement) is then of these names, not of the first round's.
    await round('zqb', 100, 20);
    // This test's own fetch keeps a bounded buffer of resource timings naming the URLs.
    performance.clearResourceTimings();
    const kept = await reachableNames('zqa');
    // Each name is a tenant, a namespace and a queue: anything keyed by one of them would keep
    // it for each name served. A few may stay in V8's string table until it is swept.
    expect(kept.size, [...kept].slice(0, 10).join(' ')).toBeLessThan(served / 20);
  }, 120_000);
});
