/**
 * The real server on a database of its own, driven over HTTP: its database pool
 * (`LEDGENCE_DB_POOL_SIZE`, seen through PostgreSQL's own `pg_stat_activity`) and its shutdown
 * budget (`LEDGENCE_SHUTDOWN_TIMEOUT_MS`) against a real completion receiver on 127.0.0.1.
 */
import { createServer as createHttpServer } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { AcquireReply, CompletionSubscription, WorkerSession } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const scope = { tenant_id: 'acme', namespace: 'pool' };
const tasks = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks`;
const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};

let running: RunningServer[] = [];
let databases: TestDatabase[] = [];
afterEach(async () => {
  // Servers first: a database in use cannot be dropped.
  for (const server of running) await server.stop();
  for (const db of databases) await db.drop();
  running = [];
  databases = [];
});

async function database(): Promise<TestDatabase> {
  const db = await createTestDatabase({ prefix: 'server' });
  databases.push(db);
  return db;
}

/** A server on `db` with the variables of `env`; stopped after the test. */
async function startOn(db: TestDatabase, env: Record<string, string>): Promise<RunningServer> {
  const config = loadConfig({ DATABASE_URL: db.url, PORT: '0', ...env }, noFiles);
  const server = await startServer(config, { logger: pino({ level: 'silent' }) });
  running.push(server);
  return server;
}

/** A server on a database of its own whose JSON log lines (info and up) are collected. */
async function loggedServer(): Promise<{
  server: RunningServer;
  lines: Record<string, unknown>[];
  db: TestDatabase;
}> {
  const db = await database();
  const lines: Record<string, unknown>[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  const config = loadConfig({ DATABASE_URL: db.url, PORT: '0' }, noFiles);
  const server = await startServer(config, { logger });
  running.push(server);
  return { server, lines, db };
}

async function serverWithPool(
  size: number,
): Promise<{ url: string; connections: () => Promise<Record<string, number>> }> {
  const db = await database();
  const server = await startOn(db, { LEDGENCE_DB_POOL_SIZE: String(size) });
  return {
    url: server.url,
    async connections() {
      const sql = postgres(db.url, { max: 1, onnotice: () => {} });
      try {
        const rows = await sql<{ application_name: string; n: number }[]>`
          select application_name, count(*)::int as n from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()
            -- Client connections only: an autovacuum worker visiting this database is no one's.
            and backend_type = 'client backend'
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

describe('LEDGENCE_SHUTDOWN_TIMEOUT_MS', () => {
  it('bounds stop() while a completion callback hangs, and the aborted try is delivered later', async () => {
    // RunningServer.stop: graceful shutdown "within the configured timeout" — not after the
    // destination's own timeout (30 s here) of a try in flight.
    let answering = false;
    const webhookIds: string[] = [];
    const receiver = createHttpServer((req, res) => {
      req.resume();
      req.on('end', () => {
        webhookIds.push(String(req.headers['webhook-id']));
        if (answering) res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    onTestFinished(
      () =>
        new Promise<void>((resolve) => {
          receiver.closeAllConnections();
          receiver.close(() => resolve());
        }),
    );
    const { port } = receiver.address() as AddressInfo;
    const secret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url: `http://127.0.0.1:${port}/hooks`, secret, timeout_ms: 30_000 },
      }),
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '1000',
      // The aborted try is due again at once after the restart.
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
    };
    const db = await database();
    const first = await startOn(db, env);
    const { body: task } = await post<{ task_id: string }>(first.url, tasks, submit('callback'));
    expect((await post(first.url, `${tasks}/${task.task_id}/cancel`, {})).status).toBe(200);
    const subscriptions = `${tasks}/${task.task_id}/completion-subscriptions`;
    const subscribed = await post(first.url, subscriptions, {
      subscription_key: 'k',
      destination: 'billing',
    });
    expect(subscribed.status).toBe(201);
    await vi.waitFor(() => expect(webhookIds).toHaveLength(1), { timeout: 15_000, interval: 20 });

    const began = performance.now();
    await first.stop();
    const tookMs = performance.now() - began;
    // The budget, then the aborted try's report and the pools closing; not the 30 s timeout.
    expect(tookMs, `stop() took ${Math.round(tookMs)} ms`).toBeLessThan(1_000 + 3_000);

    // Nothing lost: the aborted try was reported for a retry, and the restarted server sends it.
    answering = true;
    const second = await startOn(db, env);
    const delivered = await vi.waitFor(
      async () => {
        const response = await fetch(`${second.url}${subscriptions}`);
        const [row] = (await response.json()) as CompletionSubscription[];
        expect(row?.state).toBe('delivered');
        return row;
      },
      { timeout: 15_000, interval: 50 },
    );
    expect(delivered).toMatchObject({ attempts: 2, last_status_code: 204 });
    expect(webhookIds).toEqual([delivered?.event_id, delivered?.event_id]);
  }, 60_000);
});

