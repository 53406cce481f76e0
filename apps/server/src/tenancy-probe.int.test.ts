/**
 * Tenant and namespace isolation probes that the other tenancy suites do not
 * cover — long-polled acquire with a foreign session, the admin routes vs non-admin keys, key
 * rotation (two keys with one binding), a key bound to two namespaces extending without a body,
 * empty batches from a key without the route's role, and batch submits naming a foreign scope.
 */
import type { AcquireReply, Assignment, Scope, WorkerSession } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { type KeyedReply, keyedServer } from './testdata/keyed-server.js';

const KEYS = {
  ax: 'tp-acme-x-key-00000001',
  ay: 'tp-acme-y-key-00000001',
  axy: 'tp-acme-xy-key-0000001',
  gx: 'tp-globex-x-key-000001',
  rot1: 'tp-acme-x-rot1-0000001',
  rot2: 'tp-acme-x-rot2-0000001',
  client: 'tp-acme-client-0000001',
  worker: 'tp-acme-worker-0000001',
  cw: 'tp-acme-cw-key-0000001',
  admin: 'tp-acme-admin-00000001',
} as const;
const CW = ['client', 'worker'];
const server = keyedServer('tenancy_probe', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEYS.ax, tenant: 'acme', namespaces: ['x'], roles: CW },
    { key: KEYS.ay, tenant: 'acme', namespaces: ['y'], roles: CW },
    { key: KEYS.axy, tenant: 'acme', namespaces: ['x', 'y'], roles: CW },
    { key: KEYS.gx, tenant: 'globex', namespaces: ['x'], roles: CW },
    { key: KEYS.rot1, tenant: 'acme', namespaces: ['x'], roles: CW },
    { key: KEYS.rot2, tenant: 'acme', namespaces: ['x'], roles: CW },
    { key: KEYS.client, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
    { key: KEYS.worker, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
    { key: KEYS.cw, tenant: 'acme', namespaces: ['*'], roles: CW },
    { key: KEYS.admin, tenant: 'acme', namespaces: ['*'], roles: ['admin'] },
  ]),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});
const call = server.call;

const AX: Scope = { tenant_id: 'acme', namespace: 'x' };
const AY: Scope = { tenant_id: 'acme', namespace: 'y' };
const AZ: Scope = { tenant_id: 'acme', namespace: 'z' };
const GX: Scope = { tenant_id: 'globex', namespace: 'x' };
const sp = (s: Scope) =>
  `/v1/tenants/${encodeURIComponent(s.tenant_id)}/namespaces/${encodeURIComponent(s.namespace)}`;

