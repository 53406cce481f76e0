/**
 * A task retired by a real server's retention loop (real HTTP, real PostgreSQL)
 * against README "Retention": "A removed task is gone: its status, result, history and
 * subscriptions answer 404 not_found, as for an id that never existed, and its idempotency key
 * is free again". Every identity of the retired task is compared with an id of the same shape
 * that never existed, route by route, body by body; the rows are checked with SQL after.
 * Records are aged in the database itself (the shortest policy is an hour).
 */
import { describe, expect, it } from 'vitest';
import { serverReplicas, until } from './testdata/replicas.js';

const KEY = 'retention-ids-key-000000000000001';
const NS = 'retired';
const SCOPE = `/v1/tenants/acme/namespaces/${NS}`;
const scope = { tenant_id: 'acme', namespace: NS };

const replicas = serverReplicas({
  prefix: 'retention_identities',
  key: KEY,
  env: (receiver) => ({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: {
        url: `${receiver}/a`,
        secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
      },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    LEDGENCE_RETENTION_INTERVAL_MS: '100',
  }),
});
const { call } = replicas;

function submitCommand(key: string, queue: string, data: unknown) {
  return {
    idempotency_key: key,
    input: { ...scope, queue, program: { name: 'p' }, data, concurrency_key: `ck-${queue}` },
  };
}

function settleCommand(
  owner: { task_id: string; attempt_id: string },
  operation: string,
  quiescence: 'confirmed' | 'unconfirmed',
) {
  return {
    owner,
    operation_id: operation,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: { done: true } },
      },
    },
    quiescence,
    processing_trace: null,
  };
}

/** Another id of the same shape (prefix and length), which no record ever had. */
function neverIssued(id: string): string {
  const at = id.length - 6;
  const tail = id.slice(at);
  const swapped = [...tail].map((c) => (c === '0' ? '1' : '0')).join('');
  return id.slice(0, at) + swapped;
}

async function rowsOf(taskId: string): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const table of [
    'tasks',
    'task_payloads',
    'attempts',
    'task_history',
    'completion_subscriptions',
    'completion_deliveries',
  ]) {
    const [row] = await replicas.sql.unsafe(
      `select count(*)::int as n from ${table} where namespace = $1 and task_id = $2`,
      [NS, taskId],
    );
    out[table] = Number(row?.n);
  }
  return out;
}

