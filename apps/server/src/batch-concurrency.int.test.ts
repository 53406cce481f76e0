/**
 * `POST {scope}/tasks:batch` over the real server and PostgreSQL: concurrent identical and
 * conflicting batches from several clients through two servers (the one-statement and the
 * transaction paths), scoping and roles, and what the database holds afterwards (review r35c).
 */
import { request as httpRequest } from 'node:http';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const KEYS = {
  star: 'batchrace-acme-star-key-00000001',
  a: 'batchrace-acme-a-only-key-000001',
  worker: 'batchrace-acme-worker-key-00001',
  globex: 'batchrace-globex-key-00000000001',
};

let db: TestDatabase;
let s1: RunningServer;
let s2: RunningServer;
let sql: postgres.Sql;

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'batch_race' });
  const config = loadConfig(
    {
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: KEYS.star, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
        { key: KEYS.a, tenant: 'acme', namespaces: ['a'], roles: ['client'] },
        { key: KEYS.worker, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
        { key: KEYS.globex, tenant: 'globex', namespaces: ['*'], roles: ['client'] },
      ]),
    },
    (path) => {
      throw new Error(`no file ${path}`);
    },
  );
  s1 = await startServer(config, { logger: pino({ level: 'silent' }) });
  s2 = await startServer(config, { logger: pino({ level: 'silent' }) });
  sql = postgres(db.url, { max: 2, onnotice: () => {} });
}, 60_000);
afterAll(async () => {
  await sql?.end();
  await s1?.stop();
  await s2?.stop();
  await db?.drop();
});

// biome-ignore lint/suspicious/noExplicitAny: loose reply bodies
type Loose = any;
interface Reply {
  status: number;
  body: Loose;
  ms: number;
}

function post(base: string, path: string, key: string, body: string | Buffer): Promise<Reply> {
  const url = new URL(path, base);
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          authorization: `Bearer ${key}`,
          'content-length': String(Buffer.byteLength(body)),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({
            status: res.statusCode ?? 0,
            body: text.length > 0 ? JSON.parse(text) : undefined,
            ms: performance.now() - started,
          });
        });
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

const batchPath = (tenant: string, ns: string) =>
  `/v1/tenants/${tenant}/namespaces/${ns}/tasks:batch`;

let counter = 0;
const freshNs = (prefix: string) => `${prefix}-${++counter}-${Date.now()}`;

async function counts(tenant: string, ns: string) {
  const [row] = await sql`
    select
      (select count(*)::int from tasks where tenant_id = ${tenant} and namespace = ${ns}) as tasks,
      (select count(distinct idempotency_key)::int from tasks where tenant_id = ${tenant} and namespace = ${ns}) as keys,
      (select count(*)::int from task_payloads where tenant_id = ${tenant} and namespace = ${ns}) as payloads,
      (select count(*)::int from task_history where tenant_id = ${tenant} and namespace = ${ns}) as history,
      (select count(*)::int from concurrency_keys where tenant_id = ${tenant} and namespace = ${ns}) as ckeys`;
  return row as { tasks: number; keys: number; payloads: number; history: number; ckeys: number };
}

function command(ns: string, key: string, extra: Record<string, unknown> = {}, tenant = 'acme') {
  return {
    idempotency_key: key,
    input: {
      tenant_id: tenant,
      namespace: ns,
      queue: 'q',
      program: { name: 'p' },
      data: { key },
      ...extra,
    },
  };
}

