/**
 * T6 — the tenant matrix over real sockets. One server process with keys for
 * two tenants (an admin key each, client and worker keys bound to namespace
 * `prod`, a client+worker key bound to `dev`), and in each tenant a queued
 * task, a task leased through a worker session, a completion subscription and
 * a retention policy. Every operation of the OpenAPI document (so a new route
 * joins the matrix by itself) × every credential (own, the other tenant's,
 * wrong role, wrong namespace, wrong key, no key) × addressing (the
 * resource's scope, or the caller's own scope with the resource's ids) gets
 * the status DESIGN §6 gives, from the small rule table {@link RULES}.
 *
 * Proves: 401 without a valid key, 403 outside the key's role or binding, a
 * foreign task/subscription/session/attempt answered exactly like one that
 * does not exist, no refused request changing any row, no foreign row in any
 * list, no foreign task ever leased; and that the matrix is not vacuous — the
 * owners' own requests succeed.
 */
import { MIN_RETENTION_MS } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  DESTINATION,
  databaseDigest,
  fillPath,
  Histogram,
  type KeyedServer,
  type KeySetting,
  type Operation,
  readApiDocument,
  startKeyedServer,
} from '../fuzz/testdata/wire.js';

type Role = 'client' | 'worker' | 'admin';
type Tenant = 'acme' | 'globex';
const TENANTS: readonly Tenant[] = ['acme', 'globex'];
const other = (tenant: Tenant): Tenant => (tenant === 'acme' ? 'globex' : 'acme');

interface Scope {
  tenant_id: string;
  namespace: string;
}

/** A credential as the matrix uses it; `binding` is absent for a wrong or missing key. */
interface Credential {
  name: string;
  /** The bearer token; `undefined` sends no Authorization header. */
  key: string | undefined;
  binding?: { tenant: Tenant; namespaces: string[]; roles: Role[] };
}

const keyOf = (tenant: Tenant, label: string) => `tm-${tenant}-${label}-key-0001`;

/** The configured keys of one tenant: admin everywhere, per-namespace client and worker keys. */
function tenantKeys(tenant: Tenant): KeySetting[] {
  return [
    { key: keyOf(tenant, 'admin'), tenant, namespaces: ['*'], roles: ['admin'] },
    { key: keyOf(tenant, 'client'), tenant, namespaces: ['prod'], roles: ['client'] },
    { key: keyOf(tenant, 'worker'), tenant, namespaces: ['prod'], roles: ['worker'] },
    { key: keyOf(tenant, 'dev'), tenant, namespaces: ['dev'], roles: ['client', 'worker'] },
  ];
}

/** The credentials tried against `target`'s resources, named from `target`'s side. */
function credentials(target: Tenant): Credential[] {
  const bound = (who: Tenant, label: string, prefix: string): Credential => {
    const setting = tenantKeys(who).find((k) => k.key === keyOf(who, label)) as KeySetting;
    return {
      name: `${prefix} ${label}`,
      key: setting.key,
      binding: { tenant: who, namespaces: setting.namespaces, roles: setting.roles },
    };
  };
  return [
    ...['admin', 'client', 'worker', 'dev'].map((label) => bound(target, label, 'own')),
    ...['admin', 'client', 'worker', 'dev'].map((label) => bound(other(target), label, 'foreign')),
    { name: 'wrong key', key: 'tm-not-a-configured-key-0001' },
    { name: 'no key', key: undefined },
  ];
}

const PROD = (tenant: Tenant): Scope => ({ tenant_id: tenant, namespace: 'prod' });

/** The scope a credential calls its own: its tenant and its first namespace (`*` → prod). */
function ownScope(credential: Credential, fallback: Scope): Scope {
  const binding = credential.binding;
  if (binding === undefined) return fallback;
  const namespace = binding.namespaces[0] === '*' ? 'prod' : (binding.namespaces[0] as string);
  return { tenant_id: binding.tenant, namespace };
}

/** A tenant's resources, all in its `prod` namespace. */
interface Fixture {
  scope: Scope;
  queuedTaskId: string;
  leasedTaskId: string;
  sessionId: string;
  /** The lease owner of the leased task's attempt. */
  owner: Record<string, unknown> & { attempt_id: string; scope: Scope };
  subscriptionId: string;
}

/** Ids that exist nowhere: the control of "a foreign id is indistinguishable from none". */
function missingFixture(scope: Scope, real: Fixture): Fixture {
  return {
    scope,
    queuedTaskId: 'tm-missing-task',
    leasedTaskId: 'tm-missing-task',
    sessionId: 'tm-missing-session',
    owner: { ...real.owner, attempt_id: 'tm-missing-attempt', lease_id: 'tm-missing-lease' },
    subscriptionId: 'tm-missing-subscription',
  };
}

