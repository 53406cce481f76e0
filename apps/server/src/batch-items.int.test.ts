/**
 * Items inside one batch request of the four batch routes (DESIGN §6: each item is validated and
 * answered on its own, items share one transaction only where that cannot change any item's
 * outcome, replies keep request order), over the real server on a real PostgreSQL: duplicates
 * inside one batch answered as the items sent one after another, items of several queues and
 * scopes, batch limits at their edges.
 */
import {
  ACQUIRE_BATCH_REPLY_MAX_BYTES,
  type Assignment,
  MAX_WORKER_BATCH,
  type Scope,
  SUBMISSION_DATA_MAX_BYTES,
  type TaskSnapshot,
  type WorkerSession,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEYS = {
  star: 'rb-acme-star-key-000000001',
  ab: 'rb-acme-ab-key-0000000001',
  globex: 'rb-globex-star-key-0000001',
} as const;
const KEY_CONFIG = [
  { key: KEYS.star, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  { key: KEYS.ab, tenant: 'acme', namespaces: ['a', 'b'], roles: ['client', 'worker'] },
  { key: KEYS.globex, tenant: 'globex', namespaces: ['*'], roles: ['client', 'worker'] },
];
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const B: Scope = { tenant_id: 'acme', namespace: 'b' };
const G: Scope = { tenant_id: 'globex', namespace: 'a' };

/** Long enough that only a wake hint (never the rescan) ends a park within a test's wait. */
const RESCAN_MS = 60_000;

const server = keyedServer('batch_items', {
  LEDGENCE_API_KEYS: JSON.stringify(KEY_CONFIG),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
  LEDGENCE_RESCAN_INTERVAL_MS: String(RESCAN_MS),
});
const call = server.call;
// biome-ignore lint/suspicious/noExplicitAny: replies are read loosely, problem or value
type Loose = any;

const scopePath = (s: Scope) =>
  `/v1/tenants/${encodeURIComponent(s.tenant_id)}/namespaces/${encodeURIComponent(s.namespace)}`;

let counter = 0;
const fresh = (prefix: string) => `${prefix}-${++counter}`;

async function submit(
  key: string,
  scope: Scope,
  queue: string,
  extra: Record<string, unknown> = {},
): Promise<TaskSnapshot> {
  const reply = await call<TaskSnapshot>(key, 'POST', `${scopePath(scope)}/tasks`, {
    idempotency_key: fresh('k'),
    input: { ...scope, queue, program: { name: 'p' }, data: { n: counter }, ...extra },
  });
  expect(reply.status).toBe(201);
  return reply.body;
}

async function session(
  key: string,
  scope: Scope,
  queue: string,
  concurrency = 2,
): Promise<WorkerSession> {
  const reply = await call<WorkerSession>(key, 'POST', '/v1/worker/sessions', {
    scope,
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

/** A task of its own queue, claimed by slot 0 of a fresh session. */
async function claimed(key: string, scope: Scope) {
  const queue = fresh('q');
  const task = await submit(key, scope, queue);
  const s = await session(key, scope, queue);
  const reply = await call(key, 'POST', '/v1/worker/acquire', poll(s, 0, 1));
  expect(reply.body.disposition).toBe('assigned');
  const assignment = reply.body.assignment as Assignment;
  expect(assignment.lease.owner.task_id).toBe(task.task_id);
  return { task, session: s, assignment, owner: assignment.lease.owner };
}

/** What a scope's task looks like now, for "nothing changed". */
async function state(scope: Scope, taskId: string) {
  const base = `${scopePath(scope)}/tasks/${taskId}`;
  const key = scope.tenant_id === 'acme' ? KEYS.star : KEYS.globex;
  const snapshot = await call(key, 'GET', `${base}/snapshot`);
  const history = await call(key, 'GET', `${base}/history`);
  return { snapshot: snapshot.body, history: history.body };
}

const problem = (item: Loose) => [item?.status, item?.code];

describe('acquire:batch: the same slot twice in one batch (sequences n and n+1)', () => {
  it('without a wait: n is a new empty poll and n+1 the next new poll (as sent one after another)', async () => {
    const queue = fresh('dup-acq');
    const s = await session(KEYS.star, A, queue);
    const reply = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch', {
      commands: [poll(s, 0, 1), poll(s, 0, 2)],
    });
    expect(reply.status).toBe(200);
    expect(reply.body.replies).toEqual([
      { disposition: 'empty', sequence: 1 },
      { disposition: 'empty', sequence: 2 },
    ]);
  });

  it('with a wait that ends empty: the same answers, and the cursor at n+1', async () => {
    const queue = fresh('dup-acq-wait');
    const s = await session(KEYS.star, A, queue);
    const reply = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=300', {
      commands: [poll(s, 0, 1), poll(s, 0, 2)],
    });
    expect(reply.status).toBe(200);
    expect(reply.body.replies).toEqual([
      { disposition: 'empty', sequence: 1 },
      { disposition: 'empty', sequence: 2 },
    ]);
    // The slot's cursor followed the reply: 3 is the next new poll, 2 replays.
    const next = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch', {
      commands: [poll(s, 0, 2), poll(s, 0, 3)],
    });
    expect(next.body.replies).toEqual([
      { disposition: 'empty', sequence: 2 },
      { disposition: 'empty', sequence: 3 },
    ]);
  });

  it('with a wait and a task arriving: n is assigned, n+1 is consumer_busy (as sent one after another)', async () => {
    const queue = fresh('dup-acq-task');
    const s = await session(KEYS.star, A, queue);
    const parked = call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=10000', {
      commands: [poll(s, 0, 1), poll(s, 0, 2)],
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const task = await submit(KEYS.star, A, queue);
    const reply = await parked;
    expect(reply.status).toBe(200);
    expect(reply.body.replies[0].disposition).toBe('assigned');
    expect(reply.body.replies[0].assignment.lease.owner.task_id).toBe(task.task_id);
    expect(problem(reply.body.replies[1])).toEqual([409, 'consumer_busy']);
  });
});

