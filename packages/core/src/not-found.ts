/**
 * The rejections every store shares, so the memory store and the PostgreSQL
 * store answer the same code and words for the same situation.
 */
import { ContractError } from '@ledgence/contracts';

/**
 * A task that does not exist in the caller's scope. A task of another tenant
 * gets the very same error: it must be indistinguishable from an absent one.
 * The HTTP edge scrubs the id the caller supplied from the message.
 */
export function taskNotFound(taskId: string): ContractError {
  return new ContractError('not_found', `task ${taskId} was not found`);
}

/** A completion subscription that does not exist in the caller's scope (see {@link taskNotFound}). */
export function subscriptionNotFound(subscriptionId: string): ContractError {
  return new ContractError('not_found', `subscription ${subscriptionId} was not found`);
}

/**
 * An integer argument of an internal caller (a maintenance batch limit, a
 * lease length) in `min..max`. The HTTP layer validates user input before it
 * reaches a store, so anything else is a caller's bug: rejected as
 * `invalid_input`, never silently clamped, so it shows in tests.
 */
export function requireIntegerArgument(
  value: number,
  min: number,
  max: number,
  path: string,
): number {
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new ContractError('invalid_input', `${path} must be an integer in ${min}..${max}`, {
      reason: 'schema',
      path,
    });
  }
  return value;
}
