/**
 * The handler-outcome mapping (settle.ts) at its edges — messages at the
 * MESSAGE_MAX_BYTES limit, thrown values of odd types, outputs that are almost plain JSON.
 */
import {
  isWellFormedText,
  MESSAGE_MAX_BYTES,
  OUTPUT_MAX_BYTES,
  utf8ByteLength,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { ApplicationError } from './errors.js';
import { reportFor, settleCommandFor } from './settle.js';
import { identity, owner, times } from './testdata/fixtures.js';

function commandOfThrow(error: unknown) {
  return settleCommandFor(
    owner,
    reportFor(identity, { kind: 'threw', error, aborted: null }, times),
  );
}

function sentError(command: ReturnType<typeof settleCommandFor>) {
  const report = command.report;
  if (report.kind === 'failed') return report.report;
  return report.report.outcome.kind === 'application_error'
    ? report.report.outcome.error
    : undefined;
}

describe('an ApplicationError whose details cannot be reported', () => {
  // README (worker, Outcomes): "an `ApplicationError` whose `details` cannot be reported is
  // reported without them (its message says why), keeping its code and `retryable`."
  it('says why in its message even when its own message is at the byte limit', () => {
    const long = 'upstream answered: '.padEnd(MESSAGE_MAX_BYTES + 100, 'x');
    const error = new ApplicationError('upstream', long, { retryable: false, details: { n: 1n } });
    const command = commandOfThrow(error);
    const sent = sentError(command);
    expect(command.report.kind).toBe('completed');
    expect(sent).toMatchObject({ code: 'upstream', retryable: false });
    expect(sent).not.toHaveProperty('details');
    expect(utf8ByteLength(sent?.message ?? '')).toBeLessThanOrEqual(MESSAGE_MAX_BYTES);
    expect(sent?.message).toContain('its details could not be reported');
  });

  it('says why when its message is short (control)', () => {
    const error = new ApplicationError('upstream', 'short', { details: { n: 1n } });
    expect(sentError(commandOfThrow(error))?.message).toContain(
      'its details could not be reported',
    );
  });
});

describe('messages of thrown values', () => {
  it('a 5 MB message of control characters, multibyte text and lone surrogates stays a retryable crash, wire-safe', () => {
    const message = '\u0000\u001b[31m'.repeat(1000) + '\u4e2d\ud800'.repeat(2_500_000);
    const sent = sentError(commandOfThrow(new Error(message)));
    expect(sent).toMatchObject({ kind: 'crashed', retryable: true });
    expect(isWellFormedText(sent?.message ?? '')).toBe(true);
    expect(utf8ByteLength(sent?.message ?? '')).toBeLessThanOrEqual(MESSAGE_MAX_BYTES);
    // biome-ignore lint/suspicious/noControlCharactersInRegex: checking they are gone
    expect(sent?.message).not.toMatch(/[\u0000-\u001f\u007f]/);
  });

  it('an ApplicationError whose message is only control characters falls back to its code', () => {
    const sent = sentError(commandOfThrow(new ApplicationError('E1', '\n\t\r\u0000')));
    expect(sent).toMatchObject({ code: 'E1', message: 'E1', retryable: true });
  });

  it('an ApplicationError with details at the depth and size limits keeps them', () => {
    let deep: unknown = 'x'.repeat(1000);
    for (let i = 0; i < 64; i++) deep = [deep];
    const sent = sentError(
      commandOfThrow(new ApplicationError('deep', 'm', { retryable: false, details: deep })),
    );
    expect(sent).toMatchObject({ code: 'deep', retryable: false, details: deep });
    const big = 'y'.repeat(OUTPUT_MAX_BYTES - 2);
    const sentBig = sentError(commandOfThrow(new ApplicationError('big', 'm', { details: big })));
    expect(sentBig).toMatchObject({ code: 'big', details: big });
  });
});

describe('an output whose JSON.stringify differs from what checkJsonValue walked', () => {
  // json.ts checkJsonValue: "Symbol-keyed and non-enumerable properties are ignored, as
  // JSON.stringify ignores them" — but JSON.stringify does call a non-enumerable or inherited
  // `toJSON`, and settle.ts `detached` re-serialises the command with JSON.stringify.
  const hidden = () =>
    Object.defineProperty({ a: 1 }, 'toJSON', { value: () => ({ replaced: true }) });
  const inherited = () => {
    const proto = Object.create(null, { toJSON: { value: () => ({ replaced: true }) } });
    return Object.assign(Object.create(proto), { a: 1 });
  };
  for (const [name, make] of [
    ['a non-enumerable own toJSON', hidden],
    ['a toJSON inherited through a null-prototype chain', inherited],
  ] as const) {
    it(`${name}: settles a crash, not what toJSON returns`, () => {
      const command = settleCommandFor(
        owner,
        reportFor(identity, { kind: 'returned', value: make() }, times),
      );
      const report = command.report;
      const output =
        report.kind === 'completed' && report.report.outcome.kind === 'success'
          ? report.report.outcome.output
          : undefined;
      // Refused as not plain JSON: a crash, not the value toJSON would have made of it.
      expect(output).toBeUndefined();
      expect(sentError(command)).toMatchObject({ kind: 'crashed' });
    });
  }
});
