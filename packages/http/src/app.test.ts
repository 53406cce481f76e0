import {
  type AcquireReply,
  type AttemptSnapshot,
  type Authority,
  ContractError,
  type Problem,
  type RecordedHistoryEvent,
  SESSION_VALIDITY_MS,
  type SettleReply,
  type TaskPage,
  type TaskResult,
  type TaskSnapshot,
  type TaskStatus,
  type WorkerSession,
} from '@ledgence/contracts';
import { createTaskService } from '@ledgence/core';
import { createMemoryTaskStore } from '@ledgence/core/testing';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { createHttpApp } from './index.js';
import { expectJson, expectProblem } from './testdata/expect.js';
import {
  ACME_DEV,
  ACME_PROD,
  acquireBody,
  assignTask,
  createHarness,
  GLOBEX_PROD,
  KEYS,
  openSession,
  scopePath,
  settleBody,
  submitBody,
  submitTask,
} from './testdata/harness.js';

const TASKS = `${scopePath(ACME_PROD)}/tasks`;

describe('POST {scope}/tasks', () => {
  it('creates (201 + Location), replays (200) and rejects a changed command (409)', async () => {
    const h = createHarness();
    const body = submitBody(ACME_PROD, 'order-1');
    const created = await h.call(TASKS, { key: KEYS.client, json: body });
    const snapshot = await expectJson<TaskSnapshot>(created, 201);
    expect(snapshot).toMatchObject({ state: 'queued', idempotency_key: 'order-1' });
    expect(created.headers.get('location')).toBe(`${TASKS}/${snapshot.task_id}`);
    const again = await h.call(TASKS, { key: KEYS.client, json: body });
    expect(await expectJson<TaskSnapshot>(again, 200)).toEqual(snapshot);
    const changed = submitBody(ACME_PROD, 'order-1', { data: { n: 2 } });
    await expectProblem(await h.call(TASKS, { key: KEYS.client, json: changed }), 'conflict');
  });

  it('takes the key from an Idempotency-Key header', async () => {
    const h = createHarness();
    const { idempotency_key: _, ...rest } = submitBody(ACME_PROD, 'unused');
    const res = await h.call(TASKS, {
      key: KEYS.client,
      json: rest,
      headers: { 'idempotency-key': 'from-header' },
    });
    expect(await expectJson<TaskSnapshot>(res, 201)).toMatchObject({
      idempotency_key: 'from-header',
    });
    const both = await h.call(TASKS, {
      key: KEYS.client,
      json: submitBody(ACME_PROD, 'in-body'),
      headers: { 'idempotency-key': 'from-header' },
    });
    expect((await expectProblem(both, 'invalid_input')).reason).toBe('idempotency_key_conflict');
    const badHeader = await h.call(TASKS, {
      key: KEYS.client,
      json: rest,
      headers: { 'idempotency-key': 'k'.repeat(256) },
    });
    await expectProblem(badHeader, 'invalid_input');
  });

  it('rejects a task of another scope than the path (400) and a foreign scope (403)', async () => {
    const h = createHarness();
    const mismatch = await h.call(TASKS, { key: KEYS.client, json: submitBody(ACME_DEV, 'x') });
    const problem = await expectProblem(mismatch, 'invalid_input');
    expect(problem).toMatchObject({ reason: 'scope_mismatch', path: '$.input.namespace' });
    const foreign = await h.call(`${scopePath(GLOBEX_PROD)}/tasks`, {
      key: KEYS.client,
      json: submitBody(GLOBEX_PROD, 'x'),
    });
    await expectProblem(foreign, 'forbidden');
    const namespace = await h.call(`${scopePath(ACME_DEV)}/tasks`, {
      key: KEYS.prodClient,
      json: submitBody(ACME_DEV, 'x'),
    });
    await expectProblem(namespace, 'forbidden');
    const role = await h.call(TASKS, { key: KEYS.worker, json: submitBody(ACME_PROD, 'x') });
    expect((await expectProblem(role, 'forbidden')).reason).toBe('role');
  });

  it('refuses a timeout_ms less than MIN_DISPATCH_WINDOW_MS above the lease safety margin (400 at its path), creating nothing', async () => {
    const h = createHarness();
    const short = await h.call(TASKS, {
      key: KEYS.client,
      json: submitBody(ACME_PROD, 'short', { timeout_ms: 5_499 }),
    });
    expect(await expectProblem(short, 'invalid_input')).toMatchObject({
      status: 400,
      path: '$.input.timeout_ms',
      detail: expect.stringContaining('use at least 5500'),
    });
    expect((await h.service.listTasks(ACME_PROD, { filters: {} })).tasks).toEqual([]);
    // In a batch, the item's problem names its place in the body; the others are created.
    const batch = await h.call(`${TASKS}:batch`, {
      key: KEYS.client,
      json: {
        commands: [
          submitBody(ACME_PROD, 'b-1', { timeout_ms: 5_500 }),
          submitBody(ACME_PROD, 'short', { timeout_ms: 1_000 }),
        ],
      },
    });
    const { results } = await expectJson<{ results: (TaskSnapshot | Problem)[] }>(batch, 200);
    expect(results[0]).toMatchObject({ state: 'queued' });
    expect(results[1]).toMatchObject({
      status: 400,
      code: 'invalid_input',
      path: '$.commands[1].input.timeout_ms',
    });
    // The key was never taken: with a budget the server accepts, it creates the task.
    const fixed = await h.call(TASKS, {
      key: KEYS.client,
      json: submitBody(ACME_PROD, 'short', { timeout_ms: 5_500 }),
    });
    expect((await expectJson<TaskSnapshot>(fixed, 201)).idempotency_key).toBe('short');
  });

  it('answers 401 with WWW-Authenticate for a missing or unknown key', async () => {
    const h = createHarness();
    const none = await h.call(TASKS, { json: submitBody(ACME_PROD, 'x') });
    // RFC 6750 §3.1: no error code without a credential, invalid_token for a refused one.
    expect(none.headers.get('www-authenticate')).toBe('Bearer realm="ledgence"');
    await expectProblem(none, 'unauthorized');
    const wrong = await h.call(TASKS, { key: 'not-a-key', json: submitBody(ACME_PROD, 'x') });
    expect(wrong.headers.get('www-authenticate')).toBe(
      'Bearer realm="ledgence", error="invalid_token"',
    );
    await expectProblem(wrong, 'unauthorized');
    // Credentials of another scheme are no bearer token at all (RFC 6750 §3.1: "attempted using
    // an unsupported authentication method"): the challenge alone (until 2026-12-05 invalid_token).
    for (const authorization of ['Basic YTpi', 'Digest username="u"', 'Token abc', 'bearerx y']) {
      const other = await h.call(TASKS, {
        headers: { authorization, 'content-type': 'application/json' },
        body: '{}',
      });
      expect(other.headers.get('www-authenticate')).toBe('Bearer realm="ledgence"');
      expect(await expectProblem(other, 'unauthorized')).toMatchObject({
        reason: 'unsupported_scheme',
      });
    }
    // A bearer attempt that is malformed is still a refused token.
    const malformed = await h.call(TASKS, {
      headers: { authorization: 'bearer  not a token', 'content-type': 'application/json' },
      body: '{}',
    });
    expect(malformed.headers.get('www-authenticate')).toBe(
      'Bearer realm="ledgence", error="invalid_token"',
    );
  });

  it('checks content type, size and body', async () => {
    const h = createHarness();
    const text = await h.call(TASKS, {
      key: KEYS.client,
      body: JSON.stringify(submitBody(ACME_PROD, 'x')),
      headers: { 'content-type': 'text/plain' },
    });
    await expectProblem(text, 'unsupported_media_type');
    const untyped = await h.call(TASKS, { key: KEYS.client, body: '{}' });
    await expectProblem(untyped, 'unsupported_media_type');
    const charset = await h.call(TASKS, {
      key: KEYS.client,
      body: JSON.stringify(submitBody(ACME_PROD, 'cs')),
      headers: { 'content-type': 'Application/JSON; charset=utf-8' },
    });
    expect(charset.status).toBe(201);
    const empty = await h.call(TASKS, {
      key: KEYS.client,
      body: '',
      headers: { 'content-type': 'application/json' },
    });
    expect((await expectProblem(empty, 'invalid_input')).reason).toBe('missing_body');
    const huge = await h.call(TASKS, {
      key: KEYS.client,
      body: `{"idempotency_key":"${'x'.repeat(2 * 1024 * 1024)}"}`,
      headers: { 'content-type': 'application/json' },
    });
    await expectProblem(huge, 'payload_too_large');
    const bad = await h.call(TASKS, {
      key: KEYS.client,
      body: '{"idempotency_key":',
      headers: { 'content-type': 'application/json' },
    });
    await expectProblem(bad, 'invalid_input');
    const query = await h.call(`${TASKS}?x=1`, {
      key: KEYS.client,
      json: submitBody(ACME_PROD, 'q'),
    });
    await expectProblem(query, 'invalid_input');
  });

  it('replays a fixed retry spelled with backoff "fixed" or max_delay_ms 0 as the task submitted without them (200, a3s canonical RetryPolicy)', async () => {
    const h = createHarness();
    const first = await expectJson<TaskSnapshot>(
      await h.call(TASKS, {
        key: KEYS.client,
        json: submitBody(ACME_PROD, 'fixed-1', { retry: { max_attempts: 2, delay_ms: 10 } }),
      }),
      201,
    );
    // The a3s seed: `backoff` is `skip_serializing_if = "RetryBackoff::is_fixed"` and
    // `max_delay_ms` is `skip_serializing_if = "is_zero"` ("zero is canonical for a fixed
    // policy"): the same policy, the same canonical command.
    for (const retry of [
      { max_attempts: 2, delay_ms: 10, backoff: 'fixed' },
      { max_attempts: 2, delay_ms: 10, max_delay_ms: 0 },
      { max_attempts: 2, delay_ms: 10, backoff: 'fixed', max_delay_ms: 0 },
    ]) {
      const res = await h.call(TASKS, {
        key: KEYS.client,
        json: submitBody(ACME_PROD, 'fixed-1', { retry }),
      });
      const again = await expectJson<TaskSnapshot>(res, 200);
      expect(again.task_id).toBe(first.task_id);
    }
  });

  it('refuses a tracestate holding CR, LF or non-ASCII whitespace at $.origin_trace.tracestate (W3C Trace Context §3.3)', async () => {
    const h = createHarness();
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    // W3C: list = list-member 0*31( OWS "," OWS list-member ), OWS = *( SP / HTAB ); values are
    // printable ASCII. These would reach workers verbatim in the CloudEvent `tracestate`.
    for (const tracestate of [
      'a=1,\nb=2',
      'a=1\r\n',
      'a=1,\u3000b=2',
      '\u00a0a=1',
      'a=1,\u2028b=2',
    ]) {
      const res = await h.call(TASKS, {
        key: KEYS.client,
        json: {
          ...submitBody(ACME_PROD, `trace-${tracestate.length}-${tracestate.charCodeAt(3)}`),
          origin_trace: { traceparent, tracestate },
        },
      });
      const problem = await expectProblem(res, 'invalid_input');
      expect(problem.path).toBe('$.origin_trace.tracestate');
    }
  });
});

