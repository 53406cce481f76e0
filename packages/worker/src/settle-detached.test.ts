/**
 * The settle command is a snapshot of what the handler returned, and a
 * handler reported while still running says why.
 */
import { describe, expect, it } from 'vitest';
import { ApplicationError } from './errors.js';
import { reportFor, settleCommandFor } from './settle.js';
import { identity, owner, times } from './testdata/fixtures.js';

describe('settleCommandFor', () => {
  it('keeps the output as it was when built, whatever later happens to the returned object', () => {
    const out: Record<string, unknown> = { n: 1, list: [1] };
    const command = settleCommandFor(
      owner,
      reportFor(identity, { kind: 'returned', value: out }, times),
    );
    const bytes = JSON.stringify(command);
    out.n = 2;
    (out.list as unknown[]).push(10n);
    expect(JSON.stringify(command)).toBe(bytes);
  });

  it('keeps application error details as they were when built', () => {
    const details = { tries: 1 };
    const error = new ApplicationError('busy', 'busy', { details });
    const command = settleCommandFor(
      owner,
      reportFor(identity, { kind: 'threw', error, aborted: null }, times),
    );
    const bytes = JSON.stringify(command);
    details.tries = 2;
    expect(JSON.stringify(command)).toBe(bytes);
  });

  it('checks the value it sends, not only the first read of it (a getter answering twice)', () => {
    let reads = 0;
    const out = {
      get n() {
        reads += 1;
        return reads === 1 ? 1 : 'lone \ud800';
      },
    };
    const command = settleCommandFor(
      owner,
      reportFor(identity, { kind: 'returned', value: out }, times),
    );
    expect(command.report).toMatchObject({
      kind: 'failed',
      report: { kind: 'crashed', retryable: false },
    });
  });
});

describe('reportFor a handler still running', () => {
  it('after a cancel it ignored: cancelled, not a shutdown', () => {
    expect(reportFor(identity, { kind: 'abandoned', aborted: 'cancelled' }, times)).toEqual({
      kind: 'failed',
      report: {
        kind: 'cancelled',
        message: 'the task was cancelled and the handler has not returned (it may still run)',
        retryable: false,
      },
    });
  });
});
