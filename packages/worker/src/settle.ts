/**
 * Settlement as pure functions: the stable operation id, the report a
 * handler's outcome becomes, local validation of the command, and how a
 * failed settle request is classified.
 *
 * Rules:
 * - `operation_id` is derived from the attempt id alone, so a re-sent
 *   settlement (after a lost reply, or from a retry loop) carries the same id
 *   and the same bytes: the server answers `already_accepted`, never a second
 *   settlement. The command is built once per attempt and re-sent verbatim.
 * - Retry (jittered backoff) on transport errors, 5xx and `unavailable`.
 * - Accepted: a `SettleReply`, `already_accepted` or not.
 * - Split: `payload_too_large` for a request of several settlements says only
 *   that they do not fit together: each is sent again in a request of its own.
 * - Definitive: `ownership_lost` (the lease ended; recovery decides),
 *   `conflict` (another settlement of this attempt was recorded), `not_found`,
 *   and every other 4xx (`payload_too_large` of a settlement sent alone
 *   included): the same bytes would meet the same answer.
 */
import { createHash } from 'node:crypto';
import {
  type AttemptReport,
  ContractError,
  type ExecutionFailureKind,
  fitText,
  type LeaseOwner,
  MESSAGE_MAX_BYTES,
  OPERATION_ID_MAX_BYTES,
  type Quiescence,
  type SettleCommand,
  utf8ByteLength,
  validateSettleCommand,
  type ApplicationError as WireApplicationError,
} from '@ledgence/contracts';
import { ApplicationError, ProblemError, ProtocolError, TransportError } from './errors.js';

const OPERATION_PREFIX = 'settle:';

/**
 * The settlement operation id of an attempt: `settle:<attempt_id>`, or
 * `settle:sha256:<hex>` of the attempt id when that would exceed
 * OPERATION_ID_MAX_BYTES. Stable across retries and process restarts.
 */
export function operationIdFor(attemptId: string): string {
  const plain = `${OPERATION_PREFIX}${attemptId}`;
  if (utf8ByteLength(plain) <= OPERATION_ID_MAX_BYTES) return plain;
  return `${OPERATION_PREFIX}sha256:${createHash('sha256').update(attemptId, 'utf8').digest('hex')}`;
}

/** Why a running handler's signal was aborted. */
export type AbortCause = 'cancelled' | 'lease_lost' | 'timeout' | 'shutdown';

/** How a handler ended, as the runtime observed it. */
export type HandlerOutcome =
  | { kind: 'returned'; value: unknown }
  /**
   * `ownAbort`: what it threw is the abort's own reason (let through, e.g. by
   * `signal.throwIfAborted()` or an aborted `fetch`), which says nothing the cause does not.
   */
  | { kind: 'threw'; error: unknown; aborted: AbortCause | null; ownAbort?: boolean }
  /**
   * Still running when it had to be reported: past the shutdown deadline, or past the abort
   * grace after its budget ran out (`aborted: 'timeout'`).
   */
  | { kind: 'abandoned'; aborted?: AbortCause | null };

/** The identity a report names. */
export interface ReportIdentity {
  taskId: string;
  attemptId: string;
  activationId?: string | undefined;
}

/**
 * A message safe for the wire: non-empty, well-formed Unicode, no control characters, and within
 * the server's MESSAGE_MAX_BYTES of UTF-8 (a longer one is cut at a character boundary and ends
 * with `…`). A message the server refuses would turn the report into a non-retryable failure.
 */
export function wireMessage(text: unknown, fallback: string): string {
  const raw = typeof text === 'string' ? text : '';
  // biome-ignore lint/suspicious/noControlCharactersInRegex: stripping them is the point
  const clean = raw.replace(/[\u0000-\u001f\u007f]+/g, ' ').trim();
  const bounded = fitText(clean, MESSAGE_MAX_BYTES);
  return bounded.length > 0 ? bounded : fallback;
}

/** An execution failure report. */
export function failureReport(
  kind: ExecutionFailureKind,
  message: string,
  retryable: boolean,
): AttemptReport {
  return { kind: 'failed', report: { kind, message: wireMessage(message, kind), retryable } };
}

function identityOf(identity: ReportIdentity) {
  return identity.activationId === undefined
    ? { task_id: identity.taskId, attempt_id: identity.attemptId }
    : {
        task_id: identity.taskId,
        attempt_id: identity.attemptId,
        activation_id: identity.activationId,
      };
}

