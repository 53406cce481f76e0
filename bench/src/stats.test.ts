import { describe, expect, it } from 'vitest';
import {
  costPerS,
  cpuBudget,
  formatNumber,
  formatSummary,
  percentile,
  pickupLatencies,
  ratioToBest,
  ratioToBracket,
  statementsPerTask,
  summarize,
} from './stats.js';

describe('percentile', () => {
  it('uses the nearest rank', () => {
    const values = [5, 1, 4, 2, 3, 10, 9, 8, 7, 6];
    expect(percentile(values, 50)).toBe(5);
    expect(percentile(values, 90)).toBe(9);
    expect(percentile(values, 99)).toBe(10);
    expect(percentile(values, 100)).toBe(10);
    expect(percentile(values, 0)).toBe(1);
  });

  it('of 1..100, the p-th percentile is p for every whole p, and of 1..1000 p99.9 is 999', () => {
    const hundred = Array.from({ length: 100 }, (_, i) => i + 1);
    const wrong = hundred.filter((p) => percentile(hundred, p) !== p);
    expect(wrong).toEqual([]);
    const thousand = Array.from({ length: 1_000 }, (_, i) => i + 1);
    expect(percentile(thousand, 99.9)).toBe(999);
  });

  it('of 100 values, p99 is the 99th smallest', () => {
    const values = Array.from({ length: 100 }, (_, i) => 100 - i);
    expect(percentile(values, 99)).toBe(99);
    expect(percentile(values, 50)).toBe(50);
  });

  it('is NaN for no values and rejects a percentile out of range', () => {
    expect(percentile([], 50)).toBeNaN();
    expect(() => percentile([1], 101)).toThrow(RangeError);
    expect(() => percentile([1], Number.NaN)).toThrow(RangeError);
  });

  it('does not reorder its input', () => {
    const values = [3, 1, 2];
    percentile(values, 50);
    expect(values).toEqual([3, 1, 2]);
  });
});

describe('summarize', () => {
  it('gives the median and range of an odd count', () => {
    expect(summarize([30, 10, 20])).toEqual({ median: 20, min: 10, max: 30, values: [30, 10, 20] });
  });

  it('averages the middle pair of an even count', () => {
    expect(summarize([4, 1, 3, 2]).median).toBe(2.5);
  });

  it('skips NaN repetitions and is NaN when none is left', () => {
    expect(summarize([Number.NaN, 2, 4]).median).toBe(3);
    expect(summarize([]).median).toBeNaN();
    expect(summarize([Number.NaN]).min).toBeNaN();
  });
});

describe('ratioToBest', () => {
  it('divides by the highest peer when higher is better', () => {
    expect(ratioToBest(1200, { a: 1000, b: 800 }, 'higher')).toEqual({
      best: 'a',
      bestValue: 1000,
      ratio: 1.2,
    });
  });

  it('divides by the lowest peer when lower is better', () => {
    expect(ratioToBest(4, { a: 8, b: 2 }, 'lower')).toEqual({ best: 'b', bestValue: 2, ratio: 2 });
  });

  it('skips peers without a value, and is NaN without any', () => {
    expect(ratioToBest(5, { a: Number.NaN, b: 10 }, 'higher').ratio).toBe(0.5);
    expect(ratioToBest(5, { a: Number.NaN }, 'higher')).toEqual({
      best: undefined,
      bestValue: Number.NaN,
      ratio: Number.NaN,
    });
    expect(ratioToBest(Number.NaN, { a: 1 }, 'higher').ratio).toBeNaN();
  });

  it('handles a best peer of zero', () => {
    expect(ratioToBest(0, { a: 0 }, 'lower').ratio).toBe(1);
    expect(ratioToBest(3, { a: 0 }, 'lower').ratio).toBe(Number.POSITIVE_INFINITY);
  });
});

describe('formatting', () => {
  it('keeps about three significant digits', () => {
    expect(formatNumber(12345.6)).toBe('12346');
    expect(formatNumber(12.345)).toBe('12.3');
    expect(formatNumber(1.2345)).toBe('1.23');
    expect(formatNumber(0.012345)).toBe('0.012');
    expect(formatNumber(0)).toBe('0');
    expect(formatNumber(Number.NaN)).toBe('–');
  });

  it('keeps about three significant digits at the decade boundaries too', () => {
    expect([99.96, 9.996, -99.96, 0.9996].map(formatNumber)).toEqual([
      '100',
      '10.0',
      '-100',
      '1.00',
    ]);
  });

  it('shows the median and range', () => {
    expect(formatSummary(summarize([1, 2, 3]))).toBe('2.00 [1.00–3.00]');
    expect(formatSummary(summarize([7]))).toBe('7.00');
  });
});

