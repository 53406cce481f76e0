import { describe, expect, it } from 'vitest';
import { METRICS, resultsJson } from './metrics.js';

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
