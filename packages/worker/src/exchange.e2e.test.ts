/**
 * Both exchanges over real loopback sockets, against small `node:http` servers that misbehave on
 * purpose: the same request, limit, deadline and abort rules for each, and the node exchange's
 * kept-alive connections (reused, and re-sent on when the server closed one under them).
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { createServer as createNetServer, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import {
  DeadlineExceeded,
  type Exchange,
  fetchExchange,
  nodeExchange,
  UnsendableRequest,
  type WireRequest,
} from './exchange.js';
import { type BodyHandler, bodyServer, stubServers } from './testdata/stub-servers.js';

interface TestServer {
  url: string;
  /** Requests seen, and on which connection (numbered in order of arrival). */
  seen: { connection: number; method: string; body: string; headers: IncomingMessage['headers'] }[];
  connections: number;
  server: Server;
}

const stubs = stubServers();
const exchanges: ReturnType<typeof nodeExchange>[] = [];
// Registered after the servers' teardown, so it runs first: exchanges close, then servers.
afterEach(() => {
  for (const exchange of exchanges.splice(0)) exchange.close();
});

async function serve(handler: BodyHandler): Promise<TestServer> {
  const ids = new WeakMap<Socket, number>();
  const seen: TestServer['seen'] = [];
  const server = bodyServer((req, res, body) => {
    seen.push({
      connection: ids.get(req.socket) ?? 0,
      method: req.method ?? '',
      body,
      headers: req.headers,
    });
    handler(req, res, body);
  });
  const state: TestServer = { url: '', seen, connections: 0, server };
  server.on('connection', (socket: Socket) => {
    state.connections += 1;
    ids.set(socket, state.connections);
  });
  state.url = `${await stubs.listen(server)}/x`;
  return state;
}

function wire(url: string, overrides: Partial<WireRequest> = {}): WireRequest {
  return {
    method: 'POST',
    url,
    headers: { 'content-type': 'application/json', accept: 'application/json' },
    body: '{"hello":"wörld"}',
    timeoutMs: 2_000,
    signal: undefined,
    limitFor: () => 1_000,
    ...overrides,
  };
}

function ownedNodeExchange() {
  const exchange = nodeExchange();
  exchanges.push(exchange);
  return exchange;
}

const json = (res: ServerResponse, status: number, text: string) => {
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
  });
  res.end(text);
};

const both: [string, () => Exchange][] = [
  ['node', ownedNodeExchange],
  ['fetch', () => fetchExchange(fetch)],
];

describe.each(both)('%s exchange', (_name, make) => {
  it('sends the method, headers and body, and returns status, type and bytes', async () => {
    const server = await serve((_req, res, body) => json(res, 201, `{"echo":${body}}`));
    const reply = await make()(wire(server.url, { headers: { ...wire('').headers, x: 'y' } }));
    expect(reply.status).toBe(201);
    expect(reply.contentType).toBe('application/json');
    expect(new TextDecoder().decode(reply.bytes ?? undefined)).toBe('{"echo":{"hello":"wörld"}}');
    const seen = server.seen[0];
    expect(seen?.method).toBe('POST');
    expect(seen?.body).toBe('{"hello":"wörld"}');
    expect(seen?.headers['content-type']).toBe('application/json');
    expect(seen?.headers['content-length']).toBe(String(Buffer.byteLength('{"hello":"wörld"}')));
    expect(seen?.headers.x).toBe('y');
  });

  it('sends no body on a GET', async () => {
    const server = await serve((_req, res) => json(res, 200, '{}'));
    const reply = await make()(wire(server.url, { method: 'GET', body: undefined }));
    expect(reply.status).toBe(200);
    expect(server.seen[0]).toMatchObject({ method: 'GET', body: '' });
  });

  it('cuts a reply over its limit, declared or streamed without end', async () => {
    const declared = await serve((_req, res) => json(res, 200, 'x'.repeat(2_000)));
    const cut = await make()(wire(declared.url));
    expect(cut).toEqual({
      status: 200,
      contentType: 'application/json',
      date: expect.stringMatching(/ GMT$/),
      bytes: null,
    });
    // A chunked reply that never ends: only the limit can stop reading it.
    const endless = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const timer = setInterval(() => res.write('x'.repeat(300)), 5);
      res.on('close', () => clearInterval(timer));
    });
    const endlessCut = await make()(wire(endless.url, { timeoutMs: 10_000 }));
    expect(endlessCut.bytes).toBeNull();
    // The limit is per status: the same reply within a larger limit is read whole.
    const whole = await make()(wire(declared.url, { limitFor: (status) => status * 100 }));
    expect(whole.bytes?.byteLength).toBe(2_000);
  });

  it('fails with DeadlineExceeded when no complete reply arrives in time, trickling or silent', async () => {
    const silent = await serve(() => {});
    const started = performance.now();
    const error = await make()(wire(silent.url, { timeoutMs: 100 })).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DeadlineExceeded);
    expect(performance.now() - started).toBeLessThan(5_000);
    const trickle = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const timer = setInterval(() => res.write(' '), 20);
      res.on('close', () => clearInterval(timer));
    });
    const trickled = await make()(
      wire(trickle.url, { timeoutMs: 150, limitFor: () => 1_000_000 }),
    ).catch((e: unknown) => e);
    expect(trickled).toBeInstanceOf(DeadlineExceeded);
  });

  it("rejects with the caller's abort reason and drops the connection", async () => {
    let closed!: () => void;
    const serverSawClose = new Promise<void>((resolve) => {
      closed = resolve;
    });
    const server = await serve((_req, res) => res.on('close', () => closed()));
    const controller = new AbortController();
    const reason = new Error('mine');
    const pending = make()(wire(server.url, { signal: controller.signal })).catch(
      (e: unknown) => e,
    );
    while (server.seen.length === 0) await new Promise((r) => setTimeout(r, 5));
    controller.abort(reason);
    expect(await pending).toBe(reason);
    await serverSawClose;
    const already = await make()(wire(server.url, { signal: AbortSignal.abort(reason) })).catch(
      (e: unknown) => e,
    );
    expect(already).toBe(reason);
  });

  it('rejects when the connection is refused or the reply is cut short', async () => {
    const gone = await serve(() => {});
    const refusedUrl = gone.url;
    await new Promise<void>((resolve) => gone.server.close(() => resolve()));
    const refused = await make()(wire(refusedUrl)).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(Error);
    expect(refused).not.toBeInstanceOf(DeadlineExceeded);
    const short = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"partial":');
      setTimeout(() => res.socket?.destroy(), 10);
    });
    const cutShort = await make()(wire(short.url)).catch((e: unknown) => e);
    expect(cutShort).toBeInstanceOf(Error);
    expect(cutShort).not.toBeInstanceOf(DeadlineExceeded);
  });
});

