/**
 * @module @ledgence/store-postgres
 *
 * The PostgreSQL store of Ledgence (DESIGN §7): the Drizzle schema, the committed drizzle-kit
 * migrations with an advisory-locked `migrate()`, the `TaskStore`, `CompletionStore` and
 * `RetentionStore` on postgres.js (every lifecycle operation one transaction applying the core's
 * pure transitions; batches share statements and a commit), the reviewed SQL (`hot-sql.ts`,
 * `completion-sql.ts`, `retention-sql.ts`), a LISTEN/NOTIFY wake source, and embedded
 * PostgreSQL for development and tests.
 *
 * @example
 * ```ts
 * import {
 *   createPostgresTaskStore,
 *   createPostgresWakeSource,
 *   migrate,
 *   startEmbeddedPostgres,
 * } from '@ledgence/store-postgres';
 *
 * const server = await startEmbeddedPostgres({ dataDir: './.ledgence/pg' });
 * await migrate(server.url); // safe to run from every replica at once
 * const store = createPostgresTaskStore({ url: server.url });
 * const wake = createPostgresWakeSource({ url: server.url });
 * try {
 *   const { created, snapshot } = await store.submit({
 *     idempotency_key: 'order-42',
 *     input: { tenant_id: 'acme', namespace: 'prod', queue: 'email',
 *              program: { name: 'send-email' }, data: { to: 'ada@example.com' } },
 *   });
 *   console.log(created, snapshot.state); // → true queued
 * } finally {
 *   await wake.close();
 *   await store.close();
 *   await server.stop();
 * }
 * ```
 *
 * Test helpers (a database per test file) live at `@ledgence/store-postgres/testing`.
 */
export {
  type EmbeddedPostgres,
  EmbeddedPostgresError,
  type EmbeddedPostgresErrorCode,
  type EmbeddedPostgresOptions,
  startEmbeddedPostgres,
} from './embedded.js';
export { WAKE_CHANNEL } from './hot-sql.js';
export {
  MIGRATION_LOCK_KEY,
  MIGRATIONS_FOLDER,
  type MigrationResult,
  type MigrationStatus,
  type MigrationTarget,
  migrate,
  migrationStatus,
  pendingMigrations,
} from './migrate.js';
/** The Drizzle schema: one export per table. */
export * as schema from './schema.js';
export {
  createPostgresTaskStore,
  type PostgresTaskStore,
  type PostgresTaskStoreOptions,
  type QueueDepth,
} from './store.js';
export {
  createPostgresWakeSource,
  type PostgresWakeSource,
  type PostgresWakeSourceOptions,
  type WakeListenState,
} from './wake.js';
