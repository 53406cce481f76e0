import {
  ContractError,
  MESSAGE_MAX_BYTES,
  ProblemSchema,
  parseWith,
  utf8ByteLength,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { problemOf } from './problem.js';

describe('problemOf', () => {
  it('cuts a detail past MESSAGE_MAX_BYTES at a character, so the document is one by ProblemSchema (review r47h)', () => {
    const message = `$.input.data${'["é\\u0001"]'.repeat(600)} is not a safe integer`;
    expect(utf8ByteLength(message)).toBeGreaterThan(MESSAGE_MAX_BYTES);
    const problem = problemOf(new ContractError('invalid_input', message));
    expect(utf8ByteLength(problem.detail)).toBeLessThanOrEqual(MESSAGE_MAX_BYTES);
    expect(problem.detail.endsWith('…')).toBe(true);
    expect(message.startsWith(problem.detail.slice(0, -1))).toBe(true);
    expect(parseWith(ProblemSchema, problem)).toEqual(problem);
  });

  it('leaves out a path that quotes a string the request supplied', () => {
    const error = new ContractError('not_found', 'no such thing', {
      path: '$.input.labels.customer-4711',
    });
    const problem = problemOf(error, { supplied: ['customer-4711'] });
    expect(problem).not.toHaveProperty('path');
    expect(problem.detail).toBe('no such thing');
  });

  it('keeps a path that quotes nothing the request supplied', () => {
    const error = new ContractError('invalid_input', 'bad', { path: '$.input.queue' });
    expect(problemOf(error, { supplied: ['customer-4711'] }).path).toBe('$.input.queue');
  });

  it('scrubs a detail quoting a supplied string as a token, whatever surrounds it', () => {
    for (const message of ['unknown alias "hq"', 'alias hq is unknown', 'hq: unknown', 'hq']) {
      const error = new ContractError('invalid_input', message);
      expect(problemOf(error, { supplied: ['hq'] }).detail, message).toBe(
        'The request is not valid.',
      );
    }
  });

  it('keeps a detail and path in which a short supplied name occurs only inside words', () => {
    const error = new ContractError('invalid_input', 'within the lease safety margin: use 5001', {
      path: '$.input.timeout_ms',
    });
    const problem = problemOf(error, { supplied: ['p', 'in', 'ms', '5'] });
    expect(problem.detail).toBe('within the lease safety margin: use 5001');
    expect(problem.path).toBe('$.input.timeout_ms');
  });
});
