/**
 * The one HTTP path every SDK call takes: builds the request, bounds it with
 * a timeout, reads the reply with a byte limit, and parses it strictly with
 * the contracts' decoder and the route's reply schema. A reply that breaks
 * the contract is a {@link ProtocolError}, never an unchecked `any`; a
 * problem document becomes a {@link ProblemError}; anything that leaves the
 * outcome unknown (network, timeout, 5xx without a problem) is a
 * {@link TransportError}, which callers may retry because every request the
 * SDK sends is replay-safe. A request that cannot be built is a `TypeError`,
 * like the bad configuration it comes from: retrying it would fail the same way.
 */
import {
  apiKeyProblem,
  COMMAND_MAX_DEPTH,
  CONTROL_REQUEST_TIMEOUT_MS,
  ContractError,
  decodeStrictJson,
  isWellFormedText,
  type Problem,
  ProblemSchema,
  parseRetryAfterMs,
  parseWith,
  textProblem,
} from '@ledgence/contracts';
import { localProblem, ProblemError, ProtocolError, TransportError } from './errors.js';
import {
  DeadlineExceeded,
  type Exchange,
  type FetchLike,
  fetchExchange,
  type NodeExchange,
  nodeExchange,
  UnsendableRequest,
  type WireReply,
} from './exchange.js';
import { MAX_TIMER_MS, timerDelay } from './timers.js';

export type { FetchLike } from './exchange.js';

/** A schema the contracts' `parseWith` accepts (a valibot schema from @ledgence/contracts). */
export type ReplySchema = Parameters<typeof parseWith>[0];
/** The parsed output of a {@link ReplySchema}. */
export type ReplyOf<S extends ReplySchema> = ReturnType<typeof parseWith<S>>;

/** Connection settings shared by the client and the worker. */
export interface HttpOptions {
  /**
   * The server's base URL, e.g. `http://127.0.0.1:8080`: a path prefix may follow, a query or a
   * fragment may not.
   */
  url: string;
  /**
   * The API key, sent as `Authorization: Bearer <key>`; absent in development mode. A bearer
   * token: letters, digits and `- . _ ~ + /`, optionally ending in `=` (a key read from a file
   * must be trimmed of its line break). Anything else is a `TypeError` here, not a 401 later.
   */
  apiKey?: string | undefined;
  /**
   * Send every request through this `fetch` (a test double, a custom agent, a runtime without
   * `node:http`). By default requests go through `node:http`/`node:https` with kept-alive
   * connections, which costs far less CPU per request than Node's global `fetch`.
   */
  fetch?: FetchLike | undefined;
  /**
   * Timeout of one request, added to any long-poll wait; CONTROL_REQUEST_TIMEOUT_MS by default.
   * A number > 0; `Infinity` (or anything longer than a Node timer holds, about 24.8 days) waits
   * as long as a timer can.
   */
  requestTimeoutMs?: number | undefined;
}

/**
 * The largest long-poll maximum a server can be configured with (`LEDGENCE_LONG_POLL_WAIT_MS` is
 * at most 5 minutes). The server clamps `wait_ms` to its own maximum, so asking for more never
 * waits longer; bounding it here keeps the wire value a number the server accepts and the
 * request's timeout (the wait added to it) within what a timer holds.
 */
export const LONG_POLL_WAIT_BOUND_MS = 5 * 60 * 1000;

/**
 * A long-poll wait as sent in `wait_ms`: at most {@link LONG_POLL_WAIT_BOUND_MS} (so `Infinity`
 * asks for the server's maximum) and rounded up to whole milliseconds, since the server accepts
 * only digits. Throws a `TypeError` naming `name` for a negative or `NaN` wait.
 */
export function wireWaitMs(name: string, waitMs: number): number {
  if (typeof waitMs !== 'number' || !(waitMs >= 0)) {
    throw new TypeError(`${name} must be a number ≥ 0`);
  }
  return Math.ceil(Math.min(waitMs, LONG_POLL_WAIT_BOUND_MS));
}

