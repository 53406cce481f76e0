import {
  applySubmitDefaults,
  ContractError,
  canonicalRetryPolicy,
  MAX_SUBMIT_DELAY_MS,
  MIN_TIMEOUT_MS,
  type SubmitCommand,
  type TaskSnapshot,
  type Timestamp,
} from '@ledgence/contracts';
import type { LifecycleConfig } from './config.js';
import { isRecordedCommand } from './digest.js';
import { recordHistory } from './history.js';
import type { HistoryRow, TaskRow } from './rows.js';
import { taskSnapshot } from './views.js';

/** Identifiers a store issues for a new task. */
export interface SubmitIds {
  /** The new task's id. */
  task_id: string;
  /** The new task's run id. */
  run_id: string;
}

/** What a submit wrote (a new task) or found (the same command submitted before). */
export type SubmitResult =
  | { created: true; task: TaskRow; history: HistoryRow[]; reply: TaskSnapshot }
  | { created: false; task: TaskRow; history: []; reply: TaskSnapshot };

/**
 * The least time a new task's budget leaves above the lease safety margin for its worker's
 * dispatch renewal, which reaches the store one HTTP round trip after the claim: ~2 ms on an idle
 * server, 7–40 ms beside a full drain (bench/README.md, "What limits the remaining gap").
 */
export const MIN_DISPATCH_WINDOW_MS = 500;

/**
 * The shortest `timeout_ms` a server with this configuration accepts: its lease safety margin
 * plus {@link MIN_DISPATCH_WINDOW_MS}, and never below the contract's MIN_TIMEOUT_MS. Dispatch is
 * granted only while more budget than the margin remains (DESIGN §5), counted from the claim, and
 * an attempt never granted dispatch does not count against `max_attempts`: a budget at or below
 * the margin could never run nor fail, and one a few ms above it leaves the dispatch renewal no
 * time to arrive — either would re-queue the task for ever (DESIGN §1 "bounded everything").
 */
export function minSubmitTimeoutMs(config: Pick<LifecycleConfig, 'leaseSafetyMarginMs'>): number {
  return Math.max(MIN_TIMEOUT_MS, config.leaseSafetyMarginMs + MIN_DISPATCH_WINDOW_MS);
}

/**
 * Insert-or-return by `(tenant, namespace, idempotency_key)`: the same key
 * with the same canonical command returns the existing task; with another
 * command it is `409 conflict` (DESIGN §5 Submit). A new task records no
 * digest of its command: a replay compares the command rebuilt from the row
 * ({@link isRecordedCommand}). A new task's `timeout_ms` (explicit or default) must be at
 * least {@link minSubmitTimeoutMs}; a replay answers as before, whatever its timeout.
 *
 * @param existing - the task already holding the key in this scope, if any, with its
 *   `input.data` loaded (the replay comparison reads it).
 * @param config - the store's configuration; its lease safety margin bounds `timeout_ms`.
 */
