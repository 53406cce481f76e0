import fc from 'fast-check';
import { describe, expect, it, vi } from 'vitest';
import { canonicalJson } from './canonical.js';
import {
  type DecodedItem,
  decodeAcquireBatch,
  decodeAcquireCommand,
  decodeCompletionRetryCommand,
  decodeCompletionSubscribeCommand,
  decodeLeaseOwner,
  decodeOpenSessionCommand,
  decodeRenewBatch,
  decodeRenewCommand,
  decodeSettleBatch,
  decodeSettleCommand,
  decodeSubmitBatch,
  decodeSubmitCommand,
  decodeSubmitRequest,
  parseWith,
  validateSettleCommand,
  validateSubmitTask,
} from './decode.js';
import { ContractError } from './errors.js';
import {
  COMPLETION_COMMAND_MAX_BYTES,
  CONTROL_REQUEST_MAX_BYTES,
  DISPATCH_MAX_BYTES,
  JSON_MAX_DEPTH,
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
  MAX_WORKER_BATCH,
  MIN_TIMEOUT_MS,
  NAME_MAX_BYTES,
  OUTPUT_MAX_BYTES,
  PRIORITY_MAX,
  PRIORITY_MIN,
  RETRY_MAX_DELAY_MS,
  SCOPE_TEXT_MAX_BYTES,
  SUBMISSION_DATA_MAX_BYTES,
  TASK_STATUS_MAX_BYTES,
} from './limits.js';
import { canonicalRetryPolicy, type SubmitCommand, TaskListQuerySchema } from './schemas/index.js';
import {
  acquireCommand,
  leaseOwner,
  renewCommand,
  scope,
  settleCommand,
  submitCommand,
  submitTask,
  trace,
} from './schemas/testdata/examples.js';
import { taskStatusMaxBytes } from './status.js';
import { textProblem } from './text.js';

const json = (value: unknown) => JSON.stringify(value);
const bytes = (value: unknown) => new TextEncoder().encode(JSON.stringify(value));

/** The ContractError `fn` throws (fails the test if it throws anything else or nothing). */
function errorOf(fn: () => unknown): ContractError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(ContractError);
    return error as ContractError;
  }
  throw new Error('expected a ContractError, nothing was thrown');
}

function expectSchemaError(fn: () => unknown, path: string, message: string): void {
  const error = errorOf(fn);
  expect(error.code).toBe('invalid_input');
  expect(error.reason).toBe('schema');
  expect(error.path).toBe(path);
  expect(error.message).toBe(`${path} ${message}`);
}

const withInput = (patch: Record<string, unknown>) => ({
  ...submitCommand,
  input: { ...submitTask, ...patch },
});

