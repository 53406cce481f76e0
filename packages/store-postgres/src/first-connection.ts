/**
 * The first connection of a short-lived client (the migrator's): a bounded number of tries with
 * backoff, one deadline, and an abort signal, until a PostgreSQL session is established.
 *
 * A DATABASE_URL that reaches another kind of server (an HTTP server, which closes the
 * connection on the startup message) made the start hang with no output while postgres.js
 * opened tens of thousands of connections a minute to that server. Our postgres.js patch now
 * rejects the waiting query when a connection closes before its session (as a refused connect
 * is), and delays the next connect by the client's backoff; this gate turns that into a few
 * tries for the migrator's client: given as postgres.js's `socket` option,
 * {@link FirstConnection.socket} opens each socket itself, so every try passes here. Tries
 * after the first wait (backoff); the caller sends its query again while
 * {@link FirstConnection.retryable} says so; once {@link MAX_TRIES} sockets closed before a
 * session, or the deadline passed, the next try fails. Once a session was established
 * (`onparameter`: PostgreSQL reports its settings after the startup succeeded), sockets (a
 * cancel request, a reconnect) are opened at once, as upstream.
 */
import { createConnection, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/** Sockets that may close before a session is established; the next try fails. */
export const MAX_TRIES = 5;

/** The wait before the second try; it doubles for each further one (with jitter). */
const FIRST_BACKOFF_MS = 250;

/** What postgres.js passes to its `socket` option: its parsed options. */
interface SocketTarget {
  host: string[];
  port: number[];
  /** A Unix socket path, or false. */
  path: string | false | undefined;
}

/** The first connection's gate; see the module comment. */
export interface FirstConnection {
  /** postgres.js's `socket` option (untyped there): opens the next socket. */
  socket(options: SocketTarget): Promise<Socket>;
  /** postgres.js's `onparameter` option: a session was established. */
  onparameter(): void;
  /**
   * Rejects when no session was established by the deadline (`CONNECT_TIMEOUT`), or with the
   * signal's reason when it aborts first; never settles otherwise. The caller ends the client.
   */
  readonly failure: Promise<never>;
  /**
   * Whether a query that failed with `error` may be sent again: the connection closed before a
   * session began (so nothing of the query ran), and this gate has tries and time left.
   */
  retryable(error: unknown): boolean;
  /** Stops the deadline and the signal's listener (the client is done). */
  dispose(): void;
}

/**
 * A gate for one client's first connection.
 *
 * @param connectTimeoutMs the deadline of the first session, from now; also the limit of each
 *   TCP connect.
 * @param signal abandons the connecting: `failure` rejects with its reason, and no further
 *   socket is opened.
 */
export function firstConnection(connectTimeoutMs: number, signal?: AbortSignal): FirstConnection {
  const deadline = performance.now() + connectTimeoutMs;
  let ready = false;
  let tries = 0;
  let gaveUp = false;
  let where = 'the database';
  let fail: (error: unknown) => void = () => {};
  const failure = new Promise<never>((_, reject) => {
    fail = (error) => {
      gaveUp = true;
      reject(error);
    };
  });
  failure.catch(() => {}); // observed by the caller's race; never an unhandled rejection
  const timer = setTimeout(
    () =>
      fail(
        connectError(
          'CONNECT_TIMEOUT',
          `no PostgreSQL session with ${where} within ${connectTimeoutMs} ms (${plural(tries, 'try', 'tries')})`,
        ),
      ),
    connectTimeoutMs,
  );
  timer.unref?.();
  const onAbort = () => fail(signal?.reason);
  signal?.addEventListener('abort', onAbort, { once: true });
  if (signal?.aborted) onAbort();

  return {
    failure,
    onparameter() {
      if (ready) return;
      ready = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    },
    retryable(error) {
      return (
        !ready &&
        !gaveUp &&
        (error as { code?: unknown } | null)?.code === 'CONNECTION_CLOSED' &&
        performance.now() < deadline
      );
    },
    dispose() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    },
    async socket(target) {
      if (ready) return open(target, 0, connectTimeoutMs);
      try {
        return await nextTry(target);
      } catch (error) {
        gaveUp = true;
        throw error;
      }
    },
  };

  /** The next socket before a session: refused past the tries or the deadline, after a backoff. */
  async function nextTry(target: SocketTarget): Promise<Socket> {
    signal?.throwIfAborted();
    const previous = tries;
    tries += 1;
    where = describe(target, previous);
    if (previous >= MAX_TRIES) {
      throw connectError(
        'CONNECTION_CLOSED',
        `${where} closed the connection ${previous} times before a PostgreSQL session began: ` +
          'is a PostgreSQL server listening there?',
      );
    }
    if (previous > 0) {
      const backoff = FIRST_BACKOFF_MS * 2 ** (previous - 1) * (0.5 + Math.random() / 2);
      try {
        await sleep(Math.min(backoff, Math.max(0, deadline - performance.now())), undefined, {
          signal,
        });
      } catch (error) {
        throw signal?.aborted ? signal.reason : error;
      }
    }
    const remaining = deadline - performance.now();
    if (remaining <= 0) {
      throw connectError(
        'CONNECT_TIMEOUT',
        `no PostgreSQL session with ${where} within ${connectTimeoutMs} ms (${plural(previous, 'try', 'tries')})`,
      );
    }
    // Each try starts at the next host, as postgres.js rotates hosts between tries.
    return open(target, previous, remaining, signal);
  }
}

/** `host:port` (or the socket path) a try starting at host `index` connects to first. */
function describe(target: SocketTarget, index: number): string {
  if (target.path) return target.path;
  const i = index % Math.max(1, target.host.length);
  return `${target.host[i]}:${target.port[i] ?? target.port[0]}`;
}

function plural(count: number, one: string, many: string): string {
  return `${count} ${count === 1 ? one : many}`;
}

function connectError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/**
 * A connected socket: the Unix socket, or the first host (from `start`, in turn) that accepts.
 * Rejects with the last host's error when none does, as postgres.js reports a connect error.
 */
async function open(
  target: SocketTarget,
  start: number,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<Socket> {
  if (target.path) return connectOne({ path: target.path }, timeoutMs, signal);
  const count = Math.max(1, target.host.length);
  let last: unknown;
  for (let n = 0; n < count; n += 1) {
    const i = (start + n) % count;
    const host = target.host[i] ?? 'localhost';
    const port = target.port[i] ?? target.port[0] ?? 5432;
    try {
      const socket = await connectOne({ host, port }, timeoutMs, signal);
      // postgres.js names the address in its errors from these, and TLS its server name.
      return Object.assign(socket, { host, port });
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      last = error;
    }
  }
  throw last;
}

function connectOne(
  to: { path: string } | { host: string; port: number },
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = createConnection(to);
    const where = 'path' in to ? to.path : `${to.host}:${to.port}`;
    const settle = (error?: unknown) => {
      clearTimeout(timer);
      socket.off('connect', onConnect);
      socket.off('error', onError);
      signal?.removeEventListener('abort', onAbort);
      if (error === undefined) return resolve(socket);
      socket.destroy();
      reject(error);
    };
    const onConnect = () => settle();
    const onError = (error: Error) => settle(error);
    const onAbort = () => settle(signal?.reason);
    const timer = setTimeout(
      () => settle(connectError('CONNECT_TIMEOUT', `write CONNECT_TIMEOUT ${where}`)),
      timeoutMs,
    );
    socket.once('connect', onConnect);
    socket.once('error', onError);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
