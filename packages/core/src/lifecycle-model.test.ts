import { describe, it } from 'vitest';
import { createMemoryTaskStore, runLifecycleModel } from './testing/index.js';

describe('lifecycle model (memory store)', () => {
  it('random command sequences keep DESIGN §5 invariants', async () => {
    const store = createMemoryTaskStore({
      config: { leaseDurationMs: 1_000, cleanupGraceMs: 500, leaseSafetyMarginMs: 100 },
    });
    await runLifecycleModel(
      { store, advance: async (ms) => store.advance(ms), leaseDurationMs: 1_000 },
      { runs: 150, maxSteps: 60 },
    );
    // 150 sequences of up to 60 steps: seconds of work, longer on a busy CI machine.
  }, 60_000);
});
