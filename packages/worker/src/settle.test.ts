import {
  isWellFormedText,
  MESSAGE_MAX_BYTES,
  OPERATION_ID_MAX_BYTES,
  utf8ByteLength,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { backoffDelay } from './backoff.js';
import { ApplicationError, ProtocolError, TransportError } from './errors.js';
import {
  type AbortCause,
  classifySettleError,
  operationIdFor,
  reportFor,
  settleCommandFor,
} from './settle.js';
import { identity, owner, problemErrorOf, times } from './testdata/fixtures.js';

describe('operation ids', () => {
  it('derive from the attempt id alone, so retries reuse them', () => {
    expect(operationIdFor('att_1')).toBe('settle:att_1');
    expect(operationIdFor('att_1')).toBe(operationIdFor('att_1'));
    expect(operationIdFor('att_2')).not.toBe(operationIdFor('att_1'));
  });

  it('hash attempt ids that would exceed the operation id limit', () => {
    const long = 'é'.repeat(64);
    const op = operationIdFor(long);
    expect(utf8ByteLength(op)).toBeLessThanOrEqual(OPERATION_ID_MAX_BYTES);
    expect(op).toMatch(/^settle:sha256:[0-9a-f]{64}$/);
    expect(operationIdFor(long)).toBe(op);
  });

  it('build byte-identical commands for the same outcome', () => {
    const report = reportFor(identity, { kind: 'returned', value: { a: 1 } }, times);
    const a = settleCommandFor(owner, report);
    const b = settleCommandFor(
      owner,
      reportFor(identity, { kind: 'returned', value: { a: 1 } }, times),
    );
    expect(JSON.stringify(a)).toBe(JSON.stringify(b));
    expect(a.operation_id).toBe('settle:att_1');
    expect(a.quiescence).toBe('confirmed');
  });
});

describe('reports', () => {
  it('map a return value to success (undefined as null)', () => {
    expect(reportFor(identity, { kind: 'returned', value: undefined }, times)).toEqual({
      kind: 'completed',
      report: {
        context: { identity: { task_id: 't1', attempt_id: 'att_1' } },
        outcome: { kind: 'success', output: null },
        started_at: 1,
        finished_at: 2,
      },
    });
  });

  it('map an ApplicationError to an application error', () => {
    const error = new ApplicationError('card_declined', 'declined', {
      retryable: false,
      details: { last4: '4242' },
    });
    const report = reportFor(identity, { kind: 'threw', error, aborted: null }, times);
    expect(report).toMatchObject({
      kind: 'completed',
      report: {
        outcome: {
          kind: 'application_error',
          error: {
            code: 'card_declined',
            message: 'declined',
            retryable: false,
            details: { last4: '4242' },
          },
        },
      },
    });
  });

  it('report an ApplicationError thrown once the signal aborted by the abort cause, not as the application’s', () => {
    // A handler wrapping its aborted call's error as its own, not retryable (review r45a): a
    // deploy or a budget (retried by design) must not fail the task for good.
    const error = new ApplicationError('upstream_failed', 'upstream call failed', {
      retryable: false,
    });
    const cases: [AbortCause, string, boolean][] = [
      ['cancelled', 'cancelled', false],
      ['shutdown', 'cancelled', true],
      ['timeout', 'timed_out', true],
      ['lease_lost', 'crashed', true],
    ];
    for (const [aborted, kind, retryable] of cases) {
      expect(reportFor(identity, { kind: 'threw', error, aborted }, times)).toMatchObject({
        kind: 'failed',
        report: { kind, retryable, message: expect.stringMatching(/: upstream call failed$/) },
      });
    }
  });

  it('name the abort cause, then what the handler threw unless it was the abort’s own reason', () => {
    const error = new Error('stopped');
    const cases: [AbortCause, string][] = [
      ['cancelled', 'cancelled'],
      ['shutdown', 'the worker shut down'],
      ['timeout', 'the execution budget ran out'],
      ['lease_lost', 'the lease was lost'],
    ];
    for (const [aborted, cause] of cases) {
      const thrown = reportFor(identity, { kind: 'threw', error, aborted }, times);
      expect(thrown).toMatchObject({ report: { message: `${cause}: stopped` } });
      const own = reportFor(identity, { kind: 'threw', error, aborted, ownAbort: true }, times);
      expect(own).toMatchObject({ report: { message: cause } });
    }
  });

  it('map other throws to crashed (retryable), or to the abort cause', () => {
    const error = new Error('boom\nwith newline');
    expect(reportFor(identity, { kind: 'threw', error, aborted: null }, times)).toEqual({
      kind: 'failed',
      report: { kind: 'crashed', message: 'boom with newline', retryable: true },
    });
    expect(
      reportFor(identity, { kind: 'threw', error, aborted: 'cancelled' }, times),
    ).toMatchObject({
      report: { kind: 'cancelled', retryable: false },
    });
    expect(reportFor(identity, { kind: 'threw', error, aborted: 'shutdown' }, times)).toMatchObject(
      {
        report: { kind: 'cancelled', retryable: true },
      },
    );
    expect(reportFor(identity, { kind: 'threw', error, aborted: 'timeout' }, times)).toMatchObject({
      report: { kind: 'timed_out', retryable: true },
    });
    expect(
      reportFor(identity, { kind: 'threw', error: 'str', aborted: null }, times),
    ).toMatchObject({
      report: { kind: 'crashed', message: 'str' },
    });
    expect(reportFor(identity, { kind: 'abandoned' }, times)).toMatchObject({
      report: { kind: 'cancelled', retryable: true },
    });
    // Still running past the abort grace after its budget ran out: a timeout, not a shutdown.
    expect(reportFor(identity, { kind: 'abandoned', aborted: 'timeout' }, times)).toMatchObject({
      report: { kind: 'timed_out', retryable: true },
    });
  });

  it('describe a plain object thrown in place of an Error by its message, else its JSON', () => {
    const circular: Record<string, unknown> = { code: 'E_DB', message: 'database down' };
    circular.cause = circular;
    const cases: [unknown, string][] = [
      [circular, 'database down'],
      [{ code: 'E_DB', status: 503 }, '{"code":"E_DB","status":503}'],
      [{ toString: () => 'custom text' }, 'custom text'],
      [[1, 2], '1,2'],
      [42, '42'],
    ];
    for (const [error, message] of cases) {
      expect(reportFor(identity, { kind: 'threw', error, aborted: null }, times)).toEqual({
        kind: 'failed',
        report: { kind: 'crashed', message, retryable: true },
      });
    }
    // Neither a message nor JSON: what String() says.
    const selfish: Record<string, unknown> = { code: 1 };
    selfish.self = selfish;
    expect(
      reportFor(identity, { kind: 'threw', error: selfish, aborted: null }, times),
    ).toMatchObject({ report: { message: '[object Object]' } });
  });

  it('report a thrown value that cannot be turned into text as a retryable crash, without throwing', () => {
    const throwing = () => {
      throw new Error('not today');
    };
    const unreadable = [
      Object.create(null),
      Object.assign(Object.create(null), { reason: 'odd' }),
      { toString: throwing },
      { [Symbol.toPrimitive]: throwing },
      Object.defineProperty(new Error('x'), 'message', { get: throwing }),
      // `instanceof` itself runs a trap.
      new Proxy({}, { getPrototypeOf: throwing, get: throwing }),
    ];
    for (const error of unreadable) {
      const command = settleCommandFor(
        owner,
        reportFor(identity, { kind: 'threw', error, aborted: null }, times),
      );
      expect(command.report).toEqual({
        kind: 'failed',
        report: {
          kind: 'crashed',
          message: 'the handler threw a value that cannot be turned into text',
          retryable: true,
        },
      });
    }
    // An ApplicationError whose fields throw when read is reported like any other throw.
    const broken = Object.defineProperty(new ApplicationError('c', 'm'), 'code', { get: throwing });
    expect(reportFor(identity, { kind: 'threw', error: broken, aborted: null }, times)).toEqual({
      kind: 'failed',
      report: { kind: 'crashed', message: 'm', retryable: true },
    });
    // The abort cause still decides the kind.
    expect(
      reportFor(
        identity,
        { kind: 'threw', error: Object.create(null), aborted: 'shutdown' },
        times,
      ),
    ).toMatchObject({ report: { kind: 'cancelled', retryable: true } });
  });

  it('keep an application error whose details cannot be reported, with its retry decision', () => {
    for (const retryable of [true, false]) {
      const error = new ApplicationError('busy', 'try later', {
        retryable,
        details: { at: 1n },
      });
      const command = settleCommandFor(
        owner,
        reportFor(identity, { kind: 'threw', error, aborted: null }, times),
      );
      expect(command.report).toMatchObject({
        kind: 'completed',
        report: { outcome: { kind: 'application_error', error: { code: 'busy', retryable } } },
      });
      const sent = command.report.kind === 'completed' ? command.report.report.outcome : null;
      expect(sent).not.toHaveProperty('error.details');
      expect(sent).toHaveProperty(
        'error.message',
        expect.stringMatching(/^try later \(its details could not be reported: /),
      );
    }
  });

  it("keep messages within the server's byte limit, cut between characters, so a retryable failure stays retryable", () => {
    const emoji = '\u{1F600}';
    const messages = [
      // Cut at 1 000 UTF-16 units, this one split its emoji.
      `${'x'.repeat(999)}${emoji} upstream said no`,
      // Cut anywhere by bytes, a pair of units or three bytes per character.
      `!${emoji.repeat(2_000)}`,
      '\u4e2d'.repeat(2_000),
      // Lone surrogates (a bad upstream reply) are replaced, not refused.
      `bad \ud800 and \udc00 halves`,
    ];
    for (const message of messages) {
      for (const error of [new Error(message), new ApplicationError('upstream', message)]) {
        const command = settleCommandFor(
          owner,
          reportFor(identity, { kind: 'threw', error, aborted: null }, times),
        );
        const report = command.report;
        const sent =
          report.kind === 'failed'
            ? report.report
            : report.report.outcome.kind === 'application_error'
              ? report.report.outcome.error
              : undefined;
        expect(sent?.retryable).toBe(true);
        expect(report.kind).toBe(error instanceof ApplicationError ? 'completed' : 'failed');
        expect(isWellFormedText(sent?.message ?? '')).toBe(true);
        expect(utf8ByteLength(sent?.message ?? '')).toBeLessThanOrEqual(MESSAGE_MAX_BYTES);
      }
    }
    const cut = reportFor(
      identity,
      { kind: 'threw', error: new Error(`!${emoji.repeat(2_000)}`), aborted: null },
      times,
    );
    // As much as fits: 1 + 1 023 × 4 bytes, then the ellipsis.
    expect(cut).toMatchObject({ report: { message: `!${emoji.repeat(1_023)}…` } });
    expect(
      reportFor(identity, { kind: 'threw', error: new Error('a \ud800 b'), aborted: null }, times),
    ).toMatchObject({ report: { message: 'a \ufffd b' } });
  });

  it('replace an output the server would refuse by a non-retryable crash', () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    for (const value of [
      { big: 10n },
      { f: () => 1 },
      { s: 'x'.repeat(1024 * 1024 + 1) },
      cyclic,
      new Map(),
    ]) {
      const command = settleCommandFor(
        owner,
        reportFor(identity, { kind: 'returned', value }, times),
      );
      expect(command.report).toMatchObject({
        kind: 'failed',
        report: { kind: 'crashed', retryable: false },
      });
    }
    const badCode = new ApplicationError('', 'empty code');
    const command = settleCommandFor(
      owner,
      reportFor(identity, { kind: 'threw', error: badCode, aborted: null }, times),
    );
    expect(command.report.kind).toBe('failed');
  });
});

describe('settle retry policy', () => {
  it('retries transport failures and unavailable; everything else is definitive', () => {
    expect(classifySettleError(new TransportError('x', { reason: 'network' }))).toBe('retry');
    expect(classifySettleError(new TransportError('x', { reason: 'server', status: 502 }))).toBe(
      'retry',
    );
    expect(classifySettleError(problemErrorOf('unavailable'))).toBe('retry');
    for (const code of ['ownership_lost', 'conflict', 'not_found', 'invalid_input'] as const) {
      expect(classifySettleError(problemErrorOf(code))).toBe('definitive');
    }
    expect(classifySettleError(new ProtocolError('bad'))).toBe('definitive');
  });

  it('splits a request of several settlements refused as too large; one alone is definitive', () => {
    expect(classifySettleError(problemErrorOf('payload_too_large'), 2)).toBe('split');
    expect(classifySettleError(problemErrorOf('payload_too_large'), 1)).toBe('definitive');
    expect(classifySettleError(problemErrorOf('payload_too_large'))).toBe('definitive');
    expect(classifySettleError(problemErrorOf('invalid_input'), 2)).toBe('definitive');
    // A gateway's own 413 page (no problem document) is as much a size refusal (review r48a).
    const gateway413 = new ProtocolError('the server answered 413', { status: 413 });
    expect(classifySettleError(gateway413, 2)).toBe('split');
    expect(classifySettleError(gateway413, 1)).toBe('definitive');
    expect(classifySettleError(new ProtocolError('x', { status: 400 }), 2)).toBe('definitive');
  });

  it('backs off exponentially with jitter between half the ceiling and the ceiling', () => {
    const policy = { baseMs: 100, maxMs: 1_000 };
    expect(backoffDelay(1, policy, () => 0)).toBe(50);
    expect(backoffDelay(1, policy, () => 0.999999)).toBe(100);
    expect(backoffDelay(2, policy, () => 0)).toBe(100);
    expect(backoffDelay(3, policy, () => 1)).toBe(400);
    expect(backoffDelay(10, policy, () => 1)).toBe(1_000);
    expect(backoffDelay(1_000, policy, () => 0.5)).toBe(750);
    for (let i = 0; i < 100; i++) {
      const d = backoffDelay(4, policy);
      expect(d).toBeGreaterThanOrEqual(400);
      expect(d).toBeLessThanOrEqual(800);
    }
  });
});