/** The message of a thrown value that cannot be turned into text. */
const UNDESCRIBABLE = 'the handler threw a value that cannot be turned into text';

/**
 * The wire form of a thrown {@link ApplicationError}, or `undefined` for any other value.
 * Reading a thrown value runs the handler's code (its brand lookup and getters may throw, or be
 * a Proxy's traps): a value that throws here is reported like any other unexpected throw.
 */
function applicationErrorOf(error: unknown): WireApplicationError | undefined {
  try {
    if (!(error instanceof ApplicationError)) return undefined;
    const appError: WireApplicationError = {
      code: error.code,
      message: wireMessage(error.message, error.code),
      retryable: error.retryable,
    };
    const details = error.details;
    if (details !== undefined) {
      // Checked as plain JSON by settleCommandFor before anything is sent.
      appError.details = details as WireApplicationError['details'];
    }
    return appError;
  } catch {
    return undefined;
  }
}

/**
 * The message of any other thrown value. `String()` throws for a value without a prototype or
 * whose `toString`/`Symbol.toPrimitive`/`message` throws; the report must be built anyway, or
 * the attempt would be left to lease expiry.
 */
function describeThrown(error: unknown): string {
  try {
    return wireMessage(thrownText(error), 'failed');
  } catch {
    return UNDESCRIBABLE;
  }
}

/**
 * An Error's message; for a plain object thrown in its place (`throw { code, message }`, as some
 * libraries do), its `message` when a string, else its JSON — `String()` made it
 * `[object Object]`, which tells the one reading the task's outcome nothing.
 */
function thrownText(error: unknown): string {
  if (error instanceof Error) return error.message;
  if (typeof error === 'object' && error !== null) {
    const message = (error as { message?: unknown }).message;
    if (typeof message === 'string') return message;
    const text = String(error);
    if (text !== '[object Object]') return text;
    try {
      return JSON.stringify(error) ?? text;
    } catch {
      return text; // circular, or a toJSON that throws
    }
  }
  return String(error);
}

/**
 * The report of a handler's outcome: a return value → `completed/success`; a
 * thrown {@link ApplicationError} → `completed/application_error`; any other
 * throw → `failed`, `crashed` and retryable. A throw once the signal had been
 * aborted — an `ApplicationError` too — is reported by why it was (cancel →
 * `cancelled`, shutdown → `cancelled` retryable, timeout → `timed_out`
 * retryable, a lease lost → `crashed` retryable): a handler that wraps its aborted call's error as its own, not
 * retryable, must not fail the task for good because of a deploy or a budget
 * that is retried by design (review r45a). Still running at the shutdown
 * deadline → `cancelled`, retryable; still running past its budget →
 * `timed_out`, retryable; cancelled and still running → `cancelled`.
 * Never throws, whatever was thrown.
 */
export function reportFor(
  identity: ReportIdentity,
  outcome: HandlerOutcome,
  times: { startedAt: number; finishedAt: number },
): AttemptReport {
  const context = { identity: identityOf(identity) };
  const at = { started_at: times.startedAt, finished_at: times.finishedAt };
  if (outcome.kind === 'returned') {
    // `undefined` (a handler without a return value) is reported as JSON null.
    const output = outcome.value === undefined ? null : outcome.value;
    return { kind: 'completed', report: { context, outcome: { kind: 'success', output }, ...at } };
  }
  if (outcome.kind === 'abandoned') {
    switch (outcome.aborted) {
      case 'timeout':
        return failureReport(
          'timed_out',
          'the execution budget ran out and the handler has not returned (it may still run)',
          true,
        );
      case 'cancelled':
        return failureReport(
          'cancelled',
          'the task was cancelled and the handler has not returned (it may still run)',
          false,
        );
      default:
        return failureReport(
          'cancelled',
          'the worker shut down while the handler was running',
          true,
        );
    }
  }
  const appError = outcome.aborted === null ? applicationErrorOf(outcome.error) : undefined;
  if (appError !== undefined) {
    return {
      kind: 'completed',
      report: { context, outcome: { kind: 'application_error', error: appError }, ...at },
    };
  }
  const message = describeThrown(outcome.error);
  // The cause first; then what the handler threw, unless that was the abort's own reason, whose
  // message only repeats the cause ("the execution budget ran out: the attempt's execution …").
  const because = (cause: string) => (outcome.ownAbort === true ? cause : `${cause}: ${message}`);
  switch (outcome.aborted) {
    case 'cancelled':
      return failureReport('cancelled', because('cancelled'), false);
    case 'shutdown':
      return failureReport('cancelled', because('the worker shut down'), true);
    case 'timeout':
      return failureReport('timed_out', because('the execution budget ran out'), true);
    case 'lease_lost':
      return failureReport('crashed', because('the lease was lost'), true);
    default:
      return failureReport('crashed', message, true);
  }
}

