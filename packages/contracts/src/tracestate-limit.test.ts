/**
 * TRACESTATE_MAX_BYTES at its edge. The existing "513 characters" case is a single
 * 511-character value, which the per-member value rule (≤ 256 characters) already refuses; here
 * the whole header is made of valid members, so only the total length decides.
 */
import { describe, expect, it } from 'vitest';
import { TRACESTATE_MAX_BYTES } from './limits.js';
import { isValidTracestate, tracestateProblem } from './trace.js';

/** Two valid members joined by a comma, `total` characters long. */
const tracestate = (total: number) => `a=${'v'.repeat(254)},b=${'w'.repeat(total - 256 - 3)}`;

describe('tracestate length (TRACESTATE_MAX_BYTES)', () => {
  it(`accepts exactly ${TRACESTATE_MAX_BYTES} characters of valid members`, () => {
    expect(tracestate(TRACESTATE_MAX_BYTES)).toHaveLength(TRACESTATE_MAX_BYTES);
    expect(isValidTracestate(tracestate(TRACESTATE_MAX_BYTES))).toBe(true);
  });

  it(`refuses ${TRACESTATE_MAX_BYTES + 1} characters of valid members, for its length`, () => {
    const value = tracestate(TRACESTATE_MAX_BYTES + 1);
    expect(value).toHaveLength(TRACESTATE_MAX_BYTES + 1);
    // Each member alone is valid: the refusal is the total length.
    for (const member of value.split(',')) expect(isValidTracestate(member)).toBe(true);
    expect(tracestateProblem(value)).toBe(`must be at most ${TRACESTATE_MAX_BYTES} bytes`);
  });
});
