/**
 * DESIGN §6: "tenant and namespace come only from the verified credential's
 * binding"; an operator rebinds a key between two starts of the server (its namespace list
 * shrinks to another namespace; another key moves to another tenant). Sessions, leases and
 * tasks made under the old binding must be out of reach of the new one: refused (403 for a
 * scope the key no longer holds; as if missing for a re-scoped id), and nothing changes.
 */
import type {
  AcquireReply,
  Assignment,
  Scope,
  TaskSnapshot,
  WorkerSession,
} from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

// biome-ignore lint/suspicious/noExplicitAny: replies are read loosely
type Loose = any;

const K = 'tr-rebound-key-0000000001'; // acme/[x] → acme/[y]
const KT = 'tr-retenant-key-000000001'; // acme/* → globex/*
const OBS = 'tr-observer-key-00000001'; // acme/* admin, both runs
const CW = ['client', 'worker'];
const X: Scope = { tenant_id: 'acme', namespace: 'x' };
const Y: Scope = { tenant_id: 'acme', namespace: 'y' };
const GX: Scope = { tenant_id: 'globex', namespace: 'x' };
const sp = (s: Scope) => `/v1/tenants/${s.tenant_id}/namespaces/${s.namespace}`;

let db: TestDatabase;
let server: RunningServer | undefined;

async function start(keys: unknown[]): Promise<void> {
  const config = loadConfig(
    {
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_API_KEYS: JSON.stringify(keys),
      LEDGENCE_LEASE_DURATION_MS: '600000',
      LEDGENCE_CLEANUP_GRACE_MS: '600000',
    },
    (path) => {
      throw new Error(`no file ${path}`);
    },
  );
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
}

