/**
 * The core's fast-check lifecycle model against the PostgreSQL store: random command
 * sequences, DESIGN §5's invariants checked after every step.
 */
import { lifecycleConfig } from '@ledgence/core';
import { runLifecycleModel } from '@ledgence/core/testing';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { type Harness, harness } from './testdata/fixtures.js';

// Sequences move the clock by up to 1.5 leases per step: sessions must outlive a whole run.
const CONFIG = lifecycleConfig({
  leaseDurationMs: 1_000,
  cleanupGraceMs: 500,
  leaseSafetyMarginMs: 100,
  sessionValidityMs: 600_000,
});

describe('lifecycle model (PostgreSQL store)', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await harness('model', CONFIG);
  });
  afterAll(() => h.close());

  it('random command sequences keep DESIGN §5 invariants', async () => {
    await runLifecycleModel(
      {
        store: h.store,
        advance: async (ms) => h.advance(ms),
        leaseDurationMs: CONFIG.leaseDurationMs,
      },
      { runs: 12, maxSteps: 40 },
    );
    // Hundreds of transactions: seconds alone, longer on a busy CI machine.
  }, 180_000);
});
