/**
 * Mapping between table rows (as postgres.js returns them) and the core's records. postgres.js
 * returns `bigint` as text (coerced here with `Number`: every stored value is below 2^53) and
 * parses `json`/`jsonb`. JSON parameters are always sent as text inside `text[]` arrays and cast
 * in SQL: a scalar parameter the server types as json would be JSON-encoded a second time.
 */
import type {
  AcceptedSettlement,
  AcquireCommand,
  AttemptRef,
  LeaseOwner,
  RenewCommand,
  SettleCommand,
  SubmitTask,
  TaskOutcome,
} from '@ledgence/contracts';
import {
  type AttemptRow,
  type CursorRow,
  leaseOwner,
  type OwnerAttemptColumns,
  type OwnerScopeColumns,
  ownerMatches,
  type SessionRow,
  type SubscriptionRow,
  type TaskRow,
} from '@ledgence/core';

/** A row as the driver returns it. */
export type DbRow = Record<string, unknown>;

/** A number column (bigint arrives as text). */
export function num(value: unknown): number {
  return typeof value === 'number' ? value : Number(value);
}

function numOrNull(value: unknown): number | null {
  return value === null || value === undefined ? null : num(value);
}

/**
 * A `json` column as postgres.js parsed it (its default types parse `json` and `jsonb`); SQL
 * NULL stays null. A string here is a JSON string value, never JSON text to parse again, so a
 * client given to the store must keep postgres.js's default JSON parsing.
 */
export function jsonColumn(value: unknown): unknown {
  return value === undefined ? null : value;
}

function jsonbColumn<T>(value: unknown): T {
  return value as T;
}

/** JSON text for a `json`/`jsonb` parameter (SQL NULL for null). */
export function jsonText(value: unknown): string | null {
  return value === null || value === undefined ? null : JSON.stringify(value);
}

/** JSON text for a value that must be stored even when it is JSON `null` (payload data, output). */
export function jsonValueText(value: unknown): string {
  return JSON.stringify(value === undefined ? null : value);
}

/** The `input` column: the submission without its application `data`. */
export function inputColumn(input: SubmitTask): string {
  const { data: _data, ...rest } = input;
  return JSON.stringify(rest);
}

/** The `outcome` column: a success's output lives in `task_payloads.output`, not here. */
export function outcomeColumn(outcome: TaskOutcome | null): string | null {
  if (outcome === null) return null;
  if (outcome.state === 'succeeded') return JSON.stringify({ state: 'succeeded' });
  return JSON.stringify(outcome);
}

/** The identity columns of an attempt row: every field of its lease owner is one of them. */
type AttemptIdentity = OwnerScopeColumns & OwnerAttemptColumns;

const ownerOf = (row: AttemptIdentity): LeaseOwner => leaseOwner(row, row);
const isRowOwner = (owner: LeaseOwner, row: AttemptIdentity): boolean =>
  ownerMatches(row, row, owner);

/*
 * `last_renewal` and `settlement` are stored without what the row's own columns already say
 * (issue #7: a settled attempt row was ~1.6 KB, 0.6 KB of it the owner's ids twice more and a
 * receipt that repeats the command; every renewal and the settle write the row whole). A renewal
 * or a settlement is recorded only for the attempt's own owner (`ownerMatches` in the core), so
 * the owner is rebuilt from the row; should one ever differ, the whole value is stored instead,
 * and the reader takes either form: rows written before this change are the whole form too.
 */

/** The `last_renewal` column: the renew command without its owner (see above). */
export function lastRenewalColumn(row: AttemptRow): string | null {
  const renewal = row.last_renewal;
  if (renewal === null) return null;
  if (!isRowOwner(renewal.owner, row)) return JSON.stringify(renewal);
  const { owner: _owner, ...rest } = renewal;
  return JSON.stringify(rest);
}

/**
 * The `settlement` column: the settle command without its owner, and of the receipt only
 * `accepted_at` (its operation, task and attempt ids are the command's and the row's).
 */
