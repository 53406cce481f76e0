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
 * session's scope. Without a scope, the scope is the API key's binding when
 * that names exactly one namespace; otherwise the scope is required.
 */
export const ExtendSessionBodySchema = requestObject({
  scope: nullishOptional(ScopeSchema),
});

/** The body of `POST /v1/worker/sessions/{id}/extend`. */
export type ExtendSessionBody = v.InferOutput<typeof ExtendSessionBodySchema>;