describe('decodeSubmitCommand', () => {
  it('decodes a valid command from a string, bytes or an ArrayBuffer', () => {
    expect(decodeSubmitCommand(json(submitCommand))).toStrictEqual(submitCommand);
    expect(decodeSubmitCommand(bytes(submitCommand))).toStrictEqual(submitCommand);
    expect(decodeSubmitCommand(bytes(submitCommand).buffer as ArrayBuffer)).toStrictEqual(
      submitCommand,
    );
  });

  it('maps schema errors to invalid_input at the right path', () => {
    expectSchemaError(
      () => decodeSubmitCommand(json(withInput({ queue: '' }))),
      '$.input.queue',
      'must not be empty',
    );
    expectSchemaError(
      () => decodeSubmitCommand(json(withInput({ queue: 5 }))),
      '$.input.queue',
      'must be a string',
    );
    expectSchemaError(
      () => decodeSubmitCommand(json(withInput({ bogus: true }))),
      '$.input.bogus',
      'is not an allowed field',
    );
    const { program: _program, ...noProgram } = submitTask;
    expectSchemaError(
      () => decodeSubmitCommand(json({ ...submitCommand, input: noProgram })),
      '$.input.program',
      'is required',
    );
    expectSchemaError(
      () => decodeSubmitCommand(json(withInput({ labels: { team: ' x' } }))),
      '$.input.labels.team',
      'must not start or end with whitespace',
    );
    expectSchemaError(
      () =>
        decodeSubmitCommand(
          json(withInput({ retry: { max_attempts: 2, delay_ms: 5, backoff: 'exponential' } })),
        ),
      '$.input.retry.max_delay_ms',
      'is required with exponential backoff',
    );
    expectSchemaError(
      () => decodeSubmitCommand(json(withInput({ retry: { ...submitTask.retry, backoff: 'x' } }))),
      '$.input.retry.backoff',
      'must be "fixed" or "exponential"',
    );
    expectSchemaError(
      () => decodeSubmitCommand(json(withInput({ priority: PRIORITY_MAX + 1 }))),
      '$.input.priority',
      `must be an integer from ${PRIORITY_MIN} to ${PRIORITY_MAX}`,
    );
    expectSchemaError(() => decodeSubmitCommand('[]'), '$', 'must be an object');
    expectSchemaError(
      () => decodeSubmitCommand(json({ ...submitCommand, origin_trace: 'x' })),
      '$.origin_trace',
      'must be an object',
    );
  });

  it('reports an array given for an object at the container, for any object schema', () => {
    expectSchemaError(() => decodeAcquireCommand('[]'), '$', 'must be an object');
    expectSchemaError(() => decodeAcquireCommand('[1,2]'), '$', 'must be an object');
    expectSchemaError(
      () => decodeAcquireCommand(json({ ...acquireCommand, scope: [] })),
      '$.scope',
      'must be an object',
    );
    expectSchemaError(
      () => parseWith(TaskListQuerySchema, { filters: [1] }),
      '$.filters',
      'must be an object',
    );
  });

  it('never echoes the rejected value', () => {
    const secret = 'SECRET-7f3a';
    const attempts: unknown[] = [
      withInput({ queue: ` ${secret}` }),
      withInput({ priority: secret }),
      withInput({ labels: { [` ${secret}`]: 'x' } }),
      withInput({ labels: { team: `${secret}\n` } }),
      withInput({ retry: { max_attempts: 1, delay_ms: 0, backoff: secret } }),
      withInput({ program: secret }),
      withInput({ unknown_field: secret }),
      { ...submitCommand, idempotency_key: `${secret}\u0000` },
    ];
    for (const value of attempts) {
      const error = errorOf(() => decodeSubmitCommand(json(value)));
      expect(error.message).not.toContain(secret);
      expect(error.path ?? '').not.toContain(secret);
    }
  });

  it('rejects strict-JSON violations with the decoder’s codes', () => {
    expect(
      errorOf(() => decodeSubmitCommand('{"idempotency_key":"a","idempotency_key":"b"}')).reason,
    ).toBe('duplicate_key');
    expect(errorOf(() => decodeSubmitCommand('{')).reason).toBe('syntax');
    const unsafe = json(withInput({ data: 1 })).replace('"data":1', '"data":9007199254740993');
    expect(errorOf(() => decodeSubmitCommand(unsafe)).reason).toBe('number_out_of_range');
    // JSON.stringify writes a lone surrogate as the escape "\ud800", which the decoder rejects.
    expect(errorOf(() => decodeSubmitCommand(json(withInput({ queue: 'q\ud800' })))).reason).toBe(
      'lone_surrogate',
    );
  });

  it('accepts data of exactly SUBMISSION_DATA_MAX_BYTES and rejects one byte more', () => {
    // A JSON string's compact size is its length plus the two quotes.
    const atLimit = 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2);
    const decoded = decodeSubmitCommand(json(withInput({ data: atLimit })));
    expect(decoded.input.data).toBe(atLimit);
    const error = errorOf(() => decodeSubmitCommand(json(withInput({ data: `${atLimit}x` }))));
    expect(error.code).toBe('payload_too_large');
    expect(error.reason).toBe('too_large');
    expect(error.path).toBe('$.input.data');
  });

  it('bounds the depth of data at JSON_MAX_DEPTH', () => {
    const nested = (depth: number) => JSON.parse(`${'['.repeat(depth)}${']'.repeat(depth)}`);
    expect(
      decodeSubmitCommand(json(withInput({ data: nested(JSON_MAX_DEPTH) }))).input.data,
    ).toEqual(nested(JSON_MAX_DEPTH));
    const error = errorOf(() =>
      decodeSubmitCommand(json(withInput({ data: nested(JSON_MAX_DEPTH + 1) }))),
    );
    expect(error.code).toBe('invalid_input');
    expect(error.reason).toBe('depth_exceeded');
    expect(error.path?.startsWith('$.input.data')).toBe(true);
  });

  it('normalises null optional fields to absent', () => {
    const decoded = decodeSubmitCommand(
      json({
        idempotency_key: 'k',
        input: { ...submitTask, delay_ms: null, labels: null },
        origin_trace: null,
      }),
    );
    const { labels: _labels, ...withoutLabels } = submitTask;
    expect(decoded).toStrictEqual({ idempotency_key: 'k', input: withoutLabels });
    expect('labels' in decoded.input).toBe(false);
    expect('origin_trace' in decoded).toBe(false);
  });
});

describe('validateSubmitTask', () => {
  it('validates schema and data size for tasks built in memory', () => {
    expect(validateSubmitTask(submitTask)).toStrictEqual(submitTask);
    expect(validateSubmitTask({ ...submitTask, timeout_ms: null }).timeout_ms).toBeUndefined();
    const error = errorOf(() =>
      validateSubmitTask({ ...submitTask, data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES) }),
    );
    expect(error.code).toBe('payload_too_large');
    expect(error.path).toBe('$.input.data');
    expect(errorOf(() => validateSubmitTask({ ...submitTask, data: () => 1 })).reason).toBe(
      'not_json',
    );
    expect(errorOf(() => validateSubmitTask({ ...submitTask, queue: '' }, '$.task')).path).toBe(
      '$.task.queue',
    );
  });
});