/** What one matrix request sends: path parameters and body, built from a fixture and a scope. */
interface RequestPlan {
  /** The task a per-task route names (the attempt route needs the leased one). */
  task?: 'queued' | 'leased';
  body?: (f: Fixture, scope: Scope) => unknown;
  /** Whether the request names a resource by id (so a foreign id can be tried in one's own scope). */
  namesResource: boolean;
}

const submit = (scope: Scope, key: string) => ({
  idempotency_key: key,
  input: { ...scope, queue: 'tm', program: { name: 'p' }, data: { n: 1 } },
});
const acquire = (f: Fixture, scope: Scope) => ({
  scope,
  queue: 'tm-lease',
  worker_session_id: f.sessionId,
  consumer_id: 1,
  sequence: 1,
});
const renew = (f: Fixture, scope: Scope) => ({
  owner: { ...f.owner, scope },
  sequence: 1,
  intent: 'keep_alive',
});
const settle = (f: Fixture, scope: Scope) => ({
  owner: { ...f.owner, scope },
  operation_id: 'tm-settle',
  report: {
    kind: 'completed',
    report: {
      context: { identity: { task_id: f.owner.task_id, attempt_id: f.owner.attempt_id } },
      outcome: { kind: 'success', output: { ok: true } },
    },
  },
  quiescence: 'confirmed',
  processing_trace: null,
});

/**
 * How to call each operation. An operation of the document missing here fails
 * the suite, so a new route cannot silently skip the matrix.
 */
const PLANS: Readonly<Record<string, RequestPlan>> = {
  submitTask: { namesResource: false, body: (_f, s) => submit(s, 'tm-submit') },
  submitTaskBatch: {
    namesResource: false,
    body: (_f, s) => ({ commands: [submit(s, 'tm-batch')] }),
  },
  listTasks: { namesResource: false },
  getTaskStatus: { namesResource: true, task: 'queued' },
  getTaskResult: { namesResource: true, task: 'queued' },
  getTaskSnapshot: { namesResource: true, task: 'queued' },
  getAttempt: { namesResource: true, task: 'leased' },
  getTaskHistory: { namesResource: true, task: 'queued' },
  cancelTask: { namesResource: true, task: 'queued' },
  subscribeCompletion: {
    namesResource: true,
    task: 'queued',
    body: () => ({ subscription_key: 'tm-subscribe', destination: DESTINATION }),
  },
  listCompletionSubscriptions: { namesResource: true, task: 'queued' },
  redeliverCompletion: { namesResource: true, body: () => ({ generation: 1 }) },
  getRetentionPolicy: { namesResource: false },
  setRetentionPolicy: {
    namesResource: false,
    body: () => ({ retention_ms: MIN_RETENTION_MS * 3 }),
  },
  previewRetention: { namesResource: false },
  openSession: {
    namesResource: false,
    body: (_f, s) => ({ scope: s, queue: 'tm', concurrency: 1 }),
  },
  extendSession: { namesResource: true, body: (_f, s) => ({ scope: s }) },
  acquire: { namesResource: true, body: acquire },
  acquireBatch: { namesResource: true, body: (f, s) => ({ commands: [acquire(f, s)] }) },
  renew: { namesResource: true, body: renew },
  renewBatch: { namesResource: true, body: (f, s) => ({ commands: [renew(f, s)] }) },
  settle: { namesResource: true, body: settle },
  settleBatch: { namesResource: true, body: (f, s) => ({ commands: [settle(f, s)] }) },
  confirmQuiescence: { namesResource: true, body: (f, s) => ({ ...f.owner, scope: s }) },
  health: { namesResource: false },
  ready: { namesResource: false },
  metrics: { namesResource: false },
  openapi: { namesResource: false },
};

// Worker batches check each command's scope on its own (DESIGN §6: an item's error does
// not fail its neighbours), so a foreign scope is a 403 item inside a 200 reply.
const ITEM_SCOPED = new Set(['acquireBatch', 'renewBatch', 'settleBatch']);

/** One cell of the matrix. */
interface Cell {
  operation: Operation;
  credential: Credential;
  /** `resource`: the resource's own scope; `own`: the caller's scope with the resource's ids. */
  addressing: 'resource' | 'own';
  target: Tenant;
}