describe('a task retired by the retention loop, identity by identity', () => {
  it('answers every route exactly as an id that never existed, leaves no row, and frees its key for a different command', async () => {
    expect(
      (await call(replicas.a, 'PUT', `${SCOPE}/retention-policy`, { retention_ms: 3_600_000 }))
        .status,
    ).toBe(200);
    const command = submitCommand('retired-one', 'q1', { n: 1 });
    const submitted = await call(replicas.a, 'POST', `${SCOPE}/tasks`, command);
    expect(submitted.status).toBe(201);
    const taskId = submitted.body.task_id as string;
    const subs = `${SCOPE}/tasks/${taskId}/completion-subscriptions`;
    const sub = await call(replicas.a, 'POST', subs, {
      subscription_key: 's',
      destination: 'billing',
    });
    expect(sub.status).toBe(201);
    const session = await call(replicas.a, 'POST', '/v1/worker/sessions', {
      scope,
      queue: 'q1',
      concurrency: 1,
    });
    const poll = {
      scope,
      queue: 'q1',
      worker_session_id: session.body.id,
      consumer_id: 0,
      sequence: 1,
    };
    const acquired = await call(replicas.a, 'POST', '/v1/worker/acquire', poll);
    expect(acquired.body.disposition).toBe('assigned');
    const owner = acquired.body.assignment.lease.owner;
    const renew = { owner, sequence: 1, intent: 'dispatch' };
    expect((await call(replicas.a, 'POST', '/v1/worker/renew', renew)).status).toBe(200);
    // Held for cleanup, then confirmed: the task takes its outcome at the confirmation.
    const settle = settleCommand(owner, 'op-held', 'unconfirmed');
    expect((await call(replicas.a, 'POST', '/v1/worker/settle', settle)).status).toBe(200);
    const confirmed = await call(replicas.a, 'POST', '/v1/worker/quiescence', owner);
    expect([confirmed.status, confirmed.body]).toEqual([200, { task_state: 'succeeded' }]);
    await until(
      () => call(replicas.a, 'GET', subs),
      (r) => r.body?.[0]?.state === 'delivered',
    );

    // Age the task and its callback activity past the hour.
    await replicas.sql`update tasks set terminal_at = terminal_at - 7200000
      where namespace = ${NS} and task_id = ${taskId}`;
    await replicas.sql`update completion_deliveries set finished_at = finished_at - 7200000,
      delivered_at = delivered_at - 7200000 where namespace = ${NS} and task_id = ${taskId}`;
    const gone = await until(
      () => call(replicas.b, 'GET', `${SCOPE}/tasks/${taskId}`),
      (r) => r.status === 404,
    );
    expect(gone.status).toBe(404);
    expect(await rowsOf(taskId)).toEqual({
      tasks: 0,
      task_payloads: 0,
      attempts: 0,
      task_history: 0,
      completion_subscriptions: 0,
      completion_deliveries: 0,
    });

    // The same requests for a task, attempt and subscription that never existed.
    const fake = {
      task: neverIssued(taskId),
      attempt: neverIssued(owner.attempt_id),
      lease: neverIssued(owner.lease_id ?? 'lease_000000'),
      sub: neverIssued(sub.body.id),
    };
    const fakeOwner = { ...owner, task_id: fake.task, attempt_id: fake.attempt };
    const routes = (ids: { task: string; attempt: string; sub: string }, o: typeof owner) => {
      const t = `${SCOPE}/tasks/${ids.task}`;
      return [
        ['GET', t],
        ['GET', `${t}/result`],
        ['GET', `${t}/result?wait_ms=200`],
        ['GET', `${t}/snapshot`],
        ['GET', `${t}/attempts/${ids.attempt}`],
        ['GET', `${t}/history`],
        ['GET', `${t}/history?after_sequence=2`],
        ['POST', `${t}/cancel`],
        ['GET', `${t}/completion-subscriptions`],
        [
          'POST',
          `${t}/completion-subscriptions`,
          { subscription_key: 's', destination: 'billing' },
        ],
        ['POST', `${SCOPE}/completion-subscriptions/${ids.sub}/redeliver`, { generation: 1 }],
        ['POST', '/v1/worker/settle', settleCommand(o, 'op-held', 'unconfirmed')],
        [
          'POST',
          '/v1/worker/settle:batch',
          { commands: [settleCommand(o, 'op-held', 'unconfirmed')] },
        ],
        ['POST', '/v1/worker/renew', { owner: o, sequence: 1, intent: 'dispatch' }],
        ['POST', '/v1/worker/renew', { owner: o, sequence: 2, intent: 'keep_alive' }],
        [
          'POST',
          '/v1/worker/renew:batch',
          { commands: [{ owner: o, sequence: 1, intent: 'dispatch' }] },
        ],
        ['POST', '/v1/worker/quiescence', o],
      ] as [string, string, unknown?][];
    };
    const real = routes({ task: taskId, attempt: owner.attempt_id, sub: sub.body.id }, owner);
    const never = routes(fake, fakeOwner);
    const normalise = (text: string) =>
      text
        .replaceAll(taskId, '<task>')
        .replaceAll(fake.task, '<task>')
        .replaceAll(owner.attempt_id, '<attempt>')
        .replaceAll(fake.attempt, '<attempt>')
        .replaceAll(sub.body.id, '<sub>')
        .replaceAll(fake.sub, '<sub>')
        .replace(/"request_id":"[^"]*"/g, '"request_id":"<id>"');
    const answers: [string, string, number, string][] = [];
    const expected: [string, string, number, string][] = [];
    for (let i = 0; i < real.length; i += 1) {
      const [method, path, body] = real[i] as [string, string, unknown?];
      const [, fakePath, fakeBody] = never[i] as [string, string, unknown?];
      const r = await call(replicas.b, method, path, body);
      const f = await call(replicas.b, method, fakePath, fakeBody);
      answers.push([method, normalise(path), r.status, normalise(r.text)]);
      expected.push([method, normalise(path), f.status, normalise(f.text)]);
    }
    expect(answers).toEqual(expected);
    // And none of them is a 5xx, nor a success (batch routes answer 200 with a problem item).
    for (const [method, path, status, text] of answers) {
      const ok = path.includes(':batch')
        ? status === 200 && text.includes('"status":404')
        : status >= 400 && status < 500;
      expect([method, path, ok]).toEqual([method, path, true]);
    }

    // The acquire replay of the live slot: the attempt is no longer owned.
    const replay = await call(replicas.b, 'POST', '/v1/worker/acquire', poll);
    expect([replay.status, replay.body.disposition]).toEqual([200, 'ownership_lost']);
    const batchReplay = await call(replicas.b, 'POST', '/v1/worker/acquire:batch', {
      commands: [poll],
    });
    expect([batchReplay.status, batchReplay.body.replies?.[0]?.disposition]).toEqual([
      200,
      'ownership_lost',
    ]);
    // The slot polls on (its cursor's attempt is gone, so it holds nothing): not consumer_busy.
    const next = await call(replicas.b, 'POST', '/v1/worker/acquire', { ...poll, sequence: 2 });
    expect([next.status, next.body.disposition]).toEqual([200, 'empty']);

    // The key is free again: a submit with the key and a DIFFERENT command creates a new task
    // (before retirement it would have been 409 conflict), on the header route too.
    const differing = submitCommand('retired-one', 'q1', { n: 2 });
    const again = await call(replicas.b, 'POST', `${SCOPE}/tasks`, differing);
    expect(again.status).toBe(201);
    expect(again.body.task_id).not.toBe(taskId);
    const replayed = await call(replicas.a, 'POST', `${SCOPE}/tasks`, differing);
    expect([replayed.status, replayed.body.task_id]).toEqual([200, again.body.task_id]);
    const conflicting = await call(replicas.a, 'POST', `${SCOPE}/tasks`, command);
    expect([conflicting.status, conflicting.body.code]).toEqual([409, 'conflict']);
  });
});
