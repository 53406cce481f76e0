/**
 * DESIGN §4.1 "Numbers", "Defaults" (`wait_ms` clamping) and "Status codes" over the real server
 * on PostgreSQL, whose integer columns are narrower than the wire's: every counter and sequence of
 * a command takes any integer in 0..2^53−1 and is answered by the contract's rules (a conflict, a
 * miss, an empty page), never a 5xx from the database; 2^53, `1e300`, fractions and negatives are
 * 400. A `wait_ms` above the configured long-poll maximum is clamped to it, not refused and not
 * honoured.
 */
import {
  type AcquireReply,
  type Assignment,
  COMPLETION_MAX_GENERATION,
  type Scope,
  type TaskResult,
  type WorkerSession,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { type KeyedReply, keyedServer } from './testdata/keyed-server.js';

const KEY = 'wn-acme-star-key-000000001';
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const SCOPE = `/v1/tenants/${A.tenant_id}/namespaces/${A.namespace}`;
const LONG_POLL_MS = 700;
const MAX = Number.MAX_SAFE_INTEGER;

const server = keyedServer('wire_numbers', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    billing: {
      url: 'http://127.0.0.1:9/hook',
      secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
    },
  }),
  LEDGENCE_LONG_POLL_WAIT_MS: String(LONG_POLL_MS),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});

const answer = (reply: KeyedReply) => [reply.status, reply.body?.code];

