import { describe, expect, it } from 'vitest';
import { requestCounts, requestsBetween } from './requests.js';

const SCRAPE = `# HELP ledgence_http_request_duration_seconds HTTP request duration
# TYPE ledgence_http_request_duration_seconds histogram
ledgence_http_request_duration_seconds_bucket{le="0.005",route="/v1/worker/acquire:batch",method="POST",status_class="2xx"} 600
ledgence_http_request_duration_seconds_sum{route="/v1/worker/acquire:batch",method="POST",status_class="2xx"} 8.5
ledgence_http_request_duration_seconds_count{route="/v1/worker/acquire:batch",method="POST",status_class="2xx"} 625
ledgence_http_request_duration_seconds_count{route="/v1/worker/acquire:batch",method="POST",status_class="4xx"} 2
ledgence_http_request_duration_seconds_count{route="/v1/worker/settle:batch",method="POST",status_class="2xx"} 630
ledgence_http_request_duration_seconds_count{route="/metrics",method="GET",status_class="2xx"} 40
ledgence_acquire_outcomes_total{disposition="assigned"} 20000
`;

describe('requestCounts', () => {
  it('sums each route’s request counts over status classes, buckets and sums ignored', () => {
    expect(requestCounts(SCRAPE)).toEqual(
      new Map([
        ['POST /v1/worker/acquire:batch', 627],
        ['POST /v1/worker/settle:batch', 630],
      ]),
    );
  });

  it('leaves the scrapes of /metrics out, so reading the counts does not change them', () => {
    expect([...requestCounts(SCRAPE).keys()].some((key) => key.includes('/metrics'))).toBe(false);
  });
});

describe('requestsBetween', () => {
  it('gives the requests added per route, routes without any left out', () => {
    const before = new Map([
      ['POST /a', 10],
      ['POST /b', 5],
    ]);
    const after = new Map([
      ['POST /a', 42],
      ['POST /b', 5],
      ['POST /c', 3],
    ]);
    expect(requestsBetween(before, after)).toEqual(
      new Map([
        ['POST /a', 32],
        ['POST /c', 3],
      ]),
    );
  });
});
