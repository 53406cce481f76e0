/**
 * The direction of every ranked row, and the ratio the table prints for it: no latency, cost or
 * rate row ranked the wrong way.
 */
import { describe, expect, it } from 'vitest';
import { METRICS } from './metrics.js';
import { ratioToBest, summarize } from './stats.js';
import { requestCounts } from './systems/requests.js';

describe('METRICS directions', () => {
  it('rank every latency, cost and counter row lower-is-better and every rate higher-is-better', () => {
    for (const spec of METRICS) {
      const where = `${spec.shape} / ${spec.metric}`;
      if (/^(p50|p99|max)$/.test(spec.metric)) expect(spec.better, where).toBe('lower');
      if (/ms|bytes|per task|share/.test(spec.unit)) expect(spec.better, where).toBe('lower');
      if (spec.unit === 'tasks/s' || spec.metric.startsWith('rate')) {
        expect(spec.better, where).toBe('higher');
      }
    }
  });

  it('give a latency lead a ratio below 1 and a rate lead a ratio above 1', () => {
    // Ledgence twice as fast at picking up (5 ms against the best peer's 10 ms): 0.5, a lead.
    expect(ratioToBest(5, { 'pg-boss': 300, 'graphile-worker': 10 }, 'lower')).toEqual({
      best: 'graphile-worker',
      bestValue: 10,
      ratio: 0.5,
    });
    // Twice the best peer's rate: 2, a lead.
    expect(ratioToBest(2_000, { 'pg-boss': 60, 'graphile-worker': 1_000 }, 'higher').ratio).toBe(2);
  });

  it('take the median of an even number of repetitions as the mean of the middle pair, range untouched', () => {
    expect(summarize([9, 1, 5, 3])).toEqual({ median: 4, min: 1, max: 9, values: [9, 1, 5, 3] });
  });
});

describe('requestCounts', () => {
  it('reads the route and method whatever the label order, and route patterns with parameters', () => {
    const text = [
      'ledgence_http_request_duration_seconds_count{status_class="2xx",method="GET",route="/v1/tasks/:task_id"} 7',
      'ledgence_http_request_duration_seconds_count{method="GET",status_class="4xx",route="/v1/tasks/:task_id"} 2',
    ].join('\n');
    expect(requestCounts(text)).toEqual(new Map([['GET /v1/tasks/:task_id', 9]]));
  });
});
