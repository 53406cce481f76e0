/**
 * The wire protocol spoken by hand, for end-to-end tests that need what the SDK hides: a poll
 * parked on one replica while a submit goes through another, a claim left without its dispatch
 * renewal, a settle sent by a test rather than a worker. Plain `fetch`, no retries, every reply
 * returned as it came (status and body), so a test asserts on exactly what the server said.
 */
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { NAMESPACE, TENANT } from './harness.js';

/** The scope of every raw-wire test (the harness's tenant and namespace). */
export const SCOPE = Object.freeze({ tenant_id: TENANT, namespace: NAMESPACE });

/** The path of the scope's task routes: `${TASKS_BASE}/tasks`, `${TASKS_BASE}/tasks/{id}`... */
export const TASKS_BASE = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;

/**
 * The long poll of the replica tests: far beyond the time a wake takes, far below a test's timeout.
 */
export const WAIT_MS = 20_000;

/**
 * Server settings under which only a wake hint (LISTEN, or a due time learned from the store) can
 * answer a parked poll before its `WAIT_MS` wait ends: the rescan is ten minutes.
 */
export const HINTS_ONLY_ENV: Readonly<Record<string, string>> = Object.freeze({
  LEDGENCE_RESCAN_INTERVAL_MS: '600000',
  LEDGENCE_LONG_POLL_WAIT_MS: String(WAIT_MS),
});

/** A reply as the server sent it. */
export interface WireReply<T> {
  readonly status: number;
  readonly headers: Headers;
  /** The parsed JSON body (problem documents included), or the text when it is not JSON. */
  readonly body: T;
}

/** GET `path` of `url` without `body`, POST it as JSON with one. */
export async function call<T>(
  url: string,
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<WireReply<T>> {
  const response = await fetch(`${url}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  const text = await response.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // Not JSON (a proxy's or the runtime's own error page): the test sees the text.
  }
  return { status: response.status, headers: response.headers, body: parsed as T };
}

/**
 * {@link call} sent again while the server answers `503 unavailable`, as a client retries it: a
 * burst of hundreds of requests beside other suites can wait out the server's 5 s for a pool
 * connection. Only for requests that are replay-safe (every route's are, by key or sequence).
 */
export async function callUntilServed<T>(
  url: string,
  path: string,
  body?: unknown,
  tries = 20,
): Promise<WireReply<T>> {
  for (let attempt = 1; ; attempt++) {
    const reply = await call<T>(url, path, body);
    const code = (reply.body as { code?: unknown } | undefined)?.code;
    if (reply.status !== 503 || code !== 'unavailable' || attempt >= tries) return reply;
    await sleep(50 * attempt);
  }
}

/** A submit command for a no-op task of `queue`; `extra` adds to (or overrides) its input. */
export function taskBody(key: string, queue: string, extra: Record<string, unknown> = {}) {
  return {
    idempotency_key: key,
    input: { ...SCOPE, queue, program: { name: 'noop' }, data: { key }, ...extra },
  };
}

/** Submits `body` through `url` as a new task (a 201, else it throws); the task's id. */
export async function submitTask(url: string, body: unknown): Promise<string> {
  const { status, body: reply } = await call<{ task_id: string }>(url, `${TASKS_BASE}/tasks`, body);
  if (status !== 201) throw new Error(`submit: ${status} ${JSON.stringify(reply)}`);
  return reply.task_id;
}

/** Opens a worker session of `queue` on `url`; its id. */
export async function openSession(url: string, queue: string, concurrency = 1): Promise<string> {
  const { status, body } = await call<{ id: string }>(url, '/v1/worker/sessions', {
    scope: SCOPE,
    queue,
    concurrency,
  });
  if (status !== 200 && status !== 201)
    throw new Error(`session: ${status} ${JSON.stringify(body)}`);
  return body.id;
}

/** An acquire command of one slot (`consumer`) of a session. */
export function pollBody(sessionId: string, queue: string, consumer: number, sequence: number) {
  return { scope: SCOPE, queue, worker_session_id: sessionId, consumer_id: consumer, sequence };
}

/**
 * One poll that may park for up to `waitMs` (on a session of its own unless `sessionId` is
 * given): the reply and how long it took to come.
 */
export async function parkedPoll(url: string, queue: string, waitMs: number, sessionId?: string) {
  const id = sessionId ?? (await openSession(url, queue));
  const started = performance.now();
  const reply = await call<AcquireReply>(
    url,
    `/v1/worker/acquire?wait_ms=${waitMs}`,
    pollBody(id, queue, 0, 1),
  );
  return { status: reply.status, reply: reply.body, ms: performance.now() - started };
}

/**
 * Claims the next task of `queue` on `url` without waiting (it throws when there is none) and,
 * with `dispatch`, takes its dispatch grant as a worker would before running user code.
 */
export async function claimNext(url: string, queue: string, dispatch = true): Promise<Assignment> {
  const id = await openSession(url, queue);
  const { body } = await call<AcquireReply>(url, '/v1/worker/acquire', pollBody(id, queue, 0, 1));
  if (body.disposition !== 'assigned') throw new Error(`nothing to claim: ${JSON.stringify(body)}`);
  if (dispatch) {
    const renewed = await call<{ dispatch_allowed?: boolean }>(url, '/v1/worker/renew', {
      owner: body.assignment.lease.owner,
      sequence: 1,
      intent: 'dispatch',
    });
    if (renewed.body.dispatch_allowed !== true) {
      throw new Error(`dispatch refused: ${renewed.status} ${JSON.stringify(renewed.body)}`);
    }
  }
  return body.assignment;
}

/** A settle command reporting `outcome` for the attempt `assignment` holds, quiescence confirmed. */
export function settleBody(assignment: Assignment, outcome: unknown) {
  const owner = assignment.lease.owner;
  return {
    owner,
    operation_id: `settle-${owner.attempt_id}`,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome,
      },
    },
    quiescence: 'confirmed',
  };
}

/** The samples of a Prometheus text exposition, keyed by `name{labels}` exactly as exposed. */
export function metricSamples(text: string): Map<string, number> {
  const samples = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    samples.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return samples;
}

/** The sum of every series of the metric `name` on `url`'s `/metrics` (all label sets). */
export async function metricSum(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name} `) || line.startsWith(`${name}{`)) {
      sum += Number(line.split(' ').at(-1));
    }
  }
  return sum;
}

