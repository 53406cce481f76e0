/**
 * The SDK Client's submit validation against the server's (README "Commands are
 * validated locally with the server's own rules"), each rule at its edge and one past it. For
 * every case the Client's answer (a snapshot, or a ProblemError's code and path) equals the
 * server's answer to the same command sent as raw JSON; a command refused by a rule the SDK can
 * check is refused without a request.
 */
import {
  JSON_MAX_DEPTH,
  KEY_MAX_BYTES,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  MAX_ATTEMPTS_LIMIT,
  MAX_CONCURRENCY_LIMIT,
  MAX_LABELS,
  MAX_SUBMIT_DELAY_MS,
  MAX_TIMEOUT_MS,
  NAME_MAX_BYTES,
  PRIORITY_MAX,
  PRIORITY_MIN,
  RETRY_MAX_DELAY_MS,
  SUBMISSION_DATA_MAX_BYTES,
} from '@ledgence/contracts';
import {
  Client,
  type FetchLike,
  ProblemError,
  type SubmitInput,
  silentLogger,
} from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { postJson, Stack } from './test/harness.js';

const stack = new Stack('client_submit_parity');
let server: ServerProcess;
const TENANT = 'acme';
const NAMESPACE = 'submit-parity';

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
}, 120_000);
afterAll(async () => {
  await stack.close();
});

const text = (bytes: number, fill = 'é') =>
  fill.repeat(Math.floor(bytes / Buffer.byteLength(fill))) +
  'x'.repeat(bytes % Buffer.byteLength(fill));
const labels = (n: number, keyBytes = 4, valueBytes = 1) =>
  Object.fromEntries(
    Array.from({ length: n }, (_, i) => [
      `${String(i).padStart(2, '0')}${'k'.repeat(Math.max(0, keyBytes - 2))}`,
      'v'.repeat(valueBytes),
    ]),
  );
const nested = (depth: number): unknown => {
  let value: unknown = [];
  for (let d = 1; d < depth; d++) value = [value];
  return value;
};

type Case = [name: string, task: Partial<SubmitInput> & Record<string, unknown>, key?: string];
const cases: Case[] = [
  ['priority max', { priority: PRIORITY_MAX }],
  ['priority max+1', { priority: PRIORITY_MAX + 1 }],
  ['priority min', { priority: PRIORITY_MIN }],
  ['priority min-1', { priority: PRIORITY_MIN - 1 }],
  ['labels max', { labels: labels(MAX_LABELS) }],
  ['labels max+1', { labels: labels(MAX_LABELS + 1) }],
  ['label key max', { labels: labels(1, LABEL_KEY_MAX_BYTES) }],
  ['label key max+1', { labels: labels(1, LABEL_KEY_MAX_BYTES + 1) }],
  ['label value max', { labels: labels(1, 4, LABEL_VALUE_MAX_BYTES) }],
  ['label value max+1', { labels: labels(1, 4, LABEL_VALUE_MAX_BYTES + 1) }],
  ['queue max', { queue: text(NAME_MAX_BYTES) }],
  ['queue max+1', { queue: text(NAME_MAX_BYTES + 1) }],
  ['program max', { program: { name: text(NAME_MAX_BYTES), version: text(NAME_MAX_BYTES) } }],
  ['program version max+1', { program: { name: 'p', version: text(NAME_MAX_BYTES + 1) } }],
  ['concurrency key max', { concurrency_key: text(NAME_MAX_BYTES) }],
  ['concurrency key max+1', { concurrency_key: text(NAME_MAX_BYTES + 1) }],
  ['concurrency limit max', { concurrency_key: 'c', concurrency_limit: MAX_CONCURRENCY_LIMIT }],
  [
    'concurrency limit max+1',
    { concurrency_key: 'c', concurrency_limit: MAX_CONCURRENCY_LIMIT + 1 },
  ],
  ['limit without key', { concurrency_limit: 2 }],
  ['delay max', { delay_ms: MAX_SUBMIT_DELAY_MS }],
  ['delay max+1', { delay_ms: MAX_SUBMIT_DELAY_MS + 1 }],
  ['delay and available_at', { delay_ms: 1, available_at: 1 }],
  ['timeout max', { timeout_ms: MAX_TIMEOUT_MS }],
  ['timeout max+1', { timeout_ms: MAX_TIMEOUT_MS + 1 }],
  ['timeout 999', { timeout_ms: 999 }],
  ['retry max', { retry: { max_attempts: MAX_ATTEMPTS_LIMIT, delay_ms: RETRY_MAX_DELAY_MS } }],
  ['retry attempts max+1', { retry: { max_attempts: MAX_ATTEMPTS_LIMIT + 1, delay_ms: 1 } }],
  ['retry delay max+1', { retry: { max_attempts: 2, delay_ms: RETRY_MAX_DELAY_MS + 1 } }],
  ['retry exponential no cap', { retry: { max_attempts: 2, delay_ms: 1, backoff: 'exponential' } }],
  ['data depth 64', { data: { a: nested(JSON_MAX_DEPTH - 1) } }],
  ['data depth 65', { data: { a: nested(JSON_MAX_DEPTH) } }],
  ['data max bytes', { data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2) }],
  ['data max bytes+1', { data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 1) }],
  ['data ±(2^53−1)', { data: [Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER] }],
  ['data 2^53', { data: [2 ** 53] }],
  ['data NUL', { data: { '\u0000': 'a\u0000b' } }],
  ['data constructor key', { data: { constructor: 'x' } }],
  ['key max', {}, text(KEY_MAX_BYTES)],
  ['key max+1', {}, text(KEY_MAX_BYTES + 1)],
  ['key edge space', {}, ' k'],
];

