/**
 * The Hono app of DESIGN §6: every client and worker route, batch routes
 * included, with the order of checks of DESIGN §4.1 — authentication (401),
 * content type (415), body size and decoding (413/400), authorization of the
 * scope and role (403), then what the service says (404/409/410). Errors are
 * mapped to problem+json in one place (`onError`/`notFound`). The completion
 * subscription routes (DESIGN §8) and the admin retention routes are mounted
 * only when their service is given. Every route declares who may call it
 * (`documentRoute(<operation id>)`, policy.ts), the role checks read that
 * declaration, and the app refuses to be built with a route that lacks one.
 */
import {
  BATCH_MAX_BYTES,
  COMMAND_MAX_DEPTH,
  COMPLETION_COMMAND_MAX_BYTES,
  CONTROL_REQUEST_MAX_BYTES,
  ContractError,
  type DecodedItem,
  DISPATCH_MAX_BYTES,
  decodeAcquireBatch,
  decodeAcquireCommand,
  decodeCompletionRetryCommand,
  decodeCompletionSubscribeCommand,
  decodeLeaseOwner,
  decodeOpenSessionCommand,
  decodeRenewBatch,
  decodeRenewCommand,
  decodeSetRetentionPolicyCommand,
  decodeSettleBatch,
  decodeSettleCommand,
  decodeStrictJson,
  decodeSubmitBatch,
  decodeSubmitRequest,
  type LeaseOwner,
  LONG_POLL_WAIT_MS,
  MAX_RETENTION_BATCH,
  type Problem,
  parseWith,
  type Scope,
  SETTLEMENT_MAX_BYTES,
  SUBMISSION_MAX_BYTES,
  type SubmitCommand,
  textProblem,
} from '@ledgence/contracts';
import type { CompletionService, ItemResult, RetentionStore, TaskService } from '@ledgence/core';
import { type Context, Hono } from 'hono';
import { matchedRoutes } from 'hono/route';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import pino, { type Logger } from 'pino';
import {
  type AuthOptions,
  allowsScope,
  createAuthenticator,
  isLoopbackHost,
  type Principal,
  type Role,
  requireRole,
  requireScope,
  soleScope,
} from './auth.js';
import { CancelBodySchema, ExtendSessionBodySchema } from './bodies.js';
import { readBody } from './body.js';
import {
  createOpenApiDocument,
  documentRoute,
  PATH_PARAMETER_MAX_BYTES,
  type PathParameter,
} from './openapi.js';
import { checkRoutePolicies, type PolicyVariables } from './policy.js';
import { genericError, PROBLEM_CONTENT_TYPE, problemOf, wrapsBackendFailure } from './problem.js';
import {
  parseAfterSequence,
  parseLimit,
  parseListQuery,
  parseWaitMs,
  singleValues,
} from './query.js';
import { acceptedRequestId, REQUEST_ID_HEADER } from './request-id.js';

/** Readiness as the server reports it: a flag, or a flag with a short explanation. */
export type Readiness = boolean | { ok: boolean; detail?: string };

/** What `/readyz` asks (database reachable, migrations current). */
export interface HealthOptions {
  /** Resolves to whether the server can take traffic; a rejection counts as not ready. */
  ready(): Promise<Readiness>;
}

/** What `/metrics` serves (e.g. a prom-client registry). */
export interface MetricsOptions {
  /** The `Content-Type` of the rendered metrics. */
  contentType: string;
  /** Renders the current metrics as text. */
  render(): Promise<string>;
}

/**
 * What the admin retention routes call: the policy and preview operations of
 * the store's {@link RetentionStore} port. Collection itself is not exposed
 * over HTTP; it runs in the server's maintenance loop.
 */
export type RetentionAdminOptions = Pick<
  RetentionStore,
  'retentionPolicy' | 'setRetentionPolicy' | 'previewRetention'
>;

/** Options of {@link createHttpApp}. */
export interface HttpAppOptions {
  /** The task service every task and worker route calls. */
  service: TaskService;
  /**
   * The completion service of `{scope}/tasks/{task_id}/completion-subscriptions`
   * and `{scope}/completion-subscriptions/{id}/redeliver`; without one those
   * routes are not mounted (404).
   */
  completions?: CompletionService;
  /**
   * The retention operations of the admin routes `{scope}/retention-policy`
   * and `{scope}/retention-policy/preview`; without them those routes are not
   * mounted (404).
   */
  retention?: RetentionAdminOptions;
  /** The API keys; `{ keys: [] }` is development mode (every request allowed). */
  auth: AuthOptions;
  /** The most a `wait_ms` may ask for; larger values are clamped. Default LONG_POLL_WAIT_MS. */
  longPollMaxMs?: number;
  /** One JSON line per request goes here; default a silent logger. */
  logger?: Logger;
  /** Readiness probe of `/readyz`; without one the app reports ready. */
  health?: HealthOptions;
  /** The source of `/metrics`; without one the route answers 404. */
  metrics?: MetricsOptions;
  /** The request id header taken from requests and echoed on replies. Default `x-request-id`. */
  requestIdHeader?: string;
  /**
   * Called once per request, where its log line is written (e.g. to observe an HTTP duration
   * histogram). An exception it throws is logged and otherwise ignored: observing a request
   * must never change its reply.
   */
  onResponse?: (info: HttpResponseInfo) => void;
  /**
   * The address of the request's peer, logged as `remote_address` on its line (the server passes
   * the socket's, through `@hono/node-server`'s `getConnInfo`): which client sent a burst of
   * 401s, or whose requests a balancer sends here. Without it, or when it answers `undefined`
   * (as `app.request()` has no socket), the field is `null`. Forwarded headers are not read: any
   * client can set them.
   */
  remoteAddress?: (c: Context) => string | undefined;
}

