/**
 * One delivery try against hostile or odd receivers over real sockets, for what the
 * other deliver tests do not cover — Retry-After values that are garbage yet start with a day
 * name, a bare 101, unsolicited bytes on a pooled connection, broken chunked encodings, and TLS
 * (an untrusted certificate; a kept-alive TLS connection closed as it is reused).
 */
import { readFileSync } from 'node:fs';
import { globalAgent as httpsGlobalAgent } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createServer as createTlsServer, type TLSSocket } from 'node:tls';
import { fileURLToPath } from 'node:url';
import { buildCompletionEvent } from '@ledgence/contracts';
import { afterEach, describe, expect, it } from 'vitest';
import { deliverEvent, encodeCompletionEvent } from './deliver.js';
import { createDestination, type Destination } from './destinations.js';
import { startRawReceiver, startReceiver } from './testdata/receiver.js';

const KEY = Buffer.alloc(32, 0x44);
const event = encodeCompletionEvent(
  buildCompletionEvent({
    scope: { tenant_id: 'acme', namespace: 'prod' },
    queue: 'email',
    task_id: 'tsk_1',
    run_id: 'run_1',
    state: 'succeeded',
    event_id: 'evt_hostile',
    time: Date.UTC(2026, 10, 29, 12),
  }),
);
const TLS_DIR = join(dirname(fileURLToPath(import.meta.url)), '../../../e2e/src/testdata/tls');
const CERT = readFileSync(join(TLS_DIR, 'localhost-test-only.crt'));
const TLS_KEY = readFileSync(join(TLS_DIR, 'localhost-test-only.key'));

const open: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((s) => s.close()));
});
const dest = (url: string, timeoutMs = 3_000): Destination =>
  createDestination({ alias: 'billing', url, secret: KEY, timeoutMs });

/** A raw receiver answering every complete request head with `answer(index)`. */
async function answering(answer: (socket: Socket, index: number) => void) {
  let index = 0;
  const r = await startRawReceiver((socket) => {
    let pending = '';
    socket.on('data', (chunk: Buffer) => {
      pending += chunk.toString('latin1');
      const end = pending.indexOf('\r\n\r\n');
      if (end < 0) return;
      const length = Number(/content-length: *(\d+)/i.exec(pending)?.[1] ?? 0);
      if (pending.length < end + 4 + length) return;
      pending = pending.slice(end + 4 + length);
      answer(socket, index++);
    });
  });
  open.push(r);
  return r;
}

describe('Retry-After that is not a valid value', () => {
  // deliver.ts parseRetryAfterMs: "`undefined` when absent or malformed, so a broken header
  // falls back to the normal backoff"; contracts retry-after.ts: "undefined when absent or
  // malformed". None of these is delay-seconds or an HTTP-date (RFC 9110 §5.6.7: IMF-fixdate,
  // rfc850-date, asctime-date, all GMT).
  it.each([
    [503, 'Fri x 2027'],
    [429, 'Sun 2030'],
    [429, 'Thu, 01 Jan 2026 00:10:00 +0500'],
  ])(
    'a %i with Retry-After %j falls back to the backoff (no retryAfterMs)',
    async (status, value) => {
      const r = await startReceiver((res) => res.writeHead(status, { 'retry-after': value }).end());
      open.push(r);
      const outcome = await deliverEvent({
        destination: dest(r.origin),
        event,
        now: () => Date.UTC(2026, 0, 1),
      });
      expect(outcome).toEqual({
        kind: 'retry',
        reason: 'status',
        status,
        error: `status ${status}`,
      });
    },
  );

  it.each([
    ['-1', undefined],
    ['1.5', undefined],
    ['Thu, 01 Jan 1970 00:00:00 GMT', 0],
    ['99999999999999999999999', 3_600_000],
  ])('a 503 with Retry-After %j gives retryAfterMs %j', async (value, expected) => {
    const r = await startReceiver((res) => res.writeHead(503, { 'retry-after': value }).end());
    open.push(r);
    const outcome = await deliverEvent({ destination: dest(r.origin), event });
    expect(outcome).toEqual({
      kind: 'retry',
      reason: 'status',
      status: 503,
      error: 'status 503',
      ...(expected === undefined ? {} : { retryAfterMs: expected }),
    });
  });
});

describe('interim answers', () => {
  it('a bare 101 (no Upgrade headers) is a failed try with its status, not waited out', async () => {
    const r = await answering((socket) => socket.write('HTTP/1.1 101 Switching Protocols\r\n\r\n'));
    const started = performance.now();
    const outcome = await deliverEvent({ destination: dest(r.origin, 20_000), event });
    expect(outcome).toEqual({ kind: 'retry', reason: 'status', status: 101, error: 'status 101' });
    // Decided at the status line, long before the 20 s deadline.
    expect(performance.now() - started).toBeLessThan(10_000);
  });
});

