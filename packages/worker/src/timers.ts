/**
 * Bounds of the SDK's timers. Node keeps a timer's delay in a signed 32-bit integer: `setTimeout`
 * and `setInterval` run a longer delay after 1 ms (with a warning), and `AbortSignal.timeout`
 * throws a RangeError. A caller's "wait very long" (a 30-day request timeout, `Infinity`, a long
 * shutdown grace) would then fail or spin at once, so every delay the SDK arms goes through
 * {@link timerDelay}.
 */

/** The longest delay a Node timer holds: 2^31−1 ms, about 24.8 days. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * `ms` as a delay a timer can hold: at most {@link MAX_TIMER_MS} (so `Infinity` waits as long as a
 * timer can), and 0 for a negative or `NaN` delay (due now).
 */
export function timerDelay(ms: number): number {
  return ms > 0 ? Math.min(ms, MAX_TIMER_MS) : 0;
}