/**
 * The `wait_ms` query value of a wait already made wire-ready by {@link wireWaitMs}: none for 0
 * (seed `AcquireOptions`: "only the nonzero wait preference is sent over a transport").
 */
export function waitQuery(waitMs: number | undefined): number | undefined {
  return waitMs !== undefined && waitMs > 0 ? waitMs : undefined;
}

/**
 * One path segment of a route: `value` percent-encoded. `.` and `..` are refused: URL
 * normalisation (WHATWG, so both `fetch` and `node:http`'s URL parsing, and `%2E` alike) removes
 * such a segment, and the request would reach another route instead. No id the server issues is
 * either.
 */
export function pathSegment(value: string): string {
  if (typeof value !== 'string' || value.length === 0) {
    throw new TypeError('an id must be a non-empty string');
  }
  if (value === '.' || value === '..') {
    throw new TypeError(`an id cannot be "${value}": URL normalisation removes it from a path`);
  }
  // encodeURIComponent would throw a bare URIError ("URI malformed") naming nothing.
  if (!isWellFormedText(value)) {
    throw new TypeError('an id must be well-formed text: it holds a lone surrogate');
  }
  return encodeURIComponent(value);
}

/**
 * Checks a required text setting of a `Client` or `Worker` at construction: present, not empty,
 * well-formed (a lone surrogate has no UTF-8 encoding, so no request could carry it), and the
 * identifier text the server accepts (DESIGN §3: at most `maxBytes`, no control characters, no
 * whitespace at either end) — otherwise every call would fail `invalid_input`.
 */
export function requiredText<K extends string>(
  options: { readonly [key in K]: unknown },
  key: K,
  maxBytes: number,
): void {
  const value = options[key];
  if (typeof value !== 'string' || value.length === 0) throw new TypeError(`${key} is required`);
  if (!isWellFormedText(value)) {
    throw new TypeError(`${key} must be well-formed text: it holds a lone surrogate`);
  }
  const problem = textProblem(value, maxBytes);
  if (problem !== undefined) {
    // A value read from an env file often ends with its line break.
    const trim = value.trim() !== value ? ' (trim it)' : '';
    throw new TypeError(`${key} ${problem}${trim}`);
  }
}

/**
 * Refuses, as the server would (`invalid_input`), a query whose text is not well-formed:
 * `URLSearchParams` would send a lone surrogate as U+FFFD, and a filter would then silently
 * match a value the caller never named.
 */
export function refuseIllFormedQuery(query: Query): void {
  for (const [name, value] of Object.entries(query)) {
    if (isWellFormedText(name) && (typeof value !== 'string' || isWellFormedText(value))) continue;
    throw localProblem(
      new ContractError(
        'invalid_input',
        `the query parameter ${JSON.stringify(name)} is not well-formed text: it holds a lone surrogate`,
      ),
    );
  }
}

/** Query parameters of a request; `undefined` values are left out. */
export type Query = Record<string, string | number | undefined>;

/** One request: route, body, the reply schema and its byte limit. */
export interface RequestSpec<S extends ReplySchema> {
  method: 'GET' | 'POST';
  /** The path below the base URL, already percent-encoded. */
  path: string;
  /**
   * Query parameters; `undefined` values are left out. A function is asked again each time the
   * request is sent (a long poll's remaining wait).
   */
  query?: Query | (() => Query);
  /** A JSON body; `undefined` sends none. */
  body?: unknown;
  /**
   * The body already encoded as JSON text, sent as it is in place of `body`: a caller that sends
   * a request again (a retry) passes the text of its first send, so the bytes cannot change.
   */
  bodyText?: string | undefined;
  /** The schema of a successful reply. */
  schema: S;
  /** The largest reply body accepted. */
  maxBytes: number;
  /** Statuses that count as success; `[200]` by default. */
  okStatus?: readonly number[];
  /** Extra time beyond the request timeout, e.g. a long poll's wait. */
  extraTimeoutMs?: number;
  /** Aborts the request; the abort reason is rethrown as it is. */
  signal?: AbortSignal | undefined;
}

