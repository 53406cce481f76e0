/**
 * Reading an HTTP `Retry-After` header (RFC 9110 §10.2.3), for the two clients that honour it:
 * the callback sender (a receiver's answer) and the worker SDK (a gateway's or rate limiter's).
 * Here because both depend on this package and neither may depend on the other.
 */

// delay-seconds is 1*DIGIT. An HTTP-date is one of RFC 9110 §5.6.7's three forms, matched whole:
// Date.parse alone is lenient ("Fri x 2027" is a date to V8, and a "+0500" offset on a form that
// is always GMT is dropped), and a garbage value read as a date delayed a retry by up to the cap
// (review r48b).
const DELAY_SECONDS = /^\d+$/;
const MONTH = '(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)';
const TIME = '\\d{2}:\\d{2}:\\d{2}';
const HTTP_DATE = new RegExp(
  [
    // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
    `^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \\d{2} ${MONTH} \\d{4} ${TIME} GMT$`,
    // obsolete RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
    `^(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day, \\d{2}-${MONTH}-\\d{2} ${TIME} GMT$`,
    // obsolete asctime: Sun Nov  6 08:49:37 1994
    `^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ${MONTH} (?: \\d|\\d{2}) ${TIME} \\d{4}$`,
  ].join('|'),
);

/**
 * The delay a `Retry-After` value asks for, in ms from `nowMs`: delay-seconds or an HTTP-date
 * (a date in the past gives 0), at most `capMs`. `undefined` when absent or malformed (`soon`,
 * `-5`, `1.5`), so a broken header leaves the retry to the caller's backoff.
 *
 * @param nowMs - the time an HTTP-date is read against.
 * @param capMs - the longest delay returned (a long digit run or a far date gives this).
 * @example
 * parseRetryAfterMs('7', Date.now(), 3_600_000); // → 7000
 * parseRetryAfterMs('Wed, 21 Oct 2015 07:28:00 GMT', Date.UTC(2015, 9, 21, 7, 27, 0), 3_600_000); // → 60000
 */
export function parseRetryAfterMs(
  value: string | undefined,
  nowMs: number,
  capMs: number,
): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  let delay: number;
  if (DELAY_SECONDS.test(text)) {
    delay = Number(text) * 1000;
  } else if (HTTP_DATE.test(text)) {
    // HTTP-dates are GMT; asctime() form says so nowhere, and Date.parse would read it as local.
    const at = Date.parse(/ GMT$/.test(text) ? text : `${text} GMT`);
    if (Number.isNaN(at)) return undefined;
    delay = Math.max(0, at - nowMs);
  } else {
    return undefined;
  }
  // Number() of a long digit run is finite or Infinity; min() caps both.
  return Math.min(delay, capMs);
}
