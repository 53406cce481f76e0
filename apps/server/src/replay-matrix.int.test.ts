/**
 * DESIGN §1.3 "Replay-safe everywhere", over real sockets against two servers sharing one
 * PostgreSQL database and a third started after the first stopped (a restart): the same request
 * again gets the same answer whichever replica takes it, after the task moved on, and after
 * retention removed it. Two answers changed on 2026-12-05: a late copy of a redeliver naming a
 * generation two back was a 409, and a repeated retention PUT answered a new `updated_at`.
 */
import { describe, expect, it } from 'vitest';
import { serverReplicas, until } from './testdata/replicas.js';

const KEY = 'replay-matrix-key-0000000000001';
const NS = 'rm';
const SCOPE = `/v1/tenants/acme/namespaces/${NS}`;
const scope = { tenant_id: 'acme', namespace: NS };

const replicas = serverReplicas({
  prefix: 'replay_matrix',
  key: KEY,
  env: (receiver) => ({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: {
        url: `${receiver}/a`,
        secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
      },
      audit: {
        url: `${receiver}/b`,
        secret: `whsec_${Buffer.alloc(24, 9).toString('base64')}`,
      },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    LEDGENCE_RETENTION_INTERVAL_MS: '100',
  }),
});
const { call } = replicas;

let n = 0;
function submitCommand(extra: Record<string, unknown> = {}) {
  n += 1;
  return {
    idempotency_key: `rm-${n}-${Date.now()}`,
    input: {
      tenant_id: 'acme',
      namespace: NS,
      queue: `q${n}`,
      program: { name: 'p' },
      data: { n },
      ...extra,
    },
  };
}

/** Submits on A and takes the task through acquire (seq 1) and a dispatch renew (seq 1). */
async function running(extra: Record<string, unknown> = {}) {
  const command = submitCommand(extra);
  const submitted = await call(replicas.a, 'POST', `${SCOPE}/tasks`, command);
  expect(submitted.status).toBe(201);
  const session = await call(replicas.a, 'POST', '/v1/worker/sessions', {
    scope,
    queue: command.input.queue,
    concurrency: 1,
  });
  expect(session.status).toBe(200);
  const poll = {
    scope,
    queue: command.input.queue,
    worker_session_id: session.body.id,
    consumer_id: 0,
    sequence: 1,
  };
  const acquired = await call(replicas.a, 'POST', '/v1/worker/acquire', poll);
  expect(acquired.body.disposition).toBe('assigned');
  const owner = acquired.body.assignment.lease.owner;
  const renew = { owner, sequence: 1, intent: 'dispatch' };
  const renewed = await call(replicas.a, 'POST', '/v1/worker/renew', renew);
  expect(renewed.status).toBe(200);
  return { command, submitted, session: session.body, poll, acquired, owner, renew, renewed };
}

function settleCommand(
  owner: { task_id: string; attempt_id: string },
  operation: string,
  output: unknown,
  quiescence: 'confirmed' | 'unconfirmed' = 'confirmed',
) {
  return {
    owner,
    operation_id: operation,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output },
      },
    },
    quiescence,
    processing_trace: null,
  };
}

describe('replays on another replica and after a restart (DESIGN §1.3)', () => {
  it('settle: the same operation replays the stored receipt on B and on a restarted server; other bytes are 409 conflict', async () => {
    const t = await running();
    const settle = settleCommand(t.owner, 'op-1', { ok: 1 });
    const first = await call(replicas.a, 'POST', '/v1/worker/settle', settle);
    expect(first.status).toBe(200);
    expect(first.body.already_accepted).toBe(false);
    const onB = await call(replicas.b, 'POST', '/v1/worker/settle', settle);
    expect(onB.status).toBe(200);
    expect(onB.body).toEqual({ ...first.body, already_accepted: true });
    const other = await call(
      replicas.b,
      'POST',
      '/v1/worker/settle',
      settleCommand(t.owner, 'op-1', { ok: 2 }),
    );
    expect([other.status, other.body.code]).toEqual([409, 'conflict']);
    const batch = await call(replicas.b, 'POST', '/v1/worker/settle:batch', {
      commands: [settle, settle],
    });
    expect(batch.body.results).toEqual([onB.body, onB.body]);
    // The other replays of this task's identities, on B, after the task succeeded.
    const poll = await call(replicas.b, 'POST', '/v1/worker/acquire', t.poll);
    expect(poll.body).toEqual({
      disposition: 'ownership_lost',
      sequence: 1,
      assignment: { task_id: t.owner.task_id, attempt_id: t.owner.attempt_id },
    });
    const submit = await call(replicas.b, 'POST', `${SCOPE}/tasks`, t.command);
    expect([submit.status, submit.body.task_id, submit.body.state]).toEqual([
      200,
      t.submitted.body.task_id,
      'succeeded',
    ]);
    const cancelA = await call(replicas.a, 'POST', `${SCOPE}/tasks/${t.owner.task_id}/cancel`);
    const cancelB = await call(replicas.b, 'POST', `${SCOPE}/tasks/${t.owner.task_id}/cancel`);
    expect([cancelA.status, cancelA.text]).toEqual([200, '{"task_state":"succeeded"}']);
    expect(cancelB.text).toBe(cancelA.text);

    // A restart: the first server stops, a new one starts on the same database.
    await replicas.restartA();
    const afterRestart = await call(replicas.a, 'POST', '/v1/worker/settle', settle);
    expect([afterRestart.status, afterRestart.text]).toEqual([200, onB.text]);
  });
});

