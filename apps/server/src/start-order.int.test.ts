/**
 * DESIGN §11: "Start = connect, migrate, listen, start maintenance loops and the callback
 * sender". A server whose start fails at `listen` (a taken port, a HOST not of this machine)
 * never served: it must not have worked on the shared database either — in particular its
 * sender must not have posted a completion event to a receiver with the configuration of a
 * server the operator sees fail to start.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { startServer } from './server.js';

const SECRET = `whsec_${Buffer.alloc(32, 3).toString('base64')}`;
const scope = { tenant_id: 'acme', namespace: 'start-order' };
const tasks = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks`;
const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};
const silent = pino({ level: 'silent' });

let db: TestDatabase;
/** The receiver every server in this file posts to; records each `webhook-id`. */
let receiver: Server;
const posted: string[] = [];

/** The `billing` alias posting to `port` on 127.0.0.1. */
function destinations(port: number): string {
  return JSON.stringify({
    billing: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, timeout_ms: 1_000 },
  });
}

/** A port nothing listens on (connections to it are refused). */
async function closedPort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((done) => probe.listen(0, '127.0.0.1', done));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((done) => probe.close(() => done()));
  return port;
}

async function post(url: string, path: string, body?: unknown): Promise<Response> {
  return fetch(`${url}${path}`, {
    method: 'POST',
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'start_order' });
  receiver = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      posted.push(String(request.headers['webhook-id']));
      response.writeHead(204).end();
    });
  });
  await new Promise<void>((done) => receiver.listen(0, '127.0.0.1', done));
});

afterAll(async () => {
  await new Promise<void>((done) => {
    receiver.closeAllConnections();
    receiver.close(() => done());
  });
  await db?.drop();
});

describe('a server whose start fails at listen', () => {
  it('has posted no completion event that was due: its sender starts only once it listens', async () => {
    // A due delivery in the database: a first server subscribes a task, cancels it, and its one
    // try fails (connection refused), leaving the delivery due again almost at once.
    const first = await startServer(
      loadConfig(
        {
          DATABASE_URL: db.url,
          PORT: '0',
          LEDGENCE_CALLBACK_DESTINATIONS: destinations(await closedPort()),
          LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
        },
        noFiles,
      ),
      { logger: silent },
    );
    let subscription: { id: string; event_id: string };
    try {
      const submitted = await post(first.url, tasks, {
        idempotency_key: 'due',
        input: { ...scope, queue: 'q', program: { name: 'p' }, data: null },
      });
      const { task_id } = (await submitted.json()) as { task_id: string };
      const subscribed = await post(first.url, `${tasks}/${task_id}/completion-subscriptions`, {
        subscription_key: 'due',
        destination: 'billing',
      });
      expect(subscribed.status).toBe(201);
      subscription = (await subscribed.json()) as typeof subscription;
      expect((await post(first.url, `${tasks}/${task_id}/cancel`)).status).toBe(200);
      // Its one try is made and reported before the first server stops.
      const deadline = Date.now() + 10_000;
      for (;;) {
        const listed = await fetch(`${first.url}${tasks}/${task_id}/completion-subscriptions`);
        const [row] = (await listed.json()) as { attempts: number; state: string }[];
        if (row !== undefined && row.attempts >= 1 && row.state === 'due') break;
        if (Date.now() > deadline)
          throw new Error(`no failed try recorded: ${JSON.stringify(row)}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    } finally {
      await first.stop();
    }

    const blocker = createServer();
    await new Promise<void>((done) => blocker.listen({ host: '127.0.0.1', port: 0 }, done));
    try {
      const { port } = blocker.address() as AddressInfo;
      const { port: receiverPort } = receiver.address() as AddressInfo;
      await expect(
        startServer(
          loadConfig(
            {
              DATABASE_URL: db.url,
              PORT: String(port),
              LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiverPort),
            },
            noFiles,
          ),
          { logger: silent },
        ),
      ).rejects.toThrow(`127.0.0.1:${port} is taken`);
    } finally {
      await new Promise<void>((done) => blocker.close(() => done()));
    }
    // Give a stray try time to arrive, had one been started.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(posted).toEqual([]);

    // The delivery is still due: the next server that does start delivers it, once.
    const { port: receiverPort } = receiver.address() as AddressInfo;
    const next = await startServer(
      loadConfig(
        {
          DATABASE_URL: db.url,
          PORT: '0',
          LEDGENCE_CALLBACK_DESTINATIONS: destinations(receiverPort),
        },
        noFiles,
      ),
      { logger: silent },
    );
    try {
      const deadline = Date.now() + 10_000;
      while (posted.length === 0 && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      expect(posted).toEqual([subscription.event_id]);
    } finally {
      await next.stop();
    }
  });
});
