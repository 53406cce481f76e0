/**
 * One delivery try of a completion event to one destination (DESIGN §8):
 * a POST of the exact event bytes with Standard Webhooks headers, bounded by
 * a connect timeout and a total deadline, decided by the response status,
 * reading at most COMPLETION_RESPONSE_MAX_BYTES of the response and following
 * no redirect.
 * The result is a {@link DeliveryOutcome} value; network conditions never
 * throw, so the leasing loop records every try the same way.
 *
 * `node:http` rather than `fetch`/undici: undici's body timeout measures
 * only the idle gap between chunks, so a receiver trickling a byte a second
 * would hold a delivery forever. Here one timer bounds the whole exchange and
 * destroys the socket when it fires.
 */
import { type ClientRequest, request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import {
  COMPLETION_EVENT_MAX_BYTES,
  COMPLETION_MAX_RETRY_DELAY_MS,
  COMPLETION_RESPONSE_MAX_BYTES,
  type CompletionEvent,
  ContractError,
  canonicalJson,
  HTTP_STATUS_MAX,
  HTTP_STATUS_MIN,
  parseRetryAfterMs as parseRetryAfter,
  validateCompletionEvent,
} from '@ledgence/contracts';
import type { Destination } from './destinations.js';
import { webhookHeaders } from './signature.js';

/** The content type of a structured-mode CloudEvent (CloudEvents JSON format §4). */
export const CLOUDEVENTS_CONTENT_TYPE = 'application/cloudevents+json';

/**
 * Default time to establish the connection (DNS, TCP and, for https, TLS),
 * always capped by the destination's total timeout. Short, so a black-holed
 * address fails fast instead of consuming the whole deadline.
 */
export const DEFAULT_CONNECT_TIMEOUT_MS = 3_000;

/** Sent as `user-agent`, so receivers and their proxies can tell what calls them. */
const USER_AGENT = 'ledgence-callbacks';

/** The event as it travels: its id (the webhook id) and its exact body bytes. */
export interface EncodedEvent {
  /** The CloudEvent `id`, sent as `webhook-id`. */
  readonly id: string;
  /** The compact canonical JSON of the event, identical on every try. */
  readonly body: Buffer;
}

/**
 * The completion event as it travels: RFC 8785 canonical compact JSON, so
 * the same event gives the same bytes on every try and every redelivery,
 * whichever replica sends it. Validates the event and throws a
 * `ContractError` if it breaks the schema or encodes to more than
 * COMPLETION_EVENT_MAX_BYTES.
 *
 * @example
 * const encoded = encodeCompletionEvent(buildCompletionEvent({ ...task, event_id }));
 */
export function encodeCompletionEvent(event: CompletionEvent): EncodedEvent {
  const checked = validateCompletionEvent(event);
  const body = Buffer.from(canonicalJson(checked), 'utf8');
  if (body.byteLength > COMPLETION_EVENT_MAX_BYTES) {
    throw new ContractError(
      'payload_too_large',
      `the completion event encodes to more than ${COMPLETION_EVENT_MAX_BYTES} bytes`,
      { reason: 'too_large', path: '$' },
    );
  }
  return Object.freeze({ id: checked.id, body });
}

/** The receiver accepted the event: it answered a 2xx, whatever its body. */
export interface DeliveredOutcome {
  /** The discriminant. */
  readonly kind: 'delivered';
  /** The 2xx status. */
  readonly status: number;
}

/** The receiver answered 410 Gone: the subscription stops retrying. */
export interface GoneOutcome {
  /** The discriminant. */
  readonly kind: 'gone';
  /** Always 410. */
  readonly status: 410;
}

/**
 * Why a try failed, a small fixed set fit for a metrics label: a non-2xx
 * `status`, a `redirect` (3xx, never followed), the total `timeout`, the
 * `connect_timeout`, a `network` error (including a status line outside
 * 100..999), or `aborted` by the caller's signal.
 */
export type RetryReason =
  | 'status'
  | 'redirect'
  | 'timeout'
  | 'connect_timeout'
  | 'network'
  | 'aborted';

/** The try failed; the event is due again after a backoff (see `nextDeliveryDelayMs`). */
export interface RetryOutcome {
  /** The discriminant. */
  readonly kind: 'retry';
  /** The failure class, for metrics. */
  readonly reason: RetryReason;
  /** A short description for `last_error`; never holds a secret or response content. */
  readonly error: string;
  /** The response status, when one arrived. */
  readonly status?: number;
  /** A valid `Retry-After`, in ms from now, capped at COMPLETION_MAX_RETRY_DELAY_MS. */
  readonly retryAfterMs?: number;
  /** True when the try ended before any request was started (its signal had already fired). */
  readonly unsent?: true;
}

/** The result of one delivery try, a plain data value. */
export type DeliveryOutcome = DeliveredOutcome | GoneOutcome | RetryOutcome;

/** Options of {@link deliverEvent}. */
export interface DeliverEventOptions {
  /** Where to send: URL, signing key and total timeout. */
  destination: Destination;
  /** The encoded event ({@link encodeCompletionEvent}); its bytes are sent as they are. */
  event: EncodedEvent;
  /** Connection establishment limit; DEFAULT_CONNECT_TIMEOUT_MS, never above the total timeout. */
  connectTimeoutMs?: number;
  /** Aborts the try (e.g. at shutdown): the outcome is a retry with reason `aborted`. */
  signal?: AbortSignal;
  /** The clock for `webhook-timestamp` and HTTP-date `Retry-After`, in ms; `Date.now` by default. */
  now?: () => number;
}

/**
 * Delivers one event to one destination: POSTs the exact `event.body` as
 * `application/cloudevents+json` with the Standard Webhooks headers (signed
 * at this try's time), and resolves with the outcome:
 *
 * - `delivered` for a 2xx, decided at the status line: the receiver has
 *   accepted the event, so what its body does after that (too long, cut off,
 *   too slow) changes nothing;
 * - `gone` for 410, so the caller stops retrying;
 * - `retry` for everything else — other statuses (with `Retry-After` parsed),
 *   redirects (never followed), a status line outside 100..999, a connect
 *   timeout, the total deadline (the destination's `timeoutMs`, measured from
 *   the call, not from the last byte), connection errors and an abort.
 *
 * A kept-alive connection the receiver closes as it is reused (a reset
 * before any answer) is not a failed try: the same bytes, with the same
 * headers, go again on another connection within the same deadline.
 *
 * At most COMPLETION_RESPONSE_MAX_BYTES of a 2xx body is read, counted and
 * never kept, within the same deadline; past it the socket is destroyed. Any
 * other answer is not read at all.
 *
 * Never rejects for network conditions; rejects with a `TypeError` only for
 * caller bugs (a destination without its key, a non-http(s) URL, a bad id).
 *
 * @example
 * const outcome = await deliverEvent({ destination, event: encodeCompletionEvent(event) });
 * if (outcome.kind === 'retry') console.log(outcome.reason, outcome.error, outcome.retryAfterMs);
 */
export async function deliverEvent(options: DeliverEventOptions): Promise<DeliveryOutcome> {
  const { destination, event, signal } = options;
  const now = options.now ?? Date.now;
  const url = new URL(destination.url);
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new TypeError('a destination URL must use http or https');
  }
  if (!Buffer.isBuffer(destination.secret) || destination.secret.byteLength === 0) {
    // Object spread drops the non-enumerable key; say so rather than send unsigned.
    throw new TypeError(`destination ${JSON.stringify(destination.alias)} has no signing key`);
  }
  const totalMs = destination.timeoutMs;
  const connectMs = Math.min(options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS, totalMs);
  const headers = {
    ...webhookHeaders({
      id: event.id,
      timestampSeconds: Math.floor(now() / 1000),
      body: event.body,
      secret: destination.secret,
    }),
    'content-type': CLOUDEVENTS_CONTENT_TYPE,
    'content-length': String(event.body.byteLength),
    'user-agent': USER_AGENT,
  };
  if (signal?.aborted) return { ...retry('aborted', 'aborted before sending'), unsent: true };

  return new Promise<DeliveryOutcome>((resolve) => {
    let settled = false;
    let connectTimer: NodeJS.Timeout | undefined;
    // The request on the wire: a stale kept-alive connection's request is replaced by a resend.
    let current: ClientRequest | undefined;
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;

    // The outcome is settled once, the first to come winning; the exchange may go on after it
    // (a delivered 2xx's body is still drained), so ending it is a step of its own.
    const settle = (outcome: DeliveryOutcome): void => {
      if (settled) return;
      settled = true;
      resolve(outcome);
    };
    const end = (destroy: boolean): void => {
      clearTimeout(deadline);
      clearTimeout(connectTimer);
      signal?.removeEventListener('abort', onAbort);
      // Destroying the socket is how an unwanted or endless response stops being read.
      if (destroy) current?.destroy();
    };
    const finish = (outcome: DeliveryOutcome, destroy: boolean): void => {
      settle(outcome);
      end(destroy);
    };
    // After a delivered 2xx this only ends the drain: the outcome stays `delivered`.
    const fail = (reason: RetryReason, error: string, status?: number, after?: number) =>
      finish(retry(reason, error, status, after), true);
    const handlers: ResponseHandlers = { settle, end, finish, fail };

    // One timer for the whole exchange, resends included: a trickling body cannot push it back.
    const deadline = setTimeout(
      () => fail('timeout', `no complete response within ${totalMs} ms`),
      totalMs,
    );
    const onAbort = () => fail('aborted', 'aborted');
    signal?.addEventListener('abort', onAbort, { once: true });

    const post = (): void => {
      const req: ClientRequest = send(url, { method: 'POST', headers });
      current = req;
      let answered = false;
      req.once('socket', (socket: Socket) => {
        guardSocket(socket);
        // A kept-alive socket is connected already; a new one has until connectMs.
        if (!socket.connecting) return;
        clearTimeout(connectTimer);
        connectTimer = setTimeout(
          () => fail('connect_timeout', `no connection within ${connectMs} ms`),
          connectMs,
        );
        socket.once(url.protocol === 'https:' ? 'secureConnect' : 'connect', () =>
          clearTimeout(connectTimer),
        );
      });
      // Also the route of every error after `end` destroyed the request: the outcome stands then.
      req.on('error', (error: NodeJS.ErrnoException) => {
        if (req !== current) return;
        if (!settled && !answered && req.reusedSocket && isStaleConnection(error)) {
          post();
          return;
        }
        fail('network', `connection failed: ${error.code ?? error.message}`);
      });
      req.on('response', (res: IncomingMessage) => {
        answered = true;
        onResponse(res, now(), handlers);
      });
      // A 101 with Upgrade headers comes here, not as a response. Unheard, Node drops the socket
      // without an error and the try would wait out its whole deadline as a timeout. Handed
      // over, the socket is ours (the agent let go of it): close it and decide by the status.
      req.on('upgrade', (res: IncomingMessage, socket: Socket) => {
        answered = true;
        socket.destroy();
        onResponse(res, now(), handlers);
      });
      req.end(event.body);
    };
    post();
  });
}

