/**
 * Client calls whose reply is lost after the server acted (cancel, subscribe, redeliver): the
 * Client's retry resolves with what the server did, once.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client, silentLogger } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, startHttpProxy, TENANT, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 9).toString('base64')}`;

const stack = new Stack('client_replays');
let server: ServerProcess;
let receiver: Server;

function quickClient(url: string): Client {
  return new Client({
    url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    backoff: { baseMs: 10, maxMs: 20 },
  });
}

beforeAll(async () => {
  receiver = createServer((request, response) => {
    request.resume();
    request.on('end', () => response.writeHead(204).end());
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const origin = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  await stack.open();
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: `${origin}/hooks/billing`, secret: SECRET, timeout_ms: 2_000 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  });
});
afterAll(async () => {
  await stack.close();
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
});

/** A proxy that drops the connection of the first reply to a request matching `match`. */
async function droppingFirst(match: (method: string, path: string) => boolean) {
  let dropped = 0;
  const seen: string[] = [];
  const proxy = await startHttpProxy(server.url, {
    reply: (exchange) => {
      if (!match(exchange.method, exchange.path)) return 'pass';
      seen.push(`${exchange.status} ${exchange.reply}`);
      if (dropped === 0) {
        dropped += 1;
        return 'drop';
      }
      return 'pass';
    },
  });
  return { proxy, seen, dropped: () => dropped };
}

describe('replayed Client calls (reply lost after the server acted)', () => {
  it('cancel whose reply is lost is retried and resolves with the state afterwards', async () => {
    const c = quickClient(server.url);
    const task = await c.submit({ queue: 'q-cancel', program: 'p' });
    const { proxy, dropped } = await droppingFirst((m, p) => m === 'POST' && p.endsWith('/cancel'));
    try {
      const state = await quickClient(proxy.url).cancel(task.task_id);
      expect(dropped()).toBe(1);
      expect(state).toBe('cancelled');
    } finally {
      await proxy.close();
    }
  });

  it('subscribe whose reply is lost is retried with its key: one subscription, returned', async () => {
    const c = quickClient(server.url);
    const task = await c.submit({ queue: 'q-sub', program: 'p' });
    const { proxy, dropped } = await droppingFirst(
      (m, p) => m === 'POST' && p.endsWith('/completion-subscriptions'),
    );
    try {
      const sub = await quickClient(proxy.url).subscribe(task.task_id, { destination: 'billing' });
      expect(dropped()).toBe(1);
      const list = await c.subscriptions(task.task_id);
      expect(list.map((s) => s.id)).toEqual([sub.id]);
    } finally {
      await proxy.close();
    }
  });

  it('redeliver whose reply is lost is retried and resolves with the next generation, not 409', async () => {
    const c = quickClient(server.url);
    const task = await c.submit({ queue: 'q-redeliver', program: 'p' });
    const sub = await c.subscribe(task.task_id, { destination: 'billing' });
    await c.cancel(task.task_id);
    await until(async () => {
      const list = await c.subscriptions(task.task_id);
      return list[0]?.state === 'delivered';
    }, 30_000);
    const { proxy, dropped, seen } = await droppingFirst(
      (m, p) => m === 'POST' && p.endsWith('/redeliver'),
    );
    try {
      const again = await quickClient(proxy.url).redeliver(sub.id, 1);
      expect(dropped()).toBe(1);
      expect(seen.length).toBe(2);
      expect(again.id).toBe(sub.id);
      expect(again.generation).toBe(2);
    } finally {
      await proxy.close();
    }
  });
});