/**
 * The settle command of an attempt, validated locally with the same rules as
 * the server's decoder. A report the server would refuse (an output that is
 * not plain JSON, or too large; an error code that is not valid text) is
 * replaced by a non-retryable `crashed` failure saying why, so a bad return
 * value fails the task visibly instead of leaving its lease to expire.
 */
export function settleCommandFor(
  owner: LeaseOwner,
  report: AttemptReport,
  quiescence: Quiescence = 'confirmed',
): SettleCommand {
  const command = {
    owner,
    operation_id: operationIdFor(owner.attempt_id),
    report,
    quiescence,
    processing_trace: null,
  };
  try {
    return detached(validateSettleCommand(command));
  } catch (error) {
    if (!(error instanceof ContractError)) throw error;
    const kept = withoutDetails(command, error);
    if (kept !== undefined) return kept;
    return validateSettleCommand({
      ...command,
      report: failureReport(
        'crashed',
        `the handler's result could not be reported: ${error.message}`,
        false,
      ),
    });
  }
}

/** How much of the reason a {@link withoutDetails} note quotes: a path and a rule, never more. */
const NOTE_CAUSE_MAX_BYTES = 512;

/**
 * An application error whose only fault is its `details` (not plain JSON, too large) is still
 * the error the handler meant, with its code and retry decision: it is reported without the
 * details, its message saying why, rather than turned into a non-retryable crash that would
 * drop the retry the handler asked for. `undefined` when anything else is wrong.
 */
function withoutDetails(command: SettleCommand, error: ContractError): SettleCommand | undefined {
  const { report } = command;
  if (report.kind !== 'completed' || report.report.outcome.kind !== 'application_error') return;
  const { details, ...rest } = report.report.outcome.error;
  if (details === undefined || details === null) return;
  // The message is cut, not the note: a message at the limit would otherwise lose the reason.
  const note = ` (its details could not be reported: ${fitText(error.message, NOTE_CAUSE_MAX_BYTES)})`;
  const message = `${fitText(rest.message, MESSAGE_MAX_BYTES - utf8ByteLength(note))}${note}`;
  try {
    return detached(
      validateSettleCommand({
        ...command,
        report: {
          kind: 'completed',
          report: {
            ...report.report,
            outcome: { kind: 'application_error', error: { ...rest, message } },
          },
        },
      }),
    );
  } catch {
    return undefined;
  }
}

/**
 * The command with its output or error details copied out of the handler's objects, which the
 * handler (or other code sharing them) may still change after it returned: the settlement is
 * serialised again for every send, and it must carry the value as it was when the handler
 * returned, byte for byte on every retry. A value changed in between could otherwise be stored
 * in its changed form, or become unserialisable and fail its whole request (other attempts'
 * settlements sharing it included). The copy is checked again: a getter may answer differently
 * the second time it is read.
 */
function detached(command: SettleCommand): SettleCommand {
  if (command.report.kind !== 'completed') return command;
  let text: string;
  try {
    text = JSON.stringify(command);
  } catch (error) {
    throw new ContractError(
      'invalid_input',
      'the output or error details could not be serialised as JSON',
      {
        reason: 'not_json',
        path: '$.report.report.outcome',
        cause: error,
      },
    );
  }
  return validateSettleCommand(JSON.parse(text));
}

/** What to do after a settle request failed. */
export type SettleFailure = 'retry' | 'split' | 'definitive';

/**
 * Classifies a failed settle (a whole request's error, or one batch item's problem);
 * `settlements` is how many the failed request carried.
 */
export function classifySettleError(error: unknown, settlements = 1): SettleFailure {
  if (error instanceof TransportError) return 'retry';
  if (error instanceof ProblemError && error.code === 'unavailable') return 'retry';
  // A body refused for its size — by the server, or by a gateway in front of it with a page of
  // its own (nginx's 1 MiB default; review r48a) — loses none of its settlements: each is sent
  // again alone, and only one too large alone is definitive.
  const tooLarge =
    (error instanceof ProblemError && error.code === 'payload_too_large') ||
    (error instanceof ProtocolError && error.status === 413);
  if (tooLarge && settlements > 1) return 'split';
  return 'definitive';
}