describe('retention PUT replayed (DESIGN §1.3)', () => {
  it('the same policy PUT again, on B, answers the same policy (updated_at included) and changes nothing', async () => {
    const path = '/v1/tenants/acme/namespaces/rm-policy/retention-policy';
    const first = await call(replicas.a, 'PUT', path, { retention_ms: 3_600_000 });
    expect(first.status).toBe(200);
    await new Promise((resolve) => setTimeout(resolve, 20));
    const again = await call(replicas.b, 'PUT', path, { retention_ms: 3_600_000 });
    expect([again.status, again.text]).toEqual([200, first.text]);
  });
});

describe('replays after retention removed the record (DESIGN §12, README "Retention")', () => {
  it('a settled task removed by retention: replays of its identities answer 4xx problems (or, for a submit, a new task)', async () => {
    const policy = `${SCOPE}/retention-policy`;
    expect((await call(replicas.a, 'PUT', policy, { retention_ms: 3_600_000 })).status).toBe(200);
    const t = await running();
    const settle = settleCommand(t.owner, 'op-r', { r: 1 });
    expect((await call(replicas.a, 'POST', '/v1/worker/settle', settle)).status).toBe(200);
    await replicas.sql`update tasks set terminal_at = terminal_at - 7200000
      where task_id = ${t.owner.task_id}`;
    const gone = await until(
      () => call(replicas.b, 'GET', `${SCOPE}/tasks/${t.owner.task_id}`),
      (r) => r.status === 404,
    );
    expect([gone.status, gone.body.code]).toEqual([404, 'not_found']);
    const settleAgain = await call(replicas.b, 'POST', '/v1/worker/settle', settle);
    expect([settleAgain.status, settleAgain.body.code]).toEqual([404, 'not_found']);
    const pollAgain = await call(replicas.b, 'POST', '/v1/worker/acquire', t.poll);
    expect(pollAgain.status).toBe(200);
    expect(pollAgain.body.disposition).toBe('ownership_lost');
    const renewAgain = await call(replicas.b, 'POST', '/v1/worker/renew', t.renew);
    expect([renewAgain.status, renewAgain.body.code]).toEqual([404, 'not_found']);
    const cancelAgain = await call(replicas.b, 'POST', `${SCOPE}/tasks/${t.owner.task_id}/cancel`);
    expect([cancelAgain.status, cancelAgain.body.code]).toEqual([404, 'not_found']);
    const submitAgain = await call(replicas.b, 'POST', `${SCOPE}/tasks`, t.command);
    expect(submitAgain.status).toBe(201);
    expect(submitAgain.body.task_id).not.toBe(t.owner.task_id);
  });
});

describe('redeliver replays (DESIGN §1.3, §8 CompletionRetryCommand)', () => {
  it('a late copy of a redeliver naming generation 1, after generations 2 and 3 were started, answers the subscription unchanged, not 409', async () => {
    const submitted = await call(replicas.a, 'POST', `${SCOPE}/tasks`, submitCommand());
    const taskId = submitted.body.task_id as string;
    const subs = `${SCOPE}/tasks/${taskId}/completion-subscriptions`;
    const sub = await call(replicas.a, 'POST', subs, {
      subscription_key: 'late',
      destination: 'billing',
    });
    expect(sub.status).toBe(201);
    expect((await call(replicas.a, 'POST', `${SCOPE}/tasks/${taskId}/cancel`)).status).toBe(200);
    const delivered = (generation: number) =>
      until(
        () => call(replicas.b, 'GET', subs),
        (r) => r.body[0]?.state === 'delivered' && r.body[0]?.generation === generation,
      );
    await delivered(1);
    const path = `${SCOPE}/completion-subscriptions/${sub.body.id}/redeliver`;
    // The operator's request naming 1 starts generation 2 (its reply is lost on the way back).
    expect((await call(replicas.a, 'POST', path, { generation: 1 })).body.generation).toBe(2);
    await delivered(2);
    // Another operator redelivers generation 2.
    expect((await call(replicas.b, 'POST', path, { generation: 2 })).body.generation).toBe(3);
    const third = await delivered(3);
    // The first request, retried with the same bytes: it started its generation already.
    const late = await call(replicas.b, 'POST', path, { generation: 1 });
    expect([late.status, late.body]).toEqual([200, third.body[0]]);
  });
});