describe('decodeSubmitRequest', () => {
  const body = { input: submitTask, origin_trace: trace };

  it('without the header, the body is a full SubmitCommand', () => {
    expect(decodeSubmitRequest(json(submitCommand))).toStrictEqual(submitCommand);
    expectSchemaError(() => decodeSubmitRequest(json(body)), '$.idempotency_key', 'is required');
  });

  it('with the header, the body is {input, origin_trace?} and the header is the key', () => {
    expect(decodeSubmitRequest(json(body), 'order-123')).toStrictEqual(submitCommand);
    expect(decodeSubmitRequest(json({ input: submitTask }), 'k')).toStrictEqual({
      idempotency_key: 'k',
      input: submitTask,
    });
    expect(decodeSubmitRequest(json({ input: submitTask, origin_trace: null }), 'k')).toStrictEqual(
      {
        idempotency_key: 'k',
        input: submitTask,
      },
    );
  });

  it('rejects a key in both the header and the body', () => {
    for (const key of ['order-123', 'other', null]) {
      const error = errorOf(() =>
        decodeSubmitRequest(json({ ...body, idempotency_key: key }), 'order-123'),
      );
      expect(error.code).toBe('invalid_input');
      expect(error.reason).toBe('idempotency_key_conflict');
      expect(error.path).toBe('$.idempotency_key');
    }
  });

  it('applies the key text rule to the header', () => {
    expect(decodeSubmitRequest(json(body), 'k'.repeat(KEY_MAX_BYTES)).idempotency_key).toHaveLength(
      KEY_MAX_BYTES,
    );
    for (const header of ['', ' k', 'k'.repeat(KEY_MAX_BYTES + 1)]) {
      const error = errorOf(() => decodeSubmitRequest(json(body), header));
      expect(error.code).toBe('invalid_input');
      expect(error.reason).toBe('invalid_text');
    }
  });

  it('checks the data size on the header path too', () => {
    const error = errorOf(() =>
      decodeSubmitRequest(
        json({ input: { ...submitTask, data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES) } }),
        'k',
      ),
    );
    expect(error.code).toBe('payload_too_large');
    expect(error.path).toBe('$.input.data');
  });
});

describe('the task status limit at submit (TASK_STATUS_MAX_BYTES)', () => {
  // Every label as long as allowed, and all of it `"`, which JSON writes as two bytes: each
  // field within its own limit, the status they make ~11 KB. The edge itself (exactly at the
  // limit, one byte over) is tested against the real status in @ledgence/core (views.test.ts).
  const quoted: Record<string, string> = {};
  for (let i = 0; i < MAX_LABELS; i += 1) {
    quoted[`${'"'.repeat(LABEL_KEY_MAX_BYTES - 2)}${String(i).padStart(2, '0')}`] = '"'.repeat(
      LABEL_VALUE_MAX_BYTES,
    );
  }
  const tooBig = { ...submitTask, labels: quoted };

  function expectStatusTooLarge(error: ContractError, path: string): void {
    expect(error.code).toBe('payload_too_large');
    expect(error.reason).toBe('status_too_large');
    expect(error.path).toBe(path);
    expect(error.message).toMatch(new RegExp(`more than ${TASK_STATUS_MAX_BYTES}`));
  }

  it('is checked by every submit path, at the task', () => {
    expect(taskStatusMaxBytes(tooBig)).toBeGreaterThan(TASK_STATUS_MAX_BYTES);
    expectStatusTooLarge(
      errorOf(() => validateSubmitTask(tooBig)),
      '$.input',
    );
    expectStatusTooLarge(
      errorOf(() => decodeSubmitCommand(json(withInput({ labels: quoted })))),
      '$.input',
    );
    expectStatusTooLarge(
      errorOf(() => decodeSubmitRequest(json({ input: tooBig }), 'k')),
      '$.input',
    );
  });

  it('rejects only the batch item whose status would be too large', () => {
    const items = decodeSubmitBatch(
      json({ commands: [submitCommand, withInput({ labels: quoted })] }),
    );
    expect(items[0]?.ok).toBe(true);
    const item = items[1];
    if (item === undefined || item.ok) throw new Error('expected a failed item');
    expectStatusTooLarge(item.error, '$.commands[1].input');
  });
});

