/**
 * Completion subscriptions as pure transitions (DESIGN §8): subscribing
 * (idempotent by key, at most MAX_COMPLETION_SUBSCRIPTIONS per task, due at
 * once for a terminal task), the terminal hook, redelivery's generation rule,
 * and a sender's lease and report of one try. A store calls these under the
 * locks the seed names (registration and the terminal hook under the task's
 * row lock; leasing and reporting on the subscription row only) and writes
 * the rows they return.
 */
import {
  COMPLETION_MAX_ATTEMPTS,
  COMPLETION_MAX_GENERATION,
  type CompletionRetryCommand,
  type CompletionSubscribeCommand,
  type CompletionSubscription,
  ContractError,
  MAX_COMPLETION_SUBSCRIPTIONS,
  type Scope,
  type TaskState,
  type TerminalTaskState,
  type Timestamp,
} from '@ledgence/contracts';
import type { SubscriptionRow, TaskRow } from './rows.js';

const TERMINAL_STATES: ReadonlySet<TaskState> = new Set(['succeeded', 'failed', 'cancelled']);

/** Whether a task in `state` is terminal (succeeded, failed or cancelled). */
export function isTerminalState(state: TaskState): state is TerminalTaskState {
  return TERMINAL_STATES.has(state);
}

/** The identifiers a new subscription gets. */
export interface SubscribeIds {
  /** The new subscription's id. */
  subscription_id: string;
  /** Its event id: the CloudEvent `id` and `webhook-id` of every try. */
  event_id: string;
}

/** A subscribe's row and whether it created it (201) or found it by key (200). */
export interface SubscribeResult {
  /** True for a new subscription (201), false when found by key (200). */
  created: boolean;
  /** The subscription, new or as it stands at `now`. */
  row: SubscriptionRow;
}

/**
 * Subscribes `task` to a destination alias (already checked against the
 * operator's destinations). The same `subscription_key` with the same
 * destination answers the existing subscription as it stands at `now`
 * ({@link expireLostTry}; the store does not write it); with another
 * destination it is a `conflict` (a key names one subscription forever). A
 * new subscription beyond MAX_COMPLETION_SUBSCRIPTIONS is `limit_exceeded`.
 * A terminal task's new subscription is due at once (DESIGN §8).
 */
export function subscribeTask(
  task: TaskRow,
  existing: readonly SubscriptionRow[],
  command: CompletionSubscribeCommand,
  now: Timestamp,
  ids: SubscribeIds,
): SubscribeResult {
  const same = existing.find((row) => row.subscription_key === command.subscription_key);
  if (same !== undefined) {
    if (same.destination !== command.destination) {
      throw new ContractError(
        'conflict',
        'this subscription_key already subscribes the task to another destination',
        { reason: 'subscription_key_reused' },
      );
    }
    return { created: false, row: expireLostTry(same, now) };
  }
  if (existing.length >= MAX_COMPLETION_SUBSCRIPTIONS) {
    throw new ContractError(
      'limit_exceeded',
      `a task has at most ${MAX_COMPLETION_SUBSCRIPTIONS} completion subscriptions`,
      { reason: 'max_completion_subscriptions' },
    );
  }
  const terminal = isTerminalState(task.state);
  return {
    created: true,
    row: {
      tenant_id: task.tenant_id,
      namespace: task.namespace,
      subscription_id: ids.subscription_id,
      task_id: task.task_id,
      subscription_key: command.subscription_key,
      destination: command.destination,
      event_id: ids.event_id,
      created_at: now,
      state: terminal ? 'due' : 'waiting',
      generation: 1,
      attempts: 0,
      next_attempt_at: terminal ? now : null,
      delivered_at: null,
      finished_at: null,
      last_status_code: null,
      last_error: null,
    },
  };
}

/**
 * The terminal hook: a waiting subscription of a task that just became
 * terminal is due now. Stores apply it in the transaction of the terminal
 * transition; any other state is returned unchanged.
 */
export function markDue(row: SubscriptionRow, now: Timestamp): SubscriptionRow {
  if (row.state !== 'waiting') return row;
  return { ...row, state: 'due', next_attempt_at: now };
}

/** A redelivery's row and whether it differs from the stored one (the store then writes it). */
export interface RedeliverResult {
  /** A new generation started, or a lost last try was exhausted first ({@link expireLostTry}). */
  changed: boolean;
  /** The subscription after the redelivery, or unchanged. */
  row: SubscriptionRow;
}

