/**
 * A real HTTP receiver on 127.0.0.1 and an ephemeral port, for delivery
 * tests: it records every request (method, path, headers, exact body bytes)
 * and lets each test decide how to answer — or not to. A raw TCP receiver
 * beside it writes what an HTTP server never would.
 */
import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import {
  type AddressInfo,
  createServer as createTcpServer,
  type Socket,
  type Server as TcpServer,
} from 'node:net';

/** One request as the receiver saw it. */
export interface ReceivedRequest {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** Answers one request whose body has been read; may also never answer. */
export type Answer = (res: ServerResponse, request: ReceivedRequest, index: number) => void;

/** A running receiver. */
export interface Receiver {
  /** `http://127.0.0.1:<port>` */
  readonly origin: string;
  /** Every request, in arrival order. */
  readonly requests: ReceivedRequest[];
  /** Stops listening and drops every open connection (hanging ones too). */
  close(): Promise<void>;
}

/** Starts a receiver answering with `answer` (index = 0-based request count). */
export async function startReceiver(answer: Answer): Promise<Receiver> {
  const requests: ReceivedRequest[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const request: ReceivedRequest = {
        method: req.method ?? '',
        path: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(chunks),
      };
      requests.push(request);
      answer(res, request, requests.length - 1);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    origin: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** What a raw receiver does with each connection; it may write anything, or nothing. */
export type RawAnswer = (socket: Socket) => void;

/**
 * A plain TCP listener on 127.0.0.1, for the answers `node:http` would not
 * write (a status line like `HTTP/1.1 099 Odd`, a head trickled a byte at a
 * time) or no HTTP at all (a TLS handshake that never comes).
 */
export async function startRawReceiver(answer: RawAnswer): Promise<Omit<Receiver, 'requests'>> {
  const sockets = new Set<Socket>();
  const server: TcpServer = createTcpServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    // The client destroys sockets it is done with; a reset is no failure of the test.
    socket.on('error', () => {});
    answer(socket);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    origin: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}