/** A successful reply: its parsed body and status. */
export interface Reply<T> {
  status: number;
  body: T;
  /** The reply's `Date` header in ms since the epoch; `null` when absent or unreadable. */
  date: number | null;
}

const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

/** Strict JSON of a reply, with contract errors restated as protocol errors. */
function decodeReply(bytes: Uint8Array, maxBytes: number, status: number): unknown {
  try {
    return decodeStrictJson(bytes, { maxBytes, maxDepth: COMMAND_MAX_DEPTH });
  } catch (error) {
    throw asProtocolError(error, status, 'is not strict JSON');
  }
}

function asProtocolError(error: unknown, status: number, what: string): ProtocolError {
  if (error instanceof ContractError) {
    return new ProtocolError(`the server's reply ${what}: ${error.message}`, {
      status,
      path: error.path,
      cause: error,
    });
  }
  return new ProtocolError(`the server's reply ${what}`, { status, cause: error });
}

/**
 * Parses `value` with a reply schema; a mismatch is a {@link ProtocolError}
 * naming the JSON path (the server broke the contract).
 */
export function parseReply<S extends ReplySchema>(schema: S, value: unknown, status = 200) {
  try {
    return parseWith(schema, value) as ReplyOf<S>;
  } catch (error) {
    throw asProtocolError(error, status, 'does not match the contract');
  }
}

/** Whether a batch item is a problem document rather than a result. */
export function isProblem(item: unknown): item is Problem {
  return (
    typeof item === 'object' &&
    item !== null &&
    'type' in item &&
    'code' in item &&
    'status' in item &&
    'detail' in item
  );
}

/** A reply's `Date` header in ms since the epoch; `null` when absent or unreadable. */
function dateOf(header: string): number | null {
  const date = header === '' ? Number.NaN : Date.parse(header);
  return Number.isFinite(date) ? date : null;
}

/** What {@link failureOf} says of the request a failure answered. */
interface SentRequest {
  method: string;
  url: string;
  /** The transport's base URL, as configured. */
  base: string;
}

/** The error a failed status carries: a problem, a retryable server failure, or a protocol break. */
function failureOf(reply: WireReply, bytes: Uint8Array, sent: SentRequest): Error {
  const { status, contentType } = reply;
  // Read only for a failure worth retrying: any other is not sent again, so it has no use.
  const retryAfterMs = (): number | undefined =>
    reply.retryAfter === undefined
      ? undefined
      : // Capped at what a timer holds; an HTTP-date is read against the reply's own Date, so a
        // skew between the server's clock and this machine's does not shift the wait.
        parseRetryAfterMs(reply.retryAfter, dateOf(reply.date) ?? Date.now(), MAX_TIMER_MS);
  let problem: Problem | undefined;
  if (JSON_TYPE.test(contentType)) {
    try {
      problem = parseWith(
        ProblemSchema,
        decodeStrictJson(bytes, { maxBytes: bytes.byteLength + 1 }),
      ) as Problem;
    } catch {
      problem = undefined;
    }
  }
  if (problem !== undefined && problem.status === status) {
    // `unavailable` is the one problem sent again (contracts' retryable codes): a wait asked with
    // any other has no retry to apply to.
    return new ProblemError(problem, {
      retryAfterMs: problem.code === 'unavailable' ? retryAfterMs() : undefined,
      // The server has no such route: the URL, not the request, is wrong; say which it was.
      message:
        problem.reason === 'no_route'
          ? `${problem.detail}: ${sent.method} ${sent.url}; check that url (${sent.base}) is the server's base URL, with its path prefix if it has one, and that the server is not older than this SDK`
          : undefined,
    });
  }
  // Gateways answer 502/504 and rate limiters 429 with pages of their own:
  // the request's fate is unknown, so it is retried like a dropped connection.
  if (status >= 500 || status === 429 || status === 408) {
    return new TransportError(`the server answered ${status}`, {
      reason: 'server',
      status,
      retryAfterMs: retryAfterMs(),
    });
  }
  return new ProtocolError(`the server answered ${status} without a valid problem document`, {
    status,
  });
}

