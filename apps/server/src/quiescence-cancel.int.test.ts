/**
 * Quiescence and cancellation together (review r50d) over the real server (HTTP, PostgreSQL,
 * maintenance loop, completion sender). DESIGN §5 Settle ("with quiescence: unconfirmed the task
 * stays active until confirm_quiescence (or the authority deadline), then takes its outcome
 * (cleanup_confirmed)"), §5 Cancel, §4.1 conflict codes, §6 POST /v1/worker/quiescence, §8.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type {
  AcquireReply,
  Assignment,
  RecordedHistoryEvent,
  Scope,
  TaskResult,
  TaskSnapshot,
  TaskStatus,
  WorkerSession,
} from '@ledgence/contracts';
import { afterAll, describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'r50d-acme-star-key-00000001';
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const SCOPE = `/v1/tenants/${A.tenant_id}/namespaces/${A.namespace}`;
const TIMEOUT_MS = 1_000;
const GRACE_MS = 400;

interface Post {
  at: number;
  id: string;
  data: { task_id: string; state: string };
}
const posted: Post[] = [];
const receiver: Server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    posted.push({ at: Date.now(), id: String(req.headers['webhook-id']), data: body.data });
    res.writeHead(204).end();
  });
});
const port: number = await new Promise((resolve) => {
  receiver.listen(0, '127.0.0.1', () => resolve((receiver.address() as AddressInfo).port));
});
afterAll(() => new Promise<void>((resolve) => receiver.close(() => resolve())));

const server = keyedServer('r50d_quiescence', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    hook: {
      url: `http://127.0.0.1:${port}/hook`,
      secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
    },
  }),
  LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  LEDGENCE_LEASE_DURATION_MS: '5000',
  LEDGENCE_CLEANUP_GRACE_MS: String(GRACE_MS),
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '100',
  LEDGENCE_MAINTENANCE_INTERVAL_MS: '100',
  LEDGENCE_LONG_POLL_WAIT_MS: '10000',
});
const { post, get } = server.as(KEY);

let n = 0;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function submit(queue: string, extra: Record<string, unknown> = {}): Promise<string> {
  const reply = await post<TaskSnapshot>(`${SCOPE}/tasks`, {
    idempotency_key: `${queue}-${++n}`,
    input: {
      ...A,
      queue,
      program: { name: 'p' },
      data: n,
      timeout_ms: TIMEOUT_MS,
      retry: { max_attempts: 3, delay_ms: 0 },
      ...extra,
    },
  });
  expect(reply.status).toBe(201);
  return reply.body.task_id;
}

async function session(queue: string, concurrency = 1): Promise<WorkerSession> {
  return (await post<WorkerSession>('/v1/worker/sessions', { scope: A, queue, concurrency })).body;
}

async function acquire(queue: string, s: WorkerSession, consumer = 0, sequence = 1) {
  const reply = await post<AcquireReply>('/v1/worker/acquire', {
    scope: A,
    queue,
    worker_session_id: s.id,
    consumer_id: consumer,
    sequence,
  });
  expect(reply.status).toBe(200);
  return reply.body;
}

async function claim(queue: string): Promise<Assignment> {
  const s = await session(queue);
  const reply = await acquire(queue, s);
  expect(reply.disposition).toBe('assigned');
  const assignment = (reply as { assignment: Assignment }).assignment;
  const renewed = await post('/v1/worker/renew', {
    owner: assignment.lease.owner,
    sequence: 1,
    intent: 'dispatch',
  });
  expect(renewed.status).toBe(200);
  return assignment;
}

/** The `count` queued tasks of `queue`, each claimed by a slot of one session and granted dispatch. */
async function claimEach(queue: string, count: number): Promise<Assignment[]> {
  const s = await session(queue, count);
  const assignments: Assignment[] = [];
  for (let c = 0; c < count; c++) {
    const reply = await acquire(queue, s, c);
    const assignment = (reply as { assignment: Assignment }).assignment;
    const renewed = await post('/v1/worker/renew', {
      owner: assignment.lease.owner,
      sequence: 1,
      intent: 'dispatch',
    });
    expect(renewed.status).toBe(200);
    assignments.push(assignment);
  }
  return assignments;
}

