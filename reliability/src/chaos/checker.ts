/**
 * The chaos checker: reads the run's JSONL logs (what clients were told, what workers executed,
 * what the receiver got, which faults happened) and the whole database, and judges each
 * invariant of the issue as a named check with its violations and a few examples.
 */
import type postgres from 'postgres';
import {
  type DeliveryRecord,
  type ExecutionRecord,
  type FaultRecord,
  type JobData,
  type SubmitRecord,
  TASK_RETRY,
  type UnexpectedExit,
} from './model.js';

/** One invariant's verdict. */
export interface CheckResult {
  name: string;
  violations: number;
  /** Up to {@link MAX_EXAMPLES} concrete violations. */
  examples: string[];
}

const MAX_EXAMPLES = 5;

/** The checks, in the order they are reported; the test asserts each by this name. */
export const CHECKS = {
  submitsDurable: 'acknowledged submits are never lost',
  allTerminal: 'no task is non-terminal after drain',
  settlements: 'at most one accepted settlement per attempt, none from a stale lease',
  dispatch: 'dispatched attempts stay within the retry policy',
  history: 'history is gapless with legal transitions only',
  idempotency: 'a repeated idempotency key yields the same task',
  deliveries: 'terminal tasks with subscriptions have their deliveries',
  outcomes: "outcomes match the programs' behaviour",
  processes: 'no process exits on its own; replicas recover after PostgreSQL restarts',
} as const;

/** A row the checker reads. */
export interface TaskRow {
  tenant_id: string;
  namespace: string;
  task_id: string;
  idempotency_key: string;
  state: string;
  attempt_count: number;
  dispatch_count: number;
  history_sequence: number;
  max_attempts: number;
  /** `application`, `execution` or `lease_expired` for a failed task. */
  failure_kind: string | null;
  /** An execution failure's kind (`timed_out`, `crashed`, …). */
  execution_kind: string | null;
  /** Whether a failed task's last failure was retryable (`retryable !== false`); absent: unknown. */
  failure_retryable?: boolean | null;
  data: JobData;
  submitted_at: number;
  terminal_at: number | null;
}

/** A row the checker reads. */
export interface AttemptRow {
  task_id: string;
  attempt_id: string;
  ordinal: number;
  state: string;
  claimed_at: number;
  lease_expires_at: number;
  dispatch_allowed: boolean;
  accepted_at: number | null;
  /**
   * What the accepted settlement reported: `success` or `application_error` (a completed
   * report's outcome), `execution` (a failed report); null without a settlement; absent: unknown
   * (then only the attempt's state tells a success).
   */
  report?: 'success' | 'application_error' | 'execution' | null;
}

/** A row the checker reads. */
export interface HistoryRow {
  task_id: string;
  sequence: number;
  attempt_id: string | null;
  /** Store time of the record, ms. */
  at: number;
  reason: string;
}

/** A row the checker reads. */
export interface SubscriptionRow {
  subscription_id: string;
  task_id: string;
  event_id: string;
  state: string;
}

/** Everything the checker reads. */
export interface Evidence {
  submits: SubmitRecord[];
  executions: ExecutionRecord[];
  deliveries: DeliveryRecord[];
  faults: FaultRecord[];
  unexpectedExits: UnexpectedExit[];
  unrecoveredRestarts: number;
}

/** The database's record of the run, loaded once. */
export interface DatabaseRecord {
  tasks: Map<string, TaskRow>;
  attempts: Map<string, AttemptRow[]>;
  history: Map<string, HistoryRow[]>;
  subscriptions: SubscriptionRow[];
}