describe('acquire:batch?wait_ms with items of several queues', () => {
  it('a task arriving on the queue of the second item wakes the batch before its wait ends', async () => {
    const q1 = fresh('multi-1');
    const q2 = fresh('multi-2');
    const s1 = await session(KEYS.star, A, q1);
    const s2 = await session(KEYS.star, B, q2);
    const started = performance.now();
    const parked = call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=8000', {
      commands: [poll(s1, 0, 1), poll(s2, 0, 1)],
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const task = await submit(KEYS.star, B, q2);
    const reply = await parked;
    const elapsed = performance.now() - started;
    expect(reply.status).toBe(200);
    expect(reply.body.replies[0]).toEqual({ disposition: 'empty', sequence: 1 });
    expect(reply.body.replies[1].assignment.lease.owner.task_id).toBe(task.task_id);
    // Woken by the hint: neither the wait (8 s) nor the rescan (60 s) ended the park.
    expect(elapsed).toBeLessThan(6_000);
  });

  it('a first item refused (queue mismatch) does not leave the others unwoken', async () => {
    const queue = fresh('mismatch');
    const s = await session(KEYS.star, A, queue, 2);
    const started = performance.now();
    const parked = call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=8000', {
      commands: [{ ...poll(s, 1, 1), queue: fresh('other') }, poll(s, 0, 1)],
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const task = await submit(KEYS.star, A, queue);
    const reply = await parked;
    const elapsed = performance.now() - started;
    expect(problem(reply.body.replies[0])).toEqual([400, 'invalid_input']);
    expect(reply.body.replies[1].assignment.lease.owner.task_id).toBe(task.task_id);
    expect(elapsed).toBeLessThan(6_000);
  });
});