/** What {@link HttpAppOptions.onResponse} learns about one answered request. */
export interface HttpResponseInfo {
  /**
   * The route PATTERN that answered (e.g. `/v1/tenants/:tenant_id/namespaces/:namespace/tasks`),
   * never the raw path, so it is one of a fixed set; `null` when no route matched.
   */
  route: string | null;
  /** The request method as received. */
  method: string;
  /** The reply's status code. */
  status: number;
  /** From the first middleware to the reply being ready, in milliseconds. */
  durationMs: number;
}

/** The per-request values the app's middleware shares with the routes. */
export interface HttpAppVariables extends PolicyVariables {
  /** The request's id: the caller's when well formed, else a fresh UUID. */
  requestId: string;
  /** Who the request acts as, once authenticated. */
  principal: Principal | undefined;
  /**
   * The tenant the request was authorized for: its log line's `tenant`, also in development
   * mode, whose principal is bound to none.
   */
  tenant: string | undefined;
  /**
   * What the request supplied (path parameters, query values, headers, decoded bodies), so
   * service messages quoting it are not echoed. Kept as values: their strings are collected
   * only when a problem is answered (see {@link suppliedStrings}).
   */
  supplied: unknown[];
  /** Whether the service was called: only its messages can quote request input. */
  inService: boolean;
}

/** The Hono environment of the app. */
export interface HttpAppEnv {
  /** What the app's middleware sets on each request's context. */
  Variables: HttpAppVariables;
}

type AppContext = Context<HttpAppEnv>;

/** The scope prefix of the client routes: `{scope}` in DESIGN §6. */
export const SCOPE_PREFIX = '/v1/tenants/:tenant_id/namespaces/:namespace';

// Strings longer than this are never quoted by service messages (they quote
// identifiers), so they need not be remembered for scrubbing.
const SUPPLIED_MAX_CHARS = 512;
// Application JSON is never quoted by the service: not walked for scrubbing.
const APPLICATION_JSON_KEYS = new Set(['data', 'output', 'details']);

/**
 * Adds the short strings of what a request supplied that a service message may quote to `out`:
 * strings supplied as such (path parameters, query and header values) and, inside a decoded
 * command, its identifiers (`*_id` fields: tasks, attempts, leases, sessions, operations), the
 * only values service messages interpolate. A command's other strings (names, labels, keys) are
 * never quoted, and a common word among them ("a", "worker") would otherwise scrub a precise
 * message that merely contains it (review r47h).
 */
function collectStrings(value: unknown, out: string[]): void {
  const stack: [value: unknown, quotable: boolean][] = [[value, true]];
  while (stack.length > 0) {
    const [current, quotable] = stack.pop() as [unknown, boolean];
    if (typeof current === 'string') {
      if (quotable && current.length <= SUPPLIED_MAX_CHARS) out.push(current);
    } else if (Array.isArray(current)) {
      for (const item of current) stack.push([item, false]);
    } else if (typeof current === 'object' && current !== null) {
      for (const [key, item] of Object.entries(current)) {
        if (!APPLICATION_JSON_KEYS.has(key)) stack.push([item, key.endsWith('_id')]);
      }
    }
  }
}

/**
 * The short strings of what a request supplied. Collected when a problem is answered, not when
 * the request is decoded: walking every decoded command of a batch up front was ~3 % of the
 * server's CPU in a bulk submit and ~4 % of its allocations in a drain (bench/README.md), for
 * requests that mostly answer no problem at all.
 */
function suppliedStrings(values: readonly unknown[]): string[] {
  const strings: string[] = [];
  for (const value of values) collectStrings(value, strings);
  return strings;
}

function supply(c: AppContext, ...values: unknown[]): void {
  c.get('supplied').push(...values);
}

function invalidPathParameter(name: string, problem: string): ContractError {
  return new ContractError('invalid_input', `the path parameter ${name} ${problem}`, {
    reason: 'path_parameter',
  });
}

