/**
 * The worker batch routes (DESIGN §6 batch table, §12) over the real server on PostgreSQL: items
 * failing business rules or their own size limit beside valid neighbours are answered on their
 * own, in request order, and change nothing; the valid ones are written.
 */
import type { Assignment, Scope, TaskSnapshot, WorkerSession } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'br-acme-star-key-00000001';
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const SCOPE = `/v1/tenants/${A.tenant_id}/namespaces/${A.namespace}`;

const server = keyedServer('batch_routes', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});
const api = server.as(KEY);
// biome-ignore lint/suspicious/noExplicitAny: replies are read loosely, problem or value
type Loose = any;

let counter = 0;
const fresh = (prefix: string) => `${prefix}-${++counter}`;

async function submit(queue: string, extra: Record<string, unknown> = {}): Promise<TaskSnapshot> {
  const reply = await api.post<TaskSnapshot>(`${SCOPE}/tasks`, {
    idempotency_key: fresh('k'),
    input: { ...A, queue, program: { name: 'p' }, data: { n: counter }, ...extra },
  });
  expect(reply.status).toBe(201);
  return reply.body;
}

async function session(queue: string, concurrency = 2): Promise<WorkerSession> {
  const reply = await api.post<WorkerSession>('/v1/worker/sessions', {
    scope: A,
    queue,
    concurrency,
  });
  expect(reply.status).toBe(200);
  return reply.body;
}

const poll = (s: WorkerSession, consumer: number, sequence: number) => ({
  scope: s.scope,
  queue: s.queue,
  worker_session_id: s.id,
  consumer_id: consumer,
  sequence,
});

describe('renew:batch and settle:batch: items failing business rules beside valid ones', () => {
  /** A task of its own queue claimed by slot 0 of a fresh session, dispatch granted. */
  async function claimed() {
    const queue = fresh('q');
    const task = await submit(queue);
    const s = await session(queue);
    const got = await api.post('/v1/worker/acquire', poll(s, 0, 1));
    expect(got.body.disposition).toBe('assigned');
    const owner = (got.body.assignment as Assignment).lease.owner;
    const renewed = await api.post('/v1/worker/renew', {
      owner,
      sequence: 1,
      intent: 'dispatch',
    });
    expect(renewed.body.dispatch_allowed).toBe(true);
    return { task, owner };
  }
  const settle = (owner: Loose, op: string, output: unknown = { ok: true }) => ({
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  });
  const snapshotOf = async (taskId: string) => ({
    snapshot: (await api.get(`${SCOPE}/tasks/${taskId}/snapshot`)).body,
    history: (await api.get(`${SCOPE}/tasks/${taskId}/history`)).body,
  });

  it('settle:batch: stale owner, unknown task, identity mismatch and a valid item: only the valid one is written, in order', async () => {
    const good = await claimed();
    const stale = await claimed();
    const mismatch = await claimed();
    const staleBefore = await snapshotOf(stale.task.task_id);
    const mismatchBefore = await snapshotOf(mismatch.task.task_id);
    const staleOwner = { ...stale.owner, lease_id: `${stale.owner.lease_id}x` };
    const unknownOwner = { ...good.owner, task_id: 'task_does_not_exist' };
    const wrongIdentity = settle(mismatch.owner, 'op-mm');
    wrongIdentity.report.report.context.identity.attempt_id = good.owner.attempt_id;
    const reply = await api.post('/v1/worker/settle:batch', {
      commands: [
        settle(staleOwner, 'op-stale'),
        settle(unknownOwner, 'op-unknown'),
        wrongIdentity,
        settle(good.owner, 'op-good'),
      ],
    });
    expect(reply.status).toBe(200);
    const view = reply.body.results.map((r: Loose) =>
      r.code === undefined ? r.task_state : [r.status, r.code],
    );
    expect(view[0]).toEqual([409, 'ownership_lost']);
    expect(view[1][0]).toBeGreaterThanOrEqual(400);
    expect(view[1][0]).toBeLessThan(500);
    expect(view[2]).toEqual([400, 'invalid_input']);
    expect(view[3]).toBe('succeeded');
    expect(await snapshotOf(stale.task.task_id)).toEqual(staleBefore);
    expect(await snapshotOf(mismatch.task.task_id)).toEqual(mismatchBefore);
  });
});