function settleBody(
  a: Assignment,
  quiescence: 'confirmed' | 'unconfirmed',
  outcome: unknown = { kind: 'success', output: 'out' },
  op = `op-${a.lease.owner.attempt_id}`,
) {
  const owner = a.lease.owner;
  return {
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome,
      },
    },
    quiescence,
    processing_trace: null,
  };
}

const reasons = async (taskId: string) =>
  (await get<RecordedHistoryEvent[]>(`${SCOPE}/tasks/${taskId}/history`)).body.map(
    (r) => r.event.reason,
  );
const status = async (taskId: string) => (await get<TaskStatus>(`${SCOPE}/tasks/${taskId}`)).body;
const subscribe = async (taskId: string) => {
  const r = await post(`${SCOPE}/tasks/${taskId}/completion-subscriptions`, {
    subscription_key: 's',
    destination: 'hook',
  });
  expect(r.status).toBe(201);
};
const resultWait = (taskId: string, ms = 8_000) => {
  const started = Date.now();
  return get<TaskResult>(`${SCOPE}/tasks/${taskId}/result?wait_ms=${ms}`).then((r) => ({
    ...r,
    tookMs: Date.now() - started,
  }));
};
async function until<T>(read: () => Promise<T>, done: (v: T) => boolean, ms = 8_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await read();
    if (done(v) || Date.now() > deadline) return v;
    await sleep(25);
  }
}
const postsFor = (taskId: string) => posted.filter((p) => p.data?.task_id === taskId);

describe('held (unconfirmed) settlement, then confirm', () => {
  it('success held: active, key held, no callback; cancel meanwhile; confirm takes the outcome once, wakes the result wait, frees the key, fires one callback', async () => {
    const queue = `held-${++n}`;
    const key = `k-${queue}`;
    const first = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    const second = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    await subscribe(first);
    const a = await claim(queue);
    expect(a.lease.owner.task_id).toBe(first);

    const settled = await post('/v1/worker/settle', settleBody(a, 'unconfirmed'));
    expect(settled.status).toBe(200);
    expect(settled.body.task_state).toBe('active');
    // Replay while held.
    const replay = await post('/v1/worker/settle', settleBody(a, 'unconfirmed'));
    expect(replay.body).toMatchObject({ already_accepted: true, task_state: 'active' });

    const wait = resultWait(first);
    const s2 = await session(queue);
    expect((await acquire(queue, s2)).disposition).toBe('empty');

    expect((await post(`${SCOPE}/tasks/${first}/cancel`)).body).toEqual({ task_state: 'active' });
    expect((await status(first)).state).toBe('active');
    const pending = await get<TaskResult>(`${SCOPE}/tasks/${first}/result`);
    expect(pending.body.outcome).toEqual({ state: 'pending' });
    await sleep(300);
    expect(postsFor(first)).toEqual([]);

    const confirmedAt = Date.now();
    const confirmed = await post('/v1/worker/quiescence', a.lease.owner);
    expect(confirmed.status).toBe(200);
    const finalState = confirmed.body.task_state as string;
    expect(['succeeded', 'cancelled']).toContain(finalState);
    const woke = await wait;
    expect(woke.body.outcome.state).toBe(finalState);
    expect(woke.body.status.state).toBe(finalState);
    expect((await status(first)).state).toBe(finalState);
    const history = await reasons(first);
    expect(history).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'cancel_requested',
      'cleanup_confirmed',
      finalState,
    ]);
    // Replayed confirmation: same state, nothing written.
    const again = await post('/v1/worker/quiescence', a.lease.owner);
    expect(again.body).toEqual({ task_state: finalState });
    expect(await reasons(first)).toEqual(history);
    // The key is free.
    const next = await acquire(queue, s2, 0, 2);
    expect(next.disposition).toBe('assigned');
    expect((next as { assignment: Assignment }).assignment.lease.owner.task_id).toBe(second);
    // One callback, after the confirmation, with the final state.
    const posts = await until(
      async () => postsFor(first),
      (p) => p.length > 0,
    );
    await sleep(200);
    expect(postsFor(first)).toHaveLength(1);
    expect(posts[0]?.at).toBeGreaterThanOrEqual(confirmedAt);
    expect(posts[0]?.data.state).toBe(finalState);
    // Attempt view agrees.
    const attempt = (await get(`${SCOPE}/tasks/${first}/attempts/${a.lease.owner.attempt_id}`))
      .body;
    expect(attempt.quiescence).toBe('confirmed');
    expect(attempt.state).toBe(finalState);
  });

  it('cancel requested before an unconfirmed success: held as cancel, confirm → cancelled, output not kept', async () => {
    const queue = `held-c-${++n}`;
    const id = await submit(queue);
    const a = await claim(queue);
    expect((await post(`${SCOPE}/tasks/${id}/cancel`)).body).toEqual({ task_state: 'active' });
    const settled = await post('/v1/worker/settle', settleBody(a, 'unconfirmed'));
    expect(settled.body.task_state).toBe('active');
    const wait = resultWait(id);
    await sleep(100);
    const confirmed = await post('/v1/worker/quiescence', a.lease.owner);
    expect(confirmed.body).toEqual({ task_state: 'cancelled' });
    const r = await wait;
    expect(r.body.outcome).toEqual({ state: 'cancelled' });
    expect(await reasons(id)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'cancel_requested',
      'report_accepted',
      'cleanup_confirmed',
      'cancelled',
    ]);
  });

  it('held retryable failure + cancel: confirm cancels, never retried, key freed', async () => {
    const queue = `held-r-${++n}`;
    const key = `k-${queue}`;
    const id = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    const other = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    const a = await claim(queue);
    const fail = {
      kind: 'application_error',
      error: { code: 'x', message: 'boom', retryable: true },
    };
    expect(
      (await post('/v1/worker/settle', settleBody(a, 'unconfirmed', fail))).body.task_state,
    ).toBe('active');
    expect((await post(`${SCOPE}/tasks/${id}/cancel`)).body).toEqual({ task_state: 'active' });
    expect((await post('/v1/worker/quiescence', a.lease.owner)).body).toEqual({
      task_state: 'cancelled',
    });
    const st = await status(id);
    expect(st.state).toBe('cancelled');
    expect(st.attempt_count).toBe(1);
    const s2 = await session(queue);
    const next = await acquire(queue, s2);
    expect((next as { assignment: Assignment }).assignment.lease.owner.task_id).toBe(other);
  });
});

