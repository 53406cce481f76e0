import {
  type Assignment,
  type AttemptSnapshot,
  buildTaskEvent,
  type CloudEvent,
  encodeTaskCursor,
  type RecordedHistoryEvent,
  type Scope,
  TASK_CURSOR_MAX_BYTES,
  TASK_PAGE_MAX_BYTES,
  type TaskFilters,
  type TaskPage,
  type TaskResult,
  type TaskSnapshot,
  type TaskStatus,
  type Timestamp,
  utf8ByteLength,
} from '@ledgence/contracts';
import { authorityAt, leaseOf } from './lease.js';
import type { AttemptRow, HistoryRow, TaskRow } from './rows.js';

/** The transaction-loaded scheduling record: inputs and the descriptor are immutable. */
export function taskSnapshot(task: TaskRow): TaskSnapshot {
  return {
    task_id: task.task_id,
    run_id: task.run_id,
    idempotency_key: task.idempotency_key,
    input: task.input,
    descriptor: task.program,
    origin_trace: task.origin_trace,
    state: task.state,
    submitted_at: task.submitted_at,
    available_at: task.available_at,
    terminal_at: task.terminal_at,
    current_attempt_id: task.current_attempt_id,
    attempt_count: task.attempt_count,
    cancel_requested_at: task.cancel_requested_at,
  };
}

/** Scheduling metadata without application input, output or payloads. */
export function taskStatus(task: TaskRow): TaskStatus {
  const status: TaskStatus = {
    task_id: task.task_id,
    run_id: task.run_id,
    queue: task.queue,
    program: task.program,
    state: task.state,
    submitted_at: task.submitted_at,
    available_at: task.available_at,
    terminal_at: task.terminal_at,
    attempt_count: task.attempt_count,
    max_attempts: task.retry.max_attempts,
    cancel_requested_at: task.cancel_requested_at,
  };
  if (Object.keys(task.labels).length > 0) status.labels = task.labels;
  return status;
}

/**
 * The bytes of a page's compact encoding around its statuses, `{"tasks":[` … `]}`, with room for
 * the longest `,"next_cursor":"…"` it may carry: whether a cursor follows is known only once the
 * page is cut, and a cursor is at most TASK_CURSOR_MAX_BYTES of base64url, which JSON writes as
 * it is.
 */
const PAGE_ENVELOPE_BYTES =
  utf8ByteLength(JSON.stringify({ tasks: [], next_cursor: '' })) + TASK_CURSOR_MAX_BYTES;

/**
 * One page of a task list (DESIGN §4, §12). `rows` are the tasks matching the query after its
 * cursor, in listing order, at most `limit + 1` of them: the one beyond a full page tells that
 * another page follows. The page holds up to `limit` statuses and stops before its compact
 * encoding would pass TASK_PAGE_MAX_BYTES, so it may hold fewer; `next_cursor` then continues
 * right after its last status, and is absent only when no matching task is left.
 */
export function taskPage(
  scope: Scope,
  filters: TaskFilters,
  rows: readonly TaskRow[],
  limit: number,
): TaskPage {
  const tasks: TaskStatus[] = [];
  let bytes = PAGE_ENVELOPE_BYTES;
  for (const row of rows) {
    if (tasks.length === limit) break;
    const status = taskStatus(row);
    // A comma separates each status from the one before.
    const size = utf8ByteLength(JSON.stringify(status)) + (tasks.length > 0 ? 1 : 0);
    // The first status is always taken, so a page with a cursor is never empty: one status is
    // far smaller than a page (at most TASK_STATUS_MAX_BYTES from submit on), and the next page
    // could start nowhere else anyway.
    if (tasks.length > 0 && bytes + size > TASK_PAGE_MAX_BYTES) break;
    bytes += size;
    tasks.push(status);
  }
  const page: TaskPage = { tasks };
  const last = tasks.at(-1);
  if (rows.length > tasks.length && last !== undefined) {
    page.next_cursor = encodeTaskCursor(scope, filters, {
      submitted_at: last.submitted_at,
      task_id: last.task_id,
    });
  }
  return page;
}

/** One coherent observation; pending is distinct from a successful JSON null. */
export function taskResult(task: TaskRow): TaskResult {
  return { status: taskStatus(task), outcome: task.outcome ?? { state: 'pending' } };
}

/**
 * The attempt's immutable invocation event. Rebuilt from the task and the
 * attempt (its time is the claim time), so the data is stored once, on the task.
 */
export function invocationEvent(task: TaskRow, attempt: AttemptRow): CloudEvent {
  return buildTaskEvent({
    scope: { tenant_id: task.tenant_id, namespace: task.namespace },
    queue: task.queue,
    task_id: task.task_id,
    run_id: task.run_id,
    attempt_id: attempt.attempt_id,
    attempt: attempt.ordinal,
    program: task.program,
    data: task.input.data,
    time: attempt.claimed_at,
    trace: task.origin_trace,
  });
}

/** An assignment with authority sampled at `now`. */
export function assignmentAt(task: TaskRow, attempt: AttemptRow, now: Timestamp): Assignment {
  return {
    descriptor: task.program,
    event: invocationEvent(task, attempt),
    lease: leaseOf(task, attempt),
    authority: authorityAt(task, attempt, now),
    attempt_deadline: attempt.deadline,
  };
}

/** One attempt as recorded. */
export function attemptSnapshot(task: TaskRow, attempt: AttemptRow): AttemptSnapshot {
  return {
    event: invocationEvent(task, attempt),
    descriptor: task.program,
    lease: leaseOf(task, attempt),
    deadline: attempt.deadline,
    authority_deadline: attempt.authority_deadline,
    state: attempt.state,
    execution_may_have_started: attempt.dispatch_allowed,
    last_renewal: attempt.last_renewal,
    quiescence: attempt.quiescence,
    settlement: attempt.settlement,
    finished_at: attempt.finished_at,
  };
}

/** A stored history row in its wire shape. */
export function recordedHistoryEvent(row: HistoryRow): RecordedHistoryEvent {
  return {
    sequence: row.sequence,
    event: { task_id: row.task_id, attempt_id: row.attempt_id, at: row.at, reason: row.reason },
  };
}
