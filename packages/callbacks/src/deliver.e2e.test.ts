/**
 * deliverEvent against real receivers on 127.0.0.1 (no network mocks): what
 * the receiver gets, and the outcome of every way a receiver can answer —
 * or fail to.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { globalAgent } from 'node:http';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildCompletionEvent, COMPLETION_RESPONSE_MAX_BYTES } from '@ledgence/contracts';
import { Webhook } from 'standardwebhooks';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  CLOUDEVENTS_CONTENT_TYPE,
  type DeliveryOutcome,
  deliverEvent,
  encodeCompletionEvent,
} from './deliver.js';
import { createDestination, type Destination } from './destinations.js';
import {
  type Answer,
  type RawAnswer,
  type Receiver,
  startRawReceiver,
  startReceiver,
} from './testdata/receiver.js';

const KEY = Buffer.alloc(32, 0x5a);
const SECRET_TEXT = `whsec_${KEY.toString('base64')}`;
const event = encodeCompletionEvent(
  buildCompletionEvent({
    scope: { tenant_id: 'acme', namespace: 'prod' },
    queue: 'email',
    task_id: 'tsk_1',
    run_id: 'run_1',
    state: 'succeeded',
    event_id: 'evt_019ad1c2e3f47a1b8c9d0e1f2a3b4c5d',
    time: Date.UTC(2026, 10, 29, 12),
  }),
);

const open: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((server) => server.close()));
});

async function receiver(answer: Answer): Promise<Receiver> {
  const started = await startReceiver(answer);
  open.push(started);
  return started;
}

async function rawReceiver(answer: RawAnswer): Promise<{ origin: string }> {
  const started = await startRawReceiver(answer);
  open.push(started);
  return started;
}

/** A raw receiver answering every request with `head` (a status line and headers), no body. */
function answering(head: string): Promise<{ origin: string }> {
  return rawReceiver((socket) => {
    socket.once('data', () => socket.end(`${head}\r\ncontent-length: 0\r\n\r\n`));
  });
}

function destination(url: string, timeoutMs = 5_000): Destination {
  return createDestination({ alias: 'billing', url, secret: KEY, timeoutMs });
}

/** The hand-written Standard Webhooks check a receiver would do, without the library. */
function handVerify(headers: Record<string, string | string[] | undefined>, body: Buffer): boolean {
  const id = String(headers['webhook-id']);
  const timestamp = String(headers['webhook-timestamp']);
  const expected = createHmac('sha256', KEY).update(`${id}.${timestamp}.`).update(body).digest();
  return String(headers['webhook-signature'])
    .split(' ')
    .some((entry) => {
      const [version, signature] = entry.split(',');
      if (version !== 'v1' || signature === undefined) return false;
      const given = Buffer.from(signature, 'base64');
      return given.length === expected.length && timingSafeEqual(given, expected);
    });
}

async function timed(call: Promise<DeliveryOutcome>): Promise<[DeliveryOutcome, number]> {
  const start = performance.now();
  const outcome = await call;
  return [outcome, performance.now() - start];
}