describe('confirm refused', () => {
  it('wrong owner: 409 ownership_lost, nothing changes', async () => {
    const queue = `wrong-${++n}`;
    const id = await submit(queue);
    const a = await claim(queue);
    await post('/v1/worker/settle', settleBody(a, 'unconfirmed'));
    const before = await reasons(id);
    for (const bad of [
      { ...a.lease.owner, lease_id: `${a.lease.owner.lease_id}x` },
      { ...a.lease.owner, generation: a.lease.owner.generation + 1 },
      { ...a.lease.owner, consumer_id: a.lease.owner.consumer_id + 1 },
    ]) {
      const r = await post('/v1/worker/quiescence', bad);
      expect(r.status).toBe(409);
      expect(r.body.code).toBe('ownership_lost');
    }
    expect(await reasons(id)).toEqual(before);
    expect((await status(id)).state).toBe('active');
    await post('/v1/worker/quiescence', a.lease.owner);
  });

  it('before any settlement: 409 conflict; the lease stays and the attempt is unchanged', async () => {
    const queue = `early-${++n}`;
    const id = await submit(queue);
    const a = await claim(queue);
    const r = await post('/v1/worker/quiescence', a.lease.owner);
    expect(r.status).toBe(409);
    expect(r.body.code).toBe('conflict');
    expect((await status(id)).state).toBe('active');
    const s = await post('/v1/worker/settle', settleBody(a, 'confirmed'));
    expect(s.body.task_state).toBe('succeeded');
    // Confirming a settlement that was `confirmed`: answers the state, changes nothing.
    const before = await reasons(id);
    expect((await post('/v1/worker/quiescence', a.lease.owner)).body).toEqual({
      task_state: 'succeeded',
    });
    expect(await reasons(id)).toEqual(before);
  });

  it('past the authority deadline: recovery takes the held outcome once (woken wait, freed key, one callback); the late confirm is ownership_lost', async () => {
    const queue = `late-${++n}`;
    const key = `k-${queue}`;
    const id = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    const other = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    await subscribe(id);
    const a = await claim(queue);
    const fail = {
      kind: 'application_error',
      error: { code: 'x', message: 'boom', retryable: false },
    };
    await post('/v1/worker/settle', settleBody(a, 'unconfirmed', fail));
    const wait = resultWait(id);
    const r = await wait;
    expect(r.body.outcome.state).toBe('failed');
    const attemptView = (await get(`${SCOPE}/tasks/${id}/attempts/${a.lease.owner.attempt_id}`))
      .body;
    expect(attemptView.state).toBe('failed');
    expect(attemptView.quiescence).toBe('unconfirmed');
    // Took about the authority deadline, not the full wait.
    expect(r.tookMs).toBeLessThan(TIMEOUT_MS + GRACE_MS + 2_000);
    const history = await reasons(id);
    expect(history).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'report_accepted',
      'failed',
    ]);
    const late = await post('/v1/worker/quiescence', a.lease.owner);
    expect(late.status).toBe(409);
    expect(late.body.code).toBe('ownership_lost');
    expect(await reasons(id)).toEqual(history);
    const s2 = await session(queue);
    const next = await acquire(queue, s2);
    expect((next as { assignment: Assignment }).assignment.lease.owner.task_id).toBe(other);
    await until(
      async () => postsFor(id),
      (p) => p.length > 0,
    );
    await sleep(200);
    expect(postsFor(id).map((p) => p.data.state)).toEqual(['failed']);
  });
});

