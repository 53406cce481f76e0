/**
 * @module @ledgence/http
 *
 * The HTTP adapter of Ledgence (DESIGN §6): a Hono app factory serving every
 * client and worker route — batch routes included — over a `TaskService`,
 * completion subscriptions over a `CompletionService` and the admin retention
 * routes over a store's retention operations (each mounted when given),
 * with API-key authentication bound to tenant, namespaces and roles (only key
 * hashes kept; development mode when no keys are configured), strict decoding
 * through `@ledgence/contracts` with body limits enforced while reading,
 * long polls that end without consuming anything when the client goes away,
 * RFC 9457 problem+json errors that never echo rejected input, request ids,
 * one JSON log line per request, `/healthz`, `/readyz`, `/metrics` and an
 * OpenAPI 3.1 document at `/openapi.json`.
 *
 * @example
 * ```ts
 * import { createTaskService } from '@ledgence/core';
 * import { createMemoryTaskStore } from '@ledgence/core/testing';
 * import { createHttpApp } from '@ledgence/http';
 *
 * const service = createTaskService({ store: createMemoryTaskStore() });
 * const app = createHttpApp({
 *   service,
 *   auth: { keys: [{ key: 'k_live_1', tenant: 'acme', namespaces: ['*'], roles: ['client'] }] },
 * });
 * const res = await app.request('/v1/tenants/acme/namespaces/prod/tasks', {
 *   method: 'POST',
 *   headers: { authorization: 'Bearer k_live_1', 'content-type': 'application/json' },
 *   body: JSON.stringify({
 *     idempotency_key: 'order-42',
 *     input: { tenant_id: 'acme', namespace: 'prod', queue: 'email',
 *              program: { name: 'send-email' }, data: { to: 'ada@example.com' } },
 *   }),
 * });
 * console.log(res.status, (await res.json()).state); // → 201 queued
 * ```
 */
export {
  createHttpApp,
  type HealthOptions,
  type HttpAppEnv,
  type HttpAppOptions,
  type HttpAppVariables,
  type HttpResponseInfo,
  type MetricsOptions,
  type Readiness,
  type RetentionAdminOptions,
  SCOPE_PREFIX,
} from './app.js';
export {
  type ApiKeyConfig,
  type ApiKeyProblem,
  type AuthOptions,
  apiKeyProblems,
  isLoopbackHost,
  type Principal,
  ROLES,
  type Role,
} from './auth.js';
export { type ExtendSessionBody, ExtendSessionBodySchema } from './bodies.js';
export { isJsonContentType, readBody } from './body.js';
export { createOpenApiDocument } from './openapi.js';
export type { PolicyVariables, RouteAccess } from './policy.js';
export { PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE, problemOf } from './problem.js';
export { acceptedRequestId } from './request-id.js';
