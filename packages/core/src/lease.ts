import {
  type Authority,
  ContractError,
  type Lease,
  type LeaseOwner,
  type Timestamp,
} from '@ledgence/contracts';
import type { AttemptRow, TaskRow } from './rows.js';

/** The scope columns a lease owner takes (a task's or its attempt's: they are the same). */
export type OwnerScopeColumns = Pick<TaskRow, 'tenant_id' | 'namespace'>;

/** The attempt columns a lease owner is made of. */
export type OwnerAttemptColumns = Pick<
  AttemptRow,
  'task_id' | 'attempt_id' | 'lease_id' | 'generation' | 'worker_session_id' | 'consumer_id'
>;

/** The fencing identity of an attempt's current lease. */
export function leaseOwner(task: OwnerScopeColumns, attempt: OwnerAttemptColumns): LeaseOwner {
  return {
    scope: { tenant_id: task.tenant_id, namespace: task.namespace },
    task_id: attempt.task_id,
    attempt_id: attempt.attempt_id,
    lease_id: attempt.lease_id,
    generation: attempt.generation,
    worker_session_id: attempt.worker_session_id,
    consumer_id: attempt.consumer_id,
  };
}

/** The attempt's lease as recorded. */
export function leaseOf(task: TaskRow, attempt: AttemptRow): Lease {
  return { owner: leaseOwner(task, attempt), expires_at: attempt.lease_expires_at };
}

/**
 * Authority sampled at `now`: remaining times are computed from store time on
 * every call, never replayed from a cached reply (seed: `Authority`).
 */
export function authorityAt(task: TaskRow, attempt: AttemptRow, now: Timestamp): Authority {
  return {
    owner: leaseOwner(task, attempt),
    expires_at: attempt.lease_expires_at,
    remaining_ms: Math.max(0, attempt.lease_expires_at - now),
    execution_remaining_ms: Math.max(0, attempt.deadline - now),
    renew_sequence: attempt.renew_sequence,
    cancel_requested: task.cancel_requested_at !== null,
    dispatch_allowed: attempt.dispatch_allowed,
  };
}

/** Whether every field of `owner` equals the attempt's current lease owner. */
export function ownerMatches(
  task: OwnerScopeColumns,
  attempt: OwnerAttemptColumns,
  owner: LeaseOwner,
): boolean {
  return (
    owner.scope.tenant_id === task.tenant_id &&
    owner.scope.namespace === task.namespace &&
    owner.task_id === attempt.task_id &&
    owner.attempt_id === attempt.attempt_id &&
    owner.lease_id === attempt.lease_id &&
    owner.generation === attempt.generation &&
    owner.worker_session_id === attempt.worker_session_id &&
    owner.consumer_id === attempt.consumer_id
  );
}

/** Whether the attempt still holds a live lease at `now`. */
export function leaseLive(attempt: AttemptRow, now: Timestamp): boolean {
  return attempt.state === 'active' && attempt.lease_expires_at > now;
}

/** A task or attempt the owner names does not exist in its scope. */
export function attemptNotFound(owner: LeaseOwner): ContractError {
  return new ContractError(
    'not_found',
    `attempt ${owner.attempt_id} of task ${owner.task_id} was not found`,
  );
}

/** The caller no longer holds the lease it names (DESIGN §4.1 `ownership_lost`). */
export function ownershipLost(owner: LeaseOwner, why: string): ContractError {
  return new ContractError('ownership_lost', `the lease on attempt ${owner.attempt_id} ${why}`);
}

/**
 * The loaded rows, checked to belong to `owner`: the task and attempt exist
 * (else `not_found`) and every owner field matches the current lease (else
 * `ownership_lost`). Liveness is checked by each operation, since a replay of
 * an accepted settlement must still answer after the lease ended.
 */
export function requireOwnedAttempt(
  task: TaskRow | null,
  attempt: AttemptRow | null,
  owner: LeaseOwner,
): { task: TaskRow; attempt: AttemptRow } {
  if (task === null || attempt === null || attempt.task_id !== task.task_id) {
    throw attemptNotFound(owner);
  }
  if (!ownerMatches(task, attempt, owner)) throw ownershipLost(owner, 'belongs to another owner');
  return { task, attempt };
}
