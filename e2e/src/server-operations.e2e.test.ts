/**
 * `ledgence-server` (main.ts, from sources, as real processes) operated as the README's
 * "Running the server" describes (DESIGN §7, §11): replicas starting together on an empty
 * database, a SIGTERM drain with requests in flight, PostgreSQL going away and coming back and a
 * DATABASE_URL whose user may not create Ledgence's tables (the embedded PostgreSQL's own
 * operations are in main-operations.e2e.test.ts). Every process, database and
 * role a test makes is removed afterwards.
 */
import { readFileSync } from 'node:fs';
import { type IncomingHttpHeaders, request } from 'node:http';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
import {
  createTestDatabase,
  type PgProxy,
  startPgProxy,
  type TestDatabase,
} from '@ledgence/store-postgres/testing';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { type ServerProcess, ServerStartError, startServerProcess } from './server-process.js';
import { until } from './test/harness.js';

const TENANT = 'acme';
const NAMESPACE = 'ops';
const BASE = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

const servers: ServerProcess[] = [];
const databases: TestDatabase[] = [];
const proxies: PgProxy[] = [];
const cleanups: (() => Promise<void>)[] = [];

async function start(
  env: Record<string, string>,
  options?: { captureStdout?: boolean },
): Promise<ServerProcess> {
  const server = await startServerProcess(env, options);
  servers.push(server);
  return server;
}

async function database(prefix: string): Promise<TestDatabase> {
  const db = await createTestDatabase({ prefix });
  databases.push(db);
  return db;
}

function submitBody(key: string): string {
  return JSON.stringify({
    idempotency_key: key,
    input: {
      tenant_id: TENANT,
      namespace: NAMESPACE,
      queue: 'q',
      program: { name: 'noop' },
      data: {},
    },
  });
}

function submit(url: string, key: string): Promise<Response> {
  return fetch(`${url}${BASE}/tasks`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: submitBody(key),
  });
}

/** The status of GET `path`, or the connection error's code when no answer came. */
function statusOf(url: string, path: string): Promise<number | string> {
  return fetch(`${url}${path}`).then(
    async (response) => {
      await response.arrayBuffer();
      return response.status;
    },
    (error: Error) => String((error.cause as NodeJS.ErrnoException | undefined)?.code ?? error),
  );
}

afterEach(async () => {
  await Promise.all(
    servers.splice(0).map(async (server) => {
      if (server.child.exitCode !== null || server.child.signalCode !== null) return;
      server.child.kill('SIGTERM');
      const timer = setTimeout(() => server.child.kill('SIGKILL'), 30_000);
      await server.exited;
      clearTimeout(timer);
    }),
  );
});

afterAll(async () => {
  for (const proxy of proxies) await proxy.close();
  for (const cleanup of cleanups) await cleanup();
  for (const db of databases) await db.drop();
});

describe('two replicas started at once on one empty database', () => {
  it('apply the migrations once, under the lock, and both become ready', async () => {
    const db = await database('opreview_replicas');
    const env = { DATABASE_URL: db.url, LEDGENCE_LOG_LEVEL: 'info' };
    const [a, b] = await Promise.all([
      start(env, { captureStdout: true }),
      start(env, { captureStdout: true }),
    ]);
    if (a === undefined || b === undefined) throw new Error('two servers started');
    expect([await statusOf(a.url, '/readyz'), await statusOf(b.url, '/readyz')]).toEqual([
      200, 200,
    ]);
    const admin = createPostgresTaskStore({ url: db.url, max: 1 });
    try {
      const migrations = readFileSync(
        join(ROOT, 'packages', 'store-postgres', 'drizzle', 'meta', '_journal.json'),
        'utf8',
      );
      const journal = JSON.parse(migrations) as { entries: unknown[] };
      const [row] = await admin.sql<{ n: number; distinct_hashes: number }[]>`
        select count(*)::int as n, count(distinct hash)::int as distinct_hashes
        from drizzle.__drizzle_migrations`;
      expect(row).toEqual({ n: journal.entries.length, distinct_hashes: journal.entries.length });
    } finally {
      await admin.close();
    }
    // Both wrote to the same tables: a submit through one is read through the other.
    const submitted = (await (await submit(a.url, 'replicas')).json()) as { task_id: string };
    expect(await statusOf(b.url, `${BASE}/tasks/${submitted.task_id}`)).toBe(200);
  }, 120_000);
});

