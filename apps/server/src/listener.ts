/**
 * The HTTP/1.1 edge between the socket and the app: node:http with @hono/node-server's request
 * listener (as its `serve()` builds it), plus what neither does for the server's promises —
 * every refusal made before the app sees a request (by node:http's parser, by its `Expect`
 * check, by @hono/node-server's URL building) is problem+json, logged and counted like the app's
 * own (DESIGN §6, §11), and the requests pipelined on one connection run one after another
 * (RFC 9112 §9.3.2), as the sequence and idempotency rules (DESIGN §4.1) assume of a client that
 * sends `n + 1` after `n`.
 */
import {
  createServer,
  type IncomingMessage,
  type Server,
  type ServerResponse,
  STATUS_CODES,
} from 'node:http';
import type { Duplex } from 'node:stream';
import { getRequestListener, RequestError } from '@hono/node-server';
import { ContractError, REQUEST_HEADER_MAX_BYTES } from '@ledgence/contracts';
import {
  acceptedRequestId,
  type HttpResponseInfo,
  PROBLEM_CONTENT_TYPE,
  problemOf,
} from '@ledgence/http';
import type { Logger } from 'pino';

/** Options of {@link createListeningServer}. */
export interface ListeningServerOptions {
  /** The app's fetch (with whatever the server wraps around it). */
  fetch: (request: Request, env: unknown) => Promise<Response>;
  /** The host the server listens on: @hono/node-server's default for a request without one. */
  hostname: string;
  logger: Logger;
  metrics: { observeHttp(info: HttpResponseInfo): void };
  /**
   * Whether the server is stopping: the last reply of each connection then asks the client to
   * close it, so keep-alive connections drain with their last request instead of lingering until
   * the timeout. Default: never.
   */
  stopping?: () => boolean;
}

