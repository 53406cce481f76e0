import {
  COMPLETION_MAX_ATTEMPTS,
  COMPLETION_MAX_RETRY_DELAY_MS,
  COMPLETION_RETRY_BASE_MS,
  retryDelayMs,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { isExhausted, nextDeliveryDelayMs, nextDeliveryState } from './backoff.js';
import type { DeliveryOutcome } from './deliver.js';

const ids = Array.from({ length: 50 }, (_, i) => `evt_${i.toString(16).padStart(32, '0')}`);

describe('nextDeliveryDelayMs', () => {
  it('stays within 1..min(base·2^(attempt−1), max) for every attempt', () => {
    for (const eventId of ids) {
      for (let attempt = 1; attempt <= 40; attempt++) {
        const delay = nextDeliveryDelayMs({ attempt, baseMs: 1_000, eventId });
        const cap = Math.min(1_000 * 2 ** (attempt - 1), COMPLETION_MAX_RETRY_DELAY_MS);
        expect(Number.isSafeInteger(delay)).toBe(true);
        expect(delay).toBeGreaterThanOrEqual(1);
        expect(delay).toBeLessThanOrEqual(cap);
      }
    }
  });

  it('is deterministic per (event id, attempt), and spread across ids and attempts', () => {
    const once = ids.map((eventId) => nextDeliveryDelayMs({ attempt: 5, eventId }));
    const again = ids.map((eventId) => nextDeliveryDelayMs({ attempt: 5, eventId }));
    expect(again).toEqual(once);
    expect(new Set(once).size).toBeGreaterThan(40);
    const perAttempt = [1, 2, 3, 4, 5, 6].map((attempt) =>
      nextDeliveryDelayMs({ attempt, baseMs: 1_000_000, eventId: 'evt_1' }),
    );
    expect(new Set(perAttempt).size).toBe(6);
  });

  it('is the contracts full jitter with the event id as identity (one algorithm, not two)', () => {
    const policy = {
      delay_ms: COMPLETION_RETRY_BASE_MS,
      backoff: 'exponential' as const,
      max_delay_ms: COMPLETION_MAX_RETRY_DELAY_MS,
    };
    for (let attempt = 1; attempt <= 15; attempt++) {
      expect(nextDeliveryDelayMs({ attempt, eventId: 'evt_1' })).toBe(
        retryDelayMs(policy, attempt, ['evt_1']),
      );
    }
  });

  it('caps late attempts at COMPLETION_MAX_RETRY_DELAY_MS, and uses the whole range', () => {
    const late = ids.map((eventId) => nextDeliveryDelayMs({ attempt: 1_000, eventId }));
    expect(Math.max(...late)).toBeLessThanOrEqual(COMPLETION_MAX_RETRY_DELAY_MS);
    expect(Math.max(...late)).toBeGreaterThan(COMPLETION_MAX_RETRY_DELAY_MS / 2);
  });

  it('takes Retry-After as a floor, itself capped', () => {
    const plain = nextDeliveryDelayMs({ attempt: 1, baseMs: 5_000, eventId: 'evt_1' });
    expect(
      nextDeliveryDelayMs({ attempt: 1, baseMs: 5_000, eventId: 'evt_1', retryAfterMs: 60_000 }),
    ).toBe(60_000);
    expect(
      nextDeliveryDelayMs({ attempt: 1, baseMs: 5_000, eventId: 'evt_1', retryAfterMs: 1 }),
    ).toBe(plain);
    expect(
      nextDeliveryDelayMs({ attempt: 1, baseMs: 5_000, eventId: 'evt_1', retryAfterMs: 0 }),
    ).toBe(plain);
    expect(
      nextDeliveryDelayMs({
        attempt: 1,
        eventId: 'evt_1',
        retryAfterMs: 10 * COMPLETION_MAX_RETRY_DELAY_MS,
      }),
    ).toBe(COMPLETION_MAX_RETRY_DELAY_MS);
    expect(nextDeliveryDelayMs({ attempt: 1, eventId: 'evt_1', retryAfterMs: 1_500.2 })).toBe(
      Math.max(plain, 1_501),
    );
  });

  it('defaults the base to COMPLETION_RETRY_BASE_MS and refuses nonsense', () => {
    expect(nextDeliveryDelayMs({ attempt: 1, eventId: 'evt_1' })).toBe(
      nextDeliveryDelayMs({ attempt: 1, eventId: 'evt_1', baseMs: COMPLETION_RETRY_BASE_MS }),
    );
    for (const attempt of [0, -1, 1.5, Number.NaN]) {
      expect(() => nextDeliveryDelayMs({ attempt, eventId: 'e' })).toThrow(RangeError);
    }
    for (const baseMs of [0, 0.5, COMPLETION_MAX_RETRY_DELAY_MS + 1]) {
      expect(() => nextDeliveryDelayMs({ attempt: 1, eventId: 'e', baseMs })).toThrow(RangeError);
    }
  });
});

describe('isExhausted', () => {
  it('ends a generation after COMPLETION_MAX_ATTEMPTS tries', () => {
    expect(COMPLETION_MAX_ATTEMPTS).toBe(12);
    expect(isExhausted(1)).toBe(false);
    expect(isExhausted(COMPLETION_MAX_ATTEMPTS - 1)).toBe(false);
    expect(isExhausted(COMPLETION_MAX_ATTEMPTS)).toBe(true);
    expect(isExhausted(COMPLETION_MAX_ATTEMPTS + 1)).toBe(true);
  });
});

describe('nextDeliveryState', () => {
  const failed: DeliveryOutcome = {
    kind: 'retry',
    reason: 'status',
    status: 500,
    error: 'status 500',
  };

  it('delivered, gone → exhausted, last failure → exhausted, else due after the backoff', () => {
    const base = { attempt: 1, eventId: 'evt_1', baseMs: 1_000 };
    expect(nextDeliveryState({ ...base, outcome: { kind: 'delivered', status: 200 } })).toEqual({
      state: 'delivered',
    });
    // A success on the very last try still counts.
    expect(
      nextDeliveryState({
        ...base,
        attempt: COMPLETION_MAX_ATTEMPTS,
        outcome: { kind: 'delivered', status: 200 },
      }),
    ).toEqual({ state: 'delivered' });
    expect(nextDeliveryState({ ...base, outcome: { kind: 'gone', status: 410 } })).toEqual({
      state: 'exhausted',
    });
    expect(
      nextDeliveryState({ ...base, attempt: COMPLETION_MAX_ATTEMPTS, outcome: failed }),
    ).toEqual({ state: 'exhausted' });
    expect(nextDeliveryState({ ...base, attempt: 3, outcome: failed })).toEqual({
      state: 'due',
      delayMs: nextDeliveryDelayMs({ attempt: 3, eventId: 'evt_1', baseMs: 1_000 }),
    });
    expect(nextDeliveryState({ ...base, outcome: { ...failed, retryAfterMs: 120_000 } })).toEqual({
      state: 'due',
      delayMs: 120_000,
    });
  });
});
