/**
 * Every wire limit (DESIGN §3, §4.1, §12; contracts/src/limits.ts) at its edge through
 * the HTTP app: the limit itself is accepted, the next representable value is refused with the
 * right status and problem code, and the refusal changes nothing in the store.
 */
import {
  BATCH_MAX_BYTES,
  COMPLETION_COMMAND_MAX_BYTES,
  CONTROL_REQUEST_MAX_BYTES,
  DESTINATION_ALIAS_MAX_BYTES,
  ERROR_CODE_MAX_BYTES,
  type ErrorCode,
  JSON_MAX_DEPTH,
  JSON_MAX_SAFE_NUMBER,
  KEY_MAX_BYTES,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  LEASE_SAFETY_MARGIN_MS,
  MAX_ATTEMPTS_LIMIT,
  MAX_CONCURRENCY_LIMIT,
  MAX_LABELS,
  MAX_SESSION_CONCURRENCY,
  MAX_SUBMIT_BATCH,
  MAX_SUBMIT_DELAY_MS,
  MAX_TIMEOUT_MS,
  MAX_WORKER_BATCH,
  MESSAGE_MAX_BYTES,
  MIN_RETENTION_MS,
  NAME_MAX_BYTES,
  OPERATION_ID_MAX_BYTES,
  OUTPUT_MAX_BYTES,
  PRIORITY_MAX,
  PRIORITY_MIN,
  RETRY_MAX_DELAY_MS,
  SCOPE_TEXT_MAX_BYTES,
  SUBMISSION_DATA_MAX_BYTES,
  TASK_CURSOR_MAX_BYTES,
  TASK_LIST_DEFAULT_LIMIT,
  TASK_LIST_MAX_LIMIT,
  type TaskPage,
  type TaskSnapshot,
  TRACESTATE_MAX_BYTES,
} from '@ledgence/contracts';
import { MIN_DISPATCH_WINDOW_MS } from '@ledgence/core';
import { describe, expect, it } from 'vitest';
import { expectJson, expectProblem, refusedUnchanged } from './testdata/expect.js';
import {
  ACME_PROD,
  acquireBody,
  assignTask,
  createHarness,
  type Harness,
  KEYS,
  openSession,
  policyPath,
  redeliverPath,
  scopePath,
  settleBody,
  submitBody,
  submitTask,
  subscribeBody,
  subscriptionsPath,
} from './testdata/harness.js';

const JSON_HEADERS = { 'content-type': 'application/json' };

/** `json` padded with trailing spaces to exactly `size` bytes. */
function padded(json: unknown, size: number): string {
  const text = JSON.stringify(json);
  const pad = size - Buffer.byteLength(text);
  if (pad < 0) throw new RangeError(`the body is already ${Buffer.byteLength(text)} bytes`);
  return text + ' '.repeat(pad);
}

/** Text of exactly `bytes` UTF-8 bytes, multi-byte where it can be (é is 2 bytes). */
function utf8Text(bytes: number): string {
  return 'é'.repeat(Math.floor(bytes / 2)) + 'x'.repeat(bytes % 2);
}

const tasksPath = `${scopePath(ACME_PROD)}/tasks`;

/** A request whose JSON body is `json` padded to exactly `bytes` bytes. */
function sized(
  h: Harness,
  path: string,
  json: unknown,
  bytes: number,
  auth: { key: string; method?: string },
): Promise<Response> {
  return h.call(path, { ...auth, body: padded(json, bytes), headers: JSON_HEADERS });
}

/** `json` padded one byte past `limit`: 413 `payload_too_large`, and nothing written. */
function refusedPastLimit(
  h: Harness,
  path: string,
  json: unknown,
  limit: number,
  auth: { key: string; method?: string },
): Promise<void> {
  return refusedUnchanged(h, () => sized(h, path, json, limit + 1, auth), 'payload_too_large');
}

function submit(h: Harness, command: unknown, headers: Record<string, string> = {}) {
  return h.call(tasksPath, {
    key: KEYS.client,
    body: JSON.stringify(command),
    headers: { ...JSON_HEADERS, ...headers },
  });
}

let unique = 0;
const key = () => `edge-${++unique}`;

