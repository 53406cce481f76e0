/**
 * The core's conformance suites against the PostgreSQL store: `TaskStore` (every rule of
 * DESIGN §5 and §4.1), `CompletionStore` (§8) and `RetentionStore`; `advance` moves the store's
 * test clock offset. Each suite runs on a database of its own.
 */
import {
  runCompletionStoreConformance,
  runRetentionStoreConformance,
  runTaskStoreConformance,
} from '@ledgence/core/testing';
import { CONFIG, harness } from './testdata/fixtures.js';

/** A fresh database and store for one suite, shaped as the suites' harness. */
async function conformanceHarness(prefix: string) {
  const h = await harness(prefix, CONFIG);
  return {
    store: h.store,
    config: CONFIG,
    advance: async (ms: number) => h.advance(ms),
    close: () => h.close(),
  };
}

runTaskStoreConformance('PostgreSQL task store', () => conformanceHarness('conformance'));

runCompletionStoreConformance('PostgreSQL completion store', () =>
  conformanceHarness('conformance_completion'),
);

runRetentionStoreConformance('PostgreSQL retention store', () =>
  conformanceHarness('conformance_retention'),
);
