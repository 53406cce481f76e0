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
}

/**
 * The request may or may not have reached the server and no usable reply
 * came back: a network failure, a timeout, or a 5xx without a problem
 * document. Always retryable; every worker request is replay-safe, so
 * retrying the same bytes is the fix.
 */
export class TransportError extends LedgenceError {
  static override readonly brand: string = '@ledgence/worker/TransportError';

  /** What went wrong. */
  readonly reason: 'network' | 'timeout' | 'server';
  /** The HTTP status, when a response arrived. */
  readonly status: number | undefined;
  /** Always `true`: the same request may succeed when sent again. */
  readonly retryable = true;

  constructor(message: string, options: TransportErrorOptions) {
    super(message, options);
    this.reason = options.reason;
    this.status = options.status;
  }

  /** Errors are data: what the error says, without the stack (`JSON.stringify` drops `message`). */
  toJSON(): { name: string; message: string; reason: string; status?: number; retryable: true } {
    const data: ReturnType<TransportError['toJSON']> = {
      name: this.name,
      message: this.message,
      reason: this.reason,
      retryable: this.retryable,
    };
    if (this.status !== undefined) data.status = this.status;
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
  toJSON(): { name: string; message: string; status?: number; path?: string; retryable: false } {
    const data: ReturnType<ProtocolError['toJSON']> = {
      name: this.name,
      message: this.message,
      retryable: this.retryable,
    };
    if (this.status !== undefined) data.status = this.status;
    if (this.path !== undefined) data.path = this.path;
    return data;
  }
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

  constructor(problem: Problem, options?: LedgenceErrorOptions) {
    super(problem.code, problem.detail, {
      ...options,
      reason: problem.reason,
      path: problem.path,
    });
    this.problem = problem;
    this.requestId = problem.request_id;
  }

  /** {@link ContractError.toJSON} with the reply's status and the server's request id. */
  override toJSON(): ContractErrorData & { status: number; requestId?: string } {
    const data: ContractErrorData & { status: number; requestId?: string } = {
      ...super.toJSON(),
      status: this.problem.status,
    };
    if (this.requestId !== undefined) data.requestId = this.requestId;
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

/** The problem code of `error`, if it is a {@link ProblemError}. */
export function problemCode(error: unknown): ErrorCode | undefined {
  return error instanceof ProblemError ? error.code : undefined;
}
