/**
 * Two server replicas on one database, and the LISTEN connections between them: the set-up of
 * the files whose tests cross processes (a change committed through one replica, a parked poll
 * or result wait answered by the other, DESIGN §7.1 wake hints).
 */

import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll } from 'vitest';
import type { ServerProcess, ServerProcessOptions } from '../server-process.js';
import { portOf, Stack, until } from './harness.js';

/** A `postgres` client of one connection on the replicas' database, for a test's own reads. */
export type AdminSql = PostgresTaskStore['sql'];

/** What {@link replicaPair} gives a test file. */
export interface ReplicaPair {
  readonly stack: Stack;
  readonly a: ServerProcess;
  readonly b: ServerProcess;
  readonly sql: AdminSql;
}

/** One replica's settings in {@link replicaPair}. */
export interface ReplicaOptions extends ServerProcessOptions {
  /** Over the stack's short timings. */
  readonly env?: Record<string, string>;
}

/**
 * A database of the file's own with replicas A and B on it (short timings plus each one's
 * `env`; B takes A's options unless given its own) and an admin connection, all closed after
 * the file. Call it at the file's top level: it registers the file's hooks.
 */
export function replicaPair(prefix: string, a: ReplicaOptions, b: ReplicaOptions = a): ReplicaPair {
  const stack = new Stack(prefix);
  let started: { a: ServerProcess; b: ServerProcess; admin: PostgresTaskStore } | undefined;
  const get = () => {
    if (started === undefined) throw new Error('the replicas start in beforeAll');
    return started;
  };
  beforeAll(async () => {
    await stack.open();
    const { env: envA = {}, ...optionsA } = a;
    const { env: envB = {}, ...optionsB } = b;
    const [first, second] = await Promise.all([
      stack.start(envA, optionsA),
      stack.start(envB, optionsB),
    ]);
    started = {
      a: first,
      b: second,
      admin: createPostgresTaskStore({ url: stack.databaseUrl, max: 1 }),
    };
  }, 120_000);
  afterAll(async () => {
    await started?.admin.close();
    await stack.close();
  });
  return {
    stack,
    get a() {
      return get().a;
    },
    get b() {
      return get().b;
    },
    get sql() {
      return get().admin.sql;
    },
  };
}

/** The wake connections (`ledgence-wake`, one per replica) on the database, with their last statement. */
export function wakeConnections(sql: AdminSql): Promise<{ pid: number; query: string }[]> {
  return sql<{ pid: number; query: string }[]>`
    select pid, query from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'`;
}

/** Terminates every replica's wake connection (each reconnects and LISTENs again). */
export async function killWakeConnections(sql: AdminSql): Promise<void> {
  await sql`select pg_terminate_backend(pid) from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-wake'`;
}

/**
 * Waits until `count` wake connections hold their LISTEN — a wake connection's last statement is
 * its LISTEN, or the `select 1` health check it sends only once the LISTEN holds (wake.ts) — none
 * of them one of the `replacing` pids (connections a test just killed).
 */
export async function untilListening(
  sql: AdminSql,
  count = 2,
  replacing: readonly number[] = [],
): Promise<void> {
  await until(
    async () => {
      const rows = await wakeConnections(sql);
      return (
        rows.length === count &&
        rows.every((r) => !replacing.includes(r.pid) && /listen|select 1/i.test(r.query))
      );
    },
    60_000,
    `${count} replicas listening`,
  );
}

/** A TCP balancer in front of replicas (see {@link startBalancer}). */
export interface Balancer {
  readonly url: string;
  close(): Promise<void>;
}

/**
 * A round-robin TCP balancer: each new connection goes to the next server; one that refuses the
 * connection is skipped (as a balancer's connect-error retry does), so a stopped replica costs
 * only the connections it had.
 */
export async function startBalancer(targets: () => string[]): Promise<Balancer> {
  let next = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((down) => {
    sockets.add(down);
    down.on('error', () => {});
    down.on('close', () => sockets.delete(down));
    down.pause();
    const list = targets();
    const tryTarget = (left: number) => {
      if (left === 0) {
        down.destroy();
        return;
      }
      const target = list[next++ % list.length] as string;
      const up = createConnection({ host: '127.0.0.1', port: Number(portOf(target)) });
      let connected = false;
      up.once('connect', () => {
        connected = true;
        sockets.add(up);
        down.pipe(up);
        up.pipe(down);
        down.resume();
      });
      up.on('error', () => {
        if (!connected) tryTarget(left - 1);
      });
      up.on('close', () => {
        sockets.delete(up);
        if (connected) down.destroy();
      });
      down.on('close', () => up.destroy());
    };
    tryTarget(list.length);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