describe('worker and completion decoders', () => {
  it('decode valid bodies', () => {
    const session = { scope, queue: 'email', concurrency: 4 };
    expect(decodeOpenSessionCommand(json(session))).toStrictEqual(session);
    expect(decodeAcquireCommand(json(acquireCommand))).toStrictEqual(acquireCommand);
    expect(decodeRenewCommand(json(renewCommand))).toStrictEqual(renewCommand);
    expect(decodeLeaseOwner(json(leaseOwner))).toStrictEqual(leaseOwner);
    expect(decodeSettleCommand(json(settleCommand))).toStrictEqual(settleCommand);
    const subscribe = { subscription_key: 'billing-1', destination: 'billing' };
    expect(decodeCompletionSubscribeCommand(json(subscribe))).toStrictEqual(subscribe);
    expect(decodeCompletionRetryCommand(json({ generation: 2 }))).toStrictEqual({ generation: 2 });
  });

  it('map schema errors to their paths', () => {
    expectSchemaError(
      () => decodeOpenSessionCommand(json({ scope, queue: 'email', concurrency: 0 })),
      '$.concurrency',
      `must be an integer from 1 to ${MAX_SESSION_CONCURRENCY}`,
    );
    expectSchemaError(
      () => decodeAcquireCommand(json({ ...acquireCommand, consumer_id: MAX_SESSION_CONCURRENCY })),
      '$.consumer_id',
      `must be an integer from 0 to ${MAX_SESSION_CONCURRENCY - 1}`,
    );
    expectSchemaError(
      () => decodeAcquireCommand(json({ ...acquireCommand, scope: { tenant_id: 'acme' } })),
      '$.scope.namespace',
      'is required',
    );
    expectSchemaError(
      () => decodeRenewCommand(json({ ...renewCommand, owner: { ...leaseOwner, lease_id: '' } })),
      '$.owner.lease_id',
      'must not be empty',
    );
    expectSchemaError(
      () => decodeRenewCommand(json({ ...renewCommand, sequence: -1 })),
      '$.sequence',
      'must be a non-negative safe integer',
    );
    expectSchemaError(
      () => decodeLeaseOwner(json({ ...leaseOwner, generation: -1 })),
      '$.generation',
      'must be a non-negative safe integer',
    );
    expectSchemaError(
      () => decodeSettleCommand(json({ ...settleCommand, report: { kind: 'done', report: {} } })),
      '$.report.kind',
      'must be "completed" or "failed"',
    );
    expectSchemaError(
      () =>
        decodeSettleCommand(
          json({
            ...settleCommand,
            report: {
              kind: 'completed',
              report: { ...settleCommand.report.report, outcome: { kind: 'success' } },
            },
          }),
        ),
      '$.report.report.outcome.output',
      'is required',
    );
    expectSchemaError(
      () =>
        decodeCompletionSubscribeCommand(
          json({ subscription_key: 'k', destination: 'https://x', url: 1 }),
        ),
      '$.url',
      'is not an allowed field',
    );
    expectSchemaError(
      () => decodeCompletionRetryCommand(json({ generation: '1' })),
      '$.generation',
      'must be a number',
    );
  });

  it('take the widest acquire command a client can write within DISPATCH_MAX_BYTES', () => {
    // Every name at its byte limit and every character escaped (`\u0061` for `a`, the longest
    // way to write it): the claim-command limit still holds any acquire a client can send.
    const escaped = (bytes: number) => '\\u0061'.repeat(bytes);
    const text = json({
      scope: { tenant_id: 'T', namespace: 'N' },
      queue: 'Q',
      worker_session_id: 'S',
      consumer_id: MAX_SESSION_CONCURRENCY - 1,
      sequence: Number.MAX_SAFE_INTEGER,
    })
      .replace('"T"', `"${escaped(SCOPE_TEXT_MAX_BYTES)}"`)
      .replace('"N"', `"${escaped(SCOPE_TEXT_MAX_BYTES)}"`)
      .replace('"Q"', `"${escaped(NAME_MAX_BYTES)}"`)
      .replace('"S"', `"${escaped(NAME_MAX_BYTES)}"`);
    expect(text.length).toBeLessThanOrEqual(DISPATCH_MAX_BYTES);
    expect(decodeAcquireCommand(text)).toStrictEqual({
      scope: {
        tenant_id: 'a'.repeat(SCOPE_TEXT_MAX_BYTES),
        namespace: 'a'.repeat(SCOPE_TEXT_MAX_BYTES),
      },
      queue: 'a'.repeat(NAME_MAX_BYTES),
      worker_session_id: 'a'.repeat(NAME_MAX_BYTES),
      consumer_id: MAX_SESSION_CONCURRENCY - 1,
      sequence: Number.MAX_SAFE_INTEGER,
    });
  });

  it('enforce their route byte limits before parsing', () => {
    const padded = (value: unknown, size: number) => {
      const text = json(value);
      return `${text}${' '.repeat(size - text.length)}`;
    };
    expect(decodeAcquireCommand(padded(acquireCommand, DISPATCH_MAX_BYTES))).toStrictEqual(
      acquireCommand,
    );
    expect(
      errorOf(() => decodeAcquireCommand(padded(acquireCommand, DISPATCH_MAX_BYTES + 1))).code,
    ).toBe('payload_too_large');
    expect(
      errorOf(() => decodeRenewCommand(padded(renewCommand, CONTROL_REQUEST_MAX_BYTES + 1))).code,
    ).toBe('payload_too_large');
    const subscribe = { subscription_key: 'k', destination: 'd' };
    expect(
      errorOf(() =>
        decodeCompletionSubscribeCommand(padded(subscribe, COMPLETION_COMMAND_MAX_BYTES + 1)),
      ).code,
    ).toBe('payload_too_large');
  });

  it('settle: normalises processing_trace and bounds output and details', () => {
    const { processing_trace: _trace, ...withoutTrace } = settleCommand;
    expect(decodeSettleCommand(json(withoutTrace)).processing_trace).toBeNull();

    const withOutput = (output: unknown) => ({
      ...settleCommand,
      report: {
        kind: 'completed',
        report: { ...settleCommand.report.report, outcome: { kind: 'success', output } },
      },
    });
    const atLimit = 'o'.repeat(OUTPUT_MAX_BYTES - 2);
    expect(decodeSettleCommand(json(withOutput(atLimit)))).toBeTruthy();
    const tooLarge = errorOf(() => decodeSettleCommand(json(withOutput(`${atLimit}o`))));
    expect(tooLarge.code).toBe('payload_too_large');
    expect(tooLarge.path).toBe('$.report.report.outcome.output');

    const withDetails = (details: unknown) => ({
      ...settleCommand,
      report: {
        kind: 'completed',
        report: {
          ...settleCommand.report.report,
          outcome: { kind: 'application_error', error: { code: 'E', message: 'm', details } },
        },
      },
    });
    expect(decodeSettleCommand(json(withDetails(atLimit)))).toBeTruthy();
    const detailsError = errorOf(() => decodeSettleCommand(json(withDetails(`${atLimit}o`))));
    expect(detailsError.code).toBe('payload_too_large');
    expect(detailsError.path).toBe('$.report.report.outcome.error.details');

    const deep = JSON.parse(`${'['.repeat(JSON_MAX_DEPTH + 1)}${']'.repeat(JSON_MAX_DEPTH + 1)}`);
    expect(errorOf(() => decodeSettleCommand(json(withDetails(deep)))).reason).toBe(
      'depth_exceeded',
    );
    expect(errorOf(() => validateSettleCommand(withOutput(undefined))).code).toBe('invalid_input');
  });

  it('a failed report carries no application JSON to check', () => {
    const failed = {
      ...settleCommand,
      report: { kind: 'failed', report: { kind: 'crashed', message: 'x', retryable: true } },
    };
    expect(decodeSettleCommand(json(failed)).report.kind).toBe('failed');
  });
});

