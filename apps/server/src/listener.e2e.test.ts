/**
 * The listener's own refusals, over a real socket with the listener alone in front of a `fetch`
 * that stands for the app: what a refusal made before the app (or after it failed) reports of
 * its request. The server's tests (server.int, http-edge.e2e) cover the refusals through the
 * whole app; here the app can fail in ways its error mapping never lets it.
 */
import { type AddressInfo, connect } from 'node:net';
import type { HttpResponseInfo } from '@ledgence/http';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { createListeningServer, type ListeningServerOptions } from './listener.js';

const closing: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closing.splice(0)) await close();
});

/** The one reply to `request`, sent on a connection of its own that the reply closes. */
function rawExchange(
  port: number,
  request: string,
): Promise<{ status: number; headers: Record<string, string>; body: string }> {
  return new Promise((resolve, reject) => {
    let text = '';
    const socket = connect(port, '127.0.0.1', () => socket.write(request));
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      text += chunk;
    });
    socket.on('error', reject);
    socket.on('close', () => {
      const split = text.indexOf('\r\n\r\n');
      const [statusLine = '', ...fields] = text.slice(0, split).split('\r\n');
      const headers = Object.fromEntries(
        fields.map((field) => {
          const colon = field.indexOf(':');
          return [field.slice(0, colon).toLowerCase(), field.slice(colon + 1).trim()];
        }),
      );
      resolve({ status: Number(statusLine.split(' ')[1]), headers, body: text.slice(split + 4) });
    });
  });
}

/** A listening edge in front of `fetch`, with its log lines and counted requests. */
async function edge(fetch: ListeningServerOptions['fetch']): Promise<{
  port: number;
  lines: Record<string, unknown>[];
  counted: HttpResponseInfo[];
}> {
  const lines: Record<string, unknown>[] = [];
  const counted: HttpResponseInfo[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  const server = createListeningServer({
    fetch,
    hostname: '127.0.0.1',
    logger,
    metrics: { observeHttp: (info) => counted.push(info) },
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closing.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return { port: (server.address() as AddressInfo).port, lines, counted };
}

describe('a request the app fails to answer (its fetch rejects)', () => {
  it('is 503 unavailable with its own request id, its fault logged with that id and its request line counted', async () => {
    const { port, lines, counted } = await edge(async () => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      throw new Error('the app broke');
    });
    const reply = await rawExchange(
      port,
      'POST /v1/anything HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-id: fault-1\r\n' +
        'content-length: 0\r\nconnection: close\r\n\r\n',
    );
    expect(reply.status).toBe(503);
    expect(reply.headers['x-request-id']).toBe('fault-1');
    expect(reply.headers['content-type']).toBe('application/problem+json');
    expect(JSON.parse(reply.body)).toMatchObject({ code: 'unavailable', status: 503 });
    const fault = lines.find((line) => line.msg === 'request failed outside the app');
    expect(fault).toMatchObject({ request_id: 'fault-1', err: { message: 'the app broke' } });
    const request = lines.find((line) => line.msg === 'request');
    expect(request).toMatchObject({
      request_id: 'fault-1',
      method: 'POST',
      status: 503,
      remote_address: '127.0.0.1',
    });
    // The arrival is the request's own: its duration covers the app's 5 ms before it failed.
    expect(request?.duration_ms).toBeGreaterThanOrEqual(4);
    expect(counted).toEqual([expect.objectContaining({ status: 503, method: 'POST' })]);
  });
});

describe('a request @hono/node-server cannot make a Request of', () => {
  it('is 400 with its own request id, method and peer, while a request ahead of it on another connection is still served', async () => {
    let release = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const { port, lines } = await edge(async () => {
      await held;
      return new Response('ok');
    });
    // A request the app is still serving when the refused one arrives: the refusal must report
    // its own request, not the one in flight.
    const slow = rawExchange(
      port,
      'GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-id: slow-1\r\nconnection: close\r\n\r\n',
    );
    await new Promise((resolve) => setTimeout(resolve, 50));
    const refused = await rawExchange(
      port,
      'DELETE /v1\\tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-id: refused-1\r\n' +
        'connection: close\r\n\r\n',
    );
    release();
    const served = await slow;
    expect(served.status).toBe(200);
    expect(refused.status).toBe(400);
    expect(refused.headers['x-request-id']).toBe('refused-1');
    expect(JSON.parse(refused.body)).toMatchObject({
      code: 'invalid_input',
      reason: 'malformed_request',
    });
    const line = lines.find((l) => l.msg === 'request' && l.request_id === 'refused-1');
    expect(line).toMatchObject({
      method: 'DELETE',
      status: 400,
      detail: 'Backslash in request path',
      remote_address: '127.0.0.1',
    });
  });
});
