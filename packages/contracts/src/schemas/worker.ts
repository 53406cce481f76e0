/**
 * Worker protocol wire types (DESIGN §4, §5; seed `delivery.rs`): sessions,
 * replay-safe acquisition, leases and authority, renewal, settlement with
 * quiescence, attempt snapshots, and recovery progress.
 */
import * as v from 'valibot';
import { MAX_SESSION_CONCURRENCY, OPERATION_ID_MAX_BYTES } from '../limits.js';
import {
  CounterSchema,
  intRange,
  NameSchema,
  nullishNullable,
  PositiveCounterSchema,
  ProgramDescriptorSchema,
  ScopeSchema,
  TimestampSchema,
  TraceContextSchema,
  textField,
} from './common.js';
import { CloudEventSchema, ExecutionFailureSchema, ExecutionReportSchema } from './execution.js';
import { AttemptStateSchema, TaskStateSchema } from './task.js';

/**
 * A consumer slot of a session: `0..MAX_SESSION_CONCURRENCY-1`. Whether it is
 * below the session's own concurrency is checked by the core (400).
 */
const ConsumerIdSchema = intRange(0, MAX_SESSION_CONCURRENCY - 1);

// ---- Sessions -----------------------------------------------------------------

/**
 * The body of `POST /v1/worker/sessions`: open a session on one queue with
 * `concurrency` consumer slots (1..MAX_SESSION_CONCURRENCY).
 */
export const OpenSessionCommandSchema = v.strictObject({
  scope: ScopeSchema,
  queue: NameSchema,
  concurrency: intRange(1, MAX_SESSION_CONCURRENCY),
});
/** The body of `POST /v1/worker/sessions`. */
export type OpenSessionCommand = v.InferOutput<typeof OpenSessionCommandSchema>;

/**
 * Sessions are issued by the service and never recreated by acquisition.
 * Unknown/expired session IDs are rejected even after old cursor deletion.
 */
export const WorkerSessionSchema = v.strictObject({
  id: NameSchema,
  scope: ScopeSchema,
  queue: NameSchema,
  concurrency: PositiveCounterSchema,
  expires_at: TimestampSchema,
});
/** Sessions are issued by the service and never recreated by acquisition. */
export type WorkerSession = v.InferOutput<typeof WorkerSessionSchema>;

// ---- Acquisition --------------------------------------------------------------

/**
 * One poll of one consumer slot. `sequence` advances by exactly one per
 * consumer (first poll: 1): `last + 1` is a new poll, `last` replays, anything
 * else is 409 `sequence_conflict`. `queue` must equal the session's queue.
 * Any sequence in 0..2^53−1 is well-formed (DESIGN §4.1 "Numbers"); one the
 * slot's cursor does not allow, 0 included, is answered by those rules.
 */
export const AcquireCommandSchema = v.strictObject({
  scope: ScopeSchema,
  queue: NameSchema,
  worker_session_id: NameSchema,
  consumer_id: ConsumerIdSchema,
  sequence: CounterSchema,
});
/** One poll of one consumer slot. */
export type AcquireCommand = v.InferOutput<typeof AcquireCommandSchema>;

/** The task and attempt an acquisition handed out. */
export const AttemptRefSchema = v.strictObject({
  task_id: NameSchema,
  attempt_id: NameSchema,
});
/** The task and attempt an acquisition handed out. */
export type AttemptRef = v.InferOutput<typeof AttemptRefSchema>;

/** Compact replay state: only the latest completed poll per consumer is retained. */
export const ConsumerCursorSchema = v.strictObject({
  command: AcquireCommandSchema,
  assignment: v.nullable(AttemptRefSchema),
});
/** Compact replay state: only the latest completed poll per consumer is retained. */
export type ConsumerCursor = v.InferOutput<typeof ConsumerCursorSchema>;

// ---- Leases and authority -----------------------------------------------------

/**
 * The fencing identity of a lease holder. Every worker call is checked
 * against the attempt's current lease; any differing field (session and
 * consumer included) is `ownership_lost`.
 */
export const LeaseOwnerSchema = v.strictObject({
  scope: ScopeSchema,
  task_id: NameSchema,
  attempt_id: NameSchema,
  lease_id: NameSchema,
  generation: CounterSchema,
  worker_session_id: NameSchema,
  consumer_id: ConsumerIdSchema,
});
/** The fencing identity of a lease holder. */
export type LeaseOwner = v.InferOutput<typeof LeaseOwnerSchema>;