// `ignoreBOM` keeps a leading U+FEFF for the text rule to refuse: stripped, header bytes
// EF BB BF 6B named the task of key "k", while the same key in a body is refused (review r52b).
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
// biome-ignore lint/suspicious/noControlCharactersInRegex: the range is ASCII as a whole
const ASCII = /^[\u0000-\u007f]*$/;

/**
 * A header's value as text. Node hands header bytes over one per character (latin1), while
 * clients such as curl send UTF-8: decoded here, a key sent as `Idempotency-Key` names the same
 * task as the same key sent in a body. Bytes that are not UTF-8 are refused, not guessed at.
 */
function headerText(c: AppContext, name: string): string | undefined {
  if (headerLines(c, name) > 1) {
    throw new ContractError('invalid_input', `the ${name} header must be sent once`, {
      reason: 'repeated_header',
    });
  }
  const raw = c.req.header(name);
  if (raw === undefined || ASCII.test(raw)) return raw;
  try {
    return STRICT_UTF8.decode(Uint8Array.from(raw, (char) => char.charCodeAt(0)));
  } catch {
    throw new ContractError('invalid_input', `the ${name} header is not UTF-8 text`, {
      reason: 'invalid_text',
    });
  }
}

/**
 * How many lines of a header the request carried, where the runtime says (Node's
 * `headersDistinct`, which @hono/node-server passes as `env.incoming`); 1 elsewhere. The
 * `Request` it builds joins repeated lines with ", ", which would make two keys one new key.
 */
function headerLines(c: AppContext, name: string): number {
  const env = c.env as
    | { incoming?: { headersDistinct?: Record<string, string[] | undefined> } }
    | undefined;
  return env?.incoming?.headersDistinct?.[name.toLowerCase()]?.length ?? 1;
}

/**
 * A path parameter checked with the text rule of its field. The router decodes a parameter
 * leniently (an escape that is not UTF-8 stays as typed), so `/tenants/%E0%A4` and
 * `/tenants/%25E0%25A4` would name one tenant: a path whose escapes are not UTF-8 is refused, as
 * such a query is.
 */
function pathText(c: AppContext, name: PathParameter): string {
  if (c.req.url.includes('%')) refuseMalformedEscapes(c.req.url);
  const value = c.req.param(name) ?? '';
  supply(c, value);
  const problem = textProblem(value, PATH_PARAMETER_MAX_BYTES[name]);
  if (problem !== undefined) throw invalidPathParameter(name, problem);
  return value;
}

function refuseMalformedEscapes(url: string): void {
  for (const segment of new URL(url).pathname.split('/')) {
    try {
      decodeURIComponent(segment);
    } catch {
      throw new ContractError('invalid_input', 'the path is not percent-encoded UTF-8 text', {
        reason: 'path_parameter',
      });
    }
  }
}

/** The `{scope}` of a client route's path. */
function pathScope(c: AppContext): Scope {
  return {
    tenant_id: pathText(c, 'tenant_id'),
    namespace: pathText(c, 'namespace'),
  };
}

function principalOf(c: AppContext): Principal {
  const principal = c.get('principal');
  // The authentication middleware runs before every /v1 route.
  if (principal === undefined) throw genericError('unauthorized');
  return principal;
}

/**
 * The role the matched route's declared policy requires (policy.ts). The
 * startup check guarantees every route declares one; a keyed route reaching
 * here without one is a bug, refused rather than let through.
 */
function routeRole(c: AppContext): Role {
  const access = c.get('access');
  if (access === undefined || access === 'public') {
    throw new Error(`the route ${c.req.method} ${c.req.path} declares no role to authorize`);
  }
  return access;
}

/**
 * The role and binding checks of a route (403), made once its path, query and
 * body have been decoded (DESIGN §4.1's order). The role is the one the route's
 * policy declares; `path` names where the scope came from when a body supplied it.
 */
function authorize(c: AppContext, scope: Scope, path?: string): void {
  const principal = principalOf(c);
  requireRole(principal, routeRole(c));
  requireScope(principal, scope, path);
  c.set('tenant', scope.tenant_id);
}

/**
 * The per-item scope check of a batch route: `requireScope`, and the request's log tenant while
 * every authorized item names one tenant (in development mode the principal names none; a batch
 * mixing tenants logs none, as its principal's).
 */
function itemScopeCheck(c: AppContext): (scope: Scope, path: string) => void {
  const principal = principalOf(c);
  const tenants = new Set<string>();
  return (scope, path) => {
    requireScope(principal, scope, path);
    tenants.add(scope.tenant_id);
    c.set('tenant', tenants.size === 1 ? scope.tenant_id : undefined);
  };
}

/**
 * `target`, for a request that passed every check. From here on an error's
 * message may quote the request (services name the ids they could not
 * find), so `onError` scrubs what the request supplied.
 */
function entered<T>(c: AppContext, target: T): T {
  c.set('inService', true);
  return target;
}

/** Rejects a query string on routes that take no parameters. */
function noQuery(c: AppContext): void {
  singleValues(new URL(c.req.url), []);
}

