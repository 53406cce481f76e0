/**
 * The records a store persists, as the pure transitions see them. A store
 * maps them to its tables; the transitions never see SQL. Application JSON
 * (`input.data`, outputs) rides inside `input` and `outcome` so a store can
 * keep it off the hot columns.
 */
import type {
  AcceptedSettlement,
  AcquireCommand,
  AttemptRef,
  AttemptState,
  CompletionState,
  ProgramDescriptor,
  Quiescence,
  RenewCommand,
  ResolvedRetryPolicy,
  SubmitTask,
  TaskFailure,
  TaskOutcome,
  TaskState,
  Timestamp,
  TraceContext,
  TransitionReason,
} from '@ledgence/contracts';

/** One task: its immutable submission and its mutable scheduling state. */
export interface TaskRow {
  tenant_id: string;
  namespace: string;
  task_id: string;
  run_id: string;
  idempotency_key: string;
  /**
   * `null`: a replayed submit compares the command rebuilt from this row
   * canonically. Rows recorded by earlier versions hold the SHA-256 (hex) of
   * the canonical submit command instead, and a replay compares digests.
   */
  command_digest: string | null;
  /** The submission as accepted (optional fields absent, not null). Immutable. */
  input: SubmitTask;
  origin_trace: TraceContext | null;
  queue: string;
  program: ProgramDescriptor;
  /** Defaults applied at submit (DESIGN §4.1), so later policy changes cannot move them. */
  retry: ResolvedRetryPolicy;
  timeout_ms: number;
  priority: number;
  concurrency_key: string | null;
  concurrency_limit: number | null;
  labels: Record<string, string>;
  state: TaskState;
  submitted_at: Timestamp;
  available_at: Timestamp;
  terminal_at: Timestamp | null;
  /** Attempts created: each claim creates one. */
  attempt_count: number;
  /** Attempts granted dispatch: only these count against `retry.max_attempts`. */
  dispatch_count: number;
  current_attempt_id: string | null;
  cancel_requested_at: Timestamp | null;
  /** Set exactly when the task is terminal. */
  outcome: TaskOutcome | null;
  /** The last history sequence written; the next event gets `+ 1`. */
  history_sequence: number;
}

/**
 * What a settlement decided for the task, held on the attempt while cleanup is
 * unconfirmed and applied when it is confirmed or at the authority deadline.
 */
export type SettlementDecision =
  | { kind: 'succeed'; output: unknown }
  | { kind: 'fail'; failure: TaskFailure }
  | { kind: 'retry'; delay_ms: number; failure: TaskFailure }
  | { kind: 'cancel' };

/** One attempt: who holds it, until when, and what it reported. */
export interface AttemptRow {
  tenant_id: string;
  namespace: string;
  task_id: string;
  attempt_id: string;
  /** 1-based ordinal among the task's attempts (the event's `ldgattempt`). */
  ordinal: number;
  lease_id: string;
  /** The lease generation; equals the ordinal, as each claim issues one lease. */
  generation: number;
  worker_session_id: string;
  consumer_id: number;
  state: AttemptState;
  claimed_at: Timestamp;
  /** `claimed_at + timeout_ms`: end of the user-work budget. */
  deadline: Timestamp;
  /** `deadline + cleanup grace`: no lease outlives it. */
  authority_deadline: Timestamp;
  lease_expires_at: Timestamp;
  renew_sequence: number;
  last_renewal: RenewCommand | null;
  /** Dispatch was granted: user code may have started (`execution_may_have_started`). */
  dispatch_allowed: boolean;
  quiescence: Quiescence;
  settlement: AcceptedSettlement | null;
  /**
   * SHA-256 (hex) of the canonical settle command, recorded by versions before 2026-12-01 and
   * then compared by a replay; null for settlements recorded since, which a replay compares by
   * the recorded command's canonical JSON (`settleAttempt`).
   */
  settlement_digest: string | null;
  /** A settlement's decision awaiting confirmed cleanup; null otherwise. */
  pending: SettlementDecision | null;
  finished_at: Timestamp | null;
}

/** A worker session: one queue, `concurrency` consumer slots, a validity. */
export interface SessionRow {
  id: string;
  tenant_id: string;
  namespace: string;
  queue: string;
  concurrency: number;
  created_at: Timestamp;
  expires_at: Timestamp;
}

/** The replay state of one consumer slot: its last completed poll. */
export interface CursorRow {
  worker_session_id: string;
  consumer_id: number;
  sequence: number;
  command: AcquireCommand;
  assignment: AttemptRef | null;
}

/** One history record, numbered under the task's row lock. */
export interface HistoryRow {
  tenant_id: string;
  namespace: string;
  task_id: string;
  sequence: number;
  attempt_id: string | null;
  at: Timestamp;
  reason: TransitionReason;
}

/**
 * One completion subscription with its delivery state (DESIGN §8). The
 * subscription part (`subscription_key` … `created_at`) is immutable; the
 * delivery part describes the current generation. A store may keep the two
 * parts in two tables (`completion_subscriptions`, `completion_deliveries`).
 */
export interface SubscriptionRow {
  tenant_id: string;
  namespace: string;
  subscription_id: string;
  task_id: string;
  subscription_key: string;
  /** The destination alias (operator configuration), never a URL. */
  destination: string;
  /** The webhook id and CloudEvent id, identical across every try and generation. */
  event_id: string;
  created_at: Timestamp;
  state: CompletionState;
  generation: number;
  /** Tries started in the current generation; a lease starts one. */
  attempts: number;
  /** When `due`: the earliest next try; when `delivering`: when the sender's lease ends. */
  next_attempt_at: Timestamp | null;
  delivered_at: Timestamp | null;
  /** When the current generation ended (delivered or exhausted): the latest callback activity. */
  finished_at: Timestamp | null;
  last_status_code: number | null;
  last_error: string | null;
}

/** A namespace's own retention policy; a namespace without one uses the server default. */
export interface RetentionPolicyRow {
  tenant_id: string;
  namespace: string;
  retention_ms: number;
  updated_at: Timestamp;
}