/** Problem replies are small; a larger one is not a problem document. */
const PROBLEM_MAX_BYTES = 64 * 1024;

/** The HTTP transport of a client or worker. */
export class HttpTransport {
  readonly #base: string;
  readonly #apiKey: string | undefined;
  readonly #exchange: Exchange;
  readonly #owned: NodeExchange | undefined;
  /** Timeout of one request, before any long-poll wait is added. */
  readonly requestTimeoutMs: number;

  constructor(options: HttpOptions) {
    if (typeof options.url !== 'string' || !URL.canParse(options.url)) {
      throw new TypeError('url must be an absolute http(s) URL');
    }
    // The URL parser drops spaces at the ends and tabs or line breaks anywhere, so such a url
    // parses; but every route is appended to the text as given, which then is no URL ("Invalid
    // URL" on every call) or a path under `/%20/` (every call `not_found`).
    const blank = options.url.search(/[\s\p{Cc}]/u);
    if (blank >= 0) {
      throw new TypeError(
        `url contains whitespace or a control character (at character ${blank + 1} of ${options.url.length}); trim it: a value read from an env file often has some`,
      );
    }
    // Checked here: a bad scheme would surface as a network failure, which
    // the SDK would retry forever.
    const parsed = new URL(options.url);
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new TypeError(`url must use http or https, not ${parsed.protocol}`);
    }
    // `fetch` refuses to send such a URL, with an error quoting it (the password too), which would
    // then be retried; `node:http` sends it as Basic auth, which the server ignores. The message
    // names neither part, so the password reaches no error or log line.
    if (parsed.username !== '' || parsed.password !== '') {
      throw new TypeError(
        'url must not contain credentials (user:password@): they are not sent; pass an apiKey instead',
      );
    }
    // Every route is appended to the base: after a query or a fragment (a `?` or `#` even with
    // nothing after it), it lands in them and each request reaches `/`, answered `not_found`
    // as if the scope did not exist.
    if (/[?#]/.test(options.url)) {
      throw new TypeError(
        'url must not carry a query string or fragment: routes are appended to it (a path prefix is fine)',
      );
    }
    this.#base = options.url.replace(/\/+$/, '');
    const timeoutMs = options.requestTimeoutMs ?? CONTROL_REQUEST_TIMEOUT_MS;
    if (typeof timeoutMs !== 'number' || !(timeoutMs > 0)) {
      throw new TypeError(
        'requestTimeoutMs must be a number > 0 (Infinity: as long as a timer holds)',
      );
    }
    this.requestTimeoutMs = Math.min(timeoutMs, MAX_TIMER_MS);
    if (options.apiKey !== undefined) {
      const problem = apiKeyProblem(options.apiKey);
      if (problem !== undefined) throw new TypeError(problem);
    }
    this.#apiKey = options.apiKey;
    if (options.fetch !== undefined) {
      if (typeof options.fetch !== 'function') throw new TypeError('fetch must be a function');
      this.#exchange = fetchExchange(options.fetch);
    } else {
      this.#owned = nodeExchange();
      this.#exchange = this.#owned;
    }
  }

  /**
   * Closes the default exchange's kept-alive connections, in use ones too (a request still in
   * flight fails); later requests open new ones. A caller's `fetch` is not reached.
   */
  closeIdle(): void {
    this.#owned?.close();
  }

