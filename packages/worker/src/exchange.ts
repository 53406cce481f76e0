/**
 * The wire under {@link HttpTransport}: one HTTP exchange, from sending a request to the last
 * byte of its reply, within one deadline and a byte limit. Two implementations share the shape:
 *
 * - {@link nodeExchange}, the default on Node: `node:http`/`node:https` with a keep-alive agent.
 *   Measured on this project's 2-core machine (bench/README.md, "The SDK's HTTP client"): a
 *   small JSON request through Node 20's global `fetch` costs ~0.5 ms more client CPU than
 *   through `node:http` — undici's WHATWG `Request`/`Response`, `AbortSignal` and web streams —
 *   and every submit, poll, renewal and settlement pays it.
 * - {@link fetchExchange}, over any `fetch`: what a caller gets by passing `fetch` (a test
 *   double, a custom undici agent, a runtime without `node:http`).
 *
 * Both reject with {@link DeadlineExceeded} when the deadline passes, with the caller's abort
 * reason when its signal aborts, and with the underlying error for anything else (a refused
 * connection, a reset, a reply cut short); {@link HttpTransport} turns those into typed errors.
 * The node exchange also rejects with {@link UnsendableRequest} when `node:http` refuses to build
 * the request (a header value it cannot send): nothing went out, and nothing would if retried.
 */
import {
  type ClientRequest,
  Agent as HttpAgent,
  request as httpRequest,
  type IncomingMessage,
} from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import { timerDelay } from './timers.js';

/** One request as it goes on the wire. */
export interface WireRequest {
  method: 'GET' | 'POST';
  url: string;
  /**
   * The URL to send the request to again on another connection, when it differs from `url`
   * (a long poll asking for what is left of its wait); `url` by default.
   */
  resendUrl?: (() => string) | undefined;
  headers: Record<string, string>;
  /** A JSON text, or `undefined` for no body. */
  body: string | undefined;
  /** The whole exchange's budget: a reply trickling in cannot push it back. */
  timeoutMs: number;
  signal: AbortSignal | undefined;
  /** The most reply bytes read for a status; a longer reply is cut off and its bytes are `null`. */
  limitFor: (status: number) => number;
}

/** A reply read to its end (or cut at its limit: `bytes` is then `null`). */
export interface WireReply {
  status: number;
  contentType: string;
  /** The `Date` header, `''` when absent. */
  date: string;
  /** The `Retry-After` header, if any (a gateway's or rate limiter's 429/503 sends it). */
  retryAfter?: string | undefined;
  bytes: Uint8Array | null;
}

/** Sends one request and reads its reply (see the module comment for how it fails). */
export type Exchange = (request: WireRequest) => Promise<WireReply>;

/** The `fetch` the SDK may be given: the global one, a test double or one with a custom agent. */
export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

/** The deadline of an exchange passed; its `cause` is what the aborted exchange reported, if anything. */
export class DeadlineExceeded extends Error {
  constructor(timeoutMs: number, options?: { cause?: unknown }) {
    super(`no complete reply within ${timeoutMs} ms`, options);
    this.name = 'DeadlineExceeded';
  }
}

/**
 * The request could not be built, so nothing was sent (`node:http` throws before sending, e.g. on
 * a header value with a line break); its `cause` is what refused it. The same request would be
 * refused again.
 */
export class UnsendableRequest extends Error {
  constructor(cause: unknown) {
    super(cause instanceof Error ? cause.message : 'node:http refused to build the request', {
      cause,
    });
    this.name = 'UnsendableRequest';
  }
}

