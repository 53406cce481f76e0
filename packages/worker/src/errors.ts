/**
 * The SDK's typed errors. Each class declares a static `brand`, so
 * `instanceof` holds across installed copies of the package (see
 * `LedgenceError` in @ledgence/contracts): an application that bundles its own
 * copy of `@ledgence/worker` still recognises an `ApplicationError` thrown
 * with another copy.
 */
import {
  ContractError,
  type ContractErrorData,
  type ErrorCode,
  LedgenceError,
  type LedgenceErrorOptions,
  type Problem,
  problemDocument,
} from '@ledgence/contracts';

/** Options of an {@link ApplicationError}. */
export interface ApplicationErrorOptions extends LedgenceErrorOptions {
  /** Whether the task may be retried (default `true`); `false` fails the task at once. */
  retryable?: boolean;
  /** Application JSON describing the error (≤ 1 MiB compact, depth ≤ 64). */
  details?: unknown;
}

/**
 * Thrown by a handler to report an application error: the attempt settles as
 * `completed` with outcome `application_error`, carrying `code`, `message`,
 * `retryable` and `details`. Any other throw settles as an execution failure
 * `crashed`.
 *
 * @example
 * throw new ApplicationError('card_declined', 'the card was declined', { retryable: false });
 */
export class ApplicationError extends LedgenceError {
  static override readonly brand: string = '@ledgence/worker/ApplicationError';

  /** A user-defined error identifier (1..128 bytes of text). */
  readonly code: string;
  /** Whether the task may be retried; absent on the wire means retryable. */
  readonly retryable: boolean;
  /** Application JSON describing the error, if any. */
  readonly details: unknown;

  constructor(code: string, message: string, options?: ApplicationErrorOptions) {
    super(message, options);
    this.code = code;
    this.retryable = options?.retryable ?? true;
    this.details = options?.details;
  }

  /** Errors are data: what the error says, without the stack (`JSON.stringify` drops `message`). */
  toJSON(): { name: string; code: string; message: string; retryable: boolean; details?: unknown } {
    const data: ReturnType<ApplicationError['toJSON']> = {
      name: this.name,
      code: this.code,
      message: this.message,
      retryable: this.retryable,
    };
    if (this.details !== undefined) data.details = this.details;
    return data;
  }
}

/** Options of a {@link TransportError}. */
export interface TransportErrorOptions extends LedgenceErrorOptions {
  /** `network` (fetch failed or the connection dropped), `timeout`, or `server` (a 5xx without a problem document). */
  reason: 'network' | 'timeout' | 'server';
  /** The HTTP status, when a response arrived. */
  status?: number;
  /** How long the reply's `Retry-After` asked to wait before sending again, in ms. */
  retryAfterMs?: number;
}

/**
 * The request may or may not have reached the server and no usable reply
 * came back: a network failure, a timeout, or a 5xx (or 429, 408) without a
 * problem document. Always retryable; every worker request is replay-safe, so
 * retrying the same bytes is the fix.
 */
export class TransportError extends LedgenceError {
  static override readonly brand: string = '@ledgence/worker/TransportError';

  /**
   * Always `'transport_error'`: a stable identifier to branch or count on, like a
   * {@link ProblemError}'s problem code (which never takes this value). `reason` says which
   * failure it was.
   */
  readonly code = 'transport_error' as const;
  /** What went wrong. */
  readonly reason: 'network' | 'timeout' | 'server';
  /** The HTTP status, when a response arrived. */
  readonly status: number | undefined;
  /**
   * How long the reply asked to wait before the request is sent again, in ms: its `Retry-After`
   * header (delay-seconds, or an HTTP-date read against the reply's `Date`), as a gateway or rate
   * limiter answering 429/503 sends it; `undefined` when the reply had none, or none valid. The
   * SDK's own retries wait at least this long, up to their backoff's `maxMs`.
   */
  readonly retryAfterMs: number | undefined;
  /** Always `true`: the same request may succeed when sent again. */
  readonly retryable = true;

  constructor(message: string, options: TransportErrorOptions) {
    super(message, options);
    this.reason = options.reason;
    this.status = options.status;
    this.retryAfterMs = options.retryAfterMs;
  }

  /** Errors are data: what the error says, without the stack (`JSON.stringify` drops `message`). */
  toJSON(): {
    name: string;
    code: 'transport_error';
    message: string;
    reason: string;
    status?: number;
    retryAfterMs?: number;
    retryable: true;
  } {
    const data: ReturnType<TransportError['toJSON']> = {
      name: this.name,
      code: this.code,
      message: this.message,
      reason: this.reason,
      retryable: this.retryable,
    };
    if (this.status !== undefined) data.status = this.status;
    if (this.retryAfterMs !== undefined) data.retryAfterMs = this.retryAfterMs;
    return data;
  }
}

/** Options of a {@link ProtocolError}. */
export interface ProtocolErrorOptions extends LedgenceErrorOptions {
  /** The HTTP status of the reply. */
  status?: number;
  /** The JSON path of the offending value in the reply, when known. */
  path?: string;
}