describe('SIGTERM with requests in flight', () => {
  it('finishes the in-flight request, answers a parked result wait, refuses new connections, and exits 0', async () => {
    const db = await database('opreview_drain');
    const server = await start({ DATABASE_URL: db.url, LEDGENCE_SHUTDOWN_TIMEOUT_MS: '30000' });
    const queued = (await (await submit(server.url, 'queued')).json()) as { task_id: string };
    const waiting = fetch(`${server.url}${BASE}/tasks/${queued.task_id}/result?wait_ms=60000`);

    // A submit whose body is still on its way when the signal comes: `Expect: 100-continue`
    // tells exactly when the server has its headers (the request is in flight).
    const { hostname, port } = new URL(server.url);
    const text = submitBody('in-flight');
    const inFlight = request({
      host: hostname,
      port,
      path: `${BASE}/tasks`,
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(text),
        expect: '100-continue',
      },
    });
    const reply = new Promise<{ status: number; headers: IncomingHttpHeaders; body: string }>(
      (done, fail) => {
        inFlight.on('response', (response) => {
          let body = '';
          response.setEncoding('utf8');
          response.on('data', (chunk: string) => {
            body += chunk;
          });
          response.on('end', () =>
            done({ status: response.statusCode ?? 0, headers: response.headers, body }),
          );
        });
        inFlight.on('error', fail);
      },
    );
    await new Promise<void>((done) => inFlight.once('continue', () => done()));
    inFlight.write(text.slice(0, 10));

    server.child.kill('SIGTERM');
    await until(() => server.stderr().includes('SIGTERM: shutting down gracefully'), 30_000);

    // The parked wait is answered with the task as it is, not cut.
    const waited = await waiting;
    expect(waited.status).toBe(200);
    expect(((await waited.json()) as { outcome: { state: string } }).outcome.state).toBe('pending');
    // No new connection is accepted while draining.
    expect(await statusOf(server.url, '/healthz')).toBe('ECONNREFUSED');

    inFlight.end(text.slice(10));
    const answered = await reply;
    expect({ status: answered.status, connection: answered.headers.connection }).toEqual({
      status: 201,
      connection: 'close',
    });
    expect(await server.exited).toBe(0);

    // What it accepted is stored: the drain finished the request, it did not drop it.
    const admin = createPostgresTaskStore({ url: db.url, max: 1 });
    try {
      const [row] = await admin.sql<{ n: number }[]>`
        select count(*)::int as n from tasks where idempotency_key = 'in-flight'`;
      expect(row?.n).toBe(1);
    } finally {
      await admin.close();
    }
  }, 120_000);
});

describe('PostgreSQL going away and coming back', () => {
  it('the server stays up, alive but not ready, answers 503, logs why, and serves again once it is back', async () => {
    const db = await database('opreview_outage');
    const proxy = await startPgProxy(db.url);
    proxies.push(proxy);
    const server = await start(
      { DATABASE_URL: proxy.url, LEDGENCE_LOG_LEVEL: 'info' },
      { captureStdout: true },
    );
    expect((await submit(server.url, 'before')).status).toBe(201);

    proxy.refuse(true); // every connection reset, new ones refused: a restart, a failover
    expect(await statusOf(server.url, '/readyz')).toBe(503);
    expect(await statusOf(server.url, '/healthz')).toBe(200); // no liveness restart loop
    expect((await submit(server.url, 'during')).status).toBe(503);
    expect(await statusOf(server.url, '/metrics')).toBe(200);
    // The maintenance loops meet the outage too (every second) and carry on, logging the first
    // failed round and then at most one line a minute, not a stack a second.
    await until(() => server.stdout().includes('lease recovery failed; retrying next round'));
    await new Promise((resolve) => setTimeout(resolve, 3_000));

    proxy.refuse(false);
    await until(async () => (await statusOf(server.url, '/readyz')) === 200, 60_000, 'ready');
    expect((await submit(server.url, 'after')).status).toBe(201);
    expect(server.child.exitCode).toBeNull();
    expect(server.stdout()).toContain('the task store is unavailable');
    await until(() => server.stdout().includes('lease recovery works again'));
    const lines = server
      .stdout()
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as { msg: string; failures?: number });
    const recovery = lines.filter((line) => line.msg.startsWith('lease recovery'));
    expect(recovery.map((line) => line.msg)).toEqual([
      'lease recovery failed; retrying next round',
      expect.stringMatching(/^lease recovery works again after \d+ failed rounds$/),
    ]);
    expect(recovery[1]?.failures).toBeGreaterThanOrEqual(3);
    // Nothing crashed on the way: stderr holds the start lines only.
    expect(server.stderr()).not.toMatch(/\n\s+at /);
  }, 120_000);
});

describe('a DATABASE_URL whose user may not create tables', () => {
  it('exits 1 with one line naming DATABASE_URL and the privilege to grant', async () => {
    // PostgreSQL 15 and later grant CREATE on schema public to the database owner only: a
    // login role that does not own the database is the common case of an application user.
    const db = await database('opreview_priv');
    const role = `${db.name}_app`;
    const admin = createPostgresTaskStore({ url: db.url, max: 1 });
    try {
      await admin.sql.unsafe(`create role "${role}" login password 'app_password_1'`);
    } finally {
      await admin.close();
    }
    cleanups.push(async () => {
      const owner = createPostgresTaskStore({ url: db.url, max: 1 });
      try {
        await owner.sql.unsafe(`drop role if exists "${role}"`);
      } finally {
        await owner.close();
      }
    });
    const url = new URL(db.url);
    url.username = role;
    url.password = 'app_password_1';

    const failure = await start({ DATABASE_URL: url.toString() }).then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(failure).toBeInstanceOf(ServerStartError);
    const { code, output } = failure as ServerStartError;
    expect(code).toBe(1);
    expect(output.trim().split('\n')).toHaveLength(1);
    expect(output).toContain('DATABASE_URL');
    expect(output).toMatch(/grant it CREATE/);
    expect(output).not.toContain('app_password_1');
    expect(output).not.toMatch(/\n\s+at /);
  }, 120_000);
});