/** Asserts the submit of `accepted` is 201 and of `refused` is `code`, writing nothing. */
async function submitEdge(
  accepted: Record<string, unknown>,
  refused: Record<string, unknown>,
  code: ErrorCode = 'invalid_input',
): Promise<void> {
  const h = createHarness();
  await expectJson(await submit(h, submitBody(ACME_PROD, key(), accepted)), 201);
  await refusedUnchanged(h, () => submit(h, submitBody(ACME_PROD, key(), refused)), code);
}

// ---- Body byte limits: the limit itself is accepted on every route ------------------------------

describe('route body limits: exactly the limit is accepted, limit + 1 is 413 and writes nothing', () => {
  it('open session, renew, quiescence, cancel and extend (CONTROL_REQUEST_MAX_BYTES)', async () => {
    const h = createHarness();
    const session = { scope: ACME_PROD, queue: 'email', concurrency: 1 };
    await refusedPastLimit(h, '/v1/worker/sessions', session, CONTROL_REQUEST_MAX_BYTES, {
      key: KEYS.worker,
    });
    await expectJson(
      await sized(h, '/v1/worker/sessions', session, CONTROL_REQUEST_MAX_BYTES, {
        key: KEYS.worker,
      }),
      200,
    );

    const { task, session: opened, assignment } = await assignTask(h);
    const renew = { owner: assignment.lease.owner, sequence: 1, intent: 'dispatch' };
    await refusedPastLimit(h, '/v1/worker/renew', renew, CONTROL_REQUEST_MAX_BYTES, {
      key: KEYS.worker,
    });
    await expectJson(
      await sized(h, '/v1/worker/renew', renew, CONTROL_REQUEST_MAX_BYTES, { key: KEYS.worker }),
      200,
    );

    // Exactly the limit reaches the service, which answers by the attempt's state.
    const quiet = await sized(
      h,
      '/v1/worker/quiescence',
      assignment.lease.owner,
      CONTROL_REQUEST_MAX_BYTES,
      { key: KEYS.worker },
    );
    expect([200, 409]).toContain(quiet.status);
    expect(
      quiet.status === 200 ||
        ((await quiet.json()) as { code: string }).code !== 'payload_too_large',
    ).toBe(true);

    const extend = `/v1/worker/sessions/${opened.id}/extend`;
    await expectJson(
      await sized(h, extend, { scope: ACME_PROD }, CONTROL_REQUEST_MAX_BYTES, { key: KEYS.worker }),
      200,
    );
    await expectProblem(
      await sized(h, extend, { scope: ACME_PROD }, CONTROL_REQUEST_MAX_BYTES + 1, {
        key: KEYS.worker,
      }),
      'payload_too_large',
    );

    const cancel = `${tasksPath}/${task.task_id}/cancel`;
    await refusedPastLimit(h, cancel, {}, CONTROL_REQUEST_MAX_BYTES, { key: KEYS.client });
    await expectJson(
      await sized(h, cancel, {}, CONTROL_REQUEST_MAX_BYTES, { key: KEYS.client }),
      200,
    );
  });

  it('set retention policy (CONTROL_REQUEST_MAX_BYTES)', async () => {
    const h = createHarness();
    const body = { retention_ms: 2 * MIN_RETENTION_MS };
    await refusedPastLimit(h, policyPath(ACME_PROD), body, CONTROL_REQUEST_MAX_BYTES, {
      key: KEYS.admin,
      method: 'PUT',
    });
    const exact = await sized(h, policyPath(ACME_PROD), body, CONTROL_REQUEST_MAX_BYTES, {
      key: KEYS.admin,
      method: 'PUT',
    });
    expect(await expectJson(exact, 200)).toMatchObject({ retention_ms: 2 * MIN_RETENTION_MS });
  });

  it('subscribe and redeliver (COMPLETION_COMMAND_MAX_BYTES)', async () => {
    const h = createHarness();
    const task = await submitTask(h);
    const path = subscriptionsPath(ACME_PROD, task.task_id);
    await refusedPastLimit(h, path, subscribeBody('edge'), COMPLETION_COMMAND_MAX_BYTES, {
      key: KEYS.client,
    });
    const created = await expectJson<{ id: string }>(
      await sized(h, path, subscribeBody('edge'), COMPLETION_COMMAND_MAX_BYTES, {
        key: KEYS.client,
      }),
      201,
    );
    // Exactly the limit reaches the service: the subscription is still waiting, so 409.
    await expectProblem(
      await sized(
        h,
        redeliverPath(ACME_PROD, created.id),
        { generation: 1 },
        COMPLETION_COMMAND_MAX_BYTES,
        { key: KEYS.client },
      ),
      'conflict',
    );
    await refusedPastLimit(
      h,
      redeliverPath(ACME_PROD, created.id),
      { generation: 1 },
      COMPLETION_COMMAND_MAX_BYTES,
      { key: KEYS.client },
    );
  });

  it('submit, acquire and renew batches (BATCH_MAX_BYTES)', async () => {
    const h = createHarness();
    const batch = { commands: [submitBody(ACME_PROD, 'batch-1')] };
    await refusedPastLimit(h, `${tasksPath}:batch`, batch, BATCH_MAX_BYTES, { key: KEYS.client });
    const submitted = await expectJson<{ results: TaskSnapshot[] }>(
      await sized(h, `${tasksPath}:batch`, batch, BATCH_MAX_BYTES, { key: KEYS.client }),
      200,
    );
    expect(submitted.results[0]?.state).toBe('queued');

    const session = await openSession(h, ACME_PROD, KEYS.worker, 1);
    const acquire = { commands: [acquireBody(session, 0, 1)] };
    await refusedPastLimit(h, '/v1/worker/acquire:batch', acquire, BATCH_MAX_BYTES, {
      key: KEYS.worker,
    });
    const acquired = await expectJson<{
      replies: { disposition: string; assignment: { lease: { owner: unknown } } }[];
    }>(
      await sized(h, '/v1/worker/acquire:batch', acquire, BATCH_MAX_BYTES, { key: KEYS.worker }),
      200,
    );
    const reply = acquired.replies[0];
    expect(reply?.disposition).toBe('assigned');

    const renew = {
      commands: [{ owner: reply?.assignment.lease.owner, sequence: 1, intent: 'dispatch' }],
    };
    await refusedPastLimit(h, '/v1/worker/renew:batch', renew, BATCH_MAX_BYTES, {
      key: KEYS.worker,
    });
    const renewed = await expectJson<{ results: { dispatch_allowed?: boolean }[] }>(
      await sized(h, '/v1/worker/renew:batch', renew, BATCH_MAX_BYTES, { key: KEYS.worker }),
      200,
    );
    expect(renewed.results[0]).not.toHaveProperty('code');
  });
});

