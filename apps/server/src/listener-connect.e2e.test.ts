/**
 * CONNECT as the listener answers it (review r49a) — a CONNECT pipelined behind a
 * request still being served, and a CONNECT whose client keeps its side of the connection open.
 * The listener alone in front of a `fetch` standing for the app, over real sockets.
 */

import type { Server } from 'node:http';
import { type AddressInfo, connect, type Socket } from 'node:net';
import type { HttpResponseInfo } from '@ledgence/http';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { createListeningServer, type ListeningServerOptions } from './listener.js';

const closing: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closing.splice(0)) await close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function edge(fetch: ListeningServerOptions['fetch']): Promise<{
  server: Server;
  port: number;
  lines: Record<string, unknown>[];
  counted: HttpResponseInfo[];
  uncaught: unknown[];
}> {
  const lines: Record<string, unknown>[] = [];
  const counted: HttpResponseInfo[] = [];
  const uncaught: unknown[] = [];
  const onUncaught = (error: unknown) => uncaught.push(error);
  process.on('uncaughtException', onUncaught);
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  const server = createListeningServer({
    fetch,
    hostname: '127.0.0.1',
    logger,
    metrics: { observeHttp: (info) => counted.push(info) },
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closing.push(async () => {
    process.off('uncaughtException', onUncaught);
    server.closeAllConnections();
    await Promise.race([
      new Promise<void>((resolve) => server.close(() => resolve())),
      sleep(2000),
    ]);
  });
  return { server, port: (server.address() as AddressInfo).port, lines, counted, uncaught };
}

/** Opens a raw connection that keeps its side open once the server ends its own. */
async function open(
  port: number,
): Promise<{ socket: Socket; text: () => string; ended: Promise<void> }> {
  let text = '';
  const socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  socket.setEncoding('latin1');
  socket.on('data', (chunk: string) => {
    text += chunk;
  });
  socket.on('error', () => {});
  const ended = new Promise<void>((resolve) => {
    socket.once('end', () => resolve());
    socket.once('close', () => resolve());
  });
  closing.push(async () => {
    socket.destroy();
  });
  await new Promise((resolve) => socket.once('connect', resolve));
  return { socket, text: () => text, ended };
}

const connections = (server: Server) =>
  new Promise<number>((resolve, reject) =>
    server.getConnections((error, n) => (error ? reject(error) : resolve(n))),
  );

describe('a CONNECT pipelined behind a request the app is still serving (README: pipelined requests are answered in order)', () => {
  it('the request ahead is answered first, with its own reply, and nothing crashes', async () => {
    const { port, uncaught } = await edge(async (request) => {
      if (new URL(request.url).pathname === '/slow') await sleep(300);
      return new Response('first-reply', { headers: { 'x-which': 'slow' } });
    });
    const { socket, text, ended } = await open(port);
    socket.write(
      'GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-id: lc-slow\r\n\r\n' +
        'CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-id: lc-connect\r\n\r\n',
    );
    await ended;
    await sleep(500); // the slow reply's turn has come and gone
    const all = text();
    const firstHead = all.slice(0, all.indexOf('\r\n\r\n'));
    // The first reply on the connection must be the first request's.
    expect({ firstHead, uncaught: uncaught.map(String) }).toEqual({
      firstHead: expect.stringMatching(/^HTTP\/1\.1 200[\s\S]*x-which: slow/i),
      uncaught: [],
    });
  });
});

describe('a CONNECT whose client keeps its side of the connection open', () => {
  it('does not keep the server holding the connection: closeAllConnections/close end it, as they do a kept-alive one', async () => {
    const { server, port } = await edge(async () => new Response('ok'));
    const { socket, text, ended } = await open(port);
    socket.write('CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-id: lc-c2\r\n\r\n');
    await ended; // the 400 problem document and the server's FIN arrived
    expect(text()).toMatch(/^HTTP\/1\.1 400 /);
    server.closeAllConnections();
    const closed = new Promise<'closed'>((resolve) => server.close(() => resolve('closed')));
    expect(await Promise.race([closed, sleep(3000).then(() => 'still open')])).toBe('closed');
  });

  it('control: a kept-alive connection after a GET is ended by closeAllConnections/close', async () => {
    const { server, port } = await edge(async () => new Response('ok'));
    const { socket, text } = await open(port);
    socket.write('GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
    while (!text().includes('ok')) await sleep(20);
    server.closeAllConnections();
    const closed = new Promise<'closed'>((resolve) => server.close(() => resolve('closed')));
    expect(await Promise.race([closed, sleep(3000).then(() => 'still open')])).toBe('closed');
  });

  it("is not held past node's keep-alive timeout (5 s) once answered", async () => {
    const { server, port } = await edge(async () => new Response('ok'));
    const { socket, ended } = await open(port);
    socket.write('CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
    await ended;
    // Well past keepAliveTimeout (5 s): an idle kept-alive connection is gone by then.
    await sleep(8000);
    expect(await connections(server)).toBe(0);
  }, 20_000);
});