/** An exchange over `fetch`; the reply body is streamed so a runaway reply stops at its limit. */
export function fetchExchange(fetch: FetchLike): Exchange {
  return async function exchangeOverFetch(request) {
    // One controller of the exchange's own, its deadline and the caller's abort wired by hand and
    // unwired when it ends. Not `AbortSignal.any([request.signal, AbortSignal.timeout(…)])`: on
    // Node 20 a signal keeps a weak reference per `any` it took part in until it aborts, so a
    // long-lived one (an application's shutdown signal passed to every call, a worker's) grew
    // by ~250 bytes a request; and the timeout's timer and signal stayed the whole timeout after
    // the reply.
    const controller = new AbortController();
    let timedOut = false;
    const deadline = setTimeout(() => {
      timedOut = true;
      controller.abort(new DOMException('the request timed out', 'TimeoutError'));
    }, timerDelay(request.timeoutMs));
    const onAbort = () => controller.abort(request.signal?.reason);
    if (request.signal?.aborted) onAbort();
    else request.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const response = await fetch(request.url, {
        method: request.method,
        headers: request.headers,
        body: request.body,
        signal: controller.signal,
      });
      const bytes = await readLimited(response, request.limitFor(response.status));
      return {
        status: response.status,
        contentType: response.headers.get('content-type') ?? '',
        date: response.headers.get('date') ?? '',
        retryAfter: response.headers.get('retry-after') ?? undefined,
        bytes,
      };
    } catch (error) {
      if (request.signal?.aborted) throw request.signal.reason;
      if (timedOut) throw new DeadlineExceeded(request.timeoutMs, { cause: error });
      throw error;
    } finally {
      clearTimeout(deadline);
      request.signal?.removeEventListener('abort', onAbort);
    }
  };
}

async function readLimited(response: Response, maxBytes: number): Promise<Uint8Array | null> {
  const reader = response.body?.getReader();
  if (reader === undefined) return new Uint8Array(0);
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      await reader.cancel().catch(() => {});
      return null;
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks, total);
}

/** A {@link Exchange} on `node:http`/`node:https`, with a way to close its idle connections. */
export interface NodeExchange extends Exchange {
  /**
   * Closes the kept-alive connections: `Agent#destroy` destroys those in use too, so a request
   * still in flight fails (a `socket hang up`); later requests open new connections.
   */
  close(): void;
}

/**
 * An exchange over `node:http`/`node:https` with kept-alive connections.
 *
 * A kept-alive connection can be closed by the server (its keep-alive timeout) in the instant
 * the agent reuses it: the request then fails with a reset before any reply. Such a request is
 * sent again, once per reused connection, on another one. A reset does not say whether the
 * server saw the request; sending it again is safe because every request the SDK sends is
 * replay-safe (a sequence, an operation id or an idempotency key makes a repeat harmless). Idle
 * connections are unreferenced by the agent, so they never keep a process alive.
 */