describe('statementsPerTask', () => {
  const reading = (calls: number, execMs: number, evictions = 0) => ({ calls, execMs, evictions });

  it('divides the window by the tasks, less the statements the benchmark ran itself', () => {
    expect(statementsPerTask(reading(100, 10), reading(1_107, 60), 7, 500)).toEqual({
      statements: 2,
      execMs: 0.1,
    });
  });

  it('is NaN when a reading is missing or entries were evicted in between', () => {
    const lost = { statements: Number.NaN, execMs: Number.NaN };
    expect(statementsPerTask(undefined, reading(5, 1), 0, 1)).toEqual(lost);
    expect(statementsPerTask(reading(5, 1), undefined, 0, 1)).toEqual(lost);
    expect(statementsPerTask(reading(5, 1, 3), reading(9, 2, 4), 0, 1)).toEqual(lost);
  });
});

describe('ratioToBracket', () => {
  it('compares a value with the geometric mean of its two neighbours', () => {
    expect(ratioToBracket(900, 800, 1_250)).toBeCloseTo(0.9, 12);
    expect(ratioToBracket(1_000, 1_000, 1_000)).toBe(1);
  });

  it('cancels a drift that is linear over the three, where one neighbour alone does not', () => {
    // A system 5 % slower beside the load, measured while the machine speeds up 10 % per step.
    const before = 1_000;
    const beside = 1_100 * 0.95;
    const after = 1_200;
    expect(beside / before).toBeCloseTo(1.045, 12);
    expect(Math.abs(ratioToBracket(beside, before, after) - 0.95)).toBeLessThan(0.005);
  });
});

describe('costPerS', () => {
  const reading = (serverMs: number, benchMs: number, execMs: number, at: number) => ({
    serverMs,
    benchMs,
    execMs,
    at,
  });

  it('gives each part and the total per second of the window', () => {
    expect(costPerS(reading(100, 50, 10, 1_000), reading(700, 350, 130, 21_000))).toEqual({
      server: 30,
      workers: 15,
      statements: 6,
      total: 51,
    });
  });

  it('carries a part that could not be read as NaN into the total', () => {
    const cost = costPerS(reading(0, 0, Number.NaN, 0), reading(10, 10, Number.NaN, 1_000));
    expect(cost.server).toBe(10);
    expect(cost.statements).toBeNaN();
    expect(cost.total).toBeNaN();
  });
});

describe('cpuBudget', () => {
  it("divides the CPUs' ms per second by the rate and compares what was spent", () => {
    // 2 CPUs at 1 250 tasks/s: 1.6 ms per task; 2.0 spent is 1.25× that.
    expect(cpuBudget(1250, 2, 2.0)).toEqual({ targetRate: 1250, budgetMs: 1.6, overBudget: 1.25 });
    // More CPUs, a larger budget: the same spending fits.
    expect(cpuBudget(1250, 4, 2.0).overBudget).toBe(0.625);
  });

  it('is NaN where the rate or the spending was not measured', () => {
    expect(cpuBudget(Number.NaN, 2, 1).budgetMs).toBeNaN();
    expect(cpuBudget(1000, 2, Number.NaN).overBudget).toBeNaN();
  });
});

describe('pickupLatencies', () => {
  it('measures from the acknowledgement to the handler’s start, 0 for a handler that started first', () => {
    const acknowledged = new Map([
      [0, 100],
      [1, 200],
    ]);
    const started = new Map([
      [0, 130],
      [1, 195],
    ]);
    expect(pickupLatencies(acknowledged, started, 1_000)).toEqual({
      latencies: [30, 0],
      missing: 0,
    });
  });

  it('counts a task never picked up as the time it waited until the probe gave up, not as none', () => {
    const acknowledged = new Map([
      [0, 100],
      [1, 200],
      [2, 300],
    ]);
    const started = new Map([
      [0, 110],
      [2, 310],
    ]);
    const { latencies, missing } = pickupLatencies(acknowledged, started, 30_200);
    expect(missing).toBe(1);
    expect(latencies).toEqual([10, 30_000, 10]);
    // Left out, the lost task would leave a max of 10 ms: the best pickup of the three systems.
    expect(percentile(latencies, 100)).toBe(30_000);
  });
});
