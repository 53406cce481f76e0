/**
 * When a failed delivery is tried again (DESIGN §8): capped exponential
 * backoff with deterministic full jitter from the retry base
 * (`LEDGENCE_COMPLETION_RETRY_BASE_MS`) up to COMPLETION_MAX_RETRY_DELAY_MS,
 * a receiver's `Retry-After` honoured as a floor, and `exhausted` after
 * COMPLETION_MAX_ATTEMPTS tries of a generation. Pure: the leasing loop calls
 * these with the outcome of `deliverEvent` and writes the result.
 */
import {
  COMPLETION_MAX_ATTEMPTS,
  COMPLETION_MAX_RETRY_DELAY_MS,
  COMPLETION_RETRY_BASE_MS,
  deterministicFullJitter,
  exponentialCap,
} from '@ledgence/contracts';
import type { DeliveryOutcome } from './deliver.js';

/** Options of {@link nextDeliveryDelayMs}. */
export interface NextDeliveryDelayOptions {
  /** The 1-based ordinal, within the generation, of the try that just failed. */
  attempt: number;
  /** The first backoff cap, in ms (1..COMPLETION_MAX_RETRY_DELAY_MS); COMPLETION_RETRY_BASE_MS by default. */
  baseMs?: number;
  /** The event id: the jitter's identity, so every replica computes the same delay. */
  eventId: string;
  /** The receiver's `Retry-After` in ms, if it sent a valid one: a floor on the delay. */
  retryAfterMs?: number;
}

/**
 * How long to wait after failed try `attempt` before the next: a
 * deterministic full-jitter delay in `1..cap`, where the cap is
 * `baseMs · 2^(attempt−1)` up to COMPLETION_MAX_RETRY_DELAY_MS, raised to
 * `retryAfterMs` if the receiver asked for longer, and never above
 * COMPLETION_MAX_RETRY_DELAY_MS. Full jitter spreads the retries of many
 * deliveries that failed together (a receiver outage); determinism (SHA-256
 * of event id and attempt) means a restart or another replica reaches the same
 * schedule. Throws a `RangeError` for an attempt below 1 or a base outside
 * 1..COMPLETION_MAX_RETRY_DELAY_MS.
 *
 * @example
 * nextDeliveryDelayMs({ attempt: 3, baseMs: 5_000, eventId: 'evt_1' }); // → a stable value in 1..20 000
 * nextDeliveryDelayMs({ attempt: 1, eventId: 'evt_1', retryAfterMs: 60_000 }); // → 60 000
 */
export function nextDeliveryDelayMs(options: NextDeliveryDelayOptions): number {
  const { attempt, eventId, retryAfterMs } = options;
  const baseMs = options.baseMs ?? COMPLETION_RETRY_BASE_MS;
  if (!Number.isSafeInteger(attempt) || attempt < 1) {
    throw new RangeError('attempt must be an integer >= 1');
  }
  if (!Number.isSafeInteger(baseMs) || baseMs < 1 || baseMs > COMPLETION_MAX_RETRY_DELAY_MS) {
    throw new RangeError(`baseMs must be an integer from 1 to ${COMPLETION_MAX_RETRY_DELAY_MS}`);
  }
  const cap = exponentialCap(
    { delay_ms: baseMs, backoff: 'exponential', max_delay_ms: COMPLETION_MAX_RETRY_DELAY_MS },
    attempt,
  );
  const jittered = deterministicFullJitter(cap, [eventId], attempt);
  const floor =
    retryAfterMs !== undefined && Number.isFinite(retryAfterMs) && retryAfterMs > 0
      ? Math.ceil(retryAfterMs)
      : 0;
  return Math.min(Math.max(jittered, floor), COMPLETION_MAX_RETRY_DELAY_MS);
}

/**
 * Whether a generation that has made `attempt` tries has used them all
 * (COMPLETION_MAX_ATTEMPTS), so a failed try ends it as `exhausted`.
 *
 * @example
 * isExhausted(11); // → false
 * isExhausted(12); // → true
 */
export function isExhausted(attempt: number): boolean {
  return attempt >= COMPLETION_MAX_ATTEMPTS;
}

/** Options of {@link nextDeliveryState}. */
export interface NextDeliveryStateOptions {
  /** The outcome of the try. */
  outcome: DeliveryOutcome;
  /** The 1-based ordinal, within the generation, of that try. */
  attempt: number;
  /** The event id (the jitter's identity). */
  eventId: string;
  /** The retry base; COMPLETION_RETRY_BASE_MS by default. */
  baseMs?: number;
}

/**
 * What the subscription becomes after a try: `delivered`; `exhausted` on 410
 * Gone or when the failed try was the generation's last; otherwise `due`
 * again after `delayMs` ({@link nextDeliveryDelayMs}).
 */
export type NextDeliveryState =
  | { readonly state: 'delivered' }
  | { readonly state: 'exhausted' }
  | { readonly state: 'due'; readonly delayMs: number };

/**
 * The state the leasing loop writes after one try of `deliverEvent`,
 * together with the outcome's status and error.
 *
 * @example
 * const next = nextDeliveryState({ outcome, attempt: row.attempts + 1, eventId: row.event_id });
 * // → { state: 'due', delayMs: 3817 } after a 500 on the first try
 */
export function nextDeliveryState(options: NextDeliveryStateOptions): NextDeliveryState {
  const { outcome, attempt, eventId, baseMs } = options;
  if (outcome.kind === 'delivered') return { state: 'delivered' };
  if (outcome.kind === 'gone' || isExhausted(attempt)) return { state: 'exhausted' };
  const delayMs = nextDeliveryDelayMs({
    attempt,
    eventId,
    baseMs,
    retryAfterMs: outcome.retryAfterMs,
  });
  return { state: 'due', delayMs };
}