describe('POST {scope}/tasks:batch', () => {
  it('answers every item on its own, in order, each problem with the request id', async () => {
    const h = createHarness();
    await h.call(TASKS, { key: KEYS.client, json: submitBody(ACME_PROD, 'taken') });
    const res = await h.call(`${TASKS}:batch`, {
      key: KEYS.client,
      headers: { 'x-request-id': 'batch-1' },
      json: {
        commands: [
          submitBody(ACME_PROD, 'b-1'),
          { idempotency_key: 'b-2' },
          submitBody(ACME_DEV, 'b-3'),
          submitBody(ACME_PROD, 'taken', { data: { other: true } }),
          submitBody(ACME_PROD, 'b-5'),
        ],
      },
    });
    const { results } = await expectJson<{ results: (TaskSnapshot | Problem)[] }>(res, 200);
    expect(results.map((r) => ('code' in r ? r.code : r.state))).toEqual([
      'queued',
      'invalid_input',
      'invalid_input',
      'conflict',
      'queued',
    ]);
    expect(results[1]).toMatchObject({ status: 400, path: '$.commands[1].input' });
    expect(results[2]).toMatchObject({ reason: 'scope_mismatch' });
    // Refused in decoding, in the route's scope check and by the service: each traceable to the
    // request's log line, as a whole request's problem is (the SDK's ProblemError.requestId).
    expect([1, 2, 3].map((i) => (results[i] as Problem).request_id)).toEqual([
      'batch-1',
      'batch-1',
      'batch-1',
    ]);
  });

  it('answers an item whose data breaks a strict-JSON value rule on its own; its neighbours are submitted', async () => {
    const h = createHarness();
    const item = (key: string, data: string) =>
      JSON.stringify(submitBody(ACME_PROD, key, { data: 1 })).replace('"data":1', `"data":${data}`);
    const res = await h.call(`${TASKS}:batch`, {
      key: KEYS.client,
      headers: { 'content-type': 'application/json' },
      body: `{"commands":[${item('v-1', '{"a":1,"a":2}')},${item('v-2', '9007199254740993')},${item('v-3', '{"ok":true}')}]}`,
    });
    const { results } = await expectJson<{ results: (TaskSnapshot | Problem)[] }>(res, 200);
    expect(results[0]).toMatchObject({
      code: 'invalid_input',
      reason: 'duplicate_key',
      path: '$.commands[0].input.data.a',
    });
    expect(results[1]).toMatchObject({ code: 'invalid_input', reason: 'number_out_of_range' });
    expect(results[2]).toMatchObject({ state: 'queued' });
    expect(h.calls.submitBatch).toBe(1);
  });

  it('rejects a bad envelope, a foreign scope and a too-large body as a whole', async () => {
    const h = createHarness();
    const path = `${TASKS}:batch`;
    await expectProblem(
      await h.call(path, { key: KEYS.client, json: { commands: [] } }),
      'invalid_input',
    );
    await expectProblem(await h.call(path, { key: KEYS.client, json: [] }), 'invalid_input');
    await expectProblem(
      await h.call(`${scopePath(GLOBEX_PROD)}/tasks:batch`, {
        key: KEYS.client,
        json: { commands: [submitBody(GLOBEX_PROD, 'g')] },
      }),
      'forbidden',
    );
    await expectProblem(
      await h.call(path, {
        key: KEYS.client,
        headers: { 'content-type': 'application/json', 'content-length': String(17 * 1024 * 1024) },
        body: '{}',
      }),
      'payload_too_large',
    );
    expect(h.calls.submitBatch).toBeUndefined();
  });
});