/** An HTTP server (not yet listening) that serves `fetch` at the edge described above. */
export function createListeningServer(options: ListeningServerOptions): Server {
  const { logger, metrics } = options;
  // `serve()` but for the listener's errorHandler, which `serve` does not pass on, and which is
  // given the error alone. The request it refuses is the one being handed to the listener: it
  // builds the `Request` (and refuses one it cannot build) and calls `fetch` before its first
  // await, so `handing` is set across that synchronous call only. No async context is needed,
  // and none is used: on Node 20 an AsyncLocalStorage turns on a promise hook for every promise
  // of the process once it first runs.
  let handing: Arrival | undefined;
  const stopping = options.stopping ?? (() => false);
  const fetch = async (request: Request, env: unknown): Promise<Response> => {
    const arrival = handing;
    let response: Response;
    try {
      response = await options.fetch(request, env);
    } catch (error) {
      return responseOf(refusal(appFault(error, arrival, logger)));
    }
    // Only the last request handed over on its connection closes it: a reply marked `close`
    // ends the connection (node:http), and the requests pipelined behind it would run unanswered.
    const incoming = (env as { incoming?: IncomingMessage } | undefined)?.incoming;
    if (stopping() && incoming !== undefined && order.isLast(incoming)) {
      try {
        response.headers.set('connection', 'close');
      } catch {
        // A response with immutable headers is sent as is; the timeout still bounds it.
      }
    }
    return response;
  };
  const listener = getRequestListener(fetch, {
    hostname: options.hostname,
    errorHandler: (error) => responseOf(refusal(requestRefusal(error, handing, logger))),
  });
  const refusal = (made: Refusal) => answerOf(made, logger, metrics);
  const serve = (request: IncomingMessage, response: ServerResponse) => {
    // The id is settled here, as the app would settle it (the client's, or a new one): a
    // refusal of this request's body (clientError) then answers under the id the app logs.
    const sent = request.headers['x-request-id'];
    request.headers['x-request-id'] = acceptedRequestId(
      typeof sent === 'string' ? sent : undefined,
    );
    const arrival = arrivalOf(request);
    // An `Upgrade` the server does not take up (nothing here speaks another protocol): node:http
    // serves the request as HTTP/1.1 but drops the bytes that came with its head and then reads
    // the next bytes as a new request — the body of a request pipelined behind it would run as a
    // request of its own (review r47c). Its reply closes the connection instead.
    if (request.headers.upgrade !== undefined) response.setHeader('connection', 'close');
    // RFC 9112 §3.2: an HTTP/1.1 request without Host, or any with an empty Host or two, is a
    // 400. node:http answers the first bare and keeps the first of two Host lines, and
    // @hono/node-server would serve a missing or empty Host as if sent to `hostname`.
    const hostProblem = hostHeaderProblem(request);
    if (hostProblem !== undefined) {
      sendRefusal(response, refusal(badHost(hostProblem, arrival)));
      return;
    }
    handing = arrival;
    try {
      void listener(request, response);
    } finally {
      handing = undefined;
    }
  };
  const order = inOrderPerConnection(serve);
  // The longest legal list request (every filter at its limit, a cursor) is past node's default.
  const server = createServer(
    { requireHostHeader: false, maxHeaderSize: REQUEST_HEADER_MAX_BYTES },
    order.handle,
  );
  // node:http keeps only the first 2 000 header lines in `rawHeaders`: a second Host line behind
  // them went unseen (review r47c). The header block's size bounds the lines instead.
  server.maxHeadersCount = 0;
  // RFC 9110 §10.1.1: node:http would invite the body (100 Continue) before the app could look at
  // the request; a body the app refuses by its declared length (413) would then be uploaded for
  // nothing. The invitation goes out when the app starts reading the body, and never once the
  // answer has begun (node:http reads an unread body to keep the connection).
  server.on('checkContinue', (request: IncomingMessage, response: ServerResponse) => {
    request.once('resume', () => {
      if (!response.headersSent && !response.writableEnded) response.writeContinue();
    });
    order.handle(request, response);
  });
  // Node answers a header block past its limit, a malformed chunk or request line with a bare
  // status and no body; a socket that failed while reading gets no answer (there is no one).
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    if (!socket.writable || error.code === 'ECONNRESET') {
      socket.destroy();
      return;
    }
    // Made (and, for a request of its own, logged and counted) only when it is sent: a
    // connection closed without it answers nothing.
    const reply = (refused: Answer) => endWith(socket, refused);
    const last = order.last(socket);
    if (last !== undefined && !last.request.complete) {
      // The bytes refused are the body of the last request handed over: the refusal is its
      // answer, if the app has begun serving it and not yet begun its own answer (node:http's
      // rule); a request still queued behind others gets none (the connection closes). The app
      // logs and counts that request as it ends, under its own id, which the refusal carries.
      if (last.served && !last.response.headersSent) {
        reply(unrecordedAnswerOf({ ...parserRefusal(error), arrival: arrivalOf(last.request) }));
      } else socket.destroy();
      return;
    }
    // A request of its own, behind those pipelined before it: written at once, the refusal would
    // be read as the answer to the first of them, or cut into it.
    const ahead = order.answered(socket);
    if (ahead === undefined) reply(refusal(parserRefusal(error)));
    else void ahead.then(() => reply(refusal(parserRefusal(error))));
  });
  // node:http closes a CONNECT's connection without a word when nothing listens here; it is a
  // refusal like any other (review r47c): answered, logged and counted.
  server.on('connect', (request: IncomingMessage, socket: Duplex) => {
    const arrival = arrivalOf(request);
    const answer = () => {
      endWith(socket, refusal(connectRefusal(arrival)));
      // node:http has let go of this connection: no keep-alive timeout or closeAllConnections
      // ends it any more, so it ends with the reply, whether or not the client closes its side
      // (review r49a: held open past the 5 s keep-alive timeout, and through a stop).
      socket.once('finish', () => socket.destroy());
    };
    // Behind requests pipelined before it, as any refusal of a request of its own: written at
    // once, it would be read as the answer to the first of them (review r49a).
    const ahead = order.answered(socket);
    if (ahead === undefined) answer();
    else void ahead.then(answer);
  });
  // Node answers an `Expect` other than 100-continue with a bare 417 when nothing listens here.
  server.on('checkExpectation', (request: IncomingMessage, response: ServerResponse) => {
    const refused = refusal(expectationRefusal(arrivalOf(request)));
    sendRefusal(response, refused);
  });
  return server;
}

