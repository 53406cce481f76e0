/**
 * Tenancy: isolation between namespaces of one tenant and between tenants, for the
 * lease operations and the list/cursor routes, over the real server on a real PostgreSQL.
 * A key bound to namespace `a` (or to `*`) presenting an owner, session or cursor that belongs
 * to namespace `b` (or to another tenant) must change nothing there and be answered like a
 * missing resource (DESIGN §6, §4.1).
 */
import type {
  AcquireReply,
  Assignment,
  Scope,
  TaskPage,
  TaskSnapshot,
  WorkerSession,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer, type KeyedReply as Reply } from './testdata/keyed-server.js';

const KEYS = {
  star: 'rt-acme-star-key-000000001',
  a: 'rt-acme-a-key-000000001',
  b: 'rt-acme-b-key-000000001',
  globex: 'rt-globex-star-key-0000001',
  clientOnly: 'rt-acme-client-key-000000001',
  workerOnly: 'rt-acme-worker-key-000000001',
  admin: 'rt-acme-admin-key-000000001',
  nfc: 'rt-cafe-nfc-key-000000001',
  nfd: 'rt-cafe-nfd-key-000000001',
  upper: 'rt-acme-upper-key-000000001',
} as const;
const NFC = 'caf\u00e9';
const NFD = 'cafe\u0301';
const KEY_CONFIG = [
  { key: KEYS.star, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  { key: KEYS.a, tenant: 'acme', namespaces: ['a'], roles: ['client', 'worker'] },
  { key: KEYS.b, tenant: 'acme', namespaces: ['b'], roles: ['client', 'worker'] },
  { key: KEYS.globex, tenant: 'globex', namespaces: ['*'], roles: ['client', 'worker'] },
  { key: KEYS.clientOnly, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
  { key: KEYS.workerOnly, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
  { key: KEYS.admin, tenant: 'acme', namespaces: ['*'], roles: ['admin'] },
  { key: KEYS.nfc, tenant: NFC, namespaces: [NFC], roles: ['client', 'worker'] },
  { key: KEYS.nfd, tenant: NFD, namespaces: [NFD], roles: ['client', 'worker'] },
  { key: KEYS.upper, tenant: 'acme', namespaces: ['A'], roles: ['client', 'worker'] },
];
const DESTINATIONS = JSON.stringify({
  billing: {
    url: 'http://127.0.0.1:9/hook',
    secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
  },
});

const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const B: Scope = { tenant_id: 'acme', namespace: 'b' };
const G: Scope = { tenant_id: 'globex', namespace: 'a' };

const server = keyedServer('tenancy', {
  LEDGENCE_API_KEYS: JSON.stringify(KEY_CONFIG),
  LEDGENCE_CALLBACK_DESTINATIONS: DESTINATIONS,
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});
const call = server.call;

/** A request whose path is sent byte for byte (no client-side dot-segment removal). */
function raw(key: string, path: string): Promise<Reply> {
  return server.send({ method: 'GET', path, key });
}

const scopePath = (s: Scope) =>
  `/v1/tenants/${encodeURIComponent(s.tenant_id)}/namespaces/${encodeURIComponent(s.namespace)}`;

let counter = 0;
async function submit(
  key: string,
  scope: Scope,
  extra: Record<string, unknown> = {},
): Promise<TaskSnapshot> {
  counter += 1;
  const reply = await call<TaskSnapshot>(key, 'POST', `${scopePath(scope)}/tasks`, {
    idempotency_key: `rt-${counter}`,
    input: { ...scope, queue: 'q', program: { name: 'p' }, data: { n: counter }, ...extra },
  });
  expect(reply.status).toBe(201);
  return reply.body;
}

async function session(key: string, scope: Scope, queue = 'q'): Promise<WorkerSession> {
  const reply = await call<WorkerSession>(key, 'POST', '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 2,
  });
  expect(reply.status).toBe(200);
  return reply.body;
}

async function assign(key: string, scope: Scope, queue = `q-${++counter}`) {
  const task = await submit(key, scope, { queue });
  const s = await session(key, scope, queue);
  const reply = await call<AcquireReply>(key, 'POST', '/v1/worker/acquire', {
    scope,
    queue,
    worker_session_id: s.id,
    consumer_id: 0,
    sequence: 1,
  });
  expect(reply.body.disposition).toBe('assigned');
  const assignment = (reply.body as { assignment: Assignment }).assignment;
  expect(assignment.lease.owner.task_id).toBe(task.task_id);
  return { task, session: s, assignment };
}

/** What a scope's task looks like, for "nothing changed". */
async function state(scope: Scope, taskId: string) {
  const base = `${scopePath(scope)}/tasks/${taskId}`;
  const key = scope.tenant_id === 'acme' ? KEYS.star : KEYS.globex;
  const snapshot = await call(key, 'GET', `${base}/snapshot`);
  const history = await call(key, 'GET', `${base}/history`);
  return { snapshot: snapshot.body, history: history.body };
}

function settleBody(owner: Record<string, unknown>, op = 'op-1') {
  return {
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: { ok: true } },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

const missingLike = (reply: Reply) => [reply.status, reply.body?.code];

describe('lease operations with an owner from another namespace or tenant', () => {
  for (const [name, key, scopeOfCaller] of [
    ['a key bound to namespace a', KEYS.a, A],
    ['a key bound to * of the tenant', KEYS.star, A],
    ['a key of another tenant', KEYS.globex, G],
  ] as const) {
    it(`${name}: renew/settle/quiescence with b's owner re-scoped are refused and change nothing`, async () => {
      const { task, assignment } = await assign(KEYS.b, B);
      const before = await state(B, task.task_id);
      const owner = { ...assignment.lease.owner, scope: scopeOfCaller };
      const renew = await call(key, 'POST', '/v1/worker/renew', {
        owner,
        sequence: 1,
        intent: 'dispatch',
      });
      const settle = await call(key, 'POST', '/v1/worker/settle', settleBody(owner));
      const quiet = await call(key, 'POST', '/v1/worker/quiescence', owner);
      const renewBatch = await call(key, 'POST', '/v1/worker/renew:batch', {
        commands: [{ owner, sequence: 1, intent: 'keep_alive' }],
      });
      const settleBatch = await call(key, 'POST', '/v1/worker/settle:batch', {
        commands: [settleBody(owner, 'op-2')],
      });
      // The same owner with an id that exists nowhere: the answers must be the same.
      const ghost = { ...owner, task_id: 'rt-missing-task', attempt_id: 'rt-missing-attempt' };
      const renewGhost = await call(key, 'POST', '/v1/worker/renew', {
        owner: ghost,
        sequence: 1,
        intent: 'dispatch',
      });
      const settleGhost = await call(key, 'POST', '/v1/worker/settle', settleBody(ghost));
      const quietGhost = await call(key, 'POST', '/v1/worker/quiescence', ghost);
      expect(missingLike(renew)).toEqual(missingLike(renewGhost));
      expect(missingLike(settle)).toEqual(missingLike(settleGhost));
      expect(missingLike(quiet)).toEqual(missingLike(quietGhost));
      expect([404, 409]).toContain(renew.status);
      expect(renewBatch.status).toBe(200);
      expect([404, 409]).toContain(renewBatch.body.results[0].status);
      expect([404, 409]).toContain(settleBatch.body.results[0].status);
      expect(await state(B, task.task_id)).toEqual(before);
      // The owner itself still holds the lease.
      const own = await call(KEYS.b, 'POST', '/v1/worker/renew', {
        owner: assignment.lease.owner,
        sequence: 1,
        intent: 'dispatch',
      });
      expect(own.status).toBe(200);
    });
  }

  it("a key bound to a: b's real owner is 403 on every lease route and changes nothing", async () => {
    const { task, assignment } = await assign(KEYS.b, B);
    const before = await state(B, task.task_id);
    const owner = assignment.lease.owner;
    const replies = [
      await call(KEYS.a, 'POST', '/v1/worker/renew', { owner, sequence: 1, intent: 'dispatch' }),
      await call(KEYS.a, 'POST', '/v1/worker/settle', settleBody(owner)),
      await call(KEYS.a, 'POST', '/v1/worker/quiescence', owner),
    ];
    expect(replies.map((r) => [r.status, r.body.code])).toEqual(Array(3).fill([403, 'forbidden']));
    const batch = await call(KEYS.a, 'POST', '/v1/worker/renew:batch', {
      commands: [{ owner, sequence: 1, intent: 'keep_alive' }],
    });
    expect([batch.status, batch.body.results[0].status]).toEqual([200, 403]);
    expect(await state(B, task.task_id)).toEqual(before);
  });
});

describe('sessions across namespaces', () => {
  it("b's session used for acquire in a, extended in a, and mixed into an a batch", async () => {
    await submit(KEYS.b, B);
    await submit(KEYS.a, A);
    const sb = await session(KEYS.b, B);
    const sa = await session(KEYS.a, A);
    const poll = (scope: Scope, s: WorkerSession, consumer = 0, sequence = 1) => ({
      scope,
      queue: 'q',
      worker_session_id: s.id,
      consumer_id: consumer,
      sequence,
    });
    const foreign = await call(KEYS.a, 'POST', '/v1/worker/acquire', poll(A, sb));
    const missing = await call(KEYS.a, 'POST', '/v1/worker/acquire', {
      ...poll(A, sb),
      worker_session_id: 'rt-missing-session',
    });
    expect(missingLike(foreign)).toEqual([404, 'session_not_found']);
    expect(missingLike(missing)).toEqual([404, 'session_not_found']);
    const foreignG = await call(KEYS.globex, 'POST', '/v1/worker/acquire', poll(G, sb));
    expect(missingLike(foreignG)).toEqual([404, 'session_not_found']);

    const extend = await call(KEYS.a, 'POST', `/v1/worker/sessions/${sb.id}/extend`);
    expect(missingLike(extend)).toEqual([404, 'session_not_found']);
    const extendStar = await call(KEYS.star, 'POST', `/v1/worker/sessions/${sb.id}/extend`, {
      scope: A,
    });
    expect(missingLike(extendStar)).toEqual([404, 'session_not_found']);
    const extendForbidden = await call(KEYS.a, 'POST', `/v1/worker/sessions/${sb.id}/extend`, {
      scope: B,
    });
    expect(missingLike(extendForbidden)).toEqual([403, 'forbidden']);

    const batch = await call(KEYS.a, 'POST', '/v1/worker/acquire:batch', {
      commands: [poll(A, sa, 0, 1), poll(B, sb, 0, 1), poll(A, sb, 1, 1)],
    });
    expect(batch.status).toBe(200);
    expect(batch.body.replies[0].disposition).toBe('assigned');
    expect([batch.body.replies[1].status, batch.body.replies[1].code]).toEqual([403, 'forbidden']);
    expect([batch.body.replies[2].status, batch.body.replies[2].code]).toEqual([
      404,
      'session_not_found',
    ]);
    // b's task is still queued, b's slot 0 still takes sequence 1 as a new poll.
    const own = await call(KEYS.b, 'POST', '/v1/worker/acquire', poll(B, sb));
    expect(own.body.disposition).toBe('assigned');
  });
});

describe('lists and cursors across scopes', () => {
  it('a cursor issued in one scope is 400 in another namespace and in another tenant', async () => {
    for (let i = 0; i < 3; i++) await submit(KEYS.star, { tenant_id: 'acme', namespace: 'list' });
    for (let i = 0; i < 3; i++)
      await submit(KEYS.globex, { tenant_id: 'globex', namespace: 'list' });
    const first = await call<TaskPage>(
      KEYS.star,
      'GET',
      `${scopePath({ tenant_id: 'acme', namespace: 'list' })}/tasks?limit=1`,
    );
    const cursor = first.body.next_cursor as string;
    expect(cursor).toBeDefined();
    const other = await call(KEYS.star, 'GET', `${scopePath(A)}/tasks?limit=1&cursor=${cursor}`);
    expect(missingLike(other)).toEqual([400, 'invalid_input']);
    const foreign = await call(
      KEYS.globex,
      'GET',
      `${scopePath({ tenant_id: 'globex', namespace: 'list' })}/tasks?limit=1&cursor=${cursor}`,
    );
    expect(missingLike(foreign)).toEqual([400, 'invalid_input']);
  });

  it('paths that differ by case, encoding or dot segments never select another scope', async () => {
    const t = await submit(KEYS.a, A, { labels: { team: 'red' } });
    const listA = await call<TaskPage>(KEYS.a, 'GET', `${scopePath(A)}/tasks?label.team=red`);
    expect(listA.body.tasks.map((x) => x.task_id)).toContain(t.task_id);
    for (const path of [
      '/v1/tenants/acme/namespaces/A/tasks',
      '/v1/tenants/ACME/namespaces/a/tasks',
      '/v1/tenants/acme/namespaces/a%2F..%2Fb/tasks',
      '/v1/tenants/acme/namespaces/b/tasks',
      '/v1/tenants/acme/namespaces/a%20/tasks',
    ]) {
      const reply = await raw(KEYS.a, path);
      expect([path, reply.status]).toEqual([path, reply.status === 400 ? 400 : 403]);
    }
    // A dot segment resolves before authorization: b/../a is a, a/../b is b.
    const toB = await raw(KEYS.a, '/v1/tenants/acme/namespaces/a/../b/tasks');
    expect(toB.status).toBe(403);
    // Another tenant with the same namespace name sees none of a's tasks.
    const g = await call<TaskPage>(KEYS.globex, 'GET', `${scopePath(G)}/tasks?label.team=red`);
    expect(g.body.tasks.map((x) => x.task_id)).not.toContain(t.task_id);
    for (const suffix of ['', '/snapshot', '/history', '/result', '/completion-subscriptions']) {
      const foreign = await call(KEYS.globex, 'GET', `${scopePath(G)}/tasks/${t.task_id}${suffix}`);
      const missing = await call(KEYS.globex, 'GET', `${scopePath(G)}/tasks/rt-missing${suffix}`);
      expect([
        suffix,
        foreign.status,
        foreign.body.code,
        foreign.body.detail?.replace(t.task_id, 'X'),
      ]).toEqual([
        suffix,
        missing.status,
        missing.body.code,
        missing.body.detail?.replace('rt-missing', 'X'),
      ]);
      expect(foreign.status).toBe(404);
    }
  });
});

describe('completion subscriptions across scopes', () => {
  it('subscribe and redeliver of another scope are answered like missing ones', async () => {
    const t = await submit(KEYS.b, B);
    const sub = await call(
      KEYS.b,
      'POST',
      `${scopePath(B)}/tasks/${t.task_id}/completion-subscriptions`,
      {
        subscription_key: 'k1',
        destination: 'billing',
      },
    );
    expect(sub.status).toBe(201);
    const subscribe = await call(
      KEYS.a,
      'POST',
      `${scopePath(A)}/tasks/${t.task_id}/completion-subscriptions`,
      {
        subscription_key: 'k2',
        destination: 'billing',
      },
    );
    expect(missingLike(subscribe)).toEqual([404, 'not_found']);
    for (const [key, scope] of [
      [KEYS.a, A],
      [KEYS.star, A],
      [KEYS.globex, G],
    ] as const) {
      const redeliver = await call(
        key,
        'POST',
        `${scopePath(scope)}/completion-subscriptions/${sub.body.id}/redeliver`,
        {
          generation: 1,
        },
      );
      const missing = await call(
        key,
        'POST',
        `${scopePath(scope)}/completion-subscriptions/rt-missing/redeliver`,
        {
          generation: 1,
        },
      );
      expect(missingLike(redeliver)).toEqual(missingLike(missing));
      expect(redeliver.status).toBe(404);
    }
    const list = await call(
      KEYS.b,
      'GET',
      `${scopePath(B)}/tasks/${t.task_id}/completion-subscriptions`,
    );
    expect(list.body.map((s: { subscription_key: string }) => s.subscription_key)).toEqual(['k1']);
  });
});

describe('roles', () => {
  it('each role is refused on the routes of the others', async () => {
    const t = await submit(KEYS.star, A);
    const s = await session(KEYS.star, A);
    const worker = [
      ['POST', '/v1/worker/sessions', { scope: A, queue: 'q', concurrency: 1 }],
      ['POST', `/v1/worker/sessions/${s.id}/extend`, { scope: A }],
      [
        'POST',
        '/v1/worker/acquire',
        { scope: A, queue: 'q', worker_session_id: s.id, consumer_id: 0, sequence: 1 },
      ],
    ] as const;
    for (const [method, path, body] of worker) {
      const reply = await call(KEYS.clientOnly, method, path, body);
      expect([path, reply.status]).toEqual([path, 403]);
    }
    const client = [
      [
        'POST',
        `${scopePath(A)}/tasks`,
        { idempotency_key: 'role', input: { ...A, queue: 'q', program: { name: 'p' }, data: 1 } },
      ],
      ['GET', `${scopePath(A)}/tasks`, undefined],
      ['GET', `${scopePath(A)}/tasks/${t.task_id}`, undefined],
      ['POST', `${scopePath(A)}/tasks/${t.task_id}/cancel`, undefined],
    ] as const;
    for (const [method, path, body] of client) {
      const reply = await call(KEYS.workerOnly, method, path, body);
      expect([path, reply.status]).toEqual([path, 403]);
    }
    for (const key of [KEYS.clientOnly, KEYS.workerOnly, KEYS.star]) {
      const reply = await call(key, 'GET', `${scopePath(A)}/retention-policy`);
      expect(reply.status).toBe(403);
    }
    expect((await call(KEYS.admin, 'GET', `${scopePath(A)}/retention-policy`)).status).toBe(200);
  });
});

describe('foreign tasks on the remaining client routes', () => {
  it('cancel, result?wait_ms, attempts and filters of a foreign task answer like a missing one and change nothing', async () => {
    const { task, assignment } = await assign(KEYS.b, B);
    const queued = await submit(KEYS.b, B, { labels: { team: 'blue' } });
    const before = [await state(B, task.task_id), await state(B, queued.task_id)];
    for (const [key, scope] of [
      [KEYS.a, A],
      [KEYS.star, A],
      [KEYS.globex, G],
    ] as const) {
      for (const id of [task.task_id, queued.task_id]) {
        const pairs: [Reply, Reply][] = [
          [
            await call(key, 'POST', `${scopePath(scope)}/tasks/${id}/cancel`),
            await call(key, 'POST', `${scopePath(scope)}/tasks/rt-missing/cancel`),
          ],
          [
            await call(key, 'GET', `${scopePath(scope)}/tasks/${id}/result?wait_ms=200`),
            await call(key, 'GET', `${scopePath(scope)}/tasks/rt-missing/result?wait_ms=200`),
          ],
          [
            await call(
              key,
              'GET',
              `${scopePath(scope)}/tasks/${id}/attempts/${assignment.lease.owner.attempt_id}`,
            ),
            await call(
              key,
              'GET',
              `${scopePath(scope)}/tasks/rt-missing/attempts/${assignment.lease.owner.attempt_id}`,
            ),
          ],
        ];
        for (const [foreign, missing] of pairs) {
          expect(missingLike(foreign)).toEqual(missingLike(missing));
          expect(foreign.status).toBe(404);
        }
      }
      const filtered = await call<TaskPage>(
        key,
        'GET',
        `${scopePath(scope)}/tasks?label.team=blue&queue=q`,
      );
      expect(filtered.status).toBe(200);
      expect(filtered.body.tasks.map((x) => x.task_id)).not.toContain(queued.task_id);
    }
    expect([await state(B, task.task_id), await state(B, queued.task_id)]).toEqual(before);
  });

  it('an admin key bound to one namespace reads and sets only its own retention policy', async () => {
    // The admin key of the file is bound to every namespace; a one-namespace admin is the globex
    // key's counterpart here: another tenant's admin routes are 403.
    const own = await call(KEYS.admin, 'PUT', `${scopePath(A)}/retention-policy`, {
      retention_ms: 7_200_000,
    });
    expect(own.status).toBe(200);
    const foreign = await call(KEYS.globex, 'PUT', `${scopePath(A)}/retention-policy`, {
      retention_ms: 3_600_000,
    });
    expect(foreign.status).toBe(403);
    const preview = await call(KEYS.globex, 'GET', `${scopePath(A)}/retention-policy/preview`);
    expect(preview.status).toBe(403);
    const after = await call(KEYS.admin, 'GET', `${scopePath(A)}/retention-policy`);
    expect(after.body.retention_ms).toBe(7_200_000);
  });
});

describe('acquire:batch?wait_ms with an item naming a foreign session', () => {
  it("parks the batch's valid slots until a task arrives (DESIGN §6: parks until a slot is assigned or the wait ends)", async () => {
    const queue = `park-${++counter}`;
    const sa = await session(KEYS.star, A, queue);
    const sb = await session(KEYS.b, B, queue);
    const poll = (s: WorkerSession, consumer: number) => ({
      scope: A,
      queue,
      worker_session_id: s.id,
      consumer_id: consumer,
      sequence: 1,
    });
    // Slot 0 of a's own session, and an item naming b's session in scope a (404, like a missing one).
    const parked = call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=10000', {
      commands: [poll(sa, 0), poll(sb, 0)],
    });
    let answered = false;
    void parked.then(() => {
      answered = true;
    });
    // The task arrives while the batch should be parked.
    await new Promise((resolve) => setTimeout(resolve, 500));
    const answeredBeforeTheTask = answered;
    const task = await submit(KEYS.star, A, { queue });
    const reply = await parked;
    expect(reply.status).toBe(200);
    expect([reply.body.replies[1].status, reply.body.replies[1].code]).toEqual([
      404,
      'session_not_found',
    ]);
    expect({ answeredBeforeTheTask, first: reply.body.replies[0].disposition }).toEqual({
      answeredBeforeTheTask: false,
      first: 'assigned',
    });
    expect(reply.body.replies[0].assignment.lease.owner.task_id).toBe(task.task_id);
  });

  it('parks the free slot of a batch whose other slot is consumer_busy', async () => {
    const queue = `park-${++counter}`;
    const held = await submit(KEYS.star, A, { queue });
    const sa = await session(KEYS.star, A, queue);
    const poll = (consumer: number, sequence: number) => ({
      scope: A,
      queue,
      worker_session_id: sa.id,
      consumer_id: consumer,
      sequence,
    });
    const first = await call(KEYS.star, 'POST', '/v1/worker/acquire', poll(1, 1));
    expect(first.body.assignment.lease.owner.task_id).toBe(held.task_id);
    // Slot 1 still holds its attempt (a worker's slot state can lag, e.g. during quiescence).
    const parked = call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=10000', {
      commands: [poll(0, 1), poll(1, 2)],
    });
    await new Promise((resolve) => setTimeout(resolve, 500));
    const task = await submit(KEYS.star, A, { queue });
    const reply = await parked;
    expect(reply.body.replies[1].code).toBe('consumer_busy');
    expect(reply.body.replies[0].disposition).toBe('assigned');
    expect(reply.body.replies[0].assignment.lease.owner.task_id).toBe(task.task_id);
  });

  it('parks the same batch without the foreign item (control)', async () => {
    const queue = `park-${++counter}`;
    const sa = await session(KEYS.star, A, queue);
    const parked = call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=10000', {
      commands: [{ scope: A, queue, worker_session_id: sa.id, consumer_id: 0, sequence: 1 }],
    });
    await new Promise((resolve) => setTimeout(resolve, 500));
    const task = await submit(KEYS.star, A, { queue });
    const reply = await parked;
    expect(reply.body.replies[0].disposition).toBe('assigned');
    expect(reply.body.replies[0].assignment.lease.owner.task_id).toBe(task.task_id);
  });
});

