/**
 * @module @ledgence/core
 *
 * The lifecycle core: pure state transitions, the ports (TaskStore, wake, the store's clock) and the TaskService built on them. No SQL, no HTTP.
 *
 * This package is a placeholder: its contents land with issue #3. It exports
 * nothing yet, so that the workspace, its dependency direction and its build
 * exist from the first commit.
 */
export {};
