/**
 * Every route of DESIGN §6, called by keys bound to acme/x (one namespace), acme/*
 * and globex/*, with ids copied from victims in acme/y and globex/x. Each foreign id is answered
 * exactly as an id that exists nowhere (status, whole problem body except request_id, with the
 * id itself masked), no slower (result?wait_ms), and nothing of the victim changes.
 */
import type {
  AcquireReply,
  Assignment,
  Scope,
  TaskSnapshot,
  WorkerSession,
} from '@ledgence/contracts';
import { beforeAll, describe, expect, it } from 'vitest';
import { keyedServer, type KeyedReply as Reply } from './testdata/keyed-server.js';

const KEYS = {
  ax: 'tm-acme-x-key-000000001',
  astar: 'tm-acme-star-key-0000001',
  ay: 'tm-acme-y-key-000000001',
  gstar: 'tm-globex-star-key-00001',
  gx: 'tm-globex-x-key-00000001',
  aClient: 'tm-acme-x-client-000001',
  aWorker: 'tm-acme-x-worker-000001',
  aAdminX: 'tm-acme-x-admin-0000001',
} as const;
const CW = ['client', 'worker'];
const server = keyedServer('tm_matrix', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEYS.ax, tenant: 'acme', namespaces: ['x'], roles: CW },
    { key: KEYS.astar, tenant: 'acme', namespaces: ['*'], roles: CW },
    { key: KEYS.ay, tenant: 'acme', namespaces: ['y'], roles: CW },
    { key: KEYS.gstar, tenant: 'globex', namespaces: ['*'], roles: CW },
    { key: KEYS.gx, tenant: 'globex', namespaces: ['x'], roles: CW },
    { key: KEYS.aClient, tenant: 'acme', namespaces: ['x'], roles: ['client'] },
    { key: KEYS.aWorker, tenant: 'acme', namespaces: ['x'], roles: ['worker'] },
    { key: KEYS.aAdminX, tenant: 'acme', namespaces: ['x'], roles: ['admin'] },
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
const call = server.call;

const AX: Scope = { tenant_id: 'acme', namespace: 'x' };
const AY: Scope = { tenant_id: 'acme', namespace: 'y' };
const GX: Scope = { tenant_id: 'globex', namespace: 'x' };
const sp = (s: Scope) =>
  `/v1/tenants/${encodeURIComponent(s.tenant_id)}/namespaces/${encodeURIComponent(s.namespace)}`;

