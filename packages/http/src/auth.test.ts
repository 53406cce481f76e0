import { type Assignment, MIN_RETENTION_MS, type Problem, type Scope } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import {
  type ApiKeyConfig,
  allowsScope,
  apiKeyProblems,
  createAuthenticator,
  type Role,
  requireRole,
  soleScope,
} from './auth.js';
import {
  ACME_DEV,
  ACME_PROD,
  createHarness,
  deliverDue,
  GLOBEX_PROD,
  type Harness,
  KEY_CONFIG,
  KEYS,
  policyPath,
  redeliverPath,
  scopePath,
  settleBody,
  submitBody,
  subscribeBody,
  subscriptionsPath,
} from './testdata/harness.js';

describe('createAuthenticator', () => {
  it('accepts configured keys, case-insensitive scheme, and rejects the rest', () => {
    const auth = createAuthenticator({ keys: KEY_CONFIG });
    expect(auth.developmentMode).toBe(false);
    expect(auth.authenticate(`Bearer ${KEYS.client}`)).toMatchObject({
      ok: true,
      principal: { tenant: 'acme' },
    });
    expect(auth.authenticate(`bearer ${KEYS.client}`).ok).toBe(true);
    expect(auth.authenticate(undefined)).toEqual({ ok: false, reason: 'missing' });
    expect(auth.authenticate('')).toEqual({ ok: false, reason: 'missing' });
    for (const header of [
      `Bearer ${KEYS.client}x`,
      'Bearer',
      `Bearer  ${KEYS.client} extra`,
      `Bearer\t${KEYS.client}`,
      `Bearer ${'a'.repeat(10_000)}`,
    ]) {
      expect(auth.authenticate(header)).toEqual({ ok: false, reason: 'invalid' });
    }
    // No bearer token at all: another scheme, or none (RFC 6750 §3.1).
    for (const header of [`Basic ${KEYS.client}`, `Bearerx ${KEYS.client}`, KEYS.client]) {
      expect(auth.authenticate(header)).toEqual({ ok: false, reason: 'scheme' });
    }
  });

  it('keeps only hashes: the principal holds no key text', () => {
    const auth = createAuthenticator({ keys: KEY_CONFIG });
    const result = auth.authenticate(`Bearer ${KEYS.admin}`);
    expect(JSON.stringify(result, (_k, v) => (v instanceof Set ? [...v] : v))).not.toContain(
      KEYS.admin,
    );
  });

  it('expands admin into every role and binds namespaces', () => {
    const auth = createAuthenticator({ keys: KEY_CONFIG });
    const admin = auth.authenticate(`Bearer ${KEYS.admin}`);
    if (!admin.ok) throw new Error('admin key rejected');
    expect([...admin.principal.roles].sort()).toEqual(['admin', 'client', 'worker']);
    expect(() => requireRole(admin.principal, 'worker')).not.toThrow();
    const prod = auth.authenticate(`Bearer ${KEYS.prodClient}`);
    if (!prod.ok) throw new Error('prod key rejected');
    expect(allowsScope(prod.principal, ACME_PROD)).toBe(true);
    expect(allowsScope(prod.principal, ACME_DEV)).toBe(false);
    expect(allowsScope(prod.principal, GLOBEX_PROD)).toBe(false);
    expect(soleScope(prod.principal)).toEqual(ACME_PROD);
    expect(() => requireRole(prod.principal, 'worker')).toThrow(/worker role/);
    // Only an admin key holds the admin role: client plus worker is not admin.
    expect(() => requireRole(admin.principal, 'admin')).not.toThrow();
    const both = auth.authenticate(`Bearer ${KEYS.both}`);
    if (!both.ok) throw new Error('client+worker key rejected');
    expect(() => requireRole(both.principal, 'admin')).toThrow(/admin role/);
  });

  it('is in development mode without keys', () => {
    const auth = createAuthenticator({ keys: [] });
    expect(auth.developmentMode).toBe(true);
    const result = auth.authenticate(undefined);
    if (!result.ok) throw new Error('development mode rejected a request');
    expect(allowsScope(result.principal, GLOBEX_PROD)).toBe(true);
    expect(soleScope(result.principal)).toBeUndefined();
  });

  const secret = 'super-secret-key-value';
  it.each<[string, Partial<ApiKeyConfig>]>([
    ['an empty key', { key: '' }],
    ['a key with spaces', { key: `${secret} x` }],
    ['an empty tenant', { tenant: '' }],
    ['no namespaces', { namespaces: [] }],
    ['a wildcard with names', { namespaces: ['*', 'prod'] }],
    ['a bad namespace', { namespaces: [' prod'] }],
    ['no roles', { roles: [] }],
    ['an unknown role', { roles: ['root' as 'admin'] }],
  ])('rejects a configuration with %s, without naming the key', (_name, change) => {
    const config = { key: secret, tenant: 'acme', namespaces: ['*'], roles: ['client'], ...change };
    try {
      createAuthenticator({ keys: [config as ApiKeyConfig] });
      expect.unreachable();
    } catch (error) {
      expect(error).toBeInstanceOf(TypeError);
      expect((error as Error).message).toMatch(/^auth\.keys\[0\]/);
      expect((error as Error).message).not.toContain(secret);
    }
  });

  it('rejects a key configured twice', () => {
    const entry: ApiKeyConfig = { key: secret, tenant: 'a', namespaces: ['*'], roles: ['client'] };
    expect(() => createAuthenticator({ keys: [entry, { ...entry, tenant: 'b' }] })).toThrow(
      /auth\.keys\[1\]\.key repeats auth\.keys\[0\]\.key/,
    );
  });
});

