/**
 * What the test global setup hands to test files through vitest's `provide`/`inject`, typed in
 * one place so that both sides agree on the key and its value.
 */

declare module 'vitest' {
  export interface ProvidedContext {
    /** postgres:// URL of the test server's admin database; test databases are made from it. */
    ledgenceAdminDatabaseUrl: string;
  }
}

/** The `inject` key of the test server's admin database URL. */
export const ADMIN_URL_KEY = 'ledgenceAdminDatabaseUrl';

/** Every test database's name starts with this, so leftovers of crashed runs can be found. */
export const TEST_DATABASE_PREFIX = 'ledgence_test_';
