/**
 * Jittered exponential backoff for retrying replay-safe requests. Pure: the
 * random source is injected, so tests pin it.
 */
import { retryAfterOf } from './errors.js';

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
 * `policy` checked as a constructor option (undefined: {@link DEFAULT_BACKOFF}): `baseMs` a
 * finite number > 0, so a retry never spins at 0 ms, and `maxMs` a finite number ≥ `baseMs`, so
 * every retry's delay is bounded. Returns a copy, so a later change to the caller's object cannot
 * bypass the check. Throws a `TypeError` saying what to fix.
 */
export function checkedBackoff(policy: BackoffPolicy | undefined): BackoffPolicy {
  if (policy === undefined) return DEFAULT_BACKOFF;
  if (typeof policy !== 'object' || policy === null) {
    throw new TypeError('backoff must be an object { baseMs, maxMs }');
  }
  const { baseMs, maxMs } = policy;
  if (typeof baseMs !== 'number' || !Number.isFinite(baseMs) || baseMs <= 0) {
    throw new TypeError('backoff.baseMs must be a finite number > 0');
  }
  if (typeof maxMs !== 'number' || !Number.isFinite(maxMs) || maxMs < baseMs) {
    throw new TypeError('backoff.maxMs must be a finite number ≥ backoff.baseMs');
  }
  return Object.freeze({ baseMs, maxMs });
}

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

/**
 * The delay before a retry whose failed reply asked to wait `retryAfterMs` (its `Retry-After`;
 * `undefined`: it asked nothing): `delayMs`, the backoff's own choice, raised to the reply's ask
 * but never beyond `policy.maxMs`. The cap keeps every wait within what the caller configured: a
 * rate limiter answering `Retry-After: 3600` does not park a call (or a worker's polls) for an
 * hour; the error still carries what was asked, for a caller that wants to wait it out.
 *
 * @example
 * honourRetryAfter(150, 2_000, { baseMs: 100, maxMs: 5_000 }); // → 2000
 * honourRetryAfter(150, 60_000, { baseMs: 100, maxMs: 5_000 }); // → 5000
 */
export function honourRetryAfter(
  delayMs: number,
  retryAfterMs: number | undefined,
  policy: BackoffPolicy = DEFAULT_BACKOFF,
): number {
  if (retryAfterMs === undefined || !(retryAfterMs > 0)) return delayMs;
  return Math.max(delayMs, Math.min(retryAfterMs, policy.maxMs));
}

/**
 * The delay before retry number `failures` after `error`: {@link backoffDelay}, raised to the
 * failed reply's `Retry-After` ({@link honourRetryAfter}, up to `policy.maxMs`). Every retry loop
 * of the SDK waits this.
 *
 * @param random - a source of uniform numbers in [0, 1); `Math.random` by default.
 */
export function retryDelay(
  failures: number,
  error: unknown,
  policy: BackoffPolicy = DEFAULT_BACKOFF,
  random: () => number = Math.random,
): number {
  return honourRetryAfter(backoffDelay(failures, policy, random), retryAfterOf(error), policy);
}
