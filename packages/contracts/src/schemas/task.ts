/**
 * Task wire types (DESIGN §4, §4.1; seed `delivery.rs`): submission, the
 * task's snapshot, status, result and outcome, listing, and history.
 */
import * as v from 'valibot';
import {
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_RETRY_DELAY_MS,
  DEFAULT_RETRY_MAX_DELAY_MS,
  DEFAULT_TIMEOUT_MS,
  HISTORY_PAGE_LIMIT,
  KEY_MAX_BYTES,
  MAX_ATTEMPTS_LIMIT,
  MAX_CONCURRENCY_LIMIT,
  MAX_SUBMIT_DELAY_MS,
  MAX_TIMEOUT_MS,
  MIN_TIMEOUT_MS,
  PRIORITY_MAX,
  PRIORITY_MIN,
  RETRY_MAX_DELAY_MS,
  SCOPE_TEXT_MAX_BYTES,
  TASK_CURSOR_MAX_BYTES,
  TASK_LIST_MAX_LIMIT,
} from '../limits.js';
import {
  CounterSchema,
  intRange,
  itemCount,
  JsonValueSchema,
  LabelsSchema,
  NameSchema,
  nullishOptional,
  PositiveCounterSchema,
  ProgramDescriptorSchema,
  requestObject,
  TimestampSchema,
  TraceContextSchema,
  textField,
} from './common.js';
import { ApplicationErrorSchema, ExecutionFailureSchema } from './execution.js';

/** Default priority when a submit names none (DESIGN §4.1); the middle of PRIORITY_MIN..PRIORITY_MAX. */
const DEFAULT_PRIORITY = 0;

type AddIssue = (info: { message: string; path: [v.ObjectPathItem] }) => void;

/** Reports a rule broken by one field of a checked object, at that field's path. */
function fieldIssue(
  addIssue: AddIssue,
  input: Record<string, unknown>,
  key: string,
  message: string,
): void {
  addIssue({ message, path: [{ type: 'object', origin: 'value', input, key, value: input[key] }] });
}

// ---- Submission ---------------------------------------------------------------

/** `fixed` waits `delay_ms` between attempts; `exponential` doubles it up to `max_delay_ms`, with full jitter. */
export const RetryBackoffSchema = v.picklist(['fixed', 'exponential']);
/** Retry backoff kind. */
export type RetryBackoff = v.InferOutput<typeof RetryBackoffSchema>;

/**
 * Retry policy, including the initial attempt in `max_attempts` (1..100).
 * `delay_ms` is the fixed delay, or the first exponential delay. A policy
 * without `backoff` is fixed (the a3s encoding) and must not set a nonzero
 * `max_delay_ms`; an exponential one needs `1 ≤ delay_ms ≤ max_delay_ms ≤
 * RETRY_MAX_DELAY_MS`. Exponential delays use deterministic full jitter from
 * `(task_id, attempt number)` (see retry.ts).
 *
 * The decoded policy is canonical ({@link canonicalRetryPolicy}): a fixed policy
 * loses `backoff: 'fixed'` and `max_delay_ms: 0`, as the a3s seed serialises it
 * (`skip_serializing_if` `is_fixed` / `is_zero`), so every spelling of one
 * policy is the same command to submit idempotency.
 */
export const RetryPolicySchema = v.pipe(
  requestObject({
    max_attempts: intRange(1, MAX_ATTEMPTS_LIMIT),
    delay_ms: intRange(0, RETRY_MAX_DELAY_MS),
    backoff: nullishOptional(RetryBackoffSchema),
    max_delay_ms: nullishOptional(intRange(0, RETRY_MAX_DELAY_MS)),
  }),
  v.rawCheck(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const policy = dataset.value;
    const input = policy as Record<string, unknown>;
    if (policy.backoff === 'exponential') {
      if (policy.max_delay_ms === undefined) {
        fieldIssue(addIssue, input, 'max_delay_ms', 'is required with exponential backoff');
      } else if (policy.delay_ms < 1) {
        fieldIssue(addIssue, input, 'delay_ms', 'must be at least 1 with exponential backoff');
      } else if (policy.max_delay_ms < policy.delay_ms) {
        fieldIssue(addIssue, input, 'max_delay_ms', 'must be at least delay_ms');
      }
    } else if (policy.max_delay_ms !== undefined && policy.max_delay_ms !== 0) {
      fieldIssue(addIssue, input, 'max_delay_ms', 'must be absent or 0 with fixed backoff');
    }
  }),
  v.transform(canonicalRetryPolicy),
);
/** Retry policy, including the initial attempt in `max_attempts`. */
export type RetryPolicy = v.InferOutput<typeof RetryPolicySchema>;

