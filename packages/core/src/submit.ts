import {
  applySubmitDefaults,
  ContractError,
  MAX_SUBMIT_DELAY_MS,
  type SubmitCommand,
  type TaskSnapshot,
  type Timestamp,
} from '@ledgence/contracts';
import { recordHistory } from './history.js';
import type { HistoryRow, TaskRow } from './rows.js';
import { taskSnapshot } from './views.js';

/** Identifiers a store issues for a new task. */
export interface SubmitIds {
  task_id: string;
  run_id: string;
}

/** What a submit wrote (a new task) or found (the same command submitted before). */
export type SubmitResult =
  | { created: true; task: TaskRow; history: HistoryRow[]; reply: TaskSnapshot }
  | { created: false; task: TaskRow; history: []; reply: TaskSnapshot };

/**
 * Insert-or-return by `(tenant, namespace, idempotency_key)`: the same key
 * with the same canonical command returns the existing task; with another
 * command it is `409 conflict` (DESIGN §5 Submit).
 *
 * @param existing - the task already holding the key in this scope, if any.
 * @param digest - {@link commandDigest} of `command`.
 */
export function submitTask(
  existing: TaskRow | null,
  command: SubmitCommand,
  digest: string,
  now: Timestamp,
  ids: SubmitIds,
): SubmitResult {
  if (existing !== null) {
    if (existing.command_digest !== digest) {
      throw new ContractError(
        'conflict',
        'this idempotency key was used for a different submit command',
        { reason: 'idempotency_key_reused' },
      );
    }
    return { created: false, task: existing, history: [], reply: taskSnapshot(existing) };
  }
  const input = command.input;
  const withDefaults = applySubmitDefaults(input);
  const availableAt = input.available_at ?? now + (input.delay_ms ?? 0);
  if (availableAt - now > MAX_SUBMIT_DELAY_MS) {
    throw new ContractError(
      'invalid_input',
      `$.input.available_at must be at most ${MAX_SUBMIT_DELAY_MS} ms after store time`,
      { reason: 'schema', path: '$.input.available_at' },
    );
  }
  const fresh: TaskRow = {
    tenant_id: input.tenant_id,
    namespace: input.namespace,
    task_id: ids.task_id,
    run_id: ids.run_id,
    idempotency_key: command.idempotency_key,
    command_digest: digest,
    input,
    origin_trace: command.origin_trace ?? null,
    queue: input.queue,
    program: input.program,
    retry: withDefaults.retry,
    timeout_ms: withDefaults.timeout_ms,
    priority: withDefaults.priority,
    concurrency_key: input.concurrency_key ?? null,
    // A key without a limit admits one active task at a time, the usual mutex.
    concurrency_limit: input.concurrency_key === undefined ? null : (input.concurrency_limit ?? 1),
    labels: input.labels ?? {},
    state: 'queued',
    submitted_at: now,
    available_at: availableAt,
    terminal_at: null,
    attempt_count: 0,
    dispatch_count: 0,
    current_attempt_id: null,
    cancel_requested_at: null,
    outcome: null,
    history_sequence: 0,
  };
  const { task, history } = recordHistory(fresh, now, [['submitted', null]]);
  return { created: true, task, history, reply: taskSnapshot(task) };
}
