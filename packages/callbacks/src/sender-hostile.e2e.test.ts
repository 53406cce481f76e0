/**
 * The completion sender's window against a batch of hostile receivers at once
 * (real sockets, the in-memory store): each try reported exactly once with the documented
 * outcome and reason, hanging tries holding their slots only until their deadlines, and every
 * try's request verifying with the `standardwebhooks` library.
 */
import { readFileSync } from 'node:fs';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import type { Scope } from '@ledgence/contracts';
import { createMemoryTaskStore, freshScope, type MemoryTaskStore } from '@ledgence/core/testing';
import { Webhook } from 'standardwebhooks';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createDestination, type Destinations } from './destinations.js';
import { type CompletionSender, createCompletionSender, type DeliveryRecord } from './sender.js';
import { type ReceivedRequest, startRawReceiver, startReceiver } from './testdata/receiver.js';
import { finishTask, subscribe, subscriptionOf } from './testdata/tasks.js';

const KEY = Buffer.alloc(32, 0x48);
const SECRET_TEXT = `whsec_${KEY.toString('base64')}`;
const T0 = Math.floor(Date.now() / 1000) * 1000;

let store: MemoryTaskStore;
let scope: Scope;
const open: { close(): Promise<void> }[] = [];
const senders: CompletionSender[] = [];
beforeEach(() => {
  store = createMemoryTaskStore({ now: () => T0 });
  scope = freshScope();
});
afterEach(async () => {
  const stopping = senders.splice(0).map((s) => s.stop({ signal: AbortSignal.timeout(5_000) }));
  await Promise.all(open.splice(0).map((s) => s.close()));
  await Promise.all(stopping);
});

/** A raw receiver that writes `reply` once the request head has arrived (or does `act`). */
async function raw(act: (socket: import('node:net').Socket) => void): Promise<string> {
  const r = await startRawReceiver((socket) => {
    let head = '';
    const onData = (chunk: Buffer) => {
      head += chunk.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      socket.off('data', onData);
      act(socket);
    };
    socket.on('data', onData);
  });
  open.push(r);
  return r.origin;
}

const TLS_DIR = join(dirname(fileURLToPath(import.meta.url)), '../../../e2e/src/testdata/tls');

