/**
 * The retention metrics and log line of a real server (in-process, real HTTP, real
 * PostgreSQL) move when retention removes records, as the README says: `ledgence_retention_removed_total{kind}`,
 * `ledgence_retention_transactions_total`, `ledgence_retention_rounds_total`, and the per-namespace
 * log line `retention removed retired records`. Records are aged in the database itself (the
 * shortest policy is an hour).
 */
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const scope = { tenant_id: 'acme', namespace: 'ret' };
const base = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}`;
const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};

let db: TestDatabase;
let server: RunningServer;
const lines: Record<string, unknown>[] = [];

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'retention_metrics' });
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  server = await startServer(
    loadConfig({ DATABASE_URL: db.url, PORT: '0', LEDGENCE_RETENTION_INTERVAL_MS: '100' }, noFiles),
    { logger },
  );
});
afterAll(async () => {
  await server?.stop();
  await db?.drop();
});

async function post(path: string, body?: unknown) {
  const response = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

async function samples(): Promise<Map<string, number>> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

describe('retention as /metrics and the log show it', () => {
  it('counts removed tasks, history and sessions by kind, its transactions and rounds, and logs the namespace', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 3; i += 1) {
      const created = await post(`${base}/tasks`, {
        idempotency_key: `ret-${i}`,
        input: { ...scope, queue: 'q', program: { name: 'p' }, data: { i } },
      });
      expect(created.status).toBe(201);
      ids.push(String(created.body.task_id));
      const cancelled = await post(`${base}/tasks/${ids[i]}/cancel`);
      expect(cancelled.status).toBe(200);
    }
    const session = await post('/v1/worker/sessions', { scope, queue: 'q', concurrency: 1 });
    expect(session.status).toBe(200);
    const before = await samples();
    const rounds = (s: Map<string, number>) => s.get('ledgence_retention_rounds_total') ?? 0;
    expect(rounds(before)).toBeGreaterThanOrEqual(0);

    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const week = 8 * 24 * 3600 * 1000;
      await sql`update tasks set terminal_at = terminal_at - ${week}::bigint
        where namespace = ${scope.namespace}`;
      await sql`update worker_sessions set expires_at = expires_at - ${week}::bigint
        where namespace = ${scope.namespace}`;
    } finally {
      await sql.end();
    }

    const removed = (s: Map<string, number>, kind: string) =>
      s.get(`ledgence_retention_removed_total{kind="${kind}"}`) ?? 0;
    let after = before;
    await vi.waitFor(
      async () => {
        after = await samples();
        expect(removed(after, 'tasks')).toBe(3);
        expect(removed(after, 'sessions')).toBe(1);
      },
      { timeout: 20_000, interval: 100 },
    );
    expect(removed(after, 'history')).toBeGreaterThanOrEqual(3);
    expect(after.get('ledgence_retention_transactions_total') ?? 0).toBeGreaterThan(
      before.get('ledgence_retention_transactions_total') ?? 0,
    );
    expect(rounds(after)).toBeGreaterThan(rounds(before));
    const logged = lines.filter((l) => l.msg === 'retention removed retired records');
    expect(logged.map((l) => [l.tenant_id, l.namespace, l.tasks, l.sessions])).toEqual([
      ['acme', 'ret', 3, 1],
    ]);
    // Gone for a client, as for an id that never existed.
    const status = await fetch(`${server.url}${base}/tasks/${ids[0]}`);
    expect(status.status).toBe(404);
  });
});
