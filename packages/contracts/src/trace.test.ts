import { describe, expect, it } from 'vitest';
import {
  isValidTraceparent,
  isValidTracestate,
  traceparentProblem,
  tracestateProblem,
} from './trace.js';

const VALID = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

describe('traceparent', () => {
  it('accepts the W3C example and a future version with extra fields', () => {
    expect(isValidTraceparent(VALID)).toBe(true);
    expect(isValidTraceparent('cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what')).toBe(
      true,
    );
  });

  it.each([
    ['uppercase hex', VALID.toUpperCase()],
    ['version ff', `ff${VALID.slice(2)}`],
    ['all-zero trace id', '00-00000000000000000000000000000000-00f067aa0ba902b7-01'],
    ['all-zero parent id', '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01'],
    ['version 00 with a fifth field', `${VALID}-extra`],
    ['short trace id', '00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01'],
    ['missing flags', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7'],
    ['a future version whose extra field holds a LF', `cc${VALID.slice(2)}-a\nb`],
    ['a future version whose extra field holds a non-ASCII space', `cc${VALID.slice(2)}-a\u3000`],
    ['empty', ''],
    ['not a string', 42],
  ])('rejects %s', (_name, value) => {
    expect(traceparentProblem(value)).toBeTypeOf('string');
    expect(isValidTraceparent(value)).toBe(false);
  });
});

describe('tracestate', () => {
  it('accepts simple and multi-tenant keys', () => {
    expect(isValidTracestate('rojo=00f067aa0ba902b7,congo=t61rcWkgMzE')).toBe(true);
    expect(isValidTracestate('tenant@vendor=value')).toBe(true);
  });

  it.each([
    ['a duplicate key', 'a=1,a=2'],
    ['an uppercase key', 'Rojo=1'],
    ['a member without =', 'rojo'],
    ['33 members', Array.from({ length: 33 }, (_, i) => `k${i}=v`).join(',')],
    ['513 characters', `k=${'v'.repeat(511)}`],
    ['a value with =', 'k=a=b'],
  ])('rejects %s', (_name, value) => {
    expect(tracestateProblem(value)).toBeTypeOf('string');
  });

  // W3C Trace Context §3.3.1: "Empty and whitespace-only list members are allowed. Vendors MUST
  // accept empty `tracestate` headers" (until 2026-12-05 a value with no member was refused).
  it.each([
    ['empty', ''],
    ['one space', ' '],
    ['a tab', '\t'],
    ['only commas', ',,'],
    ['commas and blanks', ' , ,\t'],
    ['empty members around one', ' ,a=1, '],
  ])('accepts %s', (_name, value) => {
    expect(tracestateProblem(value)).toBeUndefined();
  });

  it.each([
    ['a LF between members', 'a=1,\nb=2'],
    ['a trailing CR LF', 'a=1\r\n'],
    ['an ideographic space between members', 'a=1,\u3000b=2'],
    ['a leading no-break space', '\u00a0a=1'],
    ['a line separator between members', 'a=1,\u2028b=2'],
    ['a non-ASCII value', 'a=\u00e9'],
    ['a NUL', 'a=1,\u0000'],
  ])('refuses a character outside printable ASCII and tab: %s (W3C §3.3)', (_name, value) => {
    expect(tracestateProblem(value)).toBe('must be printable ASCII');
  });

  it('accepts spaces and tabs around members, the OWS of W3C §3.3', () => {
    expect(isValidTracestate(' a=1 ,\tb=2\t, c=3')).toBe(true);
  });

  it('accepts exactly 32 members', () => {
    expect(isValidTracestate(Array.from({ length: 32 }, (_, i) => `k${i}=v`).join(','))).toBe(true);
  });
});