/** Loads every task, attempt, history row and subscription (numbers as JS numbers). */
export async function loadRecord(sql: postgres.Sql): Promise<DatabaseRecord> {
  const tasks = await sql<TaskRow[]>`
    select t.tenant_id, t.namespace, t.task_id, t.idempotency_key, t.state,
      t.attempt_count, t.dispatch_count, t.history_sequence,
      (t.retry->>'max_attempts')::int as max_attempts,
      t.outcome->'failure'->>'kind' as failure_kind,
      t.outcome->'failure'->'error'->>'kind' as execution_kind,
      -- DESIGN §5: a failure retries when retryable is not false and attempts remain.
      case when t.outcome->'failure' is null then null
        when t.outcome->'failure'->>'kind' = 'lease_expired' then true
        else coalesce((t.outcome->'failure'->'error'->>'retryable')::boolean, true)
      end as failure_retryable, p.data,
      t.submitted_at::float8 as submitted_at, t.terminal_at::float8 as terminal_at
    from tasks t join task_payloads p using (tenant_id, namespace, task_id)`;
  const attempts = await sql<AttemptRow[]>`
    select task_id, attempt_id, ordinal, state, claimed_at::float8 as claimed_at,
      lease_expires_at::float8 as lease_expires_at, dispatch_allowed,
      -- Both stored forms (store-postgres codec.ts): whole, and without what the row says.
      coalesce(settlement->'receipt'->>'accepted_at', settlement->>'accepted_at')::float8
        as accepted_at,
      -- Both forms keep the command (without its owner in the short one) under command.
      case settlement->'command'->'report'->>'kind'
        when 'completed' then settlement->'command'->'report'->'report'->'outcome'->>'kind'
        when 'failed' then 'execution'
      end as report
    from attempts order by task_id, ordinal`;
  const history = await sql<HistoryRow[]>`
    select task_id, sequence, attempt_id, at::float8 as at, reason
    from task_history order by task_id, sequence`;
  const subscriptions = await sql<SubscriptionRow[]>`
    select s.subscription_id, s.task_id, s.event_id, d.state
    from completion_subscriptions s
    left join completion_deliveries d using (tenant_id, namespace, subscription_id)`;
  const group = <T extends { task_id: string }>(rows: T[]) => {
    const map = new Map<string, T[]>();
    for (const row of rows) {
      const list = map.get(row.task_id);
      if (list === undefined) map.set(row.task_id, [row]);
      else list.push(row);
    }
    return map;
  };
  return {
    tasks: new Map(tasks.map((t) => [t.task_id, t])),
    attempts: group([...attempts]),
    history: group([...history]),
    subscriptions: [...subscriptions],
  };
}

/** Collects violations of one check. */
class Verdict {
  readonly examples: string[] = [];
  violations = 0;

  constructor(readonly name: string) {}

  fail(example: string): void {
    this.violations += 1;
    if (this.examples.length < MAX_EXAMPLES) this.examples.push(example);
  }

  result(): CheckResult {
    return { name: this.name, violations: this.violations, examples: this.examples };
  }
}

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const REPORTS = new Set(['success', 'application_error', 'execution']);
const OUTCOMES = new Set(['succeeded', 'failed', 'cancelled', 'retry_scheduled']);

/**
 * Replays one task's history through the lifecycle of DESIGN §5 and returns the first illegal
 * step, or the state the history ends in.
 *
 * Cancel (DESIGN §5 Cancel and Settle; core `decideSettlement`, `heldDecision`,
 * `recoverExpiredLeases`): after `cancel_requested` no dispatch is granted, and a later
 * settlement or lease expiry ends the task `cancelled` — never retried, never succeeded — except
 * a decision already held before the cancel (a `report_accepted` awaiting cleanup), which still
 * ends succeeded or failed, but is never retried either.
 */