/**
 * Runs the requests of one connection one at a time, each once the previous one's response has
 * ended (or its connection closed). node:http parses pipelined requests as they arrive and hands
 * each over at once, so a renewal `n + 1` sent right behind `n` could run first and be refused
 * (`sequence_conflict`), and the replay of a submit could create the task its first copy then
 * found. Responses go out in order either way; a request behind a parked poll waits for it, as
 * its response had to.
 */
function inOrderPerConnection(
  serve: (request: IncomingMessage, response: ServerResponse) => void,
): {
  handle: (request: IncomingMessage, response: ServerResponse) => void;
  /** When every request handed over on `socket` so far is answered; `undefined` if it is now. */
  answered: (socket: Duplex) => Promise<void> | undefined;
  /** The last request handed over on `socket` and not yet answered, and whether it is served. */
  last: (socket: Duplex) => Handed | undefined;
  /** Whether `request` is the last one handed over on its connection so far. */
  isLast: (request: IncomingMessage) => boolean;
} {
  const connections = new WeakMap<Duplex, Connection>();
  const connectionOf = (socket: Duplex): Connection => {
    let connection = connections.get(socket);
    if (connection === undefined) {
      const made: Connection = { last: undefined, waiting: new Set() };
      // node:http emits no 'close' on a response still queued when its connection closes: the
      // connection's own 'close' (one listener per connection) ends them all then.
      socket.once('close', () => {
        for (const end of made.waiting) end();
      });
      connections.set(socket, made);
      connection = made;
    }
    return connection;
  };
  return {
    handle(request, response) {
      const socket = request.socket;
      const connection = connectionOf(socket);
      const ahead = connection.last?.ended;
      let end = () => {};
      const ended = new Promise<void>((resolve) => {
        end = () => {
          connection.waiting.delete(end);
          response.off('close', end);
          resolve();
        };
      });
      connection.waiting.add(end);
      response.once('close', end);
      const handed = { request, response, ended, served: false };
      connection.last = handed;
      const start = () => {
        // Its client left while it waited, or the reply ahead of it closed the connection:
        // nobody can receive its answer, and a request never served answers nothing (DESIGN §5:
        // a disconnect consumes no task). Served, a poll would park and claim for no one, its
        // signal never aborted (@hono/node-server aborts it on the response's 'close', which a
        // queued response never emits).
        if (socket.destroyed || !socket.writable) return;
        handed.served = true;
        serve(request, response);
      };
      // The common case, one request at a time on a connection: served at once.
      if (ahead === undefined) start();
      else void ahead.then(start);
      void ended.then(() => {
        if (connection.last === handed) connection.last = undefined;
      });
    },
    answered: (socket) => connections.get(socket)?.last?.ended,
    last: (socket) => connections.get(socket)?.last,
    isLast: (request) => connections.get(request.socket)?.last?.request === request,
  };
}

/** The requests of one connection still to be answered. */
interface Connection {
  /** The last request handed over and not yet answered. */
  last: (Handed & { ended: Promise<void> }) | undefined;
  /** Ends the wait of each request handed over and not yet answered. */
  readonly waiting: Set<() => void>;
}

/** A request handed over on a connection, and whether the app serves it yet. */
interface Handed {
  readonly request: IncomingMessage;
  readonly response: ServerResponse;
  served: boolean;
}

/** What @hono/node-server says of the requests it cannot make a `Request` of; anything else is not echoed. */
const REQUEST_ERRORS = new Set([
  'Backslash in request path',
  'Invalid host header',
  'Missing host header',
  'Invalid URL',
  'Invalid absolute URL',
  'Unsupported scheme',
]);