/**
 * The a3s seed's canonical spelling of a valid retry policy: a fixed policy
 * (`backoff` absent or `'fixed'`) has neither `backoff` (`skip_serializing_if =
 * "RetryBackoff::is_fixed"`) nor `max_delay_ms` ("Zero is canonical for a fixed
 * policy"); an exponential one is kept as it is. A policy already canonical is
 * returned as it is; otherwise a copy without those keys (the argument is not mutated).
 */
export function canonicalRetryPolicy<
  T extends { backoff?: RetryBackoff | undefined; max_delay_ms?: number | undefined },
>(policy: T): T {
  if (policy.backoff === 'exponential') return policy;
  const zeroCap = 'max_delay_ms' in policy && policy.max_delay_ms === 0;
  if (!('backoff' in policy) && !zeroCap) return policy;
  const { backoff: _backoff, ...rest } = policy;
  if (zeroCap) delete (rest as { max_delay_ms?: number }).max_delay_ms;
  return rest as T;
}

/**
 * A request to create one logical task, before assigning run or attempt IDs.
 * `data` is required (JSON `null` allowed) and checked for size
 * (SUBMISSION_DATA_MAX_BYTES) and depth by the decoders; `available_at` and
 * `delay_ms` are exclusive; `concurrency_limit` needs `concurrency_key`.
 * A key's limit is each task's own: a task is claimed only while fewer than
 * its `concurrency_limit` (default 1) tasks of its key, in its namespace, are
 * active, so tasks of one key declaring different limits are each held to
 * theirs (DESIGN §4 is silent; the stores agree on this rule).
 * Optional fields may be omitted or `null`; `null` is normalised away.
 */
export const SubmitTaskSchema = v.pipe(
  requestObject({
    tenant_id: textField(SCOPE_TEXT_MAX_BYTES),
    namespace: textField(SCOPE_TEXT_MAX_BYTES),
    queue: NameSchema,
    program: ProgramDescriptorSchema,
    data: JsonValueSchema,
    retry: nullishOptional(RetryPolicySchema),
    timeout_ms: nullishOptional(intRange(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)),
    available_at: nullishOptional(TimestampSchema),
    delay_ms: nullishOptional(intRange(0, MAX_SUBMIT_DELAY_MS)),
    priority: nullishOptional(intRange(PRIORITY_MIN, PRIORITY_MAX)),
    concurrency_key: nullishOptional(NameSchema),
    concurrency_limit: nullishOptional(intRange(1, MAX_CONCURRENCY_LIMIT)),
    labels: nullishOptional(LabelsSchema),
  }),
  v.rawCheck(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const task = dataset.value;
    const input = task as Record<string, unknown>;
    if (task.available_at !== undefined && task.delay_ms !== undefined) {
      fieldIssue(addIssue, input, 'delay_ms', 'must not be given together with available_at');
    }
    if (task.concurrency_limit !== undefined && task.concurrency_key === undefined) {
      fieldIssue(addIssue, input, 'concurrency_limit', 'requires concurrency_key');
    }
  }),
);
/** A request to create one logical task, before assigning run or attempt IDs. */
export type SubmitTask = v.InferOutput<typeof SubmitTaskSchema>;

/**
 * The portable submit command. HTTP adapters may obtain its idempotency key
 * from a header, but must use the same strict JSON path. The idempotency key
 * makes submission insert-or-return per scope.
 */
export const SubmitCommandSchema = requestObject({
  idempotency_key: textField(KEY_MAX_BYTES),
  input: SubmitTaskSchema,
  origin_trace: nullishOptional(TraceContextSchema),
});
/** The portable submit command. */
export type SubmitCommand = v.InferOutput<typeof SubmitCommandSchema>;

/**
 * The body of `POST {scope}/tasks` when the idempotency key comes in the
 * `Idempotency-Key` header (DESIGN §6): a SubmitCommand without its key.
 */
export const SubmitRequestBodySchema = requestObject({
  input: SubmitTaskSchema,
  origin_trace: nullishOptional(TraceContextSchema),
});
/** The body of `POST {scope}/tasks` when the idempotency key comes in a header. */
export type SubmitRequestBody = v.InferOutput<typeof SubmitRequestBodySchema>;