// ---- Application JSON ------------------------------------------------------------------------

describe('application JSON (DESIGN §3, §4.1, §12)', () => {
  it('data: exactly SUBMISSION_DATA_MAX_BYTES compact is 201; one byte more is 413', async () => {
    const atLimit = 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2);
    await submitEdge({ data: atLimit }, { data: `${atLimit}x` }, 'payload_too_large');
  });

  it('data: escapes count as their compact encoding at the limit', async () => {
    // `"` encodes as two bytes; SUBMISSION_DATA_MAX_BYTES - 2 bytes of content = this many quotes.
    const quotes = '"'.repeat((SUBMISSION_DATA_MAX_BYTES - 2) / 2);
    await submitEdge({ data: quotes }, { data: `${quotes}x` }, 'payload_too_large');
  });

  it(`data: depth ${JSON_MAX_DEPTH} is 201; ${JSON_MAX_DEPTH + 1} is 400`, async () => {
    const nested = (depth: number) => JSON.parse(`${'['.repeat(depth)}${']'.repeat(depth)}`);
    await submitEdge({ data: nested(JSON_MAX_DEPTH) }, { data: nested(JSON_MAX_DEPTH + 1) });
  });

  it('numbers: ±(2^53−1) are 201; 2^53 (and 1e300) are 400', async () => {
    const h = createHarness();
    const command = (n: string) =>
      JSON.stringify(submitBody(ACME_PROD, key(), { data: { n: 0 } })).replace('"n":0', `"n":${n}`);
    const raw = (text: string) =>
      h.call(tasksPath, { key: KEYS.client, body: text, headers: JSON_HEADERS });
    for (const n of [String(JSON_MAX_SAFE_NUMBER), `-${JSON_MAX_SAFE_NUMBER}`]) {
      const created = await expectJson<TaskSnapshot>(await raw(command(n)), 201);
      expect(created.input.data).toEqual({ n: Number(n) });
    }
    for (const n of ['9007199254740992', '-9007199254740992', '1e300', '9007199254740991.5']) {
      await refusedUnchanged(h, () => raw(command(n)), 'invalid_input');
    }
  });
});

