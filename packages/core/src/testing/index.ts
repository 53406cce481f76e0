/**
 * @module @ledgence/core/testing
 *
 * Test support for anything built on the lifecycle core: an in-memory
 * `TaskStore`, `CompletionStore` and `RetentionStore` made only of the core's
 * pure transitions (the fast reference store), the conformance suites every
 * store runs (`TaskStore`: DESIGN §5 and §4.1; `CompletionStore`: §8;
 * `RetentionStore`), one or more vitest tests per rule, and fixture builders
 * for the commands tests send. The conformance suites need `vitest` (an
 * optional peer dependency); the memory store and the fixtures do not use it.
 *
 * @example
 * ```ts
 * import {
 *   createMemoryTaskStore,
 *   runTaskStoreConformance,
 * } from '@ledgence/core/testing';
 *
 * runTaskStoreConformance('memory store', async () => {
 *   const store = createMemoryTaskStore();
 *   return {
 *     store,
 *     config: store.config,
 *     advance: async (ms) => store.advance(ms),
 *     close: async () => {},
 *   };
 * });
 * ```
 */
export {
  type CompletionConformanceHarness,
  type CompletionConformanceStore,
  runCompletionStoreConformance,
  runRetentionStoreConformance,
} from './completion-conformance.js';
export {
  type ConformanceHarness,
  expectContractError,
  runTaskStoreConformance,
} from './conformance.js';
export {
  acquireCommand,
  freshScope,
  openSessionCommand,
  ownerOf,
  renewCommand,
  type SettleOptions,
  settleApplicationError,
  settleExecutionFailure,
  settleSuccess,
  submitCommand,
  submitCommandWithStatusBytes,
  TEST_NAMESPACE,
  TEST_QUEUE,
  withKeysReversed,
} from './fixtures.js';
export { type LifecycleModelHarness, runLifecycleModel } from './lifecycle-model.js';
export {
  createMemoryTaskStore,
  type MemoryTaskStore,
  type MemoryTaskStoreOptions,
} from './memory-store.js';
