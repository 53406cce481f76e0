/**
 * Receiver behaviours of one delivery try not covered elsewhere — a redirect to
 * another host (307/308, absolute Location), an endless stream of 1xx interim answers, a reset
 * in the middle of the response head, a head completed then reset, an unsolicited 100 Continue,
 * 429 with Retry-After, and a destination host name that does not resolve.
 */
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildCompletionEvent } from '@ledgence/contracts';
import { afterEach, describe, expect, it } from 'vitest';
import { deliverEvent, encodeCompletionEvent } from './deliver.js';
import { createDestination, type Destination } from './destinations.js';
import { type Receiver, startRawReceiver, startReceiver } from './testdata/receiver.js';

const KEY = Buffer.alloc(32, 0x33);
const event = encodeCompletionEvent(
  buildCompletionEvent({
    scope: { tenant_id: 'acme', namespace: 'prod' },
    queue: 'email',
    task_id: 'tsk_1',
    run_id: 'run_1',
    state: 'succeeded',
    event_id: 'evt_cb',
    time: Date.UTC(2026, 10, 29, 12),
  }),
);
const open: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((s) => s.close()));
});
const dest = (url: string, timeoutMs = 5_000): Destination =>
  createDestination({ alias: 'billing', url, secret: KEY, timeoutMs });
async function timed<T>(p: Promise<T>): Promise<[T, number]> {
  const t = performance.now();
  const v = await p;
  return [v, performance.now() - t];
}

describe('redirects', () => {
  it.each([301, 303, 307, 308])(
    'a %i to another host is not followed: the other host sees nothing, no signature leaks',
    async (status) => {
      const other: Receiver = await startReceiver((res) => res.end('ok'));
      open.push(other);
      // Another "host": localhost instead of 127.0.0.1, another port.
      const otherUrl = other.origin.replace('127.0.0.1', 'localhost');
      const r = await startReceiver((res) =>
        res.writeHead(status, { location: `${otherUrl}/steal`, 'retry-after': '3' }).end(),
      );
      open.push(r);
      const outcome = await deliverEvent({ destination: dest(`${r.origin}/hook`), event });
      expect(outcome).toEqual({
        kind: 'retry',
        reason: 'redirect',
        status,
        error: `redirect ${status} not followed`,
        retryAfterMs: 3_000,
      });
      await sleep(200);
      expect(other.requests).toEqual([]);
      expect(r.requests).toHaveLength(1);
    },
  );
});

describe('statuses', () => {
  it('429 with Retry-After seconds is a retry carrying the delay; 4xx and 5xx alike', async () => {
    for (const [status, ra] of [
      [429, '120'],
      [400, undefined],
      [500, '1'],
    ] as const) {
      const r = await startReceiver((res) =>
        res.writeHead(status, ra === undefined ? {} : { 'retry-after': ra }).end('no'),
      );
      open.push(r);
      const outcome = await deliverEvent({ destination: dest(r.origin), event });
      expect(outcome).toEqual({
        kind: 'retry',
        reason: 'status',
        status,
        error: `status ${status}`,
        ...(ra === undefined ? {} : { retryAfterMs: Number(ra) * 1000 }),
      });
    }
  });
});

describe('interim and broken heads', () => {
  it('an endless stream of 103 Early Hints ends at the total deadline', async () => {
    const r = await startRawReceiver((socket) => {
      socket.once('data', () => {
        const timer = setInterval(() => {
          if (socket.destroyed) return clearInterval(timer);
          socket.write('HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n');
        }, 5);
        socket.on('close', () => clearInterval(timer));
      });
    });
    open.push(r);
    const [outcome, ms] = await timed(deliverEvent({ destination: dest(r.origin, 700), event }));
    expect(outcome).toMatchObject({ kind: 'retry', reason: 'timeout' });
    // Ended by the 700 ms deadline, not by the stream of 1xx (which never ends): a bound.
    expect(ms).toBeLessThan(5_000);
  });

  it('an unsolicited 100 Continue then 200 is delivered', async () => {
    const r = await startRawReceiver((socket) => {
      socket.once('data', () =>
        socket.write('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n'),
      );
    });
    open.push(r);
    expect(await deliverEvent({ destination: dest(r.origin), event })).toEqual({
      kind: 'delivered',
      status: 200,
    });
  });

  it('a reset in the middle of the head (fresh connection) is a network retry, at once', async () => {
    const r = await startRawReceiver((socket) => {
      socket.once('data', () => {
        socket.write('HTTP/1.1 200 OK\r\ncontent-le');
        setTimeout(() => socket.resetAndDestroy(), 30);
      });
    });
    open.push(r);
    const [outcome, ms] = await timed(deliverEvent({ destination: dest(r.origin), event }));
    expect(outcome).toMatchObject({ kind: 'retry', reason: 'network' });
    // At the reset, not at the try's deadline (5 s).
    expect(ms).toBeLessThan(4_000);
  });

  it('a complete 200 head then a reset is delivered', async () => {
    const r = await startRawReceiver((socket) => {
      socket.once('data', () => {
        socket.write('HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nabc');
        setTimeout(() => socket.resetAndDestroy(), 30);
      });
    });
    open.push(r);
    expect(await deliverEvent({ destination: dest(r.origin), event })).toEqual({
      kind: 'delivered',
      status: 200,
    });
  });
});

describe('names', () => {
  it('a host name that does not resolve is a network retry within the connect timeout', async () => {
    const [outcome, ms] = await timed(
      deliverEvent({ destination: dest('http://no-such-host.invalid/hook', 10_000), event }),
    );
    expect(outcome).toMatchObject({ kind: 'retry' });
    expect(['network', 'connect_timeout']).toContain((outcome as { reason: string }).reason);
    // Within the connect timeout (10 s).
    expect(ms).toBeLessThan(10_000);
  });
});
