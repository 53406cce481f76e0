/**
 * DESIGN §5's lifecycle rules as the real server answers them (HTTP routes, group commit of
 * concurrent single requests, PostgreSQL). The store's conformance suite checks each rule on
 * the store's own calls; here the same rules hold when requests arrive together over HTTP and
 * are coalesced into batch statements: heartbeats append no history and the first granted
 * dispatch appends `dispatch_authorized` once; a settle replay is `already_accepted`, another
 * settlement 409; a given `retry` without `backoff` is fixed; cancel of a queued, an active and
 * a terminal task.
 */
import type {
  AcquireReply,
  Assignment,
  Authority,
  Problem,
  RecordedHistoryEvent,
  Scope,
  SettleReply,
  TaskSnapshot,
  TaskStatus,
  WorkerSession,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'lh-acme-star-key-000000001';
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const SCOPE = `/v1/tenants/${A.tenant_id}/namespaces/${A.namespace}`;
const TASKS = 8;

const server = keyedServer('lifecycle_http', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});
const { post, get } = server.as(KEY);

let n = 0;
/** `count` tasks on a queue of their own, each assigned to a slot of one session. */
async function assignMany(count: number, input: Record<string, unknown> = {}) {
  const queue = `lh-${++n}`;
  const tasks = await Promise.all(
    Array.from({ length: count }, (_, i) =>
      post<TaskSnapshot>(`${SCOPE}/tasks`, {
        idempotency_key: `${queue}-${i}`,
        input: { ...A, queue, program: { name: 'p' }, data: i, ...input },
      }),
    ),
  );
  expect(tasks.map((t) => t.status)).toEqual(tasks.map(() => 201));
  const session = (
    await post<WorkerSession>('/v1/worker/sessions', { scope: A, queue, concurrency: count })
  ).body;
  const replies = await Promise.all(
    Array.from({ length: count }, (_, consumer) =>
      post<AcquireReply>('/v1/worker/acquire', {
        scope: A,
        queue,
        worker_session_id: session.id,
        consumer_id: consumer,
        sequence: 1,
      }),
    ),
  );
  return replies.map((r) => (r.body as { assignment: Assignment }).assignment);
}

const reasons = async (taskId: string) =>
  (await get<RecordedHistoryEvent[]>(`${SCOPE}/tasks/${taskId}/history`)).body.map(
    (r) => r.event.reason,
  );

