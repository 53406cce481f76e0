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
  /** The owning tenant; with `namespace`, the scope every lookup is fenced by. */
  tenant_id: string;
  /** The namespace within the tenant. */
  namespace: string;
  /** Store-issued, time-sortable id; unique per scope. */
  task_id: string;
  /** Store-issued run id, issued with the task. */
  run_id: string;
  /** Unique per scope: a submit with the same key finds this task (DESIGN §5 Submit). */
  idempotency_key: string;
  /**
   * `null`: a replayed submit compares the command rebuilt from this row
   * canonically. Rows recorded by earlier versions hold the SHA-256 (hex) of
   * the canonical submit command instead, and a replay compares digests.
   */
  command_digest: string | null;
  /** The submission as accepted (optional fields absent, not null). Immutable. */
  input: SubmitTask;
  /** The submitter's trace context, propagated into every attempt's invocation event. */
  origin_trace: TraceContext | null;
  /** The queue the task waits on (`input.queue`). */
  queue: string;
  /** Which handler runs the task (`input.program`). */
  program: ProgramDescriptor;
  /** Defaults applied at submit (DESIGN §4.1), so later policy changes cannot move them. */
  retry: ResolvedRetryPolicy;
  /** One attempt's execution budget, defaulted at submit. */
  timeout_ms: number;
  /** -100..100, higher claimed first; defaulted at submit. */
  priority: number;
  /** Tasks sharing a key have at most `concurrency_limit` active at once; null for none. */
  concurrency_key: string | null;
  /** The key's limit (1 when the submission gave a key but no limit); null without a key. */
  concurrency_limit: number | null;
  /** Exact-match filters for listing; `{}` when none were given. */
  labels: Record<string, string>;
  /** The scheduling state (DESIGN §5 diagram). */
  state: TaskState;
  /** Store time of the accepting submit. */
  submitted_at: Timestamp;
  /** The earliest store time a claim may take the task: submit delay or retry backoff. */
  available_at: Timestamp;
  /** When the task became terminal; null until then. */
  terminal_at: Timestamp | null;
  /** Attempts created: each claim creates one. */
  attempt_count: number;
  /** Attempts granted dispatch: only these count against `retry.max_attempts`. */
  dispatch_count: number;
  /** The attempt holding the task while it is active; null otherwise. */
  current_attempt_id: string | null;
  /** When a cancel reached the task (a queued one ends at once; a worker sees it on renew). */
  cancel_requested_at: Timestamp | null;
  /** Set exactly when the task is terminal. */
  outcome: TaskOutcome | null;
  /** The last history sequence written; the next event gets `+ 1`. */
  history_sequence: number;
}

/**
 * What a settlement decided for the task, held on the attempt while cleanup is
 * unconfirmed and applied when it is confirmed or at the authority deadline:
 * succeed with `output`, fail with `failure`, retry after `delay_ms` (`failure`
 * being why this attempt failed), or cancel.
 */
export type SettlementDecision =
  | { kind: 'succeed'; output: unknown }
  | { kind: 'fail'; failure: TaskFailure }
  | { kind: 'retry'; delay_ms: number; failure: TaskFailure }
  | { kind: 'cancel' };

/** One attempt: who holds it, until when, and what it reported. */
export interface AttemptRow {
  /** The task's tenant. */
  tenant_id: string;
  /** The task's namespace. */
  namespace: string;
  /** The task this attempt runs. */
  task_id: string;
  /** Store-issued id: the invocation event's `id` and the owner's `attempt_id`. */
  attempt_id: string;
  /** 1-based ordinal among the task's attempts (the event's `ldgattempt`). */
  ordinal: number;
  /** Store-issued id of the attempt's lease, part of the fencing owner (DESIGN §1, Fencing). */
  lease_id: string;
  /** The lease generation; equals the ordinal, as each claim issues one lease. */
  generation: number;
  /** The session whose slot claimed the attempt; part of the owner. */
  worker_session_id: string;
  /** The slot of that session (0..concurrency-1); part of the owner. */
  consumer_id: number;
  /** `active` until its outcome is applied: by a settlement, or `lost` at lease expiry. */
  state: AttemptState;
  /** Store time of the claim; the execution budget counts from it. */
  claimed_at: Timestamp;
  /** `claimed_at + timeout_ms`: end of the user-work budget. */
  deadline: Timestamp;
  /** `deadline + cleanup grace`: no lease outlives it. */
  authority_deadline: Timestamp;
  /**
   * `min(now + lease duration, authority_deadline)` at the claim and each renewal; held at the
   * authority deadline while a settlement awaits cleanup.
   */
  lease_expires_at: Timestamp;
  /** The last accepted renew sequence (0 at claim): `+ 1` is new, equal replays. */
  renew_sequence: number;
  /** The renew command of `renew_sequence`, compared by a replay; null before any. */
  last_renewal: RenewCommand | null;
  /** Dispatch was granted: user code may have started (`execution_may_have_started`). */
  dispatch_allowed: boolean;
  /** `unconfirmed` from the claim until a settlement reports or a confirmation sets `confirmed`. */
  quiescence: Quiescence;
  /** The accepted settlement (exactly one per attempt), returned to its replays. */
  settlement: AcceptedSettlement | null;
  /**
   * SHA-256 (hex) of the canonical settle command, recorded by versions before 2026-12-01 and
   * then compared by a replay; null for settlements recorded since, which a replay compares by
   * the recorded command's canonical JSON (`settleAttempt`).
   */
  settlement_digest: string | null;
  /** A settlement's decision awaiting confirmed cleanup; null otherwise. */
  pending: SettlementDecision | null;
  /** When the attempt's outcome was applied or its lease found expired; null while active. */
  finished_at: Timestamp | null;
}

