/**
 * The server's database connections go silent (a failover that moved the address, a NAT that
 * forgot the flow: no FIN, no reset). `/readyz` answers within its own bound whatever the pool
 * does (until 2026-12-05 it waited out the store's 60 s wire timeout, far past any balancer's
 * probe timeout); requests on the silent connections wait for that timeout (README).
 */
import { type PgProxy, startPgProxy } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack } from './test/harness.js';
import { call, submitTask, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('db_silent');
let proxy: PgProxy;
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  proxy = await startPgProxy(stack.databaseUrl);
  server = await stack.start({ DATABASE_URL: proxy.url });
}, 120_000);
afterAll(async () => {
  await stack.close();
  await proxy?.close();
});

async function timed(path: string) {
  const started = performance.now();
  const reply = await call<{ code?: string }>(
    server.url,
    path,
    undefined,
    AbortSignal.timeout(90_000),
  );
  return { path, status: reply.status, ms: Math.round(performance.now() - started) };
}

it('answers /readyz 503 within seconds once the open connections go silent, not after the 60 s wire timeout', async () => {
  const id = await submitTask(server.url, taskBody('silent', 'q'));
  // Warm the pool: several connections open.
  await Promise.all(Array.from({ length: 10 }, () => timed(`${TASKS_BASE}/tasks/${id}`)));
  proxy.silenceOpen();
  const ready = await timed('/readyz');
  expect({ status: ready.status, within5s: ready.ms < 5_000 }).toEqual({
    status: 503,
    within5s: true,
  });
}, 120_000);