let n = 0;
async function submit(key: string, scope: Scope, queue = 'q'): Promise<TaskSnapshot> {
  const r = await call<TaskSnapshot>(key, 'POST', `${sp(scope)}/tasks`, {
    idempotency_key: `k-${++n}`,
    input: { ...scope, queue, program: { name: 'p' }, data: { n } },
  });
  expect(r.status).toBe(201);
  return r.body;
}
async function open(key: string, scope: Scope, queue: string): Promise<WorkerSession> {
  const r = await call<WorkerSession>(key, 'POST', '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 2,
  });
  expect(r.status).toBe(200);
  return r.body;
}
async function assign(key: string, scope: Scope) {
  const queue = `q-${++n}`;
  const task = await submit(key, scope, queue);
  const session = await open(key, scope, queue);
  const r = await call<AcquireReply>(key, 'POST', '/v1/worker/acquire', {
    scope,
    queue,
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  const assignment = (r.body as { assignment: Assignment }).assignment;
  expect(assignment.lease.owner.task_id).toBe(task.task_id);
  return { task, session, assignment, queue };
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

interface Victim {
  scope: Scope;
  key: string;
  active: Awaited<ReturnType<typeof assign>>;
  done: Awaited<ReturnType<typeof assign>>;
  queued: TaskSnapshot;
  subscription: string;
}
const victims: Victim[] = [];

beforeAll(async () => {
  for (const [scope, key] of [
    [AY, KEYS.ay],
    [GX, KEYS.gx],
  ] as const) {
    const active = await assign(key, scope);
    const done = await assign(key, scope);
    const settled = await call(
      key,
      'POST',
      '/v1/worker/settle',
      settleBody(done.assignment.lease.owner),
    );
    expect(settled.status).toBe(200);
    const queued = await submit(key, scope);
    const sub = await call(
      key,
      'POST',
      `${sp(scope)}/tasks/${done.task.task_id}/completion-subscriptions`,
      {
        subscription_key: 's1',
        destination: 'billing',
      },
    );
    expect(sub.status).toBe(201);
    victims.push({ scope, key, active, done, queued, subscription: sub.body.id });
  }
}, 60_000);

/** The reply with its request id dropped and every given id replaced by ID. */
function shape(reply: Reply, ids: readonly string[]) {
  let text = JSON.stringify({ status: reply.status, body: reply.body ?? null }, (k, v) =>
    k === 'request_id' ? undefined : v,
  );
  for (const id of ids) text = text.split(id).join('ID');
  return JSON.parse(text);
}

async function victimState(v: Victim) {
  const out: unknown[] = [];
  for (const id of [v.active.task.task_id, v.done.task.task_id, v.queued.task_id]) {
    out.push((await call(v.key, 'GET', `${sp(v.scope)}/tasks/${id}/snapshot`)).body);
    out.push((await call(v.key, 'GET', `${sp(v.scope)}/tasks/${id}/history`)).body);
    // The sender keeps retrying the dead destination in the background: its counters move.
    const subs = (await call(v.key, 'GET', `${sp(v.scope)}/tasks/${id}/completion-subscriptions`))
      .body;
    out.push(
      subs.map(
        ({
          attempts: _a,
          next_attempt_at: _n,
          state: _s,
          last_error: _e,
          ...rest
        }: Record<string, unknown>) => rest,
      ),
    );
  }
  return out;
}

const ATTACKERS = [
  ['acme/x key', KEYS.ax, AX],
  ['acme/* key in x', KEYS.astar, AX],
  ['acme/* key in z', KEYS.astar, { tenant_id: 'acme', namespace: 'z' }],
  ['globex/* key in y', KEYS.gstar, { tenant_id: 'globex', namespace: 'y' }],
] as const;

describe('every client route, foreign id vs missing id, whole bodies', () => {
  it('answers a foreign id exactly like a missing one, at once, and changes nothing', async () => {
    const before = await Promise.all(victims.map(victimState));
    const diffs: unknown[] = [];
    for (const v of victims) {
      for (const [name, key, scope] of ATTACKERS) {
        if (scope.tenant_id === v.scope.tenant_id && scope.namespace === v.scope.namespace)
          continue;
        const base = sp(scope);
        const attempt = v.done.assignment.lease.owner.attempt_id;
        const ownTask = await submit(key, scope);
        for (const id of [v.active.task.task_id, v.done.task.task_id, v.queued.task_id]) {
          const ghost = 'tsk_0000000000000000000000000000dead';
          const routes: [string, string, unknown?][] = [
            ['GET', `/tasks/ID`],
            ['GET', `/tasks/ID/result`],
            ['GET', `/tasks/ID/result?wait_ms=1500`],
            ['GET', `/tasks/ID/snapshot`],
            ['GET', `/tasks/ID/history`],
            ['GET', `/tasks/ID/history?after_sequence=1`],
            ['GET', `/tasks/ID/attempts/${attempt}`],
            ['POST', `/tasks/ID/cancel`],
            ['POST', `/tasks/ID/cancel`, {}],
            ['GET', `/tasks/ID/completion-subscriptions`],
            [
              'POST',
              `/tasks/ID/completion-subscriptions`,
              { subscription_key: 's1', destination: 'billing' },
            ],
            [
              'POST',
              `/tasks/ID/completion-subscriptions`,
              { subscription_key: 's1', destination: 'nope' },
            ],
          ];
          for (const [method, path, body] of routes) {
            const t0 = performance.now();
            const foreign = await call(key, method, base + path.replace('ID', id), body);
            const t1 = performance.now();
            const missing = await call(key, method, base + path.replace('ID', ghost), body);
            const t2 = performance.now();
            const f = shape(foreign, [id, ghost]);
            const m = shape(missing, [id, ghost]);
            if (JSON.stringify(f) !== JSON.stringify(m) || ![400, 404].includes(f.status)) {
              diffs.push({ name, method, path, foreign: f, missing: m });
            }
            if (Math.abs(t1 - t0 - (t2 - t1)) > 700) {
              diffs.push({ name, path, timing: [t1 - t0, t2 - t1] });
            }
          }
        }
        // A foreign attempt id on a task of my own scope, vs a made-up one.
        const fa = await call(key, 'GET', `${base}/tasks/${ownTask.task_id}/attempts/${attempt}`);
        const ma = await call(
          key,
          'GET',
          `${base}/tasks/${ownTask.task_id}/attempts/att_00000000000000000000000000000dead`,
        );
        const fas = shape(fa, [attempt, 'att_00000000000000000000000000000dead']);
        const mas = shape(ma, [attempt, 'att_00000000000000000000000000000dead']);
        if (JSON.stringify(fas) !== JSON.stringify(mas)) diffs.push({ name, attempt: [fas, mas] });
        // Redeliver of a foreign subscription id, every generation shape.
        for (const body of [{ generation: 1 }, { generation: 2 }, { generation: 99 }]) {
          const ghost = 'sub_0000000000000000000000000000dead';
          const f = await call(
            key,
            'POST',
            `${base}/completion-subscriptions/${v.subscription}/redeliver`,
            body,
          );
          const m = await call(
            key,
            'POST',
            `${base}/completion-subscriptions/${ghost}/redeliver`,
            body,
          );
          const fs = shape(f, [v.subscription, ghost]);
          const ms = shape(m, [v.subscription, ghost]);
          if (JSON.stringify(fs) !== JSON.stringify(ms) || ![400, 404].includes(fs.status))
            diffs.push({ name, redeliver: body, foreign: fs, missing: ms });
        }
      }
    }
    expect(diffs).toEqual([]);
    expect(await Promise.all(victims.map(victimState))).toEqual(before);
  }, 240_000);

  it('a scope outside the binding is 403 with the same body whether the id exists there or not', async () => {
    const diffs: unknown[] = [];
    for (const v of victims) {
      for (const key of [KEYS.ax, KEYS.gstar, KEYS.astar]) {
        if (key === KEYS.astar && v.scope.tenant_id === 'acme') continue;
        if (key === KEYS.gstar && v.scope.tenant_id === 'globex') continue;
        const base = sp(v.scope);
        const id = v.done.task.task_id;
        const ghost = 'tsk_0000000000000000000000000000dead';
        for (const [method, path, body] of [
          ['GET', '/tasks/ID'],
          ['GET', '/tasks/ID/result?wait_ms=1000'],
          ['GET', '/tasks/ID/history'],
          ['POST', '/tasks/ID/cancel'],
          ['GET', '/tasks/ID/completion-subscriptions'],
          ['GET', `/tasks/ID/attempts/${v.done.assignment.lease.owner.attempt_id}`],
        ] as [string, string, unknown?][]) {
          const f = shape(await call(key, method, base + path.replace('ID', id), body), [
            id,
            ghost,
          ]);
          const m = shape(await call(key, method, base + path.replace('ID', ghost), body), [
            id,
            ghost,
          ]);
          if (JSON.stringify(f) !== JSON.stringify(m) || f.status !== 403)
            diffs.push({ key, path, f, m });
        }
      }
    }
    expect(diffs).toEqual([]);
  });
});

describe('worker routes with owners, sessions copied from another tenant/namespace', () => {
  it('renew/settle/quiescence (single and batch) of a re-scoped foreign owner answer like a ghost owner, whole bodies', async () => {
    const before = await Promise.all(victims.map(victimState));
    const diffs: unknown[] = [];
    for (const v of victims) {
      for (const [name, key, scope] of ATTACKERS) {
        for (const which of [v.active, v.done]) {
          const real = which.assignment.lease.owner;
          const owner = { ...real, scope };
          const ghost = {
            ...owner,
            task_id: 'tsk_0000000000000000000000000000dead',
            attempt_id: 'att_00000000000000000000000000000dead',
            lease_id: 'lse_00000000000000000000000000000dead',
            worker_session_id: 'wss_0000000000000000000000000000dead',
          };
          const mask = [
            real.task_id,
            real.attempt_id,
            real.lease_id,
            real.worker_session_id,
            ghost.task_id,
            ghost.attempt_id,
            ghost.lease_id,
            ghost.worker_session_id,
          ].filter((s): s is string => typeof s === 'string');
          for (const [path, bodyOf] of [
            ['/v1/worker/renew', (o: object) => ({ owner: o, sequence: 1, intent: 'dispatch' })],
            ['/v1/worker/renew', (o: object) => ({ owner: o, sequence: 7, intent: 'keep_alive' })],
            ['/v1/worker/settle', (o: object) => settleBody(o as Record<string, unknown>)],
            ['/v1/worker/quiescence', (o: object) => o],
            [
              '/v1/worker/renew:batch',
              (o: object) => ({ commands: [{ owner: o, sequence: 1, intent: 'keep_alive' }] }),
            ],
            [
              '/v1/worker/settle:batch',
              (o: object) => ({ commands: [settleBody(o as Record<string, unknown>, 'op-b')] }),
            ],
          ] as const) {
            const f = shape(await call(key, 'POST', path, bodyOf(owner)), mask);
            const m = shape(await call(key, 'POST', path, bodyOf(ghost)), mask);
            if (JSON.stringify(f) !== JSON.stringify(m)) diffs.push({ name, path, f, m });
          }
        }
        // A foreign session id: extend and acquire in my scope.
        const sid = v.active.session.id;
        const gs = 'wss_0000000000000000000000000000dead';
        const pairs: [string, (s: string) => unknown][] = [
          [`/v1/worker/sessions/ID/extend`, () => ({ scope })],
          [
            '/v1/worker/acquire?wait_ms=0',
            (s) => ({
              scope,
              queue: v.active.queue,
              worker_session_id: s,
              consumer_id: 1,
              sequence: 1,
            }),
          ],
          [
            '/v1/worker/acquire:batch?wait_ms=0',
            (s) => ({
              commands: [
                { scope, queue: v.active.queue, worker_session_id: s, consumer_id: 1, sequence: 1 },
              ],
            }),
          ],
        ];
        for (const [path, bodyOf] of pairs) {
          const f = shape(await call(key, 'POST', path.replace('ID', sid), bodyOf(sid)), [sid, gs]);
          const m = shape(await call(key, 'POST', path.replace('ID', gs), bodyOf(gs)), [sid, gs]);
          if (JSON.stringify(f) !== JSON.stringify(m)) diffs.push({ name, path, f, m });
        }
      }
    }
    expect(diffs).toEqual([]);
    expect(await Promise.all(victims.map(victimState))).toEqual(before);
  }, 240_000);

  it('the victim owner sent unchanged (its own scope) is 403 from every foreign key, the same as a ghost', async () => {
    const diffs: unknown[] = [];
    for (const v of victims) {
      const real = v.active.assignment.lease.owner;
      const ghost = { ...real, task_id: 'tsk_0000000000000000000000000000dead' };
      for (const key of [KEYS.ax, v.scope.tenant_id === 'acme' ? KEYS.gstar : KEYS.astar]) {
        for (const [path, bodyOf] of [
          ['/v1/worker/renew', (o: object) => ({ owner: o, sequence: 1, intent: 'dispatch' })],
          ['/v1/worker/settle', (o: object) => settleBody(o as Record<string, unknown>)],
          ['/v1/worker/quiescence', (o: object) => o],
          ['/v1/worker/sessions/ID/extend', () => ({ scope: v.scope })],
        ] as const) {
          const f = await call(
            key,
            'POST',
            path.replace('ID', real.worker_session_id as string),
            bodyOf(real),
          );
          const m = await call(key, 'POST', path.replace('ID', 'wss_x'), bodyOf(ghost));
          const fs = shape(f, [
            real.task_id,
            ghost.task_id,
            real.worker_session_id as string,
            'wss_x',
          ]);
          const ms = shape(m, [
            real.task_id,
            ghost.task_id,
            real.worker_session_id as string,
            'wss_x',
          ]);
          if (JSON.stringify(fs) !== JSON.stringify(ms) || fs.status !== 403)
            diffs.push({ key, path, fs, ms });
        }
      }
    }
    expect(diffs).toEqual([]);
  });
});

describe('roles, per route', () => {
  it('a client-only key gets 403 on every worker route and a worker-only key on every client route', async () => {
    const t = await submit(KEYS.ax, AX);
    const s = await open(KEYS.ax, AX, 'rq');
    const ownerX = (await assign(KEYS.ax, AX)).assignment.lease.owner as unknown as Record<
      string,
      unknown
    >;
    const worker: [string, unknown][] = [
      ['/v1/worker/sessions', { scope: AX, queue: 'q', concurrency: 1 }],
      [`/v1/worker/sessions/${s.id}/extend`, {}],
      [
        '/v1/worker/acquire',
        { scope: AX, queue: 'rq', worker_session_id: s.id, consumer_id: 0, sequence: 1 },
      ],
      [
        '/v1/worker/acquire:batch',
        {
          commands: [
            { scope: AX, queue: 'rq', worker_session_id: s.id, consumer_id: 0, sequence: 1 },
          ],
        },
      ],
      [
        '/v1/worker/renew:batch',
        { commands: [{ owner: ownerX, sequence: 1, intent: 'keep_alive' }] },
      ],
      ['/v1/worker/settle:batch', { commands: [settleBody(ownerX)] }],
    ];
    const bad: unknown[] = [];
    for (const [path, body] of worker) {
      const r = await call(KEYS.aClient, 'POST', path, body);
      if (r.status !== 403) bad.push({ path, status: r.status, body: r.body });
    }
    const client: [string, string, unknown?][] = [
      ['GET', `${sp(AX)}/tasks/${t.task_id}/result?wait_ms=0`],
      ['GET', `${sp(AX)}/tasks/${t.task_id}/history`],
      ['GET', `${sp(AX)}/tasks/${t.task_id}/snapshot`],
      ['GET', `${sp(AX)}/tasks/${t.task_id}/completion-subscriptions`],
      [
        'POST',
        `${sp(AX)}/tasks/${t.task_id}/completion-subscriptions`,
        { subscription_key: 'x', destination: 'billing' },
      ],
      ['POST', `${sp(AX)}/completion-subscriptions/sub_x/redeliver`, { generation: 1 }],
      [
        'POST',
        `${sp(AX)}/tasks:batch`,
        {
          commands: [
            {
              idempotency_key: 'rb',
              input: { ...AX, queue: 'q', program: { name: 'p' }, data: 1 },
            },
          ],
        },
      ],
      ['GET', `${sp(AX)}/retention-policy`],
    ];
    for (const [method, path, body] of client) {
      const r = await call(KEYS.aWorker, method, path, body);
      if (r.status !== 403) bad.push({ path, status: r.status, body: r.body });
    }
    // Empty batches: must a role-less caller still be told 403 (not 200 {results: []})?
    expect(bad).toEqual([]);
    // An admin key bound to x: its own retention policy yes, y's no.
    expect((await call(KEYS.aAdminX, 'GET', `${sp(AX)}/retention-policy`)).status).toBe(200);
    expect((await call(KEYS.aAdminX, 'GET', `${sp(AY)}/retention-policy`)).status).toBe(403);
    expect((await call(KEYS.aAdminX, 'GET', `${sp(AY)}/retention-policy/preview`)).status).toBe(
      403,
    );
  });
});
