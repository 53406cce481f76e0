/**
 * Worker-facing execution types (DESIGN §4): the CloudEvent inside an
 * assignment, and what a worker reports about one attempt — an
 * `ExecutionReport` carrying the program's outcome, or an `ExecutionFailure`
 * when no outcome could be produced.
 */
import * as v from 'valibot';
import { ERROR_CODE_MAX_BYTES, MESSAGE_MAX_BYTES, SCOPE_TEXT_MAX_BYTES } from '../limits.js';
import {
  JsonValueSchema,
  messageField,
  NameSchema,
  nullishOptional,
  PositiveCounterSchema,
  Rfc3339TimeSchema,
  requestObject,
  TimestampSchema,
  TraceparentSchema,
  TracestateSchema,
  textField,
  UriReferenceSchema,
} from './common.js';

/** The CloudEvents `type` of a task attempt's invocation event. */
export const TASK_ATTEMPT_EVENT_TYPE = 'dev.ledgence.task.attempt';

/**
 * The immutable invocation event inside an Assignment: a CloudEvents 1.0
 * structured JSON event. Exactly the listed attributes (strict): the `ldg*`
 * extensions name the task, run and attempt it invokes; `ldgattempt` is the
 * attempt's 1-based ordinal; `ldgactivationid` is present only for a workflow
 * controller activation; `traceparent`/`tracestate` carry the task's origin
 * trace (CloudEvents distributed-tracing extension). A reply type: absent
 * optional attributes are omitted, never `null`.
 */
export const CloudEventSchema = v.strictObject({
  specversion: v.literal('1.0'),
  id: NameSchema,
  source: UriReferenceSchema,
  type: NameSchema,
  time: Rfc3339TimeSchema,
  datacontenttype: v.literal('application/json'),
  data: JsonValueSchema,
  ldgtenant: textField(SCOPE_TEXT_MAX_BYTES),
  ldgnamespace: textField(SCOPE_TEXT_MAX_BYTES),
  ldgqueue: NameSchema,
  ldgtaskid: NameSchema,
  ldgrunid: NameSchema,
  ldgattemptid: NameSchema,
  ldgattempt: PositiveCounterSchema,
  ldgactivationid: v.exactOptional(NameSchema),
  traceparent: v.exactOptional(TraceparentSchema),
  tracestate: v.exactOptional(TracestateSchema),
});
/** The immutable invocation event inside an Assignment: a CloudEvents 1.0 structured JSON event. */
export type CloudEvent = v.InferOutput<typeof CloudEventSchema>;

/**
 * Application error identifiers are user-defined, unlike worker error kinds.
 * `details` is application JSON (≤ OUTPUT_MAX_BYTES, depth ≤ 64, checked by
 * the settle decoder); a `null` or absent `details` means none. `retryable:
 * false` stops retries; absent means retryable.
 */
export const ApplicationErrorSchema = requestObject({
  code: textField(ERROR_CODE_MAX_BYTES),
  message: messageField(MESSAGE_MAX_BYTES),
  details: nullishOptional(JsonValueSchema),
  retryable: nullishOptional(v.boolean()),
});
/** Application error identifiers are user-defined, unlike worker error kinds. */
export type ApplicationError = v.InferOutput<typeof ApplicationErrorSchema>;

/**
 * What the program produced: its output (any JSON, `null` included; ≤
 * OUTPUT_MAX_BYTES, checked by the settle decoder), or an application error.
 * Tagged by `kind`.
 */
export const ProgramOutcomeSchema = v.variant('kind', [
  v.strictObject({ kind: v.literal('success'), output: JsonValueSchema }),
  v.strictObject({ kind: v.literal('application_error'), error: ApplicationErrorSchema }),
]);
/** What the program produced: its output, or an application error. */
export type ProgramOutcome = v.InferOutput<typeof ProgramOutcomeSchema>;

/**
 * The attempt a report is about. The lifecycle core verifies it against the
 * acquired task before acceptance; `activation_id` only for a workflow
 * controller activation.
 */
export const ExecutionIdentitySchema = requestObject({
  task_id: NameSchema,
  attempt_id: NameSchema,
  activation_id: nullishOptional(NameSchema),
});
/** The attempt a report is about. */
export type ExecutionIdentity = v.InferOutput<typeof ExecutionIdentitySchema>;

/** The context of an execution report: the identity of the attempt. */
export const ExecutionContextSchema = v.strictObject({ identity: ExecutionIdentitySchema });
/** The context of an execution report. */
export type ExecutionContext = v.InferOutput<typeof ExecutionContextSchema>;

/**
 * A completed execution: the attempt identity and the program's outcome.
 * `started_at`/`finished_at` are the worker's clock, informational only —
 * no decision depends on them.
 */
export const ExecutionReportSchema = requestObject({
  context: ExecutionContextSchema,
  outcome: ProgramOutcomeSchema,
  started_at: nullishOptional(TimestampSchema),
  finished_at: nullishOptional(TimestampSchema),
});
/** A completed execution: the attempt identity and the program's outcome. */
export type ExecutionReport = v.InferOutput<typeof ExecutionReportSchema>;

/** Why a worker could not produce an outcome. */
export const ExecutionFailureKindSchema = v.picklist([
  'crashed',
  'timed_out',
  'cancelled',
  'rejected',
  'internal',
]);
/** Why a worker could not produce an outcome. */
export type ExecutionFailureKind = v.InferOutput<typeof ExecutionFailureKindSchema>;

/** The worker could not produce an outcome; `retryable` decides whether the task may retry. */
export const ExecutionFailureSchema = v.strictObject({
  kind: ExecutionFailureKindSchema,
  message: messageField(MESSAGE_MAX_BYTES),
  retryable: v.boolean(),
});
/** The worker could not produce an outcome. */
export type ExecutionFailure = v.InferOutput<typeof ExecutionFailureSchema>;