// ---- Text fields ---------------------------------------------------------------------------------

describe('text fields count UTF-8 bytes (DESIGN §3 validate_text)', () => {
  it(`queue: ${NAME_MAX_BYTES} bytes is 201; ${NAME_MAX_BYTES + 1} is 400`, async () => {
    await submitEdge(
      { queue: utf8Text(NAME_MAX_BYTES) },
      { queue: `${utf8Text(NAME_MAX_BYTES - 1)}é` },
    );
  });

  it(`program name and version: ${NAME_MAX_BYTES} bytes is 201; one more is 400`, async () => {
    await submitEdge(
      { program: { name: utf8Text(NAME_MAX_BYTES), version: utf8Text(NAME_MAX_BYTES) } },
      { program: { name: 'p', version: utf8Text(NAME_MAX_BYTES + 1) } },
    );
  });

  it(`concurrency_key: ${NAME_MAX_BYTES} bytes is 201; one more is 400`, async () => {
    await submitEdge(
      { concurrency_key: utf8Text(NAME_MAX_BYTES) },
      { concurrency_key: utf8Text(NAME_MAX_BYTES + 1) },
    );
  });

  it(`idempotency key: ${KEY_MAX_BYTES} bytes is 201; ${KEY_MAX_BYTES + 1} is 400 (body and header)`, async () => {
    const h = createHarness();
    await expectJson(await submit(h, submitBody(ACME_PROD, utf8Text(KEY_MAX_BYTES))), 201);
    await refusedUnchanged(
      h,
      () => submit(h, submitBody(ACME_PROD, utf8Text(KEY_MAX_BYTES + 1))),
      'invalid_input',
    );
    const { idempotency_key: _key, ...body } = submitBody(ACME_PROD, 'unused');
    const headerKey = (text: string) =>
      // Header values travel as bytes; the app decodes them as UTF-8.
      Buffer.from(text, 'utf8').toString('latin1');
    await expectJson(
      await submit(h, body, { 'idempotency-key': headerKey(`h${utf8Text(KEY_MAX_BYTES - 1)}`) }),
      201,
    );
    await refusedUnchanged(
      h,
      () => submit(h, body, { 'idempotency-key': headerKey(`h${utf8Text(KEY_MAX_BYTES)}`) }),
      'invalid_input',
    );
  });

  it(`labels: ${MAX_LABELS} pairs with ${LABEL_KEY_MAX_BYTES}-byte keys and ${LABEL_VALUE_MAX_BYTES}-byte values are 201`, async () => {
    const labels = (count: number, keyBytes = LABEL_KEY_MAX_BYTES, valueBytes = 1) =>
      Object.fromEntries(
        Array.from({ length: count }, (_, i) => [
          `${String(i).padStart(2, '0')}${'k'.repeat(keyBytes - 2)}`,
          utf8Text(valueBytes),
        ]),
      );
    await submitEdge({ labels: labels(MAX_LABELS) }, { labels: labels(MAX_LABELS + 1) });
    await submitEdge({ labels: labels(1) }, { labels: labels(1, LABEL_KEY_MAX_BYTES + 1) });
    await submitEdge(
      { labels: labels(1, 2, LABEL_VALUE_MAX_BYTES) },
      { labels: labels(1, 2, LABEL_VALUE_MAX_BYTES + 1) },
    );
  });

  it(`tracestate: ${TRACESTATE_MAX_BYTES} characters is 201; ${TRACESTATE_MAX_BYTES + 1} is 400`, async () => {
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    // Two valid members (a value holds at most 256 characters) joined by a comma.
    const state = (total: number) => `a=${'v'.repeat(254)},b=${'w'.repeat(total - 256 - 3)}`;
    expect(state(TRACESTATE_MAX_BYTES)).toHaveLength(TRACESTATE_MAX_BYTES);
    const h = createHarness();
    const withTrace = (tracestate: string) => ({
      ...submitBody(ACME_PROD, key()),
      origin_trace: { traceparent, tracestate },
    });
    await expectJson(await submit(h, withTrace(state(TRACESTATE_MAX_BYTES))), 201);
    await refusedUnchanged(
      h,
      () => submit(h, withTrace(state(TRACESTATE_MAX_BYTES + 1))),
      'invalid_input',
    );
  });

  it(`path scope: ${SCOPE_TEXT_MAX_BYTES}-byte tenant and namespace are served; one byte more is 400`, async () => {
    const h = createHarness({
      auth: {
        keys: [
          {
            key: 'long-key',
            tenant: utf8Text(SCOPE_TEXT_MAX_BYTES),
            namespaces: ['*'],
            roles: ['client'],
          },
        ],
      },
    });
    const scope = {
      tenant_id: utf8Text(SCOPE_TEXT_MAX_BYTES),
      namespace: utf8Text(SCOPE_TEXT_MAX_BYTES),
    };
    const created = await h.call(`${scopePath(scope)}/tasks`, {
      key: 'long-key',
      json: submitBody(scope, 'k'),
    });
    await expectJson(created, 201);
    const longer = { ...scope, namespace: `${utf8Text(SCOPE_TEXT_MAX_BYTES)}x` };
    await expectProblem(
      await h.call(`${scopePath(longer)}/tasks`, {
        key: 'long-key',
        json: submitBody(longer, 'k'),
      }),
      'invalid_input',
    );
  });

  it(`path task_id: ${NAME_MAX_BYTES} bytes is looked up (404); ${NAME_MAX_BYTES + 1} is 400`, async () => {
    const h = createHarness();
    await expectProblem(
      await h.call(`${tasksPath}/${encodeURIComponent(utf8Text(NAME_MAX_BYTES))}`, {
        key: KEYS.client,
      }),
      'not_found',
    );
    await expectProblem(
      await h.call(`${tasksPath}/${encodeURIComponent(utf8Text(NAME_MAX_BYTES + 1))}`, {
        key: KEYS.client,
      }),
      'invalid_input',
    );
  });

  it(`subscription_key ${KEY_MAX_BYTES} and destination ${DESTINATION_ALIAS_MAX_BYTES} bytes are checked at their edges`, async () => {
    const h = createHarness();
    const task = await submitTask(h);
    const path = subscriptionsPath(ACME_PROD, task.task_id);
    await expectJson(
      await h.call(path, { key: KEYS.client, json: subscribeBody(utf8Text(KEY_MAX_BYTES)) }),
      201,
    );
    await refusedUnchanged(
      h,
      () => h.call(path, { key: KEYS.client, json: subscribeBody(utf8Text(KEY_MAX_BYTES + 1)) }),
      'invalid_input',
    );
    // No configured alias is that long, so both are 400; the longer is refused by the schema.
    const longAlias = await expectProblem(
      await h.call(path, {
        key: KEYS.client,
        json: subscribeBody('a1', 'd'.repeat(DESTINATION_ALIAS_MAX_BYTES + 1)),
      }),
      'invalid_input',
    );
    expect(longAlias.detail).toMatch(/destination/);
  });
});