describe('names that differ only by Unicode normalisation or case', () => {
  it('are different tenants and namespaces: no row, session or owner of one is reachable from the other', async () => {
    const nfc: Scope = { tenant_id: NFC, namespace: NFC };
    const nfd: Scope = { tenant_id: NFD, namespace: NFD };
    const upper: Scope = { tenant_id: 'acme', namespace: 'A' };
    for (const [key, mine, theirs, theirKey] of [
      [KEYS.nfc, nfc, nfd, KEYS.nfd],
      [KEYS.upper, upper, A, KEYS.a],
    ] as const) {
      const { task, session: s, assignment } = await assign(theirKey, theirs);
      const before = await call(
        theirKey,
        'GET',
        `${scopePath(theirs)}/tasks/${task.task_id}/history`,
      );
      // Their scope: 403. Their ids in my scope: like missing ones.
      expect((await call(key, 'GET', `${scopePath(theirs)}/tasks`)).status).toBe(403);
      const mineList = await call<TaskPage>(key, 'GET', `${scopePath(mine)}/tasks`);
      expect(mineList.body.tasks.map((t) => t.task_id)).not.toContain(task.task_id);
      expect((await call(key, 'GET', `${scopePath(mine)}/tasks/${task.task_id}`)).status).toBe(404);
      expect(
        (await call(key, 'POST', `${scopePath(mine)}/tasks/${task.task_id}/cancel`)).status,
      ).toBe(404);
      const owner = { ...assignment.lease.owner, scope: mine };
      const renew = await call(key, 'POST', '/v1/worker/renew', {
        owner,
        sequence: 1,
        intent: 'dispatch',
      });
      expect([404, 409]).toContain(renew.status);
      const extend = await call(key, 'POST', `/v1/worker/sessions/${s.id}/extend`);
      expect(missingLike(extend)).toEqual([404, 'session_not_found']);
      const after = await call(
        theirKey,
        'GET',
        `${scopePath(theirs)}/tasks/${task.task_id}/history`,
      );
      expect(after.body).toEqual(before.body);
    }
  });
});
