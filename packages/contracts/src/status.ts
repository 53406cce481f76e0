/**
 * The size of a task's status reply, known at submit (DESIGN §12 TASK_STATUS_MAX_BYTES).
 *
 * A `TaskStatus` holds what the submission fixed (queue, program, labels, max_attempts) beside
 * what changes over the task's life (state, timestamps, attempt_count) and identifiers the server
 * issues. Every one of the latter has a widest form, so the largest status a submission can ever
 * produce is known before the task exists, and a submission whose status could outgrow the limit
 * is refused then, rather than answering an oversized status later.
 */
import { JSON_MAX_SAFE_NUMBER, NAME_MAX_BYTES } from './limits.js';
import {
  applySubmitDefaults,
  type Labels,
  type ProgramDescriptor,
  type SubmitTask,
  TaskStateSchema,
  type TaskStatus,
} from './schemas/index.js';
import { utf8ByteLength } from './text.js';

/**
 * The widest identifier the server issues (`task_id`, `run_id`): as long as a name may be
 * (NAME_MAX_BYTES), and of characters JSON writes as they are, since the server never issues
 * an identifier with a quote or a backslash in it.
 */
const WIDEST_ISSUED_ID = 'x'.repeat(NAME_MAX_BYTES);

/** The longest state name (`succeeded`, `cancelled`): a task may end in either. */
const WIDEST_STATE = TaskStateSchema.options.reduce((a, b) => (b.length > a.length ? b : a));

/**
 * The widest timestamp or counter: every one of them is an integer in 0..2^53−1 (DESIGN §4.1).
 * `attempt_count` has no smaller bound: an attempt lost before dispatch does not count against
 * `max_attempts`, so claims can go on past it.
 */
const WIDEST_NUMBER = JSON_MAX_SAFE_NUMBER;

/**
 * The status of a task with these submitted fields at its widest. `workflow_id` is left out: a
 * submitted task never has one.
 */
function widestStatus(
  queue: string,
  program: ProgramDescriptor,
  maxAttempts: number,
  labels?: Labels,
): TaskStatus {
  const status: TaskStatus = {
    task_id: WIDEST_ISSUED_ID,
    run_id: WIDEST_ISSUED_ID,
    queue,
    program,
    state: WIDEST_STATE,
    submitted_at: WIDEST_NUMBER,
    available_at: WIDEST_NUMBER,
    terminal_at: WIDEST_NUMBER,
    attempt_count: WIDEST_NUMBER,
    max_attempts: maxAttempts,
    cancel_requested_at: WIDEST_NUMBER,
  };
  if (labels !== undefined) status.labels = labels;
  return status;
}

/** Compact JSON bytes of `value`, as the status route writes it (`JSON.stringify`). */
function encodedBytes(value: unknown): number {
  return utf8ByteLength(JSON.stringify(value));
}

// A member of a JSON object adds its own bytes (`,"key":value`) whatever the others are, so the
// widest status is measured once here, and per submission only the fields it fixes are encoded:
// one stringify of the whole status, big numbers and long ids included, took ~4 µs per submit
// against ~1 µs this way.
const EMPTY_PROGRAM: ProgramDescriptor = { name: '' };
/** The widest status's bytes but for its queue, program and max_attempts values. */
const FIXED_BYTES =
  encodedBytes(widestStatus('', EMPTY_PROGRAM, 0)) -
  encodedBytes('') -
  encodedBytes(EMPTY_PROGRAM) -
  encodedBytes(0);
/** What a `labels` member adds besides its value: `,"labels":`. */
const LABELS_MEMBER_BYTES =
  encodedBytes(widestStatus('', EMPTY_PROGRAM, 0, {})) -
  encodedBytes(widestStatus('', EMPTY_PROGRAM, 0)) -
  encodedBytes({});

/**
 * The compact JSON size in bytes of the largest `TaskStatus` that a task submitted as `task`
 * can ever have: its own queue, program, labels and max_attempts, with every field that changes
 * over its life (state, the four timestamps, attempt_count) and the server-issued ids at their
 * widest. A task whose bound is at most TASK_STATUS_MAX_BYTES answers every status read within
 * that limit.
 *
 * @example
 * taskStatusMaxBytes({ tenant_id: 'acme', namespace: 'prod', queue: 'q', program: { name: 'p' }, data: null });
 * // → 521
 */
export function taskStatusMaxBytes(task: SubmitTask): number {
  const { queue, program, labels } = task;
  const bytes =
    FIXED_BYTES +
    encodedBytes(queue) +
    encodedBytes(program) +
    encodedBytes(applySubmitDefaults(task).retry.max_attempts);
  // As the status route answers: labels only when there are some.
  if (labels == null || Object.keys(labels).length === 0) return bytes;
  return bytes + LABELS_MEMBER_BYTES + encodedBytes(labels);
}