function settleBody(
  assignment: Assignment,
  op: string,
  outcome: unknown = { kind: 'success', output: op },
) {
  const owner = assignment.lease.owner;
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
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

const renew = (a: Assignment, sequence: number, intent: 'keep_alive' | 'dispatch') =>
  post<Authority & Partial<Problem>>('/v1/worker/renew', {
    owner: a.lease.owner,
    sequence,
    intent,
  });

describe('DESIGN §5 Renew over HTTP, requests arriving together', () => {
  it('heartbeats append no history; the first granted dispatch appends dispatch_authorized once, replays and later dispatch intents none', async () => {
    const assignments = await assignMany(TASKS);
    for (const a of assignments) {
      expect([a.authority.renew_sequence, a.authority.dispatch_allowed]).toEqual([0, false]);
    }
    // Each step sent for every task at once (and each twice: a replay of the same sequence).
    const step = async (sequence: number, intent: 'keep_alive' | 'dispatch') => {
      const replies = await Promise.all(
        assignments.flatMap((a) => [renew(a, sequence, intent), renew(a, sequence, intent)]),
      );
      expect(replies.map((r) => r.status)).toEqual(replies.map(() => 200));
      return replies.map((r) => r.body);
    };
    await step(1, 'keep_alive');
    await step(2, 'keep_alive');
    const granted = await step(3, 'dispatch');
    expect(granted.map((g) => [g.renew_sequence, g.dispatch_allowed])).toEqual(
      granted.map(() => [3, true]),
    );
    await step(4, 'keep_alive');
    await step(5, 'dispatch');
    for (const a of assignments) {
      expect(await reasons(a.lease.owner.task_id)).toEqual([
        'submitted',
        'claimed',
        'dispatch_authorized',
      ]);
    }
    // A replay answers the current authority: the same sequence, never a later lease.
    const [latest] = await step(5, 'dispatch');
    const again = (await renew(assignments[0] as Assignment, 5, 'dispatch')).body;
    expect(again.renew_sequence).toBe(5);
    expect(again.expires_at).toBe(latest?.expires_at);
    const gap = await renew(assignments[0] as Assignment, 7, 'keep_alive');
    expect([gap.status, gap.body.code]).toEqual([409, 'sequence_conflict']);
    const lower = await renew(assignments[0] as Assignment, 4, 'keep_alive');
    expect([lower.status, lower.body.code]).toEqual([409, 'sequence_conflict']);
  });
});

describe('DESIGN §5 Settle over HTTP, requests arriving together', () => {
  it('the same operation replays (already_accepted), another settlement is 409 conflict; report_accepted and the outcome are recorded once', async () => {
    const assignments = await assignMany(TASKS);
    await Promise.all(assignments.map((a) => renew(a, 1, 'dispatch')));
    const replies = await Promise.all(
      assignments.flatMap((a) => [
        post<SettleReply>('/v1/worker/settle', settleBody(a, 'op-1')),
        post<SettleReply>('/v1/worker/settle', settleBody(a, 'op-1')),
      ]),
    );
    for (let i = 0; i < assignments.length; i += 1) {
      const pair = [replies[2 * i]?.body, replies[2 * i + 1]?.body] as SettleReply[];
      expect(pair.map((r) => r.task_state)).toEqual(['succeeded', 'succeeded']);
      // Exactly one of the two was the first; both carry the one receipt.
      expect(pair.map((r) => r.already_accepted).sort()).toEqual([false, true]);
      expect(pair[0]?.receipt).toEqual(pair[1]?.receipt);
    }
    const conflicts = await Promise.all(
      assignments.flatMap((a) => [
        post('/v1/worker/settle', settleBody(a, 'op-1', { kind: 'success', output: 'other' })),
        post('/v1/worker/settle', settleBody(a, 'op-2')),
      ]),
    );
    expect(conflicts.map((r) => [r.status, r.body.code])).toEqual(
      conflicts.map(() => [409, 'conflict']),
    );
    for (const a of assignments) {
      expect(await reasons(a.lease.owner.task_id)).toEqual([
        'submitted',
        'claimed',
        'dispatch_authorized',
        'report_accepted',
        'succeeded',
      ]);
    }
  });

  it('a given retry without backoff is fixed: the retry is due exactly delay_ms after acceptance; with backoff exponential it is jittered within it', async () => {
    const delay = 40_000;
    const failure = {
      kind: 'application_error',
      error: { code: 'e', message: 'm', retryable: true },
    };
    for (const [retry, fixed] of [
      [{ max_attempts: 3, delay_ms: delay }, true],
      [{ max_attempts: 3, delay_ms: delay, backoff: 'exponential', max_delay_ms: delay }, false],
    ] as const) {
      const assignments = await assignMany(TASKS, { retry });
      await Promise.all(assignments.map((a) => renew(a, 1, 'dispatch')));
      const settled = await Promise.all(
        assignments.map((a) => post<SettleReply>('/v1/worker/settle', settleBody(a, 'f', failure))),
      );
      const waits: number[] = [];
      for (const [i, a] of assignments.entries()) {
        const reply = settled[i]?.body as SettleReply;
        expect(reply.task_state).toBe('queued');
        const status = (await get<TaskStatus>(`${SCOPE}/tasks/${a.lease.owner.task_id}`)).body;
        waits.push(status.available_at - reply.receipt.accepted_at);
        expect((await reasons(a.lease.owner.task_id)).slice(-2)).toEqual([
          'report_accepted',
          'retry_scheduled',
        ]);
      }
      if (fixed) expect(waits).toEqual(waits.map(() => delay));
      else {
        for (const wait of waits) expect(wait >= 1 && wait <= delay).toBe(true);
        // Full jitter over eight tasks: not all of them the cap.
        expect(waits.some((wait) => wait !== delay)).toBe(true);
      }
    }
  });
});

describe('DESIGN §5 Cancel over HTTP', () => {
  it('queued → cancelled at once; active → cancel requested, seen on renew, settled as cancelled; terminal → its state, nothing changed', async () => {
    const queue = `lh-cancel-${++n}`;
    const queued = (
      await post<TaskSnapshot>(`${SCOPE}/tasks`, {
        idempotency_key: queue,
        input: { ...A, queue, program: { name: 'p' }, data: null },
      })
    ).body;
    expect((await post(`${SCOPE}/tasks/${queued.task_id}/cancel`)).body).toEqual({
      task_state: 'cancelled',
    });
    expect(await reasons(queued.task_id)).toEqual(['submitted', 'cancelled']);

    const [active] = (await assignMany(1)) as [Assignment];
    const taskId = active.lease.owner.task_id;
    await renew(active, 1, 'keep_alive');
    expect((await post(`${SCOPE}/tasks/${taskId}/cancel`)).body).toEqual({ task_state: 'active' });
    const status = (await get<TaskStatus>(`${SCOPE}/tasks/${taskId}`)).body;
    expect(status.cancel_requested_at).toEqual(expect.any(Number));
    const seen = (await renew(active, 2, 'dispatch')).body;
    expect([seen.cancel_requested, seen.dispatch_allowed]).toEqual([true, false]);
    // Whatever the worker reports, a settlement while cancel is requested cancels.
    const settled = await post<SettleReply>('/v1/worker/settle', settleBody(active, 'op'));
    expect(settled.body.task_state).toBe('cancelled');
    const history = await reasons(taskId);
    expect(history).toEqual([
      'submitted',
      'claimed',
      'cancel_requested',
      'report_accepted',
      'cancelled',
    ]);

    for (const id of [queued.task_id, taskId]) {
      const before = (await get(`${SCOPE}/tasks/${id}/snapshot`)).body;
      expect((await post(`${SCOPE}/tasks/${id}/cancel`)).body).toEqual({ task_state: 'cancelled' });
      expect((await get(`${SCOPE}/tasks/${id}/snapshot`)).body).toEqual(before);
    }
  });
});
