/**
 * DESIGN §4.1 "Order of checks" and the body rules beside it, over the real server (real
 * sockets, group commit, PostgreSQL): authentication (401), content type (415), body size and
 * decoding (413/400), authorization of the scope (403), then existence (404) and state (409).
 * Each case is a request that breaks two adjacent rules at once, so it is answered by the
 * earlier one; a reordering of the checks changes its status. The body rules: an empty body
 * with a JSON content type counts as no body; a POST without a body (cancel, session extend)
 * needs no content type, and a body sent there must be a JSON object; a POST with a body and
 * no content type is 415.
 */
import {
  type AcquireReply,
  type Assignment,
  CONTROL_REQUEST_MAX_BYTES,
  type Scope,
  SUBMISSION_MAX_BYTES,
  type TaskSnapshot,
  type WorkerSession,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { type KeyedReply, keyedServer } from './testdata/keyed-server.js';

const KEYS = {
  star: 'co-acme-star-key-000000001',
  a: 'co-acme-a-key-000000001',
  clientOnly: 'co-acme-client-key-0000001',
  workerOnly: 'co-acme-worker-key-0000001',
} as const;
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const B: Scope = { tenant_id: 'acme', namespace: 'b' };
const GLOBEX: Scope = { tenant_id: 'globex', namespace: 'a' };

const server = keyedServer('check_order', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEYS.star, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
    { key: KEYS.a, tenant: 'acme', namespaces: ['a'], roles: ['client', 'worker'] },
    { key: KEYS.clientOnly, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
    { key: KEYS.workerOnly, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    billing: {
      url: 'http://127.0.0.1:9/hook',
      secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
    },
  }),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});

const JSON_TYPE = { 'content-type': 'application/json' };
const scopePath = (s: Scope) => `/v1/tenants/${s.tenant_id}/namespaces/${s.namespace}`;

/** The status and problem code of a reply, as one comparable value. */
const answer = (reply: KeyedReply) => [reply.status, reply.body?.code];

let counter = 0;
function submitBody(scope: Scope, queue = 'q') {
  counter += 1;
  return {
    idempotency_key: `co-${counter}`,
    input: { ...scope, queue, program: { name: 'p' }, data: { n: counter } },
  };
}

async function submit(scope: Scope, queue = 'q'): Promise<TaskSnapshot> {
  const reply = await server.call(KEYS.star, 'POST', `${scopePath(scope)}/tasks`, {
    ...submitBody(scope, queue),
  });
  expect(reply.status).toBe(201);
  return reply.body;
}

async function assign(scope: Scope) {
  const queue = `q-${++counter}`;
  const task = await submit(scope, queue);
  const opened = await server.call<WorkerSession>(KEYS.star, 'POST', '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 1,
  });
  const reply = await server.call<AcquireReply>(KEYS.star, 'POST', '/v1/worker/acquire', {
    scope,
    queue,
    worker_session_id: opened.body.id,
    consumer_id: 0,
    sequence: 1,
  });
  expect(reply.body.disposition).toBe('assigned');
  const { assignment } = reply.body as { assignment: Assignment };
  return { task, session: opened.body, assignment, queue };
}