describe('batch decoders', () => {
  const ok = <T>(item: DecodedItem<T> | undefined): T => {
    if (item === undefined || !item.ok) throw new Error('expected an ok item');
    return item.value;
  };
  const failed = <T>(item: DecodedItem<T> | undefined): ContractError => {
    if (item === undefined || item.ok) throw new Error('expected a failed item');
    return item.error;
  };

  it('submit: answers each item on its own, in order', () => {
    const bad = withInput({ queue: '' });
    const big = withInput({ data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES) });
    const items = decodeSubmitBatch(
      json({ commands: [submitCommand, bad, submitCommand, big, 7] }),
    );
    expect(items).toHaveLength(5);
    expect(ok(items[0])).toStrictEqual(submitCommand);
    expect(failed(items[1]).path).toBe('$.commands[1].input.queue');
    expect(failed(items[1]).message).toBe('$.commands[1].input.queue must not be empty');
    expect(ok(items[2])).toStrictEqual(submitCommand);
    expect(failed(items[3]).code).toBe('payload_too_large');
    expect(failed(items[3]).path).toBe('$.commands[3].input.data');
    expect(failed(items[4]).path).toBe('$.commands[4]');
  });

  it('acquire, renew and settle answer per item too', () => {
    const acquires = decodeAcquireBatch(
      json({ commands: [acquireCommand, { ...acquireCommand, owner: 1 }] }),
    );
    expect(ok(acquires[0])).toStrictEqual(acquireCommand);
    expect(failed(acquires[1]).path).toBe('$.commands[1].owner');

    const renews = decodeRenewBatch(
      json({
        commands: [{ ...renewCommand, owner: { ...leaseOwner, consumer_id: -1 } }, renewCommand],
      }),
    );
    expect(failed(renews[0]).path).toBe('$.commands[0].owner.consumer_id');
    expect(ok(renews[1])).toStrictEqual(renewCommand);

    const settles = decodeSettleBatch(
      json({ commands: [settleCommand, { ...settleCommand, operation_id: '' }] }),
    );
    expect(ok(settles[0])).toStrictEqual(settleCommand);
    expect(failed(settles[1]).path).toBe('$.commands[1].operation_id');
  });

  it('fails the whole request when the envelope is wrong', () => {
    const cases: [(body: string) => unknown, unknown, string, string][] = [
      [decodeSubmitBatch, [submitCommand], '$', 'must be an object'],
      [decodeSubmitBatch, {}, '$.commands', 'is required'],
      [
        decodeSubmitBatch,
        { commands: [] },
        '$.commands',
        `must hold 1 to ${MAX_SUBMIT_BATCH} items`,
      ],
      [decodeSubmitBatch, { commands: {} }, '$.commands', 'must be an array'],
      [
        decodeRenewBatch,
        { commands: [renewCommand], extra: 1 },
        '$.extra',
        'is not an allowed field',
      ],
    ];
    for (const [decode, body, path, message] of cases) {
      expectSchemaError(() => decode(json(body)), path, message);
    }
  });

  it('bounds the item count per route', () => {
    const many = (command: unknown, n: number) =>
      json({ commands: Array.from({ length: n }, () => command) });
    expect(decodeSubmitBatch(many(submitCommand, MAX_SUBMIT_BATCH))).toHaveLength(MAX_SUBMIT_BATCH);
    expect(errorOf(() => decodeSubmitBatch(many(submitCommand, MAX_SUBMIT_BATCH + 1))).path).toBe(
      '$.commands',
    );
    expect(decodeAcquireBatch(many(acquireCommand, MAX_SESSION_CONCURRENCY))).toHaveLength(
      MAX_SESSION_CONCURRENCY,
    );
    expect(
      errorOf(() => decodeAcquireBatch(many(acquireCommand, MAX_SESSION_CONCURRENCY + 1))).path,
    ).toBe('$.commands');
    expect(errorOf(() => decodeRenewBatch(many(renewCommand, MAX_WORKER_BATCH + 1))).path).toBe(
      '$.commands',
    );
    expect(errorOf(() => decodeSettleBatch(many(settleCommand, MAX_WORKER_BATCH + 1))).path).toBe(
      '$.commands',
    );
  });

  it('refuses a body of millions of items before decoding any of them', () => {
    // ~8 million items in 16 MiB: decoded, then counted, they held the event loop for seconds.
    const zeros = `[${'0,'.repeat(1_000_000)}0]`;
    const parse = vi.spyOn(JSON, 'parse');
    try {
      for (const body of [
        `{"commands":${zeros}}`,
        // The key escaped, an item breaking a value rule, the list elsewhere: each is still read
        // before it is decoded.
        `{"comm\\u0061nds":${zeros}}`,
        `{"commands":[{"a":1,"a":2},${zeros.slice(1)}}`,
        zeros,
        `{"commands":[1],"x":${zeros}}`,
      ]) {
        const error = errorOf(() => decodeSubmitBatch(body));
        expect([error.code, error.reason, error.path, error.message]).toEqual([
          'invalid_input',
          'schema',
          '$.commands',
          `$.commands must hold 1 to ${MAX_SUBMIT_BATCH} items: this body holds a list of more`,
        ]);
      }
      expect(parse).not.toHaveBeenCalled();
    } finally {
      parse.mockRestore();
    }
  });

  it('counts items, not the commas, brackets and escaped quotes inside their strings', () => {
    const tricky = {
      ...submitCommand,
      input: { ...submitCommand.input, data: { s: ',,,[[{,\\",]}\\\\', list: [1, 2, 3] } },
    };
    const body = json({ commands: Array.from({ length: MAX_SUBMIT_BATCH }, () => tricky) });
    const items = decodeSubmitBatch(body);
    expect(items).toHaveLength(MAX_SUBMIT_BATCH);
    expect(ok(items[MAX_SUBMIT_BATCH - 1])).toStrictEqual(tricky);
  });

  it("rejects the body's own strict-JSON violations and syntax for the whole request", () => {
    expect(errorOf(() => decodeRenewBatch('{"commands":[],"commands":[]}')).reason).toBe(
      'duplicate_key',
    );
    const good = JSON.stringify(submitCommand);
    // Syntax inside an item is the body's syntax: nothing can be answered item by item.
    expect(errorOf(() => decodeSubmitBatch(`{"commands":[${good},{"a":}]}`)).reason).toBe('syntax');
    // An item breaking a value rule in a body whose envelope is wrong too: the request fails
    // whole (with the first error found), since the body is not `{"commands": [...]}`.
    const dup = good.replace('{', '{"a":1,"a":2,');
    expect(errorOf(() => decodeSubmitBatch(`{"commands":[${dup}],"x":1}`)).reason).toBe(
      'duplicate_key',
    );
  });

  it('answers an item breaking a strict-JSON value rule as that item alone (DESIGN §6)', () => {
    const good = JSON.stringify(submitCommand);
    const withData = (data: string) =>
      json(withInput({ data: 1 })).replace('"data":1', `"data":${data}`);
    const deep = `${'['.repeat(69)}${']'.repeat(69)}`;
    const items = decodeSubmitBatch(
      `{ "commands" : [ ${good} , ${withData('{"a":1,"a":2}')},\n${withData('9007199254740993')},` +
        `${withData('"\\ud800"')}, ${withData(deep)}, ${good} ] }`,
    );
    expect(items).toHaveLength(6);
    expect(ok(items[0])).toStrictEqual(submitCommand);
    expect([failed(items[1]).reason, failed(items[1]).path]).toEqual([
      'duplicate_key',
      '$.commands[1].input.data.a',
    ]);
    expect(failed(items[1]).message).toContain('$.commands[1].input.data.a');
    expect([failed(items[2]).reason, failed(items[2]).path]).toEqual([
      'number_out_of_range',
      '$.commands[2].input.data',
    ]);
    expect([failed(items[3]).reason, failed(items[3]).path]).toEqual([
      'lone_surrogate',
      '$.commands[3].input.data',
    ]);
    expect(failed(items[4]).reason).toBe('depth_exceeded');
    expect(failed(items[4]).path).toMatch(/^\$\.commands\[4\]\.input\.data/);
    expect(ok(items[5])).toStrictEqual(submitCommand);
  });
});