/** An https receiver whose certificate this process does not trust. */
async function untrustedTls(): Promise<string> {
  const server = createHttpsServer(
    {
      cert: readFileSync(join(TLS_DIR, 'localhost-test-only.crt')),
      key: readFileSync(join(TLS_DIR, 'localhost-test-only.key')),
    },
    (_req, res) => res.end('should never be reached'),
  );
  server.on('tlsClientError', () => {});
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  open.push({
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  });
  return `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe('a window of hostile receivers', () => {
  it('reports each try exactly once with its documented outcome and frees every slot', async () => {
    const signed: ReceivedRequest[] = [];
    const ok = await startReceiver((res, request) => {
      signed.push(request);
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.flushHeaders();
      // A body trickled forever: delivered at the status, drained no longer than the deadline.
      const tick = setInterval(() => res.write('x'), 50);
      res.on('close', () => clearInterval(tick));
    });
    open.push(ok);
    const fine = await startReceiver((res, request) => {
      signed.push(request);
      res.writeHead(204).end();
    });
    open.push(fine);
    const origins: Record<string, { url: string; timeoutMs?: number }> = {
      redirect: {
        url: await raw((s) =>
          s.write(
            'HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:9/x\r\ncontent-length: 0\r\n\r\n',
          ),
        ),
      },
      bare101: { url: await raw((s) => s.write('HTTP/1.1 101 Switching Protocols\r\n\r\n')) },
      hints: {
        url: await raw((s) => {
          const t = setInterval(() => {
            if (s.destroyed) clearInterval(t);
            else s.write('HTTP/1.1 103 Early Hints\r\n\r\n');
          }, 20);
          s.on('close', () => clearInterval(t));
        }),
        timeoutMs: 600,
      },
      hang: { url: await raw(() => {}), timeoutMs: 700 },
      cutHead: {
        url: await raw((s) => {
          s.write('HTTP/1.1 200 OK\r\ncont');
          s.destroy();
        }),
      },
      brokenChunked: {
        url: await raw((s) =>
          s.write('HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\nZZZ\r\n'),
        ),
      },
      gone: { url: await raw((s) => s.end('HTTP/1.1 410 Gone\r\ncontent-length: 0\r\n\r\n')) },
      limited: {
        url: await raw((s) =>
          s.end('HTTP/1.1 429 Too Many\r\nretry-after: 120\r\ncontent-length: 0\r\n\r\n'),
        ),
      },
      nowhere: { url: 'http://no-such-host.invalid' },
      badTls: { url: await untrustedTls() },
      stalledTls: { url: (await raw(() => {})).replace('http:', 'https:'), timeoutMs: 1_500 },
      trickle: { url: ok.origin, timeoutMs: 800 },
    };
    const destinations: Destinations = new Map([
      ...Object.entries(origins).map(
        ([alias, { url, timeoutMs }]) =>
          [
            alias,
            createDestination({ alias, url: `${url}/hooks/${alias}`, secret: KEY, timeoutMs }),
          ] as const,
      ),
      ['fine', createDestination({ alias: 'fine', url: `${fine.origin}/hooks`, secret: KEY })],
    ]);
    const records: DeliveryRecord[] = [];
    const aliases = Object.keys(origins);
    const s = createCompletionSender({
      store,
      destinations,
      idleIntervalMs: 10,
      batchSize: aliases.length, // every slot taken by a hostile receiver
      retryBaseMs: 1_000,
      onDelivery: (record) => records.push(record),
    });
    senders.push(s);
    const subs = new Map<string, Awaited<ReturnType<typeof subscribe>>>();
    for (const alias of aliases) {
      subs.set(alias, await subscribe(store, scope, await finishTask(store, scope), alias));
    }
    const started = performance.now();
    s.start();
    await vi.waitFor(() => expect(records).toHaveLength(aliases.length), {
      timeout: 15_000,
      interval: 20,
    });
    // Every slot free again: a new delivery goes out through the same window.
    const after = await subscribe(store, scope, await finishTask(store, scope, 'failed'), 'fine');
    await vi.waitFor(
      async () => expect((await subscriptionOf(store, scope, after)).state).toBe('delivered'),
      { timeout: 10_000, interval: 20 },
    );
    // Each window try ended within its deadline plus a margin (longest here 3 s connect cap).
    expect(performance.now() - started).toBeLessThan(15_000);

    const by = new Map(records.map((r) => [r.destination, r]));
    // Exactly one record per try.
    expect(records.filter((r) => r.destination !== 'fine')).toHaveLength(aliases.length);
    expect(new Set(records.map((r) => r.subscriptionId)).size).toBe(records.length);
    expect(by.get('redirect')).toMatchObject({ outcome: 'retry', reason: 'redirect', status: 302 });
    expect(by.get('bare101')).toMatchObject({ outcome: 'retry', reason: 'status', status: 101 });
    expect(by.get('hints')).toMatchObject({ outcome: 'retry', reason: 'timeout' });
    expect(by.get('hang')).toMatchObject({ outcome: 'retry', reason: 'timeout' });
    expect(by.get('cutHead')).toMatchObject({ outcome: 'retry', reason: 'network' });
    expect(by.get('brokenChunked')).toMatchObject({ outcome: 'delivered', status: 202 });
    expect(by.get('gone')).toMatchObject({ outcome: 'gone', status: 410 });
    expect(by.get('limited')).toMatchObject({ outcome: 'retry', reason: 'status', status: 429 });
    expect(['network', 'connect_timeout']).toContain(by.get('nowhere')?.reason);
    expect(by.get('badTls')).toMatchObject({ outcome: 'retry', reason: 'network' });
    expect(['timeout', 'connect_timeout']).toContain(by.get('stalledTls')?.reason);
    expect(by.get('trickle')).toMatchObject({ outcome: 'delivered', status: 200 });
    for (const r of records)
      expect(r.status === undefined || Number.isInteger(r.status)).toBe(true);

    const state = async (alias: string) => {
      const id = subs.get(alias);
      if (id === undefined) throw new Error(`no subscription for ${alias}`);
      return subscriptionOf(store, scope, id);
    };
    expect(await state('gone')).toMatchObject({ state: 'exhausted', last_status_code: 410 });
    expect(await state('limited')).toMatchObject({
      state: 'due',
      next_attempt_at: T0 + 120_000,
      last_status_code: 429,
    });
    expect(await state('redirect')).toMatchObject({
      state: 'due',
      last_status_code: 302,
      last_error: 'redirect 302 not followed',
    });
    expect(await state('trickle')).toMatchObject({ state: 'delivered', attempts: 1 });
    expect(await state('brokenChunked')).toMatchObject({ state: 'delivered', attempts: 1 });
    expect(await state('cutHead')).toMatchObject({ state: 'due', attempts: 1 });
    expect((await state('cutHead')).last_status_code).toBeUndefined();

    // Both 2xx receivers that recorded their request can verify it with standardwebhooks.
    expect(signed.length).toBeGreaterThanOrEqual(2);
    for (const request of signed) {
      expect(
        new Webhook(SECRET_TEXT).verify(
          request.body.toString('utf8'),
          request.headers as Record<string, string>,
        ),
      ).toMatchObject({ id: request.headers['webhook-id'], type: 'dev.ledgence.task.completed' });
    }
    await s.stop();
  }, 40_000);
});

describe('signatures on every try and every event', () => {
  it('each try of a succeeded and a failed task, and a redelivery, verifies with standardwebhooks', async () => {
    const got: ReceivedRequest[] = [];
    const r = await startReceiver((res, request, index) => {
      got.push(request);
      res.writeHead(index < 2 ? 503 : 200).end();
    });
    open.push(r);
    const destinations: Destinations = new Map([
      ['billing', createDestination({ alias: 'billing', url: `${r.origin}/h`, secret: KEY })],
    ]);
    const s = createCompletionSender({ store, destinations, idleIntervalMs: 10, retryBaseMs: 1 });
    senders.push(s);
    const a = await subscribe(store, scope, await finishTask(store, scope, 'succeeded'), 'billing');
    const b = await subscribe(store, scope, await finishTask(store, scope, 'failed'), 'billing');
    for (let i = 0; i < 6; i++) {
      await s.runOnce();
      store.advance(10);
    }
    expect((await subscriptionOf(store, scope, a)).state).toBe('delivered');
    expect((await subscriptionOf(store, scope, b)).state).toBe('delivered');
    await store.redeliver(scope, a.id, { generation: 1 });
    await s.runOnce();
    expect(got.length).toBeGreaterThanOrEqual(5);
    const states = new Set<string>();
    for (const request of got) {
      const verified = new Webhook(SECRET_TEXT).verify(
        request.body.toString('utf8'),
        request.headers as Record<string, string>,
      ) as { id: string; data: { state: string } };
      expect(verified.id).toBe(request.headers['webhook-id']);
      states.add(verified.data.state);
    }
    expect([...states].sort()).toEqual(['failed', 'succeeded']);
  });
});