describe('acquire:batch reply bound (ACQUIRE_BATCH_REPLY_MAX_BYTES) with replays and repeated slots', () => {
  const data = 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2);
  /** Allowance for the envelope and the `empty` items beside the assignments. */
  const SLACK = 64 * 1024;

  it('replayed assignments count against the bound: new claims stop before the reply passes it', async () => {
    const queue = fresh('budget-replay');
    const tasks = 20;
    for (let i = 0; i < tasks; i++) await submit(KEYS.star, A, queue, { data });
    const s = await session(KEYS.star, A, queue, tasks);
    // Half the slots claim one large task each, one poll at a time (each reply well within it).
    for (let slot = 0; slot < tasks / 2; slot++) {
      const one = await call(KEYS.star, 'POST', '/v1/worker/acquire', poll(s, slot, 1));
      expect(one.body.disposition).toBe('assigned');
    }
    // Their replays (a resend after lost replies) beside new polls of the other half.
    const commands = Array.from({ length: tasks }, (_, slot) => poll(s, slot, 1));
    const reply = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch', { commands });
    expect(reply.status).toBe(200);
    const replayed = reply.body.replies.slice(0, tasks / 2);
    expect(replayed.every((r: Loose) => r.disposition === 'assigned')).toBe(true);
    expect(reply.bytes).toBeLessThanOrEqual(ACQUIRE_BATCH_REPLY_MAX_BYTES + SLACK);
    // The polls refused for bytes left their tasks queued for later polls.
    const assigned = reply.body.replies.filter((r: Loose) => r.disposition === 'assigned').length;
    const queued = await call(
      KEYS.star,
      'GET',
      `${scopePath(A)}/tasks?queue=${queue}&state=queued`,
    );
    expect(queued.body.tasks).toHaveLength(tasks - assigned);
  });

  it('a long poll keeps the bound: the polls its probe turned away for size claim no more when recorded', async () => {
    // Until 2026-12-05 the empties a long poll's probe left were recorded by a second claim with
    // a bound of its own: the reply carried the probe's ~16 MiB and up to 16 MiB more.
    const queue = fresh('budget-wait');
    const tasks = Math.ceil(ACQUIRE_BATCH_REPLY_MAX_BYTES / SUBMISSION_DATA_MAX_BYTES) + 2;
    for (let i = 0; i < tasks; i++) await submit(KEYS.star, A, queue, { data });
    const s = await session(KEYS.star, A, queue, tasks);
    const commands = Array.from({ length: tasks }, (_, slot) => poll(s, slot, 1));
    const reply = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch?wait_ms=1000', {
      commands,
    });
    expect(reply.status).toBe(200);
    expect(reply.bytes).toBeLessThanOrEqual(ACQUIRE_BATCH_REPLY_MAX_BYTES + SLACK);
    const assigned = reply.body.replies.filter((r: Loose) => r.disposition === 'assigned').length;
    expect(assigned).toBeLessThan(tasks);
    const queued = await call(
      KEYS.star,
      'GET',
      `${scopePath(A)}/tasks?queue=${queue}&state=queued`,
    );
    expect(queued.body.tasks).toHaveLength(tasks - assigned);
  });

  it('a batch repeating a slot keeps the bound across its polls', async () => {
    const queue = fresh('budget-repeat');
    const tasks = Math.ceil(ACQUIRE_BATCH_REPLY_MAX_BYTES / SUBMISSION_DATA_MAX_BYTES) + 1;
    for (let i = 0; i < tasks; i++) await submit(KEYS.star, A, queue, { data });
    const s = await session(KEYS.star, A, queue, tasks);
    const commands = [
      ...Array.from({ length: tasks }, (_, slot) => poll(s, slot, 1)),
      poll(s, 0, 2),
    ];
    const reply = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch', { commands });
    expect(reply.status).toBe(200);
    expect(problem(reply.body.replies[tasks])).toEqual([409, 'consumer_busy']);
    expect(reply.bytes).toBeLessThanOrEqual(ACQUIRE_BATCH_REPLY_MAX_BYTES + SLACK);
    const assigned = reply.body.replies.filter((r: Loose) => r.disposition === 'assigned').length;
    expect(assigned).toBeGreaterThan(0);
    const queued = await call(
      KEYS.star,
      'GET',
      `${scopePath(A)}/tasks?queue=${queue}&state=queued`,
    );
    expect(queued.body.tasks).toHaveLength(tasks - assigned);
  });
});

const renewBody = (
  owner: Loose,
  sequence: number,
  intent: 'dispatch' | 'keep_alive' = 'keep_alive',
) => ({
  owner,
  sequence,
  intent,
});

function settleBody(owner: Loose, op: string, output: unknown = { ok: true }) {
  return {
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
  };
}

const reasons = async (scope: Scope, taskId: string) =>
  ((await state(scope, taskId)).history as Loose[]).map((e) => e.event.reason);