/** A lease: its owner and when it expires (store time). */
export const LeaseSchema = v.strictObject({
  owner: LeaseOwnerSchema,
  expires_at: TimestampSchema,
});
/** A lease: its owner and when it expires. */
export type Lease = v.InferOutput<typeof LeaseSchema>;

/**
 * Current authority sampled for this response; never replay a cached TTL.
 * `execution_remaining_ms` is the remaining user-work budget; cleanup and
 * reporting can retain a longer lease. A fresh assignment starts with
 * `renew_sequence: 0` and `dispatch_allowed: false`.
 */
export const AuthoritySchema = v.strictObject({
  owner: LeaseOwnerSchema,
  expires_at: TimestampSchema,
  remaining_ms: CounterSchema,
  execution_remaining_ms: CounterSchema,
  renew_sequence: CounterSchema,
  cancel_requested: v.boolean(),
  dispatch_allowed: v.boolean(),
});
/** Current authority sampled for this response; never replay a cached TTL. */
export type Authority = v.InferOutput<typeof AuthoritySchema>;

/**
 * An acquired attempt: the immutable invocation event, the program to run,
 * the lease and the current authority. `workflow_activation_id` is the
 * opt-in runtime marker of a workflow controller activation; it must agree
 * with the event's `ldgactivationid` (see `validateAssignmentIdentity`).
 */
export const AssignmentSchema = v.strictObject({
  workflow_activation_id: v.exactOptional(NameSchema),
  descriptor: ProgramDescriptorSchema,
  event: CloudEventSchema,
  lease: LeaseSchema,
  authority: AuthoritySchema,
  attempt_deadline: TimestampSchema,
});
/** An acquired attempt. */
export type Assignment = v.InferOutput<typeof AssignmentSchema>;

/**
 * The reply to an acquire, tagged by `disposition`: `empty` (nothing
 * eligible), `assigned` (an attempt with its lease), or `ownership_lost` (a
 * replayed poll whose attempt is no longer owned).
 */
export const AcquireReplySchema = v.variant('disposition', [
  v.strictObject({ disposition: v.literal('empty'), sequence: CounterSchema }),
  v.strictObject({
    disposition: v.literal('assigned'),
    sequence: CounterSchema,
    assignment: AssignmentSchema,
  }),
  v.strictObject({
    disposition: v.literal('ownership_lost'),
    sequence: CounterSchema,
    assignment: AttemptRefSchema,
  }),
]);
/** The reply to an acquire, tagged by `disposition`. */
export type AcquireReply = v.InferOutput<typeof AcquireReplySchema>;

// ---- Renewal and quiescence -----------------------------------------------------

/** `keep_alive` extends the lease; `dispatch` also asks permission to start user code. */
export const RenewIntentSchema = v.picklist(['keep_alive', 'dispatch']);
/** `keep_alive` extends the lease; `dispatch` also asks permission to start user code. */
export type RenewIntent = v.InferOutput<typeof RenewIntentSchema>;

/**
 * A renewal. `sequence` advances by one per attempt (first renew: 1);
 * `last` replays without extending twice; anything else is 409. Any sequence
 * in 0..2^53−1 is well-formed (DESIGN §4.1); 0 before any renew is 409
 * `sequence_conflict` (an assignment starts at `renew_sequence: 0`, but nothing
 * was renewed to replay).
 */
export const RenewCommandSchema = v.strictObject({
  owner: LeaseOwnerSchema,
  sequence: CounterSchema,
  intent: RenewIntentSchema,
});
/** A renewal. */
export type RenewCommand = v.InferOutput<typeof RenewCommandSchema>;

/** Required invocation cleanup is done; a healthy warm process may still exist. */
export const QuiescenceSchema = v.picklist(['confirmed', 'unconfirmed']);
/** Required invocation cleanup is done; a healthy warm process may still exist. */
export type Quiescence = v.InferOutput<typeof QuiescenceSchema>;

// ---- Settlement -----------------------------------------------------------------

/**
 * What a worker reports about an attempt, tagged by `kind` with the payload
 * under `report`: `completed` carries an ExecutionReport, `failed` an
 * ExecutionFailure.
 */