describe('parseWith', () => {
  it('validates query objects for other packages, with a path prefix', () => {
    expect(parseWith(TaskListQuerySchema, { filters: { state: null }, limit: 10 })).toStrictEqual({
      filters: {},
      limit: 10,
    });
    expectSchemaError(
      () => parseWith(TaskListQuerySchema, { filters: {}, limit: 0 }, '$query'),
      '$query.limit',
      'must be an integer from 1 to 500',
    );
    expectSchemaError(
      () => parseWith(TaskListQuerySchema, { filters: { 'odd key': 1 } }),
      '$.filters["odd key"]',
      'is not an allowed field',
    );
  });
});

// ---- Property: every valid command survives canonical encoding and decoding ----

const RESERVED = new Set(['__proto__', 'constructor', 'prototype']);

/** Identifier text of 1..maxBytes UTF-8 bytes, biased towards the exact limit sometimes. */
function textArb(maxBytes: number): fc.Arbitrary<string> {
  return fc
    .oneof(
      { weight: 5, arbitrary: fc.string({ unit: 'grapheme', minLength: 1, maxLength: 12 }) },
      { weight: 1, arbitrary: fc.constant('x'.repeat(maxBytes)) },
      { weight: 1, arbitrary: fc.constantFrom('é', '😀 ok', 'a b', 'ünï-cødé') },
    )
    .filter((value) => textProblem(value, maxBytes) === undefined);
}

