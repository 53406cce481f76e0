import { createTaskService } from '@ledgence/core';
import { createMemoryTaskStore } from '@ledgence/core/testing';
import { expect, it } from 'vitest';
import * as http from './index.js';

it('runs the module example', async () => {
  const service = createTaskService({ store: createMemoryTaskStore() });
  const app = http.createHttpApp({
    service,
    auth: { keys: [{ key: 'k_live_1', tenant: 'acme', namespaces: ['*'], roles: ['client'] }] },
  });
  const res = await app.request('/v1/tenants/acme/namespaces/prod/tasks', {
    method: 'POST',
    headers: { authorization: 'Bearer k_live_1', 'content-type': 'application/json' },
    body: JSON.stringify({
      idempotency_key: 'order-42',
      input: {
        tenant_id: 'acme',
        namespace: 'prod',
        queue: 'email',
        program: { name: 'send-email' },
        data: { to: 'ada@example.com' },
      },
    }),
  });
  expect(res.status).toBe(201);
  expect(((await res.json()) as { state: string }).state).toBe('queued');
});

it('exports exactly the public surface', () => {
  expect(Object.keys(http).sort()).toEqual([
    'ExtendSessionBodySchema',
    'PROBLEM_CONTENT_TYPE',
    'PROBLEM_TYPE_BASE',
    'ROLES',
    'SCOPE_PREFIX',
    'acceptedRequestId',
    'apiKeyProblems',
    'createHttpApp',
    'createOpenApiDocument',
    'isJsonContentType',
    'isLoopbackHost',
    'problemOf',
    'readBody',
  ]);
});