describe('a 2xx receiver', () => {
  it('gets exactly the event bytes with CloudEvents and Standard Webhooks headers', async () => {
    const r = await receiver((res) => res.writeHead(204).end());
    const before = Math.floor(Date.now() / 1000);
    const outcome = await deliverEvent({
      destination: destination(`${r.origin}/hooks/ledgence?x=1`),
      event,
    });
    expect(outcome).toEqual({ kind: 'delivered', status: 204 });
    expect(r.requests).toHaveLength(1);
    const [got] = r.requests;
    if (got === undefined) throw new Error('no request');
    expect(got.method).toBe('POST');
    expect(got.path).toBe('/hooks/ledgence?x=1');
    expect(got.body.equals(event.body)).toBe(true);
    expect(JSON.parse(got.body.toString('utf8')).id).toBe(event.id);
    expect(got.headers['content-type']).toBe(CLOUDEVENTS_CONTENT_TYPE);
    expect(got.headers['content-length']).toBe(String(event.body.byteLength));
    expect(got.headers['webhook-id']).toBe(event.id);
    const timestamp = Number(got.headers['webhook-timestamp']);
    expect(timestamp).toBeGreaterThanOrEqual(before);
    expect(timestamp).toBeLessThanOrEqual(Math.floor(Date.now() / 1000));
    expect(got.headers['webhook-signature']).toMatch(/^v1,[A-Za-z0-9+/]{43}=$/);
    // The receiver side of the contract: the library and a hand-written check both accept it.
    const payload = new Webhook(SECRET_TEXT).verify(
      got.body.toString('utf8'),
      got.headers as Record<string, string>,
    );
    expect(payload).toEqual(JSON.parse(event.body.toString('utf8')));
    expect(handVerify(got.headers, got.body)).toBe(true);
    expect(handVerify(got.headers, Buffer.concat([got.body, Buffer.from(' ')]))).toBe(false);
  });

  it('is delivered with a body of exactly the response limit', async () => {
    const r = await receiver((res) => res.end(Buffer.alloc(COMPLETION_RESPONSE_MAX_BYTES, 0x61)));
    expect(await deliverEvent({ destination: destination(r.origin), event })).toEqual({
      kind: 'delivered',
      status: 200,
    });
  });
});

describe('retries', () => {
  it('send the same id and identical bytes on every try (500, then 200)', async () => {
    const r = await receiver((res, _request, index) => {
      res.writeHead(index === 0 ? 500 : 200).end('ok');
    });
    const first = await deliverEvent({ destination: destination(r.origin), event });
    expect(first).toEqual({ kind: 'retry', reason: 'status', status: 500, error: 'status 500' });
    // A later try signs with its own timestamp; id and body do not change.
    const second = await deliverEvent({
      destination: destination(r.origin),
      event,
      now: () => Date.now() + 2_000,
    });
    expect(second).toEqual({ kind: 'delivered', status: 200 });
    const [a, b] = r.requests;
    if (a === undefined || b === undefined) throw new Error('expected two requests');
    expect(b.headers['webhook-id']).toBe(a.headers['webhook-id']);
    expect(b.body.equals(a.body)).toBe(true);
    expect(b.headers['webhook-timestamp']).not.toBe(a.headers['webhook-timestamp']);
    for (const got of [a, b]) {
      expect(handVerify(got.headers, got.body)).toBe(true);
      expect(() =>
        new Webhook(SECRET_TEXT).verify(
          got.body.toString('utf8'),
          got.headers as Record<string, string>,
        ),
      ).not.toThrow();
    }
  });

  it('on a 4xx other than 410', async () => {
    const r = await receiver((res) => res.writeHead(400).end());
    expect(await deliverEvent({ destination: destination(r.origin), event })).toMatchObject({
      kind: 'retry',
      reason: 'status',
      status: 400,
    });
  });

  it('stops on 410 Gone', async () => {
    const r = await receiver((res) => res.writeHead(410).end('gone'));
    expect(await deliverEvent({ destination: destination(r.origin), event })).toEqual({
      kind: 'gone',
      status: 410,
    });
  });

  it('never follows a redirect: a 302 is a failure and its Location is not requested', async () => {
    const r = await receiver((res, request) => {
      if (request.path === '/target') res.end('followed');
      else res.writeHead(302, { location: '/target' }).end();
    });
    const outcome = await deliverEvent({ destination: destination(`${r.origin}/hook`), event });
    expect(outcome).toEqual({
      kind: 'retry',
      reason: 'redirect',
      status: 302,
      error: 'redirect 302 not followed',
    });
    await sleep(100);
    expect(r.requests.map((request) => request.path)).toEqual(['/hook']);
  });

  it.each([
    ['099', 99],
    ['000', 0],
  ])(
    'on a status line %s outside 100..999, as a network failure without its status',
    async (code, parsed) => {
      // Node's parser takes any three digits; recorded, such a status would break the wire
      // contract of `last_status_code` (100..999).
      const r = await answering(`HTTP/1.1 ${code} Odd`);
      expect(await deliverEvent({ destination: destination(`${r.origin}/hook`), event })).toEqual({
        kind: 'retry',
        reason: 'network',
        error: `invalid status line (status ${parsed})`,
      });
    },
  );

  it('honour Retry-After in seconds', async () => {
    const r = await receiver((res) => res.writeHead(503, { 'retry-after': '7' }).end());
    expect(await deliverEvent({ destination: destination(r.origin), event })).toEqual({
      kind: 'retry',
      reason: 'status',
      status: 503,
      error: 'status 503',
      retryAfterMs: 7_000,
    });
  });

  it('honour Retry-After as an HTTP-date', async () => {
    const now = Date.UTC(2026, 10, 29, 18, 0, 0);
    const at = new Date(now + 90_000).toUTCString(); // e.g. 'Sun, 29 Nov 2026 18:01:30 GMT'
    const r = await receiver((res) => res.writeHead(429, { 'retry-after': at }).end());
    const outcome = await deliverEvent({
      destination: destination(r.origin),
      event,
      now: () => now,
    });
    expect(outcome).toMatchObject({ kind: 'retry', status: 429, retryAfterMs: 90_000 });
    // The signature still carries that clock's time.
    expect(r.requests[0]?.headers['webhook-timestamp']).toBe(String(now / 1000));
  });

  it('ignore a malformed Retry-After', async () => {
    const r = await receiver((res) => res.writeHead(503, { 'retry-after': 'soon' }).end());
    const outcome = await deliverEvent({ destination: destination(r.origin), event });
    expect(outcome).toMatchObject({ kind: 'retry', status: 503 });
    expect(outcome).not.toHaveProperty('retryAfterMs');
  });
});