function queryOf(c: AppContext, allowed: readonly string[]): Map<string, string> {
  const values = singleValues(new URL(c.req.url), allowed);
  supply(c, ...values.values());
  return values;
}

/** Reads a body that the route requires: empty is `invalid_input`. */
async function requiredBody(c: AppContext, limit: number): Promise<Uint8Array> {
  const bytes = await readBody(c.req.raw, limit);
  if (bytes.byteLength === 0) {
    throw new ContractError('invalid_input', 'the request body must be a JSON document', {
      reason: 'missing_body',
    });
  }
  return bytes;
}

/** Reads a body the route allows but does not need: when sent it must be a JSON object. */
async function optionalBody(c: AppContext): Promise<unknown> {
  const bytes = await readBody(c.req.raw, CONTROL_REQUEST_MAX_BYTES);
  if (bytes.byteLength === 0) return undefined;
  return decodeStrictJson(bytes, {
    maxBytes: CONTROL_REQUEST_MAX_BYTES,
    maxDepth: COMMAND_MAX_DEPTH,
  });
}

function scopeMismatch(path: string): ContractError {
  return new ContractError('invalid_input', `${path} must equal the scope of the path`, {
    reason: 'scope_mismatch',
    path,
  });
}

/** A submit's task must be in the scope of the path it was posted to. */
function checkSubmitScope(command: SubmitCommand, scope: Scope, at: string): void {
  if (command.input.tenant_id !== scope.tenant_id) throw scopeMismatch(`${at}.input.tenant_id`);
  if (command.input.namespace !== scope.namespace) throw scopeMismatch(`${at}.input.namespace`);
}

/**
 * Runs the items of a batch that passed decoding and authorization through
 * `run` in one call, and answers every item in request order: its reply, or
 * its own problem document carrying the request's id, as a whole request's
 * does (an item's backend failure goes to `logFailure`, as its document names
 * it only as `unavailable`).
 */
async function answerBatch<C, R, O>(
  items: readonly DecodedItem<C>[],
  check: (command: C, index: number) => void,
  run: (commands: C[]) => Promise<ItemResult<R>[]>,
  reply: (value: R) => O,
  logFailure: (error: ContractError) => void,
  requestId: string,
): Promise<(O | Problem)[]> {
  const answers: (O | Problem | undefined)[] = new Array(items.length);
  const accepted: C[] = [];
  const positions: number[] = [];
  items.forEach((item, index) => {
    if (!item.ok) {
      answers[index] = problemOf(item.error, { requestId });
      return;
    }
    try {
      check(item.value, index);
      accepted.push(item.value);
      positions.push(index);
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
      answers[index] = problemOf(error, { requestId, supplied: suppliedStrings([item.value]) });
    }
  });
  if (accepted.length > 0) {
    const results = await run(accepted);
    results.forEach((result, k) => {
      const index = positions[k] as number;
      if (result.ok) {
        answers[index] = reply(result.value);
        return;
      }
      if (wrapsBackendFailure(result.error)) logFailure(result.error);
      const problem = problemOf(result.error, {
        requestId,
        supplied: suppliedStrings([accepted[k]]),
      });
      // The service names a path within the command it was given (`$.input.timeout_ms`); in
      // this body that command is `$.commands[index]`, as the adapter's own item checks say.
      if (problem.path?.startsWith('$'))
        problem.path = `$.commands[${index}]${problem.path.slice(1)}`;
      answers[index] = problem;
    });
  }
  return answers.map(
    (answer) =>
      answer ??
      problemOf(new ContractError('unavailable', 'the item was not answered'), { requestId }),
  );
}

/** Whether `authority` (a Host header, `host[:port]`) names loopback; absent counts as loopback. */
function isLoopbackAuthority(authority: string | undefined): boolean {
  if (authority === undefined) return true;
  const host = authority.replace(/:\d{1,5}$/, '');
  return isLoopbackHost(host);
}

/** The `host[:port]` of a request URL. */
function hostOf(url: string): string {
  return new URL(url).host;
}

/** The answer to a request the authenticator refused, by its reason. */
const UNAUTHENTICATED = {
  missing: {
    message: 'an API key is required: send Authorization: Bearer <key>',
    reason: 'missing_credentials',
  },
  scheme: {
    message:
      'the Authorization header must use the Bearer scheme: send Authorization: Bearer <key>',
    reason: 'unsupported_scheme',
  },
  invalid: { message: 'the API key is not valid', reason: 'invalid_credentials' },
} as const;

/** The route pattern that answered, for logs: never the raw path. */
function routePattern(c: AppContext): string | null {
  const routes = matchedRoutes(c).filter((route) => route.method !== 'ALL');
  return routes.length === 0 ? null : (routes[routes.length - 1]?.path ?? null);
}