describe('GET {scope}/tasks', () => {
  it('lists with filters, label filters (AND) and cursors', async () => {
    const h = createHarness();
    const red = await submitTask(h, ACME_PROD, KEYS.client, { labels: { team: 'red', tier: '1' } });
    await submitTask(h, ACME_PROD, KEYS.client, { labels: { team: 'red', tier: '2' } });
    await submitTask(h, ACME_PROD, KEYS.client, { queue: 'other', program: { name: 'p2' } });
    await submitTask(h, ACME_DEV, KEYS.client);
    const all = await expectJson<TaskPage>(await h.call(TASKS, { key: KEYS.client }), 200);
    expect(all.tasks).toHaveLength(3);
    const labelled = await expectJson<TaskPage>(
      await h.call(`${TASKS}?label.team=red&label.tier=1`, { key: KEYS.client }),
      200,
    );
    expect(labelled.tasks.map((t) => t.task_id)).toEqual([red.task_id]);
    const byQueue = await expectJson<TaskPage>(
      await h.call(`${TASKS}?queue=other&program=p2&state=queued`, { key: KEYS.client }),
      200,
    );
    expect(byQueue.tasks).toHaveLength(1);
    const range = await expectJson<TaskPage>(
      await h.call(`${TASKS}?submitted_from=0&submitted_until=1`, { key: KEYS.client }),
      200,
    );
    expect(range.tasks).toHaveLength(0);
    const first = await expectJson<TaskPage>(
      await h.call(`${TASKS}?limit=2`, { key: KEYS.client }),
      200,
    );
    expect(first.tasks).toHaveLength(2);
    expect(first.next_cursor).toBeDefined();
    const second = await expectJson<TaskPage>(
      await h.call(`${TASKS}?limit=2&cursor=${first.next_cursor}`, { key: KEYS.client }),
      200,
    );
    expect(second.tasks).toHaveLength(1);
    expect(second.next_cursor).toBeUndefined();
    const replayed = await h.call(`${TASKS}?queue=email&cursor=${first.next_cursor}`, {
      key: KEYS.client,
    });
    expect((await expectProblem(replayed, 'invalid_input')).reason).toBe('invalid_cursor');
  });

  it('filters by workflow_id (a TaskFilters field), binding it to the cursor', async () => {
    const h = createHarness();
    await submitTask(h, ACME_PROD, KEYS.client);
    await submitTask(h, ACME_PROD, KEYS.client);
    // Tasks submitted outside a workflow carry no workflow_id, so none matches.
    const none = await expectJson<TaskPage>(
      await h.call(`${TASKS}?workflow_id=wf_1`, { key: KEYS.client }),
      200,
    );
    expect(none).toEqual({ tasks: [] });
    const first = await expectJson<TaskPage>(
      await h.call(`${TASKS}?limit=1`, { key: KEYS.client }),
      200,
    );
    const replayed = await h.call(`${TASKS}?workflow_id=wf_1&cursor=${first.next_cursor}`, {
      key: KEYS.client,
    });
    expect((await expectProblem(replayed, 'invalid_input')).reason).toBe('invalid_cursor');
  });

  it.each([
    'limit=0',
    'limit=501',
    'limit=abc',
    'limit=-1',
    'limit=1.5',
    'limit=99999999999999999999',
    'state=running',
    'queue=',
    'queue=%20x',
    'workflow_id=',
    'workflow_id=a&workflow_id=b',
    'submitted_from=yesterday',
    'submitted_from=-5',
    'cursor=%%%',
    'cursor=not*base64',
    'limit=1&limit=2',
    'label.a=1&label.a=2',
    'label.__proto__=x',
    'label.=x',
    'unknown=1',
  ])('rejects ?%s with 400', async (query) => {
    const h = createHarness();
    await expectProblem(await h.call(`${TASKS}?${query}`, { key: KEYS.client }), 'invalid_input');
  });

  it('accepts limits 1 and 500 and rejects foreign scopes', async () => {
    const h = createHarness();
    expect((await h.call(`${TASKS}?limit=1`, { key: KEYS.client })).status).toBe(200);
    expect((await h.call(`${TASKS}?limit=500`, { key: KEYS.client })).status).toBe(200);
    await expectProblem(
      await h.call(`${scopePath(GLOBEX_PROD)}/tasks`, { key: KEYS.client }),
      'forbidden',
    );
  });

  it('reports a bad list cursor at query.cursor, like every other list query parameter', async () => {
    const h = createHarness();
    const limit = await expectProblem(
      await h.call(`${TASKS}?limit=0`, { key: KEYS.client }),
      'invalid_input',
    );
    expect(limit.path).toBe('query.limit');
    const cursor = await expectProblem(
      await h.call(`${TASKS}?cursor=abc`, { key: KEYS.client }),
      'invalid_input',
    );
    expect(cursor.reason).toBe('invalid_cursor');
    // There is no JSON body on a GET: `$.cursor` would name nothing the caller sent.
    expect(cursor.path).toBe('query.cursor');
  });
});

