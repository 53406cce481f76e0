/**
 * A real HTTP receiver on 127.0.0.1 and an ephemeral port, for delivery
 * tests: it records every request (method, path, headers, exact body bytes)
 * and lets each test decide how to answer — or not to.
 */
import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';

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