export function replayHistory(
  events: readonly HistoryRow[],
): { state: string } | { error: string } {
  let state = 'new';
  let current: string | null = null;
  const seen = new Set<string>();
  let dispatched = false;
  let reported = false;
  let expired = false;
  let cancelRequested = false;
  /** A report was accepted before cancel was requested: its decision stands (unless a retry). */
  let heldBeforeCancel = false;
  for (const [index, { sequence, attempt_id: attempt, reason }] of events.entries()) {
    const at = `#${sequence} ${reason}`;
    if (sequence !== index + 1) return { error: `gap: ${at} at position ${index + 1}` };
    if (state === 'new') {
      if (reason !== 'submitted') return { error: `${at} before submitted` };
      state = 'queued';
      continue;
    }
    if (TERMINAL.has(state)) return { error: `${at} after terminal ${state}` };
    if (state === 'queued') {
      if (reason === 'claimed' && attempt !== null && !seen.has(attempt)) {
        seen.add(attempt);
        current = attempt;
        state = 'active';
        dispatched = reported = expired = cancelRequested = heldBeforeCancel = false;
      } else if (reason === 'cancelled') state = 'cancelled';
      else return { error: `${at} while queued` };
      continue;
    }
    // Active: every record names the current attempt.
    if (attempt !== current) return { error: `${at} names ${attempt}, current is ${current}` };
    if (expired && !OUTCOMES.has(reason)) return { error: `${at} after lease_expired` };
    switch (reason) {
      case 'dispatch_authorized':
        if (dispatched || reported) return { error: `${at} twice or after the report` };
        if (cancelRequested) return { error: `${at} after cancel_requested` };
        dispatched = true;
        break;
      case 'cancel_requested':
        if (cancelRequested) return { error: `${at} twice` };
        cancelRequested = true;
        heldBeforeCancel = reported;
        break;
      case 'report_accepted':
        if (reported) return { error: `${at}: a second accepted settlement` };
        reported = true;
        break;
      case 'cleanup_confirmed':
        if (!reported) return { error: `${at} without a report` };
        break;
      case 'lease_expired':
        if (reported) return { error: `${at} after the report` };
        expired = true;
        break;
      default:
        if (!OUTCOMES.has(reason)) return { error: `${at} while active` };
        if (!reported && !expired) return { error: `${at} with neither report nor expiry` };
        if (expired && reason === 'succeeded') return { error: `${at} from an expired lease` };
        if (cancelRequested) {
          if (reason === 'retry_scheduled') {
            return { error: `${at} after cancel_requested (a cancelled task is never retried)` };
          }
          if (!heldBeforeCancel && reason !== 'cancelled') {
            return { error: `${at} after cancel_requested: must end cancelled` };
          }
        } else if (reason === 'cancelled') {
          return { error: `${at} of an active task without cancel_requested` };
        }
        state = reason === 'retry_scheduled' ? 'queued' : reason;
        current = null;
    }
  }
  return { state };
}

