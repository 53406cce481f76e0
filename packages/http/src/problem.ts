/**
 * RFC 9457 problem documents: the one shape every error reply and every
 * failed batch item takes (DESIGN §6). Details never carry rejected input:
 * decoder messages name the JSON path and the rule, and messages written by
 * the service are replaced by a fixed sentence when they quote anything the
 * request supplied.
 */
import {
  ContractError,
  type ErrorCode,
  fitText,
  MESSAGE_MAX_BYTES,
  PROBLEM_TYPE_BASE,
  type Problem,
  problemDocument,
} from '@ledgence/contracts';

export { PROBLEM_TYPE_BASE };

/** The media type of every error reply. */
export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/**
 * A fixed explanation per code, used when a message cannot be shown as it is
 * (it quotes request input, or the error was not a contract error at all).
 */
const GENERIC_DETAILS: Readonly<Record<ErrorCode, string>> = {
  invalid_input: 'The request is not valid.',
  unauthorized: 'A valid API key is required: send Authorization: Bearer <key>.',
  forbidden: "The API key's binding does not allow this scope or role.",
  not_found: 'The resource was not found.',
  conflict: 'The request conflicts with what was already recorded.',
  sequence_conflict: 'The sequence does not follow the last recorded one.',
  consumer_busy: 'The consumer slot still holds an active attempt.',
  ownership_lost: 'The lease is no longer held by this owner.',
  limit_exceeded: 'A limit of this resource was reached.',
  session_not_found: 'The worker session was not found.',
  session_expired: 'The worker session has expired.',
  payload_too_large: 'The request body is larger than this route accepts.',
  unsupported_media_type: 'The request body must be application/json.',
  unavailable: 'The service is temporarily unavailable; retry later.',
};

/** Where a problem document was produced, for its `request_id` and detail scrubbing. */
export interface ProblemContext {
  /** The request id to report in the document. */
  requestId?: string;
  /**
   * Strings the request supplied (path parameters, query values, header
   * values, text of a decoded body). A message quoting any of them is
   * replaced by the code's generic detail.
   */
  supplied?: readonly string[];
}

/**
 * Whether `message` quotes any of the strings the request supplied: as a whole token, so a
 * short name (a program called "p") found inside the service's own words ("lease safety
 * margin", "$.input.timeout_ms") does not cost the user a precise detail and its path.
 */
function quotesInput(message: string, supplied: readonly string[] | undefined): boolean {
  if (supplied === undefined) return false;
  for (const value of supplied) {
    if (value.length === 0) continue;
    for (let at = message.indexOf(value); at >= 0; at = message.indexOf(value, at + 1)) {
      if (
        tokenEdge(message, at - 1, value, 0) &&
        tokenEdge(message, at + value.length, value, -1)
      ) {
        return true;
      }
    }
  }
  return false;
}

const WORD = /[\p{L}\p{N}_]/u;

/**
 * Whether the quote of `value` may end at `message[index]` (the character just outside it): a
 * word character there continues a word of the message only if the value's own edge character
 * (`edge`: 0 its first, -1 its last) is a word character too.
 */
function tokenEdge(message: string, index: number, value: string, edge: 0 | -1): boolean {
  const outside = message[index];
  if (outside === undefined) return true;
  return !(WORD.test(outside) && WORD.test(value.at(edge) ?? ''));
}

/**
 * Whether `error` is an `unavailable` that wraps a backend failure (its `cause`): the failure's
 * text names database internals (hosts, relations, constraints) that are for the operator's log,
 * not for a client, who learns only that it may retry.
 */
export function wrapsBackendFailure(error: ContractError): boolean {
  return error.code === 'unavailable' && error.cause !== undefined;
}

/**
 * The problem document of a {@link ContractError}: `type` from its code,
 * `title` and `status` from the contracts' tables, its message as `detail`
 * (unless it quotes request input or wraps a backend failure), and its `reason` and `path` when
 * set.
 */
export function problemOf(error: ContractError, context: ProblemContext = {}): Problem {
  // Cut to the document's own limit (ProblemSchema): a decoder's message quoting a long JSON
  // path can pass it, and a document the contracts refuse would fail a whole batch reply for a
  // client reading it with them (review r47h).
  const detail =
    wrapsBackendFailure(error) || quotesInput(error.message, context.supplied)
      ? GENERIC_DETAILS[error.code]
      : fitText(error.message, MESSAGE_MAX_BYTES);
  // `null`, not `undefined`: an omitted path argument means the error's own path.
  const path =
    error.path !== undefined && !quotesInput(error.path, context.supplied) ? error.path : null;
  const problem = problemDocument(error, detail, path);
  if (context.requestId !== undefined) problem.request_id = context.requestId;
  return problem;
}

/** A {@link ContractError} with the code's generic detail, for rejections the adapter makes. */
export function genericError(code: ErrorCode, reason?: string): ContractError {
  return new ContractError(code, GENERIC_DETAILS[code], reason === undefined ? {} : { reason });
}