describe('per-task client routes', () => {
  it('status, snapshot, result, attempt and history of a task', async () => {
    const h = createHarness();
    const { task, assignment } = await assignTask(h);
    const base = `${TASKS}/${task.task_id}`;
    const status = await expectJson<TaskStatus>(await h.call(base, { key: KEYS.client }), 200);
    expect(status).toMatchObject({ task_id: task.task_id, state: 'active' });
    const snapshot = await expectJson<TaskSnapshot>(
      await h.call(`${base}/snapshot`, { key: KEYS.client }),
      200,
    );
    expect(snapshot.current_attempt_id).toBe(assignment.lease.owner.attempt_id);
    const pending = await expectJson<TaskResult>(
      await h.call(`${base}/result`, { key: KEYS.client }),
      200,
    );
    expect(pending.outcome).toEqual({ state: 'pending' });
    const attempt = await expectJson<AttemptSnapshot>(
      await h.call(`${base}/attempts/${assignment.lease.owner.attempt_id}`, { key: KEYS.client }),
      200,
    );
    expect(attempt.state).toBe('active');
    const history = await expectJson<RecordedHistoryEvent[]>(
      await h.call(`${base}/history`, { key: KEYS.client }),
      200,
    );
    expect(history.map((e) => e.event.reason)).toEqual(['submitted', 'claimed']);
    const after = await expectJson<RecordedHistoryEvent[]>(
      await h.call(`${base}/history?after_sequence=1`, { key: KEYS.client }),
      200,
    );
    expect(after.map((e) => e.sequence)).toEqual([2]);
    // A settled task's result, read with a (clamped) wait that returns at once.
    await h.call('/v1/worker/settle', { key: KEYS.worker, json: settleBody(assignment) });
    const done = await expectJson<TaskResult>(
      await h.call(`${base}/result?wait_ms=999999999999999999999`, { key: KEYS.client }),
      200,
    );
    expect(done.outcome).toEqual({ state: 'succeeded', output: { ok: true } });
  });

  it('answers 404 for unknown tasks and attempts, and for tasks of another tenant', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    for (const suffix of ['', '/result', '/snapshot', '/history', '/attempts/att_nope']) {
      await expectProblem(
        await h.call(`${TASKS}/tsk_unknown${suffix}`, { key: KEYS.client }),
        'not_found',
      );
      // globex asks for acme's task in its own scope: indistinguishable from unknown.
      await expectProblem(
        await h.call(`${scopePath(GLOBEX_PROD)}/tasks/${task.task_id}${suffix}`, {
          key: KEYS.other,
        }),
        'not_found',
      );
    }
    await expectProblem(
      await h.call(`${TASKS}/${task.task_id}/attempts/att_nope`, { key: KEYS.client }),
      'not_found',
    );
    await expectProblem(
      await h.call(`${scopePath(GLOBEX_PROD)}/tasks/${task.task_id}/cancel`, {
        method: 'POST',
        key: KEYS.other,
      }),
      'not_found',
    );
  });

  it.each([
    ['/result?wait_ms=abc'],
    ['/result?wait_ms=-1'],
    ['/result?wait=1'],
    ['/history?after_sequence=x'],
    ['/history?after_sequence=99999999999999999999'],
    ['/snapshot?x=1'],
    ['?x=1'],
  ])('rejects bad query %s with 400', async (suffix) => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    await expectProblem(
      await h.call(`${TASKS}/${task.task_id}${suffix}`, { key: KEYS.client }),
      'invalid_input',
    );
  });

  it('rejects malformed path parameters with 400', async () => {
    const h = createHarness();
    await expectProblem(await h.call(`${TASKS}/%20x`, { key: KEYS.client }), 'invalid_input');
    await expectProblem(
      await h.call(`/v1/tenants/acme/namespaces/${'n'.repeat(129)}/tasks`, { key: KEYS.client }),
      'invalid_input',
    );
    await expectProblem(await h.call(`${TASKS}/a%00b`, { key: KEYS.client }), 'invalid_input');
  });

  it('rejects a path whose escapes are not UTF-8, where the router would keep them as typed', async () => {
    const h = createHarness();
    // Truncated, overlong and non-hex escapes, in the scope and in an id; `%25` spells a `%`.
    for (const path of [
      `${TASKS}/tsk_%E0%A4`,
      `${TASKS}/tsk_%C0%AF`,
      `${TASKS}/tsk_%ZZ`,
      '/v1/tenants/acme%E0%A4/namespaces/prod/tasks',
    ]) {
      const res = await h.call(path, { key: KEYS.client });
      expect((await expectProblem(res, 'invalid_input')).reason, path).toBe('path_parameter');
    }
    await expectProblem(await h.call(`${TASKS}/tsk_%25E0`, { key: KEYS.client }), 'not_found');
  });

  it('cancels with no body, with {} and rejects other bodies', async () => {
    const h = createHarness();
    const a = await submitTask(h, ACME_PROD, KEYS.client);
    const b = await submitTask(h, ACME_PROD, KEYS.client);
    const cancelA = await h.call(`${TASKS}/${a.task_id}/cancel`, {
      method: 'POST',
      key: KEYS.client,
    });
    expect(await expectJson(cancelA, 200)).toEqual({ task_state: 'cancelled' });
    const emptyJson = await h.call(`${TASKS}/${b.task_id}/cancel`, {
      key: KEYS.client,
      body: '',
      headers: { 'content-type': 'application/json' },
    });
    expect(emptyJson.status).toBe(200);
    const withObject = await h.call(`${TASKS}/${b.task_id}/cancel`, { key: KEYS.client, json: {} });
    expect(await expectJson(withObject, 200)).toEqual({ task_state: 'cancelled' });
    for (const json of [[], 1, 'x', null, { reason: 'x' }]) {
      await expectProblem(
        await h.call(`${TASKS}/${b.task_id}/cancel`, { key: KEYS.client, json }),
        'invalid_input',
      );
    }
    await expectProblem(
      await h.call(`${TASKS}/${b.task_id}/cancel`, {
        key: KEYS.client,
        body: '{}',
        headers: { 'content-type': 'text/plain' },
      }),
      'unsupported_media_type',
    );
    await expectProblem(
      await h.call(`${TASKS}/${b.task_id}/cancel`, {
        method: 'POST',
        key: KEYS.client,
        body: `{"a":"${'x'.repeat(16 * 1024)}"}`,
        headers: { 'content-type': 'application/json' },
      }),
      'payload_too_large',
    );
    await expectProblem(
      await h.call(`${TASKS}/tsk_nope/cancel`, { method: 'POST', key: KEYS.client }),
      'not_found',
    );
    await expectProblem(
      await h.call(`${TASKS}/${b.task_id}/cancel`, { method: 'POST', key: KEYS.worker }),
      'forbidden',
    );
  });
});