export function settlementColumn(row: AttemptRow): string | null {
  const settlement = row.settlement;
  if (settlement === null) return null;
  const { command, receipt } = settlement;
  const derivable =
    isRowOwner(command.owner, row) &&
    receipt.operation_id === command.operation_id &&
    receipt.task_id === row.task_id &&
    receipt.attempt_id === row.attempt_id;
  if (!derivable) return JSON.stringify(settlement);
  const { owner: _owner, ...rest } = command;
  return JSON.stringify({ command: rest, accepted_at: receipt.accepted_at });
}

function lastRenewalFromDb(stored: unknown, row: AttemptIdentity): RenewCommand | null {
  if (stored === null || stored === undefined) return null;
  const value = stored as Record<string, unknown>;
  if ('owner' in value) return value as unknown as RenewCommand;
  return { owner: ownerOf(row), ...value } as RenewCommand;
}

function settlementFromDb(stored: unknown, row: AttemptIdentity): AcceptedSettlement | null {
  if (stored === null || stored === undefined) return null;
  const value = stored as Record<string, unknown>;
  if ('receipt' in value) return value as unknown as AcceptedSettlement;
  const rest = value.command as Omit<SettleCommand, 'owner'>;
  return {
    command: { owner: ownerOf(row), ...rest } as SettleCommand,
    receipt: {
      operation_id: rest.operation_id,
      task_id: row.task_id,
      attempt_id: row.attempt_id,
      accepted_at: num(value.accepted_at),
    },
  };
}

/** Whether a payload was loaded alongside the task (`data`, and `output` for results). */
export interface LoadedPayload {
  data?: unknown;
  output?: unknown;
}

/**
 * A task's submission with its application `data` (loaded from `task_payloads`) in place of any
 * it had; `data` before the spread (see {@link attemptFromDb}).
 */
function inputWithData(input: Omit<SubmitTask, 'data'>, data: unknown): SubmitTask {
  const { data: _stale, ...rest } = input as SubmitTask;
  return { data, ...rest };
}

/**
 * A task row. Without a loaded payload, `input.data` is absent: the operations that load no
 * payload (renew, settle, cancel, recovery) never read or write it.
 */
export function taskFromDb(row: DbRow, payload: LoadedPayload = {}): TaskRow {
  const stored = jsonbColumn<Omit<SubmitTask, 'data'>>(row.input);
  const input = 'data' in payload ? inputWithData(stored, payload.data) : (stored as SubmitTask);
  let outcome = jsonColumn(row.outcome) as TaskOutcome | null;
  if (outcome !== null && outcome.state === 'succeeded') {
    outcome = { state: 'succeeded', output: 'output' in payload ? payload.output : null };
  }
  return {
    tenant_id: String(row.tenant_id),
    namespace: String(row.namespace),
    task_id: String(row.task_id),
    run_id: String(row.run_id),
    idempotency_key: String(row.idempotency_key),
    command_digest: row.command_digest === null ? null : String(row.command_digest),
    input,
    origin_trace: row.origin_trace === null ? null : jsonbColumn(row.origin_trace),
    queue: String(row.queue),
    program: jsonbColumn(row.program),
    retry: jsonbColumn(row.retry),
    timeout_ms: num(row.timeout_ms),
    priority: num(row.priority),
    concurrency_key: row.concurrency_key === null ? null : String(row.concurrency_key),
    concurrency_limit: numOrNull(row.concurrency_limit),
    labels: jsonbColumn(row.labels),
    state: row.state as TaskRow['state'],
    submitted_at: num(row.submitted_at),
    available_at: num(row.available_at),
    terminal_at: numOrNull(row.terminal_at),
    attempt_count: num(row.attempt_count),
    dispatch_count: num(row.dispatch_count),
    current_attempt_id: row.current_attempt_id === null ? null : String(row.current_attempt_id),
    cancel_requested_at: numOrNull(row.cancel_requested_at),
    outcome,
    history_sequence: num(row.history_sequence),
  };
}

