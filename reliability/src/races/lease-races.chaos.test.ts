/**
 * T3a, lease races (issue #8): 1 000 forced interleavings of recovery against
 * settle and 1 000 of recovery against a heartbeat, each at a seeded store time
 * within a few milliseconds of the lease's expiry, on real PostgreSQL through
 * the real store (see test/lease-race.ts for what a round does and checks).
 * Prints the outcome counts. `LEDGENCE_RACE_ROUNDS` changes the rounds per
 * kind; `LEDGENCE_RACE_SEED` the seed (a failure names its round's plan).
 */
import { prng } from '@ledgence/e2e/harness';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  RACE_MODES,
  type RaceKind,
  RaceLane,
  type RoundPlan,
  type RoundResult,
} from './test/lease-race.js';

const ROUNDS = Number(process.env.LEDGENCE_RACE_ROUNDS ?? 1_000);
const SEED = Number(process.env.LEDGENCE_RACE_SEED ?? 8);
/** Lanes race in parallel, each on its own database (recovery is database-wide). */
const LANES = 4;

/** The seeded plan of round `index` of `kind`. */
function planOf(kind: RaceKind, index: number): RoundPlan {
  const random = prng(SEED * 1_000_003 + index * 2 + (kind === 'settle' ? 0 : 1));
  return {
    kind,
    mode: RACE_MODES[Math.floor(random() * RACE_MODES.length)] ?? 'same_tick',
    // From 6 ms before the expiry to 3 ms after: both sides of it, and the instant itself.
    skewMs: Math.floor(random() * 10) - 6,
    pauseMs: Math.floor(random() * 3),
    maxAttempts: random() < 0.5 ? 1 : 2,
  };
}

const lanes: RaceLane[] = [];

beforeAll(async () => {
  for (let i = 0; i < LANES; i += 1) lanes.push(await RaceLane.open(`races_${i}`));
});
afterAll(async () => {
  await Promise.all(lanes.map((lane) => lane.close()));
});

/** Runs every round of `kind` over the lanes; returns results and failures. */
async function runKind(kind: RaceKind): Promise<RoundResult[]> {
  const results: RoundResult[] = [];
  let next = 0;
  await Promise.all(
    lanes.map(async (lane) => {
      for (let index = next++; index < ROUNDS; index = next++) {
        const plan = planOf(kind, index);
        const result = await lane.round(plan);
        results.push(result);
        if (result.violations.length > 0) {
          throw new Error(
            `round ${index} ${JSON.stringify(plan)}: ${result.violations.join('; ')}`,
          );
        }
      }
    }),
  );
  return results;
}

function summary(kind: RaceKind, results: readonly RoundResult[]): string {
  const tally = new Map<string, number>();
  for (const r of results) {
    const key =
      r.answer === 'accepted' ? `${kind} accepted` : `${kind} ${r.answer} (lost by ${r.lostBy})`;
    tally.set(key, (tally.get(key) ?? 0) + 1);
  }
  const byMode = RACE_MODES.map(
    (mode) =>
      `${mode} ${results.filter((r) => r.mode === mode && r.answer === 'accepted').length}/${results.filter((r) => r.mode === mode).length}`,
  );
  return (
    `lease races, recovery vs ${kind}: ${results.length} interleavings, seed ${SEED}, 0 violations; ` +
    [...tally].map(([key, n]) => `${key}: ${n}`).join(', ') +
    `; accepted by mode: ${byMode.join(', ')}`
  );
}

describe('lease races: recovery against a late settle or heartbeat', () => {
  it.each(['settle', 'renew'] as const)(
    'recovery vs %s: exactly one side wins, the loser gets 409 and changes nothing',
    async (kind) => {
      const results = await runKind(kind);
      console.log(summary(kind, results));
      console.log(
        `replay: LEDGENCE_RACE_SEED=${SEED} LEDGENCE_RACE_ROUNDS=${ROUNDS} pnpm test:chaos reliability/src/races/lease-races`,
      );
      expect(results).toHaveLength(ROUNDS);
      // Both sides of the race were actually exercised, or the rounds proved little.
      expect(results.some((r) => r.answer === 'accepted')).toBe(true);
      expect(results.some((r) => r.answer !== 'accepted' && r.lostBy === 'race')).toBe(true);
    },
  );
});