describe('bounded in time', () => {
  it('retries a receiver that never answers at the total deadline', async () => {
    const r = await receiver(() => {});
    const [outcome, ms] = await timed(
      deliverEvent({ destination: destination(r.origin, 300), event }),
    );
    expect(outcome).toEqual({
      kind: 'retry',
      reason: 'timeout',
      error: 'no complete response within 300 ms',
    });
    expect(ms).toBeGreaterThanOrEqual(290);
    expect(ms).toBeLessThan(2_000);
    expect(r.requests).toHaveLength(1);
  });

  it('retries a head trickled a byte a second at the total deadline, not reset by each byte', async () => {
    const head = Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n');
    let sent = 0;
    const r = await rawReceiver((socket) => {
      const tick = setInterval(() => {
        if (socket.destroyed || sent === head.length) return clearInterval(tick);
        socket.write(head.subarray(sent, sent + 1));
        sent += 1;
      }, 1_000);
      socket.on('close', () => clearInterval(tick));
    });
    // Each gap (1 s) is shorter than the deadline (2.5 s): an idle timeout would never fire.
    const [outcome, ms] = await timed(
      deliverEvent({ destination: destination(r.origin, 2_500), event }),
    );
    expect(outcome).toMatchObject({ kind: 'retry', reason: 'timeout' });
    expect(ms).toBeGreaterThanOrEqual(2_490);
    // Slack for a loaded machine; an idle timeout would instead never end.
    expect(ms).toBeLessThan(5_000);
    expect(sent).toBeGreaterThanOrEqual(2);
  });

  it('delivers a 2xx whose body trickles at its status, and drains it no longer than the deadline', async () => {
    let closedAt: number | undefined;
    const r = await receiver((res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.flushHeaders();
      const tick = setInterval(() => res.write('x'), 200);
      res.on('close', () => {
        clearInterval(tick);
        closedAt = performance.now();
      });
    });
    const started = performance.now();
    const [outcome, ms] = await timed(
      deliverEvent({ destination: destination(r.origin, 1_500), event }),
    );
    expect(outcome).toEqual({ kind: 'delivered', status: 200 });
    expect(ms).toBeLessThan(1_000);
    // The drain goes on after the outcome, within the same total deadline.
    await vi.waitFor(() => expect(closedAt).toBeDefined(), { timeout: 5_000, interval: 20 });
    expect((closedAt ?? 0) - started).toBeGreaterThanOrEqual(1_400);
    expect((closedAt ?? 0) - started).toBeLessThan(4_000);
  });

  it('gives up on a connection that never completes, at the connect timeout', async () => {
    // A TCP listener that never speaks TLS: the https handshake stalls forever.
    const r = await rawReceiver(() => {});
    const { port } = new URL(r.origin);
    const [outcome, ms] = await timed(
      deliverEvent({
        destination: destination(`https://127.0.0.1:${port}/hook`, 5_000),
        event,
        connectTimeoutMs: 200,
      }),
    );
    expect(outcome).toEqual({
      kind: 'retry',
      reason: 'connect_timeout',
      error: 'no connection within 200 ms',
    });
    expect(ms).toBeGreaterThanOrEqual(190);
    expect(ms).toBeLessThan(2_000);
  });

  it('ends at once when the caller aborts', async () => {
    const r = await receiver(() => {});
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    const [outcome, ms] = await timed(
      deliverEvent({
        destination: destination(r.origin, 10_000),
        event,
        signal: controller.signal,
      }),
    );
    expect(outcome).toEqual({ kind: 'retry', reason: 'aborted', error: 'aborted' });
    expect(ms).toBeLessThan(2_000);
    expect(
      await deliverEvent({ destination: destination(r.origin), event, signal: controller.signal }),
    ).toMatchObject({ kind: 'retry', reason: 'aborted' });
  });
});

