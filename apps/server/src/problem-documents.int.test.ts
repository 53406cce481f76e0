/**
 * The problem documents the real server answers against the contracts' own
 * `ProblemSchema` (DESIGN §6; contracts schemas/batch.ts: `detail` is a `messageField`, at most
 * MESSAGE_MAX_BYTES of UTF-8), the batch reply schemas the SDK parses with, and the detail
 * scrubbing's promise that a precise message is not lost to a short name that occurs among the
 * server's own words (packages/http/src/problem-short-names.test.ts; project rule "Errors say
 * what to do").
 */
import {
  MESSAGE_MAX_BYTES,
  ProblemSchema,
  parseWith,
  type Scope,
  SubmitBatchReplySchema,
  utf8ByteLength,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'problems-acme-all-key-000001';
const server = keyedServer('problem_documents', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
  ]),
});
const as = server.as(KEY);

const SCOPE: Scope = { tenant_id: 'acme', namespace: 'problems' };
const TASKS = `/v1/tenants/${SCOPE.tenant_id}/namespaces/${SCOPE.namespace}/tasks`;

let counter = 0;
function submitBody(input: Record<string, unknown> = {}) {
  counter += 1;
  return {
    idempotency_key: `problem-${counter}`,
    input: { ...SCOPE, queue: 'q', program: { name: 'p' }, data: { n: counter }, ...input },
  };
}

/**
 * Application JSON within every rule but one: 12 levels of objects whose keys are 64 control
 * characters (legal JSON keys; a path shows each escaped, `\u0001`, cut to 64 characters) above a
 * number beyond ±(2^53−1) (`JSON.stringify(1e300)` is the number literal `1e+300`).
 */
function deepBadData(): unknown {
  const key = '\u0001'.repeat(64);
  let value: unknown = 1e300;
  for (let level = 0; level < 12; level++) value = { [key]: value };
  return value;
}

/** Why `problem` is not a problem document by the contracts' schema; undefined when it is. */
function problemSchemaIssue(problem: unknown): string | undefined {
  try {
    parseWith(ProblemSchema, problem);
    return undefined;
  } catch (error) {
    return (error as Error).message;
  }
}

describe('problem documents the server answers are problem documents by the contracts (DESIGN §6)', () => {
  it('a submit refused for a number deep under long keys is answered with a detail within MESSAGE_MAX_BYTES', async () => {
    const reply = await as.post(TASKS, submitBody({ data: deepBadData() }));
    expect([reply.status, reply.body.code]).toEqual([400, 'invalid_input']);
    // The contracts' ProblemSchema bounds `detail` to MESSAGE_MAX_BYTES (4 KiB): the SDK parses
    // every error reply with it, and reads a document that breaks it as a ProtocolError
    // ("the server answered 400 without a valid problem document"), not as the invalid_input
    // ProblemError it is.
    expect(utf8ByteLength(reply.body.detail)).toBeLessThanOrEqual(MESSAGE_MAX_BYTES);
    expect(problemSchemaIssue(reply.body)).toBeUndefined();
  });

  it('a submit batch with one such item still answers a reply the contracts can read, its neighbour created', async () => {
    const good = submitBody();
    const bad = submitBody({ data: deepBadData() });
    const reply = await as.post(`${TASKS}:batch`, { commands: [good, bad] });
    expect(reply.status).toBe(200);
    expect(reply.body.results[0].task_id).toEqual(expect.any(String));
    expect(reply.body.results[1].code).toBe('invalid_input');
    // The neighbour was created: a client must be able to read its snapshot. With the item's
    // problem over the detail bound, the whole reply fails the schema the SDK parses it with, so
    // an SDK caller gets one ProtocolError for the batch and loses the created task's answer
    // (DESIGN §6: "an item's error does not fail its neighbours").
    let issue: string | undefined;
    try {
      parseWith(SubmitBatchReplySchema, reply.body);
    } catch (error) {
      issue = (error as Error).message;
    }
    expect(issue).toBeUndefined();
  });
});

describe('a precise detail is not lost to a short name found among the server’s own words', () => {
  it('a timeout_ms within the safety margin names the minimum even when the program is called "a"', async () => {
    // problem-short-names.test.ts promises this for "p"; its comment names "a" too. "a" is a
    // whole word of the message ("so a shorter budget"), so the token match scrubs it.
    const reply = await as.post(TASKS, submitBody({ program: { name: 'a' }, timeout_ms: 5_000 }));
    expect(reply.status).toBe(400);
    expect(reply.body).toMatchObject({
      code: 'invalid_input',
      path: '$.input.timeout_ms',
      detail: expect.stringContaining('use at least 5500'),
    });
  });

  it('a timeout_ms within the safety margin names the minimum when a label value is "worker"', async () => {
    const reply = await as.post(
      TASKS,
      submitBody({ labels: { role: 'worker' }, timeout_ms: 5_000 }),
    );
    expect(reply.status).toBe(400);
    expect(reply.body).toMatchObject({
      code: 'invalid_input',
      path: '$.input.timeout_ms',
      detail: expect.stringContaining('use at least 5500'),
    });
  });

  it('control: with a program called "p" and no such label the same request names the minimum', async () => {
    const reply = await as.post(TASKS, submitBody({ timeout_ms: 5_000 }));
    expect(reply.body).toMatchObject({
      code: 'invalid_input',
      path: '$.input.timeout_ms',
      detail: expect.stringContaining('use at least 5500'),
    });
  });
});
