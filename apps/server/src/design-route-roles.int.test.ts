/**
 * The role column of DESIGN §6's route tables, row by row, over the real server: each route is
 * refused (403, reason `role`) to a key bound to the scope but holding only the other role, and
 * passes authorization for a key holding exactly its role, and for an admin key (admin holds
 * every role). The operations routes need no key at all. Batch routes take the role of their
 * single-command route.
 */
import type {
  AcquireReply,
  Assignment,
  Scope,
  TaskSnapshot,
  WorkerSession,
} from '@ledgence/contracts';
import { beforeAll, describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEYS = {
  client: 'rr-acme-client-key-0000001',
  worker: 'rr-acme-worker-key-0000001',
  admin: 'rr-acme-admin-key-00000001',
} as const;
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const SCOPE = `/v1/tenants/${A.tenant_id}/namespaces/${A.namespace}`;

const server = keyedServer('route_roles', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEYS.client, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
    { key: KEYS.worker, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
    { key: KEYS.admin, tenant: 'acme', namespaces: ['*'], roles: ['admin'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    billing: {
      url: 'http://127.0.0.1:9/hook',
      secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
    },
  }),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});

interface Row {
  method: string;
  path: string;
  role: 'client' | 'worker';
  json?: unknown;
}

let task: TaskSnapshot;
let session: WorkerSession;
let assignment: Assignment;
let subscriptionId: string;
let n = 0;

/** A fresh, valid command for each call, so the permitted keys are answered 2xx. */
const submitCommand = () => ({
  idempotency_key: `rr-${++n}`,
  input: { ...A, queue: 'other', program: { name: 'p' }, data: n },
});

beforeAll(async () => {
  const submitted = await server.call(KEYS.admin, 'POST', `${SCOPE}/tasks`, {
    idempotency_key: 'rr-task',
    input: { ...A, queue: 'q', program: { name: 'p' }, data: 0 },
  });
  task = submitted.body;
  session = (
    await server.call(KEYS.admin, 'POST', '/v1/worker/sessions', {
      scope: A,
      queue: 'q',
      concurrency: 4,
    })
  ).body;
  const reply = await server.call<AcquireReply>(KEYS.admin, 'POST', '/v1/worker/acquire', {
    scope: A,
    queue: 'q',
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  assignment = (reply.body as { assignment: Assignment }).assignment;
  const subscribed = await server.call(
    KEYS.admin,
    'POST',
    `${SCOPE}/tasks/${task.task_id}/completion-subscriptions`,
    { subscription_key: 'rr', destination: 'billing' },
  );
  subscriptionId = subscribed.body.id;
});

/** DESIGN §6's rows with a request each; built once the fixture exists. */
function rows(): Row[] {
  const t = `${SCOPE}/tasks/${task.task_id}`;
  const owner = assignment.lease.owner;
  const poll = (sequence: number) => ({
    scope: A,
    queue: 'q',
    worker_session_id: session.id,
    consumer_id: 1,
    sequence,
  });
  return [
    { method: 'POST', path: `${SCOPE}/tasks`, role: 'client', json: submitCommand() },
    {
      method: 'GET',
      path: `${SCOPE}/tasks?state=active&queue=q&program=p&label.k=v&limit=5`,
      role: 'client',
    },
    { method: 'GET', path: t, role: 'client' },
    { method: 'GET', path: `${t}/result?wait_ms=0`, role: 'client' },
    { method: 'GET', path: `${t}/snapshot`, role: 'client' },
    { method: 'GET', path: `${t}/attempts/${owner.attempt_id}`, role: 'client' },
    { method: 'GET', path: `${t}/history?after_sequence=0`, role: 'client' },
    { method: 'POST', path: `${SCOPE}/tasks/tsk_not_there/cancel`, role: 'client' },
    {
      method: 'POST',
      path: `${t}/completion-subscriptions`,
      role: 'client',
      json: { subscription_key: 'rr', destination: 'billing' },
    },
    { method: 'GET', path: `${t}/completion-subscriptions`, role: 'client' },
    {
      method: 'POST',
      path: `${SCOPE}/completion-subscriptions/${subscriptionId}/redeliver`,
      role: 'client',
      json: { generation: 1 },
    },
    {
      method: 'POST',
      path: `${SCOPE}/tasks:batch`,
      role: 'client',
      json: { commands: [submitCommand()] },
    },
    {
      method: 'POST',
      path: '/v1/worker/sessions',
      role: 'worker',
      json: { scope: A, queue: 'q', concurrency: 1 },
    },
    {
      method: 'POST',
      path: `/v1/worker/sessions/${session.id}/extend`,
      role: 'worker',
      json: { scope: A },
    },
    { method: 'POST', path: '/v1/worker/acquire?wait_ms=0', role: 'worker', json: poll(1) },
    {
      method: 'POST',
      path: '/v1/worker/renew',
      role: 'worker',
      json: { owner, sequence: 1, intent: 'keep_alive' },
    },
    {
      method: 'POST',
      path: '/v1/worker/settle',
      role: 'worker',
      json: {
        owner: { ...owner, attempt_id: 'att_not_there' },
        operation_id: 'op',
        report: report(owner.task_id, 'att_not_there'),
        quiescence: 'confirmed',
        processing_trace: null,
      },
    },
    {
      method: 'POST',
      path: '/v1/worker/quiescence',
      role: 'worker',
      json: { ...owner, attempt_id: 'att_not_there' },
    },
    {
      method: 'POST',
      path: '/v1/worker/acquire:batch?wait_ms=0',
      role: 'worker',
      json: { commands: [poll(1)] },
    },
    {
      method: 'POST',
      path: '/v1/worker/renew:batch',
      role: 'worker',
      json: { commands: [{ owner, sequence: 1, intent: 'keep_alive' }] },
    },
    {
      method: 'POST',
      path: '/v1/worker/settle:batch',
      role: 'worker',
      json: {
        commands: [
          {
            owner: { ...owner, attempt_id: 'att_not_there' },
            operation_id: 'op',
            report: report(owner.task_id, 'att_not_there'),
            quiescence: 'confirmed',
            processing_trace: null,
          },
        ],
      },
    },
  ];
}

function report(taskId: string, attemptId: string) {
  return {
    kind: 'completed',
    report: {
      context: { identity: { task_id: taskId, attempt_id: attemptId } },
      outcome: { kind: 'success', output: null },
    },
  };
}

const OTHER = { client: KEYS.worker, worker: KEYS.client } as const;
const OWN = { client: KEYS.client, worker: KEYS.worker } as const;

describe('DESIGN §6 role column', () => {
  it('covers every /v1 route the server documents', async () => {
    const doc = (await server.call(KEYS.admin, 'GET', '/openapi.json')).body as {
      paths: Record<string, Record<string, unknown>>;
    };
    const documented = Object.entries(doc.paths)
      .filter(([path]) => path.startsWith('/v1/') && !path.includes('retention-policy'))
      .flatMap(([path, item]) => Object.keys(item).map((m) => `${m.toUpperCase()} ${path}`));
    const template = (path: string) =>
      path
        .split('?')[0]
        ?.replace(/\/tasks\/[^/:]+/, '/tasks/{task_id}')
        .replace(/\/attempts\/[^/]+/, '/attempts/{attempt_id}')
        .replace(/\/sessions\/[^/]+\/extend/, '/sessions/{session_id}/extend')
        .replace(
          /\/completion-subscriptions\/[^/]+\/redeliver/,
          '/completion-subscriptions/{subscription_id}/redeliver',
        )
        .replace('/tenants/acme/namespaces/a', '/tenants/{tenant_id}/namespaces/{namespace}');
    const tested = rows().map((r) => `${r.method} ${template(r.path)}`);
    expect([...new Set(tested)].sort()).toEqual([...new Set(documented)].sort());
  });

  it('refuses each route to a key holding only the other role (403 role), before anything is done', async () => {
    const before = (await server.call(KEYS.admin, 'GET', `${SCOPE}/tasks/${task.task_id}/snapshot`))
      .body;
    for (const row of rows()) {
      const reply = await server.call(OTHER[row.role], row.method, row.path, row.json);
      expect([row.method, row.path, reply.status, reply.body?.code, reply.body?.reason]).toEqual([
        row.method,
        row.path,
        403,
        'forbidden',
        'role',
      ]);
    }
    const after = (await server.call(KEYS.admin, 'GET', `${SCOPE}/tasks/${task.task_id}/snapshot`))
      .body;
    expect(after).toEqual(before);
  });

  it('lets a key holding exactly the route’s role, and an admin key, past authorization', async () => {
    for (const key of ['own', KEYS.admin] as const) {
      for (const row of rows()) {
        const reply = await server.call(
          key === 'own' ? OWN[row.role] : key,
          row.method,
          row.path,
          row.json,
        );
        expect([
          row.method,
          row.path,
          reply.status === 401 || reply.status === 403 || reply.status >= 500,
        ]).toEqual([row.method, row.path, false]);
      }
    }
  });

  it('serves the operations routes with no key', async () => {
    for (const path of ['/healthz', '/readyz', '/metrics', '/openapi.json']) {
      const reply = await fetch(`${server.url}${path}`);
      await reply.arrayBuffer();
      expect([path, reply.status]).toEqual([path, 200]);
    }
  });
});
