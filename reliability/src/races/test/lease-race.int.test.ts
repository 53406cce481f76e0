/**
 * The lease-race round must be able to fail for the misbehaviour it is named after, and must
 * pass correct behaviour. README T3: "a late call gets `409` and changes nothing".
 *
 * The round moves store time to `expiry + skewMs` before it starts the calls, and store time
 * only moves forward, so with `skewMs >= 0` the worker's call is late by construction and
 * must be refused — "exactly one of {call accepted, attempt lost}" alone would not see it, as
 * a store that accepts the late call keeps recovery from ever seeing an expired lease.
 *
 * Misbehaviour is simulated on the worker's store only, for the one racing settle:
 * its store time lags 1 s, i.e. the settle is judged as if the lease were still live (the
 * shape of a bug that judges a settle at a stale store time, or with a grace on the lease).
 * The recoverer and the observer keep the true clock.
 */
import { ContractError } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RaceLane } from './lease-race.js';

let lane: RaceLane;

beforeAll(async () => {
  lane = await RaceLane.open('lease_race_round');
});
afterAll(async () => {
  await lane?.close();
});

describe('a lease-race round', () => {
  it.each([
    ['settle', 'recovery_first', 3],
    ['settle', 'worker_first', -6],
    ['renew', 'worker_blocked', 0],
    ['renew', 'same_tick', -6],
  ] as const)('passes the real store: %s, %s, %i ms from expiry', async (kind, mode, skewMs) => {
    for (const maxAttempts of [1, 2] as const) {
      const result = await lane.round({ kind, mode, skewMs, pauseMs: 0, maxAttempts });
      expect(result.violations).toEqual([]);
      if (skewMs >= 0) expect(result.answer).toBe('ownership_lost');
    }
  });

  it('reports a settle accepted 3 ms after the lease expired at store time', async () => {
    const store = lane.worker as unknown as {
      offset: () => number;
      settle: (...args: unknown[]) => Promise<unknown>;
    };
    const laneOffset = store.offset;
    let lagMs = 0;
    store.offset = () => laneOffset() - lagMs;
    const settle = store.settle;
    let calls = 0;
    store.settle = async (...args: unknown[]) => {
      calls += 1;
      // Only the racing settle (the round's first) is judged at the lagging time.
      lagMs = calls === 1 ? 1_000 : 0;
      try {
        return await settle.apply(store, args);
      } finally {
        lagMs = 0;
      }
    };

    try {
      // worker_blocked: the observer holds the task's row lock, recovery skips the locked row,
      // then the settle decides. The call starts 3 ms after the lease's expiry.
      const result = await lane.round({
        kind: 'settle',
        mode: 'worker_blocked',
        skewMs: 3,
        pauseMs: 0,
        maxAttempts: 1,
      });
      // The misbehaviour happened: the late settle was accepted.
      expect(result.answer).toBe('accepted');
      // …and the round must say so.
      expect(result.violations).not.toEqual([]);
    } finally {
      store.offset = laneOffset;
      store.settle = settle;
    }
  });

  // README T3: "a rejected call is a 409 (`ownership_lost`)"; DESIGN §4 Conflict codes: a lease
  // that expired is `ownership_lost`, while `conflict` means "a second, different settlement".
  // Any other 409 is the wrong answer. Simulated: a store that refuses the late settle with the
  // wrong code (`conflict`), the one racing settle only.
  it('reports a late settle refused with a 409 other than ownership_lost', async () => {
    const store = lane.worker as unknown as {
      settle: (...args: unknown[]) => Promise<unknown>;
    };
    const settle = store.settle;
    let calls = 0;
    store.settle = async (...args: unknown[]) => {
      calls += 1;
      try {
        return await settle.apply(store, args);
      } catch (error) {
        if (calls === 1 && error instanceof ContractError && error.code === 'ownership_lost') {
          throw new ContractError('conflict', 'attempt already has a different settlement');
        }
        throw error;
      }
    };
    try {
      const result = await lane.round({
        kind: 'settle',
        mode: 'recovery_first',
        skewMs: 3,
        pauseMs: 0,
        maxAttempts: 1,
      });
      expect(result.answer).toBe('conflict');
      expect(result.violations).not.toEqual([]);
    } finally {
      store.settle = settle;
    }
  });
});