describe('development mode over real sockets', () => {
  /** A submit over node:http naming `host` (fetch cannot set Host); the reply's status. */
  async function submitNaming(url: string, host: string, key: string): Promise<number> {
    const { request } = await import('node:http');
    const target = new URL(tasks, url);
    return new Promise((resolve, reject) => {
      const req = request(
        {
          hostname: target.hostname.replace(/^\[|\]$/g, ''),
          port: target.port,
          path: target.pathname,
          method: 'POST',
          headers: { host, 'content-type': 'application/json' },
        },
        (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        },
      );
      req.on('error', reject);
      req.end(JSON.stringify(submit(key)));
    });
  }

  it('HOST=[::1] listens on ::1', async () => {
    // Passed to listen() as written, `[::1]` was a name to resolve: ENOTFOUND, after migrating.
    const server = await startOn(await database(), { HOST: '[::1]' });
    expect(server.url).toMatch(/^http:\/\/\[::1\]:\d+$/);
    expect((await post(server.url, tasks, submit('v6'))).status).toBe(201);
  });

  it('startServer refuses development mode on a non-loopback address, before touching the database', async () => {
    const db = await database();
    const config = { ...loadConfig({ DATABASE_URL: db.url, PORT: '0' }, noFiles), host: '0.0.0.0' };
    await expect(startServer(config, { logger: pino({ level: 'silent' }) })).rejects.toThrow(
      /development mode\) listens on loopback only/,
    );
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const [row] = await sql`select count(*)::int as n from pg_tables where schemaname = 'public'`;
      expect(row?.n).toBe(0);
    } finally {
      await sql.end();
    }
  });

  it('refuses a request naming a non-loopback Host (DNS rebinding)', async () => {
    const server = await startOn(await database(), {});
    expect(server.developmentMode).toBe(true);
    const port = new URL(server.url).port;
    expect(await submitNaming(server.url, `localhost:${port}`, 'local')).toBe(201);
    expect(await submitNaming(server.url, `rebind.attacker.example:${port}`, 'rebound')).toBe(403);
  });
});

describe('the request log', () => {
  it("names the peer's address on each request line, from the socket", async () => {
    const { server, lines } = await loggedServer();
    const reply = await fetch(`${server.url}/healthz`);
    expect(reply.status).toBe(200);
    const request = lines.find((l) => l.msg === 'request' && l.route === '/healthz');
    expect(request?.remote_address).toBe('127.0.0.1');
  });
});

describe('a request refused before the app', () => {
  it('is answered problem+json and logged: a backslash in the path, a Host that makes no URL', async () => {
    const { server, lines } = await loggedServer();
    const { port } = new URL(server.url);
    // Raw requests: fetch and node:http normalise or refuse these before sending.
    const raw = (head: string) =>
      new Promise<string>((resolve, reject) => {
        const socket = connect(Number(port), '127.0.0.1', () => socket.end(head));
        let text = '';
        socket.setEncoding('utf8');
        socket.on('data', (chunk) => {
          text += chunk;
        });
        socket.on('end', () => resolve(text));
        socket.on('error', reject);
      });
    for (const head of [
      'GET /v1\\tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n',
      'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:bad:port\r\nConnection: close\r\n\r\n',
    ]) {
      const reply = await raw(head);
      const [status] = reply.split('\r\n');
      expect(status).toBe('HTTP/1.1 400 Bad Request');
      expect(reply.toLowerCase()).toContain('content-type: application/problem+json');
      const body = JSON.parse(reply.slice(reply.indexOf('\r\n\r\n') + 4));
      expect(body).toMatchObject({ status: 400, code: 'invalid_input' });
    }
    const refused = lines.filter((l) => l.msg === 'request' && l.reason === 'malformed_request');
    expect(refused.map((l) => l.detail)).toEqual(['Backslash in request path', 'Invalid URL']);
  });
});

describe('the wake LISTEN', () => {
  it('logs its loss, naming what it costs, and its return', async () => {
    const { lines, db } = await loggedServer();
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      await sql`select pg_terminate_backend(pid) from pg_stat_activity
        where application_name = 'ledgence-wake' and datname = current_database()`;
    } finally {
      await sql.end();
    }
    const back = (l: Record<string, unknown>) =>
      String(l.msg).startsWith('wake LISTEN works again');
    await vi.waitFor(() => expect(lines.some(back)).toBe(true), { timeout: 10_000 });
    const wake = lines.filter((l) => String(l.msg).startsWith('wake LISTEN'));
    expect(wake[0]).toMatchObject({ level: 40, cause: 'closed' });
    expect(String(wake[0]?.msg)).toMatch(/only by their rescan, every \d+ ms/);
  });
});

describe('an address the server cannot listen on', () => {
  it('a taken port: says which HOST:PORT is taken and to set PORT', async () => {
    const blocker = createHttpServer();
    await new Promise<void>((done) => blocker.listen({ host: '127.0.0.1', port: 0 }, done));
    onTestFinished(() => new Promise<void>((done) => blocker.close(() => done())));
    const { port } = blocker.address() as AddressInfo;
    // A bare `listen EADDRINUSE` said neither where nor what to do.
    await expect(startOn(await database(), { PORT: String(port) })).rejects.toThrow(
      `127.0.0.1:${port} is taken: stop what listens there or set PORT (0 picks a free port)`,
    );
  });

  it('a HOST that is not an address of this machine: says so and to set HOST', async () => {
    const db = await database();
    const keys = JSON.stringify([
      { key: 'k'.repeat(32), tenant: 'acme', namespaces: ['*'], roles: ['client'] },
    ]);
    const config = loadConfig(
      { DATABASE_URL: db.url, PORT: '0', HOST: '192.0.2.1', LEDGENCE_API_KEYS: keys },
      noFiles,
    );
    await expect(startServer(config, { logger: pino({ level: 'silent' }) })).rejects.toThrow(
      'HOST 192.0.2.1 is not an address of this machine: set HOST to one of its addresses',
    );
  });
});