describe('node exchange requests', () => {
  it('rejects at once, as UnsendableRequest, a request node:http refuses to build, leaving no timer', async () => {
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    const before = timers();
    const error = await ownedNodeExchange()(
      wire('http://127.0.0.1:1/x', {
        // What an API key read from a file with its line break would become.
        headers: { authorization: 'Bearer key-from-a-file\n' },
        timeoutMs: 60_000,
      }),
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(UnsendableRequest);
    expect((error as Error).cause).toMatchObject({ code: 'ERR_INVALID_CHAR' });
    // The deadline armed before the request was built must not stay armed for its 60 s.
    expect(timers()).toBeLessThanOrEqual(before);
  });
});

describe('node exchange connections', () => {
  it('reuses one kept-alive connection for requests in sequence', async () => {
    const server = await serve((_req, res) => json(res, 200, '{}'));
    const exchange = ownedNodeExchange();
    for (let i = 0; i < 5; i++) expect((await exchange(wire(server.url))).status).toBe(200);
    expect(server.seen).toHaveLength(5);
    expect(server.connections).toBe(1);
  });

  it('sends again on a new connection when the server closed the reused one under it', async () => {
    // Every connection's second request finds its connection closed without a reply: what a
    // client sees when the server's keep-alive timeout fires as it reuses the connection.
    const perConnection = new Map<number, number>();
    const server = await serve((req, res) => {
      const connection = server.seen.at(-1)?.connection ?? 0;
      const count = (perConnection.get(connection) ?? 0) + 1;
      perConnection.set(connection, count);
      if (count === 2) req.socket.destroy();
      else json(res, 200, `{"n":${server.seen.length}}`);
    });
    const exchange = ownedNodeExchange();
    expect((await exchange(wire(server.url))).status).toBe(200);
    const second = await exchange(wire(server.url));
    expect(second.status).toBe(200);
    expect(new TextDecoder().decode(second.bytes ?? undefined)).toBe('{"n":3}');
    expect(server.seen.map((s) => s.connection)).toEqual([1, 1, 2]);
  });

  it('does not send again when a fresh connection is reset', async () => {
    const server = await serve((req) => req.socket.destroy());
    const error = await ownedNodeExchange()(wire(server.url)).catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'ECONNRESET' });
    expect(server.seen).toHaveLength(1);
  });

  it('raises no uncaught error when a server answers before reading a large body and resets the connection', async () => {
    // A 413 sent on the headers alone, kept alive in its headers, then the connection reset with
    // the body unread: the write's broken pipe, reported after node:http freed the connection,
    // used to be an uncaught exception (every time, on this machine) that ended the process.
    const reply = '{"code":"payload_too_large"}';
    const server = createNetServer((socket) => {
      socket.on('error', () => {});
      let head = '';
      const onData = (chunk: Buffer) => {
        head += chunk.toString('latin1');
        if (!head.includes('\r\n\r\n')) return;
        socket.off('data', onData);
        socket.write(
          'HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n' +
            `content-length: ${reply.length}\r\nconnection: keep-alive\r\n\r\n${reply}`,
          () => socket.destroy(),
        );
      };
      socket.on('data', onData);
    });
    const url = `${await stubs.listen(server)}/x`;
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown) => uncaught.push(error);
    process.on('uncaughtException', onUncaught);
    try {
      const exchange = ownedNodeExchange();
      const body = JSON.stringify({ data: 'x'.repeat(4 * 1024 * 1024) });
      for (let i = 0; i < 5; i++) {
        const answer = await exchange(wire(url, { body }));
        expect(answer.status).toBe(413);
      }
      // The broken pipe is reported a few ticks after the reply.
      await new Promise((resolve) => setTimeout(resolve, 100));
    } finally {
      process.off('uncaughtException', onUncaught);
    }
    expect(uncaught).toEqual([]);
  });

  it('closes its idle connections on close', async () => {
    const server = await serve((_req, res) => json(res, 200, '{}'));
    const exchange = ownedNodeExchange();
    await exchange(wire(server.url));
    let open = 0;
    await new Promise<void>((resolve, reject) =>
      server.server.getConnections((error, count) => {
        if (error) reject(error);
        open = count;
        resolve();
      }),
    );
    expect(open).toBe(1);
    exchange.close();
    for (let i = 0; i < 100 && open > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
      open = await new Promise<number>((resolve) =>
        server.server.getConnections((_error, count) => resolve(count)),
      );
    }
    expect(open).toBe(0);
  });
});