describe('apiKeyProblems', () => {
  const secret = 'super-secret-key-value';

  it('finds nothing wrong with the keys the authenticator accepts', () => {
    for (const config of KEY_CONFIG) expect(apiKeyProblems(config)).toEqual([]);
  });

  it('lists every problem of a key by field, never quoting the key', () => {
    const config = {
      key: `${secret}\n`,
      tenant: 'acme ',
      namespaces: ['prod', 'x'.repeat(129), 7],
      roles: ['client', 'root'],
    } as unknown as ApiKeyConfig;
    const problems = apiKeyProblems(config);
    expect(problems.map(({ field }) => field)).toEqual([
      'key',
      'tenant',
      'namespaces[1]',
      'namespaces[2]',
      'roles[1]',
    ]);
    expect(JSON.stringify(problems)).not.toContain(secret);
    // The authenticator refuses the first of them, named as its option.
    expect(() => createAuthenticator({ keys: [config] })).toThrow(/^auth\.keys\[0\]\.key must be/);
  });

  it('tolerates fields of the wrong type, as configuration read from JSON may hold', () => {
    const problems = apiKeyProblems({ key: 7, tenant: null, roles: 'admin' } as never);
    expect(problems.map(({ field }) => field)).toEqual(['key', 'tenant', 'namespaces', 'roles']);
  });
});

// ---- The auth matrix: keys × tenants × namespaces × roles × routes --------------

type KeyName = keyof typeof KEYS | 'none' | 'invalid';

interface Fixture {
  scope: Scope;
  taskId: string;
  queuedTaskId: string;
  sessionId: string;
  assignment: Assignment;
  /** A subscription whose first generation was delivered, so it may be redelivered. */
  deliveredSubscriptionId: string;
}

interface MatrixRoute {
  name: string;
  role: Role;
  batch: boolean;
  success: number;
  request(h: Harness, f: Fixture): { path: string; method: string; json?: unknown };
}

