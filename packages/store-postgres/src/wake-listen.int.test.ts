/**
 * Replicas: the wake source's LISTEN connection while PostgreSQL is unreachable
 * (a restart, a failover). Every replica's waiters depend on it coming back as soon as the
 * database does: until then hints are lost and polls wait for the rescan. The store's pool
 * reconnects at most 2 s apart for this reason (store.ts `reconnectBackoffSeconds`: postgres.js's
 * default backoff grows to 20 s); the LISTEN connection must not lag further behind.
 */
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type Harness, harness, SCOPE, submitCommand } from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

/**
 * A TCP proxy to PostgreSQL that can refuse: while refusing, open connections are cut and each
 * new one is reset at once (what a client sees of a database that is down), and every
 * connection attempt is timed.
 */
async function startRefusingProxy(databaseUrl: string) {
  const target = new URL(databaseUrl);
  let refusing = false;
  const attempts: number[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    client.on('error', () => {});
    if (refusing) {
      attempts.push(performance.now());
      client.resetAndDestroy();
      return;
    }
    const upstream = createConnection(Number(target.port || 5432), target.hostname);
    upstream.on('error', () => {});
    sockets.add(client);
    sockets.add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      sockets.delete(client);
      sockets.delete(upstream);
      client.destroy();
      upstream.destroy();
    };
    client.on('close', end);
    upstream.on('close', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(databaseUrl);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as { port: number }).port);
  return {
    url: url.toString(),
    attempts,
    refuse(value: boolean) {
      refusing = value;
      if (value) for (const s of sockets) s.resetAndDestroy();
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

let h: Harness;
let proxy: Awaited<ReturnType<typeof startRefusingProxy>>;
let wake: PostgresWakeSource;
beforeAll(async () => {
  h = await harness('wake_listen');
  proxy = await startRefusingProxy(h.db.url);
  wake = createPostgresWakeSource({ url: proxy.url });
  await wake.ready();
});
afterAll(async () => {
  await wake.close();
  await proxy.close();
  await h.close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

it('while the database is unreachable, the LISTEN connection is retried at most ~2 s apart, as the store pool is', async () => {
  proxy.refuse(true);
  await sleep(12_000);
  const attempts = [...proxy.attempts];
  proxy.refuse(false);
  const gaps = attempts.slice(1).map((t, i) => Math.round(t - (attempts[i] as number)));
  expect(attempts.length).toBeGreaterThan(1);
  // The store's backoff caps at 2 s (with jitter below it); 1 s of slack for a loaded machine.
  // postgres.js's default schedule (0.03, 0.09, 0.27, 0.81, 2.43, 7.29, 20 s, each × 0.5..1)
  // makes its sixth retry, at least 3.6 s after the fifth, within the 12 s outage.
  expect(gaps.filter((gap) => gap >= 3_000)).toEqual([]);

  // And once back, hints flow again.
  for (let i = 0; ; i += 1) {
    const watch = wake.watch({ kind: 'queue', scope: SCOPE, queue: 'back' });
    const started = performance.now();
    await h.store.submit(submitCommand(`back-${i}`, { queue: 'back' }));
    await watch.next(1_000);
    watch.close();
    if (performance.now() - started < 1_000) break;
    expect(i).toBeLessThan(60);
  }
}, 120_000);

it('close() during an outage opens no connection afterwards', async () => {
  const other = await startRefusingProxy(h.db.url);
  const source = createPostgresWakeSource({ url: other.url });
  await source.ready();
  other.refuse(true);
  await sleep(1_500);
  await source.close();
  const attemptsAtClose = other.attempts.length;
  other.refuse(false);
  await sleep(3_000);
  other.refuse(true); // count attempts again, as refused ones
  await sleep(3_000);
  const [row] = await h.sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'
      and client_port is not null`;
  expect({ attempts: other.attempts.length - attemptsAtClose, listening: row?.n }).toEqual({
    attempts: 0,
    listening: 1, // the first test's source only
  });
  await other.close();
}, 60_000);

/**
 * A proxy that answers the first `listen` statement itself with an ErrorResponse (as a server
 * still in recovery does: "cannot execute LISTEN during recovery") and forwards everything else:
 * the LISTEN failed, the connection stays open.
 */
async function startListenFailingProxy(databaseUrl: string) {
  const target = new URL(databaseUrl);
  let failNext = true;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    client.on('error', () => {});
    const upstream = createConnection(Number(target.port || 5432), target.hostname);
    upstream.on('error', () => {});
    sockets.add(client);
    sockets.add(upstream);
    client.on('data', (chunk: Buffer) => {
      if (failNext && chunk.includes('listen "ledgence_wake"')) {
        failNext = false;
        const fields = Buffer.concat([
          Buffer.from('SERROR\0VERROR\0C25006\0Mcannot execute LISTEN during recovery\0'),
          Buffer.from([0]),
        ]);
        const error = Buffer.alloc(5);
        error.write('E', 0);
        error.writeInt32BE(4 + fields.length, 1);
        const ready = Buffer.from([0x5a, 0, 0, 0, 5, 0x49]); // ReadyForQuery, idle
        client.write(Buffer.concat([error, fields, ready]));
        return;
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => client.write(chunk));
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', end);
    upstream.on('close', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(databaseUrl);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as { port: number }).port);
  return {
    url: url.toString(),
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

it('a LISTEN that fails on an open connection is tried again: hints reach the waiters later', async () => {
  const failing = await startListenFailingProxy(h.db.url);
  const source = createPostgresWakeSource({ url: failing.url });
  try {
    await source.ready();
    let woken = false;
    for (let i = 0; i < 30 && !woken; i += 1) {
      const watch = source.watch({ kind: 'queue', scope: SCOPE, queue: 'relisten' });
      const started = performance.now();
      await h.store.submit(submitCommand(`relisten-${i}`, { queue: 'relisten' }));
      await watch.next(1_000);
      watch.close();
      woken = performance.now() - started < 1_000;
    }
    expect(woken).toBe(true);
  } finally {
    await source.close();
    await failing.close();
  }
}, 120_000);
