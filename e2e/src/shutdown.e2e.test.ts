/**
 * `ledgence-server` (main.ts, as a real process) stopping when waiting would never end: SIGTERM
 * while the database has stopped answering (a network partition: packets to PostgreSQL are
 * dropped, connections stay open), where LEDGENCE_SHUTDOWN_TIMEOUT_MS, the "graceful shutdown
 * budget" (README), bounds the whole shutdown; and SIGTERM while the start waits on the
 * migration lock another replica holds, which abandons the start (DESIGN §11).
 */
import { createServer, type Server, Socket } from 'node:net';
import { MIGRATION_LOCK_KEY } from '@ledgence/store-postgres';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitUntil } from './processes.js';
import { type SpawnedServer, spawnServerProcess } from './server-process.js';

/** Ends `run` with SIGKILL if a failed test left it running. */
async function killLeftover(run: SpawnedServer | undefined): Promise<void> {
  if (run === undefined || run.child.exitCode !== null || run.child.signalCode !== null) return;
  run.child.kill('SIGKILL');
  await run.exited;
}

/** A TCP proxy to PostgreSQL that can freeze: it then forwards nothing, closing nothing. */
function freezableProxy(target: URL): Promise<{ port: number; freeze(): void; close(): void }> {
  let frozen = false;
  const sockets: Socket[] = [];
  const server: Server = createServer((client) => {
    const upstream = new Socket();
    sockets.push(client, upstream);
    upstream.connect(Number(target.port || 5432), target.hostname);
    client.on('data', (chunk) => {
      if (!frozen) upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (!frozen) client.write(chunk);
    });
    const end = () => {
      if (frozen) return; // a partition: nobody learns that anything ended
      client.destroy();
      upstream.destroy();
    };
    client.on('close', end);
    upstream.on('close', end);
    client.on('error', () => {});
    upstream.on('error', () => {});
  });
  return new Promise((done) =>
    server.listen({ host: '127.0.0.1', port: 0 }, () => {
      const address = server.address();
      done({
        port: typeof address === 'object' && address !== null ? address.port : 0,
        freeze: () => {
          frozen = true;
        },
        close: () => {
          for (const socket of sockets) socket.destroy();
          server.close();
        },
      });
    }),
  );
}

describe('SIGTERM while PostgreSQL is unreachable', () => {
  let database: TestDatabase;
  let run: SpawnedServer | undefined;
  let proxy: Awaited<ReturnType<typeof freezableProxy>> | undefined;

  beforeAll(async () => {
    database = await createTestDatabase({ prefix: 'shutdown_partition' });
  });
  afterAll(async () => {
    await killLeftover(run);
    proxy?.close();
    await database.drop();
  });

  it('exits 0 within LEDGENCE_SHUTDOWN_TIMEOUT_MS (plus a margin), no longer waiting on queries the partition swallowed', async () => {
    const target = new URL(database.url);
    proxy = await freezableProxy(target);
    const viaProxy = new URL(database.url);
    viaProxy.hostname = '127.0.0.1';
    viaProxy.port = String(proxy.port);
    run = spawnServerProcess({
      LEDGENCE_LOG_LEVEL: 'silent',
      DATABASE_URL: viaProxy.toString(),
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '50',
      LEDGENCE_RETENTION_INTERVAL_MS: '50',
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '1000',
      LEDGENCE_DB_POOL_SIZE: '1',
    });
    expect(await run.listening, run.stderr()).toBe(true);

    proxy.freeze();
    // The maintenance loops run every 50 ms: by now a round waits on a query sent into the void.
    await new Promise((r) => setTimeout(r, 500));
    const signalled = performance.now();
    run.child.kill('SIGTERM');
    const outcome = await Promise.race([
      run.exited,
      new Promise<'still running'>((r) => setTimeout(() => r('still running'), 20_000)),
    ]);
    const tookMs = Math.round(performance.now() - signalled);
    // Budget 1 s, plus 7 s of margin for a loaded machine. Unbounded, with the pool's one
    // connection open when the partition starts, it was still running after 20 s: cleanup
    // awaited the maintenance/sender rounds in flight with no deadline, and their query on the
    // open connection is never answered (with a larger pool, rounds waiting on new connections
    // end at postgres.js's connect_timeout, ~10 s, still 10× the budget).
    expect(
      { outcome, withinBudgetPlusMargin: tookMs < 8_000 },
      `SIGTERM to exit took ${tookMs} ms with a 1 s shutdown budget`,
    ).toEqual({ outcome: 0, withinBudgetPlusMargin: true });
  }, 120_000);
});

describe('SIGTERM while the start waits on the migration lock', () => {
  let database: TestDatabase;
  let run: SpawnedServer | undefined;
  let holder: postgres.Sql | undefined;

  beforeAll(async () => {
    database = await createTestDatabase({ prefix: 'shutdown_lockwait' });
  });
  afterAll(async () => {
    await killLeftover(run);
    await holder?.end({ timeout: 1 });
    await database.drop();
  });

  it('abandons the start, logging whose lock it waits for, and exits 0 with nothing left migrated', async () => {
    // Another replica is migrating (or hung mid-migration, e.g. its ALTER queued behind a
    // pg_dump): it holds the migration lock, so this replica's start waits on it.
    holder = postgres(database.url, { max: 1, onnotice: () => {} });
    const reserved = await holder.reserve();
    await reserved`select pg_advisory_lock(${MIGRATION_LOCK_KEY.toString()}::bigint)`;

    const starting = spawnServerProcess({ DATABASE_URL: database.url }, { captureStdout: true });
    run = starting;
    // Wait until its migrator is queued on the lock.
    let waiting = false;
    for (let i = 0; i < 300 && !waiting; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const rows = await reserved`
        select 1 from pg_locks
        where locktype = 'advisory' and not granted and database =
          (select oid from pg_database where datname = current_database())`;
      waiting = rows.length > 0;
    }
    expect(waiting, `the start queued on the migration lock:\n${starting.stderr()}`).toBe(true);
    const [held] = await reserved<{ pid: number }[]>`select pg_backend_pid() as pid`;
    const line = `waiting for the migration lock held by pid ${held?.pid}`;
    await waitUntil(() => starting.stdout().includes(line), 10_000);
    expect(starting.stdout()).toContain(line);

    starting.child.kill('SIGTERM');
    const outcome = await Promise.race([
      starting.exited,
      new Promise<'still running'>((r) => setTimeout(() => r('still running'), 20_000)),
    ]);
    // DESIGN §11: SIGTERM stops the server. Unabortable, the start waited on the lock for as
    // long as it was held ("stopping once the start completes").
    expect(outcome, starting.stderr()).toBe(0);
    expect(starting.stderr()).toContain('SIGTERM: start abandoned, stopped');
    // It migrated nothing: its transaction, waiting on the lock, rolled back.
    const [tasks] = await reserved<{ found: string | null }[]>`
      select to_regclass('public.tasks')::text as found`;
    expect(tasks?.found ?? null).toBeNull();
    reserved.release();
  }, 120_000);
});
