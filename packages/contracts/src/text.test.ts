import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  fitText,
  isWellFormedText,
  textProblem,
  textProblemByRules,
  utf8ByteLength,
} from './text.js';

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
    // Unicode noncharacters, which CloudEvents 1.0 strings exclude, at each edge of their ranges;
    // the code points beside them are ordinary text.
    for (const noncharacter of [
      '\ufdd0',
      '\ufdef',
      '\ufffe',
      '\uffff',
      '\u{1fffe}',
      '\u{10ffff}',
    ]) {
      expect(textProblem(`q${noncharacter}`, 8)).toBe(
        'must not contain Unicode noncharacters (U+FDD0..U+FDEF, U+xFFFE, U+xFFFF)',
      );
    }
    for (const neighbour of ['\ufdcf', '\ufdf0', '\ufffd', '\u{1fffd}', '\u{10fffd}']) {
      expect(textProblem(`q${neighbour}`, 8)).toBeUndefined();
    }
    expect(textProblem('', 8)).toBe('must not be empty');
    expect(textProblem(1, 8)).toBe('must be a string');
  });
});

describe('fitText', () => {
  it('returns well-formed text within the limit unchanged', () => {
    expect(fitText('héllo \u{1F600}', 11)).toBe('héllo \u{1F600}');
  });

  it('replaces lone surrogates, which no JSON decoder here accepts', () => {
    expect(fitText('a\ud800b\udc00', 100)).toBe('a\ufffdb\ufffd');
  });

  it('cuts before a character that would cross the limit, never inside a surrogate pair', () => {
    // 1 + 4 + 4 bytes, a limit of 9 keeps all; 8 leaves room for '!' and the 3-byte mark.
    expect(fitText('!\u{1F600}\u{1F600}', 9)).toBe('!\u{1F600}\u{1F600}');
    expect(fitText('!\u{1F600}\u{1F600}', 8)).toBe('!\u{1F600}…');
    expect(fitText('!\u{1F600}\u{1F600}', 7)).toBe('!…');
  });

  it('always answers well-formed text within the limit that starts with the kept prefix', () => {
    fc.assert(
      fc.property(
        fc.string({ unit: 'binary', maxLength: 200 }),
        fc.integer({ min: 3, max: 400 }),
        (text, max) => {
          const fitted = fitText(text, max);
          const wellFormed = text.replace(/\p{Cs}/gu, '\ufffd');
          expect(isWellFormedText(fitted)).toBe(true);
          expect(utf8ByteLength(fitted)).toBeLessThanOrEqual(max);
          const kept = fitted.endsWith('…') && fitted !== wellFormed ? fitted.slice(0, -1) : fitted;
          expect(wellFormed.startsWith(kept)).toBe(true);
        },
      ),
    );
  });
});
