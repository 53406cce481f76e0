/**
 * The wake source's LISTEN as its owner sees it: `onListenState` says when the LISTEN stopped
 * being in place and why, and when it is back (the server logs both: while it is lost, this
 * replica's parked polls find new work only by their rescan); and `close()` returns without the
 * database's help, whatever state the LISTEN is in.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type Harness, harness, SCOPE } from './testdata/fixtures.js';
import { type PgProxy, startPgProxy } from './testing/pg-proxy.js';
import { createPostgresWakeSource, type WakeListenState } from './wake.js';

let h: Harness;
let proxy: PgProxy;
beforeAll(async () => {
  h = await harness('wake_state');
  proxy = await startPgProxy(h.db.url);
});
afterAll(async () => {
  await proxy.close();
  await h.close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** `promise`'s outcome within `ms`: `'done'` or `'timeout'`. */
async function within(promise: Promise<unknown>, ms: number): Promise<'done' | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), ms);
  });
  try {
    return await Promise.race([promise.then(() => 'done' as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until `states` holds an entry matching `done`, for up to `ms`. */
async function until(states: WakeListenState[], done: (s: WakeListenState) => boolean, ms: number) {
  const deadline = performance.now() + ms;
  while (!states.some(done) && performance.now() < deadline) await sleep(50);
}

it('reports the LISTEN lost when its connection is terminated, and listening once it is back', async () => {
  const states: WakeListenState[] = [];
  const application = 'ledgence-wake';
  const source = createPostgresWakeSource({
    url: h.db.url,
    onListenState: (state) => states.push(state),
  });
  try {
    await source.ready();
    // The first LISTEN is the start, not a recovery: nothing to report.
    expect(states).toEqual([]);
    await h.sql`select pg_terminate_backend(pid) from pg_stat_activity
      where application_name = ${application} and datname = current_database()`;
    await until(states, (s) => s.listening, 10_000);
    expect(states[0]).toEqual({ listening: false, cause: 'closed' });
    expect(states.at(-1)).toEqual({ listening: true });
    expect(states.filter((s) => s.listening)).toHaveLength(1);
  } finally {
    await source.close();
  }
  const reported = states.length;
  await sleep(200);
  // close() ends the connection: that close is not a loss to report.
  expect(states).toHaveLength(reported);
}, 30_000);

it('reports a LISTEN the database refuses on an open connection, with its error', async () => {
  const failing = await startPgProxy(h.db.url);
  failing.failStatementCarrying(
    'listen "ledgence_wake"',
    '25006',
    'cannot execute LISTEN during recovery',
  );
  const states: WakeListenState[] = [];
  const source = createPostgresWakeSource({
    url: failing.url,
    onListenState: (state) => states.push(state),
  });
  try {
    await source.ready();
    await until(states, (s) => s.listening, 10_000);
    const [lost] = states;
    expect(lost).toMatchObject({ listening: false, cause: 'listen_failed' });
    expect(String((lost as { error?: unknown }).error)).toContain('during recovery');
    expect(states.at(-1)).toEqual({ listening: true });
  } finally {
    await source.close();
    await failing.close();
  }
}, 30_000);

it('reports a connection gone silent as lost, and listening once its replacement LISTENs', async () => {
  const silent = await startPgProxy(h.db.url);
  const states: WakeListenState[] = [];
  const source = createPostgresWakeSource({
    url: silent.url,
    pingIntervalMs: 200,
    onListenState: (state) => states.push(state),
  });
  try {
    await source.ready();
    silent.silenceOpen();
    await until(states, (s) => s.listening, 10_000);
    expect(states[0]).toEqual({ listening: false, cause: 'silent' });
    expect(states.at(-1)).toEqual({ listening: true });
  } finally {
    await source.close();
    await silent.close();
  }
}, 30_000);

it('an onListenState that throws changes nothing: the LISTEN still comes back and hints flow', async () => {
  let calls = 0;
  const source = createPostgresWakeSource({
    url: h.db.url,
    onListenState: () => {
      calls += 1;
      throw new Error('a broken logger');
    },
  });
  try {
    await source.ready();
    await h.sql`select pg_terminate_backend(pid) from pg_stat_activity
      where application_name = 'ledgence-wake' and datname = current_database()`;
    const deadline = performance.now() + 10_000;
    while (calls < 2 && performance.now() < deadline) await sleep(50);
    expect(calls).toBeGreaterThanOrEqual(2);
    // Back in place: a NOTIFY reaches a parked watch.
    const watch = source.watch({ kind: 'queue', scope: SCOPE, queue: 'after-throw' });
    const started = performance.now();
    await h.sql`select pg_notify('ledgence_wake', ${JSON.stringify([
      { kind: 'queue', tenant: SCOPE.tenant_id, namespace: SCOPE.namespace, queue: 'after-throw' },
    ])})`;
    await watch.next(5_000);
    watch.close();
    expect(performance.now() - started).toBeLessThan(5_000);
  } finally {
    await source.close();
  }
}, 30_000);

it('close() while the first LISTEN is unanswered returns at once, and ready() resolves', async () => {
  // The database went silent right after the connection was made (a failover, a NAT that forgot
  // the flow). With the checks stopped by close(), nothing would replace the connection: waiting
  // for the LISTEN was waiting for TCP to give up (~10 min).
  const held = proxy.holdRequestCarrying('listen "ledgence_wake"');
  const source = createPostgresWakeSource({ url: proxy.url, pingIntervalMs: 60_000 });
  const release = await held;
  try {
    expect(await within(source.close(), 5_000)).toBe('done');
    expect(await within(source.ready(), 1_000)).toBe('done');
  } finally {
    release();
  }
}, 30_000);

it('close() after a check already saw the LISTEN stalled returns at once too', async () => {
  const held = proxy.holdRequestCarrying('listen "ledgence_wake"');
  const source = createPostgresWakeSource({ url: proxy.url, pingIntervalMs: 200 });
  const release = await held;
  try {
    // One check finds the LISTEN unanswered (a second would replace the connection).
    await sleep(250);
    expect(await within(source.close(), 5_000)).toBe('done');
  } finally {
    release();
  }
}, 30_000);