const jsonKey = fc.string({ unit: 'grapheme', maxLength: 8 }).filter((key) => !RESERVED.has(key));

const { json: jsonArb } = fc.letrec((tie) => ({
  json: fc.oneof(
    { depthSize: 'small' },
    fc.constant(null),
    fc.boolean(),
    fc.integer({ min: -1_000_000_000, max: 1_000_000_000 }),
    // -0 is written "0" by canonical JSON: it reads back as 0, an equal JSON value.
    fc
      .double({ noNaN: true, noDefaultInfinity: true, min: -1e12, max: 1e12 })
      .filter((n) => !Object.is(n, -0)),
    fc.string({ unit: 'grapheme', maxLength: 10 }),
    fc.array(tie('json'), { maxLength: 4 }),
    fc.dictionary(jsonKey, tie('json'), { maxKeys: 4, noNullPrototype: true }),
  ),
}));

const retryArb = fc.oneof(
  fc.record(
    {
      max_attempts: fc.integer({ min: 1, max: MAX_ATTEMPTS_LIMIT }),
      delay_ms: fc.integer({ min: 0, max: RETRY_MAX_DELAY_MS }),
      backoff: fc.constant('fixed' as const),
      max_delay_ms: fc.constant(0),
    },
    { requiredKeys: ['max_attempts', 'delay_ms'], noNullPrototype: true },
  ),
  fc
    .tuple(
      fc.integer({ min: 1, max: MAX_ATTEMPTS_LIMIT }),
      fc.integer({ min: 1, max: RETRY_MAX_DELAY_MS }),
      fc.integer({ min: 0, max: RETRY_MAX_DELAY_MS }),
    )
    .map(([max_attempts, delay_ms, extra]) => ({
      max_attempts,
      delay_ms,
      backoff: 'exponential' as const,
      max_delay_ms: Math.min(RETRY_MAX_DELAY_MS, delay_ms + extra),
    })),
);

const labelsArb = fc
  .dictionary(textArb(LABEL_KEY_MAX_BYTES), textArb(LABEL_VALUE_MAX_BYTES), {
    maxKeys: MAX_LABELS,
    noNullPrototype: true,
  })
  .filter((labels) => Object.keys(labels).every((key) => !RESERVED.has(key)));