/** A reply read off the socket as it came: status, the head's text, the body's text (latin1). */
export interface RawReply {
  readonly status: number;
  readonly headers: string;
  readonly body: string;
}

/**
 * One raw HTTP/1.1 exchange, for what fetch will not send (a backslash in the path, a header
 * fetch rewrites): `head` is the request line and any headers; a `body` goes as JSON. The reply
 * is read as latin1, so every byte the server sent is seen as it was.
 */
export async function rawExchange(url: string, head: string, body?: string): Promise<RawReply> {
  const extra =
    body === undefined
      ? ''
      : `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n`;
  const { text, closed } = await socketExchange(
    url,
    `${head}\r\nHost: 127.0.0.1\r\n${extra}Connection: close\r\n\r\n${body ?? ''}`,
    60_000,
  );
  if (!closed) throw new Error(`the server kept the connection open after: ${text.slice(0, 200)}`);
  const split = text.indexOf('\r\n\r\n');
  return {
    status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]),
    headers: text.slice(0, split),
    body: text.slice(split + 4),
  };
}

/**
 * Writes `bytes` on a fresh connection and collects everything the server sends (as latin1)
 * until it closes the connection, or until `waitMs` has passed (`closed: false`). `onData` sees
 * the text so far and may write more (a body sent once `100 Continue` came).
 */
export function socketExchange(
  url: string,
  bytes: string | Buffer,
  waitMs = 3_000,
  onData?: (text: string, write: (more: string) => void) => void,
): Promise<{ text: string; closed: boolean }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    let text = '';
    const socket = connect(Number(port), hostname, () => socket.write(bytes));
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      text += chunk;
      onData?.(text, (more) => socket.write(more));
    });
    // A reset after the server's reply still ends the exchange with what was read.
    socket.on('error', () => {});
    const timer = setTimeout(() => {
      socket.destroy();
      resolve({ text, closed: false });
    }, waitMs);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ text, closed: true });
    });
  });
}

/** One reply of a {@link socketExchange}: its status, its head lower-cased, its body. */
export interface FramedReply {
  status: number;
  head: string;
  body: string;
}

/** The replies in `text`, in order, each body framed by its Content-Length or its chunks. */
export function repliesIn(text: string): FramedReply[] {
  const out: FramedReply[] = [];
  let rest = text;
  while (rest.startsWith('HTTP/1.1 ')) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) break;
    const head = rest.slice(0, end).toLowerCase();
    const status = Number(rest.slice(9, 12));
    rest = rest.slice(end + 4);
    const length = /content-length: (\d+)/.exec(head);
    let body = '';
    if (length !== null) {
      body = rest.slice(0, Number(length[1]));
      rest = rest.slice(body.length);
    } else if (head.includes('transfer-encoding: chunked')) {
      for (;;) {
        const line = rest.indexOf('\r\n');
        const size = Number.parseInt(rest.slice(0, line), 16);
        rest = rest.slice(line + 2);
        if (!(size > 0)) {
          rest = rest.slice(2);
          break;
        }
        body += rest.slice(0, size);
        rest = rest.slice(size + 2);
      }
    }
    out.push({ status, head, body });
  }
  return out;
}

/** POSTs `body` to `path` and resets the connection at once: the client is gone before any reply. */
export function postAndLeave(url: string, path: string, body: unknown): Promise<void> {
  const text = JSON.stringify(body);
  return new Promise<void>((resolve) => {
    const socket = connect(Number(new URL(url).port), '127.0.0.1', () => {
      socket.write(
        `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\n\r\n${text}`,
      );
      socket.resetAndDestroy();
    });
    socket.on('error', () => undefined);
    socket.on('close', () => resolve());
  });
}
