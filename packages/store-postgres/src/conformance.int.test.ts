/**
 * The core's TaskStore conformance suite (every rule of DESIGN §5 and §4.1) against the
 * PostgreSQL store; `advance` moves the store's test clock offset.
 */
import { runTaskStoreConformance } from '@ledgence/core/testing';
import { CONFIG, harness } from './testdata/fixtures.js';

runTaskStoreConformance('PostgreSQL task store', async () => {
  const h = await harness('conformance', CONFIG);
  return {
    store: h.store,
    config: CONFIG,
    advance: async (ms) => h.advance(ms),
    close: () => h.close(),
  };
});