describe('a pooled connection', () => {
  it('bytes the receiver sends on an idle kept-alive connection do not answer the next POST', async () => {
    const r = await answering((socket, index) => {
      if (index === 0) {
        socket.write('HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n');
        // An unsolicited second 200 while the connection idles in the pool.
        setTimeout(() => socket.write('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n'), 50);
      } else {
        socket.write('HTTP/1.1 500 No\r\ncontent-length: 0\r\n\r\n');
      }
    });
    expect(await deliverEvent({ destination: dest(r.origin), event })).toEqual({
      kind: 'delivered',
      status: 200,
    });
    await sleep(200);
    // The receiver said 500 to this event: it must not be taken as delivered.
    expect(await deliverEvent({ destination: dest(r.origin), event })).toMatchObject({
      kind: 'retry',
    });
  });

  it('a 2xx with a broken chunked body is delivered, and the next try is not poisoned by it', async () => {
    const r = await answering((socket, index) => {
      if (index === 0) {
        socket.write(
          'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n3\r\nabc\r\nZZ\r\n',
        );
      } else {
        socket.write('HTTP/1.1 503 No\r\ncontent-length: 0\r\n\r\n');
      }
    });
    expect(await deliverEvent({ destination: dest(r.origin), event })).toEqual({
      kind: 'delivered',
      status: 200,
    });
    await sleep(50);
    expect(await deliverEvent({ destination: dest(r.origin), event })).toEqual({
      kind: 'retry',
      reason: 'status',
      status: 503,
      error: 'status 503',
    });
  });

  it('a 5xx with a broken chunked body is a status retry', async () => {
    const r = await answering((socket) =>
      socket.write('HTTP/1.1 500 No\r\ntransfer-encoding: chunked\r\n\r\nnot-hex\r\n'),
    );
    expect(await deliverEvent({ destination: dest(r.origin), event })).toEqual({
      kind: 'retry',
      reason: 'status',
      status: 500,
      error: 'status 500',
    });
  });

  it('a head with two different content-lengths is a network retry', async () => {
    const r = await answering((socket) =>
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd'),
    );
    const outcome = await deliverEvent({ destination: dest(r.origin), event });
    expect(outcome).toMatchObject({ kind: 'retry', reason: 'network' });
  });
});

describe('TLS', () => {
  async function tlsReceiver(onSocket: (socket: TLSSocket) => void) {
    const sockets = new Set<TLSSocket>();
    const server = createTlsServer({ cert: CERT, key: TLS_KEY }, (socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => {});
      onSocket(socket);
    });
    server.on('tlsClientError', () => {});
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const r = {
      origin: `https://127.0.0.1:${port}`,
      close: () =>
        new Promise<void>((resolve) => {
          for (const s of sockets) s.destroy();
          server.close(() => resolve());
        }),
    };
    open.push(r);
    return r;
  }

  it('an untrusted certificate is a network retry naming the check, and no request is read', async () => {
    let requests = 0;
    const r = await tlsReceiver((socket) => socket.on('data', () => (requests += 1)));
    const outcome = await deliverEvent({ destination: dest(`${r.origin}/hook`), event });
    expect(outcome).toMatchObject({ kind: 'retry', reason: 'network' });
    expect((outcome as { error: string }).error).toMatch(/^connection failed: [A-Z_]+$/);
    expect((outcome as { error: string }).error).not.toContain('127.0.0.1');
    await sleep(50);
    expect(requests).toBe(0);
  });

  it('a kept-alive TLS connection the receiver closes as it is reused is sent again and delivered', async () => {
    // Trust the test CA in this process's https agent (as NODE_EXTRA_CA_CERTS would).
    const before = httpsGlobalAgent.options.ca;
    httpsGlobalAgent.options.ca = CERT;
    try {
      const perConnection: number[] = [];
      const r = await tlsReceiver((socket) => {
        const index = perConnection.push(0) - 1;
        let pending = '';
        socket.on('data', (chunk: Buffer) => {
          pending += chunk.toString('latin1');
          const end = pending.indexOf('\r\n\r\n');
          if (end < 0) return;
          const length = Number(/content-length: *(\d+)/i.exec(pending)?.[1] ?? 0);
          if (pending.length < end + 4 + length) return;
          pending = pending.slice(end + 4 + length);
          perConnection[index] = (perConnection[index] ?? 0) + 1;
          // The first connection's second request meets its keep-alive timeout: dropped.
          if (index === 0 && perConnection[index] === 2) socket.destroy();
          else
            socket.write('HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n');
        });
      });
      const to = dest(`${r.origin}/hook`);
      expect(await deliverEvent({ destination: to, event })).toEqual({
        kind: 'delivered',
        status: 200,
      });
      const deadline = performance.now() + 5_000;
      while (
        Object.values(httpsGlobalAgent.freeSockets).every((list) => (list?.length ?? 0) === 0) &&
        performance.now() < deadline
      ) {
        await sleep(1);
      }
      expect(await deliverEvent({ destination: to, event })).toEqual({
        kind: 'delivered',
        status: 200,
      });
      expect(perConnection).toEqual([2, 1]);
    } finally {
      httpsGlobalAgent.options.ca = before;
    }
  });
});
