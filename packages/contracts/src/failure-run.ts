/**
 * How a background loop that retries a failing dependency (the server's maintenance loops, the
 * callback sender's leasing, the worker SDK's polls and renewals) decides which of its failures
 * to log. An outage fails every pass of every loop: logged each time, that was a warning with a
 * stack a second per loop (lease recovery and table statistics run every second by default, the
 * sender's leasing backs off to 5 s, a worker's polls to 5 s), burying the one line that says
 * what is wrong. Of a run of consecutive failures the first is logged, then at most one per
 * interval with the count so far, and the first success after them says how many there were.
 */

/**
 * While passes keep failing, the least time between two of their log lines by default: one a
 * minute still says the loop is failing, how long, and with which error.
 */
export const FAILURE_LOG_INTERVAL_MS = 60_000;

/** Options of {@link failureRun}. */
export interface FailureRunOptions {
  /** The least time between two logged failures of one run ({@link FAILURE_LOG_INTERVAL_MS}). */
  logIntervalMs?: number;
  /** A monotonic clock in ms, `performance.now` by default (a wall-clock step must not matter). */
  now?: () => number;
}

/** What {@link FailureRun.failed} says of a failure. */
export interface FailureVerdict {
  /** Consecutive failures so far, this one included. */
  failures: number;
  /** Whether to log this one: the run's first, or the first a log interval after the last logged. */
  log: boolean;
}

/** The run of consecutive failures of one loop. */
export interface FailureRun {
  /** Counts a failure and says whether to log it. */
  failed(): FailureVerdict;
  /** Ends the run: the failures it ended (0 when the previous pass succeeded too; log when > 0). */
  succeeded(): number;
}

/**
 * Tracks a loop's consecutive failures for its log.
 *
 * @example
 * ```ts
 * const run = failureRun();
 * try {
 *   await pass();
 *   const ended = run.succeeded();
 *   if (ended > 0) logger.info({ failures: ended }, 'the pass works again');
 * } catch (err) {
 *   const { failures, log } = run.failed();
 *   if (log) logger.warn({ err, failures }, 'the pass failed; retrying');
 * }
 * ```
 */
export function failureRun(options: FailureRunOptions = {}): FailureRun {
  const now = options.now ?? (() => performance.now());
  const logIntervalMs = options.logIntervalMs ?? FAILURE_LOG_INTERVAL_MS;
  let failures = 0;
  let loggedAt = 0;
  return {
    failed() {
      failures += 1;
      const at = now();
      const log = failures === 1 || at - loggedAt >= logIntervalMs;
      if (log) loggedAt = at;
      return { failures, log };
    },
    succeeded() {
      const ended = failures;
      failures = 0;
      return ended;
    },
  };
}
