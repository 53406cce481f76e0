/** Which failures of a retrying loop are logged (failure-run.ts), on a scripted monotonic clock. */
import { describe, expect, it } from 'vitest';
import { FAILURE_LOG_INTERVAL_MS, failureRun } from './failure-run.js';

describe('failureRun', () => {
  it('logs the first failure of a run, then one per interval, counting every failure', () => {
    let clock = 1_000;
    const run = failureRun({ now: () => clock, logIntervalMs: 10_000 });
    const verdicts = [];
    for (let i = 0; i < 8; i += 1) {
      verdicts.push(run.failed());
      clock += 4_000;
    }
    // Failures at 1, 5, 9, 13, 17, 21, 25, 29 s: logged at 1, 13 (12 s after 1) and 25 s.
    expect(verdicts).toEqual([
      { failures: 1, log: true },
      { failures: 2, log: false },
      { failures: 3, log: false },
      { failures: 4, log: true },
      { failures: 5, log: false },
      { failures: 6, log: false },
      { failures: 7, log: true },
      { failures: 8, log: false },
    ]);
  });

  it('ends the run on a success, says how many failures it ended, and logs the next failure at once', () => {
    let clock = 0;
    const run = failureRun({ now: () => clock });
    expect(run.succeeded()).toBe(0);
    run.failed();
    run.failed();
    clock += 1;
    expect(run.succeeded()).toBe(2);
    expect(run.succeeded()).toBe(0);
    expect(run.failed()).toEqual({ failures: 1, log: true });
  });

  it('spaces the lines a minute apart by default', () => {
    let clock = 0;
    const run = failureRun({ now: () => clock });
    expect(run.failed().log).toBe(true);
    clock += FAILURE_LOG_INTERVAL_MS - 1;
    expect(run.failed().log).toBe(false);
    clock += 1;
    expect(run.failed().log).toBe(true);
    expect(FAILURE_LOG_INTERVAL_MS).toBe(60_000);
  });
});