/** A retry policy with its defaults applied: `backoff` always present. */
export interface ResolvedRetryPolicy {
  /** Dispatched attempts allowed, the first included (1..MAX_ATTEMPTS_LIMIT). */
  max_attempts: number;
  /** The fixed delay, or the first exponential delay, in milliseconds. */
  delay_ms: number;
  /** `fixed` when the submitted policy named none (the a3s encoding). */
  backoff: RetryBackoff;
  /** The exponential cap in milliseconds; absent (or 0) for a fixed policy. */
  max_delay_ms?: number;
}

/** A SubmitTask with the retry, priority and timeout defaults of DESIGN §4.1 filled in. */
export type SubmitTaskWithDefaults = Omit<SubmitTask, 'retry' | 'priority' | 'timeout_ms'> & {
  /** The given policy with `backoff` resolved, or the default exponential one. */
  retry: ResolvedRetryPolicy;
  /** The given priority, or 0. */
  priority: number;
  /** The given attempt timeout, or 300 000 ms. */
  timeout_ms: number;
};

/**
 * The task with the defaults of DESIGN §4.1 filled in, as a new object (the
 * argument is not mutated): an absent `retry` becomes `{max_attempts: 3,
 * delay_ms: 1000, backoff: 'exponential', max_delay_ms: 60000}`; a given
 * `retry` without `backoff` becomes `backoff: 'fixed'`; `priority` 0;
 * `timeout_ms` 300 000. Other fields are copied as they are.
 */
export function applySubmitDefaults(task: SubmitTask): SubmitTaskWithDefaults {
  // Spreads last: a property an object literal adds after a spread is V8's slow path (~1 µs
  // each on Node 20; bench/README.md, "Objects built by spread"), and this runs per task.
  const { retry: given, priority, timeout_ms, ...rest } = task;
  const retry: ResolvedRetryPolicy =
    given === undefined
      ? {
          max_attempts: DEFAULT_MAX_ATTEMPTS,
          delay_ms: DEFAULT_RETRY_DELAY_MS,
          backoff: 'exponential',
          max_delay_ms: DEFAULT_RETRY_MAX_DELAY_MS,
        }
      : { backoff: given.backoff ?? 'fixed', ...withoutBackoff(given) };
  return {
    retry,
    priority: priority ?? DEFAULT_PRIORITY,
    timeout_ms: timeout_ms ?? DEFAULT_TIMEOUT_MS,
    ...rest,
  };
}

function withoutBackoff(retry: NonNullable<SubmitTask['retry']>) {
  const { backoff: _backoff, ...rest } = retry;
  return rest;
}

// ---- States -------------------------------------------------------------------

/** A task's scheduling state. */
export const TaskStateSchema = v.picklist(['queued', 'active', 'succeeded', 'failed', 'cancelled']);
/** A task's scheduling state. */
export type TaskState = v.InferOutput<typeof TaskStateSchema>;

/** The terminal task states: a completion event reports one of these. */
export const TerminalTaskStateSchema = v.picklist(['succeeded', 'failed', 'cancelled']);
/** A terminal task state. */
export type TerminalTaskState = v.InferOutput<typeof TerminalTaskStateSchema>;

/** An attempt's state; `lost` is an attempt whose lease expired. */
export const AttemptStateSchema = v.picklist([
  'active',
  'succeeded',
  'failed',
  'cancelled',
  'lost',
]);
/** An attempt's state. */
export type AttemptState = v.InferOutput<typeof AttemptStateSchema>;

// ---- Snapshot, status, result -------------------------------------------------

/**
 * Transaction-loaded scheduling record. Inputs and the descriptor are
 * immutable. `parent_workflow_id` and `root_workflow_id` are present together
 * only for a nested owned workflow; roots omit both. `workflow_id` is the
 * workflow execution identity, distinct from the per-task run ID;
 * `workflow_activation_id` is present only for a registered workflow
 * controller task. `input` is the normalised SubmitTask; `descriptor` is its
 * `program`.
 */
