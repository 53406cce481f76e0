/**
 * Shared pieces of the SDK's end-to-end tests: a real server process with
 * short lease timings on a per-file test database, waiting helpers that read
 * the server's record through the public API, a TCP proxy that can drop
 * or black-hole connections between a worker and the server, and an HTTP(S)
 * proxy that forwards requests as they are, lets a test see each one and can
 * hold back a reply.
 */

import {
  request as httpRequest,
  createServer as httpServer,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import { createServer as httpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import type {
  RecordedHistoryEvent,
  TaskResult,
  TaskSnapshot,
  TransitionReason,
} from '@ledgence/contracts';
import { ContractError, problemDocument } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { Client, type Logger, silentLogger, Worker, type WorkerOptions } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, expect } from 'vitest';
import {
  type ServerProcess,
  type ServerProcessOptions,
  startServerProcess,
} from '../server-process.js';

export const TENANT = 'acme';
export const NAMESPACE = 'e2e';

/**
 * Short timings, so expiry and recovery happen within a second: a 1 s lease
 * renewed every 250 ms, recovery every 100 ms, and long polls of at most 1 s
 * so a worker's parked poll never holds a test's shutdown for long.
 */
export const SHORT_TIMINGS: Readonly<Record<string, string>> = Object.freeze({
  LEDGENCE_LEASE_DURATION_MS: '1000',
  LEDGENCE_RENEW_INTERVAL_MS: '250',
  LEDGENCE_MAINTENANCE_INTERVAL_MS: '100',
  LEDGENCE_RESCAN_INTERVAL_MS: '100',
  LEDGENCE_LONG_POLL_WAIT_MS: '1000',
});
/** The worker side of {@link SHORT_TIMINGS}. */
export const RENEW_MS = 250;

/**
 * A `Worker` on `queue` of the test scope with the settings e2e runs share — heartbeats at
 * {@link RENEW_MS}, short polls, a quick backoff, one slot, no log output — and `options` over
 * them. The caller runs and stops it.
 */
export function shortWorker(
  url: string,
  queue: string,
  options: Partial<WorkerOptions> = {},
): Worker {
  return new Worker({
    url,
    tenant: TENANT,
    namespace: NAMESPACE,
    queue,
    concurrency: 1,
    logger: silentLogger,
    renewIntervalMs: RENEW_MS,
    pollWaitMs: 500,
    requestTimeoutMs: 2_000,
    backoff: { baseMs: 10, maxMs: 200 },
    ...options,
  });
}

/**
 * One test database and the server processes a test file starts on it; every
 * process is killed and the database dropped by `close()`.
 */
export class Stack {
  readonly servers: ServerProcess[] = [];
  #database: TestDatabase | undefined;

  constructor(readonly prefix: string) {}

  get databaseUrl(): string {
    if (this.#database === undefined) throw new Error('Stack.open() was not awaited');
    return this.#database.url;
  }

  async open(): Promise<this> {
    this.#database = await createTestDatabase({ prefix: this.prefix });
    return this;
  }

  /** Starts a server on the stack's database with short timings plus `env`. */
  async start(
    env: Record<string, string> = {},
    options: ServerProcessOptions = {},
  ): Promise<ServerProcess> {
    const server = await startServerProcess(
      { DATABASE_URL: this.databaseUrl, ...SHORT_TIMINGS, ...env },
      options,
    );
    this.servers.push(server);
    return server;
  }

  async close(): Promise<void> {
    await Promise.all(this.servers.map((s) => s.stop('SIGKILL')));
    await this.#database?.drop();
  }
}

/** The port of a server URL, to start a replacement on the same one. */
export function portOf(url: string): string {
  return new URL(url).port;
}

export function client(url: string, logger: Logger = silentLogger): Client {
  return new Client({
    url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger,
    // Generous: clients in these tests also ride out server restarts.
    retries: 20,
    backoff: { baseMs: 50, maxMs: 500 },
  });
}

/** Polls `check` until it holds; fails the test after `ms` (a termination bound, not a timing claim). */
export async function until(
  check: () => boolean | Promise<boolean>,
  ms = 30_000,
  what = 'condition',
): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`${what} not reached within ${ms} ms`);
    await sleep(20);
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Waits for each task to become terminal (result long polls, repeated). */
export async function settled(c: Client, taskIds: string[], ms = 60_000): Promise<TaskResult[]> {
  const end = Date.now() + ms;
  const results: TaskResult[] = [];
  for (const id of taskIds) {
    let result = await c.result(id, { waitMs: 1_000 });
    while (result.outcome.state === 'pending') {
      if (Date.now() > end) throw new Error(`task ${id} is not terminal within ${ms} ms`);
      result = await c.result(id, { waitMs: 1_000 });
    }
    results.push(result);
  }
  return results;
}

/** The task's whole history, through the client's page iterator. */
export async function historyOf(c: Client, taskId: string): Promise<RecordedHistoryEvent[]> {
  const events: RecordedHistoryEvent[] = [];
  for await (const page of c.history(taskId)) events.push(...page);
  return events;
}

export function reasons(events: RecordedHistoryEvent[]): TransitionReason[] {
  return events.map((e) => e.event.reason);
}

/** How many records of `reason` each attempt of the task has, by attempt id. */
export function perAttempt(
  events: RecordedHistoryEvent[],
  reason: TransitionReason,
): Map<string, number> {
  const counts = new Map<string, number>();
  for (const { event } of events) {
    if (event.reason === reason && event.attempt_id !== null) {
      counts.set(event.attempt_id, (counts.get(event.attempt_id) ?? 0) + 1);
    }
  }
  return counts;
}

/** The attempt ids of a task's history, in claim order. */
export function attemptIds(events: RecordedHistoryEvent[]): string[] {
  return [...perAttempt(events, 'claimed').keys()];
}

export function idsOf(results: (TaskSnapshot | Error)[]): string[] {
  return results.map((r) => {
    if (r instanceof Error) throw r;
    return r.task_id;
  });
}

/** A deterministic PRNG (mulberry32), so fault patterns repeat run to run. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A TCP proxy in front of a server. */
export interface TcpProxy {
  readonly url: string;
  /** Connections destroyed by the drop rate. */
  drops(): number;
  /**
   * While down, every open connection is destroyed and new ones are closed at
   * once: the worker sees the network fail, the server sees nothing.
   */
  setDown(down: boolean): void;
  /** Destroys the connection of each of the next `n` replies as it starts to arrive. */
  dropReplies(n: number): void;
  close(): Promise<void>;
}

/**
 * A TCP proxy to `target`. Per chunk, with probability `rate`, it destroys
 * the connection: half the time before a request reaches the server (the
 * request is lost), half the time as the reply starts to come back (the
 * server committed, the reply is lost).
 */
export async function startProxy(target: string, rate = 0, seed = 1): Promise<TcpProxy> {
  const targetPort = Number(new URL(target).port);
  const random = prng(seed);
  let drops = 0;
  let down = false;
  let replyDrops = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((downstream) => {
    downstream.on('error', () => {});
    if (down) {
      downstream.destroy();
      return;
    }
    const upstream = createConnection({ host: '127.0.0.1', port: targetPort });
    upstream.on('error', () => {});
    sockets.add(downstream);
    sockets.add(upstream);
    const kill = () => {
      drops += 1;
      downstream.destroy();
      upstream.destroy();
    };
    downstream.on('data', (chunk) => {
      if (rate > 0 && random() < rate / 2) kill();
      else upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (replyDrops > 0) {
        replyDrops -= 1;
        kill();
      } else if (rate > 0 && random() < rate / 2) kill();
      else downstream.write(chunk);
    });
    for (const socket of [downstream, upstream]) {
      socket.on('close', () => {
        sockets.delete(socket);
        downstream.destroy();
        upstream.destroy();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    drops: () => drops,
    setDown(value) {
      down = value;
      if (value) for (const socket of sockets) socket.destroy();
    },
    dropReplies(n) {
      replyDrops = n;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** One request the HTTP proxy is about to forward, with its whole body. */
export interface ProxiedRequest {
  method: string;
  path: string;
  body: Buffer;
}

/** Options of {@link startHttpProxy}. */
export interface HttpProxyOptions {
  /** Serve HTTPS with this certificate and key; the proxy terminates TLS. */
  tls?: { cert: Buffer; key: Buffer };
  /**
   * Sees each request before it is forwarded; a function it returns runs once the reply has
   * been passed on (or the exchange failed).
   */
  observe?: (request: ProxiedRequest) => (() => void) | undefined;
  /**
   * Holds back the reply of a request until the promise it returns resolves (the request is
   * forwarded at once), to place an answer at a chosen moment of the client's life.
   */
  hold?: (request: ProxiedRequest) => Promise<void> | undefined;
  /**
   * Answers a request itself with `503 unavailable` when this returns true, without forwarding
   * it: the server never sees it, as when the server was briefly overloaded or restarting.
   */
  refuse?: (request: ProxiedRequest) => boolean;
  /**
   * Answers a request itself with the reply this returns, without forwarding it (a gateway's
   * error page, a captive portal, a reply cut short); `undefined` forwards it.
   */
  answer?: (request: ProxiedRequest) => ProxyAnswer | undefined;
  /**
   * Decides, once the server's whole reply is in (the server has acted on the request), what the
   * client gets ({@link ReplyVerdict}); a promise holds the reply until it settles. With it every
   * reply is read whole before it is passed on, so it is not for streamed long polls a test times.
   */
  reply?: (exchange: ProxiedExchange) => ReplyVerdict | Promise<ReplyVerdict>;
}

/** A forwarded request with the server's whole reply to it. */
export interface ProxiedExchange extends ProxiedRequest {
  status: number;
  reply: string;
}

/**
 * What a client gets of a reply the server made: `pass` it; `drop` the connection before any
 * byte (the server committed, the client sees a network failure); `cut` it after its head and a
 * few bytes (a reply lost mid-way); or another `body` in its place.
 */
export type ReplyVerdict = 'pass' | 'drop' | 'cut' | { body: string };

/** A reply a test proxy makes up (see {@link HttpProxyOptions.answer}). */
export interface ProxyAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** Declares a body 100 bytes longer than `body`, sends `body`, then closes the connection. */
  cut?: boolean;
}

function refusal(): ProxyAnswer {
  const problem = problemDocument(new ContractError('unavailable', 'refused by a test proxy'));
  return {
    status: problem.status,
    headers: { 'content-type': 'application/problem+json' },
    body: JSON.stringify(problem),
  };
}

function writeAnswer(res: ServerResponse, answer: ProxyAnswer): void {
  if (answer.cut !== true) {
    res.writeHead(answer.status, answer.headers).end(answer.body);
    return;
  }
  const length = Buffer.byteLength(answer.body) + 100;
  res.writeHead(answer.status, { ...answer.headers, 'content-length': String(length) });
  res.write(answer.body);
  setTimeout(() => res.socket?.destroy(), 20);
}

/** Reads `reply` whole, then sends `res` what `judge` decides for it. */
function passJudged(
  request: ProxiedRequest,
  reply: IncomingMessage,
  res: ServerResponse,
  judge: NonNullable<HttpProxyOptions['reply']>,
): void {
  const parts: Buffer[] = [];
  reply.on('data', (chunk: Buffer) => parts.push(chunk));
  reply.on('end', async () => {
    const status = reply.statusCode ?? 502;
    const text = Buffer.concat(parts).toString('utf8');
    const verdict = await judge({ ...request, status, reply: text });
    if (verdict === 'drop') {
      res.socket?.destroy();
      return;
    }
    const contentType = String(reply.headers['content-type'] ?? '');
    if (verdict === 'cut') {
      writeAnswer(res, {
        status,
        headers: { 'content-type': contentType },
        body: text.slice(0, 10),
        cut: true,
      });
      return;
    }
    const body = verdict === 'pass' ? text : verdict.body;
    const { 'content-length': _length, 'transfer-encoding': _encoding, ...headers } = reply.headers;
    res.writeHead(status, { ...headers, 'content-length': String(Buffer.byteLength(body)) });
    res.end(body);
  });
}

/** An HTTP(S) proxy in front of a server. */
export interface HttpProxy {
  readonly url: string;
  /** Requests forwarded so far. */
  forwarded(): number;
  close(): Promise<void>;
}

/**
 * A forwarding proxy to `target` that sees every request: the SDK's default exchange talks to
 * it over real sockets (HTTP, or HTTPS with `tls`), and the test observes what was sent without
 * replacing the client's transport. Replies stream through unchanged (long polls included),
 * unless `hold` holds one back.
 */
export async function startHttpProxy(
  target: string,
  options: HttpProxyOptions = {},
): Promise<HttpProxy> {
  const upstream = new URL(target);
  let forwarded = 0;
  const forward = (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('error', () => res.destroy());
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const request = { method: req.method ?? '', path: req.url ?? '', body };
      const answer = options.refuse?.(request) ? refusal() : options.answer?.(request);
      if (answer !== undefined) {
        writeAnswer(res, answer);
        return;
      }
      forwarded += 1;
      const observed = options.observe?.(request);
      const held = options.hold?.(request);
      // Once, whichever way the exchange ends: replied, failed, or the client went away mid-reply
      // (a long poll aborted at stop), so a test's count of open requests stays true.
      let ended = false;
      const done = () => {
        if (ended) return;
        ended = true;
        observed?.();
      };
      res.on('close', done);
      // Either peer may go away mid-exchange (a server answering 401 before reading the body, a
      // client aborting a long poll): the other side is closed, never left to throw EPIPE or
      // ECONNRESET unhandled in the test process.
      res.on('error', () => out.destroy());
      const out = httpRequest(
        {
          host: upstream.hostname,
          port: upstream.port,
          method: req.method,
          path: req.url,
          headers: req.headers,
        },
        (reply) => {
          reply.on('error', () => res.destroy());
          const judge = options.reply;
          const pass =
            judge === undefined
              ? () => {
                  res.writeHead(reply.statusCode ?? 502, reply.headers);
                  reply.pipe(res);
                  reply.on('end', done);
                }
              : () => passJudged(request, reply, res, judge);
          if (held === undefined) pass();
          else void held.then(pass);
        },
      );
      out.on('error', () => {
        done();
        res.destroy();
      });
      out.end(body);
    });
  };
  const server =
    options.tls === undefined ? httpServer(forward) : httpsServer(options.tls, forward);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `${options.tls === undefined ? 'http' : 'https'}://127.0.0.1:${port}`,
    forwarded: () => forwarded,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A proxy that holds back the answers to dispatch renewals: see {@link holdDispatchAnswers}. */
export interface HeldDispatch {
  readonly proxy: HttpProxy;
  /** Whether a dispatch renewal has gone through the proxy (its answer held). */
  sent(): boolean;
  /** Lets every held answer, and every later one, through. */
  release(): void;
}

/**
 * A proxy to `target` that forwards every request at once but holds back the answer to each
 * dispatch renewal until `release()`: the dispatch is granted at the server and the worker learns
 * it at a moment the test chooses (after a stop's grace period, say).
 */
export async function holdDispatchAnswers(target: string): Promise<HeldDispatch> {
  let sent = false;
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  const proxy = await startHttpProxy(target, {
    hold({ path, body }) {
      if (!path.startsWith('/v1/worker/renew') || !body.includes('"intent":"dispatch"')) {
        return undefined;
      }
      sent = true;
      return released;
    },
  });
  return { proxy, sent: () => sent, release };
}

/**
 * POSTs `body` as JSON to `path` of `url` over a fresh `node:http` request (no SDK, no retries):
 * for tests that speak the wire protocol by hand. The reply's status and parsed JSON body.
 */
export function postJson(
  url: string,
  path: string,
  body: unknown,
  // biome-ignore lint/suspicious/noExplicitAny: replies of several routes, read field by field
): Promise<{ status: number; body: any }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      new URL(path, url),
      { method: 'POST', headers: { 'content-type': 'application/json' } },
      (res) => {
        let text = '';
        res.setEncoding('utf8').on('data', (c: string) => {
          text += c;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) }));
      },
    );
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

/**
 * Collects unhandled rejections of this process while installed: the SDK
 * promises to leave none, whatever the network does.
 */
export function watchUnhandledRejections(): { readonly seen: unknown[]; dispose(): void } {
  const seen: unknown[] = [];
  const listener = (reason: unknown) => seen.push(reason);
  process.on('unhandledRejection', listener);
  return { seen, dispose: () => process.off('unhandledRejection', listener) };
}

/** What {@link workerSuite} gives a test file. */
export interface WorkerSuite {
  readonly stack: Stack;
  /** The file's server, started with the suite's environment before its first test. */
  readonly server: ServerProcess;
  /** Workers a test made: stopped (grace 0) after it, so none polls the next test's queues. */
  readonly workers: Worker[];
  /** Proxies a test started: closed after it. */
  readonly proxies: { close(): Promise<void> }[];
  /**
   * A {@link shortWorker} on `queue` of the suite's server (unless `options.url` names a proxy)
   * with `options` over its settings, stopped after the test. The test runs it.
   */
  worker(queue: string, options?: Partial<WorkerOptions>): Worker;
}

/**
 * The set-up of a file of worker tests against one server: a database and a server of the
 * file's own (short timings plus `env`), the workers and proxies each test made stopped after
 * it, and no unhandled rejection allowed in any test. Call it at the file's top level: it
 * registers the file's hooks.
 */
export function workerSuite(prefix: string, env: Record<string, string> = {}): WorkerSuite {
  const stack = new Stack(prefix);
  const unhandled = watchUnhandledRejections();
  let server: ServerProcess | undefined;
  const suite: WorkerSuite = {
    stack,
    get server() {
      if (server === undefined) throw new Error('the suite server starts in beforeAll');
      return server;
    },
    workers: [],
    proxies: [],
    worker(queue, options = {}) {
      const made = shortWorker(suite.server.url, queue, options);
      suite.workers.push(made);
      return made;
    },
  };
  beforeAll(async () => {
    await stack.open();
    server = await stack.start(env);
  });
  afterEach(async () => {
    await Promise.all(suite.workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
    await Promise.all(suite.proxies.splice(0).map((p) => p.close()));
    expect(unhandled.seen).toEqual([]);
  });
  afterAll(async () => {
    unhandled.dispose();
    await stack.close();
  });
  return suite;
}