describe('concurrent identical batches', () => {
  const shapes: [string, (ns: string, i: number) => Record<string, unknown>, number][] = [
    ['plain (one-statement path)', () => ({}), 50],
    ['more than one chunk (300 items)', () => ({}), 300],
    [
      'concurrency keys, available_at, delay_ms and priority',
      (_ns, i) =>
        i % 3 === 0
          ? { concurrency_key: `ck-${i % 7}`, concurrency_limit: 2, priority: (i % 201) - 100 }
          : i % 3 === 1
            ? { available_at: 1_700_000_000_000 + i, priority: 100 }
            : { delay_ms: 60_000 + i, priority: -100 },
      120,
    ],
  ];
  for (const [label, extra, n] of shapes) {
    it(`six clients, two servers: ${label} — one task per key, every item 2xx, same ids`, async () => {
      const ns = freshNs('race');
      const body = JSON.stringify({
        commands: Array.from({ length: n }, (_, i) => command(ns, `k-${i}`, extra(ns, i))),
      });
      const replies = await Promise.all(
        Array.from({ length: 6 }, (_, c) =>
          post(c % 2 === 0 ? s1.url : s2.url, batchPath('acme', ns), KEYS.star, body),
        ),
      );
      expect(replies.map((r) => r.status)).toEqual([200, 200, 200, 200, 200, 200]);
      const problems = replies.flatMap((r) =>
        (r.body.results as Loose[]).filter((x) => x.task_id === undefined),
      );
      expect(problems).toEqual([]);
      for (let i = 0; i < n; i++) {
        const ids = new Set(replies.map((r) => r.body.results[i].task_id));
        expect(ids.size).toBe(1);
      }
      const c = await counts('acme', ns);
      expect(c.tasks).toBe(n);
      expect(c.keys).toBe(n);
      expect(c.payloads).toBe(n);
      expect(c.history).toBe(n);
    }, 60_000);
  }

  it('six clients sending two different commands per key: one task per key, each item its snapshot or 409, no 5xx', async () => {
    const ns = freshNs('clash');
    const n = 80;
    const body = (variant: number) =>
      JSON.stringify({
        commands: Array.from({ length: n }, (_, i) =>
          command(ns, `k-${i}`, {
            data: { variant },
            ...(i % 2 === 0 ? { concurrency_key: `ck-${i % 5}` } : {}),
          }),
        ),
      });
    const replies = await Promise.all(
      Array.from({ length: 6 }, (_, c) =>
        post(c % 2 === 0 ? s1.url : s2.url, batchPath('acme', ns), KEYS.star, body(c % 2)),
      ),
    );
    expect(replies.map((r) => r.status)).toEqual([200, 200, 200, 200, 200, 200]);
    const stored = await sql`
      select t.idempotency_key, t.task_id, p.data from tasks t
      join task_payloads p using (tenant_id, namespace, task_id)
      where t.tenant_id = 'acme' and t.namespace = ${ns}`;
    expect(stored.length).toBe(n);
    const byKey = new Map(stored.map((r) => [String(r.idempotency_key), r]));
    for (const [c, reply] of replies.entries()) {
      for (let i = 0; i < n; i++) {
        const item = reply.body.results[i];
        const row = byKey.get(`k-${i}`);
        if (row === undefined) throw new Error(`no task stored for k-${i}`);
        const winner = (row.data as { variant: number }).variant;
        if (winner === c % 2) expect(item.task_id).toBe(row.task_id);
        else expect([item.status, item.code]).toEqual([409, 'conflict']);
      }
    }
    const c = await counts('acme', ns);
    expect([c.tasks, c.payloads, c.history, c.ckeys]).toEqual([n, n, n, 5]);
  }, 60_000);
});

describe('scoping and roles of tasks:batch', () => {
  it('a key bound to namespace a: a batch posted to b is 403 and writes nothing; items naming b under a are per-item 400', async () => {
    const body = (ns: string) =>
      JSON.stringify({ commands: [command(ns, 'k-0'), command(ns, 'k-1')] });
    const refused = await post(s1.url, batchPath('acme', 'b'), KEYS.a, body('b'));
    expect([refused.status, refused.body.code]).toEqual([403, 'forbidden']);
    expect((await counts('acme', 'b')).tasks).toBe(0);
    const mixed = await post(
      s1.url,
      batchPath('acme', 'a'),
      KEYS.a,
      JSON.stringify({ commands: [command('a', 'batchrace-a-0'), command('b', 'batchrace-b-0')] }),
    );
    expect(mixed.status).toBe(200);
    expect(mixed.body.results[0].state).toBe('queued');
    expect([mixed.body.results[1].status, mixed.body.results[1].path]).toEqual([
      400,
      '$.commands[1].input.namespace',
    ]);
    expect((await counts('acme', 'b')).tasks).toBe(0);
    // A worker-only key and another tenant's key: 403, nothing written.
    for (const key of [KEYS.worker, KEYS.globex]) {
      const r = await post(s1.url, batchPath('acme', 'a'), key, body('a'));
      expect([r.status, r.body.code]).toEqual([403, 'forbidden']);
    }
    expect((await counts('acme', 'a')).tasks).toBe(1);
  });
});