export const TaskSnapshotSchema = v.pipe(
  v.strictObject({
    parent_workflow_id: v.exactOptional(NameSchema),
    root_workflow_id: v.exactOptional(NameSchema),
    workflow_id: v.exactOptional(NameSchema),
    workflow_activation_id: v.exactOptional(NameSchema),
    task_id: NameSchema,
    run_id: NameSchema,
    idempotency_key: textField(KEY_MAX_BYTES),
    input: SubmitTaskSchema,
    descriptor: ProgramDescriptorSchema,
    origin_trace: v.nullable(TraceContextSchema),
    state: TaskStateSchema,
    submitted_at: TimestampSchema,
    available_at: TimestampSchema,
    terminal_at: v.nullable(TimestampSchema),
    current_attempt_id: v.nullable(NameSchema),
    attempt_count: CounterSchema,
    cancel_requested_at: v.nullable(TimestampSchema),
  }),
  v.rawCheck(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const snapshot = dataset.value;
    if ((snapshot.parent_workflow_id === undefined) !== (snapshot.root_workflow_id === undefined)) {
      fieldIssue(
        addIssue,
        snapshot as Record<string, unknown>,
        snapshot.parent_workflow_id === undefined ? 'root_workflow_id' : 'parent_workflow_id',
        'must be present together with its lineage pair (parent_workflow_id, root_workflow_id)',
      );
    }
  }),
);
/** Transaction-loaded scheduling record. Inputs and the descriptor are immutable. */
export type TaskSnapshot = v.InferOutput<typeof TaskSnapshotSchema>;

/** Scheduling metadata without application input, output, or package payloads. */
export const TaskStatusSchema = v.strictObject({
  task_id: NameSchema,
  run_id: NameSchema,
  queue: NameSchema,
  program: ProgramDescriptorSchema,
  state: TaskStateSchema,
  submitted_at: TimestampSchema,
  available_at: TimestampSchema,
  terminal_at: v.nullable(TimestampSchema),
  attempt_count: CounterSchema,
  max_attempts: CounterSchema,
  cancel_requested_at: v.nullable(TimestampSchema),
  labels: v.exactOptional(LabelsSchema),
  workflow_id: v.exactOptional(NameSchema),
});
/** Scheduling metadata without application input, output, or package payloads. */
export type TaskStatus = v.InferOutput<typeof TaskStatusSchema>;

/**
 * Why a task failed: an application error, an execution failure, or lease
 * expiry with no attempts left (`attempts` reports `attempt_count`). Tagged
 * by `kind`.
 */
export const TaskFailureSchema = v.variant('kind', [
  v.strictObject({ kind: v.literal('application'), error: ApplicationErrorSchema }),
  v.strictObject({ kind: v.literal('execution'), error: ExecutionFailureSchema }),
  v.strictObject({ kind: v.literal('lease_expired'), attempts: CounterSchema }),
]);
/** Why a task failed. */
export type TaskFailure = v.InferOutput<typeof TaskFailureSchema>;

const SucceededOutcomeSchema = v.strictObject({
  state: v.literal('succeeded'),
  output: JsonValueSchema,
});
const FailedOutcomeSchema = v.strictObject({
  state: v.literal('failed'),
  failure: TaskFailureSchema,
});
const CancelledOutcomeSchema = v.strictObject({ state: v.literal('cancelled') });

/**
 * Terminal scheduling outcome. Cancellation never attributes an earlier
 * attempt. Tagged by `state`.
 */
export const TaskOutcomeSchema = v.variant('state', [
  SucceededOutcomeSchema,
  FailedOutcomeSchema,
  CancelledOutcomeSchema,
]);
/** Terminal scheduling outcome. Cancellation never attributes an earlier attempt. */
export type TaskOutcome = v.InferOutput<typeof TaskOutcomeSchema>;

/**
 * The outcome part of a TaskResult: a terminal outcome, or `{state:
 * 'pending'}` while the task is not terminal. Pending is distinct from a
 * successful JSON `null`.
 */
export const TaskResultOutcomeSchema = v.variant('state', [
  SucceededOutcomeSchema,
  FailedOutcomeSchema,
  CancelledOutcomeSchema,
  v.strictObject({ state: v.literal('pending') }),
]);
/** A terminal outcome, or pending. */
export type TaskResultOutcome = v.InferOutput<typeof TaskResultOutcomeSchema>;

/** One coherent task observation. Pending is distinct from successful JSON null. */
export const TaskResultSchema = v.strictObject({
  status: TaskStatusSchema,
  outcome: TaskResultOutcomeSchema,
});
/** One coherent task observation. Pending is distinct from successful JSON null. */
export type TaskResult = v.InferOutput<typeof TaskResultSchema>;

// ---- Listing ------------------------------------------------------------------

