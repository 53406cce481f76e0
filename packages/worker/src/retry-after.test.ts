/**
 * Folding a `Retry-After` (read by @ledgence/contracts' `parseRetryAfterMs`) into a retry's
 * backoff: a pure function, so the values are pinned here; the e2e tests beside it check the
 * waits on real sockets, and the header's reading at the SDK's cap.
 */
import { describe, expect, it } from 'vitest';
import { honourRetryAfter } from './backoff.js';
import { MAX_TIMER_MS } from './timers.js';

describe('honourRetryAfter', () => {
  const policy = { baseMs: 100, maxMs: 5_000 };

  it("raises the backoff's delay to the reply's ask, never lowers it", () => {
    expect(honourRetryAfter(150, 2_000, policy)).toBe(2_000);
    expect(honourRetryAfter(3_000, 1_000, policy)).toBe(3_000);
    expect(honourRetryAfter(150, 0, policy)).toBe(150);
    expect(honourRetryAfter(150, undefined, policy)).toBe(150);
  });

  it("caps the ask at the policy's maxMs", () => {
    expect(honourRetryAfter(150, 3_600_000, policy)).toBe(5_000);
    expect(honourRetryAfter(150, MAX_TIMER_MS, { baseMs: 5, maxMs: 300 })).toBe(300);
  });
});
