/**
 * @module @ledgence/store-postgres
 *
 * The PostgreSQL store: Drizzle schema, committed migrations, the reviewed hot SQL (claim, renew, settle, recover) and embedded PostgreSQL for development and tests.
 *
 * This package is a placeholder: its contents land with issue #3. It exports
 * nothing yet, so that the workspace, its dependency direction and its build
 * exist from the first commit.
 */
export {};
