/**
 * One delivery try against real receivers (node:http on loopback).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { buildCompletionEvent } from '@ledgence/contracts';
import { afterEach, describe, expect, it } from 'vitest';
import { deliverEvent, encodeCompletionEvent } from './deliver.js';
import { parseDestinations } from './destinations.js';
import { startReceiver } from './testdata/receiver.js';

const SECRET = `whsec_${Buffer.alloc(32, 0x11).toString('base64')}`;
const event = encodeCompletionEvent(
  buildCompletionEvent({
    scope: { tenant_id: 'acme', namespace: 'prod' },
    queue: 'email',
    task_id: 'tsk_edges',
    run_id: 'run_edges',
    state: 'succeeded',
    event_id: 'evt_edges',
    time: 1_700_000_000_000,
  }),
);
const open: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((r) => r.close()));
});

function destination(url: string, timeoutMs = 2_000) {
  const d = parseDestinations(
    JSON.stringify({ hook: { url, secret: SECRET, timeout_ms: timeoutMs } }),
  ).get('hook');
  if (d === undefined) throw new Error('no destination');
  return d;
}

async function listen(
  host: string,
  handler: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<{ port: number; close(): Promise<void> }> {
  const server: Server = createServer(handler);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, resolve);
  });
  const r = {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  open.push(r);
  return r;
}

describe('destination URLs as operators write them', () => {
  it('posts to the path and query of the URL, never its fragment', async () => {
    const r = await startReceiver((res) => res.writeHead(204).end());
    open.push(r);
    const outcome = await deliverEvent({
      destination: destination(`${r.origin}/hooks/ledgence?tenant=acme&x=%20y#frag`),
      event,
    });
    expect(outcome).toEqual({ kind: 'delivered', status: 204 });
    expect(r.requests.map((q) => q.path)).toEqual(['/hooks/ledgence?tenant=acme&x=%20y']);
  });

  it('reaches an IPv6 literal destination ([::1])', async (ctx) => {
    let r: { port: number };
    try {
      r = await listen('::1', (req, res) => {
        req.resume();
        req.on('end', () => res.writeHead(200).end());
      });
    } catch {
      ctx.skip();
      return;
    }
    const outcome = await deliverEvent({
      destination: destination(`http://[::1]:${r.port}/h`),
      event,
    });
    expect(outcome).toEqual({ kind: 'delivered', status: 200 });
  });
});

describe('statuses', () => {
  it.each([301, 303, 307, 308])(
    'a %i is a redirect failure and its Location is not requested',
    async (status) => {
      const r = await startReceiver((res, req) => {
        if (req.path === '/hooks') res.writeHead(status, { location: '/elsewhere' }).end();
        else res.writeHead(200).end();
      });
      open.push(r);
      const outcome = await deliverEvent({ destination: destination(`${r.origin}/hooks`), event });
      expect(outcome).toMatchObject({ kind: 'retry', reason: 'redirect', status });
      expect(r.requests.map((q) => q.path)).toEqual(['/hooks']);
    },
  );

  it('a 410 carrying a Retry-After and a body is gone, at once', async () => {
    const r = await startReceiver((res) =>
      res.writeHead(410, { 'retry-after': '3600' }).end('x'.repeat(200_000)),
    );
    open.push(r);
    const outcome = await deliverEvent({ destination: destination(`${r.origin}/hooks`), event });
    expect(outcome).toEqual({ kind: 'gone', status: 410 });
  });

  it('a response head larger than Node accepts is a network retry, not a hang', async () => {
    const r = await startReceiver((res) => {
      res.writeHead(200, { 'x-big': 'a'.repeat(40_000) }).end();
    });
    open.push(r);
    const started = Date.now();
    const outcome = await deliverEvent({
      destination: destination(`${r.origin}/hooks`, 5_000),
      event,
    });
    expect(outcome).toMatchObject({ kind: 'retry', reason: 'network' });
    expect(Date.now() - started).toBeLessThan(4_000);
  });
});
