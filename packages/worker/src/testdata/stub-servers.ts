/**
 * Local `node:http` (or bare `node:net`) servers that stand in for the Ledgence server (or a
 * gateway in front of it) in the SDK's wire tests: each listens on 127.0.0.1 and is closed, its
 * sockets destroyed, after every test of the file that asked for them.
 */
import {
  createServer,
  Server as HttpServer,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo, Server, Socket } from 'node:net';
import { afterEach } from 'vitest';

/** Answers one request, given its whole body read as UTF-8. */
export type BodyHandler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

/** A `node:http` server, not yet listening, calling `handler` once each request's body has arrived. */
export function bodyServer(handler: BodyHandler): HttpServer {
  return createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => handler(req, res, Buffer.concat(chunks).toString()));
  });
}

/** What {@link stubServers} gives a test file. */
export interface StubServers {
  /**
   * Listens `server` (a `node:http` server, or a `node:net` one for a peer that never speaks
   * HTTP) on a free port of 127.0.0.1 and returns its base URL.
   */
  listen(server: Server): Promise<string>;
  /** Listens a {@link bodyServer} of `handler`, and returns its base URL. */
  serve(handler: BodyHandler): Promise<string>;
}

/**
 * Call at a test file's top level: registers the teardown. Its `afterEach` is registered then, so
 * a file's own later `afterEach` (stopping workers, say) runs before the servers close.
 */
export function stubServers(): StubServers {
  const servers: Server[] = [];
  const sockets = new Set<Socket>();
  afterEach(async () => {
    for (const socket of sockets) socket.destroy();
    sockets.clear();
    await Promise.all(
      servers.splice(0).map(
        (server) =>
          new Promise<void>((resolve) => {
            // An HTTP server's idle kept-alive connections would hold `close` open.
            if (server instanceof HttpServer) server.closeAllConnections();
            server.close(() => resolve());
          }),
      ),
    );
  });
  const listen = async (server: Server): Promise<string> => {
    server.on('connection', (socket: Socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  };
  return {
    listen,
    serve: (handler) => listen(bodyServer(handler)),
  };
}