type Outcome = string;
const outcomeOf = (value: unknown): Outcome => {
  if (value instanceof ProblemError) return `${value.status} ${value.code} ${value.problem.path}`;
  const body = value as { task_id?: string; status?: number; code?: string; path?: string };
  if (body.task_id !== undefined) return 'created';
  return `${body.status} ${body.code} ${body.path}`;
};

describe('Client.submit validation against the server, rule by rule', () => {
  it('answers every edge case as the server answers the same wire command', async () => {
    let sent = 0;
    const counting: FetchLike = (input, init) => {
      sent += 1;
      return fetch(input, init);
    };
    const client = new Client({
      url: server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      fetch: counting,
      logger: silentLogger,
      retries: 0,
    });
    const rows: [string, Outcome, Outcome, number][] = [];
    for (const [i, [name, task, key]] of cases.entries()) {
      const input = { queue: 'q', program: 'p', ...task } as SubmitInput;
      const before = sent;
      const sdk = await client
        .submit(input, { idempotencyKey: key === undefined ? `sdk-${i}` : `${key}` })
        .catch((error: unknown) => error);
      const { program, data, ...rest } = input;
      const wire = {
        idempotency_key: key === undefined ? `raw-${i}` : key,
        input: {
          tenant_id: TENANT,
          namespace: NAMESPACE,
          program: typeof program === 'string' ? { name: program } : program,
          data: data === undefined ? null : data,
          ...rest,
        },
      };
      // The same key as the SDK's for the key cases: the raw one replays the SDK's task.
      const raw = await postJson(
        server.url,
        `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}/tasks`,
        wire,
      );
      rows.push([name, outcomeOf(sdk), outcomeOf(raw.body), sent - before]);
    }
    const mismatches = rows.filter(([, sdk, raw]) => sdk !== raw);
    expect(mismatches).toEqual([]);
    // A refusal by a rule the SDK knows is local: no request.
    const localRefusedButSent = rows.filter(
      ([, sdk, , requests]) => sdk !== 'created' && requests > 0,
    );
    expect(localRefusedButSent).toEqual([]);
    // Not vacuous: both kinds of answer occur.
    expect(rows.filter(([, sdk]) => sdk === 'created').length).toBe(17);
    expect(rows.filter(([, sdk]) => sdk !== 'created').length).toBe(23);
  });
});
