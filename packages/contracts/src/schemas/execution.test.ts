import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import { ERROR_CODE_MAX_BYTES, MESSAGE_MAX_BYTES } from '../limits.js';
import {
  ApplicationErrorSchema,
  CloudEventSchema,
  ExecutionFailureSchema,
  ExecutionReportSchema,
  ProgramOutcomeSchema,
} from './index.js';
import { applicationError, cloudEvent, executionReport } from './testdata/examples.js';

const ok = (schema: v.GenericSchema, value: unknown) => v.safeParse(schema, value).success;

describe('CloudEvent', () => {
  const event = (patch: Record<string, unknown>) => ({ ...cloudEvent, ...patch });

  it('requires specversion 1.0 and datacontenttype application/json', () => {
    expect(ok(CloudEventSchema, event({ specversion: '0.3' }))).toBe(false);
    expect(ok(CloudEventSchema, event({ datacontenttype: 'text/plain' }))).toBe(false);
  });

  it('requires an RFC 3339 UTC time', () => {
    expect(ok(CloudEventSchema, event({ time: '2024-05-01T12:00:00Z' }))).toBe(true);
    expect(ok(CloudEventSchema, event({ time: '2024-05-01T14:00:00+02:00' }))).toBe(false);
    expect(ok(CloudEventSchema, event({ time: 1_714_564_800_000 }))).toBe(false);
  });

  it('ldgattempt is a 1-based ordinal', () => {
    expect(ok(CloudEventSchema, event({ ldgattempt: 1 }))).toBe(true);
    expect(ok(CloudEventSchema, event({ ldgattempt: 0 }))).toBe(false);
  });

  it('optional attributes are omitted, never null', () => {
    for (const key of ['ldgactivationid', 'traceparent', 'tracestate']) {
      expect(ok(CloudEventSchema, event({ [key]: null })), key).toBe(false);
    }
  });

  it('validates the trace attributes', () => {
    expect(ok(CloudEventSchema, event({ traceparent: '00-abc-def-01' }))).toBe(false);
    expect(ok(CloudEventSchema, event({ tracestate: 'bad value' }))).toBe(false);
  });

  it('data may be any JSON, null included, but must be present', () => {
    expect(ok(CloudEventSchema, event({ data: null }))).toBe(true);
    const { data: _data, ...noData } = cloudEvent;
    expect(ok(CloudEventSchema, noData)).toBe(false);
  });
});

describe('ApplicationError', () => {
  it('code is identifier text; message is free text with newlines', () => {
    expect(ok(ApplicationErrorSchema, { code: 'E', message: 'a\nb\tc ' })).toBe(true);
    expect(ok(ApplicationErrorSchema, { code: 'E\n', message: 'm' })).toBe(false);
    expect(
      ok(ApplicationErrorSchema, { code: 'c'.repeat(ERROR_CODE_MAX_BYTES), message: '' }),
    ).toBe(true);
    expect(
      ok(ApplicationErrorSchema, { code: 'c'.repeat(ERROR_CODE_MAX_BYTES + 1), message: '' }),
    ).toBe(false);
    expect(ok(ApplicationErrorSchema, { code: 'E', message: 'm'.repeat(MESSAGE_MAX_BYTES) })).toBe(
      true,
    );
    expect(
      ok(ApplicationErrorSchema, { code: 'E', message: 'm'.repeat(MESSAGE_MAX_BYTES + 1) }),
    ).toBe(false);
  });

  it('null details and retryable are absent', () => {
    expect(
      v.parse(ApplicationErrorSchema, { code: 'E', message: 'm', details: null, retryable: null }),
    ).toStrictEqual({ code: 'E', message: 'm' });
    expect(v.parse(ApplicationErrorSchema, applicationError)).toStrictEqual(applicationError);
  });
});

describe('ProgramOutcome and ExecutionReport', () => {
  it('a success output may be null but must be present', () => {
    expect(v.parse(ProgramOutcomeSchema, { kind: 'success', output: null })).toStrictEqual({
      kind: 'success',
      output: null,
    });
    expect(ok(ProgramOutcomeSchema, { kind: 'success' })).toBe(false);
    expect(ok(ProgramOutcomeSchema, { kind: 'failure', output: 1 })).toBe(false);
  });

  it('normalises null worker-clock times and activation id away', () => {
    const report = v.parse(ExecutionReportSchema, {
      ...executionReport,
      context: { identity: { task_id: 't', attempt_id: 'a', activation_id: null } },
      started_at: null,
      finished_at: null,
    });
    expect(report).toStrictEqual({
      context: { identity: { task_id: 't', attempt_id: 'a' } },
      outcome: executionReport.outcome,
    });
  });

  it('execution failures need a known kind and an explicit retryable', () => {
    expect(ok(ExecutionFailureSchema, { kind: 'timed_out', message: '', retryable: false })).toBe(
      true,
    );
    expect(ok(ExecutionFailureSchema, { kind: 'oom', message: '', retryable: false })).toBe(false);
    expect(ok(ExecutionFailureSchema, { kind: 'crashed', message: '' })).toBe(false);
  });
});