const OPTIONAL_TASK_KEYS = [
  'retry',
  'timeout_ms',
  'available_at',
  'delay_ms',
  'priority',
  'concurrency_key',
  'concurrency_limit',
  'labels',
] as const;

const taskArb = fc
  .record(
    {
      tenant_id: textArb(SCOPE_TEXT_MAX_BYTES),
      namespace: textArb(SCOPE_TEXT_MAX_BYTES),
      queue: textArb(NAME_MAX_BYTES),
      program: fc.record(
        { name: textArb(NAME_MAX_BYTES), version: textArb(NAME_MAX_BYTES) },
        { requiredKeys: ['name'], noNullPrototype: true },
      ),
      data: jsonArb,
      retry: retryArb,
      timeout_ms: fc.integer({ min: MIN_TIMEOUT_MS, max: MAX_TIMEOUT_MS }),
      available_at: fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
      delay_ms: fc.integer({ min: 0, max: MAX_SUBMIT_DELAY_MS }),
      priority: fc.integer({ min: PRIORITY_MIN, max: PRIORITY_MAX }),
      concurrency_key: textArb(NAME_MAX_BYTES),
      concurrency_limit: fc.integer({ min: 1, max: MAX_CONCURRENCY_LIMIT }),
      labels: labelsArb,
    },
    {
      requiredKeys: ['tenant_id', 'namespace', 'queue', 'program', 'data'],
      noNullPrototype: true,
    },
  )
  .map((task) => {
    // Respect the cross-field rules rather than filtering most cases away.
    const fixed: Record<string, unknown> = { ...task };
    if (fixed.available_at !== undefined && fixed.delay_ms !== undefined) delete fixed.delay_ms;
    if (fixed.concurrency_limit !== undefined && fixed.concurrency_key === undefined) {
      delete fixed.concurrency_limit;
    }
    return fixed;
  });

const hex = (length: number) =>
  fc.string({ unit: fc.constantFrom(...'0123456789abcdef'), minLength: length, maxLength: length });

const commandArb = fc.record(
  {
    idempotency_key: textArb(KEY_MAX_BYTES),
    input: taskArb,
    origin_trace: fc.record(
      {
        traceparent: fc
          .tuple(hex(32), hex(16))
          .filter(([traceId, parentId]) => /[1-9a-f]/.test(traceId) && /[1-9a-f]/.test(parentId))
          .map(([traceId, parentId]) => `00-${traceId}-${parentId}-01`),
        tracestate: fc.constantFrom('congo=t61rcWkgMzE', 'a=1,b=2'),
      },
      { requiredKeys: ['traceparent'], noNullPrototype: true },
    ),
  },
  { requiredKeys: ['idempotency_key', 'input'], noNullPrototype: true },
);

/** The command spelled with `null` for some absent optional fields: it must decode to `command`. */
const spelledArb = commandArb.chain((command) =>
  fc.subarray([...OPTIONAL_TASK_KEYS, 'origin_trace', 'version'] as const).map((nulls) => {
    const input: Record<string, unknown> = { ...(command.input as Record<string, unknown>) };
    const program: Record<string, unknown> = { ...(input.program as Record<string, unknown>) };
    const spelled: Record<string, unknown> = { ...command, input };
    for (const key of nulls) {
      if (key === 'origin_trace') {
        if (spelled.origin_trace === undefined) spelled.origin_trace = null;
      } else if (key === 'version') {
        if (program.version === undefined) program.version = null;
      } else if (input[key] === undefined) input[key] = null;
    }
    input.program = program;
    return { command: decodedForm(command as unknown as SubmitCommand), spelled };
  }),
);

/**
 * The command a decode answers: a fixed retry policy spelled with `backoff: 'fixed'` or
 * `max_delay_ms: 0` loses them (the a3s canonical encoding, {@link canonicalRetryPolicy}).
 */
function decodedForm(command: SubmitCommand): SubmitCommand {
  const retry = command.input.retry;
  if (retry === undefined) return command;
  return { ...command, input: { ...command.input, retry: canonicalRetryPolicy(retry) } };
}

describe('decodeSubmitCommand property', () => {
  it('decodes canonicalJson of any valid command to that command, its retry policy canonical', () => {
    fc.assert(
      fc.property(commandArb, (command) => {
        expect(decodeSubmitCommand(canonicalJson(command))).toStrictEqual(
          decodedForm(command as unknown as SubmitCommand),
        );
      }),
      { numRuns: 200 },
    );
  });

  it('normalises null-spelled optional fields to the same command (string and bytes)', () => {
    fc.assert(
      fc.property(spelledArb, ({ command, spelled }) => {
        const text = canonicalJson(spelled);
        expect(decodeSubmitCommand(text)).toStrictEqual(command);
        expect(decodeSubmitCommand(new TextEncoder().encode(text))).toStrictEqual(command);
        expect(canonicalJson(decodeSubmitCommand(text))).toBe(canonicalJson(command));
      }),
      { numRuns: 200 },
    );
  });
});
