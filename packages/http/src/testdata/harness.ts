/**
 * Test harness of the HTTP app: an app over the in-memory store (tasks,
 * completion subscriptions and retention), keys for every role, a request
 * helper, service wrappers that count calls, and a full dump of what the
 * store holds for some scopes (to prove that a rejected request changed
 * nothing).
 */
import type {
  AcquireReply,
  Assignment,
  CompletionSubscribeCommand,
  CompletionSubscription,
  Scope,
  SubmitCommand,
  TaskPage,
  TaskSnapshot,
  WorkerSession,
} from '@ledgence/contracts';
import {
  type CompletionService,
  createCompletionService,
  createTaskService,
  type DeliveryNext,
  type TaskService,
} from '@ledgence/core';
import { createMemoryTaskStore, type MemoryTaskStore } from '@ledgence/core/testing';
import type { Hono } from 'hono';
import {
  type ApiKeyConfig,
  createHttpApp,
  type HttpAppEnv,
  type HttpAppOptions,
} from '../index.js';

/** Keys of tenant `acme`: one per role, one bound to namespace `prod` only. */
export const KEYS = {
  client: 'key-client-acme',
  worker: 'key-worker-acme',
  admin: 'key-admin-acme',
  both: 'key-both-acme',
  prodClient: 'key-client-acme-prod',
  prodWorker: 'key-worker-acme-prod',
  other: 'key-both-globex',
} as const;