describe('renew:batch: one owner several times in one batch', () => {
  it('n, n, n+1, n+1, n-1, n+3: answered as sent one after another, dispatch recorded once', async () => {
    const { owner, task } = await claimed(KEYS.star, A);
    const reply = await call(KEYS.star, 'POST', '/v1/worker/renew:batch', {
      commands: [
        renewBody(owner, 1, 'dispatch'),
        renewBody(owner, 1, 'dispatch'),
        renewBody(owner, 2),
        renewBody(owner, 2),
        renewBody(owner, 1, 'dispatch'),
        renewBody(owner, 4),
      ],
    });
    expect(reply.status).toBe(200);
    const summary = reply.body.results.map((r: Loose) =>
      r.code === undefined ? `${r.renew_sequence}:${r.dispatch_allowed}` : r.code,
    );
    expect(summary).toEqual([
      '1:true',
      '1:true',
      '2:true',
      '2:true',
      'sequence_conflict',
      'sequence_conflict',
    ]);
    // The next renewal follows on from 2.
    const next = await call(KEYS.star, 'POST', '/v1/worker/renew', renewBody(owner, 3));
    expect([next.status, next.body.renew_sequence]).toEqual([200, 3]);
    expect(
      (await reasons(A, task.task_id)).filter((r) => r === 'dispatch_authorized'),
    ).toHaveLength(1);
  });

  it(`${MAX_WORKER_BATCH} renewals of one owner are one batch; ${MAX_WORKER_BATCH + 1} are 400 and renew nothing`, async () => {
    const { owner } = await claimed(KEYS.star, A);
    const over = Array.from({ length: MAX_WORKER_BATCH + 1 }, (_, i) =>
      renewBody(owner, i + 1, i === 0 ? 'dispatch' : 'keep_alive'),
    );
    const refused = await call(KEYS.star, 'POST', '/v1/worker/renew:batch', { commands: over });
    expect(problem(refused.body)).toEqual([400, 'invalid_input']);
    const at = over.slice(0, MAX_WORKER_BATCH);
    const accepted = await call(KEYS.star, 'POST', '/v1/worker/renew:batch', { commands: at });
    expect(accepted.status).toBe(200);
    expect(accepted.body.results.map((r: Loose) => r.renew_sequence)).toEqual(
      at.map((c) => c.sequence),
    );
  });
});

describe('settle:batch: one attempt several times in one batch', () => {
  it('the same bytes twice: accepted once, then already_accepted with the same receipt', async () => {
    const { owner, task } = await claimed(KEYS.star, A);
    await call(KEYS.star, 'POST', '/v1/worker/renew', renewBody(owner, 1, 'dispatch'));
    const cmd = settleBody(owner, 'op-same');
    const reply = await call(KEYS.star, 'POST', '/v1/worker/settle:batch', {
      commands: [cmd, cmd],
    });
    expect(reply.status).toBe(200);
    const [first, second] = reply.body.results;
    expect([first.already_accepted, second.already_accepted]).toEqual([false, true]);
    expect(second.receipt).toEqual(first.receipt);
    const r = await reasons(A, task.task_id);
    expect(r.filter((x) => x === 'report_accepted')).toHaveLength(1);
  });

  it('the same operation id with other bytes, and another operation: 409 conflict, the first stands', async () => {
    const { owner, task } = await claimed(KEYS.star, A);
    await call(KEYS.star, 'POST', '/v1/worker/renew', renewBody(owner, 1, 'dispatch'));
    const reply = await call(KEYS.star, 'POST', '/v1/worker/settle:batch', {
      commands: [
        settleBody(owner, 'op-a', { v: 1 }),
        settleBody(owner, 'op-a', { v: 2 }),
        settleBody(owner, 'op-b', { v: 1 }),
        settleBody(owner, 'op-a', { v: 1 }),
      ],
    });
    expect(reply.status).toBe(200);
    const [a, b, c, d] = reply.body.results;
    expect(a.already_accepted).toBe(false);
    expect(problem(b)).toEqual([409, 'conflict']);
    expect(problem(c)).toEqual([409, 'conflict']);
    expect(d.already_accepted).toBe(true);
    const result = await call(KEYS.star, 'GET', `${scopePath(A)}/tasks/${task.task_id}/result`);
    expect(result.body.outcome).toEqual({ state: 'succeeded', output: { v: 1 } });
  });
});