// ---- Scheduling ranges ---------------------------------------------------------------------------

describe('scheduling ranges (DESIGN §4, §4.1)', () => {
  it(`priority: ${PRIORITY_MIN} and ${PRIORITY_MAX} are 201; one beyond either is 400`, async () => {
    await submitEdge({ priority: PRIORITY_MAX }, { priority: PRIORITY_MAX + 1 });
    await submitEdge({ priority: PRIORITY_MIN }, { priority: PRIORITY_MIN - 1 });
  });

  it(`retry.max_attempts: 1 and ${MAX_ATTEMPTS_LIMIT} are 201; 0 and ${MAX_ATTEMPTS_LIMIT + 1} are 400`, async () => {
    await submitEdge(
      { retry: { max_attempts: MAX_ATTEMPTS_LIMIT, delay_ms: 0 } },
      { retry: { max_attempts: MAX_ATTEMPTS_LIMIT + 1, delay_ms: 0 } },
    );
    await submitEdge(
      { retry: { max_attempts: 1, delay_ms: 0 } },
      { retry: { max_attempts: 0, delay_ms: 0 } },
    );
  });

  it(`retry delays: ${RETRY_MAX_DELAY_MS} is 201; one more is 400`, async () => {
    await submitEdge(
      { retry: { max_attempts: 2, delay_ms: RETRY_MAX_DELAY_MS } },
      { retry: { max_attempts: 2, delay_ms: RETRY_MAX_DELAY_MS + 1 } },
    );
    await submitEdge(
      {
        retry: {
          max_attempts: 2,
          delay_ms: 1,
          backoff: 'exponential',
          max_delay_ms: RETRY_MAX_DELAY_MS,
        },
      },
      {
        retry: {
          max_attempts: 2,
          delay_ms: 1,
          backoff: 'exponential',
          max_delay_ms: RETRY_MAX_DELAY_MS + 1,
        },
      },
    );
  });

  it(`timeout_ms: ${MAX_TIMEOUT_MS} is 201; one more is 400`, async () => {
    await submitEdge({ timeout_ms: MAX_TIMEOUT_MS }, { timeout_ms: MAX_TIMEOUT_MS + 1 });
  });

  it('timeout_ms: the server minimum is the lease safety margin plus MIN_DISPATCH_WINDOW_MS', async () => {
    // DESIGN §4.1 names 1 000..86 400 000; with the default 5 000 ms margin the server's real
    // lower edge is 5 500, a window for the dispatch renewal (core/src/submit.ts
    // minSubmitTimeoutMs).
    await submitEdge(
      { timeout_ms: LEASE_SAFETY_MARGIN_MS + MIN_DISPATCH_WINDOW_MS },
      { timeout_ms: LEASE_SAFETY_MARGIN_MS + MIN_DISPATCH_WINDOW_MS - 1 },
    );
  });

  it(`delay_ms: ${MAX_SUBMIT_DELAY_MS} is 201; one more is 400`, async () => {
    await submitEdge({ delay_ms: MAX_SUBMIT_DELAY_MS }, { delay_ms: MAX_SUBMIT_DELAY_MS + 1 });
  });

  it('available_at: store time + MAX_SUBMIT_DELAY_MS is 201; one ms more is 400', async () => {
    const now = 1_700_000_000_000;
    // A harness over a store whose clock stands still, so "store time" is exact.
    const frozen = createHarness({ now: () => now });
    await expectJson(
      await submit(
        frozen,
        submitBody(ACME_PROD, key(), { available_at: now + MAX_SUBMIT_DELAY_MS }),
      ),
      201,
    );
    await refusedUnchanged(
      frozen,
      () =>
        submit(
          frozen,
          submitBody(ACME_PROD, key(), { available_at: now + MAX_SUBMIT_DELAY_MS + 1 }),
        ),
      'invalid_input',
    );
  });

  it(`concurrency_limit: 1 and ${MAX_CONCURRENCY_LIMIT} are 201; 0 and one more are 400`, async () => {
    await submitEdge(
      { concurrency_key: 'k', concurrency_limit: MAX_CONCURRENCY_LIMIT },
      { concurrency_key: 'k', concurrency_limit: MAX_CONCURRENCY_LIMIT + 1 },
    );
    await submitEdge(
      { concurrency_key: 'k', concurrency_limit: 1 },
      { concurrency_key: 'k', concurrency_limit: 0 },
    );
  });
});