/** The configured keys behind {@link KEYS}. */
export const KEY_CONFIG: ApiKeyConfig[] = [
  { key: KEYS.client, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
  { key: KEYS.worker, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
  { key: KEYS.admin, tenant: 'acme', namespaces: ['*'], roles: ['admin'] },
  { key: KEYS.both, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  { key: KEYS.prodClient, tenant: 'acme', namespaces: ['prod'], roles: ['client'] },
  { key: KEYS.prodWorker, tenant: 'acme', namespaces: ['prod'], roles: ['worker'] },
  { key: KEYS.other, tenant: 'globex', namespaces: ['*'], roles: ['client', 'worker'] },
];

/** The callback destination aliases the harness's completion service knows. */
export const DESTINATIONS: ReadonlySet<string> = new Set(['billing', 'audit']);

export const ACME_PROD: Scope = { tenant_id: 'acme', namespace: 'prod' };
export const ACME_DEV: Scope = { tenant_id: 'acme', namespace: 'dev' };
export const GLOBEX_PROD: Scope = { tenant_id: 'globex', namespace: 'prod' };

/** The path prefix of `scope`'s client routes. */
export function scopePath(scope: Scope): string {
  return `/v1/tenants/${encodeURIComponent(scope.tenant_id)}/namespaces/${encodeURIComponent(scope.namespace)}`;
}

/** Options of one request made with {@link Harness.call}. */
export interface CallOptions {
  method?: string;
  /** A key to send as `Authorization: Bearer`. */
  key?: string;
  /** A value to send as JSON (with `Content-Type: application/json`). */
  json?: unknown;
  /** Raw body bytes or text, sent with whatever `headers` say. */
  body?: string | Uint8Array | ReadableStream<Uint8Array>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/** Counts of service calls, by method. */
export type CallCounts = Record<string, number>;

/**
 * A wrapper of `target` counting every method call into `calls` under
 * `prefix + name`, to prove a request never reached it.
 */
export function countCalls<T extends object>(target: T, calls: CallCounts, prefix = ''): T {
  return new Proxy(target, {
    get(object, property, receiver) {
      const value: unknown = Reflect.get(object, property, receiver);
      if (typeof value !== 'function' || typeof property !== 'string') return value;
      return (...args: unknown[]) => {
        const name = `${prefix}${property}`;
        calls[name] = (calls[name] ?? 0) + 1;
        return (value as (...a: unknown[]) => unknown).apply(object, args);
      };
    },
  });
}

/** What a test gets: the app, the store, the services and helpers. */
export interface Harness {
  app: Hono<HttpAppEnv>;
  /** The store; also the app's retention operations. */
  store: MemoryTaskStore;
  service: TaskService;
  /** The completion service over {@link store} with {@link DESTINATIONS}. */
  completions: CompletionService;
  /**
   * Calls that reached the services: task service methods by name,
   * `completions.<name>` and `retention.<name>`.
   */
  calls: CallCounts;
  call(path: string, options?: CallOptions): Promise<Response>;
  /** Everything the store holds for `scopes`, as comparable JSON. */
  dump(scopes: readonly Scope[]): Promise<string>;
}

/**
 * Builds a harness; `options` override the app options (keys default to
 * {@link KEY_CONFIG}; completions and retention are mounted unless set to
 * `undefined`).
 */
export function createHarness(
  options: Partial<Omit<HttpAppOptions, 'service'>> & {
    rescanIntervalMs?: number;
    /** The store's clock (default `Date.now`), for tests that need exact store times. */
    now?: () => number;
  } = {},
): Harness {
  const { now, ...appOptions } = options;
  const store = createMemoryTaskStore(now === undefined ? {} : { now });
  const base = createTaskService({
    store,
    longPollMaxMs: options.longPollMaxMs ?? 5_000,
    rescanIntervalMs: options.rescanIntervalMs ?? 10,
  });
  const completions = createCompletionService({ store, destinations: DESTINATIONS });
  const calls: CallCounts = {};
  const app = createHttpApp({
    auth: { keys: KEY_CONFIG },
    completions: countCalls(completions, calls, 'completions.'),
    retention: countCalls(store, calls, 'retention.'),
    ...appOptions,
    service: countCalls(base, calls),
  });
  async function call(path: string, init: CallOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { ...init.headers };
    if (init.key !== undefined) headers.authorization = `Bearer ${init.key}`;
    let body: CallOptions['body'];
    if (init.json !== undefined) {
      headers['content-type'] ??= 'application/json';
      body = JSON.stringify(init.json);
    } else body = init.body;
    const request: RequestInit & { duplex?: 'half' } = {
      method: init.method ?? (body === undefined ? 'GET' : 'POST'),
      headers,
    };
    if (body !== undefined) request.body = body as NonNullable<RequestInit['body']>;
    if (body instanceof ReadableStream) request.duplex = 'half';
    if (init.signal !== undefined) request.signal = init.signal;
    return app.request(path, request);
  }
  async function dump(scopes: readonly Scope[]): Promise<string> {
    const out: unknown[] = [];
    for (const scope of scopes) {
      let cursor: string | undefined;
      do {
        const page: TaskPage = await base.listTasks(scope, {
          filters: {},
          limit: 500,
          ...(cursor === undefined ? {} : { cursor }),
        });
        for (const status of page.tasks) {
          const snapshot = await base.inspect(scope, status.task_id);
          const history = await base.history(scope, status.task_id, 0);
          const result = await base.result(scope, status.task_id);
          const subscriptions = await completions.list(scope, status.task_id);
          out.push({ status, snapshot, history, result, subscriptions });
        }
        cursor = page.next_cursor;
      } while (cursor !== undefined);
      out.push({ scope, retention: await store.retentionPolicy(scope) });
    }
    return JSON.stringify(out);
  }
  return { app, store, service: base, completions, calls, call, dump };
}

/** A submit command in `scope` (queue `email`, program `send`). */
export function submitBody(
  scope: Scope,
  key: string,
  extra: Record<string, unknown> = {},
): SubmitCommand {
  return {
    idempotency_key: key,
    input: {
      tenant_id: scope.tenant_id,
      namespace: scope.namespace,
      queue: 'email',
      program: { name: 'send' },
      data: { n: 1 },
      ...extra,
    },
  } as SubmitCommand;
}

/** Submits one task over HTTP and returns its snapshot. */
export async function submitTask(
  h: Harness,
  scope: Scope = ACME_PROD,
  key: string = KEYS.both,
  extra: Record<string, unknown> = {},
): Promise<TaskSnapshot> {
  const res = await h.call(`${scopePath(scope)}/tasks`, {
    key,
    json: submitBody(scope, `k-${Math.random().toString(36).slice(2)}`, extra),
  });
  if (res.status !== 201) throw new Error(`submit answered ${res.status}: ${await res.text()}`);
  return (await res.json()) as TaskSnapshot;
}

/** Opens a session on queue `email` over HTTP. */
export async function openSession(
  h: Harness,
  scope: Scope = ACME_PROD,
  key: string = KEYS.both,
  concurrency = 2,
): Promise<WorkerSession> {
  const res = await h.call('/v1/worker/sessions', {
    key,
    json: { scope, queue: 'email', concurrency },
  });
  if (res.status !== 200)
    throw new Error(`open session answered ${res.status}: ${await res.text()}`);
  return (await res.json()) as WorkerSession;
}

/** The acquire command of `session`'s slot `consumer` with `sequence`. */
export function acquireBody(session: WorkerSession, consumer: number, sequence: number) {
  return {
    scope: session.scope,
    queue: session.queue,
    worker_session_id: session.id,
    consumer_id: consumer,
    sequence,
  };
}

/** Submits a task, opens a session and acquires the task over HTTP. */
export async function assignTask(
  h: Harness,
  scope: Scope = ACME_PROD,
  key: string = KEYS.both,
): Promise<{ task: TaskSnapshot; session: WorkerSession; assignment: Assignment }> {
  const task = await submitTask(h, scope, key);
  const session = await openSession(h, scope, key);
  const res = await h.call('/v1/worker/acquire', { key, json: acquireBody(session, 0, 1) });
  const reply = (await res.json()) as AcquireReply;
  if (reply.disposition !== 'assigned') throw new Error(`acquire answered ${reply.disposition}`);
  return { task, session, assignment: reply.assignment };
}

/** A settle command reporting success for `assignment`. */
export function settleBody(
  assignment: Assignment,
  operationId = 'op-1',
  quiescence: 'confirmed' | 'unconfirmed' = 'confirmed',
) {
  const owner = assignment.lease.owner;
  return {
    owner,
    operation_id: operationId,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: { ok: true } },
      },
    },
    quiescence,
    processing_trace: null,
  };
}

/** The completion subscriptions path of `taskId` in `scope`. */
export function subscriptionsPath(scope: Scope, taskId: string): string {
  return `${scopePath(scope)}/tasks/${encodeURIComponent(taskId)}/completion-subscriptions`;
}

/** The redeliver path of subscription `id` in `scope`. */
export function redeliverPath(scope: Scope, id: string): string {
  return `${scopePath(scope)}/completion-subscriptions/${encodeURIComponent(id)}/redeliver`;
}

/** The retention policy path of `scope` (admin). */
export function policyPath(scope: Scope): string {
  return `${scopePath(scope)}/retention-policy`;
}

/** A subscribe command for `key` (destination `billing` unless given). */
export function subscribeBody(key: string, destination = 'billing'): CompletionSubscribeCommand {
  return { subscription_key: key, destination };
}

/**
 * Plays the callback sender once: leases every due delivery and reports
 * `next` for each (a delivery becomes due when its task is terminal).
 * Returns the subscriptions as they are afterwards, by id.
 */
export async function deliverDue(
  h: Harness,
  next: DeliveryNext,
): Promise<Map<string, CompletionSubscription>> {
  const leases = await h.store.leaseDeliveries(100, 30_000);
  const out = new Map<string, CompletionSubscription>();
  for (const lease of leases) {
    await h.store.reportDelivery({
      scope: lease.scope,
      subscription_id: lease.subscription_id,
      generation: lease.generation,
      attempt: lease.attempt,
      next,
      ...(next.state === 'delivered' ? { status_code: 204 } : { status_code: 500 }),
    });
    const list = await h.completions.list(lease.scope, lease.task_id);
    for (const subscription of list) out.set(subscription.id, subscription);
  }
  return out;
}
