/**
 * Test harness of the HTTP app: an app over the in-memory store, keys for
 * every role, a request helper, a service wrapper that counts calls, and a
 * full dump of what the store holds for some scopes (to prove that a
 * rejected request changed nothing).
 */
import type {
  AcquireReply,
  Assignment,
  Scope,
  SubmitCommand,
  TaskPage,
  TaskSnapshot,
  WorkerSession,
} from '@ledgence/contracts';
import { createTaskService, type TaskService } from '@ledgence/core';
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

/** A service wrapper counting every call, to prove a request never reached it. */
export function countingService(service: TaskService): { service: TaskService; calls: CallCounts } {
  const calls: CallCounts = {};
  const wrapped = new Proxy(service, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver);
      if (typeof value !== 'function' || typeof property !== 'string') return value;
      return (...args: unknown[]) => {
        calls[property] = (calls[property] ?? 0) + 1;
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { service: wrapped, calls };
}

/** What a test gets: the app, the store, the service and helpers. */
export interface Harness {
  app: Hono<HttpAppEnv>;
  store: MemoryTaskStore;
  service: TaskService;
  calls: CallCounts;
  call(path: string, options?: CallOptions): Promise<Response>;
  /** Everything the store holds for `scopes`, as comparable JSON. */
  dump(scopes: readonly Scope[]): Promise<string>;
}

/** Builds a harness; `options` override the app options (keys default to {@link KEY_CONFIG}). */
export function createHarness(
  options: Partial<Omit<HttpAppOptions, 'service'>> & { rescanIntervalMs?: number } = {},
): Harness {
  const store = createMemoryTaskStore();
  const base = createTaskService({
    store,
    longPollMaxMs: options.longPollMaxMs ?? 5_000,
    rescanIntervalMs: options.rescanIntervalMs ?? 10,
  });
  const { service, calls } = countingService(base);
  const app = createHttpApp({ auth: { keys: KEY_CONFIG }, ...options, service });
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
          out.push({ status, snapshot, history, result });
        }
        cursor = page.next_cursor;
      } while (cursor !== undefined);
    }
    return JSON.stringify(out);
  }
  return { app, store, service: base, calls, call, dump };
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
