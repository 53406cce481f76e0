/**
 * `instanceof` on the SDK's typed errors. The brand makes it hold across
 * installed copies of the package; it must not make it hold for classes the error is not.
 */
import { ContractError } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { ApplicationError, ProblemError, ProtocolError, TransportError } from './errors.js';

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
      message: 'GET /x failed: connect ECONNREFUSED',
      reason: 'network',
      retryable: true,
    });
    expect(data(new ProtocolError('the reply is not strict JSON', { status: 200 }))).toMatchObject({
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
      code: 'not_found',
      message: 'no such task',
      status: 404,
      requestId: 'req_1',
    });
    expect(
      data(new ApplicationError('card_declined', 'the card was declined', { details: { a: 1 } })),
    ).toMatchObject({ code: 'card_declined', message: 'the card was declined', details: { a: 1 } });
  });
});