let n = 0;
async function submit(key: string, scope: Scope, queue: string) {
  const r = await call(key, 'POST', `${sp(scope)}/tasks`, {
    idempotency_key: `tp-${++n}`,
    input: { ...scope, queue, program: { name: 'p' }, data: { n } },
  });
  expect(r.status).toBe(201);
  return r.body as { task_id: string };
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
function shape(reply: KeyedReply, ids: readonly string[]) {
  let text = JSON.stringify({ status: reply.status, body: reply.body ?? null }, (k, v) =>
    k === 'request_id' ? undefined : v,
  );
  for (const id of ids) text = text.split(id).join('ID');
  return JSON.parse(text);
}
const GHOST_SESSION = 'ses_0000000000000000000000000000dead';

describe('long-polled acquire with a foreign session', () => {
  it('answers at once, exactly like a missing session, and claims nothing', async () => {
    const queue = 'lp-shared';
    // The victims: sessions in acme/y and globex/x, on a queue of the same name, with work.
    const victims = [
      { key: KEYS.ay, scope: AY },
      { key: KEYS.gx, scope: GX },
    ];
    const sessions: string[] = [];
    for (const v of victims) {
      await submit(v.key, v.scope, queue);
      sessions.push((await open(v.key, v.scope, queue)).id);
    }
    // The attacker has work in its own scope too: a foreign session must not claim it.
    const own = await submit(KEYS.ax, AX, queue);
    const diffs: unknown[] = [];
    for (const sid of sessions) {
      for (const path of [
        '/v1/worker/acquire?wait_ms=1500',
        '/v1/worker/acquire:batch?wait_ms=1500',
      ]) {
        const body = (s: string) => {
          const poll = { scope: AX, queue, worker_session_id: s, consumer_id: 0, sequence: 1 };
          return path.includes('batch') ? { commands: [poll] } : poll;
        };
        const t0 = performance.now();
        const f = await call(KEYS.ax, 'POST', path, body(sid));
        const t1 = performance.now();
        const m = await call(KEYS.ax, 'POST', path, body(GHOST_SESSION));
        const t2 = performance.now();
        const fs = shape(f, [sid, GHOST_SESSION]);
        const ms = shape(m, [sid, GHOST_SESSION]);
        if (JSON.stringify(fs) !== JSON.stringify(ms)) diffs.push({ path, fs, ms });
        if (t1 - t0 > 700 || t2 - t1 > 700) diffs.push({ path, timing: [t1 - t0, t2 - t1] });
      }
    }
    expect(diffs).toEqual([]);
    const status = await call(KEYS.ax, 'GET', `${sp(AX)}/tasks/${own.task_id}`);
    expect(status.body.state).toBe('queued');
  });
});

describe('admin routes', () => {
  it('refuse every non-admin key (client, worker, client+worker) with 403 role', async () => {
    const bad: unknown[] = [];
    for (const key of [KEYS.client, KEYS.worker, KEYS.cw]) {
      for (const [method, path, body] of [
        ['GET', `${sp(AX)}/retention-policy`],
        ['PUT', `${sp(AX)}/retention-policy`, { retention_ms: 3_600_000 }],
        ['GET', `${sp(AX)}/retention-policy/preview`],
        ['GET', `${sp(AX)}/retention-policy/preview?limit=5`],
      ] as [string, string, unknown?][]) {
        const r = await call(key, method, path, body);
        if (r.status !== 403 || r.body?.reason !== 'role')
          bad.push({ key, method, path, status: r.status, body: r.body });
      }
    }
    expect(bad).toEqual([]);
    // The policy is still the default.
    const policy = await call(KEYS.admin, 'GET', `${sp(AX)}/retention-policy`);
    expect(policy.status).toBe(200);
    expect(policy.body.source).toBe('default');
  });

  it("an admin key of one tenant is 403 on another tenant's policy, and changes nothing there", async () => {
    const r = await call(KEYS.admin, 'PUT', `${sp(GX)}/retention-policy`, {
      retention_ms: 3_600_000,
    });
    expect([r.status, r.body?.code]).toEqual([403, 'forbidden']);
    expect((await call(KEYS.admin, 'GET', `${sp(GX)}/retention-policy`)).status).toBe(403);
    expect((await call(KEYS.admin, 'GET', `${sp(GX)}/retention-policy/preview`)).status).toBe(403);
  });
});

describe('key rotation: two keys with one binding', () => {
  it('a lease taken with one key is renewed and settled with the other; a key of another binding cannot', async () => {
    const queue = 'rot';
    const task = await submit(KEYS.rot1, AX, queue);
    const session = await open(KEYS.rot1, AX, queue);
    const acq = await call<AcquireReply>(KEYS.rot2, 'POST', '/v1/worker/acquire', {
      scope: AX,
      queue,
      worker_session_id: session.id,
      consumer_id: 0,
      sequence: 1,
    });
    expect(acq.status).toBe(200);
    const assignment = (acq.body as { assignment: Assignment }).assignment;
    expect(assignment.lease.owner.task_id).toBe(task.task_id);
    const owner = assignment.lease.owner;
    // A key bound elsewhere in the same tenant: 403, nothing renewed.
    const foreign = await call(KEYS.ay, 'POST', '/v1/worker/renew', {
      owner,
      sequence: 1,
      intent: 'dispatch',
    });
    expect([foreign.status, foreign.body?.code]).toEqual([403, 'forbidden']);
    const renewed = await call(KEYS.rot1, 'POST', '/v1/worker/renew', {
      owner,
      sequence: 1,
      intent: 'dispatch',
    });
    expect([renewed.status, renewed.body?.dispatch_allowed]).toEqual([200, true]);
    const extended = await call(KEYS.rot2, 'POST', `/v1/worker/sessions/${session.id}/extend`);
    expect(extended.status).toBe(200);
    const settled = await call(KEYS.rot2, 'POST', '/v1/worker/settle', {
      owner,
      operation_id: 'rot-op',
      report: {
        kind: 'completed',
        report: {
          context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
          outcome: { kind: 'success', output: 1 },
        },
      },
      quiescence: 'confirmed',
      processing_trace: null,
    });
    expect(settled.status).toBe(200);
    const result = await call(KEYS.rot1, 'GET', `${sp(AX)}/tasks/${task.task_id}/result`);
    expect(result.body.outcome).toEqual({ state: 'succeeded', output: 1 });
  });
});

describe('a key bound to two namespaces extends without a body', () => {
  it('its own sessions in either namespace; a session of a third namespace or tenant is 404 like a ghost', async () => {
    const sx = await open(KEYS.ax, AX, 'ext');
    const sy = await open(KEYS.ay, AY, 'ext');
    const sz = await open(KEYS.cw, AZ, 'ext');
    const sg = await open(KEYS.gx, GX, 'ext');
    for (const s of [sx, sy]) {
      const r = await call<WorkerSession>(KEYS.axy, 'POST', `/v1/worker/sessions/${s.id}/extend`);
      expect([r.status, r.body.id, r.body.scope]).toEqual([200, s.id, s.scope]);
    }
    const ghost = await call(KEYS.axy, 'POST', `/v1/worker/sessions/${GHOST_SESSION}/extend`);
    expect(ghost.status).toBe(404);
    for (const s of [sz, sg]) {
      const r = await call(KEYS.axy, 'POST', `/v1/worker/sessions/${s.id}/extend`);
      expect(shape(r, [s.id, GHOST_SESSION])).toEqual(shape(ghost, [s.id, GHOST_SESSION]));
    }
    // A key bound to one namespace (x) extending y's session without a body: like a ghost too.
    const sole = await call(KEYS.ax, 'POST', `/v1/worker/sessions/${sy.id}/extend`);
    const soleGhost = await call(KEYS.ax, 'POST', `/v1/worker/sessions/${GHOST_SESSION}/extend`);
    expect(shape(sole, [sy.id, GHOST_SESSION])).toEqual(shape(soleGhost, [sy.id, GHOST_SESSION]));
    expect(sole.status).toBe(404);
    // Nothing was extended by the refused calls.
    for (const [key, s] of [
      [KEYS.cw, sz],
      [KEYS.gx, sg],
    ] as const) {
      const again = await call<WorkerSession>(key, 'POST', `/v1/worker/sessions/${s.id}/extend`, {
        scope: s.scope,
      });
      expect(again.status).toBe(200);
    }
  });
});

describe('empty batches from a key without the route role', () => {
  it('are 403, not an empty 200', async () => {
    const bad: unknown[] = [];
    for (const [key, path, body] of [
      [KEYS.worker, `${sp(AX)}/tasks:batch`, { commands: [] }],
      [KEYS.client, '/v1/worker/acquire:batch', { commands: [] }],
      [KEYS.client, '/v1/worker/renew:batch', { commands: [] }],
      [KEYS.client, '/v1/worker/settle:batch', { commands: [] }],
      [KEYS.gx, `${sp(AX)}/tasks:batch`, { commands: [] }],
    ] as const) {
      const r = await call(key, 'POST', path, body);
      if (r.status !== 403 && r.status !== 400)
        bad.push({ key, path, status: r.status, body: r.body });
    }
    expect(bad).toEqual([]);
  });
});

describe('batch submit items naming a foreign scope', () => {
  it('refuse those items alone and create nothing in the foreign scope', async () => {
    const input = (scope: Scope) => ({ ...scope, queue: 'bq', program: { name: 'p' }, data: 1 });
    const r = await call(KEYS.ax, 'POST', `${sp(AX)}/tasks:batch`, {
      commands: [
        { idempotency_key: 'bq-1', input: input(AX) },
        { idempotency_key: 'bq-2', input: input(GX) },
        { idempotency_key: 'bq-3', input: input(AY) },
      ],
    });
    expect(r.status).toBe(200);
    const results = r.body.results as Record<string, unknown>[];
    expect(results[0]?.task_id).toBeTypeOf('string');
    expect([results[1]?.status, results[2]?.status]).toEqual([
      expect.any(Number),
      expect.any(Number),
    ]);
    expect([400, 403]).toContain(results[1]?.status);
    expect([400, 403]).toContain(results[2]?.status);
    for (const [key, scope] of [
      [KEYS.gx, GX],
      [KEYS.ay, AY],
    ] as const) {
      const list = await call(key, 'GET', `${sp(scope)}/tasks?queue=bq`);
      expect(list.body.tasks).toEqual([]);
    }
  });
});
