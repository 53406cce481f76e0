import { describe, expect, it } from 'vitest';
import { HEARTBEATS, METRICS, resultsJson } from './metrics.js';

describe('METRICS', () => {
  it('rank no CPU row that covers Ledgence’s SDK but not its server against a peer’s whole library', () => {
    // The benchmark process hosts Ledgence's SDK workers, which hand the queue's work to the
    // server process ("CPU server"); a peer's library does all of it in that process.
    const workers = METRICS.filter((spec) => spec.metric === 'CPU workers');
    expect(workers.length).toBeGreaterThan(0);
    for (const spec of workers) expect(spec.context, spec.shape).toBe(true);
  });

  it('name each row once', () => {
    const keys = METRICS.map((spec) => `${spec.shape} / ${spec.metric}`);
    expect(new Set(keys).size).toBe(keys.length);
  });

  it('report PostgreSQL exec time beside statements wherever statements are counted (README "How the counters are read")', () => {
    // Drains, shape 7 and single submit at 1 in flight; until 2026-12-05 the last two recorded
    // it (or computed it) with no row to show it in.
    const shapes = (metric: string) =>
      METRICS.filter((spec) => spec.metric === metric).map((spec) => spec.shape);
    expect(shapes('PostgreSQL exec time')).toEqual(shapes('statements'));
    expect(shapes('statements')).toEqual(
      expect.arrayContaining(['single submit, 1 in flight', HEARTBEATS]),
    );
  });
});

describe('resultsJson', () => {
  it('keeps six significant digits and writes the non-finite numbers as null', () => {
    const text = resultsJson({
      rate: 1234.56789,
      ratio: Number.POSITIVE_INFINITY,
      values: [Number.NaN, 0.000123456789],
    });
    expect(JSON.parse(text)).toEqual({ rate: 1234.57, ratio: null, values: [null, 0.000123457] });
    expect(text.endsWith('}\n')).toBe(true);
  });
});
