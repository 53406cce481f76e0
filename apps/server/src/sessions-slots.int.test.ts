/**
 * Worker sessions over the real server (review r50a; DESIGN §4.1 "Sessions", §5 "Sessions" and
 * "Acquire (replay-safe)"): expiries from store time, expired sessions of another scope looking
 * unknown (never "expired"), a mixed acquire:batch answered item by item, and concurrent single
 * and batch polls of the same slots never holding two live attempts in one slot. Slot freeing,
 * sequences and batch replays are poll-protocol.int's and batch-items.int's.
 */
import type { Scope, TaskSnapshot, WorkerSession } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

// biome-ignore lint/suspicious/noExplicitAny: replies are read loosely, problem or value
type Loose = any;

const KEYS = {
  star: 'r50a-acme-star-key-00000001',
  ab: 'r50a-acme-ab-key-0000000001',
  globex: 'r50a-globex-star-key-000001',
} as const;
const KEY_CONFIG = JSON.stringify([
  { key: KEYS.star, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  { key: KEYS.ab, tenant: 'acme', namespaces: ['a', 'b'], roles: ['client', 'worker'] },
  { key: KEYS.globex, tenant: 'globex', namespaces: ['*'], roles: ['client', 'worker'] },
]);
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const B: Scope = { tenant_id: 'acme', namespace: 'b' };
const G: Scope = { tenant_id: 'globex', namespace: 'a' };

const VALIDITY_SHORT = 1_000;

/** Long leases, default session validity. */
const live = keyedServer('r50a_live', {
  LEDGENCE_API_KEYS: KEY_CONFIG,
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});
/** Sessions valid for one second. */
const short = keyedServer('r50a_short', {
  LEDGENCE_API_KEYS: KEY_CONFIG,
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
  LEDGENCE_SESSION_VALIDITY_MS: String(VALIDITY_SHORT),
});
type Server = typeof live;

const scopePath = (s: Scope) =>
  `/v1/tenants/${encodeURIComponent(s.tenant_id)}/namespaces/${encodeURIComponent(s.namespace)}`;
let counter = 0;
const fresh = (prefix: string) => `${prefix}-${++counter}`;
const keyOf = (scope: Scope) => (scope.tenant_id === 'acme' ? KEYS.star : KEYS.globex);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function submit(srv: Server, scope: Scope, queue: string): Promise<TaskSnapshot> {
  const reply = await srv.call<TaskSnapshot>(keyOf(scope), 'POST', `${scopePath(scope)}/tasks`, {
    idempotency_key: fresh('k'),
    input: { ...scope, queue, program: { name: 'p' }, data: { n: counter } },
  });
  expect(reply.status, JSON.stringify(reply.body)).toBe(201);
  return reply.body;
}

async function open(
  srv: Server,
  scope: Scope,
  queue: string,
  concurrency = 2,
): Promise<WorkerSession> {
  const reply = await srv.call<WorkerSession>(keyOf(scope), 'POST', '/v1/worker/sessions', {
    scope,
    queue,
    concurrency,
  });
  expect(reply.status, JSON.stringify(reply.body)).toBe(200);
  return reply.body;
}

const poll = (s: WorkerSession, consumer: number, sequence: number) => ({
  scope: s.scope,
  queue: s.queue,
  worker_session_id: s.id,
  consumer_id: consumer,
  sequence,
});

const acquire = (srv: Server, body: unknown, key: string = KEYS.star, query = '') =>
  srv.call(key, 'POST', `/v1/worker/acquire${query}`, body);
const acquireBatch = (srv: Server, commands: unknown[], key: string = KEYS.star, query = '') =>
  srv.call(key, 'POST', `/v1/worker/acquire:batch${query}`, { commands });

const codeOf = (r: Loose) => [r.status, r.body?.code];
const itemCode = (p: Loose) => [p.status, p.code];

async function snapshot(srv: Server, scope: Scope, taskId: string) {
  return (await srv.call(keyOf(scope), 'GET', `${scopePath(scope)}/tasks/${taskId}/snapshot`)).body;
}

describe('open_session and extend: expires_at = store now + SESSION_VALIDITY_MS', () => {
  it('open and extend are bracketed by store times read before and after', async () => {
    const queue = fresh('q');
    const before = await submit(live, A, queue);
    const s = await open(live, A, queue);
    const after = await submit(live, A, queue);
    expect(s.expires_at).toBeGreaterThanOrEqual(before.submitted_at + 300_000);
    expect(s.expires_at).toBeLessThanOrEqual(after.submitted_at + 300_000);
    await sleep(30);
    const before2 = await submit(live, A, queue);
    const ext = await live.call(KEYS.star, 'POST', `/v1/worker/sessions/${s.id}/extend`);
    const after2 = await submit(live, A, queue);
    expect(ext.status).toBe(200);
    expect(ext.body).toEqual({ ...s, expires_at: ext.body.expires_at });
    expect(ext.body.expires_at).toBeGreaterThanOrEqual(before2.submitted_at + 300_000);
    expect(ext.body.expires_at).toBeLessThanOrEqual(after2.submitted_at + 300_000);
    expect(ext.body.expires_at).toBeGreaterThan(s.expires_at);
  });
});

describe('unknown, expired and foreign sessions', () => {
  it('unknown: 404 session_not_found on acquire, acquire:batch and extend', async () => {
    const queue = fresh('q');
    const s = await open(live, A, queue);
    const ghost = { ...s, id: 'session-does-not-exist' };
    expect(codeOf(await acquire(live, poll(ghost, 0, 1)))).toEqual([404, 'session_not_found']);
    expect(codeOf(await acquire(live, poll(ghost, 0, 1), KEYS.star, '?wait_ms=200'))).toEqual([
      404,
      'session_not_found',
    ]);
    const batch = await acquireBatch(live, [poll(s, 0, 1), poll(ghost, 0, 1)]);
    expect(batch.status).toBe(200);
    expect(batch.body.replies[0].disposition).toBe('empty');
    expect(itemCode(batch.body.replies[1])).toEqual([404, 'session_not_found']);
    for (const key of [KEYS.star, KEYS.ab]) {
      const ext = await live.call(key, 'POST', `/v1/worker/sessions/${ghost.id}/extend`);
      expect(codeOf(ext)).toEqual([404, 'session_not_found']);
      const ext2 = await live.call(key, 'POST', `/v1/worker/sessions/${ghost.id}/extend`, {
        scope: A,
      });
      expect(codeOf(ext2)).toEqual([404, 'session_not_found']);
    }
  });

  it('expired: 410 session_expired on acquire (new and replay), acquire:batch and extend; foreign expired sessions look unknown', async () => {
    const queue = fresh('q');
    await submit(short, A, queue);
    const s = await open(short, A, queue);
    const sg = await open(short, G, queue);
    const first = await acquire(short, poll(s, 0, 1));
    expect(first.body.disposition).toBe('assigned');
    const firstEmpty = await acquire(short, poll(s, 1, 1));
    expect(firstEmpty.body.disposition).toBe('empty');
    await sleep(VALIDITY_SHORT + 200);
    expect(codeOf(await acquire(short, poll(s, 0, 1)))).toEqual([410, 'session_expired']);
    expect(codeOf(await acquire(short, poll(s, 1, 1)))).toEqual([410, 'session_expired']);
    expect(codeOf(await acquire(short, poll(s, 1, 2)))).toEqual([410, 'session_expired']);
    expect(codeOf(await acquire(short, poll(s, 1, 2), KEYS.star, '?wait_ms=200'))).toEqual([
      410,
      'session_expired',
    ]);
    const batch = await acquireBatch(short, [poll(s, 1, 2), poll(s, 0, 2), poll(s, 5, 1)]);
    expect(batch.status).toBe(200);
    expect(batch.body.replies.map(itemCode)).toEqual([
      [410, 'session_expired'],
      [410, 'session_expired'],
      // consumer outside the concurrency of an expired session: either answer is a 4xx
      batch.body.replies[2].status === 400 ? [400, 'invalid_input'] : [410, 'session_expired'],
    ]);
    const ext = await short.call(KEYS.star, 'POST', `/v1/worker/sessions/${s.id}/extend`);
    expect(codeOf(ext)).toEqual([410, 'session_expired']);
    const extScoped = await short.call(KEYS.ab, 'POST', `/v1/worker/sessions/${s.id}/extend`, {
      scope: A,
    });
    expect(codeOf(extScoped)).toEqual([410, 'session_expired']);

    // Foreign: an expired session of another tenant or namespace is unknown, never "expired".
    const asG = { ...s, scope: G };
    expect(codeOf(await acquire(short, poll(asG, 1, 2), KEYS.globex))).toEqual([
      404,
      'session_not_found',
    ]);
    const asB = { ...s, scope: B };
    expect(codeOf(await acquire(short, poll(asB, 1, 2), KEYS.ab))).toEqual([
      404,
      'session_not_found',
    ]);
    const gb = await acquireBatch(short, [poll(asG, 1, 2)], KEYS.globex);
    expect(itemCode(gb.body.replies[0])).toEqual([404, 'session_not_found']);
    for (const [key, body] of [
      [KEYS.globex, undefined],
      [KEYS.globex, { scope: G }],
      [KEYS.star, { scope: B }],
    ] as const) {
      const r = await short.call(key, 'POST', `/v1/worker/sessions/${s.id}/extend`, body);
      expect(codeOf(r), `${key} ${JSON.stringify(body)}`).toEqual([404, 'session_not_found']);
    }
    // The globex expired session, from acme.
    const r = await short.call(KEYS.star, 'POST', `/v1/worker/sessions/${sg.id}/extend`);
    expect(codeOf(r)).toEqual([404, 'session_not_found']);
    const ra = await acquire(short, poll({ ...sg, scope: A }, 0, 1));
    expect(codeOf(ra)).toEqual([404, 'session_not_found']);
  });

  it('a live foreign session: acquire, batch and extend say not found and change nothing; its owner still polls', async () => {
    const queue = fresh('q');
    const task = await submit(live, G, queue);
    const sg = await open(live, G, queue);
    const asA = { ...sg, scope: A };
    expect(codeOf(await acquire(live, poll(asA, 0, 1)))).toEqual([404, 'session_not_found']);
    const b = await acquireBatch(live, [poll(asA, 0, 1), poll(asA, 1, 1)]);
    expect(b.body.replies.map(itemCode)).toEqual([
      [404, 'session_not_found'],
      [404, 'session_not_found'],
    ]);
    const ext = await live.call(KEYS.star, 'POST', `/v1/worker/sessions/${sg.id}/extend`);
    expect(codeOf(ext)).toEqual([404, 'session_not_found']);
    expect(JSON.stringify(ext.body)).not.toContain('globex');
    const own = await acquire(live, poll(sg, 0, 1), KEYS.globex);
    expect(own.body.disposition).toBe('assigned');
    expect(own.body.assignment.lease.owner.task_id).toBe(task.task_id);
  });
});

describe('acquire:batch items', () => {
  it('commands of two sessions and mixed valid and invalid items: each on its own, in request order', async () => {
    const queue = fresh('q');
    const queue2 = fresh('q');
    await submit(live, A, queue);
    await submit(live, A, queue2);
    await submit(live, B, queue);
    const s1 = await open(live, A, queue, 2);
    const s2 = await open(live, A, queue2, 1);
    const sb = await open(live, B, queue, 1);
    const r = await acquireBatch(
      live,
      [
        poll(s1, 5, 1), // out of range
        poll(s2, 0, 1), // assigned queue2
        { ...poll(s1, 0, 1), queue: queue2 }, // queue mismatch
        poll(s1, 0, 2), // sequence conflict (first poll)
        poll(sb, 0, 1), // other namespace, allowed
        { ...poll(s1, 1, 1), worker_session_id: 'nope' }, // unknown
        poll(s1, 1, 1), // assigned queue
        { ...poll(sb, 0, 1), scope: G }, // foreign tenant: 403
        { scope: A, queue, consumer_id: 0 }, // malformed item
      ],
      KEYS.ab,
    );
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const rs = r.body.replies;
    expect(rs.length).toBe(9);
    expect(itemCode(rs[0])).toEqual([400, 'invalid_input']);
    expect(rs[1].disposition).toBe('assigned');
    expect(rs[1].assignment.event.ldgqueue).toBe(queue2);
    expect(itemCode(rs[2])).toEqual([400, 'invalid_input']);
    expect(itemCode(rs[3])).toEqual([409, 'sequence_conflict']);
    expect(rs[4].disposition).toBe('assigned');
    expect(rs[4].assignment.event.ldgnamespace).toBe('b');
    expect(itemCode(rs[5])).toEqual([404, 'session_not_found']);
    expect(rs[6].disposition).toBe('assigned');
    expect(rs[6].assignment.event.ldgqueue).toBe(queue);
    expect(rs[7].status).toBe(403);
    expect(rs[8].status).toBe(400);
    for (const x of rs) if (x.status !== undefined) expect(x.status).toBeLessThan(500);
  });
});

describe('no double assignment of a slot under concurrent polls', () => {
  it('concurrent polls of one slot with sequences 1 and 2 (and repeats) give at most one live attempt', async () => {
    const queue = fresh('q');
    for (let i = 0; i < 6; i++) await submit(live, A, queue);
    const s = await open(live, A, queue, 1);
    const bodies = [1, 2, 1, 2, 1, 2, 3, 1].map((seq) => poll(s, 0, seq));
    const results = await Promise.all(bodies.map((b) => acquire(live, b)));
    for (const r of results) expect(r.status).toBeLessThan(500);
    const attempts = new Set(
      results
        .filter((r) => r.status === 200 && r.body.disposition === 'assigned')
        .map((r) => r.body.assignment.lease.owner.attempt_id),
    );
    expect(
      attempts.size,
      JSON.stringify(results.map((r) => [r.status, r.body.disposition ?? r.body.code])),
    ).toBe(1);
  });
});

describe('concurrent single and batch polls of the same slots', () => {
  it('mixed acquire and acquire:batch (with and without waits) never leave a slot two live attempts', async () => {
    const queue = fresh('q');
    const s = await open(live, A, queue, 2);
    const requests: Promise<Loose>[] = [];
    for (let round = 0; round < 3; round++) {
      for (const seq of [1, 2, 3]) {
        requests.push(acquire(live, poll(s, 0, seq), KEYS.star, round === 0 ? '?wait_ms=800' : ''));
        requests.push(
          acquireBatch(
            live,
            [poll(s, 0, seq), poll(s, 1, seq), poll(s, 1, seq + 1)],
            KEYS.star,
            round === 1 ? '?wait_ms=800' : '',
          ),
        );
      }
    }
    await sleep(100);
    const tasks = [];
    for (let i = 0; i < 6; i++) tasks.push(await submit(live, A, queue));
    const results = await Promise.all(requests);
    for (const r of results) expect(r.status, JSON.stringify(r.body)).toBeLessThan(500);
    const bySlot = new Map<number, Set<string>>();
    for (const t of tasks) {
      const snap = await snapshot(live, A, t.task_id);
      if (snap.state !== 'active') continue;
      const att = await live.call(
        KEYS.star,
        'GET',
        `${scopePath(A)}/tasks/${t.task_id}/attempts/${snap.current_attempt_id}`,
      );
      const consumer = att.body.lease?.owner?.consumer_id ?? att.body.consumer_id;
      const set = bySlot.get(consumer) ?? new Set();
      set.add(t.task_id);
      bySlot.set(consumer, set);
    }
    expect(bySlot.size).toBeGreaterThan(0);
    for (const [slot, set] of bySlot)
      expect(set.size, `slot ${slot}: ${[...set]}`).toBeLessThanOrEqual(1);
  });
});
