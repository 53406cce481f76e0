/**
 * Reading a `Retry-After` header (RFC 9110 §10.2.3) and folding it into a retry's backoff: pure
 * functions, so the values are pinned here; the e2e tests beside them check the waits on real
 * sockets.
 */
import { describe, expect, it } from 'vitest';
import { honourRetryAfter } from './backoff.js';
import { parseRetryAfterMs } from './http.js';
import { MAX_TIMER_MS } from './timers.js';

describe('parseRetryAfterMs', () => {
  const now = Date.UTC(2015, 9, 21, 7, 27, 0);

  it('reads delay-seconds', () => {
    expect(parseRetryAfterMs('7', now)).toBe(7_000);
    expect(parseRetryAfterMs(' 0 ', now)).toBe(0);
    expect(parseRetryAfterMs('120', now)).toBe(120_000);
  });

  it('reads the three HTTP-date forms against the given now', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:28:00 GMT', now)).toBe(60_000);
    expect(parseRetryAfterMs('Wednesday, 21-Oct-15 07:28:00 GMT', now)).toBe(60_000);
    // asctime() carries no zone but means GMT, whatever the local time zone is.
    expect(parseRetryAfterMs('Wed Oct 21 07:28:00 2015', now)).toBe(60_000);
  });

  it('gives 0 for a date in the past, and keeps a long delay within what a timer holds', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:00:00 GMT', now)).toBe(0);
    expect(parseRetryAfterMs('3600', now)).toBe(3_600_000);
    expect(parseRetryAfterMs('9'.repeat(400), now)).toBe(MAX_TIMER_MS);
    expect(parseRetryAfterMs('Fri, 31 Dec 9999 23:59:59 GMT', now)).toBe(MAX_TIMER_MS);
  });

  it('ignores what is absent or malformed, leaving the retry to the backoff', () => {
    for (const value of [undefined, '', 'soon', '-5', '7.5', '1e3', '0x10', 'Wed, 99 Foo 2015']) {
      expect(parseRetryAfterMs(value, now)).toBeUndefined();
    }
  });
});

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
