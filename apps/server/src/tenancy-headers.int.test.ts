/**
 * DESIGN §6: "a task that exists in another tenant is indistinguishable from one
 * that does not: 404". The existing matrix compares statuses and bodies; this compares every
 * response header (and the exact body bytes) of a foreign id against a missing id of the same
 * length, on the client routes and the worker routes, over the real server.
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
  ax: 'th-hdr-acme-x-key-000001',
  gy: 'th-hdr-globex-y-key-0001',
  ay: 'th-hdr-acme-y-key-000001',
} as const;
const CW = ['client', 'worker'];
const server = keyedServer('tenancy_headers', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEYS.ax, tenant: 'acme', namespaces: ['x'], roles: CW },
    { key: KEYS.ay, tenant: 'acme', namespaces: ['y'], roles: CW },
    { key: KEYS.gy, tenant: 'globex', namespaces: ['y'], roles: CW },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    billing: {
      url: 'http://127.0.0.1:9/hook',
      secret: `whsec_${Buffer.alloc(24, 3).toString('base64')}`,
    },
  }),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});
const X: Scope = { tenant_id: 'acme', namespace: 'x' };
const AY: Scope = { tenant_id: 'acme', namespace: 'y' };
const GY: Scope = { tenant_id: 'globex', namespace: 'y' };
const sp = (s: Scope) => `/v1/tenants/${s.tenant_id}/namespaces/${s.namespace}`;

/** A different id of the same length and prefix: the last 4 characters replaced. */
const ghostOf = (id: string) => `${id.slice(0, -4)}${id.endsWith('dead') ? 'beef' : 'dead'}`;