describe('cancel', () => {
  it('queued: cancelled at once, wakes a result wait, one callback; terminal: answers state, changes nothing', async () => {
    const queue = `cq-${++n}`;
    const id = await submit(queue);
    await subscribe(id);
    const wait = resultWait(id);
    await sleep(100);
    expect((await post(`${SCOPE}/tasks/${id}/cancel`)).body).toEqual({ task_state: 'cancelled' });
    const r = await wait;
    expect(r.body.outcome).toEqual({ state: 'cancelled' });
    expect(r.tookMs).toBeLessThan(3_000);
    const snap = (await get(`${SCOPE}/tasks/${id}/snapshot`)).body;
    const hist = await reasons(id);
    expect((await post(`${SCOPE}/tasks/${id}/cancel`)).body).toEqual({ task_state: 'cancelled' });
    expect((await get(`${SCOPE}/tasks/${id}/snapshot`)).body).toEqual(snap);
    expect(await reasons(id)).toEqual(hist);
    await until(
      async () => postsFor(id),
      (p) => p.length > 0,
    );
    await sleep(200);
    expect(postsFor(id).map((p) => p.data.state)).toEqual(['cancelled']);
  });

  it('cancel_requested then lease expiry with attempts left: cancelled, never retried, key freed, wait woken', async () => {
    const queue = `cx-${++n}`;
    const key = `k-${queue}`;
    const id = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    const other = await submit(queue, { concurrency_key: key, concurrency_limit: 1 });
    await subscribe(id);
    const a = await claim(queue);
    expect((await post(`${SCOPE}/tasks/${id}/cancel`)).body).toEqual({ task_state: 'active' });
    // second cancel: no new history
    expect((await post(`${SCOPE}/tasks/${id}/cancel`)).body).toEqual({ task_state: 'active' });
    const r = await resultWait(id);
    expect(r.body.outcome).toEqual({ state: 'cancelled' });
    expect(await reasons(id)).toEqual([
      'submitted',
      'claimed',
      'dispatch_authorized',
      'cancel_requested',
      'lease_expired',
      'cancelled',
    ]);
    const st = await status(id);
    expect(st.attempt_count).toBe(1);
    const attemptView = (await get(`${SCOPE}/tasks/${id}/attempts/${a.lease.owner.attempt_id}`))
      .body;
    expect(attemptView.state).toBe('lost');
    const s2 = await session(queue);
    const next = await acquire(queue, s2);
    expect((next as { assignment: Assignment }).assignment.lease.owner.task_id).toBe(other);
    await until(
      async () => postsFor(id),
      (p) => p.length > 0,
    );
    await sleep(200);
    expect(postsFor(id).map((p) => p.data.state)).toEqual(['cancelled']);
    // A late settle: ownership_lost.
    const late = await post('/v1/worker/settle', settleBody(a, 'confirmed'));
    expect(late.status).toBe(409);
    expect(late.body.code).toBe('ownership_lost');
  });

  it('cancel racing a success settle, many tasks: state, replies and history agree; one terminal event each', async () => {
    const queue = `race-${++n}`;
    const count = 12;
    for (let i = 0; i < count; i++) await submit(queue);
    const assignments = await claimEach(queue, count);
    const results = await Promise.all(
      assignments.map(async (a) => {
        const [settle, cancel] = await Promise.all([
          post('/v1/worker/settle', settleBody(a, 'confirmed')),
          post(`${SCOPE}/tasks/${a.lease.owner.task_id}/cancel`),
        ]);
        return { a, settle, cancel };
      }),
    );
    for (const { a, settle, cancel } of results) {
      const id = a.lease.owner.task_id;
      const st = await status(id);
      const hist = await reasons(id);
      const terminalEvents = hist.filter((h) => ['succeeded', 'cancelled', 'failed'].includes(h));
      expect(terminalEvents).toHaveLength(1);
      expect(terminalEvents[0]).toBe(st.state);
      expect(settle.body.task_state).toBe(st.state);
      if (st.state === 'succeeded') {
        expect(cancel.body.task_state).toBe('succeeded');
        expect(hist).not.toContain('cancel_requested');
      } else {
        expect(st.state).toBe('cancelled');
        expect(cancel.body.task_state).toBe('active');
        expect(hist.indexOf('cancel_requested')).toBeLessThan(hist.indexOf('report_accepted'));
      }
    }
  });
});

