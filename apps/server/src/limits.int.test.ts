/**
 * The wire limits at their edges over the real PostgreSQL store, driven through
 * `app.request()`. Values exactly at every limit are stored, read back unchanged and carried
 * through the lifecycle; the next value is refused with a 4xx problem and stores nothing.
 */
import type { AcquireReply, Scope, TaskPage, TaskResult, TaskSnapshot } from '@ledgence/contracts';
import {
  ERROR_CODE_MAX_BYTES,
  JSON_MAX_DEPTH,
  JSON_MAX_SAFE_NUMBER,
  KEY_MAX_BYTES,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  MAX_ATTEMPTS_LIMIT,
  MAX_CONCURRENCY_LIMIT,
  MAX_LABELS,
  MAX_SESSION_CONCURRENCY,
  MAX_SUBMIT_BATCH,
  MAX_SUBMIT_DELAY_MS,
  MAX_TIMEOUT_MS,
  MESSAGE_MAX_BYTES,
  NAME_MAX_BYTES,
  OPERATION_ID_MAX_BYTES,
  OUTPUT_MAX_BYTES,
  PRIORITY_MIN,
  RETRY_MAX_DELAY_MS,
  SUBMISSION_DATA_MAX_BYTES,
  TASK_LIST_MAX_LIMIT,
  TASK_STATUS_MAX_BYTES,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { appOverPostgres, scopeFor, tasksPath } from './testdata/app-over-postgres.js';

const call = appOverPostgres('limits', ['client', 'worker']);

/** Text of exactly `bytes` UTF-8 bytes, two-byte characters where it can be. */
const utf8Text = (bytes: number) => 'é'.repeat(Math.floor(bytes / 2)) + 'x'.repeat(bytes % 2);

/** Everything a scope's tasks hold, to prove that a refusal wrote nothing. */
async function dump(scope: Scope): Promise<string> {
  const page = await call<TaskPage>(`${tasksPath(scope)}?limit=${TASK_LIST_MAX_LIMIT}`);
  const out: unknown[] = [page.body];
  for (const task of page.body.tasks) {
    out.push((await call(`${tasksPath(scope)}/${task.task_id}/snapshot`)).body);
    out.push((await call(`${tasksPath(scope)}/${task.task_id}/history`)).body);
  }
  return JSON.stringify(out);
}

/** Application JSON at every data limit at once: depth 64, ±(2^53−1), escapes, multi-byte text. */
function widestData(): unknown {
  let nested: unknown = [JSON_MAX_SAFE_NUMBER, -JSON_MAX_SAFE_NUMBER, 'é"\\\n'];
  // The array above is depth 1; the object wrapper below adds one; 62 more arrays reach 64.
  for (let depth = 2; depth < JSON_MAX_DEPTH; depth++) nested = [nested];
  const head = { nested, pad: '' };
  const size = Buffer.byteLength(JSON.stringify(head));
  // `"` costs two bytes compact: fill with quotes, then one `x` if the remainder is odd.
  const left = SUBMISSION_DATA_MAX_BYTES - size;
  head.pad = '"'.repeat(Math.floor(left / 2)) + 'x'.repeat(left % 2);
  expect(Buffer.byteLength(JSON.stringify(head))).toBe(SUBMISSION_DATA_MAX_BYTES);
  return head;
}

function widestInput(scope: Scope, queue: string) {
  const labels: Record<string, string> = {};
  for (let i = 0; i < MAX_LABELS; i++) {
    labels[`${String(i).padStart(2, '0')}${'k'.repeat(LABEL_KEY_MAX_BYTES - 2)}`] =
      utf8Text(LABEL_VALUE_MAX_BYTES);
  }
  return {
    tenant_id: scope.tenant_id,
    namespace: scope.namespace,
    queue,
    program: { name: utf8Text(NAME_MAX_BYTES), version: utf8Text(NAME_MAX_BYTES) },
    data: widestData(),
    retry: {
      max_attempts: MAX_ATTEMPTS_LIMIT,
      delay_ms: RETRY_MAX_DELAY_MS,
      backoff: 'exponential',
      max_delay_ms: RETRY_MAX_DELAY_MS,
    },
    timeout_ms: MAX_TIMEOUT_MS,
    priority: PRIORITY_MIN,
    concurrency_key: utf8Text(NAME_MAX_BYTES),
    concurrency_limit: MAX_CONCURRENCY_LIMIT,
    labels,
  };
}

describe('a task at every submit limit, through PostgreSQL', () => {
  it('is stored, replayed, listed and settled with values at their limits; one more refuses and stores nothing', async () => {
    const scope = scopeFor('widest');
    const queue = utf8Text(NAME_MAX_BYTES);
    const command = { idempotency_key: utf8Text(KEY_MAX_BYTES), input: widestInput(scope, queue) };
    const created = await call<TaskSnapshot>(tasksPath(scope), command);
    expect(created.status).toBe(201);
    expect(created.body.input.data).toEqual(command.input.data);
    // The same command again is a replay: jsonb round trip and all.
    const replay = await call<TaskSnapshot>(tasksPath(scope), command);
    expect([replay.status, replay.body.task_id]).toEqual([200, created.body.task_id]);

    const taskPath = `${tasksPath(scope)}/${created.body.task_id}`;
    const status = await call<unknown>(taskPath);
    expect(status.status).toBe(200);
    expect(status.bytes).toBeLessThanOrEqual(TASK_STATUS_MAX_BYTES);

    // Listing by the longest label key and value finds it.
    const [labelKey, labelValue] = Object.entries(command.input.labels)[MAX_LABELS - 1] as [
      string,
      string,
    ];
    const listed = await call<TaskPage>(
      `${tasksPath(scope)}?label.${encodeURIComponent(labelKey)}=${encodeURIComponent(labelValue)}&queue=${encodeURIComponent(queue)}`,
    );
    expect(listed.body.tasks.map((t) => t.task_id)).toEqual([created.body.task_id]);

    // One byte over, each in turn: refused, nothing stored.
    const before = await dump(scope);
    const over: [string, Record<string, unknown>][] = [
      ['queue', { queue: `${queue}x` }],
      ['data', { data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 1) }],
      ['priority', { priority: PRIORITY_MIN - 1 }],
      ['timeout', { timeout_ms: MAX_TIMEOUT_MS + 1 }],
      ['delay', { delay_ms: MAX_SUBMIT_DELAY_MS + 1 }],
      ['concurrency', { concurrency_limit: MAX_CONCURRENCY_LIMIT + 1 }],
    ];
    for (const [name, change] of over) {
      const refused = await call<{ code: string }>(tasksPath(scope), {
        idempotency_key: `over-${name}`,
        input: { ...widestInput(scope, queue), ...change },
      });
      expect([name, refused.status]).toEqual([name, name === 'data' ? 413 : 400]);
    }
    expect(await dump(scope)).toBe(before);
  });

  it('settles with output, message, code and operation id at their limits; one more leaves the attempt open', async () => {
    const scope = scopeFor('settle');
    const created = await call<TaskSnapshot>(tasksPath(scope), {
      idempotency_key: 'settle-1',
      input: {
        tenant_id: scope.tenant_id,
        namespace: scope.namespace,
        queue: 'q',
        program: { name: 'p' },
        data: 1,
        retry: { max_attempts: 2, delay_ms: 0 },
      },
    });
    expect(created.status).toBe(201);
    const session = await call<{ id: string }>('/v1/worker/sessions', {
      scope,
      queue: 'q',
      concurrency: MAX_SESSION_CONCURRENCY,
    });
    expect(session.status).toBe(200);
    const acquire = (consumer: number) => ({
      scope,
      queue: 'q',
      worker_session_id: session.body.id,
      consumer_id: consumer,
      sequence: 1,
    });
    // consumer_id == concurrency is outside the session: 400, and no cursor or claim is written.
    const before = await dump(scope);
    const outside = await call<{ code: string }>(
      '/v1/worker/acquire',
      acquire(MAX_SESSION_CONCURRENCY),
    );
    expect([outside.status, outside.body.code]).toEqual([400, 'invalid_input']);
    expect(await dump(scope)).toBe(before);
    const reply = await call<AcquireReply>(
      '/v1/worker/acquire',
      acquire(MAX_SESSION_CONCURRENCY - 1),
    );
    expect(reply.body.disposition).toBe('assigned');
    if (reply.body.disposition !== 'assigned') return;
    const owner = reply.body.assignment.lease.owner;
    const renewed = await call<unknown>('/v1/worker/renew', {
      owner,
      sequence: 1,
      intent: 'dispatch',
    });
    expect(renewed.status).toBe(200);

    const settle = (outcome: unknown, operationId: string) => ({
      owner,
      operation_id: operationId,
      report: {
        kind: 'completed',
        report: {
          context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
          outcome,
        },
      },
      quiescence: 'confirmed',
      processing_trace: null,
    });
    const details = 'd'.repeat(OUTPUT_MAX_BYTES - 2);
    const error = {
      code: utf8Text(ERROR_CODE_MAX_BYTES),
      message: utf8Text(MESSAGE_MAX_BYTES),
      details,
      retryable: false,
    };
    const op = utf8Text(OPERATION_ID_MAX_BYTES);
    const active = await dump(scope);
    for (const [name, body, status] of [
      [
        'details',
        settle({ kind: 'application_error', error: { ...error, details: `${details}d` } }, op),
        413,
      ],
      ['output', settle({ kind: 'success', output: `${details}d` }, op), 413],
      [
        'code',
        settle({ kind: 'application_error', error: { ...error, code: `${error.code}x` } }, op),
        400,
      ],
      [
        'message',
        settle(
          { kind: 'application_error', error: { ...error, message: `${error.message}x` } },
          op,
        ),
        400,
      ],
      ['operation id', settle({ kind: 'success', output: 1 }, `${op}x`), 400],
    ] as const) {
      const refused = await call<{ code: string }>('/v1/worker/settle', body);
      expect([name, refused.status]).toEqual([name, status]);
    }
    expect(await dump(scope)).toBe(active);

    const settled = await call<{ task_state: string }>(
      '/v1/worker/settle',
      settle({ kind: 'application_error', error }, op),
    );
    expect([settled.status, settled.body.task_state]).toEqual([200, 'failed']);
    const result = await call<TaskResult>(`${tasksPath(scope)}/${created.body.task_id}/result`);
    expect(result.body.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'application', error },
    });
    const status = await call<unknown>(`${tasksPath(scope)}/${created.body.task_id}`);
    expect(status.bytes).toBeLessThanOrEqual(TASK_STATUS_MAX_BYTES);
  });
});