/**
 * A reset, a close without an answer (`socket hang up`, also ECONNRESET) or a broken pipe: on a
 * reused connection, the receiver closed it as we reused it (its keep-alive timeout, which few
 * servers announce). The POST is then sent again, once per reused connection, on another one,
 * within the same deadline: a reset does not say whether the receiver saw the event, and
 * webhooks are at-least-once (a receiver drops a repeat by `webhook-id`), whereas counting the
 * race as a failed try would delay the event by a backoff and bring it closer to exhaustion for
 * nothing the receiver did wrong. The worker SDK's exchange resends the same way.
 */
function isStaleConnection(error: NodeJS.ErrnoException): boolean {
  return error.code === 'ECONNRESET' || error.code === 'EPIPE';
}

/**
 * Gives a connection an error listener of its own, once. A receiver answering 2xx before reading
 * the body (keep-alive in its headers) and then closing the connection leaves the POST's write
 * pending after the answer: once it fails, `node:http` frees the connection (taking its error
 * listener off) and the global agent destroys it, no longer writable, without adding one, so the
 * broken pipe reported a moment later was an uncaught exception that ended the sender's process.
 * While a request holds the connection, `node:http`'s listener still passes its errors to the
 * request; this one only keeps a freed connection's from throwing. The worker SDK's exchange has
 * the same guard: the SDK installs alone, so the two packages cannot share it.
 */
