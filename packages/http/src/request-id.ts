/**
 * Request ids: the caller's, when it can go into headers and logs as it is, else a new one. Its
 * own module so the app (which applies it) and the OpenAPI document (which states it) share one
 * rule.
 */
import { randomUUID } from 'node:crypto';

/** The header a request id is read from and echoed on, unless the app is told another. */
export const REQUEST_ID_HEADER = 'x-request-id';

/** A caller's request id that is kept: short, and of characters safe in headers and logs. */
export const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:/+=@-]{1,128}$/;

/**
 * A request's id: the caller's (its `x-request-id`) when it is short and made of characters safe
 * in headers and logs as they are, else a new UUID.
 */
export function acceptedRequestId(incoming: string | undefined): string {
  return incoming !== undefined && REQUEST_ID_PATTERN.test(incoming) ? incoming : randomUUID();
}