export function nodeExchange(): NodeExchange {
  // `lifo` reuses the most recently used connection, so the others age out instead of all
  // staying barely alive (and meeting the server's keep-alive timeout one by one).
  const http = new HttpAgent({ keepAlive: true, scheduling: 'lifo' });
  const https = new HttpsAgent({ keepAlive: true, scheduling: 'lifo' });
  const exchange = (request: WireRequest): Promise<WireReply> =>
    new Promise<WireReply>((resolve, reject) => {
      let url: URL;
      try {
        url = new URL(request.url);
      } catch (error) {
        reject(new UnsendableRequest(error));
        return;
      }
      const secure = url.protocol === 'https:';
      const headers =
        request.body === undefined
          ? request.headers
          : { ...request.headers, 'content-length': String(Buffer.byteLength(request.body)) };
      let settled = false;
      let current: ClientRequest | undefined;
      const finish = (outcome: () => void): void => {
        if (settled) return;
        settled = true;
        clearTimeout(deadline);
        request.signal?.removeEventListener('abort', onAbort);
        outcome();
      };
      // Destroying the request is how an unwanted or endless reply stops being read.
      const fail = (error: unknown): void =>
        finish(() => {
          current?.destroy();
          reject(error);
        });
      const deadline = setTimeout(
        () => fail(new DeadlineExceeded(request.timeoutMs)),
        timerDelay(request.timeoutMs),
      );
      const onAbort = () => fail(request.signal?.reason);
      if (request.signal?.aborted) return fail(request.signal.reason);
      request.signal?.addEventListener('abort', onAbort, { once: true });

      const send = (target: URL): void => {
        let req: ClientRequest;
        try {
          req = (secure ? httpsRequest : httpRequest)(target, {
            method: request.method,
            headers,
            agent: secure ? https : http,
          });
        } catch (error) {
          // Thrown before anything was sent: failing here also clears the deadline, which would
          // otherwise keep its timer (and the process) alive for nothing.
          fail(new UnsendableRequest(error));
          return;
        }
        current = req;
        req.on('socket', guardSocket);
        let answered = false;
        req.on('error', (error: NodeJS.ErrnoException) => {
          if (settled || req !== current) return;
          if (!answered && req.reusedSocket && isStaleConnection(error)) {
            let again = url;
            try {
              if (request.resendUrl !== undefined) again = new URL(request.resendUrl());
            } catch {
              // The first URL parsed; a resend's differs only in its query.
            }
            send(again);
            return;
          }
          fail(error);
        });
        req.on('response', (res: IncomingMessage) => {
          answered = true;
          readReply(res, request.limitFor(res.statusCode ?? 0), {
            done: (reply) => finish(() => resolve(reply)),
            cut: (reply) =>
              finish(() => {
                req.destroy();
                resolve(reply);
              }),
            fail,
          });
        });
        req.end(request.body);
      };
      send(url);
    });
  return Object.assign(exchange, {
    close(): void {
      http.destroy();
      https.destroy();
    },
  });
}

/**
 * Gives a connection an error listener of its own, once. A server refusing a large body (a 413)
 * answers before reading it, keeps the connection alive in its headers, then resets it with the
 * body unread. `node:http` frees the connection once the request is written, taking its error
 * listener off; its agent sees the connection no longer writable and destroys it without adding
 * one, and the broken pipe of the write, reported a moment later, was an uncaught exception that
 * ended the application's process. While a request holds the connection, `node:http`'s listener
 * still passes its errors to the request; this one only keeps a freed connection's from throwing.
 * The callback sender (packages/callbacks) has the same guard; the SDK installs alone.
 */
function guardSocket(socket: Socket): void {
  if (!socket.listeners('error').includes(ignoreSocketError)) socket.on('error', ignoreSocketError);
}

function ignoreSocketError(): void {}

/** A reset or broken pipe on a reused connection: the server closed it as we reused it. */
function isStaleConnection(error: NodeJS.ErrnoException): boolean {
  return error.code === 'ECONNRESET' || error.code === 'EPIPE';
}

interface ReplyHandlers {
  done: (reply: WireReply) => void;
  cut: (reply: WireReply) => void;
  fail: (error: unknown) => void;
}

/** Reads a reply to its end within `limit` bytes. */
function readReply(res: IncomingMessage, limit: number, handlers: ReplyHandlers): void {
  const status = res.statusCode ?? 0;
  const header = res.headers['content-type'];
  const contentType = typeof header === 'string' ? header : '';
  const date = res.headers.date ?? '';
  const retryAfter = res.headers['retry-after'];
  // Listen before deciding: cutting the reply makes it emit errors.
  res.on('error', (error) => handlers.fail(error));
  if (Number(res.headers['content-length']) > limit) {
    handlers.cut({ status, contentType, date, retryAfter, bytes: null });
    return;
  }
  const chunks: Buffer[] = [];
  let total = 0;
  let ended = false;
  res.on('data', (chunk: Buffer) => {
    total += chunk.byteLength;
    if (total > limit) handlers.cut({ status, contentType, date, retryAfter, bytes: null });
    else chunks.push(chunk);
  });
  res.on('end', () => {
    ended = true;
    handlers.done({
      status,
      contentType,
      date,
      retryAfter,
      bytes: Buffer.concat(chunks, total),
    });
  });
  res.on('close', () => {
    if (!ended) handlers.fail(new Error('the connection closed before the reply ended'));
  });
}
