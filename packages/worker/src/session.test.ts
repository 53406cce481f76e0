import { describe, expect, it } from 'vitest';
import {
  DATE_RESOLUTION_MS,
  extensionDelayMs,
  MIN_DATE_VALIDITY_MS,
  MIN_EXTENSION_DELAY_MS,
  shorterValidity,
  validityShownBy,
} from './session.js';

const DATE = Date.parse('Thu, 03 Dec 2026 11:30:00 GMT');

describe('validityShownBy', () => {
  it('reads expires_at less the Date, less the header resolution', () => {
    // The store read its clock somewhere in the Date's second: at most 60 s of validity shows
    // as 59 s, never as more than the real validity.
    expect(validityShownBy(DATE + 60_000 + 400, DATE)).toBe(60_000 + 400 - DATE_RESOLUTION_MS);
  });

  it('shows nothing without a Date, or where the resolution could be a third of it', () => {
    expect(validityShownBy(DATE + 60_000, null)).toBeNull();
    expect(validityShownBy(DATE + DATE_RESOLUTION_MS + MIN_DATE_VALIDITY_MS, DATE)).toBe(
      MIN_DATE_VALIDITY_MS,
    );
    expect(validityShownBy(DATE + DATE_RESOLUTION_MS + MIN_DATE_VALIDITY_MS - 1, DATE)).toBeNull();
    // A database clock behind the server's: nothing usable rather than a negative validity.
    expect(validityShownBy(DATE - 5_000, DATE)).toBeNull();
  });
});

describe('shorterValidity', () => {
  it('keeps the shorter known estimate', () => {
    expect(shorterValidity(null, null)).toBeNull();
    expect(shorterValidity(null, 9_000)).toBe(9_000);
    expect(shorterValidity(4_000, null)).toBe(4_000);
    expect(shorterValidity(4_000, 9_000)).toBe(4_000);
    expect(shorterValidity(9_000, 4_000)).toBe(4_000);
  });
});

describe('extensionDelayMs', () => {
  it("keeps the worker's period when the server's sessions are long enough", () => {
    expect(extensionDelayMs(100_000, null)).toBe(100_000);
    expect(extensionDelayMs(100_000, 300_000)).toBe(100_000);
  });

  it("extends at a third of a shorter server's validity: two chances before it lapses", () => {
    expect(extensionDelayMs(100_000, 30_000)).toBe(10_000);
    expect(extensionDelayMs(100_000, 1_000)).toBe(333);
  });

  it('never extends more often than the floor', () => {
    expect(extensionDelayMs(100_000, 0)).toBe(MIN_EXTENSION_DELAY_MS);
    expect(extensionDelayMs(1, null)).toBe(MIN_EXTENSION_DELAY_MS);
  });
});
