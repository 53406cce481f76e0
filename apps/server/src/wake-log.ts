/**
 * The operator's view of the wake source's LISTEN: while it is not in place, this replica's parked
 * polls see no hint and find new work only by their rescan — a poll then waits up to the rescan
 * interval (or its whole long poll) for a task that is already there. Nothing else says so: the
 * HTTP routes and `/readyz` keep answering.
 */
import { type FailureRunOptions, failureRun } from '@ledgence/core';
import type { WakeListenState } from '@ledgence/store-postgres';
import type { Logger } from 'pino';

/** Options of {@link wakeListenLog}. */
export interface WakeListenLogOptions {
  logger: Logger;
  /** `LEDGENCE_RESCAN_INTERVAL_MS`, named in the lines: what a poll waits at most meanwhile. */
  rescanIntervalMs: number;
  /** Spacing of the log lines of a run of failures (`failureRun`'s options). */
  failureLog?: FailureRunOptions;
}

const CAUSES: Record<Exclude<WakeListenState, { listening: true }>['cause'], string> = {
  closed: 'its connection closed',
  listen_failed: 'LISTEN failed',
  silent: 'its connection stopped answering and is replaced',
};

/**
 * The wake source's `onListenState`, logging as the maintenance loops do: the first loss with its
 * cause, then at most one line a minute with the count, and `… works again` once it is back.
 */
export function wakeListenLog(options: WakeListenLogOptions): (state: WakeListenState) => void {
  const { logger, rescanIntervalMs } = options;
  const run = failureRun(options.failureLog);
  return (state) => {
    if (state.listening) {
      const ended = run.succeeded();
      if (ended > 0) {
        logger.info(
          { failures: ended },
          `wake LISTEN works again after ${ended} failure${ended === 1 ? '' : 's'}: parked polls are woken by hints again`,
        );
      }
      return;
    }
    const { failures, log } = run.failed();
    if (!log) return;
    const fields = { err: state.error, cause: state.cause, failures, rescanIntervalMs };
    if (failures === 1) {
      logger.warn(
        fields,
        `wake LISTEN lost (${CAUSES[state.cause]}); reconnecting — until it is back, parked polls on this replica find new work only by their rescan, every ${rescanIntervalMs} ms`,
      );
    } else {
      logger.warn(
        fields,
        `wake LISTEN still not in place (${failures} failures in a row, last: ${CAUSES[state.cause]}); reconnecting`,
      );
    }
  };
}
