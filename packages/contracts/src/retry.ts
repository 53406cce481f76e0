import { createHash } from 'node:crypto';
import { ContractError } from './errors.js';

/**
 * The fields of a retry policy the delay depends on. Structural, so that both
 * the wire `RetryPolicy` and a defaults-applied copy can be passed.
 */
export interface RetryDelayPolicy {
  /** Fixed delay, or the first exponential delay. */
  delay_ms: number;
  /** Absent means fixed: the a3s encoding omits `backoff` for fixed policies. */
  backoff?: 'fixed' | 'exponential' | undefined;
  /** Exponential cap; zero or absent for fixed policies. */
  max_delay_ms?: number | undefined;
}

/**
 * Domain tag of the jitter hash. Versioned: changing the derivation must not
 * silently move the retry times of tasks already scheduled under v1.
 */
const JITTER_DOMAIN = 'ledgence.retry-jitter.v1';

/** Exponents above 63 cannot change a capped delay; the seed saturates there too. */
const MAX_EXPONENT = 63;

/**
 * A delay in `1..=cap` chosen from SHA-256 over the domain tag, each identity
 * length-prefixed (u64 big-endian), and the failed attempt (u32 big-endian):
 * the a3s seed's `deterministic_full_jitter`. Restarts and replicas therefore
 * reach the same backoff decision without sharing random state.
 *
 * @param cap - inclusive upper bound, a safe integer ≥ 1.
 * @param identities - immutable ids of what is retried (e.g. run id and task id).
 * @param failedAttempt - the 1-based ordinal of the attempt that failed.
 */
export function deterministicFullJitter(
  cap: number,
  identities: readonly string[],
  failedAttempt: number,
): number {
  if (!Number.isSafeInteger(cap) || cap < 1) {
    throw new ContractError('invalid_input', 'jitter cap must be a safe integer >= 1', {
      reason: 'invalid_retry_policy',
    });
  }
  const hash = createHash('sha256');
  hash.update(JITTER_DOMAIN);
  for (const identity of identities) {
    const bytes = Buffer.from(identity, 'utf8');
    const length = Buffer.alloc(8);
    length.writeBigUInt64BE(BigInt(bytes.length));
    hash.update(length);
    hash.update(bytes);
  }
  const attempt = Buffer.alloc(4);
  attempt.writeUInt32BE(failedAttempt >>> 0);
  hash.update(attempt);
  const sample = hash.digest().readBigUInt64BE(0);
  return 1 + Number(sample % BigInt(cap));
}

/**
 * The exponential cap for a failed attempt: `delay_ms · 2^(attempt−1)`,
 * bounded by `max_delay_ms`.
 */
export function exponentialCap(policy: RetryDelayPolicy, failedAttempt: number): number {
  const exponent = Math.min(Math.max(failedAttempt - 1, 0), MAX_EXPONENT);
  // Doubling a safe integer stays exact in binary floating point, and the
  // min() below brings it back under the (safe) maximum.
  return Math.min(policy.delay_ms * 2 ** exponent, policy.max_delay_ms ?? 0);
}

/**
 * Throws unless the policy's delays are coherent: a fixed policy defines no
 * nonzero `max_delay_ms`; an exponential one needs `1 ≤ delay_ms ≤ max_delay_ms`.
 */
export function assertRetryDelays(policy: RetryDelayPolicy): void {
  const fail = (message: string): never => {
    throw new ContractError('invalid_input', message, { reason: 'invalid_retry_policy' });
  };
  if (policy.backoff === 'exponential') {
    const max = policy.max_delay_ms ?? 0;
    if (!(policy.delay_ms >= 1 && max >= policy.delay_ms)) {
      fail('exponential retry delays must satisfy 1 <= delay_ms <= max_delay_ms');
    }
  } else if ((policy.max_delay_ms ?? 0) !== 0) {
    fail('a fixed retry policy cannot define max_delay_ms');
  }
}

/**
 * How long to wait before the next attempt after `failedAttempt` (1-based)
 * failed. Fixed policies wait `delay_ms` (zero means at once); exponential
 * policies pick a deterministic full-jitter delay in `1..=cap`, where the cap
 * doubles per failed attempt up to `max_delay_ms` (the a3s seed's
 * `delay_for_step`, with the task's immutable ids in place of run and step).
 *
 * @example
 * retryDelayMs({ delay_ms: 100, backoff: 'exponential', max_delay_ms: 400 }, 3, ['run_1', 'task_1']);
 * // → a stable value in 1..400
 */
export function retryDelayMs(
  policy: RetryDelayPolicy,
  failedAttempt: number,
  identities: readonly string[],
): number {
  assertRetryDelays(policy);
  if (policy.backoff !== 'exponential') return policy.delay_ms;
  return deterministicFullJitter(exponentialCap(policy, failedAttempt), identities, failedAttempt);
}
