import { ContractError } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { problemOf } from './problem.js';

describe('problemOf', () => {
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
});
