/**
 * A PostgreSQL outage under a steady request rate. DESIGN §1.1: "A backend error is an error
 * (HTTP 503)". Each request made while PostgreSQL is down is answered 503 within the store's
 * wait for a connection (5 s), not held until PostgreSQL comes back — as they were, every one
 * then running at once — and `/readyz` answers "not ready" while the database is down, not
 * "ready" once it is back, many seconds after it was asked (review r35b).
 *
 * The test runs its own embedded PostgreSQL (so that stopping it disturbs nobody), stops it for
 * 12 s while it sends ~25 task reads and ~25 `/readyz` per second, and records, for every request
 * sent during the outage, whether it was answered before PostgreSQL was started again.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type EmbeddedPostgres, startEmbeddedPostgres } from '@ledgence/store-postgres';
import { Client, silentLogger } from '@ledgence/worker';
import { afterAll, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      probe.close(() => resolve(port));
    });
  });
}

const dataDir = mkdtempSync(join(tmpdir(), 'ledgence-outage-'));
let database: EmbeddedPostgres | undefined;
let server: ServerProcess | undefined;

afterAll(async () => {
  await server?.stop('SIGKILL');
  await database?.stop().catch(() => {});
  rmSync(dataDir, { recursive: true, force: true });
});

interface Probe {
  path: string;
  sentAt: number;
  answeredAt?: number;
  status?: number | string;
}

it('answers every request promptly while PostgreSQL is down, instead of queueing it until it is back', async () => {
  const port = await freePort();
  database = await startEmbeddedPostgres({ dataDir, port });
  server = await startServerProcess({
    DATABASE_URL: database.url,
    LEDGENCE_MAINTENANCE_INTERVAL_MS: '1000',
  });
  const client = new Client({
    url: server.url,
    tenant: 'acme',
    namespace: 'outage',
    logger: silentLogger,
  });
  const task = await client.submit({ queue: 'q', program: 'p', data: null });
  const paths = [`/v1/tenants/acme/namespaces/outage/tasks/${task.task_id}`, '/readyz'];

  await database.stop(); // fast shutdown
  const probes: Probe[] = [];
  const pending: Promise<void>[] = [];
  const downFor = 12_000;
  const end = Date.now() + downFor;
  while (Date.now() < end) {
    for (const path of paths) {
      const probe: Probe = { path, sentAt: Date.now() };
      probes.push(probe);
      pending.push(
        fetch(`${server.url}${path}`).then(
          async (res) => {
            await res.arrayBuffer();
            probe.answeredAt = Date.now();
            probe.status = res.status;
          },
          (error: Error) => {
            probe.answeredAt = Date.now();
            probe.status = error.name;
          },
        ),
      );
    }
    await sleep(40);
  }
  const restartedAt = Date.now();
  database = await startEmbeddedPostgres({ dataDir, port });
  await Promise.all(pending);

  // Requests sent in the outage's first 6 s had 6 s to be answered before the restart: the
  // store's 5 s wait for a connection, and 1 s to spare.
  const judged = probes.filter((p) => p.sentAt < restartedAt - 6_000);
  const heldUntilRestart = judged.filter((p) => (p.answeredAt ?? Infinity) >= restartedAt);
  const readyWhileDown = judged.filter((p) => p.path === '/readyz' && p.status === 200);
  expect(judged.length).toBeGreaterThan(100);
  expect({
    heldUntilRestart: heldUntilRestart.length,
    readyzAnswered200AfterRestart: readyWhileDown.length,
  }).toEqual({ heldUntilRestart: 0, readyzAnswered200AfterRestart: 0 });
  // Answered as the outage it was: unavailable, never another 5xx.
  expect(new Set(judged.map((p) => p.status))).toEqual(new Set([503]));
});