describe('bounded in size', () => {
  // DESIGN §8: at most 64 KiB of response read, and 2xx = delivered: a 2xx is decided at its
  // status line, whatever its body does next; any other answer is not read at all.
  it.each([
    [200, { kind: 'delivered', status: 200 }],
    [500, { kind: 'retry', reason: 'status', status: 500, error: 'status 500' }],
  ])(
    'stops reading a huge streamed %i body after the limit, without buffering it',
    async (status, expected) => {
      const TOTAL = 64 * 1024 * 1024;
      const chunk = Buffer.alloc(64 * 1024, 0x61);
      let written = 0;
      let closed!: () => void;
      const serverSawClose = new Promise<void>((resolve) => {
        closed = resolve;
      });
      const r = await receiver((res) => {
        // Chunked, no content-length: the client learns the size only by reading.
        res.writeHead(status, { 'content-type': 'application/octet-stream' });
        res.on('close', () => closed());
        const pump = (): void => {
          while (!res.destroyed && written < TOTAL) {
            written += chunk.length;
            if (!res.write(chunk)) {
              res.once('drain', pump);
              return;
            }
          }
          if (!res.destroyed) res.end();
        };
        pump();
      });
      const [outcome, ms] = await timed(
        deliverEvent({ destination: destination(r.origin, 30_000), event }),
      );
      expect(outcome).toEqual(expected);
      expect(ms).toBeLessThan(2_000);
      await serverSawClose;
      // The client hung up: the server could push only what the kernel buffers held, not 64 MiB.
      expect(written).toBeLessThan(TOTAL);
    },
  );

  it('delivers a 2xx declaring a content-length above the limit at its headers, unread', async () => {
    let closed!: () => void;
    const serverSawClose = new Promise<void>((resolve) => {
      closed = resolve;
    });
    const r = await receiver((res) => {
      // Headers only: the 10 MiB body never comes, so waiting for it would hit the deadline.
      res.writeHead(200, { 'content-length': String(10 * 1024 * 1024) });
      res.flushHeaders();
      res.on('close', () => closed());
    });
    const [outcome, ms] = await timed(
      deliverEvent({ destination: destination(r.origin, 10_000), event }),
    );
    expect(outcome).toEqual({ kind: 'delivered', status: 200 });
    expect(ms).toBeLessThan(2_000);
    // Not kept waiting for the body until the deadline: the client hung up at the headers.
    await serverSawClose;
  });

  it('delivers a 2xx whose body breaks off before its end', async () => {
    const r = await receiver((res) => {
      res.writeHead(200, { 'content-length': '100' });
      res.write('partial');
      setTimeout(() => res.destroy(), 50);
    });
    expect(await deliverEvent({ destination: destination(r.origin), event })).toEqual({
      kind: 'delivered',
      status: 200,
    });
  });
});