/**
 * What a refusal before the app reports of its request, taken as it reached the listener. Only
 * these: the fetch wrapper holds it while the app serves the request (for a fault's log line), so
 * it must not hold the request itself, whose headers carry its credential (DESIGN §6: only a
 * key's hash is held in memory; keys-in-memory.e2e).
 */
interface Arrival {
  readonly requestId: string | undefined;
  readonly method: string;
  readonly remoteAddress: string | null;
  readonly started: number;
}

function arrivalOf(request: IncomingMessage): Arrival {
  const header = request.headers['x-request-id'];
  return {
    requestId: typeof header === 'string' ? header : undefined,
    method: request.method ?? 'GET',
    remoteAddress: request.socket.remoteAddress ?? null,
    started: performance.now(),
  };
}

/** A refusal made before the app: what to answer and what to log. */
interface Refusal {
  readonly error: ContractError;
  /** Echoed in the log line; only texts of a known set, never the request's bytes. */
  readonly detail?: string;
  readonly arrival: Arrival | undefined;
}

/**
 * A request @hono/node-server refuses (a backslash in its path, a Host it cannot parse or none):
 * `invalid_input`. Anything else reaching its error handler is the fault {@link appFault} reports
 * (none is expected: `fetch` answers its own rejections).
 */
function requestRefusal(error: unknown, arrival: Arrival | undefined, logger: Logger): Refusal {
  if (!(error instanceof RequestError)) return appFault(error, arrival, logger);
  const detail = REQUEST_ERRORS.has(error.message) ? error.message : 'Malformed request';
  const refused = new ContractError('invalid_input', `${detail}: the request could not be read`, {
    reason: 'malformed_request',
  });
  return { error: refused, detail, arrival };
}

/**
 * The app's fetch rejecting, which its error mapping should make impossible: logged as the fault
 * it is and answered `unavailable`, never a connection left without a reply.
 */
function appFault(error: unknown, arrival: Arrival | undefined, logger: Logger): Refusal {
  logger.error(
    { request_id: acceptedRequestId(arrival?.requestId), err: error },
    'request failed outside the app',
  );
  const refused = new ContractError('unavailable', 'the request could not be served; retry');
  return { error: refused, arrival };
}

/**
 * A request node:http's parser refused: a header block past its limit is `payload_too_large`
 * (413, reason `header_too_large`, where node:http says 431), one not received in time or any
 * other bytes that are not HTTP/1.1 `invalid_input` (400; node:http says 408 for the first).
 * Each keeps the status of its code, as every problem document does (`ProblemSchema`; the SDK
 * reads a document that breaks it as a protocol error). Nothing of the request was parsed, so
 * it has no id of its own, no method and no peer to report.
 */
function parserRefusal(error: NodeJS.ErrnoException): Refusal {
  if (error.code === 'HPE_HEADER_OVERFLOW') {
    const refused = new ContractError(
      'payload_too_large',
      `the request headers are larger than the server reads (${REQUEST_HEADER_MAX_BYTES / 1024} KiB)`,
      { reason: 'header_too_large' },
    );
    return { error: refused, detail: 'Header fields too large', arrival: undefined };
  }
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    const refused = new ContractError('invalid_input', 'the request was not received in time', {
      reason: 'request_timeout',
    });
    return { error: refused, detail: 'Request timeout', arrival: undefined };
  }
  const refused = new ContractError(
    'invalid_input',
    'Malformed request: the request could not be read',
    { reason: 'malformed_request' },
  );
  return { error: refused, detail: 'Malformed request', arrival: undefined };
}

/** What is wrong with a request's Host header (RFC 9112 §3.2), if anything. */
function hostHeaderProblem(request: IncomingMessage): string | undefined {
  let lines = 0;
  for (let i = 0; i < request.rawHeaders.length; i += 2) {
    if (request.rawHeaders[i]?.toLowerCase() === 'host') lines += 1;
  }
  if (lines > 1) return 'Duplicate host header';
  if (request.headers.host === '') return 'Empty host header';
  if (lines === 0 && request.httpVersion === '1.1') return 'Missing host header';
  return undefined;
}

