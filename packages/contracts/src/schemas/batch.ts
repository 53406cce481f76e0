/**
 * Batch request and reply bodies (DESIGN §6 batch table), the RFC 9457
 * problem document every error reply (and every failed batch item) carries,
 * and the `{task_state}` reply of cancel and quiescence.
 *
 * The request schemas describe the whole body for documentation, the SDK and
 * OpenAPI; the server's batch decoders (decode.ts) check the envelope first
 * and then each item on its own, so one bad item fails only itself.
 */
import * as v from 'valibot';
import { ERROR_CODES, ERROR_STATUS } from '../errors.js';
import { MAX_SESSION_CONCURRENCY, MAX_SUBMIT_BATCH, MAX_WORKER_BATCH } from '../limits.js';
import { intRange, itemCount, messageField } from './common.js';
import { SubmitCommandSchema, TaskSnapshotSchema, TaskStateSchema } from './task.js';
import {
  AcquireCommandSchema,
  AcquireReplySchema,
  AuthoritySchema,
  RenewCommandSchema,
  SettleCommandSchema,
  SettleReplySchema,
} from './worker.js';

// Problem documents describe errors only: client (4xx) and server (5xx) statuses.
const ERROR_STATUS_MIN = 400;
const ERROR_STATUS_MAX = 599;

/**
 * An RFC 9457 `application/problem+json` document: `type` (a URI reference),
 * `title` (per code), `status` (the code's HTTP status), the stable `code`,
 * and `detail` (the message, never echoing rejected input); optionally the
 * finer `reason`, the JSON `path` it concerns, the `instance` and the
 * server's `request_id`.
 */
export const ProblemSchema = v.pipe(
  v.strictObject({
    type: v.pipe(v.string(), v.minLength(1, 'must not be empty')),
    title: v.string(),
    status: intRange(ERROR_STATUS_MIN, ERROR_STATUS_MAX),
    code: v.picklist(ERROR_CODES),
    detail: messageField(),
    reason: v.exactOptional(v.string()),
    path: v.exactOptional(v.string()),
    instance: v.exactOptional(v.string()),
    request_id: v.exactOptional(v.string()),
  }),
  v.check(
    (problem) => problem.status === ERROR_STATUS[problem.code],
    'status must be the HTTP status of code',
  ),
);
/** An RFC 9457 problem document. */
export type Problem = v.InferOutput<typeof ProblemSchema>;

/** The reply of cancel and of quiescence confirmation: the task's state afterwards. */
export const TaskStateReplySchema = v.strictObject({ task_state: TaskStateSchema });
/** The reply of cancel and of quiescence confirmation. */
export type TaskStateReply = v.InferOutput<typeof TaskStateReplySchema>;

/** A batch request body: `commands`, 1..`max` independent commands of one kind. */
function batchRequest<const TCommand extends v.GenericSchema>(command: TCommand, max: number) {
  return v.strictObject({ commands: v.pipe(v.array(command), itemCount(1, max)) });
}

/** A batch reply's list: one answer per command, in request order — the reply or a problem. */
function batchAnswers<const TReply extends v.GenericSchema>(reply: TReply, max: number) {
  return v.pipe(v.array(v.union([reply, ProblemSchema])), itemCount(1, max));
}

// ---- Submit -------------------------------------------------------------------

/** `POST {scope}/tasks:batch`: 1..MAX_SUBMIT_BATCH independent submit commands. */
export const SubmitBatchRequestSchema = batchRequest(SubmitCommandSchema, MAX_SUBMIT_BATCH);
/** `POST {scope}/tasks:batch` body. */
export type SubmitBatchRequest = v.InferOutput<typeof SubmitBatchRequestSchema>;

/** One result per submitted command, in request order: the task, or why that item failed. */
export const SubmitBatchReplySchema = v.strictObject({
  results: batchAnswers(TaskSnapshotSchema, MAX_SUBMIT_BATCH),
});
/** `POST {scope}/tasks:batch` reply. */
export type SubmitBatchReply = v.InferOutput<typeof SubmitBatchReplySchema>;

// ---- Acquire --------------------------------------------------------------------

/** `POST /v1/worker/acquire:batch`: one acquire per slot of one session (≤ MAX_SESSION_CONCURRENCY). */
export const AcquireBatchRequestSchema = batchRequest(
  AcquireCommandSchema,
  MAX_SESSION_CONCURRENCY,
);
/** `POST /v1/worker/acquire:batch` body. */
export type AcquireBatchRequest = v.InferOutput<typeof AcquireBatchRequestSchema>;

/** One reply per acquire command, in request order. */
export const AcquireBatchReplySchema = v.strictObject({
  replies: batchAnswers(AcquireReplySchema, MAX_SESSION_CONCURRENCY),
});
/** `POST /v1/worker/acquire:batch` reply. */
export type AcquireBatchReply = v.InferOutput<typeof AcquireBatchReplySchema>;

// ---- Renew ------------------------------------------------------------------------

/** `POST /v1/worker/renew:batch`: 1..MAX_WORKER_BATCH renew commands. */
export const RenewBatchRequestSchema = batchRequest(RenewCommandSchema, MAX_WORKER_BATCH);
/** `POST /v1/worker/renew:batch` body. */
export type RenewBatchRequest = v.InferOutput<typeof RenewBatchRequestSchema>;

/** One current authority (or problem) per renew command, in request order. */
export const RenewBatchReplySchema = v.strictObject({
  results: batchAnswers(AuthoritySchema, MAX_WORKER_BATCH),
});
/** `POST /v1/worker/renew:batch` reply. */
export type RenewBatchReply = v.InferOutput<typeof RenewBatchReplySchema>;

// ---- Settle -----------------------------------------------------------------------

/** `POST /v1/worker/settle:batch`: 1..MAX_WORKER_BATCH settle commands. */
export const SettleBatchRequestSchema = batchRequest(SettleCommandSchema, MAX_WORKER_BATCH);
/** `POST /v1/worker/settle:batch` body. */
export type SettleBatchRequest = v.InferOutput<typeof SettleBatchRequestSchema>;

/** One settle reply (or problem) per settle command, in request order. */
export const SettleBatchReplySchema = v.strictObject({
  results: batchAnswers(SettleReplySchema, MAX_WORKER_BATCH),
});
/** `POST /v1/worker/settle:batch` reply. */
export type SettleBatchReply = v.InferOutput<typeof SettleBatchReplySchema>;
