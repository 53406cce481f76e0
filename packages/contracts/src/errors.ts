/**
 * Errors as data. Every rejection the server or the SDK reports carries a
 * stable `code` (DESIGN §6), a message, whether retrying the same request can
 * succeed, and optionally a finer `reason` and the JSON `path` it concerns.
 *
 * `instanceof` is answered by a brand kept under a registered symbol rather
 * than by prototype identity, so an error created by one installed copy of
 * this package is recognised by another copy (two versions in one
 * `node_modules`, or the SDK and the server bundling their own).
 */

import type { Problem } from './schemas/batch.js';

/** The stable error codes of the HTTP API (DESIGN §6), shared by server and SDK. */
export const ERROR_CODES = [
  'invalid_input',
  'unauthorized',
  'forbidden',
  'not_found',
  'conflict',
  'sequence_conflict',
  'consumer_busy',
  'ownership_lost',
  'limit_exceeded',
  'session_not_found',
  'session_expired',
  'payload_too_large',
  'unsupported_media_type',
  'unavailable',
] as const;

/** One of {@link ERROR_CODES}. */
export type ErrorCode = (typeof ERROR_CODES)[number];

/** The HTTP status each code is answered with (DESIGN §4.1, §6). */
export const ERROR_STATUS: Readonly<Record<ErrorCode, number>> = {
  invalid_input: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  sequence_conflict: 409,
  consumer_busy: 409,
  ownership_lost: 409,
  limit_exceeded: 409,
  session_not_found: 404,
  session_expired: 410,
  payload_too_large: 413,
  unsupported_media_type: 415,
  unavailable: 503,
};

/** The stable prefix of every problem `type`: `https://ledgence.dev/problems/<code>`. */
export const PROBLEM_TYPE_BASE = 'https://ledgence.dev/problems/';

/** A short human title per code, used as the problem+json `title`. */
export const ERROR_TITLES: Readonly<Record<ErrorCode, string>> = {
  invalid_input: 'Invalid input',
  unauthorized: 'Unauthorized',
  forbidden: 'Forbidden',
  not_found: 'Not found',
  conflict: 'Conflict',
  sequence_conflict: 'Sequence conflict',
  consumer_busy: 'Consumer busy',
  ownership_lost: 'Ownership lost',
  limit_exceeded: 'Limit exceeded',
  session_not_found: 'Session not found',
  session_expired: 'Session expired',
  payload_too_large: 'Payload too large',
  unsupported_media_type: 'Unsupported media type',
  unavailable: 'Service unavailable',
};

/**
 * Only `unavailable` is worth retrying unchanged: every other code describes
 * the request or the state it met, and the same request meets it again.
 */
const RETRYABLE_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>(['unavailable']);

const ERROR_CODE_SET: ReadonlySet<string> = new Set(ERROR_CODES);

/** Whether `value` is one of the stable {@link ERROR_CODES}. */
export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && ERROR_CODE_SET.has(value);
}

/** The registered symbol under which each error lists the brands of its class chain. */
const BRANDS = Symbol.for('@ledgence/error.brands');

interface Branded {
  readonly [BRANDS]?: readonly string[];
}

function brandsOf(value: unknown): readonly string[] {
  if ((typeof value !== 'object' && typeof value !== 'function') || value === null) return [];
  const brands = (value as Branded)[BRANDS];
  return Array.isArray(brands) ? brands : [];
}

/** Options shared by every Ledgence error. */
export interface LedgenceErrorOptions {
  /** The lower-level error this one explains. */
  cause?: unknown;
}

/**
 * Whether `value` is an instance of `cls` by brand, so that `instanceof` holds across duplicate
 * installs: each class checks for its own brand. A class that declares no brand of its own (a
 * user's `class CardDeclined extends ApplicationError {}`) would inherit its parent's and match
 * every parent instance: it gets the ordinary prototype check instead.
 */
function isBranded(cls: abstract new (...args: never[]) => unknown, value: unknown): boolean {
  if (!Object.hasOwn(cls, 'brand')) return Function.prototype[Symbol.hasInstance].call(cls, value);
  return brandsOf(value).includes((cls as unknown as { brand: string }).brand);
}

/**
 * The root of Ledgence's small error hierarchy. Subclasses declare a static
 * `brand` (a registered, versionless name); `instanceof` then holds across
 * installed copies of the package that defines them.
 */
export class LedgenceError extends Error {
  /** The brand `instanceof` checks for; each subclass declares its own. */
  static readonly brand: string = '@ledgence/LedgenceError';

