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

/**
 * A function that gathers what it is given during one turn of the event loop and hands it all
 * to `flush` at the turn's end (`setImmediate`), once per item: what asks together (the leases of
 * one poll asking for dispatch, leases due together) goes out in one request, not one each.
 */
export function perTurn<T>(flush: (items: T[]) => void): (item: T) => void {
  const pending = new Set<T>();
  return (item) => {
    pending.add(item);
    if (pending.size > 1) return;
    setImmediate(() => {
      const items = [...pending];
      pending.clear();
      flush(items);
    });
  };
}