/**
 * Redelivery's generation rule (DESIGN §8): naming the current generation `g`
 * once it is delivered or exhausted starts `g+1` (due now, attempts from 0,
 * the same event); naming `g` again once `g+1` exists answers the
 * subscription unchanged, so a repeated request never starts two
 * generations — however many generations later the copy arrives (DESIGN
 * §1.3: the same request, the same answer); anything else (a generation not
 * started yet, or the current one still delivering) is a `conflict`. A generation beyond
 * COMPLETION_MAX_GENERATION is `limit_exceeded`: redelivery is a repair, not
 * a loop. The rule sees the row as it stands at `now`: a last try whose
 * sender's lease ended is exhausted ({@link expireLostTry}), so its
 * generation may be redelivered without waiting for a sender's next lease.
 */
export function redeliverSubscription(
  stored: SubscriptionRow,
  command: CompletionRetryCommand,
  now: Timestamp,
): RedeliverResult {
  const row = expireLostTry(stored, now);
  if (command.generation < row.generation) return { changed: row !== stored, row };
  if (command.generation !== row.generation) {
    throw new ContractError(
      'conflict',
      // The message never quotes the request (DESIGN §6 problems echo no input).
      "the named generation is past the subscription's current generation",
      { reason: 'generation_mismatch' },
    );
  }
  if (row.state !== 'delivered' && row.state !== 'exhausted') {
    throw new ContractError(
      'conflict',
      `the current generation is still ${row.state}; redeliver once it is delivered or exhausted`,
      { reason: 'generation_in_progress' },
    );
  }
  if (row.generation >= COMPLETION_MAX_GENERATION) {
    throw new ContractError(
      'limit_exceeded',
      `a subscription has at most ${COMPLETION_MAX_GENERATION} generations`,
      { reason: 'max_completion_generation' },
    );
  }
  return {
    changed: true,
    row: {
      ...row,
      state: 'due',
      generation: row.generation + 1,
      attempts: 0,
      next_attempt_at: now,
      delivered_at: null,
      finished_at: null,
      last_status_code: null,
      last_error: null,
    },
  };
}

/** Whether a sender may lease `row` at `now`: due, or a sender's lease that ran out. */
export function deliveryLeasable(row: SubscriptionRow, now: Timestamp): boolean {
  return (
    (row.state === 'due' || row.state === 'delivering') &&
    row.next_attempt_at !== null &&
    row.next_attempt_at <= now
  );
}

/** The recorded error of a try whose sender lost its lease without a report. */
export const DELIVERY_LEASE_EXPIRED_ERROR = 'the sender lease expired before the try was reported';

/** Whether `row` is delivering its generation's last try (no try may follow it). */
function deliveringLastTry(row: SubscriptionRow): boolean {
  return row.state === 'delivering' && row.attempts >= COMPLETION_MAX_ATTEMPTS;
}

/** A last try whose sender's lease ran out without a report: the generation is exhausted. */
function exhaustLostTry(row: SubscriptionRow, now: Timestamp): SubscriptionRow {
  return {
    ...row,
    state: 'exhausted',
    next_attempt_at: null,
    finished_at: now,
    // The lost try got no answer: an earlier try's status would misdescribe it.
    last_status_code: null,
    last_error: DELIVERY_LEASE_EXPIRED_ERROR,
  };
}

/**
 * A sender leases a leasable row: the next try starts (`attempts + 1`) and
 * the row is `delivering` until `now + leaseMs`. A row whose sender lost its
 * lease after the generation's last try becomes `exhausted` instead (no try
 * beyond COMPLETION_MAX_ATTEMPTS). Counting at lease time means a try that
 * crashed mid-POST still counts, so a crash loop cannot retry forever.
 */
export function leaseDelivery(
  row: SubscriptionRow,
  now: Timestamp,
  leaseMs: number,
): SubscriptionRow {
  if (deliveringLastTry(row)) return exhaustLostTry(row, now);
  return {
    ...row,
    state: 'delivering',
    attempts: row.attempts + 1,
    next_attempt_at: now + leaseMs,
  };
}

