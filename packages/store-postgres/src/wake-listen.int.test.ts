/**
 * Replicas: the wake source's LISTEN connection while PostgreSQL is unreachable
 * (a restart, a failover). Every replica's waiters depend on it coming back as soon as the
 * database does: until then hints are lost and polls wait for the rescan. The store's pool
 * reconnects at most 2 s apart for this reason (reconnect.ts `reconnectBackoffSeconds`: postgres.js's
 * default backoff grows to 20 s); the LISTEN connection must not lag further behind.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type Harness, harness, SCOPE, submitCommand } from './testdata/fixtures.js';
import { type PgProxy, startPgProxy } from './testing/pg-proxy.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let proxy: PgProxy;
let wake: PostgresWakeSource;
beforeAll(async () => {
  h = await harness('wake_listen');
  proxy = await startPgProxy(h.db.url);
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
  const attempts = [...proxy.refusedAt];
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
  const other = await startPgProxy(h.db.url);
  const source = createPostgresWakeSource({ url: other.url });
  await source.ready();
  other.refuse(true);
  await sleep(1_500);
  await source.close();
  const attemptsAtClose = other.refusedAt.length;
  other.refuse(false);
  await sleep(3_000);
  other.refuse(true); // count attempts again, as refused ones
  await sleep(3_000);
  const [row] = await h.sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'
      and client_port is not null`;
  expect({ attempts: other.refusedAt.length - attemptsAtClose, listening: row?.n }).toEqual({
    attempts: 0,
    listening: 1, // the first test's source only
  });
  await other.close();
}, 60_000);

it('a LISTEN that fails on an open connection is tried again: hints reach the waiters later', async () => {
  // A server still in recovery refuses the LISTEN and keeps the connection open.
  const failing = await startPgProxy(h.db.url);
  failing.failStatementCarrying(
    'listen "ledgence_wake"',
    '25006',
    'cannot execute LISTEN during recovery',
  );
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

it('a LISTEN connection gone silent (its peer vanished without a word) is replaced: hints reach the waiters again', async () => {
  // Without the check, nothing notices such a connection before TCP keepalive gives up (~10 min
  // on Linux): the replica's waiters see no hint, only the rescan.
  const silent = await startPgProxy(h.db.url);
  const source = createPostgresWakeSource({ url: silent.url, pingIntervalMs: 300 });
  await source.ready();
  /** Whether a submit on `queue` wakes a watch within 1 s. */
  const hinted = async (queue: string, key: string) => {
    const watch = source.watch({ kind: 'queue', scope: SCOPE, queue });
    try {
      const started = performance.now();
      await h.store.submit(submitCommand(key, { queue }));
      await watch.next(1_000);
      return performance.now() - started < 1_000;
    } finally {
      watch.close();
    }
  };
  try {
    expect(await hinted('silent', 'silent-before')).toBe(true);
    silent.silenceOpen();
    // A few checks' time: the silent connection is found out and replaced (its new LISTEN wakes
    // every waiter once, so the probe comes after it).
    await sleep(2_000);
    expect(await hinted('silent', 'silent-after')).toBe(true);
    expect(await hinted('silent', 'silent-after-again')).toBe(true);
  } finally {
    await source.close();
    await silent.close();
  }
}, 60_000);