const ROUTES: MatrixRoute[] = [
  {
    name: 'submit',
    role: 'client',
    batch: false,
    success: 201,
    request: (_h, f) => ({
      method: 'POST',
      path: `${scopePath(f.scope)}/tasks`,
      json: submitBody(f.scope, 'matrix'),
    }),
  },
  {
    name: 'submit batch',
    role: 'client',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: `${scopePath(f.scope)}/tasks:batch`,
      json: { commands: [submitBody(f.scope, 'matrix')] },
    }),
  },
  {
    name: 'list',
    role: 'client',
    batch: false,
    success: 200,
    request: (_h, f) => ({ method: 'GET', path: `${scopePath(f.scope)}/tasks` }),
  },
  {
    name: 'status',
    role: 'client',
    batch: false,
    success: 200,
    request: (_h, f) => ({ method: 'GET', path: `${scopePath(f.scope)}/tasks/${f.taskId}` }),
  },
  {
    name: 'result',
    role: 'client',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'GET',
      path: `${scopePath(f.scope)}/tasks/${f.taskId}/result`,
    }),
  },
  {
    name: 'cancel',
    role: 'client',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: `${scopePath(f.scope)}/tasks/${f.queuedTaskId}/cancel`,
    }),
  },
  {
    name: 'subscribe',
    role: 'client',
    batch: false,
    success: 201,
    request: (_h, f) => ({
      method: 'POST',
      path: subscriptionsPath(f.scope, f.taskId),
      json: subscribeBody('matrix'),
    }),
  },
  {
    name: 'list subscriptions',
    role: 'client',
    batch: false,
    success: 200,
    request: (_h, f) => ({ method: 'GET', path: subscriptionsPath(f.scope, f.taskId) }),
  },
  {
    name: 'redeliver',
    role: 'client',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: redeliverPath(f.scope, f.deliveredSubscriptionId),
      json: { generation: 1 },
    }),
  },
  {
    name: 'retention policy',
    role: 'admin',
    batch: false,
    success: 200,
    request: (_h, f) => ({ method: 'GET', path: policyPath(f.scope) }),
  },
  {
    name: 'set retention policy',
    role: 'admin',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'PUT',
      path: policyPath(f.scope),
      json: { retention_ms: MIN_RETENTION_MS },
    }),
  },
  {
    name: 'retention preview',
    role: 'admin',
    batch: false,
    success: 200,
    request: (_h, f) => ({ method: 'GET', path: `${policyPath(f.scope)}/preview?limit=10` }),
  },
  {
    name: 'open session',
    role: 'worker',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: '/v1/worker/sessions',
      json: { scope: f.scope, queue: 'email', concurrency: 1 },
    }),
  },
  {
    name: 'extend session',
    role: 'worker',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: `/v1/worker/sessions/${f.sessionId}/extend`,
      json: { scope: f.scope },
    }),
  },
  {
    name: 'acquire',
    role: 'worker',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: '/v1/worker/acquire',
      json: {
        scope: f.scope,
        queue: 'email',
        worker_session_id: f.sessionId,
        consumer_id: 1,
        sequence: 1,
      },
    }),
  },
  {
    name: 'acquire batch',
    role: 'worker',
    batch: true,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: '/v1/worker/acquire:batch',
      json: {
        commands: [
          {
            scope: f.scope,
            queue: 'email',
            worker_session_id: f.sessionId,
            consumer_id: 1,
            sequence: 1,
          },
        ],
      },
    }),
  },
  {
    name: 'renew',
    role: 'worker',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: '/v1/worker/renew',
      json: { owner: f.assignment.lease.owner, sequence: 1, intent: 'keep_alive' },
    }),
  },
  {
    name: 'renew batch',
    role: 'worker',
    batch: true,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: '/v1/worker/renew:batch',
      json: { commands: [{ owner: f.assignment.lease.owner, sequence: 1, intent: 'keep_alive' }] },
    }),
  },
  {
    name: 'settle',
    role: 'worker',
    batch: false,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: '/v1/worker/settle',
      json: settleBody(f.assignment),
    }),
  },
  {
    name: 'settle batch',
    role: 'worker',
    batch: true,
    success: 200,
    request: (_h, f) => ({
      method: 'POST',
      path: '/v1/worker/settle:batch',
      json: { commands: [settleBody(f.assignment)] },
    }),
  },
];

const KEY_NAMES: KeyName[] = [
  'none',
  'invalid',
  'client',
  'worker',
  'admin',
  'both',
  'prodClient',
  'prodWorker',
  'other',
];
const SCOPES: Scope[] = [ACME_PROD, ACME_DEV, GLOBEX_PROD];