// ---- Worker limits -------------------------------------------------------------------------------

describe('worker limits (DESIGN §4.1, §6)', () => {
  it(`session concurrency: ${MAX_SESSION_CONCURRENCY} is 200; one more is 400`, async () => {
    const h = createHarness();
    const open = (concurrency: number) =>
      h.call('/v1/worker/sessions', {
        key: KEYS.worker,
        json: { scope: ACME_PROD, queue: 'email', concurrency },
      });
    await expectJson(await open(MAX_SESSION_CONCURRENCY), 200);
    await expectProblem(await open(MAX_SESSION_CONCURRENCY + 1), 'invalid_input');
    await expectProblem(await open(0), 'invalid_input');
  });

  it("consumer_id: concurrency − 1 is served; the session's concurrency is 400 invalid_input", async () => {
    const h = createHarness();
    await submitTask(h);
    const session = await openSession(h, ACME_PROD, KEYS.worker, 3);
    await refusedUnchanged(
      h,
      () => h.call('/v1/worker/acquire', { key: KEYS.worker, json: acquireBody(session, 3, 1) }),
      'invalid_input',
    );
    const reply = await expectJson<{ disposition: string }>(
      await h.call('/v1/worker/acquire', { key: KEYS.worker, json: acquireBody(session, 2, 1) }),
      200,
    );
    expect(reply.disposition).toBe('assigned');
  });

  it(`acquire:batch holds at most ${MAX_SESSION_CONCURRENCY} commands`, async () => {
    const h = createHarness();
    const session = await openSession(h, ACME_PROD, KEYS.worker, MAX_SESSION_CONCURRENCY);
    const commands = (n: number) =>
      Array.from({ length: n }, (_, i) => acquireBody(session, i % MAX_SESSION_CONCURRENCY, 1));
    const ok = await expectJson<{ replies: unknown[] }>(
      await h.call('/v1/worker/acquire:batch', {
        key: KEYS.worker,
        json: { commands: commands(MAX_SESSION_CONCURRENCY) },
      }),
      200,
    );
    expect(ok.replies).toHaveLength(MAX_SESSION_CONCURRENCY);
    await expectProblem(
      await h.call('/v1/worker/acquire:batch', {
        key: KEYS.worker,
        json: { commands: commands(MAX_SESSION_CONCURRENCY + 1) },
      }),
      'invalid_input',
    );
  });

  it(`renew:batch and settle:batch hold at most ${MAX_WORKER_BATCH} commands`, async () => {
    const h = createHarness();
    const { assignment } = await assignTask(h);
    const renew = { owner: assignment.lease.owner, sequence: 1, intent: 'dispatch' };
    const many = (command: unknown, n: number) => ({
      commands: Array.from({ length: n }, () => command),
    });
    const renewed = await expectJson<{ results: unknown[] }>(
      await h.call('/v1/worker/renew:batch', {
        key: KEYS.worker,
        json: many(renew, MAX_WORKER_BATCH),
      }),
      200,
    );
    expect(renewed.results).toHaveLength(MAX_WORKER_BATCH);
    await refusedUnchanged(
      h,
      () =>
        h.call('/v1/worker/renew:batch', {
          key: KEYS.worker,
          json: many(renew, MAX_WORKER_BATCH + 1),
        }),
      'invalid_input',
    );
    await refusedUnchanged(
      h,
      () =>
        h.call('/v1/worker/settle:batch', {
          key: KEYS.worker,
          json: many(settleBody(assignment), MAX_WORKER_BATCH + 1),
        }),
      'invalid_input',
    );
    const settled = await expectJson<{ results: unknown[] }>(
      await h.call('/v1/worker/settle:batch', {
        key: KEYS.worker,
        json: many(settleBody(assignment), MAX_WORKER_BATCH),
      }),
      200,
    );
    expect(settled.results).toHaveLength(MAX_WORKER_BATCH);
  });

  it('settle: output of OUTPUT_MAX_BYTES is accepted; one byte more is 413 and leaves the attempt open', async () => {
    const h = createHarness();
    const { assignment } = await assignTask(h);
    const withOutput = (output: unknown, op: string) => {
      const body = settleBody(assignment, op);
      body.report.report.outcome = { kind: 'success', output } as never;
      return body;
    };
    const atLimit = 'o'.repeat(OUTPUT_MAX_BYTES - 2);
    await refusedUnchanged(
      h,
      () => h.call('/v1/worker/settle', { key: KEYS.worker, json: withOutput(`${atLimit}o`, 'a') }),
      'payload_too_large',
    );
    const reply = await expectJson<{ task_state: string }>(
      await h.call('/v1/worker/settle', { key: KEYS.worker, json: withOutput(atLimit, 'b') }),
      200,
    );
    expect(reply.task_state).toBe('succeeded');
  });

  it(`settle: error code ${ERROR_CODE_MAX_BYTES}, message ${MESSAGE_MAX_BYTES} and operation id ${OPERATION_ID_MAX_BYTES} bytes at their edges`, async () => {
    const h = createHarness();
    const { assignment } = await assignTask(h);
    const failed = (code: string, message: string, op: string) => {
      const body = settleBody(assignment, op);
      body.report.report.outcome = {
        kind: 'application_error',
        error: { code, message, retryable: false },
      } as never;
      return body;
    };
    const settle = (json: unknown) => h.call('/v1/worker/settle', { key: KEYS.worker, json });
    const code = utf8Text(ERROR_CODE_MAX_BYTES);
    const message = utf8Text(MESSAGE_MAX_BYTES);
    const op = utf8Text(OPERATION_ID_MAX_BYTES);
    for (const refused of [
      failed(utf8Text(ERROR_CODE_MAX_BYTES + 1), message, op),
      failed(code, utf8Text(MESSAGE_MAX_BYTES + 1), op),
      failed(code, message, utf8Text(OPERATION_ID_MAX_BYTES + 1)),
    ]) {
      await refusedUnchanged(h, () => settle(refused), 'invalid_input');
    }
    const reply = await expectJson<{ task_state: string }>(
      await settle(failed(code, message, op)),
      200,
    );
    expect(reply.task_state).toBe('failed');
  });
});