export function submitTask(
  existing: TaskRow | null,
  command: SubmitCommand,
  now: Timestamp,
  ids: SubmitIds,
  config: Pick<LifecycleConfig, 'leaseSafetyMarginMs'>,
): SubmitResult {
  if (existing !== null) {
    if (!isSameSubmit(existing, command)) {
      // Naming the task the key holds lets the caller look at what it submitted before (the key
      // is the caller's, scoped to its namespace, so the id tells it nothing foreign).
      throw new ContractError(
        'conflict',
        `this idempotency key already names task ${existing.task_id}, submitted with a different command`,
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
  checkTimeout(withDefaults.timeout_ms, config);
  const fresh: TaskRow = {
    tenant_id: input.tenant_id,
    namespace: input.namespace,
    task_id: ids.task_id,
    run_id: ids.run_id,
    idempotency_key: command.idempotency_key,
    command_digest: null,
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

/** Refuses a new task's budget when a worker could not be granted dispatch in it ({@link minSubmitTimeoutMs}). */
function checkTimeout(
  timeoutMs: number,
  config: Pick<LifecycleConfig, 'leaseSafetyMarginMs'>,
): void {
  const minTimeoutMs = minSubmitTimeoutMs(config);
  if (timeoutMs >= minTimeoutMs) return;
  throw new ContractError(
    'invalid_input',
    `timeout_ms must be at least ${MIN_DISPATCH_WINDOW_MS} ms more than the server's lease safety ` +
      `margin (${config.leaseSafetyMarginMs} ms): dispatch is granted only while more than the ` +
      `margin remains, so a shorter budget leaves a worker no time to start an attempt; use at ` +
      `least ${minTimeoutMs}`,
    { reason: 'schema', path: '$.input.timeout_ms' },
  );
}

/**
 * Whether `command` is the command `existing` was created by, canonically. Both sides' retry
 * policies are compared in their canonical spelling ({@link canonicalRetryPolicy}): a row
 * recorded before the decoder canonicalised them keeps `backoff: 'fixed'` or `max_delay_ms: 0`
 * in its input. A row recorded with a digest (before migration 0002) digested the command as
 * the client spelled it, so a fixed policy is tried in each of its four spellings.
 */
function isSameSubmit(existing: TaskRow, command: SubmitCommand): boolean {
  const recorded = canonicalSubmit(recordedSubmit(existing));
  const given = canonicalSubmit(asRecorded(command));
  if (existing.command_digest === null) return isRecordedCommand(recorded, null, given);
  return fixedRetrySpellings(given).some((spelling) =>
    isRecordedCommand(recorded, existing.command_digest, spelling),
  );
}

/** The command with its retry policy in the canonical spelling; the argument is not mutated. */
function canonicalSubmit(command: SubmitCommand): SubmitCommand {
  const retry = command.input.retry;
  if (retry === undefined) return command;
  const canonical = canonicalRetryPolicy(retry);
  return canonical === retry
    ? command
    : { ...command, input: { ...command.input, retry: canonical } };
}

/**
 * Every spelling of a canonical command's fixed retry policy (with and without `backoff:
 * 'fixed'` and `max_delay_ms: 0`, the canonical one first); the command alone otherwise.
 */
function fixedRetrySpellings(command: SubmitCommand): SubmitCommand[] {
  const retry = command.input.retry;
  if (retry === undefined || retry.backoff === 'exponential') return [command];
  const spelled = (extra: Partial<NonNullable<SubmitCommand['input']['retry']>>) => ({
    ...command,
    input: { ...command.input, retry: { ...retry, ...extra } },
  });
  return [
    command,
    spelled({ backoff: 'fixed' }),
    spelled({ max_delay_ms: 0 }),
    spelled({ backoff: 'fixed', max_delay_ms: 0 }),
  ];
}

/**
 * The submit command a task was created by, rebuilt from its row: the key, the input as
 * accepted (with its data) and the origin trace. A task read without its payload cannot be
 * compared, and saying so beats a false `409`.
 */
function recordedSubmit(task: TaskRow): SubmitCommand {
  if (!('data' in task.input)) {
    throw new Error(
      `task ${task.task_id} was loaded without its data; a submit replay compares it`,
    );
  }
  return asRecorded({
    idempotency_key: task.idempotency_key,
    input: task.input,
    origin_trace: task.origin_trace ?? undefined,
  });
}

/**
 * A submit command in the form a row records it: the three fields of the wire command, and
 * `origin_trace` left out when there is none — the row cannot tell an explicit `null` from an
 * absent trace, and the wire normalises one to the other (DESIGN §4.1).
 */
function asRecorded(command: SubmitCommand): SubmitCommand {
  const { idempotency_key, input, origin_trace } = command;
  return origin_trace == null
    ? { idempotency_key, input }
    : { idempotency_key, input, origin_trace };
}