describe('held retry: confirm racing cancel', () => {
  it('each task ends cancelled exactly once whatever the order; replies agree with history; never claimed again', async () => {
    const queue = `hr-race-${++n}`;
    const count = 10;
    for (let i = 0; i < count; i++) await submit(queue);
    const assignments = await claimEach(queue, count);
    for (const assignment of assignments) {
      const fail = { kind: 'application_error', error: { code: 'x', message: 'm' } };
      const settled = await post('/v1/worker/settle', settleBody(assignment, 'unconfirmed', fail));
      expect(settled.body.task_state).toBe('active');
    }
    const results = await Promise.all(
      assignments.map(async (a) => {
        const [confirm, cancel] = await Promise.all([
          post('/v1/worker/quiescence', a.lease.owner),
          post(`${SCOPE}/tasks/${a.lease.owner.task_id}/cancel`),
        ]);
        return { a, confirm, cancel };
      }),
    );
    for (const { a, confirm, cancel } of results) {
      const id = a.lease.owner.task_id;
      const st = await status(id);
      expect(st.state).toBe('cancelled');
      const hist = await reasons(id);
      expect(hist.filter((h) => h === 'cancelled')).toHaveLength(1);
      expect(hist).toContain('cleanup_confirmed');
      if (hist.includes('retry_scheduled')) {
        // confirm first: re-queued, then cancelled at once
        expect(confirm.body.task_state).toBe('queued');
        expect(cancel.body.task_state).toBe('cancelled');
      } else {
        expect(confirm.body.task_state).toBe('cancelled');
        expect(cancel.body.task_state).toBe('active');
      }
      const replay = await post(
        '/v1/worker/settle',
        settleBody(a, 'unconfirmed', {
          kind: 'application_error',
          error: { code: 'x', message: 'm' },
        }),
      );
      expect(replay.body).toMatchObject({ already_accepted: true, task_state: 'cancelled' });
    }
    const s2 = await session(queue);
    expect((await acquire(queue, s2)).disposition).toBe('empty');
  });
});
