import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { textProblem, textProblemByRules } from './text.js';

// Characters near every boundary the rules draw: controls, space and the other whitespace,
// the ends of printable ASCII, C1 controls, two- and three-byte text, zero-width space, BOM,
// surrogate halves.
const EDGES = [
  '\u0000',
  '\t',
  '\n',
  '\u001f',
  ' ',
  '!',
  'a',
  '~',
  '\u007f',
  '\u0080',
  '\u009f',
  '\u00a0',
  'é',
  '\u07ff',
  '\u0800',
  '\u2028',
  '\u200b',
  '\ufeff',
  '\ud800',
  '\udc00',
  '😀',
];

const text = fc.oneof(
  fc.string({ unit: 'grapheme-ascii', maxLength: 40 }),
  fc.string({ unit: fc.constantFrom(...EDGES, 'x', 'y', '-'), maxLength: 12 }),
  fc.string({ unit: 'binary', maxLength: 20 }),
);

describe('textProblem', () => {
  it('answers exactly as the rules checked one by one, on any text and limit', () => {
    fc.assert(
      fc.property(text, fc.integer({ min: 1, max: 45 }), (value, maxBytes) => {
        expect(textProblem(value, maxBytes)).toBe(textProblemByRules(value, maxBytes));
      }),
      { numRuns: 20_000 },
    );
  });

  it('accepts printable ASCII up to the limit and names each rule it breaks', () => {
    expect(textProblem('a b', 3)).toBeUndefined();
    expect(textProblem('abcd', 3)).toBe('must be at most 3 UTF-8 bytes');
    expect(textProblem(' ab', 8)).toBe('must not start or end with whitespace');
    expect(textProblem('ab ', 8)).toBe('must not start or end with whitespace');
    expect(textProblem('a\u007fb', 8)).toBe('must not contain control characters');
    expect(textProblem('é', 1)).toBe('must be at most 1 UTF-8 bytes');
    expect(textProblem('é', 2)).toBeUndefined();
    expect(textProblem('a\ud800', 8)).toBe('must be well-formed Unicode');
    expect(textProblem('', 8)).toBe('must not be empty');
    expect(textProblem(1, 8)).toBe('must be a string');
  });
});