describe('worker sessions', () => {
  it('opens and extends a session', async () => {
    const h = createHarness();
    const session = await openSession(h);
    h.store.advance(1_000);
    const extended = await expectJson<WorkerSession>(
      await h.call(`/v1/worker/sessions/${session.id}/extend`, {
        key: KEYS.worker,
        json: { scope: ACME_PROD },
      }),
      200,
    );
    expect(extended.expires_at).toBeGreaterThan(session.expires_at);
    // A key bound to exactly one namespace needs no body.
    const sole = await h.call(`/v1/worker/sessions/${session.id}/extend`, {
      method: 'POST',
      key: KEYS.prodWorker,
    });
    expect(sole.status).toBe(200);
    // Nor does one bound to every namespace (DESIGN §6: extend takes no body): the session's own.
    const bodiless = await expectJson<WorkerSession>(
      await h.call(`/v1/worker/sessions/${session.id}/extend`, {
        method: 'POST',
        key: KEYS.worker,
      }),
      200,
    );
    expect(bodiless.id).toBe(session.id);
  });

  it('answers extend errors: 403, 404, 410, bad bodies', async () => {
    const h = createHarness();
    const session = await openSession(h);
    const extend = `/v1/worker/sessions/${session.id}/extend`;
    // Without a body: another tenant's key finds no such session, as for a missing one, and a
    // key without the worker role is refused first.
    await expectProblem(
      await h.call(extend, { method: 'POST', key: KEYS.other }),
      'session_not_found',
    );
    await expectProblem(
      await h.call('/v1/worker/sessions/ses_nope/extend', { method: 'POST', key: KEYS.worker }),
      'session_not_found',
    );
    await expectProblem(await h.call(extend, { method: 'POST', key: KEYS.client }), 'forbidden');
    await expectProblem(
      await h.call(extend, { key: KEYS.worker, json: { scope: GLOBEX_PROD } }),
      'forbidden',
    );
    await expectProblem(
      await h.call(extend, { key: KEYS.client, json: { scope: ACME_PROD } }),
      'forbidden',
    );
    await expectProblem(
      await h.call('/v1/worker/sessions/ses_nope/extend', {
        key: KEYS.worker,
        json: { scope: ACME_PROD },
      }),
      'session_not_found',
    );
    // Another namespace of the same tenant does not hold the session either.
    await expectProblem(
      await h.call(extend, { key: KEYS.worker, json: { scope: ACME_DEV } }),
      'session_not_found',
    );
    for (const json of [[], 'x', { scope: 'acme' }, { scope: ACME_PROD, extra: 1 }]) {
      await expectProblem(await h.call(extend, { key: KEYS.worker, json }), 'invalid_input');
    }
    h.store.advance(SESSION_VALIDITY_MS + 1);
    await expectProblem(
      await h.call(extend, { key: KEYS.worker, json: { scope: ACME_PROD } }),
      'session_expired',
    );
  });

  it('rejects bad open-session commands', async () => {
    const h = createHarness();
    const path = '/v1/worker/sessions';
    await expectProblem(
      await h.call(path, { key: KEYS.worker, json: { scope: ACME_PROD, queue: 'q' } }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(path, {
        key: KEYS.worker,
        json: { scope: ACME_PROD, queue: 'q', concurrency: 0 },
      }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(path, {
        key: KEYS.worker,
        json: { scope: GLOBEX_PROD, queue: 'q', concurrency: 1 },
      }),
      'forbidden',
    );
    await expectProblem(
      await h.call(path, {
        key: KEYS.prodWorker,
        json: { scope: ACME_DEV, queue: 'q', concurrency: 1 },
      }),
      'forbidden',
    );
    await expectProblem(
      await h.call(path, {
        key: KEYS.client,
        json: { scope: ACME_PROD, queue: 'q', concurrency: 1 },
      }),
      'forbidden',
    );
  });
});

describe('acquire, renew, settle, quiescence', () => {
  it('acquires empty, then assigned; replays; rejects gaps, busy slots and bad sessions', async () => {
    const h = createHarness();
    const session = await openSession(h);
    const acquire = (body: unknown) =>
      h.call('/v1/worker/acquire', { key: KEYS.worker, json: body });
    expect(await expectJson<AcquireReply>(await acquire(acquireBody(session, 0, 1)), 200)).toEqual({
      disposition: 'empty',
      sequence: 1,
    });
    await submitTask(h);
    const assigned = await expectJson<AcquireReply>(await acquire(acquireBody(session, 0, 2)), 200);
    expect(assigned.disposition).toBe('assigned');
    const replay = await expectJson<AcquireReply>(await acquire(acquireBody(session, 0, 2)), 200);
    expect(replay.disposition).toBe('assigned');
    await expectProblem(await acquire(acquireBody(session, 0, 5)), 'sequence_conflict');
    await expectProblem(await acquire(acquireBody(session, 0, 3)), 'consumer_busy');
    await expectProblem(
      await acquire({ ...acquireBody(session, 1, 1), queue: 'other' }),
      'invalid_input',
    );
    await expectProblem(await acquire(acquireBody(session, 5, 1)), 'invalid_input');
    await expectProblem(
      await acquire({ ...acquireBody(session, 1, 1), worker_session_id: 'ses_nope' }),
      'session_not_found',
    );
    await expectProblem(
      await acquire({ ...acquireBody(session, 1, 1), scope: GLOBEX_PROD }),
      'forbidden',
    );
    await expectProblem(
      await h.call('/v1/worker/acquire?wait_ms=x', {
        key: KEYS.worker,
        json: acquireBody(session, 1, 1),
      }),
      'invalid_input',
    );
    h.store.advance(SESSION_VALIDITY_MS + 1);
    await expectProblem(await acquire(acquireBody(session, 1, 1)), 'session_expired');
  });

  it('acquires in a batch, answering each slot on its own', async () => {
    const h = createHarness();
    const session = await openSession(h);
    await submitTask(h);
    const res = await h.call('/v1/worker/acquire:batch', {
      key: KEYS.worker,
      json: {
        commands: [
          acquireBody(session, 0, 1),
          { ...acquireBody(session, 1, 1), sequence: -1 },
          { ...acquireBody(session, 1, 1), scope: GLOBEX_PROD },
          acquireBody(session, 1, 1),
        ],
      },
    });
    const { replies } = await expectJson<{ replies: (AcquireReply | Problem)[] }>(res, 200);
    expect(replies.map((r) => ('code' in r ? r.code : r.disposition))).toEqual([
      'assigned',
      'invalid_input',
      'forbidden',
      'empty',
    ]);
    await expectProblem(
      await h.call('/v1/worker/acquire:batch', {
        key: KEYS.client,
        json: { commands: [acquireBody(session, 0, 2)] },
      }),
      'forbidden',
    );
  });

  it('answers sequence 0 by the sequence rules (409 sequence_conflict), never as invalid_input (DESIGN §4.1: sequences are integers in 0..2^53−1)', async () => {
    const h = createHarness();
    const { assignment, session } = await assignTask(h, ACME_PROD, KEYS.both);
    expect(assignment.authority.renew_sequence).toBe(0);
    // An assignment starts at renew_sequence 0, but nothing was renewed yet: 0 replays nothing
    // and is not the next (1).
    await expectProblem(
      await h.call('/v1/worker/renew', {
        key: KEYS.both,
        json: { owner: assignment.lease.owner, sequence: 0, intent: 'keep_alive' },
      }),
      'sequence_conflict',
    );
    // Acquire on a slot that has not polled yet: 0 is not `last + 1` (1).
    await expectProblem(
      await h.call('/v1/worker/acquire', {
        key: KEYS.both,
        json: {
          scope: session.scope,
          queue: session.queue,
          worker_session_id: session.id,
          consumer_id: 1,
          sequence: 0,
        },
      }),
      'sequence_conflict',
    );
  });

  it('renews, settles, replays and rejects stale owners', async () => {
    const h = createHarness();
    const { task, assignment } = await assignTask(h);
    const owner = assignment.lease.owner;
    const renew = (body: unknown) => h.call('/v1/worker/renew', { key: KEYS.worker, json: body });
    const granted = await expectJson<Authority>(
      await renew({ owner, sequence: 1, intent: 'dispatch' }),
      200,
    );
    expect(granted.dispatch_allowed).toBe(true);
    await expectProblem(
      await renew({ owner, sequence: 3, intent: 'keep_alive' }),
      'sequence_conflict',
    );
    await expectProblem(
      await renew({
        owner: { ...owner, lease_id: 'lease_other' },
        sequence: 2,
        intent: 'keep_alive',
      }),
      'ownership_lost',
    );
    await expectProblem(
      await renew({ owner: { ...owner, scope: GLOBEX_PROD }, sequence: 2, intent: 'keep_alive' }),
      'forbidden',
    );
    const batch = await h.call('/v1/worker/renew:batch', {
      key: KEYS.worker,
      json: {
        commands: [
          { owner, sequence: 2, intent: 'keep_alive' },
          { owner, sequence: 9, intent: 'keep_alive' },
          { owner, sequence: 3 },
        ],
      },
    });
    const { results } = await expectJson<{ results: (Authority | Problem)[] }>(batch, 200);
    expect(results.map((r) => ('code' in r ? r.code : r.renew_sequence))).toEqual([
      2,
      'sequence_conflict',
      'invalid_input',
    ]);
    const settle = (body: unknown) => h.call('/v1/worker/settle', { key: KEYS.worker, json: body });
    const settled = await expectJson<SettleReply>(await settle(settleBody(assignment)), 200);
    expect(settled).toMatchObject({ already_accepted: false, task_state: 'succeeded' });
    const replayed = await expectJson<SettleReply>(await settle(settleBody(assignment)), 200);
    expect(replayed.already_accepted).toBe(true);
    const changed = settleBody(assignment);
    changed.report.report.outcome.output = { ok: false };
    await expectProblem(await settle(changed), 'conflict');
    await expectProblem(
      await settle({ ...settleBody(assignment, 'op-2'), owner: { ...owner, generation: 7 } }),
      'ownership_lost',
    );
    await expectProblem(
      await settle({ ...settleBody(assignment, 'op-3'), owner: { ...owner, scope: ACME_DEV } }),
      'not_found',
    );
    const status = await expectJson<TaskStatus>(
      await h.call(`${TASKS}/${task.task_id}`, { key: KEYS.client }),
      200,
    );
    expect(status.state).toBe('succeeded');
  });

  it('settles in a batch and confirms quiescence', async () => {
    const h = createHarness();
    const first = await assignTask(h);
    const res = await h.call('/v1/worker/settle:batch', {
      key: KEYS.worker,
      json: {
        commands: [
          settleBody(first.assignment, 'op-q', 'unconfirmed'),
          { ...settleBody(first.assignment, 'op-x'), quiescence: 'maybe' },
        ],
      },
    });
    const { results } = await expectJson<{ results: (SettleReply | Problem)[] }>(res, 200);
    expect(results[0]).toMatchObject({ task_state: 'active' });
    expect(results[1]).toMatchObject({ code: 'invalid_input', path: '$.commands[1].quiescence' });
    const owner = first.assignment.lease.owner;
    const quiesce = (body: unknown, key: string = KEYS.worker) =>
      h.call('/v1/worker/quiescence', { key, json: body });
    await expectProblem(await quiesce({ ...owner, lease_id: 'lease_x' }), 'ownership_lost');
    await expectProblem(await quiesce({ ...owner, scope: GLOBEX_PROD }), 'forbidden');
    await expectProblem(await quiesce(owner, KEYS.client), 'forbidden');
    await expectProblem(await quiesce({ ...owner, extra: 1 }), 'invalid_input');
    expect(await expectJson(await quiesce(owner), 200)).toEqual({ task_state: 'succeeded' });
  });
});

describe('every /v1 route', () => {
  it('answers 401 without a key, before looking at anything else', async () => {
    const h = createHarness();
    const seen = new Set<string>();
    const routes = h.app.routes.filter((r) => {
      const id = `${r.method} ${r.path}`;
      if (r.method === 'ALL' || !r.path.startsWith('/v1/') || seen.has(id)) return false;
      seen.add(id);
      return true;
    });
    expect(routes).toHaveLength(24);
    for (const route of routes) {
      const path = route.path.replace(/\/:([a-z_]+)/g, '/x');
      const res = await h.call(path, {
        method: route.method,
        ...(route.method === 'POST'
          ? { body: 'not json', headers: { 'content-type': 'text/plain' } }
          : {}),
      });
      await expectProblem(res, 'unauthorized');
    }
  });

  it('answers 403 on every client read for a key without the role or the scope', async () => {
    const h = createHarness();
    const { task, assignment } = await assignTask(h);
    const base = `${TASKS}/${task.task_id}`;
    for (const path of [
      TASKS,
      base,
      `${base}/result`,
      `${base}/snapshot`,
      `${base}/attempts/${assignment.lease.owner.attempt_id}`,
      `${base}/history`,
    ]) {
      expect(
        (await expectProblem(await h.call(path, { key: KEYS.worker }), 'forbidden')).reason,
      ).toBe('role');
      expect(
        (await expectProblem(await h.call(path, { key: KEYS.other }), 'forbidden')).reason,
      ).toBe('scope');
      expect((await h.call(path, { key: KEYS.admin })).status).toBe(200);
    }
  });
});

describe('operations routes and the edge', () => {
  it('serves /healthz, /readyz and /metrics without a key', async () => {
    let ready: boolean | { ok: boolean; detail?: string } | Error = true;
    const h = createHarness({
      health: {
        ready: async () => {
          if (ready instanceof Error) throw ready;
          return ready;
        },
      },
      metrics: { contentType: 'text/plain; version=0.0.4', render: async () => 'up 1\n' },
    });
    expect(await expectJson(await h.call('/healthz'), 200)).toEqual({ status: 'ok' });
    expect(await expectJson(await h.call('/readyz'), 200)).toEqual({ status: 'ready' });
    ready = { ok: false, detail: 'migrations pending' };
    const pending = await expectProblem(await h.call('/readyz'), 'unavailable');
    expect(pending.detail).toBe('migrations pending');
    ready = false;
    await expectProblem(await h.call('/readyz'), 'unavailable');
    ready = new Error('database down');
    await expectProblem(await h.call('/readyz'), 'unavailable');
    const metrics = await h.call('/metrics');
    expect(metrics.status).toBe(200);
    expect(metrics.headers.get('content-type')).toBe('text/plain; version=0.0.4');
    expect(await metrics.text()).toBe('up 1\n');
    await expectProblem(await createHarness().call('/metrics'), 'not_found');
  });

  it('answers unknown routes with a 404 problem', async () => {
    const h = createHarness();
    await expectProblem(await h.call('/nope'), 'not_found');
    await expectProblem(await h.call('/v1/worker/acquire', { key: KEYS.worker }), 'not_found');
  });

  it('keeps a well-formed request id and replaces others', async () => {
    const h = createHarness();
    const kept = await h.call('/healthz', { headers: { 'x-request-id': 'req-123' } });
    expect(kept.headers.get('x-request-id')).toBe('req-123');
    const replaced = await h.call('/healthz', { headers: { 'x-request-id': 'bad id\t' } });
    expect(replaced.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/);
    const long = await h.call('/healthz', { headers: { 'x-request-id': 'a'.repeat(129) } });
    expect(long.headers.get('x-request-id')).not.toBe('a'.repeat(129));
    const custom = createHarness({ requestIdHeader: 'x-correlation-id' });
    const res = await custom.call('/nope', { headers: { 'x-correlation-id': 'corr-1' } });
    expect(res.headers.get('x-correlation-id')).toBe('corr-1');
    expect(((await res.json()) as Problem).request_id).toBe('corr-1');
  });

  it('writes one JSON log line per request with the route pattern and never the key', async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const h = createHarness({ logger });
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    await h.call(`${TASKS}/${task.task_id}`, {
      key: KEYS.client,
      headers: { 'x-request-id': 'log-1' },
    });
    await h.call('/nope');
    const requests = lines.filter((l) => l.msg === 'request');
    expect(requests).toHaveLength(3);
    expect(requests[1]).toMatchObject({
      request_id: 'log-1',
      method: 'GET',
      route: '/v1/tenants/:tenant_id/namespaces/:namespace/tasks/:task_id',
      status: 200,
      tenant: 'acme',
    });
    expect(typeof requests[1]?.duration_ms).toBe('number');
    expect(requests[2]).toMatchObject({ route: null, status: 404, tenant: null });
    expect(JSON.stringify(lines)).not.toContain(KEYS.client);
  });

  it("logs each request's peer address from the remoteAddress option, and null without one", async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const peers = ['203.0.113.7', undefined];
    const h = createHarness({ logger, remoteAddress: () => peers.shift() });
    await h.call('/healthz');
    await h.call('/healthz');
    const failing = createHarness({
      logger,
      remoteAddress: () => {
        throw new Error('no socket');
      },
    });
    // A failing lookup leaves the field null and the reply as it would be.
    expect((await failing.call('/healthz')).status).toBe(200);
    await createHarness({ logger }).call('/healthz');
    const logged = lines.filter((l) => l.msg === 'request').map((l) => l.remote_address);
    expect(logged).toEqual(['203.0.113.7', null, null, null]);
  });

  it("names the tenant of a development-mode request in its log line, from the request's scope", async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const h = createHarness({ auth: { keys: [] }, logger });
    const task = await submitTask(h, ACME_PROD);
    await h.call(`${TASKS}/${task.task_id}`);
    const session = await h.call('/v1/worker/sessions', {
      json: { scope: GLOBEX_PROD, queue: 'q', concurrency: 1 },
    });
    expect(session.status).toBe(200);
    const requests = lines.filter((l) => l.msg === 'request');
    expect(requests.map((l) => [l.status, l.tenant])).toEqual([
      [201, ACME_PROD.tenant_id],
      [200, ACME_PROD.tenant_id],
      [200, GLOBEX_PROD.tenant_id],
    ]);
  });

  it('answers 503 for a failure that is not a contract error and logs its stack', async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const service = createTaskService({ store: createMemoryTaskStore() });
    service.status = async () => {
      throw new Error('connection reset: secret-dsn');
    };
    const app = createHttpApp({ service, auth: { keys: [] }, logger });
    const res = await app.request(`${TASKS}/tsk_1`);
    const problem = await expectProblem(res, 'unavailable');
    expect(JSON.stringify(problem)).not.toContain('secret-dsn');
    const failure = lines.find((l) => l.msg === 'request failed') as { err?: { stack?: string } };
    expect(failure?.err?.stack).toContain('connection reset');
  });

  it('answers a store failure wrapped as unavailable with the generic detail and logs its cause', async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const service = createTaskService({ store: createMemoryTaskStore() });
    // What the PostgreSQL store throws for a failed statement (store.ts `unavailable`).
    const cause = new Error('relation "tasks" does not exist at db-internal-7:5432');
    service.status = async () => {
      throw new ContractError('unavailable', `the task store is unavailable: ${cause.message}`, {
        cause,
      });
    };
    const app = createHttpApp({ service, auth: { keys: [] }, logger });
    const problem = await expectProblem(await app.request(`${TASKS}/tsk_1`), 'unavailable');
    expect(JSON.stringify(problem)).not.toContain('db-internal-7');
    expect(problem.detail).toBe('The service is temporarily unavailable; retry later.');
    const failure = lines.find((l) => l.msg === 'request failed') as {
      request_id?: string;
      err?: { message?: string };
    };
    expect(failure?.err?.message).toContain('db-internal-7');
    expect(failure?.request_id).toBe(problem.request_id);
  });

  it('answers a batch item the store failed with the generic detail and logs its cause', async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const service = createTaskService({ store: createMemoryTaskStore() });
    const submitBatch = service.submitBatch.bind(service);
    const cause = new Error('deadlock detected on db-internal-7');
    // The first item answered as the PostgreSQL store answers an item its statement failed.
    service.submitBatch = async (commands) => {
      const [, ...rest] = await submitBatch(commands);
      const failed = new ContractError(
        'unavailable',
        `the task store is unavailable: ${cause.message}`,
        {
          cause,
        },
      );
      return [{ ok: false, error: failed }, ...rest];
    };
    const app = createHttpApp({ service, auth: { keys: [] }, logger });
    const res = await app.request(`${TASKS}:batch`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        commands: [submitBody(ACME_PROD, 'item-1'), submitBody(ACME_PROD, 'item-2')],
      }),
    });
    const { results } = await expectJson<{ results: (TaskSnapshot | Problem)[] }>(res, 200);
    expect(results[0]).toMatchObject({
      code: 'unavailable',
      detail: 'The service is temporarily unavailable; retry later.',
    });
    expect(JSON.stringify(results)).not.toContain('db-internal-7');
    expect(results[1]).toMatchObject({ state: 'queued' });
    const failure = lines.find((l) => l.msg === 'request failed') as { err?: { message?: string } };
    expect(failure?.err?.message).toContain('db-internal-7');
  });

  it('runs in development mode without keys: every request is allowed', async () => {
    const app = createHttpApp({
      service: createTaskService({ store: createMemoryTaskStore() }),
      auth: { keys: [] },
    });
    const res = await app.request(`${scopePath(GLOBEX_PROD)}/tasks`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer whatever' },
      body: JSON.stringify(submitBody(GLOBEX_PROD, 'dev')),
    });
    expect(res.status).toBe(201);
    const opened = await app.request('/v1/worker/sessions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ scope: GLOBEX_PROD, queue: 'q', concurrency: 1 }),
    });
    const { id } = (await opened.json()) as WorkerSession;
    // Extended without a body: the session's own scope, whatever tenant it is in.
    const extended = await app.request(`/v1/worker/sessions/${id}/extend`, { method: 'POST' });
    expect(((await extended.json()) as WorkerSession).id).toBe(id);
    const missing = await app.request('/v1/worker/sessions/ses_x/extend', { method: 'POST' });
    await expectProblem(missing, 'session_not_found');
  });

  it('serves the OpenAPI document without a key', async () => {
    const h = createHarness();
    const doc = await expectJson<{ openapi: string }>(await h.call('/openapi.json'), 200);
    expect(doc.openapi).toBe('3.1.0');
  });
});