/**
 * The row as it stands at `now` (store time): a generation's last try whose
 * sender's lease has ended (`next_attempt_at <= now`) is `exhausted`, exactly
 * as the next {@link leaseDelivery} of the row will write it; any other row is
 * returned as it is (the same object). Once that lease ended nothing else can
 * happen to the delivery, but the next lease may be long in coming (leases
 * walk the due rows oldest first, behind any backlog) or never come (no
 * sender runs): the views apply this without writing, so they never show a
 * finished delivery as `delivering`, and redelivery applies it before its
 * generation rule and writes the result.
 */
export function expireLostTry(row: SubscriptionRow, now: Timestamp): SubscriptionRow {
  return deliveringLastTry(row) && deliveryLeasable(row, now) ? exhaustLostTry(row, now) : row;
}

/**
 * What one try of a leased delivery decided (the callbacks package computes it): `delivered`,
 * `exhausted`, or `due` again after `delay_ms`.
 */
export type DeliveryNext =
  | { readonly state: 'delivered' }
  | { readonly state: 'exhausted' }
  | { readonly state: 'due'; readonly delay_ms: number };

/** A sender's report of one try, fenced by the generation and try it leased. */
export interface DeliveryReport {
  /** The subscription's scope. */
  scope: Scope;
  /** The subscription the try delivered. */
  subscription_id: string;
  /** The generation the lease was for; a report for another is stale. */
  generation: number;
  /** The try's ordinal within the generation: the lease's `attempt`. */
  attempt: number;
  /** What the try decided ({@link DeliveryNext}). */
  next: DeliveryNext;
  /** The receiver's HTTP status, when it answered. */
  status_code?: number;
  /** Why the try failed, when it did (never a secret, never the response body). */
  error?: string;
}

/**
 * Applies a sender's report to the row, or returns `undefined` when the
 * report is stale: the row is not `delivering` this generation's try
 * `report.attempt` (the lease ran out and another sender took the row, or a
 * redelivery moved on). A stale report changes nothing; at-least-once means
 * the receiver may have seen the event twice, and dedupes by `webhook-id`.
 * A `due` report of the generation's last try (COMPLETION_MAX_ATTEMPTS)
 * exhausts the delivery, so `attempts` never exceeds the limit. A report of
 * the last try after its lease ended is stale too: from then on the views
 * show the delivery exhausted ({@link expireLostTry}), and what they showed
 * stands.
 */
export function reportDelivery(
  row: SubscriptionRow,
  report: DeliveryReport,
  now: Timestamp,
): SubscriptionRow | undefined {
  if (
    row.state !== 'delivering' ||
    row.generation !== report.generation ||
    row.attempts !== report.attempt ||
    (deliveringLastTry(row) && deliveryLeasable(row, now))
  ) {
    return undefined;
  }
  const outcome = {
    last_status_code: report.status_code ?? null,
    last_error: report.error ?? null,
  };
  // The generation's last try failed: no try may follow it, whatever the
  // sender asked, so the delivery is exhausted now (and its finish time
  // starts retention) rather than due for a lease that cannot try again.
  const next: DeliveryNext =
    report.next.state === 'due' && row.attempts >= COMPLETION_MAX_ATTEMPTS
      ? { state: 'exhausted' }
      : report.next;
  switch (next.state) {
    case 'delivered':
      return {
        ...row,
        ...outcome,
        state: 'delivered',
        next_attempt_at: null,
        delivered_at: now,
        finished_at: now,
      };
    case 'exhausted':
      return { ...row, ...outcome, state: 'exhausted', next_attempt_at: null, finished_at: now };
    case 'due':
      return {
        ...row,
        ...outcome,
        state: 'due',
        next_attempt_at: now + Math.max(0, next.delay_ms),
      };
  }
}

/** The wire view of a subscription row (absent optional fields, never null). */
export function completionSubscription(row: SubscriptionRow): CompletionSubscription {
  return {
    id: row.subscription_id,
    task_id: row.task_id,
    subscription_key: row.subscription_key,
    destination: row.destination,
    event_id: row.event_id,
    state: row.state,
    attempts: row.attempts,
    generation: row.generation,
    ...(row.next_attempt_at === null ? {} : { next_attempt_at: row.next_attempt_at }),
    ...(row.delivered_at === null ? {} : { delivered_at: row.delivered_at }),
    ...(row.last_status_code === null ? {} : { last_status_code: row.last_status_code }),
    ...(row.last_error === null ? {} : { last_error: row.last_error }),
  };
}