let n = 0;
async function assign(queue = `q-${++n}`) {
  const task = await server.call(KEY, 'POST', `${SCOPE}/tasks`, {
    idempotency_key: `wn-${n}`,
    input: { ...A, queue, program: { name: 'p' }, data: n },
  });
  expect(task.status).toBe(201);
  const session = (
    await server.call<WorkerSession>(KEY, 'POST', '/v1/worker/sessions', {
      scope: A,
      queue,
      concurrency: 2,
    })
  ).body;
  const reply = await server.call<AcquireReply>(KEY, 'POST', '/v1/worker/acquire', {
    scope: A,
    queue,
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  const { assignment } = reply.body as { assignment: Assignment };
  return { taskId: task.body.task_id as string, session, assignment, queue };
}

function settleBody(owner: Assignment['lease']['owner'], extra: Record<string, unknown> = {}) {
  return {
    owner,
    operation_id: 'op-1',
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: MAX },
        ...extra,
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

/** A raw JSON body whose `"@"` placeholder is replaced by `number` as written. */
const withNumber = (json: unknown, number: string) => JSON.stringify(json).replace('"@"', number);

describe('DESIGN §4.1 Numbers over PostgreSQL', () => {
  it('counters and sequences at 2^53−1 are answered by the contract (409/404/400/200), never 5xx', async () => {
    const { taskId, session, assignment, queue } = await assign();
    const owner = assignment.lease.owner;
    const cases: { path: string; json: unknown; expected: [number, string | undefined] }[] = [
      {
        path: '/v1/worker/acquire',
        json: { scope: A, queue, worker_session_id: session.id, consumer_id: 1, sequence: MAX },
        expected: [409, 'sequence_conflict'],
      },
      {
        path: '/v1/worker/acquire:batch',
        json: {
          commands: [
            { scope: A, queue, worker_session_id: session.id, consumer_id: 1, sequence: MAX },
          ],
        },
        expected: [200, undefined],
      },
      {
        path: '/v1/worker/renew',
        json: { owner, sequence: MAX, intent: 'keep_alive' },
        expected: [409, 'sequence_conflict'],
      },
      {
        path: '/v1/worker/renew',
        json: { owner: { ...owner, generation: MAX }, sequence: 1, intent: 'keep_alive' },
        expected: [409, 'ownership_lost'],
      },
      {
        path: '/v1/worker/settle',
        json: settleBody({ ...owner, generation: MAX }),
        expected: [409, 'ownership_lost'],
      },
      {
        path: '/v1/worker/quiescence',
        json: { ...owner, generation: MAX },
        expected: [409, 'ownership_lost'],
      },
      {
        path: '/v1/worker/renew:batch',
        json: {
          commands: [{ owner: { ...owner, generation: MAX }, sequence: MAX, intent: 'dispatch' }],
        },
        expected: [200, undefined],
      },
      {
        path: '/v1/worker/settle:batch',
        json: { commands: [settleBody({ ...owner, generation: MAX })] },
        expected: [200, undefined],
      },
    ];
    for (const c of cases) {
      const reply = await server.call(KEY, 'POST', c.path, c.json);
      expect([c.path, ...answer(reply)]).toEqual([c.path, ...c.expected]);
    }
    // The batch items carry the same answers as the single routes.
    const batch = await server.call(KEY, 'POST', '/v1/worker/renew:batch', {
      commands: [{ owner: { ...owner, generation: MAX }, sequence: 1, intent: 'keep_alive' }],
    });
    expect(batch.body.results[0].code).toBe('ownership_lost');
    // The attempt is still held by its owner, whose settlement (times at 2^53−1) is accepted.
    const settled = await server.call(
      KEY,
      'POST',
      '/v1/worker/settle',
      settleBody(owner, { started_at: MAX, finished_at: MAX }),
    );
    expect([settled.status, settled.body.task_state]).toEqual([200, 'succeeded']);
    const result = await server.call<TaskResult>(KEY, 'GET', `${SCOPE}/tasks/${taskId}/result`);
    expect(result.body.outcome).toEqual({ state: 'succeeded', output: MAX });
    // Reads that take a number: the largest is an empty page, not an error.
    for (const path of [
      `${SCOPE}/tasks/${taskId}/history?after_sequence=${MAX}`,
      `${SCOPE}/tasks?submitted_from=${MAX}`,
      `${SCOPE}/tasks?submitted_until=${MAX}&limit=500`,
    ]) {
      const reply = await server.call(KEY, 'GET', path);
      expect([path, reply.status]).toEqual([path, 200]);
    }
    const subscribed = await server.call(
      KEY,
      'POST',
      `${SCOPE}/tasks/${taskId}/completion-subscriptions`,
      {
        subscription_key: 'wn',
        destination: 'billing',
      },
    );
    // A generation is bounded by COMPLETION_MAX_GENERATION on the wire: the bound is a
    // generation the subscription does not have (409), one past it is not a generation (400).
    const redeliver = (generation: number) =>
      server.call(
        KEY,
        'POST',
        `${SCOPE}/completion-subscriptions/${subscribed.body.id}/redeliver`,
        {
          generation,
        },
      );
    expect(answer(await redeliver(COMPLETION_MAX_GENERATION))).toEqual([409, 'conflict']);
    expect(answer(await redeliver(MAX))).toEqual([400, 'invalid_input']);
  });

  it('2^53, 1e300, NaN, Infinity, fractions and negatives in a counter are 400 invalid_input', async () => {
    const { session, assignment, queue } = await assign();
    const owner = assignment.lease.owner;
    const bodies: { path: string; json: unknown }[] = [
      {
        path: '/v1/worker/acquire',
        json: { scope: A, queue, worker_session_id: session.id, consumer_id: 1, sequence: '@' },
      },
      { path: '/v1/worker/renew', json: { owner, sequence: '@', intent: 'keep_alive' } },
      {
        path: '/v1/worker/renew',
        json: { owner: { ...owner, generation: '@' }, sequence: 1, intent: 'keep_alive' },
      },
      { path: '/v1/worker/quiescence', json: { ...owner, generation: '@' } },
    ];
    for (const number of [
      '9007199254740992',
      '1e300',
      '-1e300',
      'NaN',
      'Infinity',
      '1.5',
      '-1',
      '1e400',
    ]) {
      for (const b of bodies) {
        const reply = await server.send({
          method: 'POST',
          path: b.path,
          key: KEY,
          headers: { 'content-type': 'application/json' },
          body: withNumber(b.json, number),
        });
        expect([b.path, number, ...answer(reply)]).toEqual([b.path, number, 400, 'invalid_input']);
      }
    }
    // A lone surrogate escape is not text.
    const surrogate = await server.send({
      method: 'POST',
      path: `${SCOPE}/tasks`,
      key: KEY,
      headers: { 'content-type': 'application/json' },
      body: '{"idempotency_key":"wn-s","input":{"tenant_id":"acme","namespace":"a","queue":"q","program":{"name":"p"},"data":"\\ud800"}}',
    });
    expect(answer(surrogate)).toEqual([400, 'invalid_input']);
    // The attempt was not touched by any of them.
    const renewed = await server.call(KEY, 'POST', '/v1/worker/renew', {
      owner,
      sequence: 1,
      intent: 'keep_alive',
    });
    expect(renewed.status).toBe(200);
  });
});

describe('DESIGN §4.1 wait_ms above the long-poll maximum is clamped', () => {
  /** Runs `request` and the milliseconds it took. */
  async function timed<T>(request: () => Promise<T>): Promise<[T, number]> {
    const started = performance.now();
    const reply = await request();
    return [reply, performance.now() - started];
  }

  it('result?wait_ms far above the maximum (beyond 2^53 too) answers pending after the maximum', async () => {
    const { taskId } = await assign();
    for (const wait of ['3600000', '99999999999999999999999']) {
      const [reply, ms] = await timed(() =>
        server.call<TaskResult>(KEY, 'GET', `${SCOPE}/tasks/${taskId}/result?wait_ms=${wait}`),
      );
      expect([wait, reply.status, reply.body.outcome]).toEqual([wait, 200, { state: 'pending' }]);
      expect(ms).toBeGreaterThanOrEqual(LONG_POLL_MS - 50);
      expect(ms).toBeLessThan(LONG_POLL_MS + 5_000);
    }
  }, 30_000);

  it('acquire and acquire:batch ?wait_ms far above the maximum answer empty after the maximum', async () => {
    const queue = `empty-${++n}`;
    const session = (
      await server.call<WorkerSession>(KEY, 'POST', '/v1/worker/sessions', {
        scope: A,
        queue,
        concurrency: 2,
      })
    ).body;
    const poll = (consumer: number) => ({
      scope: A,
      queue,
      worker_session_id: session.id,
      consumer_id: consumer,
      sequence: 1,
    });
    const [single, singleMs] = await timed(() =>
      server.call(KEY, 'POST', '/v1/worker/acquire?wait_ms=99999999999999999999', poll(0)),
    );
    expect([single.status, single.body.disposition]).toEqual([200, 'empty']);
    const [batch, batchMs] = await timed(() =>
      server.call(KEY, 'POST', '/v1/worker/acquire:batch?wait_ms=3600000', { commands: [poll(1)] }),
    );
    expect([batch.status, batch.body.replies[0].disposition]).toEqual([200, 'empty']);
    for (const ms of [singleMs, batchMs]) {
      expect(ms).toBeGreaterThanOrEqual(LONG_POLL_MS - 50);
      expect(ms).toBeLessThan(LONG_POLL_MS + 5_000);
    }
  }, 30_000);
});