/** An attempt row. */
export function attemptFromDb(row: DbRow): AttemptRow {
  const identity: AttemptIdentity = {
    tenant_id: String(row.tenant_id),
    namespace: String(row.namespace),
    task_id: String(row.task_id),
    attempt_id: String(row.attempt_id),
    lease_id: String(row.lease_id),
    generation: num(row.generation),
    worker_session_id: String(row.worker_session_id),
    consumer_id: num(row.consumer_id),
  };
  // Every field spelled out, not `{ ...identity, ordinal, … }`: on Node 20's V8 each property
  // an object literal adds after a spread takes the slow path, ~1 µs (a spread that only
  // overrides is fast). Up to three calls per task made this 5.5 % of the server's busy time
  // in a strict drain (bench/README.md, "Objects built by spread").
  return {
    tenant_id: identity.tenant_id,
    namespace: identity.namespace,
    task_id: identity.task_id,
    attempt_id: identity.attempt_id,
    lease_id: identity.lease_id,
    generation: identity.generation,
    worker_session_id: identity.worker_session_id,
    consumer_id: identity.consumer_id,
    ordinal: num(row.ordinal),
    state: row.state as AttemptRow['state'],
    claimed_at: num(row.claimed_at),
    deadline: num(row.deadline),
    authority_deadline: num(row.authority_deadline),
    lease_expires_at: num(row.lease_expires_at),
    renew_sequence: num(row.renew_sequence),
    last_renewal: lastRenewalFromDb(row.last_renewal, identity),
    dispatch_allowed: Boolean(row.dispatch_allowed),
    quiescence: row.quiescence as AttemptRow['quiescence'],
    settlement: settlementFromDb(row.settlement, identity),
    settlement_digest: row.settlement_digest === null ? null : String(row.settlement_digest),
    pending: jsonColumn(row.pending) as AttemptRow['pending'],
    finished_at: numOrNull(row.finished_at),
  };
}

/** A session row. */
export function sessionFromDb(row: DbRow): SessionRow {
  return {
    id: String(row.session_id),
    tenant_id: String(row.tenant_id),
    namespace: String(row.namespace),
    queue: String(row.queue),
    concurrency: num(row.concurrency),
    created_at: num(row.created_at),
    expires_at: num(row.expires_at),
  };
}

/** A consumer cursor row. */
export function cursorFromDb(row: DbRow): CursorRow {
  return {
    worker_session_id: String(row.worker_session_id),
    consumer_id: num(row.consumer_id),
    sequence: num(row.sequence),
    command: jsonbColumn<AcquireCommand>(row.command),
    assignment: row.assignment === null ? null : jsonbColumn<AttemptRef>(row.assignment),
  };
}

/**
 * The in-memory map key of something identified by `id` within a scope (a task, a session, a
 * queue, an idempotency or concurrency key): the parts NUL-joined, which is unambiguous because
 * no scope text or identifier can contain a control character.
 */
export function scopedKey(tenant: string, namespace: string, id: string): string {
  return `${tenant}\u0000${namespace}\u0000${id}`;
}

/** The in-memory key of a task. */
export function taskKey(tenant: string, namespace: string, taskId: string): string {
  return scopedKey(tenant, namespace, taskId);
}

/** The in-memory key of an attempt. */
export function attemptKey(
  tenant: string,
  namespace: string,
  taskId: string,
  attemptId: string,
): string {
  return scopedKey(tenant, namespace, `${taskId}\u0000${attemptId}`);
}

/**
 * A subscription with its delivery (a `completion_subscriptions` row joined to its
 * `completion_deliveries` row).
 */
export function subscriptionFromDb(row: DbRow): SubscriptionRow {
  return {
    tenant_id: String(row.tenant_id),
    namespace: String(row.namespace),
    subscription_id: String(row.subscription_id),
    task_id: String(row.task_id),
    subscription_key: String(row.subscription_key),
    destination: String(row.destination),
    event_id: String(row.event_id),
    created_at: num(row.created_at),
    state: row.state as SubscriptionRow['state'],
    generation: num(row.generation),
    attempts: num(row.attempts),
    next_attempt_at: numOrNull(row.next_attempt_at),
    delivered_at: numOrNull(row.delivered_at),
    finished_at: numOrNull(row.finished_at),
    last_status_code: numOrNull(row.last_status_code),
    last_error:
      row.last_error === null || row.last_error === undefined ? null : String(row.last_error),
  };
}