// ---- Batches and listing -------------------------------------------------------------------------

describe('submit batch and listing (DESIGN §6, §12)', () => {
  it(`tasks:batch holds at most ${MAX_SUBMIT_BATCH} commands; one more is 400 and writes nothing`, async () => {
    const h = createHarness();
    const commands = (n: number, prefix: string) =>
      Array.from({ length: n }, (_, i) => submitBody(ACME_PROD, `${prefix}-${i}`));
    await refusedUnchanged(
      h,
      () =>
        h.call(`${tasksPath}:batch`, {
          key: KEYS.client,
          json: { commands: commands(MAX_SUBMIT_BATCH + 1, 'over') },
        }),
      'invalid_input',
    );
    const ok = await expectJson<{ results: TaskSnapshot[] }>(
      await h.call(`${tasksPath}:batch`, {
        key: KEYS.client,
        json: { commands: commands(MAX_SUBMIT_BATCH, 'at') },
      }),
      200,
    );
    expect(ok.results.every((r) => r.state === 'queued')).toBe(true);
    expect(ok.results).toHaveLength(MAX_SUBMIT_BATCH);

    // Listing: the default page, the largest page, and the limits either side.
    const list = (query: string) => h.call(`${tasksPath}${query}`, { key: KEYS.client });
    expect((await expectJson<TaskPage>(await list(''), 200)).tasks).toHaveLength(
      TASK_LIST_DEFAULT_LIMIT,
    );
    const page = await expectJson<TaskPage>(await list(`?limit=${TASK_LIST_MAX_LIMIT}`), 200);
    expect(page.tasks).toHaveLength(TASK_LIST_MAX_LIMIT);
    expect(page.next_cursor).toBeTypeOf('string');
    await expectProblem(await list(`?limit=${TASK_LIST_MAX_LIMIT + 1}`), 'invalid_input');
    await expectProblem(await list('?limit=0'), 'invalid_input');
    expect((page.next_cursor ?? '').length).toBeLessThanOrEqual(TASK_CURSOR_MAX_BYTES);
    await expectProblem(
      await list(`?cursor=${'A'.repeat(TASK_CURSOR_MAX_BYTES + 1)}`),
      'invalid_input',
    );
  });
});