/** An opaque task cursor: base64url text of at most TASK_CURSOR_MAX_BYTES. */
export const TaskCursorSchema = v.pipe(
  v.string(),
  v.check(
    (cursor) => cursor.length >= 1 && cursor.length <= TASK_CURSOR_MAX_BYTES,
    `must be 1 to ${TASK_CURSOR_MAX_BYTES} characters`,
  ),
  v.regex(/^[A-Za-z0-9_-]+$/, 'must be base64url text'),
);

/**
 * Exact metadata filters. Submission bounds are inclusive from, exclusive
 * until; label filters combine with AND; `program` matches the program name.
 * An empty range (`submitted_from ≥ submitted_until`) is not an error: it
 * matches nothing.
 */
export const TaskFiltersSchema = requestObject({
  state: nullishOptional(TaskStateSchema),
  queue: nullishOptional(NameSchema),
  program: nullishOptional(NameSchema),
  labels: nullishOptional(LabelsSchema),
  submitted_from: nullishOptional(TimestampSchema),
  submitted_until: nullishOptional(TimestampSchema),
  workflow_id: nullishOptional(NameSchema),
});
/** Exact metadata filters. Submission bounds are inclusive from, exclusive until. */
export type TaskFilters = v.InferOutput<typeof TaskFiltersSchema>;

/**
 * One bounded read. Cursors bind the scope and filters, but allow a new page
 * size. `limit` is 1..TASK_LIST_MAX_LIMIT (absent: TASK_LIST_DEFAULT_LIMIT).
 * The list route's query string becomes this object.
 */
export const TaskListQuerySchema = requestObject({
  filters: TaskFiltersSchema,
  limit: nullishOptional(intRange(1, TASK_LIST_MAX_LIMIT)),
  cursor: nullishOptional(TaskCursorSchema),
});
/** One bounded read. Cursors bind the scope and filters, but allow a new page size. */
export type TaskListQuery = v.InferOutput<typeof TaskListQuerySchema>;

/**
 * A coherent committed view for this read; later pages use later read
 * snapshots. `next_cursor` is omitted on the last page.
 */
export const TaskPageSchema = v.strictObject({
  tasks: v.pipe(v.array(TaskStatusSchema), itemCount(0, TASK_LIST_MAX_LIMIT)),
  next_cursor: v.exactOptional(TaskCursorSchema),
});
/** A coherent committed view for this read; later pages use later read snapshots. */
export type TaskPage = v.InferOutput<typeof TaskPageSchema>;

/** Immutable seek key, ordered by submission time and then UTF-8 task ID bytes. */
export const TaskPositionSchema = v.strictObject({
  submitted_at: TimestampSchema,
  task_id: NameSchema,
});
/** Immutable seek key, ordered by submission time and then UTF-8 task ID bytes. */
export type TaskPosition = v.InferOutput<typeof TaskPositionSchema>;

// ---- History ------------------------------------------------------------------

/** Why a history record was appended. */
export const TransitionReasonSchema = v.picklist([
  'submitted',
  'claimed',
  'dispatch_authorized',
  'cancel_requested',
  'cancelled',
  'report_accepted',
  'cleanup_confirmed',
  'succeeded',
  'failed',
  'retry_scheduled',
  'lease_expired',
]);
/** Why a history record was appended. */
export type TransitionReason = v.InferOutput<typeof TransitionReasonSchema>;

/**
 * Persist with the accompanying records. Per-task ordering is assigned under
 * the same task lock; heartbeat renewals do not append history rows.
 */
export const HistoryEventSchema = v.strictObject({
  task_id: NameSchema,
  attempt_id: v.nullable(NameSchema),
  at: TimestampSchema,
  reason: TransitionReasonSchema,
});
/** Persist with the accompanying records. */
export type HistoryEvent = v.InferOutput<typeof HistoryEventSchema>;

/** A history record with its per-task sequence number (gapless, ordered, from 1). */
export const RecordedHistoryEventSchema = v.strictObject({
  sequence: PositiveCounterSchema,
  event: HistoryEventSchema,
});
/** A history record with its per-task sequence number. */
export type RecordedHistoryEvent = v.InferOutput<typeof RecordedHistoryEventSchema>;

/**
 * The history route's reply: at most HISTORY_PAGE_LIMIT ordered records after
 * the requested sequence. Large application outcomes are fetched through
 * result or inspect_attempt, not history.
 */
export const TaskHistorySchema = v.pipe(
  v.array(RecordedHistoryEventSchema),
  itemCount(0, HISTORY_PAGE_LIMIT),
);
/** The history route's reply. */
export type TaskHistory = v.InferOutput<typeof TaskHistorySchema>;
