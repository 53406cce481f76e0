import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES, ERROR_STATUS, ERROR_TITLES } from '../errors.js';
import { MAX_SESSION_CONCURRENCY, MAX_SUBMIT_BATCH, MAX_WORKER_BATCH } from '../limits.js';
import {
  AcquireBatchRequestSchema,
  ProblemSchema,
  RenewBatchReplySchema,
  RenewBatchRequestSchema,
  SettleBatchRequestSchema,
  SubmitBatchReplySchema,
  SubmitBatchRequestSchema,
} from './index.js';
import {
  acquireCommand,
  authority,
  problem,
  renewCommand,
  settleCommand,
  submitCommand,
  taskSnapshot,
} from './testdata/examples.js';

const ok = (schema: v.GenericSchema, value: unknown) => v.safeParse(schema, value).success;

describe('Problem', () => {
  it.each(ERROR_CODES)('accepts code %s with its own status', (code) => {
    const minimal = {
      type: `https://ledgence.dev/problems/${code}`,
      title: ERROR_TITLES[code],
      status: ERROR_STATUS[code],
      code,
      detail: 'what happened',
    };
    expect(ok(ProblemSchema, minimal)).toBe(true);
  });

  it('rejects a status that is not the code’s, and unknown codes', () => {
    expect(ok(ProblemSchema, { ...problem, status: 409 })).toBe(false);
    expect(ok(ProblemSchema, { ...problem, code: 'teapot', status: 418 })).toBe(false);
    expect(ok(ProblemSchema, { ...problem, reason: null })).toBe(false);
  });
});

describe('batch request bounds', () => {
  const cases = [
    ['submit', SubmitBatchRequestSchema, submitCommand, MAX_SUBMIT_BATCH],
    ['acquire', AcquireBatchRequestSchema, acquireCommand, MAX_SESSION_CONCURRENCY],
    ['renew', RenewBatchRequestSchema, renewCommand, MAX_WORKER_BATCH],
    ['settle', SettleBatchRequestSchema, settleCommand, MAX_WORKER_BATCH],
  ] as const;

  it.each(cases)('%s: 1..max commands', (_name, schema, command, max) => {
    const batch = (n: number) => ({ commands: Array.from({ length: n }, () => command) });
    expect(ok(schema, batch(0))).toBe(false);
    expect(ok(schema, batch(1))).toBe(true);
    expect(ok(schema, batch(max))).toBe(true);
    expect(ok(schema, batch(max + 1))).toBe(false);
  });

  it.each(cases)('%s: every item is a full command', (_name, schema, command) => {
    expect(ok(schema, { commands: [command, { ...command, extra: 1 }] })).toBe(false);
  });
});

describe('batch replies', () => {
  it('each result is the success reply or a problem', () => {
    expect(ok(SubmitBatchReplySchema, { results: [problem, taskSnapshot] })).toBe(true);
    expect(ok(SubmitBatchReplySchema, { results: [authority] })).toBe(false);
    expect(ok(RenewBatchReplySchema, { results: [authority, problem] })).toBe(true);
    expect(ok(RenewBatchReplySchema, { results: [{ ...problem, status: 500 }] })).toBe(false);
  });
});
