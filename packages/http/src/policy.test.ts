import { Hono } from 'hono';
import { describe, expect, it } from 'vitest';
import { ACCESS_EXTENSION } from './openapi.js';
import { checkRoutePolicies, policyOf, type RouteAccess, withPolicy } from './policy.js';
import { createHarness, KEYS, scopePath } from './testdata/harness.js';

const pass = async (_c: unknown, next: () => Promise<void>) => next();

describe('checkRoutePolicies', () => {
  it('accepts routes that declare exactly one fitting policy, and skips app.use', () => {
    const app = new Hono();
    app.use('*', pass);
    app.get('/healthz', withPolicy('public'), (c) => c.text('ok'));
    app.post('/v1/things', withPolicy('client'), (c) => c.text('ok'));
    expect(() => checkRoutePolicies(app.routes)).not.toThrow();
  });

  it.each<[string, (app: Hono) => void, RegExp]>([
    [
      'a route without a policy',
      (app) => app.post('/v1/tenants/:tenant_id/export', (c) => c.text('x')),
      /POST \/v1\/tenants\/:tenant_id\/export declares no authorization policy/,
    ],
    [
      'a route with only an unrelated middleware',
      (app) => app.get('/v1/things', pass, (c) => c.text('x')),
      /GET \/v1\/things declares no authorization policy/,
    ],
    [
      'a public route under /v1/',
      (app) => app.get('/v1/open', withPolicy('public'), (c) => c.text('x')),
      /GET \/v1\/open is public but sits under \/v1\//,
    ],
    [
      'a keyed route outside /v1/',
      (app) => app.get('/admin', withPolicy('admin'), (c) => c.text('x')),
      /GET \/admin needs the admin role but is outside \/v1\//,
    ],
    [
      'a route with two policies',
      (app) => app.put('/v1/x', withPolicy('client'), withPolicy('admin'), (c) => c.text('x')),
      /PUT \/v1\/x declares 2 policies/,
    ],
  ])('rejects %s, naming the route', (_name, register, message) => {
    const app = new Hono();
    app.get('/healthz', withPolicy('public'), (c) => c.text('ok'));
    register(app);
    expect(() => checkRoutePolicies(app.routes)).toThrow(message);
  });

  it('keeps the annotations of the middleware it stands in for', () => {
    const tag = Symbol('doc');
    const annotated = Object.assign(pass, { [tag]: { spec: 1 } });
    const middleware = withPolicy('worker', annotated);
    expect((middleware as unknown as Record<symbol, unknown>)[tag]).toEqual({ spec: 1 });
    expect(policyOf(middleware)).toBe('worker');
    expect(policyOf(pass)).toBeUndefined();
  });
});

describe('the routes of createHttpApp', () => {
  // DESIGN §6's role column (retention is the admin's).
  const EXPECTED: Record<string, RouteAccess> = {
    submitTask: 'client',
    submitTaskBatch: 'client',
    listTasks: 'client',
    getTaskStatus: 'client',
    getTaskResult: 'client',
    getTaskSnapshot: 'client',
    getAttempt: 'client',
    getTaskHistory: 'client',
    cancelTask: 'client',
    subscribeCompletion: 'client',
    listCompletionSubscriptions: 'client',
    redeliverCompletion: 'client',
    getRetentionPolicy: 'admin',
    setRetentionPolicy: 'admin',
    previewRetention: 'admin',
    openSession: 'worker',
    extendSession: 'worker',
    acquire: 'worker',
    acquireBatch: 'worker',
    renew: 'worker',
    renewBatch: 'worker',
    settle: 'worker',
    settleBatch: 'worker',
    confirmQuiescence: 'worker',
    health: 'public',
    ready: 'public',
    metrics: 'public',
    openapi: 'public',
  };

  it('declares one policy on every mounted route', () => {
    const { app } = createHarness();
    const routes = app.routes.filter((route) => route.method !== 'ALL');
    const declared = new Map<string, RouteAccess[]>();
    for (const route of routes) {
      const access = policyOf(route.handler);
      const name = `${route.method} ${route.path}`;
      if (access !== undefined) declared.set(name, [...(declared.get(name) ?? []), access]);
    }
    const names = new Set(routes.map((route) => `${route.method} ${route.path}`));
    expect(names.size).toBe(Object.keys(EXPECTED).length);
    for (const name of names) expect(declared.get(name), name).toHaveLength(1);
  });

  it("publishes each operation's access in the OpenAPI document, as DESIGN §6 says", async () => {
    const { call } = createHarness();
    const doc = (await (await call('/openapi.json')).json()) as {
      paths: Record<string, Record<string, Record<string, unknown>>>;
    };
    const published: Record<string, unknown> = {};
    for (const item of Object.values(doc.paths)) {
      for (const operation of Object.values(item)) {
        published[operation.operationId as string] = operation[ACCESS_EXTENSION];
      }
    }
    expect(published).toEqual(EXPECTED);
  });

  it('enforces the declared role: a key without it is refused', async () => {
    const { call } = createHarness();
    const res = await call(`${scopePath({ tenant_id: 'acme', namespace: 'prod' })}/tasks`, {
      key: KEYS.worker,
    });
    expect(res.status).toBe(403);
    expect(await res.json()).toMatchObject({
      code: 'forbidden',
      detail: expect.stringMatching(/client role/),
    });
  });
});
