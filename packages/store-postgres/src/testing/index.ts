/**
 * @module @ledgence/store-postgres/testing
 *
 * Test helpers for packages that need a real PostgreSQL (DESIGN §13). The vitest global setup
 * `global-setup.ts` (wired into the int and e2e projects) starts embedded PostgreSQL, or uses
 * `DATABASE_URL`; each test file then makes its own database with {@link createTestDatabase}, or
 * a copy of the run's migrated template with {@link createMigratedTestDatabase}.
 *
 * @example
 * ```ts
 * import postgres from 'postgres';
 * import { afterAll, beforeAll, expect, it } from 'vitest';
 * import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
 *
 * let db: TestDatabase;
 * beforeAll(async () => {
 *   db = await createTestDatabase({ prefix: 'example' });
 * });
 * afterAll(() => db.drop());
 *
 * it('talks to its own database', async () => {
 *   const sql = postgres(db.url, { max: 1, onnotice: () => {} });
 *   const [row] = await sql`select current_database() as name`;
 *   expect(row?.name).toBe(db.name);
 *   await sql.end();
 * });
 * ```
 */
export {
  type CreateTestDatabaseOptions,
  createTestDatabase,
  type TestDatabase,
} from './database.js';
export { createMigratedTestDatabase } from './migrated.js';
export { type PgProxy, type ProxyCounts, startPgProxy } from './pg-proxy.js';