export const AttemptReportSchema = v.variant('kind', [
  v.strictObject({ kind: v.literal('completed'), report: ExecutionReportSchema }),
  v.strictObject({ kind: v.literal('failed'), report: ExecutionFailureSchema }),
]);
/** What a worker reports about an attempt. */
export type AttemptReport = v.InferOutput<typeof AttemptReportSchema>;

/**
 * Settle an attempt exactly once. The same `operation_id` with the same
 * canonical command replays the receipt; different content is 409.
 * `processing_trace` may be omitted or `null` on input and is normalised to
 * `null` (the seed serialises it as present-with-null). A success output and
 * error details are checked for size and depth by the decoder.
 */
export const SettleCommandSchema = v.strictObject({
  owner: LeaseOwnerSchema,
  operation_id: textField(OPERATION_ID_MAX_BYTES),
  report: AttemptReportSchema,
  quiescence: QuiescenceSchema,
  processing_trace: nullishNullable(TraceContextSchema),
});
/** Settle an attempt exactly once. */
export type SettleCommand = v.InferOutput<typeof SettleCommandSchema>;

/** Durable acceptance of a settlement, at store time. */
export const SettlementReceiptSchema = v.strictObject({
  operation_id: textField(OPERATION_ID_MAX_BYTES),
  task_id: NameSchema,
  attempt_id: NameSchema,
  accepted_at: TimestampSchema,
});
/** Durable acceptance of a settlement, at store time. */
export type SettlementReceipt = v.InferOutput<typeof SettlementReceiptSchema>;

/** An accepted settlement: the exact command and its receipt. */
export const AcceptedSettlementSchema = v.strictObject({
  command: SettleCommandSchema,
  receipt: SettlementReceiptSchema,
});
/** An accepted settlement: the exact command and its receipt. */
export type AcceptedSettlement = v.InferOutput<typeof AcceptedSettlementSchema>;

/**
 * The reply to a settle. `already_accepted` marks a replay. A report can be
 * recorded while required cleanup is still outstanding (`task_state` then
 * stays `active`).
 */
export const SettleReplySchema = v.strictObject({
  receipt: SettlementReceiptSchema,
  already_accepted: v.boolean(),
  task_state: TaskStateSchema,
});
/** The reply to a settle. */
export type SettleReply = v.InferOutput<typeof SettleReplySchema>;

/** One attempt as recorded: event, lease, deadlines, state, renewal and settlement. */
export const AttemptSnapshotSchema = v.strictObject({
  event: CloudEventSchema,
  descriptor: ProgramDescriptorSchema,
  lease: LeaseSchema,
  deadline: TimestampSchema,
  authority_deadline: TimestampSchema,
  state: AttemptStateSchema,
  execution_may_have_started: v.boolean(),
  last_renewal: v.nullable(RenewCommandSchema),
  quiescence: QuiescenceSchema,
  settlement: v.nullable(AcceptedSettlementSchema),
  finished_at: v.nullable(TimestampSchema),
});
/** One attempt as recorded. */
export type AttemptSnapshot = v.InferOutput<typeof AttemptSnapshotSchema>;

// ---- Recovery -------------------------------------------------------------------

/**
 * Committed progress from one bounded recovery operation (≤ MAX_RECOVERY_BATCH
 * candidates). `scanned`: expired-lease candidates examined; `recovered`:
 * attempts marked `lost`, each of which either `requeued` its task, `failed`
 * it (`lease_expired`) or `cancelled` it (cancel was requested), so
 * `recovered = requeued + failed + cancelled`; `finalized`: settled attempts
 * whose cleanup was never confirmed, given their recorded outcome when their
 * authority ended (they were not lost); `recovered + finalized ≤ scanned`
 * (a candidate a late settle or renew reached first counts in neither);
 * `has_more`: the pass was full, so another may find more.
 */
export const RecoveryProgressSchema = v.pipe(
  v.strictObject({
    scanned: CounterSchema,
    recovered: CounterSchema,
    requeued: CounterSchema,
    failed: CounterSchema,
    cancelled: CounterSchema,
    finalized: CounterSchema,
    has_more: v.boolean(),
  }),
  v.check(
    (p) =>
      p.recovered === p.requeued + p.failed + p.cancelled && p.recovered + p.finalized <= p.scanned,
    'must satisfy recovered = requeued + failed + cancelled and recovered + finalized <= scanned',
  ),
);
/** Committed progress from one bounded recovery operation. */
export type RecoveryProgress = v.InferOutput<typeof RecoveryProgressSchema>;