function problemResponse(c: AppContext, problem: Problem): Response {
  if (problem.code === 'unauthorized') {
    // RFC 6750 §3.1: a presented bearer token that is refused is `invalid_token`; a request that
    // presented none, or credentials of another scheme, gets the challenge alone.
    c.header(
      'WWW-Authenticate',
      problem.reason === 'invalid_credentials'
        ? 'Bearer realm="ledgence", error="invalid_token"'
        : 'Bearer realm="ledgence"',
    );
  } else if (problem.reason === 'content_encoding') {
    // RFC 9110 §15.5.16: name the content codings that would have been accepted.
    c.header('Accept-Encoding', 'identity');
  }
  return c.body(JSON.stringify(problem), problem.status as ContentfulStatusCode, {
    'Content-Type': PROBLEM_CONTENT_TYPE,
  });
}

/**
 * Builds the Ledgence HTTP app over a task service.
 *
 * @example
 * ```ts
 * const app = createHttpApp({ service, auth: { keys: [] } });
 * const res = await app.request('/healthz');
 * ```
 */
export function createHttpApp(options: HttpAppOptions): Hono<HttpAppEnv> {
  // Taken apart here, and `options` referenced by no closure: it holds the API keys' text
  // (`auth.keys`), which must not stay reachable once hashed (DESIGN §6).
  const { service, completions, retention, health, metrics, onResponse, remoteAddress } = options;
  const authenticator = createAuthenticator(options.auth);
  const longPollMaxMs = options.longPollMaxMs ?? LONG_POLL_WAIT_MS;
  const logger = options.logger ?? pino({ level: 'silent' });
  const requestIdHeader = options.requestIdHeader ?? REQUEST_ID_HEADER;
  const app = new Hono<HttpAppEnv>();

  /** The task service, for a request that passed every check. */
  const svc = (c: AppContext): TaskService => entered(c, service);

  // ---- Edge: request id, one log line, errors -----------------------------------

  // A failing lookup must not fail the request it only describes.
  const peerOf = (c: AppContext): string | null => {
    try {
      return remoteAddress?.(c) ?? null;
    } catch {
      return null;
    }
  };

  app.use('*', async (c, next) => {
    const started = performance.now();
    // Read first: a client that disconnects before the reply leaves a socket with no address.
    const peer = peerOf(c);
    const requestId = acceptedRequestId(c.req.header(requestIdHeader));
    c.set('requestId', requestId);
    c.set('supplied', []);
    c.set('inService', false);
    c.set('principal', undefined);
    c.set('tenant', undefined);
    c.set('access', undefined);
    c.header(requestIdHeader, requestId);
    await next();
    c.res.headers.set(requestIdHeader, requestId);
    const durationMs = performance.now() - started;
    const route = routePattern(c);
    logger.info(
      {
        request_id: requestId,
        method: c.req.method,
        route,
        status: c.res.status,
        duration_ms: Math.round(durationMs * 1000) / 1000,
        tenant: c.get('tenant') ?? c.get('principal')?.tenant ?? null,
        remote_address: peer,
      },
      'request',
    );
    if (onResponse !== undefined) {
      try {
        onResponse({ route, method: c.req.method, status: c.res.status, durationMs });
      } catch (error) {
        logger.warn({ request_id: requestId, err: error }, 'onResponse hook failed');
      }
    }
  });

  /** Logs a failure whose text is for the operator: the client's answer says only "retry". */
  const logFailure = (c: AppContext) => (error: unknown) =>
    logger.error({ request_id: c.get('requestId'), err: error }, 'request failed');

  app.onError((error, c) => {
    const requestId = c.get('requestId');
    if (error instanceof ContractError) {
      if (wrapsBackendFailure(error)) logFailure(c)(error);
      // Decoder, query and path messages name paths and rules only; the
      // service's messages may quote identifiers, so those are scrubbed.
      const supplied = c.get('inService') ? suppliedStrings(c.get('supplied')) : undefined;
      return problemResponse(c, problemOf(error, { requestId, supplied }));
    }
    // Not a contract error: a bug or a backend failure. The stack goes to the
    // log; the client learns only that it may retry (no 500 code exists).
    logFailure(c)(error);
    return problemResponse(c, problemOf(genericError('unavailable'), { requestId }));
  });

  app.notFound((c) =>
    problemResponse(
      c,
      // `reason` tells it apart from a missing resource: a client answered so has the wrong base
      // URL (a path prefix) or is newer than this server (the worker SDK says which URL it used).
      problemOf(
        new ContractError('not_found', 'no route matches this method and path', {
          reason: 'no_route',
        }),
        { requestId: c.get('requestId') },
      ),
    ),
  );

  // ---- Development mode: loopback only -------------------------------------------

  // Without keys every request is allowed, which is safe only because the server listens on
  // loopback. A web page whose host name re-resolves to 127.0.0.1 (DNS rebinding) reaches it
  // same-origin anyway, but its requests name that host: only loopback names are served.
  if (authenticator.developmentMode) {
    app.use('*', async (c, next) => {
      if (!isLoopbackAuthority(c.req.header('host')) || !isLoopbackAuthority(hostOf(c.req.url))) {
        throw new ContractError(
          'forbidden',
          'development mode (no API keys configured) serves loopback host names only (localhost, 127.0.0.1, [::1]); configure API keys to serve other hosts',
          { reason: 'host_not_loopback' },
        );
      }
      await next();
    });
  }

  // ---- Authentication of every /v1 route ----------------------------------------

  app.use('/v1/*', async (c, next) => {
    const result = authenticator.authenticate(c.req.header('authorization'));
    if (!result.ok) {
      throw new ContractError('unauthorized', UNAUTHENTICATED[result.reason].message, {
        reason: UNAUTHENTICATED[result.reason].reason,
      });
    }
    c.set('principal', result.principal);
    await next();
  });

  // ---- Client routes ------------------------------------------------------------

  app.post(`${SCOPE_PREFIX}/tasks`, documentRoute('submitTask'), async (c) => {
    const bytes = await requiredBody(c, SUBMISSION_MAX_BYTES);
    const header = headerText(c, 'Idempotency-Key');
    if (header !== undefined) supply(c, header);
    const command = decodeSubmitRequest(bytes, header);
    supply(c, command);
    noQuery(c);
    const scope = pathScope(c);
    checkSubmitScope(command, scope, '$');
    authorize(c, scope);
    const outcome = await svc(c).submit(command);
    if (outcome.created) {
      const location = `/v1/tenants/${encodeURIComponent(scope.tenant_id)}/namespaces/${encodeURIComponent(scope.namespace)}/tasks/${encodeURIComponent(outcome.snapshot.task_id)}`;
      c.header('Location', location);
    }
    return c.json(outcome.snapshot, outcome.created ? 201 : 200);
  });

  app.post(`${SCOPE_PREFIX}/tasks:batch`, documentRoute('submitTaskBatch'), async (c) => {
    const items = decodeSubmitBatch(await requiredBody(c, BATCH_MAX_BYTES));
    noQuery(c);
    const scope = pathScope(c);
    authorize(c, scope);
    const results = await answerBatch(
      items,
      (command, index) => checkSubmitScope(command, scope, `$.commands[${index}]`),
      (commands) => svc(c).submitBatch(commands),
      (outcome) => outcome.snapshot,
      logFailure(c),
      c.get('requestId'),
    );
    return c.json({ results });
  });

  app.get(`${SCOPE_PREFIX}/tasks`, documentRoute('listTasks'), async (c) => {
    const url = new URL(c.req.url);
    supply(c, ...url.searchParams.values());
    const query = parseListQuery(url);
    const scope = pathScope(c);
    authorize(c, scope);
    return c.json(await svc(c).listTasks(scope, query));
  });

  /** The common head of the per-task client routes: scope, task id, role and scope checks. */
  function taskRoute(c: AppContext): { scope: Scope; taskId: string } {
    const scope = pathScope(c);
    const taskId = pathText(c, 'task_id');
    authorize(c, scope);
    return { scope, taskId };
  }

  app.get(`${SCOPE_PREFIX}/tasks/:task_id`, documentRoute('getTaskStatus'), async (c) => {
    noQuery(c);
    const { scope, taskId } = taskRoute(c);
    return c.json(await svc(c).status(scope, taskId));
  });

  app.get(`${SCOPE_PREFIX}/tasks/:task_id/result`, documentRoute('getTaskResult'), async (c) => {
    const query = queryOf(c, ['wait_ms']);
    const waitMs = parseWaitMs(query.get('wait_ms'), longPollMaxMs);
    const { scope, taskId } = taskRoute(c);
    return c.json(await svc(c).result(scope, taskId, { waitMs, signal: c.req.raw.signal }));
  });

  app.get(
    `${SCOPE_PREFIX}/tasks/:task_id/snapshot`,
    documentRoute('getTaskSnapshot'),
    async (c) => {
      noQuery(c);
      const { scope, taskId } = taskRoute(c);
      return c.json(await svc(c).inspect(scope, taskId));
    },
  );

  app.get(
    `${SCOPE_PREFIX}/tasks/:task_id/attempts/:attempt_id`,
    documentRoute('getAttempt'),
    async (c) => {
      noQuery(c);
      const attemptId = pathText(c, 'attempt_id');
      const { scope, taskId } = taskRoute(c);
      return c.json(await svc(c).inspectAttempt(scope, taskId, attemptId));
    },
  );

  app.get(`${SCOPE_PREFIX}/tasks/:task_id/history`, documentRoute('getTaskHistory'), async (c) => {
    const query = queryOf(c, ['after_sequence']);
    const after = parseAfterSequence(query.get('after_sequence'));
    const { scope, taskId } = taskRoute(c);
    return c.json(await svc(c).history(scope, taskId, after));
  });

  app.post(`${SCOPE_PREFIX}/tasks/:task_id/cancel`, documentRoute('cancelTask'), async (c) => {
    const body = await optionalBody(c);
    if (body !== undefined) parseWith(CancelBodySchema, body);
    noQuery(c);
    const { scope, taskId } = taskRoute(c);
    return c.json({ task_state: await svc(c).cancel(scope, taskId) });
  });

  // ---- Completion subscriptions (DESIGN §8), when a completion service is given -----

  if (completions !== undefined) {
    const subscriptions = `${SCOPE_PREFIX}/tasks/:task_id/completion-subscriptions`;

    app.post(subscriptions, documentRoute('subscribeCompletion'), async (c) => {
      const command = decodeCompletionSubscribeCommand(
        await requiredBody(c, COMPLETION_COMMAND_MAX_BYTES),
      );
      supply(c, command);
      noQuery(c);
      const { scope, taskId } = taskRoute(c);
      const outcome = await entered(c, completions).subscribe(scope, taskId, command);
      // No Location header: a subscription has no route of its own; the task's
      // list is where it is read back.
      return c.json(outcome.subscription, outcome.created ? 201 : 200);
    });

    app.get(subscriptions, documentRoute('listCompletionSubscriptions'), async (c) => {
      noQuery(c);
      const { scope, taskId } = taskRoute(c);
      return c.json(await entered(c, completions).list(scope, taskId));
    });

    app.post(
      `${SCOPE_PREFIX}/completion-subscriptions/:subscription_id/redeliver`,
      documentRoute('redeliverCompletion'),
      async (c) => {
        const command = decodeCompletionRetryCommand(
          await requiredBody(c, COMPLETION_COMMAND_MAX_BYTES),
        );
        supply(c, command);
        noQuery(c);
        const scope = pathScope(c);
        const subscriptionId = pathText(c, 'subscription_id');
        authorize(c, scope);
        return c.json(await entered(c, completions).redeliver(scope, subscriptionId, command));
      },
    );
  }

  // ---- Retention (admin), when the retention operations are given ------------------

  if (retention !== undefined) {
    const policy = `${SCOPE_PREFIX}/retention-policy`;

    /** The head of an admin route: the path's scope, for an admin key bound to it. */
    const adminScope = (c: AppContext): Scope => {
      const scope = pathScope(c);
      authorize(c, scope);
      return scope;
    };

    app.get(policy, documentRoute('getRetentionPolicy'), async (c) => {
      noQuery(c);
      const scope = adminScope(c);
      return c.json(await entered(c, retention).retentionPolicy(scope));
    });

    app.put(policy, documentRoute('setRetentionPolicy'), async (c) => {
      const command = decodeSetRetentionPolicyCommand(
        await requiredBody(c, CONTROL_REQUEST_MAX_BYTES),
      );
      supply(c, command);
      noQuery(c);
      const scope = adminScope(c);
      return c.json(await entered(c, retention).setRetentionPolicy(scope, command));
    });

    app.get(`${policy}/preview`, documentRoute('previewRetention'), async (c) => {
      const limit = parseLimit(queryOf(c, ['limit']).get('limit'), MAX_RETENTION_BATCH);
      const scope = adminScope(c);
      return c.json(await entered(c, retention).previewRetention(scope, limit));
    });
  }

  // ---- Worker routes ------------------------------------------------------------

  app.post('/v1/worker/sessions', documentRoute('openSession'), async (c) => {
    const command = decodeOpenSessionCommand(await requiredBody(c, CONTROL_REQUEST_MAX_BYTES));
    supply(c, command);
    noQuery(c);
    authorize(c, command.scope, '$.scope');
    return c.json(await svc(c).openSession(command));
  });

  app.post('/v1/worker/sessions/:session_id/extend', documentRoute('extendSession'), async (c) => {
    const body = await optionalBody(c);
    const parsed = body === undefined ? {} : parseWith(ExtendSessionBodySchema, body);
    supply(c, parsed);
    noQuery(c);
    const sessionId = pathText(c, 'session_id');
    const principal = principalOf(c);
    // The session's scope: named in the body, or the key's only scope, or else the session's own
    // (DESIGN §6: extend takes no body), found within the key's tenant; one the key may not use
    // is answered as missing, as a foreign session is.
    let scope = parsed.scope ?? soleScope(principal);
    if (scope === undefined) {
      requireRole(principal, routeRole(c));
      const found = await svc(c).sessionScope(sessionId, principal.tenant);
      if (found === null || !allowsScope(principal, found)) {
        throw new ContractError('session_not_found', `worker session ${sessionId} was not found`);
      }
      scope = found;
    }
    authorize(c, scope, '$.scope');
    return c.json(await svc(c).extendSession(scope, sessionId));
  });

  app.post('/v1/worker/acquire', documentRoute('acquire'), async (c) => {
    const command = decodeAcquireCommand(await requiredBody(c, DISPATCH_MAX_BYTES));
    supply(c, command);
    const waitMs = parseWaitMs(queryOf(c, ['wait_ms']).get('wait_ms'), longPollMaxMs);
    authorize(c, command.scope, '$.scope');
    return c.json(await svc(c).acquire(command, { waitMs, signal: c.req.raw.signal }));
  });

  app.post('/v1/worker/acquire:batch', documentRoute('acquireBatch'), async (c) => {
    const items = decodeAcquireBatch(await requiredBody(c, BATCH_MAX_BYTES));
    const waitMs = parseWaitMs(queryOf(c, ['wait_ms']).get('wait_ms'), longPollMaxMs);
    requireRole(principalOf(c), routeRole(c));
    const checkScope = itemScopeCheck(c);
    const replies = await answerBatch(
      items,
      (command, index) => checkScope(command.scope, `$.commands[${index}].scope`),
      (commands) => svc(c).acquireBatch(commands, { waitMs, signal: c.req.raw.signal }),
      (reply) => reply,
      logFailure(c),
      c.get('requestId'),
    );
    return c.json({ replies });
  });

  /**
   * The batch routes of a lease owner's commands (renew, settle): the route's role for the
   * request, then each item's owner scope on its own (a foreign item is that item's 403).
   */
  function ownerBatch<C extends { owner: LeaseOwner }, R>(
    c: AppContext,
    items: readonly DecodedItem<C>[],
    run: (commands: C[]) => Promise<ItemResult<R>[]>,
  ): Promise<(R | Problem)[]> {
    noQuery(c);
    requireRole(principalOf(c), routeRole(c));
    const checkScope = itemScopeCheck(c);
    return answerBatch(
      items,
      (command, index) => checkScope(command.owner.scope, `$.commands[${index}].owner.scope`),
      run,
      (value) => value,
      logFailure(c),
      c.get('requestId'),
    );
  }

  app.post('/v1/worker/renew', documentRoute('renew'), async (c) => {
    const command = decodeRenewCommand(await requiredBody(c, CONTROL_REQUEST_MAX_BYTES));
    supply(c, command);
    noQuery(c);
    authorize(c, command.owner.scope, '$.owner.scope');
    return c.json(await svc(c).renew(command));
  });

  app.post('/v1/worker/renew:batch', documentRoute('renewBatch'), async (c) => {
    const items = decodeRenewBatch(await requiredBody(c, BATCH_MAX_BYTES));
    return c.json({
      results: await ownerBatch(c, items, (commands) => svc(c).renewBatch(commands)),
    });
  });

  app.post('/v1/worker/settle', documentRoute('settle'), async (c) => {
    const command = decodeSettleCommand(await requiredBody(c, SETTLEMENT_MAX_BYTES));
    supply(c, command);
    noQuery(c);
    authorize(c, command.owner.scope, '$.owner.scope');
    return c.json(await svc(c).settle(command));
  });

  app.post('/v1/worker/settle:batch', documentRoute('settleBatch'), async (c) => {
    const items = decodeSettleBatch(await requiredBody(c, BATCH_MAX_BYTES));
    return c.json({
      results: await ownerBatch(c, items, (commands) => svc(c).settleBatch(commands)),
    });
  });

  app.post('/v1/worker/quiescence', documentRoute('confirmQuiescence'), async (c) => {
    const owner = decodeLeaseOwner(await requiredBody(c, CONTROL_REQUEST_MAX_BYTES));
    supply(c, owner);
    noQuery(c);
    authorize(c, owner.scope, '$.scope');
    return c.json({ task_state: await svc(c).confirmQuiescence(owner) });
  });

  // ---- Operations: no authentication ---------------------------------------------

  app.get('/healthz', documentRoute('health'), (c) => c.json({ status: 'ok' }));

  app.get('/readyz', documentRoute('ready'), async (c) => {
    let readiness: Readiness;
    try {
      readiness = health === undefined ? true : await health.ready();
    } catch (error) {
      logger.warn({ request_id: c.get('requestId'), err: error }, 'readiness check failed');
      readiness = false;
    }
    const ok = typeof readiness === 'boolean' ? readiness : readiness.ok;
    if (ok) return c.json({ status: 'ready' });
    const detail = typeof readiness === 'object' ? readiness.detail : undefined;
    throw new ContractError('unavailable', detail ?? 'the server is not ready', {
      reason: 'not_ready',
    });
  });

  app.get('/metrics', documentRoute('metrics'), async (c) => {
    if (metrics === undefined) {
      throw new ContractError('not_found', 'metrics are not configured on this server');
    }
    const text = await metrics.render();
    return c.body(text, 200, { 'Content-Type': metrics.contentType });
  });

  let document: Promise<unknown> | undefined;
  app.get('/openapi.json', documentRoute('openapi'), async (c) => {
    document ??= createOpenApiDocument(app).catch((error: unknown) => {
      document = undefined;
      throw error;
    });
    return c.json(await document);
  });

  // Last, over everything mounted above: a route without a declared policy
  // fails here, at start, rather than serving requests nobody authorizes.
  checkRoutePolicies(app.routes);
  return app;
}
