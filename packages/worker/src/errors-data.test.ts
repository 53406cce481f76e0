/**
 * `instanceof` on the SDK's typed errors. The brand makes it hold across
 * installed copies of the package; it must not make it hold for classes the error is not.
 */
import { ContractError } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { ApplicationError, ProblemError, ProtocolError, TransportError } from './errors.js';
import { TaskAbortedError } from './worker.js';

describe('instanceof on subclasses of the SDK errors', () => {
  it('a plain ApplicationError is not an instance of a user subclass of it', () => {
    class CardDeclined extends ApplicationError {}
    const declined = new CardDeclined('card_declined', 'the card was declined');
    const other = new ApplicationError('no_recipient', 'nothing to send');
    expect(declined).toBeInstanceOf(CardDeclined);
    expect(declined).toBeInstanceOf(ApplicationError);
    expect(other instanceof CardDeclined).toBe(false);
  });

  it('a TransportError or ProblemError is not an instance of a user subclass of it', () => {
    class Offline extends TransportError {}
    class Conflict extends ProblemError {}
    const transport = new TransportError('down', { reason: 'network' });
    const problem = new ProblemError({
      type: 'https://ledgence.dev/problems/not_found',
      title: 'Not found',
      status: 404,
      code: 'not_found',
      detail: 'no such task',
    });
    expect(problem).toBeInstanceOf(ContractError);
    expect(transport instanceof Offline).toBe(false);
    expect(problem instanceof Conflict).toBe(false);
  });
});

describe('errors as data', () => {
  it('serialise to JSON with their message and what identifies them', () => {
    const data = (error: Error): Record<string, unknown> => JSON.parse(JSON.stringify(error));
    expect(
      data(new TransportError('GET /x failed: connect ECONNREFUSED', { reason: 'network' })),
    ).toMatchObject({
      name: 'TransportError',
      code: 'transport_error',
      message: 'GET /x failed: connect ECONNREFUSED',
      reason: 'network',
      retryable: true,
    });
    expect(
      data(
        new TransportError('the server answered 429', {
          reason: 'server',
          status: 429,
          retryAfterMs: 7_000,
        }),
      ),
    ).toMatchObject({ code: 'transport_error', status: 429, retryAfterMs: 7_000 });
    expect(data(new ProtocolError('the reply is not strict JSON', { status: 200 }))).toMatchObject({
      name: 'ProtocolError',
      code: 'protocol_error',
      message: 'the reply is not strict JSON',
      status: 200,
      retryable: false,
    });
    expect(
      data(
        new ProblemError({
          type: 'https://ledgence.dev/problems/not_found',
          title: 'Not found',
          status: 404,
          code: 'not_found',
          detail: 'no such task',
          request_id: 'req_1',
        }),
      ),
    ).toMatchObject({
      name: 'ProblemError',
      code: 'not_found',
      message: 'no such task',
      status: 404,
      requestId: 'req_1',
    });
    const unavailable = {
      type: 'https://ledgence.dev/problems/unavailable',
      title: 'Service unavailable',
      status: 503,
      code: 'unavailable' as const,
      detail: 'retry later',
    };
    expect(data(new ProblemError(unavailable, { retryAfterMs: 2_000 }))).toMatchObject({
      code: 'unavailable',
      retryable: true,
      retryAfterMs: 2_000,
    });
    expect(data(new ProblemError(unavailable))).not.toHaveProperty('retryAfterMs');
    expect(
      data(new ApplicationError('card_declined', 'the card was declined', { details: { a: 1 } })),
    ).toMatchObject({ code: 'card_declined', message: 'the card was declined', details: { a: 1 } });
  });
});

describe('every SDK error carries a stable code', () => {
  it('a TransportError and a ProtocolError have theirs, whatever their reason or status', () => {
    for (const reason of ['network', 'timeout', 'server'] as const) {
      const error = new TransportError('x', { reason });
      expect(error.code).toBe('transport_error');
      expect(error.retryAfterMs).toBeUndefined();
    }
    expect(new TransportError('x', { reason: 'server', retryAfterMs: 1_000 }).retryAfterMs).toBe(
      1_000,
    );
    expect(new ProtocolError('x').code).toBe('protocol_error');
    expect(new ProtocolError('x', { status: 200, path: '$.a' }).code).toBe('protocol_error');
    // Same as ApplicationError and ProblemError: `code` is what a caller branches on.
    expect(new ApplicationError('card_declined', 'm').code).toBe('card_declined');
  });

  it("a TaskAbortedError (a handler's `ctx.signal.reason`) has its own, and says why as data", () => {
    const aborted = new TaskAbortedError('lease_lost');
    expect(aborted.code).toBe('task_aborted');
    expect(JSON.parse(JSON.stringify(aborted))).toEqual({
      name: 'TaskAbortedError',
      code: 'task_aborted',
      message: 'the lease on this attempt was lost',
      why: 'lease_lost',
    });
  });
});
