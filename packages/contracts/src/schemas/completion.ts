/**
 * Completion-callback wire types (DESIGN §8): subscribing a task to an
 * operator-configured destination, redelivery, the subscription's delivery
 * state, and the compact CloudEvent a destination receives.
 */
import * as v from 'valibot';
import {
  COMPLETION_MAX_GENERATION,
  DESTINATION_ALIAS_MAX_BYTES,
  KEY_MAX_BYTES,
  MAX_COMPLETION_SUBSCRIPTIONS,
  MESSAGE_MAX_BYTES,
  SCOPE_TEXT_MAX_BYTES,
} from '../limits.js';
import {
  CounterSchema,
  intRange,
  itemCount,
  messageField,
  NameSchema,
  PositiveCounterSchema,
  Rfc3339TimeSchema,
  TimestampSchema,
  textField,
  UriReferenceSchema,
} from './common.js';
import { TerminalTaskStateSchema } from './task.js';

/** The CloudEvents `type` of a task completion event. */
export const TASK_COMPLETED_EVENT_TYPE = 'dev.ledgence.task.completed';

/** The lowest status a delivery records: any three-digit status a receiver may answer with. */
export const HTTP_STATUS_MIN = 100;
/** The highest status a delivery records (a sender treats anything outside as no status). */
export const HTTP_STATUS_MAX = 999;

/**
 * Subscribe a task to a destination alias (never a URL: destinations are
 * operator configuration). `subscription_key` makes subscribing idempotent.
 */
export const CompletionSubscribeCommandSchema = v.strictObject({
  subscription_key: textField(KEY_MAX_BYTES),
  destination: textField(DESTINATION_ALIAS_MAX_BYTES),
});
/** Subscribe a task to a destination alias. */
export type CompletionSubscribeCommand = v.InferOutput<typeof CompletionSubscribeCommandSchema>;

/**
 * Redeliver a subscription's event, naming the generation being retried
 * (1..COMPLETION_MAX_GENERATION): naming the current generation `g` (delivered
 * or exhausted) starts `g+1`; naming `g` again once `g+1` exists returns the
 * subscription unchanged; anything else is 409.
 */
export const CompletionRetryCommandSchema = v.strictObject({
  generation: intRange(1, COMPLETION_MAX_GENERATION),
});
/** Redeliver a subscription's event, naming the generation being retried. */
export type CompletionRetryCommand = v.InferOutput<typeof CompletionRetryCommandSchema>;

/** A subscription's delivery state. */
export const CompletionStateSchema = v.picklist([
  'waiting',
  'due',
  'delivering',
  'delivered',
  'exhausted',
]);
/** A subscription's delivery state. */
export type CompletionState = v.InferOutput<typeof CompletionStateSchema>;

/**
 * A completion subscription with its delivery state. `event_id` is the
 * webhook id and the CloudEvent id, identical across retries and
 * redeliveries. `attempts` counts within the current `generation` (from 1).
 * Accepted subscriptions survive caller disconnection.
 */
export const CompletionSubscriptionSchema = v.strictObject({
  id: NameSchema,
  task_id: NameSchema,
  subscription_key: textField(KEY_MAX_BYTES),
  destination: textField(DESTINATION_ALIAS_MAX_BYTES),
  event_id: NameSchema,
  state: CompletionStateSchema,
  attempts: CounterSchema,
  generation: PositiveCounterSchema,
  next_attempt_at: v.exactOptional(TimestampSchema),
  delivered_at: v.exactOptional(TimestampSchema),
  last_status_code: v.exactOptional(intRange(HTTP_STATUS_MIN, HTTP_STATUS_MAX)),
  last_error: v.exactOptional(messageField(MESSAGE_MAX_BYTES)),
});
/** A completion subscription with its delivery state. */
export type CompletionSubscription = v.InferOutput<typeof CompletionSubscriptionSchema>;

/** The reply of the subscription list route: at most MAX_COMPLETION_SUBSCRIPTIONS per task. */
export const CompletionSubscriptionListSchema = v.pipe(
  v.array(CompletionSubscriptionSchema),
  itemCount(0, MAX_COMPLETION_SUBSCRIPTIONS),
);
/** The reply of the subscription list route. */
export type CompletionSubscriptionList = v.InferOutput<typeof CompletionSubscriptionListSchema>;

/**
 * The data of a completion event: a reference to `GET …/result`
 * (`result_ref`, a path), never a copy of the result.
 */
export const CompletionEventDataSchema = v.strictObject({
  task_id: NameSchema,
  run_id: NameSchema,
  state: TerminalTaskStateSchema,
  result_ref: UriReferenceSchema,
});
/** The data of a completion event: a reference to the result, never a copy. */
export type CompletionEventData = v.InferOutput<typeof CompletionEventDataSchema>;

/**
 * Compact reference-only CloudEvent: no application result copy and no
 * platform data. Event identity and bytes remain unchanged across retries and
 * manual redelivery. `subject` is the task id (and equals `data.task_id`);
 * `source` is the queue's path, as in the attempt event. Besides the DESIGN §8
 * attributes it carries the `ldgtenant`, `ldgnamespace` and `ldgqueue`
 * extensions, so a receiver can route without parsing `source`.
 */
export const CompletionEventSchema = v.pipe(
  v.strictObject({
    specversion: v.literal('1.0'),
    id: NameSchema,
    source: UriReferenceSchema,
    type: v.literal(TASK_COMPLETED_EVENT_TYPE),
    subject: NameSchema,
    time: Rfc3339TimeSchema,
    datacontenttype: v.literal('application/json'),
    data: CompletionEventDataSchema,
    ldgtenant: textField(SCOPE_TEXT_MAX_BYTES),
    ldgnamespace: textField(SCOPE_TEXT_MAX_BYTES),
    ldgqueue: NameSchema,
  }),
  v.check((event) => event.subject === event.data.task_id, 'subject must equal data.task_id'),
);
/** Compact reference-only CloudEvent announcing a terminal task. */
export type CompletionEvent = v.InferOutput<typeof CompletionEventSchema>;