/**
 * The server's reply broke the contract: not strict JSON, not the shape the
 * route promises, or an unexpected status or content type. Never a silent
 * `any`. Not retryable: the same request would meet the same server.
 */
export class ProtocolError extends LedgenceError {
  static override readonly brand: string = '@ledgence/worker/ProtocolError';

  /**
   * Always `'protocol_error'`: a stable identifier to branch or count on, like a
   * {@link ProblemError}'s problem code (which never takes this value).
   */
  readonly code = 'protocol_error' as const;
  /** The HTTP status of the reply, when one arrived. */
  readonly status: number | undefined;
  /** The JSON path of the offending value in the reply, when known. */
  readonly path: string | undefined;
  /** Always `false`. */
  readonly retryable = false;

  constructor(message: string, options?: ProtocolErrorOptions) {
    super(message, options);
    this.status = options?.status;
    this.path = options?.path;
  }

  /** Errors are data: what the error says, without the stack (`JSON.stringify` drops `message`). */
  toJSON(): {
    name: string;
    code: 'protocol_error';
    message: string;
    status?: number;
    path?: string;
    retryable: false;
  } {
    const data: ReturnType<ProtocolError['toJSON']> = {
      name: this.name,
      code: this.code,
      message: this.message,
      retryable: this.retryable,
    };
    if (this.status !== undefined) data.status = this.status;
    if (this.path !== undefined) data.path = this.path;
    return data;
  }
}

/** Options of a {@link ProblemError}. */
export interface ProblemErrorOptions extends LedgenceErrorOptions {
  /** How long the reply's `Retry-After` asked to wait before sending again, in ms. */
  retryAfterMs?: number | undefined;
  /** The SDK's own message in place of the problem's `detail` (which `problem` keeps). */
  message?: string | undefined;
}

/**
 * The server rejected a request (or one item of a batch) with an RFC 9457
 * problem document. A {@link ContractError}, so `code`, `retryable`,
 * `reason` and `path` read the same as on the server; `problem` is the
 * document as received and `requestId` the server's request id, if any.
 */
export class ProblemError extends ContractError {
  static override readonly brand: string = '@ledgence/worker/ProblemError';

  /** The problem document as received (strictly parsed). */
  readonly problem: Problem;
  /** The server's request id, for correlating with its logs. */
  readonly requestId: string | undefined;
  /**
   * For a retryable problem (`unavailable`) answering a whole request: how long its reply's
   * `Retry-After` header asked to wait before sending again, in ms (see
   * {@link TransportError.retryAfterMs}); `undefined` otherwise, and for a batch item's problem.
   */
  readonly retryAfterMs: number | undefined;

  constructor(problem: Problem, options?: ProblemErrorOptions) {
    const { retryAfterMs, message, ...rest } = options ?? {};
    super(problem.code, message ?? problem.detail, {
      ...rest,
      reason: problem.reason,
      path: problem.path,
    });
    this.problem = problem;
    this.requestId = problem.request_id;
    this.retryAfterMs = retryAfterMs;
  }

  /**
   * {@link ContractError.toJSON} with the reply's status, the server's request id and its
   * `Retry-After`, when present.
   */
  override toJSON(): ContractErrorData & {
    name: string;
    status: number;
    requestId?: string;
    retryAfterMs?: number;
  } {
    // `name` as every other SDK error's data has it: a log line tells the kinds apart by it.
    const data: ReturnType<ProblemError['toJSON']> = {
      name: this.name,
      ...super.toJSON(),
      status: this.problem.status,
    };
    if (this.requestId !== undefined) data.requestId = this.requestId;
    if (this.retryAfterMs !== undefined) data.retryAfterMs = this.retryAfterMs;
    return data;
  }
}

/**
 * The {@link ProblemError} of an item the SDK refused before sending it (a batch entry that fails
 * the local validation): the problem document the server would have answered for it, so a caller
 * handles an item refused here and one refused by the server alike. `cause` is the refusal.
 */
export function localProblem(error: ContractError): ProblemError {
  return new ProblemError(problemDocument(error), { cause: error });
}

/**
 * Whether sending the same request again may succeed: transport failures, and
 * problems whose code is retryable (`unavailable`).
 */
export function isRetryable(error: unknown): boolean {
  if (error instanceof TransportError) return true;
  if (error instanceof ProblemError) return error.retryable;
  return false;
}

/**
 * How long the reply that failed with `error` asked to wait before the request is sent again
 * (`Retry-After`, in ms): a {@link TransportError}'s or a {@link ProblemError}'s `retryAfterMs`,
 * `undefined` for any other value.
 */
export function retryAfterOf(error: unknown): number | undefined {
  if (error instanceof TransportError || error instanceof ProblemError) return error.retryAfterMs;
  return undefined;
}

/** The problem code of `error`, if it is a {@link ProblemError}. */
export function problemCode(error: unknown): ErrorCode | undefined {
  return error instanceof ProblemError ? error.code : undefined;
}
