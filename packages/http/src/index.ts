/**
 * @module @ledgence/http
 *
 * The HTTP adapter: a Hono app factory serving every route of the API with auth, strict decoding, long polls and problem+json errors.
 *
 * This package is a placeholder: its contents land with issue #4. It exports
 * nothing yet, so that the workspace, its dependency direction and its build
 * exist from the first commit.
 */
export {};
