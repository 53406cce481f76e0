/** Reading a `Retry-After` header (RFC 9110 §10.2.3): what the callback sender and the SDK share. */
import { describe, expect, it } from 'vitest';
import { parseRetryAfterMs } from './retry-after.js';

const CAP = 2 ** 31 - 1;

describe('parseRetryAfterMs', () => {
  const now = Date.UTC(2015, 9, 21, 7, 27, 0);

  it('reads delay-seconds', () => {
    expect(parseRetryAfterMs('7', now, CAP)).toBe(7_000);
    expect(parseRetryAfterMs(' 0 ', now, CAP)).toBe(0);
    expect(parseRetryAfterMs('120', now, CAP)).toBe(120_000);
  });

  it('reads the three HTTP-date forms against the given now', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:28:00 GMT', now, CAP)).toBe(60_000);
    expect(parseRetryAfterMs('Wednesday, 21-Oct-15 07:28:00 GMT', now, CAP)).toBe(60_000);
    // asctime() carries no zone but means GMT, whatever the local time zone is.
    expect(parseRetryAfterMs('Wed Oct 21 07:28:00 2015', now, CAP)).toBe(60_000);
  });

  it('gives 0 for a date in the past, and keeps a long delay within the cap', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:00:00 GMT', now, CAP)).toBe(0);
    expect(parseRetryAfterMs('3600', now, CAP)).toBe(3_600_000);
    expect(parseRetryAfterMs('9'.repeat(400), now, CAP)).toBe(CAP);
    expect(parseRetryAfterMs('Fri, 31 Dec 9999 23:59:59 GMT', now, CAP)).toBe(CAP);
  });

  it('ignores what is absent or malformed, leaving the retry to the backoff', () => {
    for (const value of [undefined, '', 'soon', '-5', '7.5', '1e3', '0x10', 'Wed, 99 Foo 2015']) {
      expect(parseRetryAfterMs(value, now, CAP)).toBeUndefined();
    }
  });

  it('reads a date only in one of the three forms whole, not whatever Date.parse takes (found by review r48b)', () => {
    // V8 reads each of these as a date; as a wait they were up to the cap (an hour for the sender).
    for (const value of [
      'Fri x 2027',
      'Sun 2030',
      'Thu, 01 Jan 2026 00:10:00 +0500',
      'Wed, 21 Oct 2015 07:28:00',
      'Wed, 21 Oct 2015 07:28:00 GMT trailing',
      'Wednesday, 21 Oct 2015 07:28:00 GMT',
      'Wed Oct 21 07:28:00 2015 GMT',
    ]) {
      expect(parseRetryAfterMs(value, now, CAP), value).toBeUndefined();
    }
    expect(parseRetryAfterMs('Wed Oct  1 07:28:00 2015', now, CAP)).toBe(0);
  });
});

describe('parseRetryAfterMs: the three date forms of one instant (review r49a)', () => {
  const CAP_HOUR = 3_600_000;
  const now = Date.UTC(2026, 0, 1, 0, 0, 0);
  it('reads each form of one instant alike, asctime with a one-digit day and RFC 850 with a two-digit year', () => {
    const at = Date.UTC(2026, 0, 1, 0, 10, 0);
    for (const value of [
      'Thu, 01 Jan 2026 00:10:00 GMT',
      'Thursday, 01-Jan-26 00:10:00 GMT',
      'Thu Jan  1 00:10:00 2026',
      '  Thu Jan  1 00:10:00 2026 ',
    ]) {
      expect(parseRetryAfterMs(value, now, CAP_HOUR), value).toBe(at - now);
    }
    expect(parseRetryAfterMs('Wed Dec 31 23:00:00 2025', now, CAP_HOUR)).toBe(0);
    expect(parseRetryAfterMs('Sat, 31 Jan 2026 00:00:00 GMT', now, CAP_HOUR)).toBe(CAP_HOUR);
  });

  it('reads asctime as GMT whatever the local zone, and refuses impossible fields', () => {
    expect(parseRetryAfterMs('Thu Jan 01 00:00:30 2026', now, CAP_HOUR)).toBe(30_000);
    for (const value of [
      'Thu, 00 Jan 2026 00:10:00 GMT',
      'Thu, 1 Jan 2026 00:10:00 GMT',
      'Thu Jan 1 00:10:00 2026',
      'Thu, 01 jan 2026 00:10:00 GMT',
      'Thu, 01 Jan 2026 00:10:00 gmt',
      'Thursday, 01-Jan-2026 00:10:00 GMT',
    ]) {
      expect(parseRetryAfterMs(value, now, CAP_HOUR), value).toBeUndefined();
    }
  });
});
