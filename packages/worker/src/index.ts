/**
 * @module @ledgence/worker
 *
 * The worker SDK and client. Depends on @ledgence/contracts only, so a user installs it alone.
 *
 * This package is a placeholder: its contents land with issue #5. It exports
 * nothing yet, so that the workspace, its dependency direction and its build
 * exist from the first commit.
 */
export {};
