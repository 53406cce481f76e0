/**
 * When to extend a worker session. The server decides how long a session lasts
 * (`LEDGENCE_SESSION_VALIDITY_MS`, SESSION_VALIDITY_MS by default) and the wire does not say it:
 * a `WorkerSession` carries only its `expires_at`, in store time, which the worker's clock
 * cannot be compared with. A worker extending at a third of the default validity would lose
 * every session of a server configured shorter (DESIGN §11 lets operators set it), so the
 * worker takes the shorter of its own period and a third of what it learns of the server's
 * validity, from two readings that need no clock sync:
 *
 * - **the reply's `Date`**: `expires_at − Date` is the validity, give or take the header's one
 *   second resolution (and any skew between the server's clock and its database's). Trusted
 *   only from {@link MIN_DATE_VALIDITY_MS}, where that second is at most a third of it.
 * - **a session found expired** (`410 session_expired`, on an extension or a poll): the
 *   validity was at most the time since the request that last set its expiry was sent (the
 *   store read its clock after that). Each such loss shrinks the estimate, so a worker whose
 *   server has very short sessions loses a few at most, then keeps them.
 */

/** The resolution of an HTTP `Date` header (RFC 9110 §5.6.7): whole seconds. */
export const DATE_RESOLUTION_MS = 1_000;

/**
 * The shortest validity read from a `Date` header: below it the header's resolution could be
 * more than a third of the validity, and extending at a third of it could come too late.
 */
export const MIN_DATE_VALIDITY_MS = 3 * DATE_RESOLUTION_MS;

/** The shortest delay between extensions, whatever is learned: a floor against a runaway loop. */
export const MIN_EXTENSION_DELAY_MS = 50;

/**
 * The validity a session reply shows: its `expires_at` (ms since the epoch) less the reply's `Date` (ms since the
 * epoch) and the header's resolution, so never more than the real validity when the server's
 * clock agrees with its database's. `null` when there is no `Date`, or what it shows is under
 * {@link MIN_DATE_VALIDITY_MS}.
 */
export function validityShownBy(expiresAtMs: number, dateMs: number | null): number | null {
  if (dateMs === null) return null;
  const shown = expiresAtMs - dateMs - DATE_RESOLUTION_MS;
  return Number.isFinite(shown) && shown >= MIN_DATE_VALIDITY_MS ? shown : null;
}

/** The smaller of two validity estimates, either of which may be unknown. */
export function shorterValidity(a: number | null, b: number | null): number | null {
  if (a === null) return b;
  if (b === null) return a;
  return Math.min(a, b);
}

/**
 * The delay until the next extension: the worker's own period, or a third of the server's
 * validity when that is shorter (two chances to extend before the session lapses), never under
 * {@link MIN_EXTENSION_DELAY_MS}.
 */
export function extensionDelayMs(periodMs: number, validityMs: number | null): number {
  const delay = validityMs === null ? periodMs : Math.min(periodMs, Math.floor(validityMs / 3));
  return Math.max(MIN_EXTENSION_DELAY_MS, delay);
}