/** What the matrix expects: the HTTP status, and for batches the first item's code. */
function expectation(keyName: KeyName, scope: Scope, route: MatrixRoute) {
  if (keyName === 'none' || keyName === 'invalid') return { status: 401 };
  const config = KEY_CONFIG.find((entry) => entry.key === KEYS[keyName]) as ApiKeyConfig;
  const role = config.roles.includes(route.role) || config.roles.includes('admin');
  const inScope =
    config.tenant === scope.tenant_id &&
    (config.namespaces.includes('*') || config.namespaces.includes(scope.namespace));
  if (!role) return { status: 403 };
  if (!inScope) return route.batch ? { status: 200, item: 'forbidden' } : { status: 403 };
  return route.batch ? { status: route.success, item: 'ok' } : { status: route.success };
}

/**
 * Sets up, through the services, a task, a queued task, a session, an
 * assignment and a delivered subscription in `scope`.
 */
async function fixture(h: Harness, scope: Scope): Promise<Fixture> {
  const base = (key: string) => ({
    idempotency_key: key,
    input: {
      tenant_id: scope.tenant_id,
      namespace: scope.namespace,
      queue: 'email',
      program: { name: 'send' },
      data: null,
    },
  });
  const { snapshot: task } = await h.service.submit(base('fixture-1'));
  const session = await h.service.openSession({ scope, queue: 'email', concurrency: 2 });
  const reply = await h.service.acquire({
    scope,
    queue: 'email',
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  if (reply.disposition !== 'assigned') throw new Error('fixture task was not assigned');
  const { snapshot: queued } = await h.service.submit(base('fixture-2'));
  const { snapshot: finished } = await h.service.submit(base('fixture-3'));
  await h.service.cancel(scope, finished.task_id);
  const { subscription } = await h.completions.subscribe(
    scope,
    finished.task_id,
    subscribeBody('fixture'),
  );
  await deliverDue(h, { state: 'delivered' });
  return {
    scope,
    taskId: task.task_id,
    queuedTaskId: queued.task_id,
    sessionId: session.id,
    assignment: reply.assignment,
    deliveredSubscriptionId: subscription.id,
  };
}

const MATRIX = KEY_NAMES.flatMap((keyName) =>
  SCOPES.flatMap((scope) =>
    ROUTES.map((route) => ({
      keyName,
      scope,
      route,
      expected: expectation(keyName, scope, route),
    })),
  ),
);

describe(`auth matrix (${MATRIX.length} cases)`, () => {
  it('has at least 60 cases covering every outcome', () => {
    expect(MATRIX.length).toBeGreaterThanOrEqual(60);
    const statuses = new Set(MATRIX.map((c) => c.expected.status));
    expect([...statuses].sort()).toEqual([200, 201, 401, 403]);
  });

  it.each(
    MATRIX.map((c) => [c.keyName, `${c.scope.tenant_id}/${c.scope.namespace}`, c.route.name, c]),
  )('key %s × scope %s × %s', async (_k, _s, _r, testCase) => {
    const { keyName, scope, route, expected } = testCase;
    const h = createHarness();
    const f = await fixture(h, scope);
    const { path, method, json } = route.request(h, f);
    const key =
      keyName === 'none' ? undefined : keyName === 'invalid' ? 'no-such-key' : KEYS[keyName];
    const res = await h.call(path, {
      method,
      ...(key === undefined ? {} : { key }),
      ...(json === undefined ? {} : { json }),
    });
    const body = (await res.json()) as Record<string, unknown>;
    expect({ status: res.status, body }).toMatchObject({ status: expected.status });
    if (expected.status === 401) expect(body.code).toBe('unauthorized');
    if (expected.status === 403) expect(body.code).toBe('forbidden');
    if ('item' in expected) {
      const items = (body.results ?? body.replies) as (Problem | Record<string, unknown>)[];
      const first = items[0] as Record<string, unknown>;
      if (expected.item === 'forbidden') expect(first.code).toBe('forbidden');
      else expect(first.code).toBeUndefined();
    }
  });
});
