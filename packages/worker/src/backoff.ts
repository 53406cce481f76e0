/**
 * Jittered exponential backoff for retrying replay-safe requests. Pure: the
 * random source is injected, so tests pin it.
 */

/** A backoff schedule: `base * 2^(n-1)`, capped, with full jitter. */
export interface BackoffPolicy {
  /** The first delay's upper bound. */
  baseMs: number;
  /** The cap of every delay. */
  maxMs: number;
}

/** The SDK's default: 100 ms doubling to 5 s, so an outage is probed often but not hammered. */
export const DEFAULT_BACKOFF: Readonly<BackoffPolicy> = Object.freeze({
  baseMs: 100,
  maxMs: 5_000,
});

/**
 * The delay before retry number `failures` (1 = after the first failure):
 * full jitter in `[ceiling/2, ceiling]` where `ceiling = min(max, base *
 * 2^(failures-1))`. Half the ceiling is kept as a floor so a retry storm
 * after a shared outage still spreads out but never spins at 0 ms.
 *
 * @param random - a source of uniform numbers in [0, 1); `Math.random` by default.
 */
export function backoffDelay(
  failures: number,
  policy: BackoffPolicy = DEFAULT_BACKOFF,
  random: () => number = Math.random,
): number {
  const exponent = Math.min(Math.max(failures, 1) - 1, 30);
  const ceiling = Math.min(policy.maxMs, policy.baseMs * 2 ** exponent);
  const r = Math.min(Math.max(random(), 0), 1);
  return Math.round(ceiling / 2 + (ceiling / 2) * r);
}