function settleBody(owner: Assignment['lease']['owner'], op = 'op-1') {
  return {
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: 1 },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

describe('DESIGN §4.1 order of checks, two rules broken at once', () => {
  it('401 before 415: no key, or an unknown one, with a text/plain body', async () => {
    for (const key of [undefined, 'co-no-such-key-00000000001']) {
      const reply = await server.send({
        method: 'POST',
        path: `${scopePath(A)}/tasks`,
        ...(key === undefined ? {} : { key }),
        headers: { 'content-type': 'text/plain' },
        body: 'not json',
      });
      expect(answer(reply)).toEqual([401, 'unauthorized']);
    }
  });

  it('415 before 413: a body over the limit in another content type, or in none', async () => {
    const big = 'x'.repeat(SUBMISSION_MAX_BYTES + 1);
    const typed = await server.send({
      method: 'POST',
      path: `${scopePath(A)}/tasks`,
      key: KEYS.star,
      headers: { 'content-type': 'text/plain' },
      body: big,
    });
    expect(answer(typed)).toEqual([415, 'unsupported_media_type']);
    const untyped = await server.send({
      method: 'POST',
      path: `${scopePath(A)}/tasks`,
      key: KEYS.star,
      body: big,
    });
    expect(answer(untyped)).toEqual([415, 'unsupported_media_type']);
  });

  it('413 before 400: a JSON-typed body over the limit that is not JSON either', async () => {
    const reply = await server.send({
      method: 'POST',
      path: `${scopePath(A)}/tasks`,
      key: KEYS.star,
      headers: JSON_TYPE,
      body: '{'.repeat(SUBMISSION_MAX_BYTES + 1),
    });
    expect(answer(reply)).toEqual([413, 'payload_too_large']);
  });

  it('413 before 403: an oversized body to a scope the key may not use, or without the role', async () => {
    const body = JSON.stringify({ ...submitBody(GLOBEX), pad: 'x'.repeat(SUBMISSION_MAX_BYTES) });
    for (const [key, scope] of [
      [KEYS.star, GLOBEX],
      [KEYS.a, B],
      [KEYS.workerOnly, A],
    ] as const) {
      const reply = await server.send({
        method: 'POST',
        path: `${scopePath(scope)}/tasks`,
        key,
        headers: JSON_TYPE,
        body,
      });
      expect([key, scope, ...answer(reply)]).toEqual([key, scope, 413, 'payload_too_large']);
    }
  });

  it('400 before 403: a malformed body or query sent outside the binding or without the role', async () => {
    const cases: { key: string; method: string; path: string; body?: string }[] = [
      { key: KEYS.star, method: 'POST', path: `${scopePath(GLOBEX)}/tasks`, body: '{"idem' },
      { key: KEYS.a, method: 'POST', path: `${scopePath(B)}/tasks`, body: '[]' },
      { key: KEYS.workerOnly, method: 'POST', path: `${scopePath(A)}/tasks`, body: '{}' },
      { key: KEYS.workerOnly, method: 'POST', path: `${scopePath(A)}/tasks:batch`, body: '{}' },
      { key: KEYS.clientOnly, method: 'POST', path: '/v1/worker/renew', body: '{"owner":1}' },
      { key: KEYS.clientOnly, method: 'POST', path: '/v1/worker/sessions', body: 'nul' },
      { key: KEYS.clientOnly, method: 'POST', path: '/v1/worker/settle:batch', body: '{}' },
      { key: KEYS.a, method: 'GET', path: `${scopePath(B)}/tasks?limit=0` },
      { key: KEYS.workerOnly, method: 'GET', path: `${scopePath(A)}/tasks?limit=501` },
      // Cursors this server never issues, of every kind (not base64url; base64url of something
      // else; of a cursor's shape with another version), whatever the scope's binding says.
      ...['!!!', 'bnVsbA', 'WzEsIngiLDFd', 'WzksIngiLDEsInRzayJd'].flatMap((cursor) => [
        { key: KEYS.a, method: 'GET', path: `${scopePath(B)}/tasks?cursor=${cursor}` },
        { key: KEYS.workerOnly, method: 'GET', path: `${scopePath(A)}/tasks?cursor=${cursor}` },
      ]),
      { key: KEYS.a, method: 'GET', path: `${scopePath(B)}/tasks/t/result?wait_ms=-1` },
      { key: KEYS.workerOnly, method: 'GET', path: `${scopePath(A)}/tasks/t/history?x=1` },
    ];
    for (const c of cases) {
      const reply = await server.send({
        method: c.method,
        path: c.path,
        key: c.key,
        ...(c.body === undefined ? {} : { headers: JSON_TYPE, body: c.body }),
      });
      expect([c.path, ...answer(reply)]).toEqual([c.path, 400, 'invalid_input']);
    }
  });

  it('403 before 404: an unknown task, session or owner in a namespace the key is not bound to', async () => {
    const { assignment, session } = await assign(B);
    const unknownOwner = { ...assignment.lease.owner, task_id: 'tsk_unknown' };
    const cases: { method: string; path: string; json?: unknown }[] = [
      { method: 'GET', path: `${scopePath(B)}/tasks/tsk_unknown` },
      { method: 'GET', path: `${scopePath(B)}/tasks/tsk_unknown/history` },
      { method: 'POST', path: `${scopePath(B)}/tasks/tsk_unknown/cancel`, json: {} },
      {
        method: 'POST',
        path: `${scopePath(B)}/tasks/tsk_unknown/completion-subscriptions`,
        json: { subscription_key: 'k', destination: 'billing' },
      },
      {
        method: 'POST',
        path: `${scopePath(B)}/completion-subscriptions/sub_unknown/redeliver`,
        json: { generation: 1 },
      },
      { method: 'POST', path: '/v1/worker/sessions/ses_unknown/extend', json: { scope: B } },
      {
        method: 'POST',
        path: '/v1/worker/acquire',
        json: { scope: B, queue: 'q', worker_session_id: 'ses_x', consumer_id: 0, sequence: 1 },
      },
      {
        method: 'POST',
        path: '/v1/worker/renew',
        json: { owner: unknownOwner, sequence: 1, intent: 'keep_alive' },
      },
      { method: 'POST', path: '/v1/worker/settle', json: settleBody(unknownOwner) },
      { method: 'POST', path: '/v1/worker/quiescence', json: unknownOwner },
    ];
    for (const c of cases) {
      const reply = await server.call(KEYS.a, c.method, c.path, c.json);
      expect([c.path, ...answer(reply)]).toEqual([c.path, 403, 'forbidden']);
    }
    // The session is B's and untouched: extend as a key bound to B still works.
    const extended = await server.call(
      KEYS.star,
      'POST',
      `/v1/worker/sessions/${session.id}/extend`,
      {
        scope: B,
      },
    );
    expect(extended.status).toBe(200);
  });

  it('404 before 409: a command that would conflict, naming a task, attempt, session or subscription that does not exist', async () => {
    const { assignment, session, queue } = await assign(A);
    const owner = assignment.lease.owner;
    // Renewed to 1, so sequence 5 would be sequence_conflict for this attempt.
    expect(
      (
        await server.call(KEYS.star, 'POST', '/v1/worker/renew', {
          owner,
          sequence: 1,
          intent: 'keep_alive',
        })
      ).status,
    ).toBe(200);
    const cases: { path: string; json: unknown; code: string }[] = [
      // An unknown attempt of a known task, and an unknown task, at a sequence that conflicts.
      {
        path: '/v1/worker/renew',
        json: { owner: { ...owner, attempt_id: 'att_unknown' }, sequence: 5, intent: 'dispatch' },
        code: 'not_found',
      },
      {
        path: '/v1/worker/renew',
        json: { owner: { ...owner, task_id: 'tsk_unknown' }, sequence: 5, intent: 'dispatch' },
        code: 'not_found',
      },
      // The same settlement bytes again after a different one would be 409 conflict.
      {
        path: '/v1/worker/settle',
        json: settleBody({ ...owner, attempt_id: 'att_unknown' }, 'op-other'),
        code: 'not_found',
      },
      {
        path: '/v1/worker/quiescence',
        json: { ...owner, task_id: 'tsk_unknown' },
        code: 'not_found',
      },
      // A sequence gap on an unknown session (the known one's slot is busy: consumer_busy).
      {
        path: '/v1/worker/acquire',
        json: { scope: A, queue, worker_session_id: 'ses_unknown', consumer_id: 0, sequence: 7 },
        code: 'session_not_found',
      },
      // Naming generation 9 of a subscription would be 409 conflict; of none it is 404.
      {
        path: `${scopePath(A)}/completion-subscriptions/sub_unknown/redeliver`,
        json: { generation: 9 },
        code: 'not_found',
      },
    ];
    for (const c of cases) {
      const reply = await server.call(KEYS.star, 'POST', c.path, c.json);
      expect([c.path, ...answer(reply)]).toEqual([c.path, 404, c.code]);
    }
    // Control: the known session's slot with a gap is the 409 the unknown one was not.
    const gap = await server.call(KEYS.star, 'POST', '/v1/worker/acquire', {
      scope: A,
      queue,
      worker_session_id: session.id,
      consumer_id: 0,
      sequence: 7,
    });
    expect(answer(gap)).toEqual([409, 'sequence_conflict']);
    const stale = await server.call(KEYS.star, 'POST', '/v1/worker/renew', {
      owner,
      sequence: 5,
      intent: 'dispatch',
    });
    expect(answer(stale)).toEqual([409, 'sequence_conflict']);
  });
});

describe('DESIGN §4.1 empty bodies and content types', () => {
  const cancelPath = (task: TaskSnapshot) => `${scopePath(A)}/tasks/${task.task_id}/cancel`;

  it('an empty body with a JSON content type counts as no body: a required body is missing (400), an optional one absent (200)', async () => {
    const submitted = await server.send({
      method: 'POST',
      path: `${scopePath(A)}/tasks`,
      key: KEYS.star,
      headers: JSON_TYPE,
      body: '',
    });
    expect([...answer(submitted), submitted.body.reason]).toEqual([
      400,
      'invalid_input',
      'missing_body',
    ]);
    const task = await submit(A);
    const cancelled = await server.send({
      method: 'POST',
      path: cancelPath(task),
      key: KEYS.star,
      headers: JSON_TYPE,
      body: '',
    });
    expect([cancelled.status, cancelled.body]).toEqual([200, { task_state: 'cancelled' }]);
    const opened = await server.call<WorkerSession>(KEYS.a, 'POST', '/v1/worker/sessions', {
      scope: A,
      queue: 'q',
      concurrency: 1,
    });
    // Chunked, with no byte in it: the same as no body.
    const extended = await server.send({
      method: 'POST',
      path: `/v1/worker/sessions/${opened.body.id}/extend`,
      key: KEYS.a,
      headers: { ...JSON_TYPE, 'transfer-encoding': 'chunked' },
    });
    expect(extended.status).toBe(200);
    expect(extended.body.id).toBe(opened.body.id);
  });

  it('a POST without a body needs no content type: cancel and session extend, framed by length or chunked', async () => {
    const framings: Record<string, string>[] = [
      { 'content-length': '0' },
      { 'transfer-encoding': 'chunked' },
    ];
    for (const framing of framings) {
      const task = await submit(A);
      const cancelled = await server.send({
        method: 'POST',
        path: cancelPath(task),
        key: KEYS.star,
        headers: framing,
      });
      expect([cancelled.status, cancelled.body]).toEqual([200, { task_state: 'cancelled' }]);
      const opened = await server.call<WorkerSession>(KEYS.a, 'POST', '/v1/worker/sessions', {
        scope: A,
        queue: 'q',
        concurrency: 1,
      });
      const extended = await server.send({
        method: 'POST',
        path: `/v1/worker/sessions/${opened.body.id}/extend`,
        key: KEYS.a,
        headers: framing,
      });
      expect(extended.status).toBe(200);
    }
  });

  it('a body sent to cancel or extend must be a JSON object; anything else is 400 and changes nothing', async () => {
    const task = await submit(A);
    const opened = await server.call<WorkerSession>(KEYS.a, 'POST', '/v1/worker/sessions', {
      scope: A,
      queue: 'q',
      concurrency: 1,
    });
    const extend = `/v1/worker/sessions/${opened.body.id}/extend`;
    for (const body of ['null', '[]', '1', '"x"', 'true', '{"reason":"x"}', '{']) {
      for (const path of [cancelPath(task), extend]) {
        const reply = await server.send({
          method: 'POST',
          path,
          key: KEYS.a,
          headers: JSON_TYPE,
          body,
        });
        expect([path, body, ...answer(reply)]).toEqual([path, body, 400, 'invalid_input']);
      }
    }
    const status = await server.call(KEYS.star, 'GET', `${scopePath(A)}/tasks/${task.task_id}`);
    expect(status.body.state).toBe('queued');
    expect(
      (
        await server.send({
          method: 'POST',
          path: cancelPath(task),
          key: KEYS.a,
          headers: JSON_TYPE,
          body: '{}',
        })
      ).body,
    ).toEqual({ task_state: 'cancelled' });
  });

  it('a POST with a body and no content type is 415, on the optional-body routes too; application/json with parameters is accepted', async () => {
    const task = await submit(A);
    for (const path of [cancelPath(task), `${scopePath(A)}/tasks`, '/v1/worker/renew']) {
      const reply = await server.send({ method: 'POST', path, key: KEYS.star, body: '{}' });
      expect([path, ...answer(reply)]).toEqual([path, 415, 'unsupported_media_type']);
    }
    const status = await server.call(KEYS.star, 'GET', `${scopePath(A)}/tasks/${task.task_id}`);
    expect(status.body.state).toBe('queued');
    const submitted = await server.send({
      method: 'POST',
      path: `${scopePath(A)}/tasks`,
      key: KEYS.star,
      headers: { 'content-type': 'APPLICATION/JSON ; charset="utf-8"; x=y' },
      body: JSON.stringify(submitBody(A)),
    });
    expect(submitted.status).toBe(201);
    // The control request limit applies to an optional body as to any other.
    const oversized = await server.send({
      method: 'POST',
      path: cancelPath(task),
      key: KEYS.star,
      headers: JSON_TYPE,
      body: JSON.stringify({ pad: 'x'.repeat(CONTROL_REQUEST_MAX_BYTES) }),
    });
    expect(answer(oversized)).toEqual([413, 'payload_too_large']);
  });
});