describe('list query bounds (DESIGN §4.1 Numbers, MAX_LABELS)', () => {
  it('submitted_from/until take 0..2^53−1; 2^53 and longer digit strings are 400', async () => {
    const h = createHarness();
    await submitTask(h);
    const list = (query: string) => h.call(`${tasksPath}?${query}`, { key: KEYS.client });
    for (const name of ['submitted_from', 'submitted_until']) {
      await expectJson(await list(`${name}=${JSON_MAX_SAFE_NUMBER}`), 200);
      await expectJson(await list(`${name}=0`), 200);
      await expectProblem(await list(`${name}=9007199254740992`), 'invalid_input');
      await expectProblem(await list(`${name}=${'9'.repeat(40)}`), 'invalid_input');
    }
  });

  it(`${MAX_LABELS} label filters are 200; ${MAX_LABELS + 1} are 400`, async () => {
    const h = createHarness();
    const filters = (n: number) =>
      Array.from(
        { length: n },
        (_, i) => `label.k${i}=${encodeURIComponent(utf8Text(LABEL_VALUE_MAX_BYTES))}`,
      ).join('&');
    await expectJson(
      await h.call(`${tasksPath}?${filters(MAX_LABELS)}`, { key: KEYS.client }),
      200,
    );
    await expectProblem(
      await h.call(`${tasksPath}?${filters(MAX_LABELS + 1)}`, { key: KEYS.client }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(
        `${tasksPath}?label.k=${encodeURIComponent(utf8Text(LABEL_VALUE_MAX_BYTES + 1))}`,
        {
          key: KEYS.client,
        },
      ),
      'invalid_input',
    );
  });
});
