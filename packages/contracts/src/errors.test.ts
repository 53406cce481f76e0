import { describe, expect, it } from 'vitest';
import {
  ContractError,
  ERROR_CODES,
  ERROR_STATUS,
  ERROR_TITLES,
  invalidInput,
  isErrorCode,
  LedgenceError,
  problemDocument,
} from './errors.js';

describe('ContractError', () => {
  it('carries its code, status, retryability, reason, path and cause as data', () => {
    const cause = new Error('socket closed');
    const error = new ContractError('unavailable', 'the database is unreachable', {
      cause,
      reason: 'backend',
    });
    expect(error.code).toBe('unavailable');
    expect(error.status).toBe(503);
    expect(error.retryable).toBe(true);
    expect(error.cause).toBe(cause);
    expect(error.name).toBe('ContractError');
    expect(error.toJSON()).toEqual({
      code: 'unavailable',
      message: 'the database is unreachable',
      retryable: true,
      reason: 'backend',
    });
    const bad = invalidInput('$.queue must not be empty', 'invalid_text', '$.queue');
    expect(bad.toJSON()).toEqual({
      code: 'invalid_input',
      message: '$.queue must not be empty',
      retryable: false,
      reason: 'invalid_text',
      path: '$.queue',
    });
  });

  it('maps every code to a status and a title, and only unavailable is retryable by default', () => {
    for (const code of ERROR_CODES) {
      expect(isErrorCode(code)).toBe(true);
      expect(ERROR_STATUS[code]).toBeGreaterThanOrEqual(400);
      expect(ERROR_TITLES[code].length).toBeGreaterThan(0);
      expect(new ContractError(code, 'x').retryable).toBe(code === 'unavailable');
    }
    expect(isErrorCode('teapot')).toBe(false);
    expect(new ContractError('conflict', 'x', { retryable: true }).retryable).toBe(true);
  });

  it('answers instanceof for itself, its base class and not for plain errors', () => {
    const error = new ContractError('not_found', 'missing');
    expect(error).toBeInstanceOf(ContractError);
    expect(error).toBeInstanceOf(LedgenceError);
    expect(error).toBeInstanceOf(Error);
    expect(new Error('x') instanceof ContractError).toBe(false);
    expect(new LedgenceError('x') instanceof ContractError).toBe(false);
    expect((null as unknown) instanceof ContractError).toBe(false);
    expect({ code: 'not_found' } instanceof ContractError).toBe(false);
  });

  it('answers instanceof across two separately loaded copies of the module', async () => {
    // A query string makes the module loader evaluate a second, independent copy,
    // as two installed versions of the package would be.
    // @ts-expect-error: TypeScript cannot resolve a query string; the loader can.
    const copy = (await import('./errors.js?second-copy')) as typeof import('./errors.js');
    expect(copy.ContractError).not.toBe(ContractError);
    const foreign = new copy.ContractError('conflict', 'from the other copy');
    expect(foreign instanceof ContractError).toBe(true);
    expect(foreign instanceof LedgenceError).toBe(true);
    expect(new ContractError('conflict', 'x') instanceof copy.ContractError).toBe(true);
    expect(new copy.LedgenceError('x') instanceof ContractError).toBe(false);
  });

  it('lets subclasses declare their own brand', () => {
    class TransportError extends LedgenceError {
      static override readonly brand = '@ledgence/test.TransportError';
    }
    const error = new TransportError('reset');
    expect(error).toBeInstanceOf(TransportError);
    expect(error).toBeInstanceOf(LedgenceError);
    expect(error instanceof ContractError).toBe(false);
    expect(new ContractError('conflict', 'x') instanceof TransportError).toBe(false);
    expect(error.name).toBe('TransportError');
  });
});

describe('problemDocument', () => {
  const error = new ContractError('invalid_input', 'bad', { reason: 'schema', path: '$.a' });

  it("reports the error's own path when none is given, another when given, and none for null", () => {
    expect(problemDocument(error).path).toBe('$.a');
    expect(problemDocument(error, 'x', undefined).path).toBe('$.a');
    expect(problemDocument(error, 'x', '$.b').path).toBe('$.b');
    const stripped = problemDocument(error, 'x', null);
    expect(stripped).not.toHaveProperty('path');
    expect(stripped).toMatchObject({ code: 'invalid_input', detail: 'x', reason: 'schema' });
  });
});