  /** By brand, not prototype chain, so that `instanceof` holds across installed copies. */
  static override [Symbol.hasInstance](value: unknown): boolean {
    // `this` is the class on the right of `instanceof` (a subclass too).
    // biome-ignore lint/complexity/noThisInStatic: the receiver is the point
    return isBranded(this, value);
  }

  /** The brands of this error's class chain, most derived first, checked by `instanceof`. */
  declare readonly [BRANDS]: readonly string[];

  constructor(message: string, options?: LedgenceErrorOptions) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    const brands: string[] = [];
    for (let c = new.target as unknown; typeof c === 'function'; c = Object.getPrototypeOf(c)) {
      const brand = (c as { brand?: unknown }).brand;
      if (typeof brand === 'string' && !brands.includes(brand)) brands.push(brand);
      if (c === LedgenceError) break;
    }
    Object.defineProperty(this, BRANDS, { value: Object.freeze(brands), enumerable: false });
    Object.defineProperty(this, 'name', {
      value: new.target.name,
      enumerable: false,
      configurable: true,
      writable: true,
    });
  }
}

/** Options of a {@link ContractError}. */
export interface ContractErrorOptions extends LedgenceErrorOptions {
  /** A stable, finer-grained reason, e.g. `duplicate_key` or `depth_exceeded`. */
  reason?: string;
  /** The JSON path of the offending value, e.g. `$.input.data.items[3]`. */
  path?: string;
  /** Overrides the default retryability of the code. */
  retryable?: boolean;
}

/** The JSON shape of a {@link ContractError} (see {@link ContractError.toJSON}). */
export interface ContractErrorData {
  /** The stable code; decides the HTTP status. */
  code: ErrorCode;
  /** The error's message. */
  message: string;
  /** Whether the same request may succeed when retried unchanged. */
  retryable: boolean;
  /** A stable, finer-grained reason; absent when the code alone says it. */
  reason?: string;
  /** The JSON path of the offending value; absent when the error concerns none. */
  path?: string;
}

/**
 * An expected rejection of an operation, or an adapter failure reported as
 * `unavailable`. Backend errors are never turned into successful empty
 * acquisitions or lost ownership (seed: `ContractError`).
 */
export class ContractError extends LedgenceError {
  static override readonly brand: string = '@ledgence/ContractError';

  /** The stable code; decides the HTTP status. */
  readonly code: ErrorCode;
  /** Whether the same request may succeed when retried unchanged. */
  readonly retryable: boolean;
  /** A stable, finer-grained reason, when the code alone is too coarse. */
  readonly reason: string | undefined;
  /** The JSON path of the offending value, when the error concerns one. */
  readonly path: string | undefined;

  constructor(code: ErrorCode, message: string, options?: ContractErrorOptions) {
    super(message, options);
    this.code = code;
    this.retryable = options?.retryable ?? RETRYABLE_CODES.has(code);
    this.reason = options?.reason;
    this.path = options?.path;
  }

  /** The HTTP status of this error's code. */
  get status(): number {
    return ERROR_STATUS[this.code];
  }

  /** Errors are data: the fields a transport carries, without the stack. */
  toJSON(): ContractErrorData {
    const data: ContractErrorData = {
      code: this.code,
      message: this.message,
      retryable: this.retryable,
    };
    if (this.reason !== undefined) data.reason = this.reason;
    if (this.path !== undefined) data.path = this.path;
    return data;
  }
}

/** Shorthand for the most common rejection: `invalid_input` with a reason and a path. */
export function invalidInput(message: string, reason?: string, path?: string): ContractError {
  return new ContractError('invalid_input', message, { reason, path });
}

/**
 * The problem+json document of a {@link ContractError}: `type`, `title` and `status` from its
 * code, `detail` (its message unless another is given), and its `reason` and `path` when set.
 * The server's edge passes a scrubbed detail, and `null` as `path` to leave out a path that
 * would echo request input; the SDK answers an item it refused before sending with the
 * document the server would have sent.
 *
 * @param path - the location to report: omitted (or `undefined`) for the error's own path,
 *   `null` for none at all.
 */
export function problemDocument(
  error: ContractError,
  detail: string = error.message,
  path: string | null = error.path ?? null,
): Problem {
  const code = error.code;
  const problem: Problem = {
    type: `${PROBLEM_TYPE_BASE}${code}`,
    title: ERROR_TITLES[code],
    status: ERROR_STATUS[code],
    code,
    detail,
  };
  if (error.reason !== undefined) problem.reason = error.reason;
  if (path !== null) problem.path = path;
  return problem;
}