describe('worker batches with items of several scopes', () => {
  it('a key bound to a and b: items of both namespaces answered, an item of another tenant 403 alone, in request order', async () => {
    const inA = await claimed(KEYS.ab, A);
    const inB = await claimed(KEYS.ab, B);
    const inG = await claimed(KEYS.globex, G);
    const before = await state(G, inG.task.task_id);
    const renewed = await call(KEYS.ab, 'POST', '/v1/worker/renew:batch', {
      commands: [
        renewBody(inA.owner, 1, 'dispatch'),
        renewBody(inG.owner, 1, 'dispatch'),
        renewBody(inB.owner, 1, 'dispatch'),
      ],
    });
    expect(renewed.status).toBe(200);
    const [ra, rg, rb] = renewed.body.results;
    expect([ra.dispatch_allowed, rb.dispatch_allowed]).toEqual([true, true]);
    expect(problem(rg)).toEqual([403, 'forbidden']);
    const settled = await call(KEYS.ab, 'POST', '/v1/worker/settle:batch', {
      commands: [
        settleBody(inB.owner, 'op-b'),
        settleBody(inG.owner, 'op-g'),
        settleBody(inA.owner, 'op-a'),
      ],
    });
    expect(settled.status).toBe(200);
    const [sb, sg, sa] = settled.body.results;
    expect([sb.task_state, sa.task_state]).toEqual(['succeeded', 'succeeded']);
    expect(problem(sg)).toEqual([403, 'forbidden']);
    expect(await state(G, inG.task.task_id)).toEqual(before);
  });

  it('acquire:batch over sessions of two namespaces and another tenant: each slot on its own', async () => {
    const q = fresh('scopes');
    const ta = await submit(KEYS.ab, A, q);
    const tb = await submit(KEYS.ab, B, q);
    const tg = await submit(KEYS.globex, G, q);
    const sa = await session(KEYS.ab, A, q);
    const sb = await session(KEYS.ab, B, q);
    const sg = await session(KEYS.globex, G, q);
    const reply = await call(KEYS.ab, 'POST', '/v1/worker/acquire:batch', {
      commands: [poll(sg, 0, 1), poll(sb, 0, 1), poll(sa, 0, 1)],
    });
    expect(reply.status).toBe(200);
    const [rg, rb, ra] = reply.body.replies;
    expect(problem(rg)).toEqual([403, 'forbidden']);
    expect(rb.assignment.lease.owner.task_id).toBe(tb.task_id);
    expect(ra.assignment.lease.owner.task_id).toBe(ta.task_id);
    expect((await state(G, tg.task_id)).snapshot.state).toBe('queued');
  });
});

describe('acquire:batch at MAX_WORKER_BATCH', () => {
  it(`${MAX_WORKER_BATCH} slots of one session are answered; ${MAX_WORKER_BATCH + 1} polls are 400 and record nothing`, async () => {
    const queue = fresh('max-acq');
    const s = await session(KEYS.star, A, queue, MAX_WORKER_BATCH);
    const over = [
      ...Array.from({ length: MAX_WORKER_BATCH }, (_, slot) => poll(s, slot, 1)),
      poll(s, 0, 2),
    ];
    const refused = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch', { commands: over });
    expect(problem(refused.body)).toEqual([400, 'invalid_input']);
    const task = await submit(KEYS.star, A, queue);
    const at = Array.from({ length: MAX_WORKER_BATCH }, (_, slot) => poll(s, slot, 1));
    const reply = await call(KEYS.star, 'POST', '/v1/worker/acquire:batch', { commands: at });
    expect(reply.status).toBe(200);
    expect(reply.body.replies).toHaveLength(MAX_WORKER_BATCH);
    // Sequence 1 was still new for every slot: nothing was recorded by the refused batch.
    expect(reply.body.replies.map((r: Loose) => r.sequence)).toEqual(at.map(() => 1));
    const assigned = reply.body.replies.filter((r: Loose) => r.disposition === 'assigned');
    expect(assigned.map((r: Loose) => r.assignment.lease.owner.task_id)).toEqual([task.task_id]);
  });
});

describe('an item whose content PostgreSQL treats specially does not fail its neighbours', () => {
  it('settle:batch: a failure message and details with NUL characters beside a plain success', async () => {
    const one = await claimed(KEYS.star, A);
    const two = await claimed(KEYS.star, A);
    await call(KEYS.star, 'POST', '/v1/worker/renew', renewBody(one.owner, 1, 'dispatch'));
    await call(KEYS.star, 'POST', '/v1/worker/renew', renewBody(two.owner, 1, 'dispatch'));
    const failure = {
      owner: one.owner,
      operation_id: 'op-nul',
      report: {
        kind: 'completed',
        report: {
          context: { identity: { task_id: one.owner.task_id, attempt_id: one.owner.attempt_id } },
          outcome: {
            kind: 'application_error',
            error: {
              code: 'nul_inside',
              message: 'a\u0000b',
              details: { '\u0000': 'x\u0000y' },
              retryable: false,
            },
          },
        },
      },
      quiescence: 'confirmed',
      processing_trace: null,
    };
    const reply = await call(KEYS.star, 'POST', '/v1/worker/settle:batch', {
      commands: [failure, settleBody(two.owner, 'op-plain')],
    });
    expect(reply.status).toBe(200);
    expect(reply.body.results.map((r: Loose) => r.task_state ?? r.code)).toEqual([
      'failed',
      'succeeded',
    ]);
    const result = await call(KEYS.star, 'GET', `${scopePath(A)}/tasks/${one.task.task_id}/result`);
    expect(result.body.outcome.failure.error).toEqual(failure.report.report.outcome.error);
  });
});
