/**
 * Replicas: replica B reaches PostgreSQL through a TCP proxy that goes down for a
 * while (a database restart or a network blip: every connection dropped, new ones refused), then
 * comes back. B's LISTEN connection must come back with it: a submit through replica A then wakes
 * a poll parked on B, whose rescan is far beyond the wait (DESIGN §5).
 */
import type { AcquireReply } from '@ledgence/contracts';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { type PgProxy, startPgProxy } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, sleep, TENANT, until } from './test/harness.js';

const scope = { tenant_id: TENANT, namespace: NAMESPACE };
const base = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;
const WAIT_MS = 20_000;
const ENV = { LEDGENCE_RESCAN_INTERVAL_MS: '600000', LEDGENCE_LONG_POLL_WAIT_MS: String(WAIT_MS) };

async function call<T>(url: string, path: string, body?: unknown) {
  const response = await fetch(`${url}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as T };
}

const stack = new Stack('replicas_wake_outage');
let proxy: PgProxy;
let a: ServerProcess;
let b: ServerProcess;
let admin: PostgresTaskStore;
let sql: PostgresTaskStore['sql'];

beforeAll(async () => {
  await stack.open();
  proxy = await startPgProxy(stack.databaseUrl);
  admin = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
  sql = admin.sql;
  a = await stack.start(ENV);
  b = await stack.start({ ...ENV, DATABASE_URL: proxy.url });
}, 120_000);
afterAll(async () => {
  await admin.close();
  await stack.close();
  await proxy.close();
});

/**
 * Replicas whose LISTEN is in place: a wake connection's last statement is its LISTEN, or the
 * `select 1` health check it sends only once the LISTEN holds (wake.ts).
 */
async function wakeCount(): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'
      and (query ilike 'listen%' or query = 'select 1')`;
  return row?.n ?? 0;
}

async function parkedOnB(queue: string) {
  const { body: session } = await call<{ id: string }>(b.url, '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 1,
  });
  const started = performance.now();
  const { body } = await call<AcquireReply>(b.url, `/v1/worker/acquire?wait_ms=${WAIT_MS}`, {
    scope,
    queue,
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  return { reply: body, ms: performance.now() - started };
}

async function submitOnA(key: string, queue: string) {
  const { status } = await call(a.url, `${base}/tasks`, {
    idempotency_key: key,
    input: { ...scope, queue, program: { name: 'noop' }, data: {} },
  });
  expect(status).toBe(201);
}

for (const outageMs of [500, 5_000]) {
  it(`after a ${outageMs} ms database outage of replica B, a submit through A wakes a poll parked on B`, async () => {
    await until(async () => (await wakeCount()) === 2, 30_000, 'both replicas listening');
    proxy.refuse(true);
    await sleep(outageMs);
    proxy.refuse(false);
    // B answers again (its pool reconnects on demand)...
    await until(
      async () => (await call(b.url, '/readyz').catch(() => ({ status: 0 }))).status === 200,
      60_000,
      'B ready again',
    );
    // ...and its LISTEN connection is back, whenever that is.
    await until(async () => (await wakeCount()) === 2, 60_000, "B's LISTEN connection back");
    const queue = `outage-${outageMs}`;
    const parked = parkedOnB(queue);
    await sleep(300);
    await submitOnA(`outage-${outageMs}`, queue);
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 180_000);
}

it('a poll parked on B across its outage is answered once B is back, for a submit made during the outage', async () => {
  await until(async () => (await wakeCount()) === 2, 30_000, 'both replicas listening');
  const queue = 'during-outage';
  const parked = parkedOnB(queue);
  await sleep(500);
  proxy.refuse(true);
  await sleep(200);
  // The hint of this submit is sent while B's LISTEN connection is down: B never sees it.
  await submitOnA('during-outage', queue);
  await sleep(1_000);
  proxy.refuse(false);
  const { reply, ms } = await parked;
  expect(reply.disposition).toBe('assigned');
  expect(ms).toBeLessThan(WAIT_MS);
}, 120_000);