interface Raw {
  status: number;
  headers: Record<string, string>;
  text: string;
}
async function raw(key: string, method: string, path: string, json?: unknown): Promise<Raw> {
  const headers: Record<string, string> = { authorization: `Bearer ${key}` };
  let body: string | undefined;
  if (json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const res = await fetch(`${server.url}${path}`, { method, headers, body });
  const out: Record<string, string> = {};
  res.headers.forEach((v, k) => {
    if (k !== 'date' && k !== 'x-request-id') out[k] = v;
  });
  return { status: res.status, headers: out, text: await res.text() };
}
/** Everything of a reply but its request id, with `ids` masked. */
function masked(reply: Raw, ids: readonly string[]) {
  let text = reply.text.replace(/"request_id":"[^"]*"/g, '"request_id":"R"');
  for (const id of ids) text = text.split(id).join('ID');
  return { status: reply.status, headers: reply.headers, text };
}

let done: TaskSnapshot;
let queued: TaskSnapshot;
let owner: Record<string, unknown>;
let session: WorkerSession;
let subscription: string;

beforeAll(async () => {
  const call = server.call;
  const q = await call(KEYS.ax, 'POST', `${sp(X)}/tasks`, {
    idempotency_key: 'h-1',
    input: { ...X, queue: 'hq', program: { name: 'p' }, data: 1 },
  });
  expect(q.status).toBe(201);
  done = q.body;
  session = (
    await call(KEYS.ax, 'POST', '/v1/worker/sessions', { scope: X, queue: 'hq', concurrency: 1 })
  ).body;
  const acquired = await call(KEYS.ax, 'POST', '/v1/worker/acquire', {
    scope: X,
    queue: 'hq',
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  owner = (acquired.body as AcquireReply as { assignment: Assignment }).assignment.lease
    .owner as never;
  const sub = await call(
    KEYS.ax,
    'POST',
    `${sp(X)}/tasks/${done.task_id}/completion-subscriptions`,
    {
      subscription_key: 's',
      destination: 'billing',
    },
  );
  expect(sub.status).toBe(201);
  subscription = sub.body.id;
  const q2 = await call(KEYS.ax, 'POST', `${sp(X)}/tasks`, {
    idempotency_key: 'h-2',
    input: { ...X, queue: 'other', program: { name: 'p' }, data: 2 },
  });
  queued = q2.body;
}, 60_000);

describe('foreign vs missing ids: headers and bytes', () => {
  it('client routes answer a foreign task id with the same headers and bytes as a missing one', async () => {
    const diffs: unknown[] = [];
    for (const [key, scope] of [
      [KEYS.ay, AY],
      [KEYS.gy, GY],
    ] as const) {
      for (const id of [done.task_id, queued.task_id]) {
        const ghost = ghostOf(id);
        const attempt = String(owner.attempt_id);
        for (const [method, path, body] of [
          ['GET', '/tasks/ID'],
          ['GET', '/tasks/ID/result?wait_ms=0'],
          ['GET', '/tasks/ID/snapshot'],
          ['GET', '/tasks/ID/history'],
          ['GET', `/tasks/ID/attempts/${attempt}`],
          ['POST', '/tasks/ID/cancel'],
          ['GET', '/tasks/ID/completion-subscriptions'],
          [
            'POST',
            '/tasks/ID/completion-subscriptions',
            { subscription_key: 's', destination: 'billing' },
          ],
          ['HEAD', '/tasks/ID'],
        ] as [string, string, unknown?][]) {
          const f = masked(await raw(key, method, sp(scope) + path.replace('ID', id), body), [
            id,
            ghost,
          ]);
          const m = masked(await raw(key, method, sp(scope) + path.replace('ID', ghost), body), [
            id,
            ghost,
          ]);
          if (JSON.stringify(f) !== JSON.stringify(m) || f.status !== 404)
            diffs.push({ key, method, path, f, m });
        }
      }
      const g = ghostOf(subscription);
      const f = masked(
        await raw(key, 'POST', `${sp(scope)}/completion-subscriptions/${subscription}/redeliver`, {
          generation: 1,
        }),
        [subscription, g],
      );
      const m = masked(
        await raw(key, 'POST', `${sp(scope)}/completion-subscriptions/${g}/redeliver`, {
          generation: 1,
        }),
        [subscription, g],
      );
      if (JSON.stringify(f) !== JSON.stringify(m)) diffs.push({ key, redeliver: true, f, m });
    }
    expect(diffs).toEqual([]);
  });

  it('worker routes answer a re-scoped foreign owner or session with the same headers and bytes as a missing one', async () => {
    const diffs: unknown[] = [];
    const ids = ['task_id', 'attempt_id', 'lease_id', 'worker_session_id'] as const;
    for (const [key, scope] of [
      [KEYS.ay, AY],
      [KEYS.gy, GY],
    ] as const) {
      const foreign = { ...owner, scope };
      const ghost: Record<string, unknown> = { ...foreign };
      for (const k of ids) ghost[k] = ghostOf(String(owner[k]));
      const mask = ids.flatMap((k) => [String(owner[k]), String(ghost[k])]);
      for (const [path, bodyOf] of [
        ['/v1/worker/renew', (o: object) => ({ owner: o, sequence: 1, intent: 'dispatch' })],
        ['/v1/worker/quiescence', (o: object) => o],
        [
          '/v1/worker/settle',
          (o: Record<string, unknown>) => ({
            owner: o,
            operation_id: 'op',
            report: {
              kind: 'failed',
              report: { kind: 'crashed', message: 'x', retryable: true },
            },
            quiescence: 'confirmed',
            processing_trace: null,
          }),
        ],
      ] as [string, (o: Record<string, unknown>) => unknown][]) {
        const f = masked(await raw(key, 'POST', path, bodyOf(foreign)), mask);
        const m = masked(await raw(key, 'POST', path, bodyOf(ghost)), mask);
        if (JSON.stringify(f) !== JSON.stringify(m) || f.status === 200)
          diffs.push({ key, path, f, m });
      }
      const gs = ghostOf(session.id);
      for (const [path, bodyOf] of [
        ['/v1/worker/sessions/ID/extend', () => undefined],
        ['/v1/worker/sessions/ID/extend', () => ({ scope })],
        [
          '/v1/worker/acquire?wait_ms=0',
          (s: string) => ({
            scope,
            queue: 'hq',
            worker_session_id: s,
            consumer_id: 0,
            sequence: 2,
          }),
        ],
      ] as [string, (s: string) => unknown][]) {
        const f = masked(
          await raw(key, 'POST', path.replace('ID', session.id), bodyOf(session.id)),
          [session.id, gs],
        );
        const m = masked(await raw(key, 'POST', path.replace('ID', gs), bodyOf(gs)), [
          session.id,
          gs,
        ]);
        if (JSON.stringify(f) !== JSON.stringify(m) || f.status === 200)
          diffs.push({ key, path, f, m });
      }
    }
    expect(diffs).toEqual([]);
  });
});

describe('idempotency keys are per scope', () => {
  it('the same key in another namespace or tenant makes a task of its own, replays its own, and never answers 409 across scopes', async () => {
    const call = server.call;
    const made: Record<string, TaskSnapshot> = {};
    for (const [key, scope, n] of [
      [KEYS.ax, X, 1],
      [KEYS.ay, AY, 2],
      [KEYS.gy, GY, 3],
    ] as const) {
      const body = {
        idempotency_key: 'shared-key',
        input: { ...scope, queue: 'idem', program: { name: 'p' }, data: { n } },
      };
      const first = await call<TaskSnapshot>(key, 'POST', `${sp(scope)}/tasks`, body);
      expect([first.status, first.body.input.data]).toEqual([201, { n }]);
      const again = await call<TaskSnapshot>(key, 'POST', `${sp(scope)}/tasks`, body);
      expect([again.status, again.body.task_id]).toEqual([200, first.body.task_id]);
      // The header form, batch form: the same answer.
      const batch = await call(key, 'POST', `${sp(scope)}/tasks:batch`, { commands: [body] });
      expect(batch.body.results[0].task_id).toBe(first.body.task_id);
      made[`${scope.tenant_id}/${scope.namespace}`] = first.body;
    }
    expect(new Set(Object.values(made).map((t) => t.task_id)).size).toBe(3);
    // A different command under the key conflicts in its own scope only.
    const conflict = await call(KEYS.ax, 'POST', `${sp(X)}/tasks`, {
      idempotency_key: 'shared-key',
      input: { ...X, queue: 'idem', program: { name: 'p' }, data: { n: 3 } },
    });
    expect(conflict.status).toBe(409);
  });
});