describe('batches at their limits, through PostgreSQL', () => {
  it(`tasks:batch of ${MAX_SUBMIT_BATCH} is stored; ${MAX_SUBMIT_BATCH + 1} is 400 and stores nothing`, async () => {
    const scope = scopeFor('batch');
    const commands = (n: number, prefix: string) =>
      Array.from({ length: n }, (_, i) => ({
        idempotency_key: `${prefix}-${i}`,
        input: {
          tenant_id: scope.tenant_id,
          namespace: scope.namespace,
          queue: 'b',
          program: { name: 'p' },
          data: i,
        },
      }));
    const refused = await call<{ code: string }>(`${tasksPath(scope)}:batch`, {
      commands: commands(MAX_SUBMIT_BATCH + 1, 'over'),
    });
    expect([refused.status, refused.body.code]).toEqual([400, 'invalid_input']);
    expect((await call<TaskPage>(tasksPath(scope))).body.tasks).toEqual([]);
    const ok = await call<{ results: TaskSnapshot[] }>(`${tasksPath(scope)}:batch`, {
      commands: commands(MAX_SUBMIT_BATCH, 'at'),
    });
    expect(ok.status).toBe(200);
    expect(ok.body.results.filter((r) => r.state === 'queued')).toHaveLength(MAX_SUBMIT_BATCH);
    let count = 0;
    let cursor: string | undefined;
    do {
      const page = await call<TaskPage>(
        `${tasksPath(scope)}?limit=${TASK_LIST_MAX_LIMIT}${cursor === undefined ? '' : `&cursor=${cursor}`}`,
      );
      expect(page.status).toBe(200);
      expect(page.body.tasks.length).toBeLessThanOrEqual(TASK_LIST_MAX_LIMIT);
      count += page.body.tasks.length;
      cursor = page.body.next_cursor;
    } while (cursor !== undefined);
    expect(count).toBe(MAX_SUBMIT_BATCH);
  });
});