/** A worker session: one queue, `concurrency` consumer slots, a validity. */
export interface SessionRow {
  /** Store-issued session id (`worker_session_id`). */
  id: string;
  /** The scope's tenant; acquisitions in another scope do not find the session. */
  tenant_id: string;
  /** The scope's namespace. */
  namespace: string;
  /** The one queue this session acquires from. */
  queue: string;
  /** Number of consumer slots: `consumer_id` ranges over `0..concurrency-1`. */
  concurrency: number;
  /** Store time of opening. */
  created_at: Timestamp;
  /** Validity end; `extend` moves it to `now + SESSION_VALIDITY_MS`. */
  expires_at: Timestamp;
}

/** The replay state of one consumer slot: its last completed poll. */
export interface CursorRow {
  /** The session of the slot. */
  worker_session_id: string;
  /** The slot within that session. */
  consumer_id: number;
  /** The last completed poll's sequence: `+ 1` is a new poll, equal replays. */
  sequence: number;
  /** That poll's command, kept as the seed's `ConsumerCursor` holds it. */
  command: AcquireCommand;
  /** What that poll handed out, answered again on replay; null for `empty`. */
  assignment: AttemptRef | null;
}

/** One history record, numbered under the task's row lock. */
export interface HistoryRow {
  /** The task's tenant. */
  tenant_id: string;
  /** The task's namespace. */
  namespace: string;
  /** The task the record belongs to. */
  task_id: string;
  /** Gapless per-task ordinal (from 1), assigned under the task's row lock. */
  sequence: number;
  /** The attempt the transition concerns; null for task-level ones (e.g. `submitted`). */
  attempt_id: string | null;
  /** Store time of the transition. */
  at: Timestamp;
  /** What happened (DESIGN §5); never a payload. */
  reason: TransitionReason;
}

/**
 * One completion subscription with its delivery state (DESIGN §8). The
 * subscription part (`subscription_key` … `created_at`) is immutable; the
 * delivery part describes the current generation. A store may keep the two
 * parts in two tables (`completion_subscriptions`, `completion_deliveries`).
 */
export interface SubscriptionRow {
  /** The task's tenant. */
  tenant_id: string;
  /** The task's namespace. */
  namespace: string;
  /** Store-issued id (the wire `id`), named by redeliver. */
  subscription_id: string;
  /** The subscribed task. */
  task_id: string;
  /** The client's idempotency key: one subscription per key and task, forever. */
  subscription_key: string;
  /** The destination alias (operator configuration), never a URL. */
  destination: string;
  /** The webhook id and CloudEvent id, identical across every try and generation. */
  event_id: string;
  /** Store time of subscribing. */
  created_at: Timestamp;
  /** `waiting` until the task is terminal, then `due`, `delivering`, `delivered` or `exhausted`. */
  state: CompletionState;
  /** The current delivery generation, from 1; each accepted redeliver starts the next. */
  generation: number;
  /** Tries started in the current generation; a lease starts one. */
  attempts: number;
  /** When `due`: the earliest next try; when `delivering`: when the sender's lease ends. */
  next_attempt_at: Timestamp | null;
  /** When the current generation was delivered; null otherwise. */
  delivered_at: Timestamp | null;
  /** When the current generation ended (delivered or exhausted): the latest callback activity. */
  finished_at: Timestamp | null;
  /** The receiver's HTTP status on this generation's last try; null when none answered. */
  last_status_code: number | null;
  /** Why this generation's last try failed (never a secret or a response body); else null. */
  last_error: string | null;
}

/** A namespace's own retention policy; a namespace without one uses the server default. */
export interface RetentionPolicyRow {
  /** The tenant of the namespace. */
  tenant_id: string;
  /** The namespace the policy applies to. */
  namespace: string;
  /** How long finished records are kept before collection (see `retentionCutoff`). */
  retention_ms: number;
  /** Store time of the last set. */
  updated_at: Timestamp;
}