describe('connection failures', () => {
  it('retries when the port is closed (connection refused)', async () => {
    const r = await startReceiver(() => {});
    await r.close();
    const outcome = await deliverEvent({ destination: destination(r.origin), event });
    expect(outcome).toEqual({
      kind: 'retry',
      reason: 'network',
      error: 'connection failed: ECONNREFUSED',
    });
  });

  it('retries when the receiver drops the connection without answering', async () => {
    const r = await receiver((res) => res.socket?.destroy());
    expect(await deliverEvent({ destination: destination(r.origin), event })).toMatchObject({
      kind: 'retry',
      reason: 'network',
    });
  });
});

/**
 * A raw receiver that answers the first request of each of its first `answered` connections
 * with a kept-alive 200, and ends any other request as it arrives, without an answer: `reset`
 * (RST) or `close` (FIN), the two ways a server's keep-alive timeout meets a reused connection.
 */
async function closingReused(
  how: 'reset' | 'close',
  answered: number,
): Promise<{ origin: string; connections: number[] }> {
  // Per connection, the number of requests it carried (complete or not).
  const connections: number[] = [];
  const r = await rawReceiver((socket) => {
    const index = connections.push(0) - 1;
    let pending = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      const headEnd = pending.indexOf('\r\n\r\n');
      if (headEnd < 0) return;
      if ((connections[index] ?? 0) > 0 || index >= answered) {
        connections[index] = (connections[index] ?? 0) + 1;
        if (how === 'reset') socket.resetAndDestroy();
        else socket.end();
        return;
      }
      const length = Number(/content-length: *(\d+)/i.exec(pending.toString('latin1'))?.[1]);
      if (pending.byteLength < headEnd + 4 + length) return;
      pending = pending.subarray(headEnd + 4 + length);
      connections[index] = 1;
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n');
    });
  });
  return { ...r, connections };
}

/** Resolves once the global agent holds an idle connection to `origin`, ready for reuse. */
async function pooled(origin: string): Promise<void> {
  const { hostname, port } = new URL(origin);
  const key = globalAgent.getName({ host: hostname, port: Number(port) });
  while ((globalAgent.freeSockets[key]?.length ?? 0) === 0) await sleep(1);
}

describe('a kept-alive connection the receiver closes as it is reused', () => {
  it.each(['reset', 'close'] as const)(
    'is no failed try: the event goes again on a new connection and is delivered (%s)',
    async (how) => {
      const r = await closingReused(how, 2);
      const to = destination(r.origin);
      expect(await deliverEvent({ destination: to, event })).toEqual({
        kind: 'delivered',
        status: 200,
      });
      await pooled(r.origin);
      expect(await deliverEvent({ destination: to, event })).toEqual({
        kind: 'delivered',
        status: 200,
      });
      // The first connection carried the first event and the second's lost send.
      expect(r.connections).toEqual([2, 1]);
    },
  );

  it('is sent again once, not again when the new connection fails as well', async () => {
    const r = await closingReused('reset', 1);
    const to = destination(r.origin);
    await deliverEvent({ destination: to, event });
    await pooled(r.origin);
    expect(await deliverEvent({ destination: to, event })).toEqual({
      kind: 'retry',
      reason: 'network',
      error: 'connection failed: ECONNRESET',
    });
    expect(r.connections).toEqual([2, 1]);
  });
});

describe('caller bugs reject instead of sending', () => {
  it('a destination copied by spread (the key is not enumerable)', async () => {
    const copy = { ...destination('http://127.0.0.1:9/') } as Destination;
    await expect(deliverEvent({ destination: copy, event })).rejects.toThrow(
      'destination "billing" has no signing key',
    );
  });

  it('a non-http URL', async () => {
    const bad = createDestination({ alias: 'a', url: 'ftp://127.0.0.1/', secret: KEY });
    await expect(deliverEvent({ destination: bad, event })).rejects.toThrow(TypeError);
  });
});
