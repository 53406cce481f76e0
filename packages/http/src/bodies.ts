/**
 * The two request bodies this adapter defines itself, for the routes whose
 * body is optional (DESIGN §4.1: "a POST without a body needs no content
 * type; if a body is sent it must be a JSON object").
 */
import { nullishOptional, requestObject, ScopeSchema } from '@ledgence/contracts';
import type * as v from 'valibot';

/**
 * `POST {scope}/tasks/{task_id}/cancel`: no body, or the empty object `{}`.
 * Unknown fields are rejected like everywhere else.
 */
export const CancelBodySchema = requestObject({});

/**
 * `POST /v1/worker/sessions/{id}/extend`: no body, or `{scope}` naming the
 * session's scope. Without a scope, the session's own scope is used: one the
 * API key may not use is `session_not_found`, as a foreign session is.
 */
export const ExtendSessionBodySchema = requestObject({
  scope: nullishOptional(ScopeSchema),
});

/** The body of `POST /v1/worker/sessions/{id}/extend`. */
export type ExtendSessionBody = v.InferOutput<typeof ExtendSessionBodySchema>;
