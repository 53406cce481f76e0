/**
 * A tasks:batch whose PostgreSQL backend is terminated while its inserts run
 * (DESIGN §1.1 durable before acknowledged, §1.3 replay-safe, §6 batch items): nothing of it is
 * half-written, each item is a retryable 503 problem, and sending the same batch again makes
 * exactly one task per key — over the real server and sockets.
 */
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const KEY = 'loss-acme-star-key-00000001';
let db: TestDatabase;
let server: RunningServer;
let sql: postgres.Sql;

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'batch_backend_loss' });
  const config = loadConfig(
    {
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
      ]),
    },
    (path) => {
      throw new Error(`no file ${path}`);
    },
  );
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
  sql = postgres(db.url, { max: 2, onnotice: () => {} });
}, 60_000);
afterAll(async () => {
  await sql?.end();
  await server?.stop();
  await db?.drop();
});

// biome-ignore lint/suspicious/noExplicitAny: loose reply bodies
type Loose = any;
const SCOPE = '/v1/tenants/acme/namespaces/a';

async function post(path: string, json: unknown): Promise<{ status: number; body: Loose }> {
  const res = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify(json),
  });
  return { status: res.status, body: await res.json() };
}

describe('tasks:batch whose backend is terminated mid-insert', () => {
  it('writes nothing or everything, answers each item 503 unavailable, and the retry makes one task per key', async () => {
    const queue = 'loss';
    const blob = 'y'.repeat(12_000);
    const commands = Array.from({ length: 1_000 }, (_, i) => ({
      idempotency_key: `loss-${i}`,
      input: {
        tenant_id: 'acme',
        namespace: 'a',
        queue,
        program: { name: 'p' },
        data: { i, blob },
      },
    }));
    let terminated = 0;
    let stop = false;
    const killer = (async () => {
      while (!stop && terminated === 0) {
        const rows = await sql`
          select pg_terminate_backend(pid) as done from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()
            and state = 'active' and query ilike '%insert into%tasks%'`;
        terminated += rows.filter((r) => r.done === true).length;
        await new Promise((resolve) => setTimeout(resolve, 2));
      }
    })();
    const first = await post(`${SCOPE}/tasks:batch`, { commands });
    stop = true;
    await killer;
    expect(terminated, 'the batch insert was seen and terminated').toBeGreaterThan(0);
    expect(first.status).toBe(200);
    const kinds = new Set(
      first.body.results.map((r: Loose) => ('code' in r ? `${r.status} ${r.code}` : 'task')),
    );
    expect([...kinds]).toEqual(['503 unavailable']);
    const [row] = await sql<{ count: number }[]>`select count(*)::int as count from tasks
      where tenant_id = 'acme' and namespace = 'a' and queue = ${queue}`;
    expect([0, 1_000]).toContain(row?.count);

    const retry = await post(`${SCOPE}/tasks:batch`, { commands });
    expect(retry.status).toBe(200);
    expect(retry.body.results.every((r: Loose) => r.state === 'queued')).toBe(true);
    const rows = await sql`select idempotency_key, task_id from tasks
      where tenant_id = 'acme' and namespace = 'a' and queue = ${queue}`;
    expect(rows).toHaveLength(1_000);
    const byKey = new Map(rows.map((r) => [r.idempotency_key, r.task_id]));
    retry.body.results.forEach((r: Loose, i: number) => {
      expect(r.task_id).toBe(byKey.get(`loss-${i}`));
    });
  });
});
