/**
 * Replicas: replica B reaches PostgreSQL through a TCP proxy that goes down for a
 * while (a database restart or a network blip: every connection dropped, new ones refused), then
 * comes back. B's LISTEN connection must come back with it: a submit through replica A then wakes
 * a poll parked on B, whose rescan is far beyond the wait (DESIGN §5).
 */
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { type PgProxy, startPgProxy } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, sleep, until } from './test/harness.js';
import { untilListening } from './test/replicas.js';
import { call, HINTS_ONLY_ENV, parkedPoll, submitTask, taskBody, WAIT_MS } from './test/wire.js';

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
  a = await stack.start(HINTS_ONLY_ENV);
  b = await stack.start({ ...HINTS_ONLY_ENV, DATABASE_URL: proxy.url });
}, 120_000);
afterAll(async () => {
  await admin.close();
  await stack.close();
  await proxy.close();
});

for (const outageMs of [500, 5_000]) {
  it(`after a ${outageMs} ms database outage of replica B, a submit through A wakes a poll parked on B`, async () => {
    await untilListening(sql);
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
    await untilListening(sql);
    const queue = `outage-${outageMs}`;
    const parked = parkedPoll(b.url, queue, WAIT_MS);
    await sleep(300);
    await submitTask(a.url, taskBody(`outage-${outageMs}`, queue));
    const { reply, ms } = await parked;
    expect(reply.disposition).toBe('assigned');
    expect(ms).toBeLessThan(WAIT_MS);
  }, 180_000);
}

it('a poll parked on B across its outage is answered once B is back, for a submit made during the outage', async () => {
  await untilListening(sql);
  const queue = 'during-outage';
  const parked = parkedPoll(b.url, queue, WAIT_MS);
  await sleep(500);
  proxy.refuse(true);
  await sleep(200);
  // The hint of this submit is sent while B's LISTEN connection is down: B never sees it.
  await submitTask(a.url, taskBody('during-outage', queue));
  await sleep(1_000);
  proxy.refuse(false);
  const { reply, ms } = await parked;
  expect(reply.disposition).toBe('assigned');
  expect(ms).toBeLessThan(WAIT_MS);
}, 120_000);