/**
 * What a cell must answer: a status label (`403`, or `200/403` for a batch
 * whose item was refused), `hidden` (exactly what the same request answers
 * for ids that exist nowhere), or `allowed` (2xx, or 409 where the fixture's
 * state makes a repeat conflict — never 401/403/404, nor `ownership_lost`).
 */
type Expectation = string;

const holds = (credential: Credential, access: string): boolean => {
  const roles = credential.binding?.roles ?? [];
  return roles.includes('admin') || roles.includes(access as Role);
};
const binds = (credential: Credential, scope: Scope): boolean => {
  const b = credential.binding;
  if (b === undefined || b.tenant !== scope.tenant_id) return false;
  return b.namespaces.includes('*') || b.namespaces.includes(scope.namespace);
};

/** DESIGN §6 as rules; the first that applies gives the expectation. */
const RULES: readonly {
  rule: string;
  applies: (c: Cell) => boolean;
  expect: (c: Cell) => Expectation;
}[] = [
  {
    rule: 'public routes need no key',
    applies: (c) => c.operation.access === 'public',
    expect: () => '200',
  },
  {
    rule: 'no or unknown key → 401',
    applies: (c) => c.credential.binding === undefined,
    expect: () => '401',
  },
  {
    rule: 'a key without the route role → 403',
    applies: (c) => !holds(c.credential, c.operation.access),
    expect: () => '403',
  },
  {
    rule: 'a scope outside the binding → 403 (per item in worker batches)',
    applies: (c) => c.addressing === 'resource' && !binds(c.credential, PROD(c.target)),
    expect: (c) => (ITEM_SCOPED.has(c.operation.operationId) ? '200/403' : '403'),
  },
  {
    rule: "another scope's resource, named in one's own scope → as if it did not exist",
    applies: (c) => c.addressing === 'own',
    expect: () => 'hidden',
  },
  { rule: 'the owner, bound and entitled → served', applies: () => true, expect: () => 'allowed' },
];

function expectationOf(cell: Cell): Expectation {
  const rule = RULES.find((r) => r.applies(cell)) as (typeof RULES)[number];
  return rule.expect(cell);
}

let srv: KeyedServer;
let operations: Operation[];
const fixtures = new Map<Tenant, Fixture>();