function guardSocket(socket: Socket): void {
  if (!socket.listeners('error').includes(ignoreSocketError)) socket.on('error', ignoreSocketError);
}

function ignoreSocketError(): void {}

interface ResponseHandlers {
  settle: (outcome: DeliveryOutcome) => void;
  end: (destroy: boolean) => void;
  finish: (outcome: DeliveryOutcome, destroy: boolean) => void;
  fail: (reason: RetryReason, error: string, status?: number, after?: number) => void;
}

/**
 * Decides at the status: any answer but a 2xx at once, without reading its body; a 2xx is
 * delivered, and its body drained within the byte limit so the connection can be reused.
 */
function onResponse(res: IncomingMessage, nowMs: number, handlers: ResponseHandlers): void {
  const { settle, end, finish, fail } = handlers;
  const status = res.statusCode;
  // Listen before deciding: destroying the socket makes the response emit errors. Each path
  // below settles the outcome at once, so an error can only end the exchange, never decide it.
  res.on('error', () => end(true));
  if (status === undefined || status < HTTP_STATUS_MIN || status > HTTP_STATUS_MAX) {
    // Node's parser takes any three digits ("099", "000"); outside the range a subscription
    // records (CompletionSubscriptionSchema) it is not an HTTP status: a broken response, like one cut off, and nothing to record.
    fail('network', `invalid status line (status ${status})`);
    return;
  }
  if (status === 410) {
    finish({ kind: 'gone', status: 410 }, true);
    return;
  }
  if (status < 200 || status > 299) {
    const after = parseRetryAfterMs(res.headers['retry-after'], nowMs);
    if (status >= 300 && status <= 399) {
      fail('redirect', `redirect ${status} not followed`, status, after);
    } else {
      fail('status', `status ${status}`, status, after);
    }
    return;
  }
  // DESIGN §8: 2xx = delivered. The receiver has the event; failing now would post it again,
  // up to exhaustion, to a receiver that accepted it every time.
  settle({ kind: 'delivered', status });
  if (Number(res.headers['content-length']) > COMPLETION_RESPONSE_MAX_BYTES) {
    // More than the limit is coming: reading it would be work for nothing.
    end(true);
    return;
  }
  let received = 0;
  let ended = false;
  res.on('data', (chunk: Buffer) => {
    // Counted, never kept: the body's content does not matter, only that it stays in bounds.
    received += chunk.byteLength;
    if (received > COMPLETION_RESPONSE_MAX_BYTES) end(true);
  });
  res.on('end', () => {
    ended = true;
    // Read to its end: the socket may go back to the agent's keep-alive pool.
    end(false);
  });
  // Cut off before its end (the socket is gone already): only the timers are left to clear.
  res.on('close', () => {
    if (!ended) end(true);
  });
}