describe('batch items past a limit or a rule beside valid ones', () => {
  const settleWith = (owner: Loose, op: string, output: unknown) => ({
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  });

  it('settle:batch: output at OUTPUT_MAX_BYTES settles, one byte more is that item alone 413, its attempt left open', async () => {
    const queue = fresh('out-limit');
    const t1 = await submit(queue);
    const t2 = await submit(queue);
    const s = await session(queue, 2);
    const got = await api.post('/v1/worker/acquire:batch', {
      commands: [poll(s, 0, 1), poll(s, 1, 1)],
    });
    const owners = got.body.replies.map((r: Loose) => r.assignment.lease.owner);
    const byTask = new Map(owners.map((o: Loose) => [o.task_id, o]));
    const o1 = byTask.get(t1.task_id) as Loose;
    const o2 = byTask.get(t2.task_id) as Loose;
    for (const o of [o1, o2]) {
      await api.post('/v1/worker/renew', { owner: o, sequence: 1, intent: 'dispatch' });
    }
    const { OUTPUT_MAX_BYTES } = await import('@ledgence/contracts');
    const atLimit = 'a'.repeat(OUTPUT_MAX_BYTES - 2);
    const reply = await api.post('/v1/worker/settle:batch', {
      commands: [settleWith(o1, 'op-over', `${atLimit}b`), settleWith(o2, 'op-at', atLimit)],
    });
    expect(reply.status).toBe(200);
    const [over, at] = reply.body.results;
    expect([over.status, over.code]).toEqual([413, 'payload_too_large']);
    expect(at.task_state).toBe('succeeded');
    const status = await api.get(`${SCOPE}/tasks/${t1.task_id}`);
    expect(status.body.state).toBe('active');
    // The refused item is still the attempt's first settlement: a valid retry under its id works.
    const retry = await api.post('/v1/worker/settle', settleWith(o1, 'op-over', { ok: 1 }));
    expect([retry.status, retry.body.task_state]).toEqual([200, 'succeeded']);
  });

  it('acquire:batch: an unknown session and a consumer_id past the concurrency are their own problems; the valid poll claims', async () => {
    const queue = fresh('acq-mix');
    const task = await submit(queue);
    const s = await session(queue, 2);
    const reply = await api.post('/v1/worker/acquire:batch', {
      commands: [
        { ...poll(s, 0, 1), worker_session_id: 'session_unknown' },
        poll(s, 2, 1),
        poll(s, 1, 1),
      ],
    });
    expect(reply.status).toBe(200);
    const [unknown, past, good] = reply.body.replies;
    expect([unknown.status, unknown.code]).toEqual([404, 'session_not_found']);
    expect([past.status, past.code]).toEqual([400, 'invalid_input']);
    expect(good.assignment.lease.owner.task_id).toBe(task.task_id);
    // Slot 0 of the real session recorded nothing: sequence 1 is still its new poll.
    const next = await api.post('/v1/worker/acquire', poll(s, 0, 1));
    expect(next.body).toEqual({ disposition: 'empty', sequence: 1 });
  });

  it('renew:batch: a stale owner beside the valid one is ownership_lost alone; the valid one is granted dispatch', async () => {
    const queue = fresh('renew-mix');
    await submit(queue);
    const s = await session(queue, 1);
    const got = await api.post('/v1/worker/acquire', poll(s, 0, 1));
    const owner = got.body.assignment.lease.owner;
    const stale = { ...owner, generation: owner.generation + 1 };
    const reply = await api.post('/v1/worker/renew:batch', {
      commands: [
        { owner: stale, sequence: 1, intent: 'dispatch' },
        { owner, sequence: 1, intent: 'dispatch' },
      ],
    });
    expect(reply.status).toBe(200);
    const [lost, ok] = reply.body.results;
    expect([lost.status, lost.code]).toEqual([409, 'ownership_lost']);
    expect([ok.renew_sequence, ok.dispatch_allowed]).toEqual([1, true]);
  });
});
