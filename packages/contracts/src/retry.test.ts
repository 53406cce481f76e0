import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ContractError } from './errors.js';
import { deterministicFullJitter, exponentialCap, retryDelayMs } from './retry.js';

const exponential = { delay_ms: 100, backoff: 'exponential', max_delay_ms: 400 } as const;
const ids = ['run-1', 'step-1'];

describe('retryDelayMs', () => {
  it('is identity-stable and capped per attempt (the a3s seed test)', () => {
    for (const [attempt, cap] of [
      [1, 100],
      [2, 200],
      [3, 400],
      [20, 400],
    ] as const) {
      const first = retryDelayMs(exponential, attempt, ids);
      expect(retryDelayMs(exponential, attempt, ids)).toBe(first);
      expect(first).toBeGreaterThanOrEqual(1);
      expect(first).toBeLessThanOrEqual(cap);
    }
    expect(retryDelayMs(exponential, 3, ['run-1', 'step-1'])).not.toBe(
      retryDelayMs(exponential, 3, ['run-2', 'step-1']),
    );
    expect(retryDelayMs(exponential, 3, ['run-1', 'step-1'])).not.toBe(
      retryDelayMs(exponential, 3, ['run-1', 'step-2']),
    );
  });

  it('returns the fixed delay for fixed policies, including an omitted backoff', () => {
    expect(retryDelayMs({ delay_ms: 250 }, 1, ids)).toBe(250);
    expect(retryDelayMs({ delay_ms: 250, backoff: 'fixed' }, 7, ids)).toBe(250);
    expect(retryDelayMs({ delay_ms: 0, backoff: 'fixed', max_delay_ms: 0 }, 2, ids)).toBe(0);
  });

  it('rejects incoherent policies', () => {
    const bad = [
      { delay_ms: 10, backoff: 'fixed', max_delay_ms: 20 },
      { delay_ms: 0, backoff: 'exponential', max_delay_ms: 20 },
      { delay_ms: 30, backoff: 'exponential', max_delay_ms: 20 },
      { delay_ms: 30, backoff: 'exponential' },
    ] as const;
    for (const policy of bad) {
      expect(() => retryDelayMs(policy, 1, ids)).toThrow(ContractError);
    }
  });

  it('hashes the domain tag, length-prefixed identities and the attempt as specified', () => {
    // An independent transcription of the derivation, so a change to either side shows.
    const cap = 1_000_000;
    const hash = createHash('sha256');
    hash.update('ledgence.retry-jitter.v1');
    for (const id of ['ab', 'c']) {
      hash.update(Buffer.from([0, 0, 0, 0, 0, 0, 0, Buffer.byteLength(id)]));
      hash.update(id);
    }
    hash.update(Buffer.from([0, 0, 0, 5]));
    const sample = hash.digest().readBigUInt64BE(0);
    expect(deterministicFullJitter(cap, ['ab', 'c'], 5)).toBe(1 + Number(sample % BigInt(cap)));
    // Length prefixes keep ['ab','c'] and ['a','bc'] apart.
    expect(deterministicFullJitter(cap, ['a', 'bc'], 5)).not.toBe(
      deterministicFullJitter(cap, ['ab', 'c'], 5),
    );
  });

  it('always falls in 1..cap and repeats for the same identity (property)', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 86_400_000 }),
        fc.integer({ min: 0, max: 86_400_000 }),
        fc.integer({ min: 1, max: 200 }),
        fc.array(fc.string(), { minLength: 1, maxLength: 3 }),
        (delay, extra, attempt, identity) => {
          const policy = {
            delay_ms: delay,
            backoff: 'exponential' as const,
            max_delay_ms: delay + extra,
          };
          const cap = exponentialCap(policy, attempt);
          const value = retryDelayMs(policy, attempt, identity);
          expect(value).toBeGreaterThanOrEqual(1);
          expect(value).toBeLessThanOrEqual(cap);
          expect(cap).toBeLessThanOrEqual(policy.max_delay_ms);
          expect(retryDelayMs(policy, attempt, identity)).toBe(value);
        },
      ),
    );
  });

  it('spreads delays across identities rather than collapsing them', () => {
    const policy = { delay_ms: 1000, backoff: 'exponential', max_delay_ms: 60_000 } as const;
    const values = new Set<number>();
    for (let i = 0; i < 200; i++) values.add(retryDelayMs(policy, 6, [`task-${i}`]));
    // 200 draws from 1..32 000: collisions are rare; a constant function would give 1.
    expect(values.size).toBeGreaterThan(190);
  });
});