/** A request as the matrix sends it; returns the status label (`status` or `status/item`). */
async function send(
  method: string,
  path: string,
  key: string | undefined,
  body: unknown,
): Promise<{ label: string; json: unknown }> {
  const headers: Record<string, string> = {};
  if (key !== undefined) headers.authorization = `Bearer ${key}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`${srv.url}${path}`, {
    method,
    headers,
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  const items = (json as { replies?: unknown[]; results?: unknown[] } | null) ?? {};
  const first = (items.replies ?? items.results)?.[0] as
    | { status?: unknown; code?: unknown }
    | undefined;
  const item =
    first === undefined ? '' : typeof first.code === 'string' ? `/${String(first.status)}` : '/ok';
  return { label: `${res.status}${res.status === 200 ? item : ''}`, json };
}

/** The problem code of a reply, or of its first batch item; `-` when there is none. */
function problemCode(json: unknown): string {
  const body = (json ?? {}) as { code?: unknown; replies?: unknown[]; results?: unknown[] };
  const item = (body.replies ?? body.results)?.[0] as { code?: unknown } | undefined;
  return String(item?.code ?? body.code ?? '-');
}

/** Every task id `tenant`'s admin lists in its `prod` scope, paging two at a time. */
async function listTaskIds(tenant: Tenant): Promise<string[]> {
  const ids: string[] = [];
  let cursor: string | undefined;
  do {
    const query =
      cursor === undefined ? '?limit=2' : `?limit=2&cursor=${encodeURIComponent(cursor)}`;
    const path = `${scopePath(PROD(tenant))}/tasks${query}`;
    const { label, json } = await send('GET', path, keyOf(tenant, 'admin'), undefined);
    if (label !== '200') throw new Error(`${path} answered ${label}`);
    const page = json as { tasks: { task_id: string }[]; next_cursor?: string };
    ids.push(...page.tasks.map((task) => task.task_id));
    cursor = page.next_cursor;
  } while (cursor !== undefined);
  return ids;
}

/** An owner's setup request; throws unless it answers 200 or 201. `T` is the reply's shape. */
async function setup<T>(tenant: Tenant, method: string, path: string, body?: unknown): Promise<T> {
  const { label, json } = await send(method, path, keyOf(tenant, 'admin'), body);
  if (!/^20[01]/.test(label))
    throw new Error(`${method} ${path} answered ${label}: ${JSON.stringify(json)}`);
  return json as T;
}

const scopePath = (s: Scope) => `/v1/tenants/${s.tenant_id}/namespaces/${s.namespace}`;

async function createFixture(tenant: Tenant): Promise<Fixture> {
  const scope = PROD(tenant);
  const base = scopePath(scope);
  const queued = await setup<{ task_id: string }>(
    tenant,
    'POST',
    `${base}/tasks`,
    submit(scope, 'tm-queued'),
  );
  const leased = await setup<{ task_id: string }>(tenant, 'POST', `${base}/tasks`, {
    ...submit(scope, 'tm-leased'),
    input: { ...submit(scope, '').input, queue: 'tm-lease' },
  });
  const session = await setup<{ id: string }>(tenant, 'POST', '/v1/worker/sessions', {
    scope,
    queue: 'tm-lease',
    concurrency: 2,
  });
  const reply = await setup<{
    disposition: string;
    assignment: { lease: { owner: Fixture['owner'] } };
  }>(tenant, 'POST', '/v1/worker/acquire', {
    scope,
    queue: 'tm-lease',
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  if (reply.disposition !== 'assigned')
    throw new Error(`fixture acquire: ${JSON.stringify(reply)}`);
  const subscription = await setup<{ id: string }>(
    tenant,
    'POST',
    `${base}/tasks/${queued.task_id}/completion-subscriptions`,
    { subscription_key: 'tm-fixture', destination: DESTINATION },
  );
  await setup(tenant, 'PUT', `${base}/retention-policy`, { retention_ms: MIN_RETENTION_MS * 2 });
  // A task in a queue only this tenant uses, for the other tenant to try to lease.
  await setup(tenant, 'POST', `${base}/tasks`, {
    ...submit(scope, 'tm-bait'),
    input: { ...submit(scope, '').input, queue: `bait-${tenant}` },
  });
  return {
    scope,
    queuedTaskId: queued.task_id,
    leasedTaskId: leased.task_id,
    sessionId: session.id,
    owner: reply.assignment.lease.owner,
    subscriptionId: subscription.id,
  };
}

/** The method, path and body of `cell`, for the resources of `fixture`. */
function requestOf(cell: Cell, fixture: Fixture): { method: string; path: string; body: unknown } {
  const plan = PLANS[cell.operation.operationId] as RequestPlan;
  const scope =
    cell.addressing === 'resource' ? fixture.scope : ownScope(cell.credential, fixture.scope);
  const path = fillPath(cell.operation.path, {
    tenant_id: scope.tenant_id,
    namespace: scope.namespace,
    task_id: plan.task === 'leased' ? fixture.leasedTaskId : fixture.queuedTaskId,
    attempt_id: fixture.owner.attempt_id,
    subscription_id: fixture.subscriptionId,
    session_id: fixture.sessionId,
  });
  return { method: cell.operation.method, path, body: plan.body?.(fixture, scope) };
}

beforeAll(async () => {
  srv = await startKeyedServer('tenancy', [...tenantKeys('acme'), ...tenantKeys('globex')]);
  ({ operations } = await readApiDocument(srv.url));
  for (const tenant of TENANTS) fixtures.set(tenant, await createFixture(tenant));
});

afterAll(async () => {
  await srv?.close();
});

describe('T6: the tenant matrix over real sockets', () => {
  it('gives every operation × credential the DESIGN §6 status, and refusals change nothing', async () => {
    const started = performance.now();
    for (const op of operations)
      expect(PLANS[op.operationId], `a plan for ${op.operationId}`).toBeDefined();

    const cells: Cell[] = [];
    for (const target of TENANTS) {
      for (const operation of operations) {
        for (const credential of credentials(target)) {
          cells.push({ operation, credential, addressing: 'resource', target });
          // One's own scope with the target's ids: only for keys whose own scope differs.
          const own = ownScope(credential, PROD(target));
          const differs = own.tenant_id !== target || own.namespace !== 'prod';
          if (
            PLANS[operation.operationId]?.namesResource &&
            credential.binding !== undefined &&
            differs
          ) {
            cells.push({ operation, credential, addressing: 'own', target });
          }
        }
      }
    }
    const refused = cells.filter((c) => expectationOf(c) !== 'allowed');
    const allowed = cells.filter((c) => expectationOf(c) === 'allowed');

    const histogram = new Histogram();
    const mismatches: string[] = [];
    const check = async (cell: Cell) => {
      const fixture = fixtures.get(cell.target) as Fixture;
      const expected = expectationOf(cell);
      const { method, path, body } = requestOf(cell, fixture);
      const { label, json } = await send(method, path, cell.credential.key, body);
      histogram.add(label);
      let want = expected;
      let ok: boolean;
      if (expected === 'hidden') {
        // Indistinguishable: the same status and problem code (per item in batches)
        // as the same request naming ids that exist nowhere.
        const scope = ownScope(cell.credential, fixture.scope);
        const control = requestOf(cell, missingFixture(scope, fixture));
        const twin = await send(control.method, control.path, cell.credential.key, control.body);
        want = `like missing ids: ${twin.label} ${problemCode(twin.json)}`;
        ok =
          want === `like missing ids: ${label} ${problemCode(json)}` && !/^(401|403)/.test(label);
      } else if (expected === 'allowed') {
        // A repeat may conflict with the fixture's state (409 `sequence_conflict`, `conflict`),
        // but an owner's own lease is never `ownership_lost`: that is the likely face of a scope
        // comparison bug (the owner's scope read as another's).
        ok = /^(2\d\d|409)(\/(ok|409))?$/.test(label) && problemCode(json) !== 'ownership_lost';
        if (!ok) want = 'served (2xx, or a 409 other than ownership_lost)';
      } else ok = label === expected;
      if (!ok) {
        mismatches.push(
          `${cell.target} ${cell.operation.operationId} as ${cell.credential.name} (${cell.addressing}): ${label}, expected ${want}`,
        );
      }
    };

    // Refusals first, between two digests of every table: none may change a row.
    const before = await databaseDigest(srv.stack.databaseUrl);
    for (const cell of refused) await check(cell);
    const after = await databaseDigest(srv.stack.databaseUrl);

    // No foreign row in any list, and no foreign task leased.
    const foreignRows: string[] = [];
    const listed = new Map<Tenant, string[]>();
    for (const tenant of TENANTS) listed.set(tenant, await listTaskIds(tenant));
    for (const tenant of TENANTS) {
      const mine = fixtures.get(tenant) as Fixture;
      const theirs = fixtures.get(other(tenant)) as Fixture;
      const key = keyOf(tenant, 'admin');
      const theirIds = new Set(listed.get(other(tenant)));
      const ids = listed.get(tenant) ?? [];
      expect(ids.length, `${tenant} lists its own tasks`).toBeGreaterThanOrEqual(3);
      for (const id of ids) if (theirIds.has(id)) foreignRows.push(`${tenant} lists task ${id}`);
      const subs = await send(
        'GET',
        `${scopePath(mine.scope)}/tasks/${mine.queuedTaskId}/completion-subscriptions`,
        key,
        undefined,
      );
      for (const sub of subs.json as { id: string }[]) {
        if (sub.id === theirs.subscriptionId)
          foreignRows.push(`${tenant} lists subscription ${sub.id}`);
      }
      // A session of this tenant on the queue only the other tenant fills must get nothing.
      const session = await setup<{ id: string }>(tenant, 'POST', '/v1/worker/sessions', {
        scope: mine.scope,
        queue: `bait-${other(tenant)}`,
        concurrency: 1,
      });
      const poll = await setup<{ disposition: string }>(tenant, 'POST', '/v1/worker/acquire', {
        scope: mine.scope,
        queue: `bait-${other(tenant)}`,
        worker_session_id: session.id,
        consumer_id: 0,
        sequence: 1,
      });
      if (poll.disposition !== 'empty')
        foreignRows.push(`${tenant} leased ${JSON.stringify(poll)}`);
    }

    // Last, the owners' own requests: they change the record, by design.
    for (const cell of allowed) await check(cell);
    const seconds = (performance.now() - started) / 1000;

    console.log(
      [
        `T6 tenant matrix: ${cells.length} cells (${operations.length} operations × ${credentials('acme').length} credentials × 2 tenants, ` +
          `+ own-scope addressing), ${refused.length} refusals and ${allowed.length} owner requests in ${seconds.toFixed(1)} s`,
        `  statuses: ${histogram}`,
        `  foreign rows in lists or leases: ${foreignRows.length}`,
        ...RULES.map(
          (r) =>
            `  rule: ${r.rule} — ${cells.filter((c) => RULES.find((x) => x.applies(c)) === r).length} cells`,
        ),
      ].join('\n'),
    );
    expect(mismatches).toEqual([]);
    expect(foreignRows).toEqual([]);
    expect(after).toEqual(before);
  });
});