async function call(key: string, method: string, path: string, json?: unknown) {
  const headers: Record<string, string> = { authorization: `Bearer ${key}` };
  let body: string | undefined;
  if (json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const res = await fetch(`${server?.url}${path}`, { method, headers, body });
  const text = await res.text();
  return { status: res.status, body: (text.length === 0 ? undefined : JSON.parse(text)) as Loose };
}

/** Status and body without request_id, every given id replaced by ID. */
function shape(reply: { status: number; body: Loose }, ids: readonly string[]) {
  let text = JSON.stringify({ status: reply.status, body: reply.body ?? null }, (k, v) =>
    k === 'request_id' ? undefined : v,
  );
  for (const id of ids) text = text.split(id).join('ID');
  return JSON.parse(text);
}

function settleBody(owner: Record<string, unknown>) {
  return {
    owner,
    operation_id: 'op-restart',
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

let task: TaskSnapshot;
let queued: TaskSnapshot;
let session: WorkerSession;
let idle: WorkerSession;
let owner: Record<string, unknown> & { scope: Scope };

async function observe() {
  const out: unknown[] = [];
  for (const id of [task.task_id, queued.task_id]) {
    out.push((await call(OBS, 'GET', `${sp(X)}/tasks/${id}/snapshot`)).body);
    out.push((await call(OBS, 'GET', `${sp(X)}/tasks/${id}/history`)).body);
  }
  out.push(
    (await call(OBS, 'GET', `${sp(X)}/tasks/${task.task_id}/attempts/${String(owner.attempt_id)}`))
      .body,
  );
  return out;
}

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'tenancy_restart' });
  await start([
    { key: K, tenant: 'acme', namespaces: ['x'], roles: CW },
    { key: KT, tenant: 'acme', namespaces: ['*'], roles: CW },
    { key: OBS, tenant: 'acme', namespaces: ['*'], roles: ['admin'] },
  ]);
  const submitted = await call(K, 'POST', `${sp(X)}/tasks`, {
    idempotency_key: 'restart-1',
    input: { ...X, queue: 'q', program: { name: 'p' }, data: { n: 1 } },
  });
  expect(submitted.status).toBe(201);
  task = submitted.body;
  const opened = await call(K, 'POST', '/v1/worker/sessions', {
    scope: X,
    queue: 'q',
    concurrency: 2,
  });
  expect(opened.status).toBe(200);
  session = opened.body;
  const opened2 = await call(KT, 'POST', '/v1/worker/sessions', {
    scope: X,
    queue: 'q',
    concurrency: 1,
  });
  expect(opened2.status).toBe(200);
  idle = opened2.body;
  const acquired = await call(K, 'POST', '/v1/worker/acquire', {
    scope: X,
    queue: 'q',
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  const reply = acquired.body as AcquireReply;
  expect(reply.disposition).toBe('assigned');
  owner = (reply as { assignment: Assignment }).assignment.lease.owner as Loose;
  const renewed = await call(K, 'POST', '/v1/worker/renew', {
    owner,
    sequence: 1,
    intent: 'dispatch',
  });
  expect(renewed.status).toBe(200);
  const q2 = await call(K, 'POST', `${sp(X)}/tasks`, {
    idempotency_key: 'restart-2',
    input: { ...X, queue: 'other', program: { name: 'p' }, data: { n: 2 } },
  });
  expect(q2.status).toBe(201);
  queued = q2.body;
  await server?.stop();
  server = undefined;
  // The operator rebinds: K to acme/y only, KT to globex.
  await start([
    { key: K, tenant: 'acme', namespaces: ['y'], roles: CW },
    { key: KT, tenant: 'globex', namespaces: ['*'], roles: CW },
    { key: OBS, tenant: 'acme', namespaces: ['*'], roles: ['admin'] },
  ]);
}, 90_000);

afterAll(async () => {
  await server?.stop();
  await db?.drop();
});

const GHOST_SESSION = 'wss_0000000000000000000000000000dead';

describe('a key rebound across a restart', () => {
  it('the old namespace is 403 on every route, and re-scoped ids answer like missing ones; nothing changes', async () => {
    const before = await observe();
    const diffs: unknown[] = [];
    const ghostOwner = (scope: Scope) => ({
      ...owner,
      scope,
      task_id: 'tsk_0000000000000000000000000000dead',
      attempt_id: 'att_00000000000000000000000000000dead',
      lease_id: 'lse_00000000000000000000000000000dead',
      worker_session_id: GHOST_SESSION,
    });
    const mask = [
      String(owner.task_id),
      String(owner.attempt_id),
      String(owner.lease_id),
      String(owner.worker_session_id),
      'tsk_0000000000000000000000000000dead',
      'att_00000000000000000000000000000dead',
      'lse_00000000000000000000000000000dead',
      GHOST_SESSION,
      queued.task_id,
      idle.id,
    ];
    const workerRoutes: [string, (o: object) => unknown][] = [
      ['/v1/worker/renew', (o) => ({ owner: o, sequence: 2, intent: 'keep_alive' })],
      ['/v1/worker/renew', (o) => ({ owner: o, sequence: 1, intent: 'dispatch' })],
      ['/v1/worker/settle', (o) => settleBody(o as Record<string, unknown>)],
      ['/v1/worker/quiescence', (o) => o],
      [
        '/v1/worker/renew:batch',
        (o) => ({ commands: [{ owner: o, sequence: 2, intent: 'keep_alive' }] }),
      ],
      [
        '/v1/worker/settle:batch',
        (o) => ({ commands: [settleBody(o as Record<string, unknown>)] }),
      ],
    ];
    for (const [key, scopes] of [
      [K, [Y]],
      [KT, [GX, { tenant_id: 'globex', namespace: 'y' }]],
    ] as const) {
      // The owner as it was issued (scope acme/x): outside the binding now.
      for (const [path, bodyOf] of workerRoutes) {
        const f = await call(key, 'POST', path, bodyOf(owner));
        const m = await call(key, 'POST', path, bodyOf(ghostOwner(X)));
        const fs = shape(f, mask);
        const ms = shape(m, mask);
        const itemStatus = (r: Loose) => r.body?.results?.[0]?.status ?? r.status;
        if (JSON.stringify(fs) !== JSON.stringify(ms) || itemStatus(f) !== 403)
          diffs.push({ key, path, old: fs, ghost: ms });
      }
      // The owner re-scoped into what the key may use now: like a ghost owner there.
      for (const scope of scopes) {
        for (const [path, bodyOf] of workerRoutes) {
          const f = shape(await call(key, 'POST', path, bodyOf({ ...owner, scope })), mask);
          const m = shape(await call(key, 'POST', path, bodyOf(ghostOwner(scope))), mask);
          if (
            JSON.stringify(f) !== JSON.stringify(m) ||
            (f.status === 200 && path.indexOf(':batch') < 0)
          )
            diffs.push({ key, path, scope, rescoped: f, ghost: m });
        }
        // Sessions opened under the old binding: extend (with and without a body) and acquire.
        for (const sid of [session.id, idle.id]) {
          for (const [path, bodyOf] of [
            [`/v1/worker/sessions/ID/extend`, () => undefined],
            [`/v1/worker/sessions/ID/extend`, () => ({ scope })],
            [
              '/v1/worker/acquire?wait_ms=0',
              (s: string) => ({
                scope,
                queue: 'q',
                worker_session_id: s,
                consumer_id: 1,
                sequence: 1,
              }),
            ],
          ] as [string, (s: string) => unknown][]) {
            const f = shape(await call(key, 'POST', path.replace('ID', sid), bodyOf(sid)), mask);
            const m = shape(
              await call(key, 'POST', path.replace('ID', GHOST_SESSION), bodyOf(GHOST_SESSION)),
              mask,
            );
            if (JSON.stringify(f) !== JSON.stringify(m) || f.status === 200)
              diffs.push({ key, path, sid, scope, old: f, ghost: m });
          }
        }
        // The old tasks, named in the key's new scope: like missing ones.
        for (const id of [task.task_id, queued.task_id]) {
          for (const [method, path] of <const>[
            ['GET', '/tasks/ID'],
            ['GET', '/tasks/ID/snapshot'],
            ['GET', '/tasks/ID/history'],
            ['GET', '/tasks/ID/result?wait_ms=0'],
            ['POST', '/tasks/ID/cancel'],
          ]) {
            const ghost = 'tsk_0000000000000000000000000000dead';
            const f = shape(await call(key, method, sp(scope) + path.replace('ID', id)), [
              id,
              ghost,
            ]);
            const m = shape(await call(key, method, sp(scope) + path.replace('ID', ghost)), [
              id,
              ghost,
            ]);
            if (JSON.stringify(f) !== JSON.stringify(m) || f.status !== 404)
              diffs.push({ key, scope, path, old: f, ghost: m });
          }
        }
      }
      // The old scope, by path: 403.
      for (const path of [`/tasks/${task.task_id}`, `/tasks`, `/tasks/${queued.task_id}/cancel`]) {
        const r = await call(key, path.endsWith('cancel') ? 'POST' : 'GET', sp(X) + path);
        if (r.status !== 403) diffs.push({ key, path, status: r.status, body: r.body });
      }
    }
    // K (bound to one namespace, y) extending its old session by id alone: as if missing.
    const bare = await call(K, 'POST', `/v1/worker/sessions/${session.id}/extend`);
    expect([bare.status, bare.body?.code]).toEqual([404, 'session_not_found']);
    expect(diffs).toEqual([]);
    expect(await observe()).toEqual(before);
  }, 120_000);

  it('the key that kept its binding still holds the lease and settles it', async () => {
    // Control: OBS (acme/*, admin) renews and settles the lease issued before the restart.
    const renewed = await call(OBS, 'POST', '/v1/worker/renew', {
      owner,
      sequence: 2,
      intent: 'keep_alive',
    });
    expect(renewed.status, JSON.stringify(renewed.body)).toBe(200);
    const settled = await call(OBS, 'POST', '/v1/worker/settle', settleBody(owner));
    expect(settled.status, JSON.stringify(settled.body)).toBe(200);
    const status = await call(OBS, 'GET', `${sp(X)}/tasks/${task.task_id}`);
    expect(status.body.state).toBe('succeeded');
  });
});
