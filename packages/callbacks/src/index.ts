/**
 * @module @ledgence/callbacks
 *
 * The completion-callback sender: leases due deliveries and POSTs signed CloudEvents with Standard Webhooks headers.
 *
 * This package is a placeholder: its contents land with issue #6. It exports
 * nothing yet, so that the workspace, its dependency direction and its build
 * exist from the first commit.
 */
export {};