  /** Sends one request and returns its strictly parsed reply, or throws a typed error. */
  async request<S extends ReplySchema>(spec: RequestSpec<S>): Promise<Reply<ReplyOf<S>>> {
    const urlNow = (): string => {
      let url = `${this.#base}${spec.path}`;
      const query = typeof spec.query === 'function' ? spec.query() : spec.query;
      if (query !== undefined) {
        const params = new URLSearchParams();
        for (const [key, value] of Object.entries(query)) {
          if (value !== undefined) params.append(key, String(value));
        }
        const text = params.toString();
        if (text.length > 0) url += `?${text}`;
      }
      return url;
    };
    const url = urlNow();
    const headers: Record<string, string> = { accept: 'application/json' };
    if (this.#apiKey !== undefined) headers.authorization = `Bearer ${this.#apiKey}`;
    const body = spec.bodyText ?? (spec.body === undefined ? undefined : JSON.stringify(spec.body));
    if (body !== undefined) headers['content-type'] = 'application/json';
    const okStatus = spec.okStatus ?? [200];
    const timeoutMs = timerDelay(this.requestTimeoutMs + (spec.extraTimeoutMs ?? 0));
    let reply: WireReply;
    try {
      reply = await this.#exchange({
        method: spec.method,
        url,
        resendUrl: typeof spec.query === 'function' ? urlNow : undefined,
        headers,
        body,
        timeoutMs,
        signal: spec.signal,
        limitFor: (status) => (okStatus.includes(status) ? spec.maxBytes : PROBLEM_MAX_BYTES),
      });
    } catch (error) {
      if (spec.signal?.aborted) throw spec.signal.reason;
      if (error instanceof UnsendableRequest) {
        throw new TypeError(`${spec.method} ${spec.path} cannot be sent: ${error.message}`, {
          cause: error.cause,
        });
      }
      if (error instanceof DeadlineExceeded) {
        throw new TransportError(`${spec.method} ${spec.path} timed out after ${timeoutMs} ms`, {
          reason: 'timeout',
          cause: error.cause ?? error,
        });
      }
      throw new TransportError(`${spec.method} ${spec.path} failed: ${describe(error)}`, {
        reason: 'network',
        cause: error,
      });
    }
    const { status, contentType } = reply;
    if (!okStatus.includes(status)) {
      // A problem body too large to be one still says "failed with this status".
      throw failureOf(reply, reply.bytes ?? new Uint8Array(0), {
        method: spec.method,
        url,
        base: this.#base,
      });
    }
    if (reply.bytes === null) {
      throw new ProtocolError(`the reply exceeds ${spec.maxBytes} bytes`, { status });
    }
    if (!JSON_TYPE.test(contentType)) {
      throw new ProtocolError(`the server answered ${status} with content type "${contentType}"`, {
        status,
      });
    }
    const value = decodeReply(reply.bytes, spec.maxBytes, status);
    return {
      status,
      body: parseReply(spec.schema, value, status),
      date: dateOf(reply.date),
    };
  }
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const own = messageOf(error);
  const cause = (error as { cause?: unknown }).cause;
  const inner = cause instanceof Error ? messageOf(cause) : '';
  if (own.length > 0 && inner.length > 0) return `${own} (${inner})`;
  return own || inner || error.name;
}

/**
 * What an error says: its message or, when that is empty, its parts. Node 20 connects with
 * `autoSelectFamily`, so a host with several addresses (`localhost`: ::1 and 127.0.0.1) fails
 * with an `AggregateError` whose own message is empty, the reasons being in its `errors`.
 */
function messageOf(error: Error): string {
  if (error.message.length > 0) return error.message;
  if (error instanceof AggregateError) {
    const parts = new Set<string>();
    for (const part of error.errors as unknown[]) {
      const text = part instanceof Error ? part.message : String(part);
      if (text.length > 0) parts.add(text);
    }
    if (parts.size > 0) return [...parts].join('; ');
  }
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' ? code : '';
}
