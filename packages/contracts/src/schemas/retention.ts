/**
 * Retention wire types (seed: `RetentionPolicy`, `RetentionPreview`,
 * `RetentionProgress`): how long a namespace keeps terminal tasks, which tasks
 * the next collection would consider, and what one collection removed.
 */
import * as v from 'valibot';
import { MAX_RETENTION_BATCH, MAX_RETENTION_MS, MIN_RETENTION_MS } from '../limits.js';
import { CounterSchema, intRange, TimestampSchema } from './common.js';

/** A retention length: MIN_RETENTION_MS..MAX_RETENTION_MS. */
const RetentionMsSchema = intRange(MIN_RETENTION_MS, MAX_RETENTION_MS);

/**
 * The body of `PUT {scope}/retention-policy` (admin): the namespace keeps a
 * terminal task `retention_ms` after it became terminal and after its latest
 * callback activity, whichever is later. Never below MIN_RETENTION_MS, so a
 * client can read a result it was just called back about.
 */
export const SetRetentionPolicyCommandSchema = v.strictObject({
  retention_ms: RetentionMsSchema,
});
/** Set a namespace's retention policy. */
export type SetRetentionPolicyCommand = v.InferOutput<typeof SetRetentionPolicyCommandSchema>;

/** Where a namespace's policy comes from: the server default, or set for the namespace. */
export const RetentionPolicySourceSchema = v.picklist(['default', 'namespace']);
/** Where a namespace's policy comes from. */
export type RetentionPolicySource = v.InferOutput<typeof RetentionPolicySourceSchema>;

/**
 * A namespace's retention policy. Applies to terminal executions and the
 * latest terminal callback activity; records a collection already removed
 * stay removed under any later policy. `updated_at` is present when the
 * policy was set for the namespace (`source: 'namespace'`).
 */
export const RetentionPolicySchema = v.strictObject({
  retention_ms: RetentionMsSchema,
  source: RetentionPolicySourceSchema,
  updated_at: v.exactOptional(TimestampSchema),
});
/** A namespace's retention policy. */
export type RetentionPolicy = v.InferOutput<typeof RetentionPolicySchema>;

/**
 * Bounded age candidates only (`GET {scope}/retention-policy/preview`): the
 * terminal tasks older than `cutoff`, counted up to
 * MAX_RETENTION_BATCH (`truncated` when more exist). Protective references (a
 * callback still pending or recently active) can defer a candidate's
 * collection, so a candidate is not a promise of removal. `oldest_terminal_at`
 * is present when there is a candidate. `cutoff` is `as_of − retention_ms`, or
 * later: what a shorter earlier policy (the server default included) had
 * already retired stays collectable under a longer one (the seed's "existing
 * retiring records continue physical collection under any later policy").
 */
export const RetentionPreviewSchema = v.strictObject({
  retention_ms: RetentionMsSchema,
  as_of: TimestampSchema,
  cutoff: TimestampSchema,
  candidates: intRange(0, MAX_RETENTION_BATCH),
  truncated: v.boolean(),
  oldest_terminal_at: v.exactOptional(TimestampSchema),
});
/** Bounded age candidates of a namespace's next collection. */
export type RetentionPreview = v.InferOutput<typeof RetentionPreviewSchema>;

/**
 * One bounded retention transaction in one namespace: the terminal tasks it
 * removed (at most MAX_RETENTION_BATCH) with their attempts, history, payloads
 * and finished subscriptions, and the expired worker sessions (with their
 * consumer cursors) it removed. Zero removed rows does not mean nothing is
 * retained: protection, cursor rotation or a new retirement can occur.
 * `has_more`: the pass was full, so another may find more.
 */
export const RetentionProgressSchema = v.strictObject({
  cutoff: TimestampSchema,
  tasks_removed: intRange(0, MAX_RETENTION_BATCH),
  attempts_removed: CounterSchema,
  history_removed: CounterSchema,
  subscriptions_removed: CounterSchema,
  sessions_removed: intRange(0, MAX_RETENTION_BATCH),
  has_more: v.boolean(),
});
/** Committed progress from one bounded retention transaction. */
export type RetentionProgress = v.InferOutput<typeof RetentionProgressSchema>;
