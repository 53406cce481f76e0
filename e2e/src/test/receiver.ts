/**
 * A completion-callback receiver on a real socket: it records every POST the server's sender
 * makes and answers each when, and as, the test says (at once, late, or never).
 */
import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** One POST the receiver got. */
export interface ReceivedPost {
  /** Its `webhook-id`: the delivery's event id, the same on every try. */
  readonly id: string;
  readonly headers: IncomingHttpHeaders;
  /** The body as sent (a CloudEvent's JSON). */
  readonly body: string;
  /** The body parsed. */
  readonly event: Record<string, unknown>;
  /** When it arrived (`Date.now()`). */
  readonly at: number;
}

/** A running receiver (see {@link startReceiver}). */
export interface Receiver {
  /** The URL to configure as a destination's `url`. */
  readonly url: string;
  /** Every POST so far, in arrival order. */
  readonly posts: ReceivedPost[];
  /** Stops listening; answers still held are cut. */
  close(): Promise<void>;
}

/**
 * Starts a receiver whose `answer(post, seen)` — `seen` counts earlier posts of the same id —
 * says how many ms to wait before answering `status` (0 or less: at once) or `'hang'` (never).
 */
export async function startReceiver(
  answer: (post: ReceivedPost, seen: number) => number | 'hang' = () => 0,
  status = 200,
): Promise<Receiver> {
  const posts: ReceivedPost[] = [];
  const held = new Set<ServerResponse>();
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const post: ReceivedPost = {
        id: String(request.headers['webhook-id']),
        headers: request.headers,
        body,
        event: JSON.parse(body) as Record<string, unknown>,
        at: Date.now(),
      };
      const seen = posts.filter((p) => p.id === post.id).length;
      posts.push(post);
      const wait = answer(post, seen);
      if (wait !== 'hang' && wait <= 0) {
        response.writeHead(status).end();
        return;
      }
      held.add(response);
      if (wait === 'hang') return;
      const timer = setTimeout(() => {
        held.delete(response);
        if (!response.destroyed) response.writeHead(status).end();
      }, wait);
      response.on('close', () => clearTimeout(timer));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    posts,
    close: () =>
      new Promise<void>((resolve) => {
        for (const response of held) response.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
