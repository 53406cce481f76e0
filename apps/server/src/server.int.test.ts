/**
 * The server's database pool (`LEDGENCE_DB_POOL_SIZE`): the real server on a database of its
 * own, driven over HTTP, and PostgreSQL's own view of who is connected (`pg_stat_activity`).
 */
import type { AcquireReply, WorkerSession } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const scope = { tenant_id: 'acme', namespace: 'pool' };
const tasks = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks`;
const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};

let running: { server: RunningServer; db: TestDatabase }[] = [];
afterEach(async () => {
  for (const { server, db } of running) {
    await server.stop();
    await db.drop();
  }
  running = [];
});

async function serverWithPool(
  size: number,
): Promise<{ url: string; connections: () => Promise<Record<string, number>> }> {
  const db = await createTestDatabase({ prefix: 'pool' });
  const config = loadConfig(
    { DATABASE_URL: db.url, PORT: '0', LEDGENCE_DB_POOL_SIZE: String(size) },
    noFiles,
  );
  const server = await startServer(config, { logger: pino({ level: 'silent' }) });
  running.push({ server, db });
  return {
    url: server.url,
    async connections() {
      const sql = postgres(db.url, { max: 1, onnotice: () => {} });
      try {
        const rows = await sql<{ application_name: string; n: number }[]>`
          select application_name, count(*)::int as n from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()
          group by application_name`;
        return Object.fromEntries(rows.map((row) => [row.application_name, row.n]));
      } finally {
        await sql.end();
      }
    },
  };
}

async function post<T>(
  url: string,
  path: string,
  body: unknown,
): Promise<{ status: number; body: T }> {
  const response = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as T };
}

function submit(key: string) {
  return {
    idempotency_key: key,
    input: { ...scope, queue: 'q', program: { name: 'noop' }, data: { key } },
  };
}

describe('LEDGENCE_DB_POOL_SIZE', () => {
  it('serves submits, listings and a parked poll on the single connection it allows', async () => {
    const server = await serverWithPool(1);
    const { body: session } = await post<WorkerSession>(server.url, '/v1/worker/sessions', {
      scope,
      queue: 'q',
      concurrency: 1,
    });
    const poll = { scope, queue: 'q', worker_session_id: session.id, consumer_id: 0, sequence: 1 };
    const parked = post<AcquireReply>(server.url, '/v1/worker/acquire?wait_ms=10000', poll);
    const submits = Array.from({ length: 30 }, (_, i) => post(server.url, tasks, submit(`k-${i}`)));
    const listings = Array.from({ length: 30 }, () => fetch(`${server.url}${tasks}?limit=10`));
    expect((await Promise.all(submits)).map((reply) => reply.status)).toEqual(Array(30).fill(201));
    expect((await Promise.all(listings)).map((reply) => reply.status)).toEqual(Array(30).fill(200));
    expect((await parked).body.disposition).toBe('assigned');
    // One store connection, and the wake source's LISTEN connection beside it.
    expect(await server.connections()).toEqual({ 'ledgence-store': 1, 'ledgence-wake': 1 });
  });

  it('opens up to the configured size under concurrent reads, and no more', async () => {
    const server = await serverWithPool(3);
    await post(server.url, tasks, submit('one'));
    // Bursts of concurrent listings until the pool is full (the first burst usually fills it;
    // with the default size of 10 one burst opened 5 connections).
    let connections = await server.connections();
    for (let burst = 0; burst < 5 && connections['ledgence-store'] !== 3; burst += 1) {
      const listings = Array.from({ length: 40 }, () => fetch(`${server.url}${tasks}?limit=10`));
      expect((await Promise.all(listings)).every((reply) => reply.status === 200)).toBe(true);
      connections = await server.connections();
    }
    expect(connections).toEqual({ 'ledgence-store': 3, 'ledgence-wake': 1 });
  });
});