function retry(
  reason: RetryReason,
  error: string,
  status?: number,
  retryAfterMs?: number,
): RetryOutcome {
  const outcome: { -readonly [K in keyof RetryOutcome]: RetryOutcome[K] } = {
    kind: 'retry',
    reason,
    error,
  };
  if (status !== undefined) outcome.status = status;
  if (retryAfterMs !== undefined) outcome.retryAfterMs = retryAfterMs;
  return outcome;
}

/**
 * The delay a `Retry-After` value asks for, in ms from `nowMs`: delay-seconds
 * or an HTTP-date (RFC 9110 §10.2.3), capped at COMPLETION_MAX_RETRY_DELAY_MS;
 * a date in the past gives 0. `undefined` when absent or malformed, so a
 * broken header falls back to the normal backoff. The contracts' reading, with
 * the sender's cap.
 *
 * @example
 * parseRetryAfterMs('7', Date.now()); // → 7000
 * parseRetryAfterMs('Wed, 21 Oct 2015 07:28:00 GMT', Date.UTC(2015, 9, 21, 7, 27, 0)); // → 60000
 */
export function parseRetryAfterMs(value: string | undefined, nowMs: number): number | undefined {
  return parseRetryAfter(value, nowMs, COMPLETION_MAX_RETRY_DELAY_MS);
}
