/**
 * @module @ledgence/server
 *
 * The composition root: configuration, embedded PostgreSQL, migrations, the HTTP server, maintenance loops and the callback sender.
 *
 * This package is a placeholder: its contents land with issue #4. It exports
 * nothing yet, so that the workspace, its dependency direction and its build
 * exist from the first commit.
 */
export {};