function badHost(detail: string, arrival: Arrival): Refusal {
  const refused = new ContractError(
    'invalid_input',
    `${detail}: an HTTP/1.1 request names its host once`,
    { reason: 'malformed_request' },
  );
  return { error: refused, detail, arrival };
}

/**
 * An `Expect` other than `100-continue` (RFC 9110 §10.1.1): `invalid_input` (400, reason
 * `expectation_failed`), where node:http says 417 with no body.
 */
function expectationRefusal(arrival: Arrival): Refusal {
  const refused = new ContractError(
    'invalid_input',
    'the only expectation the server meets is Expect: 100-continue',
    { reason: 'expectation_failed' },
  );
  return { error: refused, detail: 'Expectation failed', arrival };
}

/**
 * A `CONNECT` (a tunnel to the authority it names): `invalid_input` (400, reason
 * `malformed_request`); the server is no proxy.
 */
function connectRefusal(arrival: Arrival): Refusal {
  const refused = new ContractError(
    'invalid_input',
    'CONNECT is not served: this server is not a proxy',
    { reason: 'malformed_request' },
  );
  return { error: refused, detail: 'CONNECT', arrival };
}

/** Writes a refusal on a connection node:http has let go of (no response object), and ends it. */
function endWith(socket: Duplex, refused: Answer): void {
  const head = [
    `HTTP/1.1 ${refused.status} ${STATUS_CODES[refused.status] ?? ''}`,
    ...Object.entries(refused.headers).map(([name, value]) => `${name}: ${value}`),
    `content-length: ${Buffer.byteLength(refused.body)}`,
    'connection: close',
  ];
  if (socket.writable) socket.end(`${head.join('\r\n')}\r\n\r\n${refused.body}`);
  else socket.destroy();
}

/** Sends a refusal made after node:http parsed the request, and closes the connection. */
function sendRefusal(response: ServerResponse, refused: Answer): void {
  response.writeHead(refused.status, {
    ...refused.headers,
    'content-length': String(Buffer.byteLength(refused.body)),
    connection: 'close',
  });
  response.end(refused.body);
}

/** A refusal's reply as the listener sends the app's. */
function responseOf(refused: Answer): Response {
  return new Response(refused.body, { status: refused.status, headers: refused.headers });
}

/** A refusal's reply. */
interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * Answers, logs and counts a refusal made before the app as the app does every request: its id
 * (the client's `x-request-id`, or a new one) in the reply's header, its problem document and
 * its `request` log line, and its route `unmatched` in `ledgence_http_request_duration_seconds`.
 */
function answerOf(
  made: Refusal,
  logger: Logger,
  metrics: { observeHttp(info: HttpResponseInfo): void },
): Answer {
  const answer = unrecordedAnswerOf(made);
  const { error, detail, arrival } = made;
  const method = arrival?.method ?? null;
  const durationMs = arrival === undefined ? 0 : performance.now() - arrival.started;
  logger.info(
    {
      request_id: answer.headers['x-request-id'],
      method,
      route: null,
      status: answer.status,
      duration_ms: Math.round(durationMs * 1000) / 1000,
      tenant: null,
      remote_address: arrival?.remoteAddress ?? null,
      ...(detail === undefined ? {} : { reason: error.reason, detail }),
    },
    'request',
  );
  // A request the parser refused has no method to count: it is counted as `other`.
  metrics.observeHttp({ route: null, method: method ?? '', status: answer.status, durationMs });
  return answer;
}

/**
 * A refusal's reply alone, for a request another record covers: the body of a request the app
 * serves, which the app logs and counts as one request when it ends ({@link answerOf} otherwise).
 */
function unrecordedAnswerOf({ error, arrival }: Refusal): Answer {
  const requestId = acceptedRequestId(arrival?.requestId);
  const problem = problemOf(error, { requestId });
  return {
    status: problem.status,
    headers: { 'content-type': PROBLEM_CONTENT_TYPE, 'x-request-id': requestId },
    body: JSON.stringify(problem),
  };
}