/** Runs every check; the result lists each of {@link CHECKS} once, in order. */
export function check(evidence: Evidence, record: DatabaseRecord): CheckResult[] {
  const { tasks, attempts, history } = record;
  const acks = evidence.submits.filter((s) => s.event === 'ack');

  const durable = new Verdict(CHECKS.submitsDurable);
  for (const ack of acks) {
    const task = tasks.get(ack.task_id);
    if (
      task === undefined ||
      task.idempotency_key !== ack.key ||
      task.tenant_id !== ack.tenant ||
      task.namespace !== ack.namespace
    ) {
      durable.fail(
        `${ack.key} → ${ack.task_id}: ${task === undefined ? 'missing' : 'different key or scope'}`,
      );
    }
  }

  const terminal = new Verdict(CHECKS.allTerminal);
  for (const task of tasks.values()) {
    if (!TERMINAL.has(task.state)) terminal.fail(`${task.task_id} is ${task.state}`);
  }

  // Every task of the run is submitted with this policy (submitter.ts): judge against it, not
  // against what the database reads back.
  const policy = TASK_RETRY.max_attempts;
  const settlements = new Verdict(CHECKS.settlements);
  const dispatch = new Verdict(CHECKS.dispatch);
  const legal = new Verdict(CHECKS.history);
  const outcomes = new Verdict(CHECKS.outcomes);
  for (const task of tasks.values()) {
    const id = task.task_id;
    const events = history.get(id) ?? [];
    const rows = attempts.get(id) ?? [];
    const replay = replayHistory(events);
    if ('error' in replay) legal.fail(`${id}: ${replay.error}`);
    else if (replay.state !== task.state) {
      legal.fail(`${id}: history ends ${replay.state}, task is ${task.state}`);
    }
    if (events.length !== task.history_sequence) {
      legal.fail(`${id}: ${events.length} records, history_sequence ${task.history_sequence}`);
    }
    if (rows.length !== task.attempt_count) {
      legal.fail(`${id}: ${rows.length} attempts, attempt_count ${task.attempt_count}`);
    }
    // Each attempt row is created with its `claimed` record in one transaction (§5 Acquire):
    // the claimed attempt ids, in order, are the attempt rows by ordinal, numbered 1..n.
    const claimed = events.filter((e) => e.reason === 'claimed').map((e) => e.attempt_id);
    const byOrdinal = [...rows].sort((a, b) => a.ordinal - b.ordinal);
    const rowIds = byOrdinal.map((a) => a.attempt_id);
    if (JSON.stringify(claimed) !== JSON.stringify(rowIds)) {
      legal.fail(`${id}: claimed [${claimed.join(', ')}], attempt rows [${rowIds.join(', ')}]`);
    }
    byOrdinal.forEach((a, index) => {
      if (a.ordinal !== index + 1)
        legal.fail(
          `${id}: attempt ${a.attempt_id} has ordinal ${a.ordinal}, expected ${index + 1}`,
        );
    });

    const accepted = new Map<string, number>();
    for (const e of events) {
      if (e.reason === 'report_accepted' && e.attempt_id !== null) {
        accepted.set(e.attempt_id, (accepted.get(e.attempt_id) ?? 0) + 1);
      }
    }
    for (const attempt of rows) {
      const n = accepted.get(attempt.attempt_id) ?? 0;
      if (n > 1) settlements.fail(`${attempt.attempt_id}: ${n} accepted settlements`);
      if ((attempt.accepted_at !== null) !== (n === 1)) {
        settlements.fail(`${attempt.attempt_id}: settlement row and history disagree`);
      }
      // The outcome checks read the report: one that cannot be read would make them vacuous.
      if (
        attempt.accepted_at !== null &&
        attempt.report !== undefined &&
        !REPORTS.has(attempt.report as string)
      ) {
        settlements.fail(
          `${attempt.attempt_id}: settlement with an unreadable report (${attempt.report})`,
        );
      }
      if (attempt.accepted_at !== null && attempt.state === 'lost') {
        settlements.fail(`${attempt.attempt_id}: a lost attempt has an accepted settlement`);
      }
      if (attempt.accepted_at !== null && attempt.accepted_at >= attempt.lease_expires_at) {
        settlements.fail(
          `${attempt.attempt_id}: accepted at ${attempt.accepted_at}, lease ended ${attempt.lease_expires_at}`,
        );
      }
    }

    const authorized = events.filter((e) => e.reason === 'dispatch_authorized').length;
    const granted = rows.filter((a) => a.dispatch_allowed).length;
    if (task.max_attempts !== policy) {
      dispatch.fail(`${id}: stored max_attempts ${task.max_attempts}, submitted with ${policy}`);
    }
    if (authorized > policy || task.dispatch_count > policy) {
      dispatch.fail(
        `${id}: ${authorized} authorized, dispatch_count ${task.dispatch_count}, submitted max_attempts ${policy}`,
      );
    }
    if (authorized !== task.dispatch_count || granted !== task.dispatch_count) {
      dispatch.fail(
        `${id}: dispatch_count ${task.dispatch_count}, ${authorized} authorized, ${granted} granted`,
      );
    }
    // §4.1/§5: a retryable failure (an application error, a lease expiry, a retryable
    // execution failure) fails the task only once its dispatched attempts reach max_attempts.
    const exhaustsPolicy =
      task.failure_kind === 'application' ||
      task.failure_kind === 'lease_expired' ||
      (task.failure_kind === 'execution' && task.failure_retryable === true);
    if (task.state === 'failed' && exhaustsPolicy && task.dispatch_count !== policy) {
      dispatch.fail(
        `${id}: failed (${task.failure_kind}) after ${task.dispatch_count} of ${policy} dispatches`,
      );
    }

    const fail = task.data.fail;
    if (task.state === 'cancelled') outcomes.fail(`${id}: cancelled, but nothing cancels`);
    if (fail === 'always' && task.state === 'succeeded')
      outcomes.fail(`${id}: always fails, succeeded`);
    // A handler that never throws may still see its task fail for infrastructure reasons
    // (leases lost, or the SDK giving up before dispatch: counted in the figures), but
    // never with an application error.
    if (fail !== 'always' && task.state === 'failed' && task.failure_kind === 'application') {
      outcomes.fail(`${id} (${fail ?? 'ok'}): failed with ${task.failure_kind}`);
    }
  }
  // User code ran only under a granted dispatch.
  const attemptById = new Map<string, AttemptRow>();
  for (const rows of attempts.values()) for (const a of rows) attemptById.set(a.attempt_id, a);
  for (const run of evidence.executions) {
    const attempt = attemptById.get(run.attempt_id);
    if (run.event === 'start') {
      if (attempt === undefined || !attempt.dispatch_allowed) {
        dispatch.fail(`${run.worker} ran ${run.attempt_id} without a granted dispatch`);
      }
      continue;
    }
    // The accepted settlement reports what the handler produced: an execution that ended in
    // the handler's error never settles as a success, one that returned never as an
    // application error (an execution failure — the SDK timing the attempt out — may follow
    // either, and is judged by the retry policy above).
    if (attempt === undefined || attempt.accepted_at === null || run.outcome === undefined)
      continue;
    const success = attempt.report === 'success' || attempt.state === 'succeeded';
    if (run.outcome === 'error' && success) {
      outcomes.fail(
        `${run.attempt_id} (${run.task_id}): handler ended in error, settled as a success`,
      );
    }
    if (run.outcome === 'ok' && attempt.report === 'application_error') {
      outcomes.fail(
        `${run.attempt_id} (${run.task_id}): handler returned, settled as an application error`,
      );
    }
  }

  const idempotency = new Verdict(CHECKS.idempotency);
  const byKey = new Map<string, Set<string>>();
  for (const ack of acks) {
    const ids = byKey.get(ack.key) ?? new Set<string>();
    ids.add(ack.task_id);
    byKey.set(ack.key, ids);
  }
  for (const [key, ids] of byKey) {
    if (ids.size > 1) idempotency.fail(`${key} → ${[...ids].join(', ')}`);
  }
  const keyCount = new Map<string, number>();
  for (const task of tasks.values()) {
    const scoped = `${task.tenant_id}/${task.namespace}/${task.idempotency_key}`;
    keyCount.set(scoped, (keyCount.get(scoped) ?? 0) + 1);
  }
  for (const [key, n] of keyCount)
    if (n > 1) idempotency.fail(`${key}: ${n} tasks in the database`);

  const deliveries = new Verdict(CHECKS.deliveries);
  // Every POST per event id: at least once, always the same event (README T2).
  const received = new Map<string, DeliveryRecord[]>();
  for (const d of evidence.deliveries) {
    const posts = received.get(d.webhook_id);
    if (posts === undefined) received.set(d.webhook_id, [d]);
    else posts.push(d);
  }
  const subscriptionById = new Map(record.subscriptions.map((s) => [s.subscription_id, s]));
  for (const s of evidence.submits) {
    if (s.event !== 'subscribed') continue;
    const db = subscriptionById.get(s.subscription_id);
    if (db === undefined) {
      deliveries.fail(`acknowledged subscription ${s.subscription_id} is missing`);
      continue;
    }
    // The client was told an event id: that one is the one delivered.
    if (db.event_id !== s.event_id || db.task_id !== s.task_id) {
      deliveries.fail(
        `${s.subscription_id}: acknowledged event ${s.event_id} of ${s.task_id}, recorded ${db.event_id} of ${db.task_id}`,
      );
    }
    const task = tasks.get(s.task_id);
    if (task !== undefined && TERMINAL.has(task.state) && !received.has(s.event_id)) {
      deliveries.fail(`acknowledged event ${s.event_id} (${s.task_id}) never reached the receiver`);
    }
  }
  for (const s of record.subscriptions) {
    const task = tasks.get(s.task_id);
    if (task === undefined || !TERMINAL.has(task.state)) continue;
    const posts = received.get(s.event_id) ?? [];
    if (s.state !== 'delivered')
      deliveries.fail(`${s.subscription_id} (${s.task_id}) is ${s.state}`);
    if (posts.length === 0)
      deliveries.fail(`${s.event_id} (${s.task_id}) never reached the receiver`);
    for (const [index, got] of posts.entries()) {
      if (got.task_id !== s.task_id || got.state !== task.state) {
        deliveries.fail(
          `${s.event_id} POST ${index + 1}/${posts.length}: received ${got.task_id}/${got.state}, task ${s.task_id} is ${task.state}`,
        );
      }
    }
  }

  const processes = new Verdict(CHECKS.processes);
  for (const exit of evidence.unexpectedExits) {
    processes.fail(`${exit.process} exited (${exit.code}): ${exit.stderr.slice(-300)}`);
  }
  for (let i = 0; i < evidence.unrecoveredRestarts; i++) {
    processes.fail('a replica was not ready within 60 s of a PostgreSQL restart');
  }

  return [
    durable,
    terminal,
    settlements,
    dispatch,
    legal,
    idempotency,
    deliveries,
    outcomes,
    processes,
  ].map((v) => v.result());
}
