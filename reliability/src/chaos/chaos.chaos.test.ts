/**
 * T1 (issue #8) at CI size: 2 000 tasks across 2 tenants × 2 namespaces under a fault every
 * 2–5 s for 90 s, two server replicas, four worker processes, two immediate PostgreSQL restarts;
 * then drain and check. Each invariant is its own assertion, so a failure names it; the figures
 * and the seed are printed either way. Replay a failing seed with
 * `LEDGENCE_CHAOS_SEED=<seed> pnpm test:chaos` or `pnpm chaos --seed <seed>`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHECKS } from './checker.js';
import { FAULT_TYPES } from './model.js';
import { type ChaosReport, DEFAULT_OPTIONS, runChaos } from './scenario.js';

const seed = Number(process.env.LEDGENCE_CHAOS_SEED ?? DEFAULT_OPTIONS.seed);

describe(`chaos (T1), seed ${seed}`, () => {
  let report: ChaosReport | undefined;
  let failure: unknown;

  beforeAll(async () => {
    try {
      report = await runChaos({ seed });
    } catch (error) {
      failure = error;
    }
    if (report !== undefined)
      console.log(`${report.table}\nreplay: LEDGENCE_CHAOS_SEED=${seed} pnpm test:chaos`);
  }, 400_000);
  afterAll(() => {
    if (report !== undefined && report.figures.violations > 0) {
      console.log(`logs kept in ${report.runDir}`);
    }
  });

  it('completes the run', () => {
    expect(failure).toBeUndefined();
    expect(report).toBeDefined();
  });

  for (const name of Object.values(CHECKS)) {
    it(name, () => {
      const result = report?.checks.find((c) => c.name === name);
      expect(result, 'the run did not complete').toBeDefined();
      expect(result?.examples, name).toEqual([]);
      expect(result?.violations).toBe(0);
    });
  }

  it('injected every kind of fault, and restarted PostgreSQL twice', () => {
    const faults = report?.figures.faults;
    for (const type of FAULT_TYPES) expect(faults?.[type], type).toBeGreaterThan(0);
    expect(faults?.restart_postgres).toBe(DEFAULT_OPTIONS.postgresRestarts);
  });

  it('acknowledged every planned task and ran the mix', () => {
    // Told to a client at least once, not only present in the database (a submit whose every
    // reply was lost also leaves its row).
    expect(report?.figures.submits.keys).toBe(DEFAULT_OPTIONS.tasks);
    expect(report?.figures.tasks).toBe(DEFAULT_OPTIONS.tasks);
    expect(report?.figures.submits.repeats).toBeGreaterThan(0);
    expect(report?.figures.subscriptions).toBeGreaterThan(0);
  });
});

// The checker's own tests (it must report each violation, and pass a correct record) are pure and
// run with `pnpm test`: checker.test.ts.
