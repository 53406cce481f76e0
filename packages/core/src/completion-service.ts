import {
  type CompletionRetryCommand,
  type CompletionSubscribeCommand,
  type CompletionSubscription,
  ContractError,
  type Scope,
} from '@ledgence/contracts';
import type { CompletionStore, SubscribeOutcome } from './ports.js';

/** Options of {@link createCompletionService}. */
export interface CompletionServiceOptions {
  /** Where subscriptions and deliveries persist. */
  store: CompletionStore;
  /**
   * The operator's destination aliases (DESIGN §8). A client names an alias,
   * never a URL; an alias not in this set is `invalid_input`.
   */
  destinations: { has(alias: string): boolean };
}

/**
 * Subscriber-facing completion operations (seed: `CompletionService`).
 * Accepted subscriptions survive caller disconnection: a reply follows the
 * store's commit.
 */
export interface CompletionService {
  /** Subscribes a task to a destination alias; 201 when created, 200 when found by key. */
  subscribe(
    scope: Scope,
    taskId: string,
    command: CompletionSubscribeCommand,
  ): Promise<SubscribeOutcome>;
  /** A task's subscriptions with their delivery state. */
  list(scope: Scope, taskId: string): Promise<CompletionSubscription[]>;
  /** Starts the next generation of a finished delivery (DESIGN §8's generation rule). */
  redeliver(
    scope: Scope,
    subscriptionId: string,
    command: CompletionRetryCommand,
  ): Promise<CompletionSubscription>;
}

/**
 * The completion service over a store and the operator's destinations.
 *
 * @example
 * const completions = createCompletionService({ store, destinations: new Set(['billing']) });
 * const { created, subscription } = await completions.subscribe(scope, taskId, {
 *   subscription_key: 'billing-1', destination: 'billing' });
 */
export function createCompletionService(options: CompletionServiceOptions): CompletionService {
  const { store, destinations } = options;
  return {
    subscribe(scope, taskId, command) {
      if (!destinations.has(command.destination)) {
        // The alias is the caller's own input, so naming it leaks nothing.
        return Promise.reject(
          new ContractError(
            'invalid_input',
            '$.destination is not a configured callback destination alias',
            { reason: 'unknown_destination', path: '$.destination' },
          ),
        );
      }
      return store.subscribe(scope, taskId, command);
    },
    list: (scope, taskId) => store.listSubscriptions(scope, taskId),
    redeliver: (scope, subscriptionId, command) => store.redeliver(scope, subscriptionId, command),
  };
}
