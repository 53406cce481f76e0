/**
 * An aborted wait for the migration lock must not end the process, whatever the database's
 * connections do: the cancel request it sends is best effort.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';
import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { MIGRATION_LOCK_KEY, migrate } from './migrate.js';
import { createTestDatabase, type TestDatabase } from './testing/index.js';

const created: TestDatabase[] = [];
afterAll(() => Promise.all(created.map((db) => db.drop())));

/** A TCP proxy to `url`'s server passing its first connection through and resetting the others. */
async function firstOnlyProxy(url: string): Promise<{ url: string; server: Server }> {
  const target = new URL(url);
  const sockets: Socket[] = [];
  let connections = 0;
  const server = createServer((client) => {
    connections += 1;
    sockets.push(client);
    client.on('error', () => {});
    if (connections > 1) {
      // The cancel request's connection: reset as its CancelRequest arrives.
      client.once('data', () => client.resetAndDestroy());
      return;
    }
    const upstream = connect(Number(target.port || 5432), target.hostname);
    sockets.push(upstream);
    upstream.on('error', () => client.destroy());
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.pipe(upstream);
    upstream.pipe(client);
  });
  server.on('close', () => {
    for (const socket of sockets) socket.destroy();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const proxied = new URL(url);
  proxied.hostname = '127.0.0.1';
  proxied.port = String((server.address() as { port: number }).port);
  return { url: proxied.toString(), server };
}

describe('migrate, aborted while waiting for the lock', () => {
  it('raises no unhandled rejection when the cancel request cannot be sent', async () => {
    // postgres.js's query.cancel() opens a connection for the CancelRequest and drops the
    // promise of it: when that connection fails (reset, refused), the rejection was unhandled,
    // which ends a Node 20 process (a server stopped by a signal while another replica migrates).
    // patches/postgres@3.4.9.patch catches it.
    const db = await createTestDatabase({ prefix: 'migrate_uncaught' });
    created.push(db);
    const proxy = await firstOnlyProxy(db.url);
    const holder = postgres(db.url, { max: 1, onnotice: () => {} });
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      const reserved = await holder.reserve();
      await reserved`select pg_advisory_lock(${MIGRATION_LOCK_KEY.toString()}::bigint)`;
      let waiting = false;
      const abort = new AbortController();
      const migrating = migrate(proxy.url, {
        signal: abort.signal,
        onWait: () => {
          waiting = true;
        },
      }).catch(() => undefined);
      for (let i = 0; i < 300 && !waiting; i++) await new Promise((r) => setTimeout(r, 20));
      expect(waiting).toBe(true);
      // Let the blocking wait reach the server before aborting it.
      await new Promise((r) => setTimeout(r, 200));
      abort.abort(new Error('stop waiting'));
      // The cancel connection is reset at once; its rejection is reported within a few ticks.
      await new Promise((r) => setTimeout(r, 300));
      reserved.release();
      await holder`select pg_advisory_unlock_all()`.catch(() => undefined);
      proxy.server.close();
      await migrating;
    } finally {
      process.off('unhandledRejection', onUnhandled);
      await holder.end({ timeout: 1 });
      proxy.server.close();
    }
    expect(unhandled).toEqual([]);
  });
});
