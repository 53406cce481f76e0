/**
 * A pluggable structured logger. Every SDK log line is a fixed message plus
 * a flat object of fields (task id, attempt id, sequence, error…), in that
 * order (as Temporal's SDK logger), which console and winston take as they
 * are; pino and bunyan take fields first, through {@link fieldsFirst}.
 */
import { inspect } from 'node:util';
import type { FailureRun } from '@ledgence/contracts';

/** Structured fields attached to a log line. */
export type LogFields = Record<string, unknown>;

/**
 * The logger the SDK writes to, message first: `console` fits as it is; a pino or bunyan logger
 * goes through {@link fieldsFirst}, or its fields are lost. Calls are made through a guard, so a
 * throwing or async logger cannot break the SDK.
 */
export interface Logger {
  /** Per-task detail, e.g. each settlement sent. */
  debug(message: string, fields?: LogFields): void;
  /** Lifecycle events: starting, stopping, a session opened, a task aborted or refused. */
  info(message: string, fields?: LogFields): void;
  /** Something failed that the SDK retries, works around, or leaves to lease expiry. */
  warn(message: string, fields?: LogFields): void;
  /** A fault to fix: no handler for a program, an unexpected failure, a fatal stop. */
  error(message: string, fields?: LogFields): void;
}

/** A logger whose methods take a line's fields first, then its message: pino's and bunyan's. */
export interface FieldsFirstLogger {
  /** Writes a debug line. */
  debug(fields: LogFields, message: string): unknown;
  /** Writes an info line. */
  info(fields: LogFields, message: string): unknown;
  /** Writes a warning. */
  warn(fields: LogFields, message: string): unknown;
  /** Writes an error. */
  error(fields: LogFields, message: string): unknown;
}

/**
 * `target`, which takes fields first, as a {@link Logger}. Passed as it is, pino reads the SDK's
 * fields object as a format argument for the message and drops it: every line would lose its
 * task and attempt ids. Each level is looked up on every call, so a level changed later holds.
 *
 * @example
 * ```ts
 * // `pino` being the pino package's default export:
 * const worker = new Worker({ ...options, logger: fieldsFirst(pino()) });
 * ```
 */
export function fieldsFirst(target: FieldsFirstLogger): Logger {
  const level =
    (name: keyof FieldsFirstLogger) =>
    (message: string, fields?: LogFields): void => {
      target[name](fields ?? {}, message);
    };
  return { debug: level('debug'), info: level('info'), warn: level('warn'), error: level('error') };
}

const noop = (): void => {};

/** A logger that drops everything. */
export const silentLogger: Logger = Object.freeze({
  debug: noop,
  info: noop,
  warn: noop,
  error: noop,
});

/**
 * The default logger: warnings and errors to the console, the rest dropped, so a misbehaving
 * server or handler is visible without configuration. Each on one line: fields printed as
 * `console.warn(message, fields)` prints them span several once they are long.
 */
export const consoleLogger: Logger = Object.freeze({
  debug: noop,
  info: noop,
  warn: (message: string, fields?: LogFields) =>
    console.warn(`[ledgence] ${message}`, oneLine(fields)),
  error: (message: string, fields?: LogFields) =>
    console.error(`[ledgence] ${message}`, oneLine(fields)),
});

function oneLine(fields: LogFields | undefined): string {
  return inspect(fields ?? {}, { breakLength: Number.POSITIVE_INFINITY, depth: 4 });
}

/**
 * Logs a failed try of a retried run (contracts' `failureRun`): a warning at the run's first and
 * once a minute, with the count so far; debug in between, so an outage is not a warning per try.
 */
export function logRetriedFailure(
  logger: Logger,
  run: FailureRun,
  message: string,
  fields: LogFields,
): void {
  const { failures, log } = run.failed();
  const line = { ...fields, failures };
  if (log) logger.warn(message, line);
  else logger.debug(message, line);
}

/** Ends a run of failures, saying so (`message`, with the count) when there was one. */
export function logRecovered(logger: Logger, run: FailureRun, message: string): void {
  const failures = run.succeeded();
  if (failures > 0) logger.info(message, { failures });
}

/** The fields describing an error in a log line, without throwing on odd values. */
export function errorFields(error: unknown): LogFields {
  if (error instanceof Error) {
    const fields: LogFields = { error: error.message, error_name: error.name };
    const code = (error as { code?: unknown }).code;
    if (typeof code === 'string') fields.error_code = code;
    return fields;
  }
  return { error: String(error) };
}

const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const satisfies readonly (keyof Logger)[];

/**
 * Calls a user logger without letting it break the SDK: a throwing logger
 * must not turn into a lost settlement or an unhandled rejection. A value
 * without the four methods is a `TypeError` (the Worker's and the Client's
 * constructors call this).
 */
export function safeLogger(logger: Logger): Logger {
  // Refused here rather than dropping every warning and error unseen (review r45a): a logger
  // is an object of four methods; `console` and `fieldsFirst(pino())` are.
  const missing = LOG_LEVELS.filter(
    (level) => typeof (logger as Partial<Logger> | null)?.[level] !== 'function',
  );
  if (missing.length > 0) {
    throw new TypeError(
      `logger must have the methods debug, info, warn and error (it lacks ${missing.join(', ')}): pass console, consoleLogger, silentLogger or fieldsFirst(pino())`,
    );
  }
  const wrap =
    (level: keyof Logger) =>
    (message: string, fields?: LogFields): void => {
      try {
        // An async logger type-checks as one returning void; its rejection must not become an
        // unhandled rejection, which ends a Node process by default.
        const returned: unknown = logger[level](message, fields);
        if (typeof (returned as PromiseLike<unknown> | undefined)?.then === 'function') {
          (returned as PromiseLike<unknown>).then(undefined, () => {});
        }
      } catch {
        // Logging is best effort by design.
      }
    };
  return { debug: wrap('debug'), info: wrap('info'), warn: wrap('warn'), error: wrap('error') };
}
