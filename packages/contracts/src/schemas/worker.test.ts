import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import { MAX_SESSION_CONCURRENCY, OPERATION_ID_MAX_BYTES } from '../limits.js';
import {
  AcquireCommandSchema,
  AcquireReplySchema,
  AssignmentSchema,
  AttemptReportSchema,
  AuthoritySchema,
  LeaseOwnerSchema,
  OpenSessionCommandSchema,
  RecoveryProgressSchema,
  RenewCommandSchema,
  SettleCommandSchema,
} from './index.js';
import {
  acquireCommand,
  assignment,
  authority,
  executionFailure,
  executionReport,
  leaseOwner,
  renewCommand,
  scope,
  settleCommand,
} from './testdata/examples.js';

const ok = (schema: v.GenericSchema, value: unknown) => v.safeParse(schema, value).success;

describe('sessions and acquisition', () => {
  it('session concurrency is 1..MAX_SESSION_CONCURRENCY', () => {
    const open = (concurrency: number) =>
      ok(OpenSessionCommandSchema, { scope, queue: 'email', concurrency });
    expect(open(1)).toBe(true);
    expect(open(MAX_SESSION_CONCURRENCY)).toBe(true);
    expect(open(0)).toBe(false);
    expect(open(MAX_SESSION_CONCURRENCY + 1)).toBe(false);
  });

  it('consumer_id is 0..MAX_SESSION_CONCURRENCY-1 in acquire commands and lease owners', () => {
    for (const [schema, base] of [
      [AcquireCommandSchema, acquireCommand],
      [LeaseOwnerSchema, leaseOwner],
    ] as const) {
      expect(ok(schema, { ...base, consumer_id: 0 })).toBe(true);
      expect(ok(schema, { ...base, consumer_id: MAX_SESSION_CONCURRENCY - 1 })).toBe(true);
      expect(ok(schema, { ...base, consumer_id: MAX_SESSION_CONCURRENCY })).toBe(false);
      expect(ok(schema, { ...base, consumer_id: -1 })).toBe(false);
      expect(ok(schema, { ...base, consumer_id: 1.5 })).toBe(false);
    }
  });

  it('command sequences are integers in 0..2^53-1 (DESIGN §4.1); the sequence rules, not the schema, answer 0', () => {
    expect(ok(AcquireCommandSchema, { ...acquireCommand, sequence: 1 })).toBe(true);
    expect(ok(AcquireCommandSchema, { ...acquireCommand, sequence: Number.MAX_SAFE_INTEGER })).toBe(
      true,
    );
    expect(ok(AcquireCommandSchema, { ...acquireCommand, sequence: 0 })).toBe(true);
    expect(ok(AcquireCommandSchema, { ...acquireCommand, sequence: -1 })).toBe(false);
    expect(ok(AcquireCommandSchema, { ...acquireCommand, sequence: 1.5 })).toBe(false);
    expect(ok(AcquireCommandSchema, { ...acquireCommand, sequence: 2 ** 53 })).toBe(false);
    expect(ok(RenewCommandSchema, { ...renewCommand, sequence: 0 })).toBe(true);
    expect(ok(RenewCommandSchema, { ...renewCommand, sequence: -1 })).toBe(false);
    expect(ok(RenewCommandSchema, { ...renewCommand, sequence: 1 })).toBe(true);
    expect(ok(AuthoritySchema, { ...authority, renew_sequence: 0 })).toBe(true);
    expect(ok(AcquireReplySchema, { disposition: 'empty', sequence: 0 })).toBe(true);
  });

  it('renew intent is keep_alive or dispatch', () => {
    expect(ok(RenewCommandSchema, { ...renewCommand, intent: 'keep_alive' })).toBe(true);
    expect(ok(RenewCommandSchema, { ...renewCommand, intent: 'run' })).toBe(false);
  });

  it('acquire replies are tagged by disposition, each with its own payload', () => {
    expect(ok(AcquireReplySchema, { disposition: 'unknown', sequence: 1 })).toBe(false);
    expect(ok(AcquireReplySchema, { disposition: 'empty', sequence: 1, assignment })).toBe(false);
    expect(ok(AcquireReplySchema, { disposition: 'ownership_lost', sequence: 1, assignment })).toBe(
      false,
    );
    expect(ok(AcquireReplySchema, { disposition: 'assigned', sequence: 1 })).toBe(false);
  });

  it('an assignment event must be exactly the DESIGN CloudEvent', () => {
    expect(ok(AssignmentSchema, { ...assignment, event: { ...assignment.event, ldgx: 'y' } })).toBe(
      false,
    );
    expect(ok(AssignmentSchema, { ...assignment, workflow_activation_id: null })).toBe(false);
  });
});

describe('settlement', () => {
  it('processing_trace may be omitted or null and is normalised to null', () => {
    const { processing_trace: _trace, ...withoutTrace } = settleCommand;
    expect(v.parse(SettleCommandSchema, withoutTrace).processing_trace).toBeNull();
    const fromNull = v.parse(SettleCommandSchema, { ...settleCommand, processing_trace: null });
    expect(fromNull.processing_trace).toBeNull();
    expect(fromNull).toStrictEqual(v.parse(SettleCommandSchema, withoutTrace));
  });

  it('operation_id is text of at most OPERATION_ID_MAX_BYTES', () => {
    const id = 'o'.repeat(OPERATION_ID_MAX_BYTES);
    expect(ok(SettleCommandSchema, { ...settleCommand, operation_id: id })).toBe(true);
    expect(ok(SettleCommandSchema, { ...settleCommand, operation_id: `${id}o` })).toBe(false);
    expect(ok(SettleCommandSchema, { ...settleCommand, operation_id: '' })).toBe(false);
  });

  it('report payloads must match their kind', () => {
    expect(ok(AttemptReportSchema, { kind: 'completed', report: executionFailure })).toBe(false);
    expect(ok(AttemptReportSchema, { kind: 'failed', report: executionReport })).toBe(false);
    expect(ok(AttemptReportSchema, { kind: 'completed', ...executionReport })).toBe(false);
  });

  it('quiescence is confirmed or unconfirmed', () => {
    expect(ok(SettleCommandSchema, { ...settleCommand, quiescence: 'unconfirmed' })).toBe(true);
    expect(ok(SettleCommandSchema, { ...settleCommand, quiescence: 'done' })).toBe(false);
  });
});

describe('RecoveryProgress', () => {
  const progress = (patch: Record<string, unknown>) =>
    ok(RecoveryProgressSchema, {
      scanned: 5,
      recovered: 3,
      requeued: 1,
      failed: 1,
      cancelled: 1,
      finalized: 1,
      has_more: false,
      ...patch,
    });

  it('recovered = requeued + failed + cancelled and recovered + finalized <= scanned', () => {
    expect(progress({})).toBe(true);
    expect(
      progress({ scanned: 0, recovered: 0, requeued: 0, failed: 0, cancelled: 0, finalized: 0 }),
    ).toBe(true);
    expect(progress({ recovered: 4 })).toBe(false);
    expect(progress({ scanned: 3 })).toBe(false);
    expect(progress({ finalized: 3 })).toBe(false);
  });
});
