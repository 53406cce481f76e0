import { createHash } from 'node:crypto';
import { canonicalJson } from './canonical.js';
import { ContractError } from './errors.js';
import { NAME_MAX_BYTES, TASK_CURSOR_MAX_BYTES } from './limits.js';
import type { Scope, TaskFilters, TaskPosition } from './schemas/index.js';
import { textProblem } from './text.js';

/**
 * Cursor layout version. A cursor is `base64url(JSON [version, binding,
 * submitted_at, task_id])`; a new layout gets a new version so old cursors
 * are rejected with a clear error instead of misread.
 */
const CURSOR_VERSION = 1;

/**
 * Bytes of the scope-and-filters fingerprint kept in a cursor. It is a
 * binding, not a secret: a forged cursor can only seek within the scope the
 * server already enforces from the credential, so 96 bits against accidental
 * reuse with other filters is plenty.
 */
const BINDING_BYTES = 12;

const BASE64URL = /^[A-Za-z0-9_-]+$/;

/**
 * The fingerprint of a list query's scope and filters. Canonical JSON makes it
 * independent of key order and of how optional filters were spelled absent.
 */
export function taskCursorBinding(scope: Scope, filters: TaskFilters): string {
  const canonical = canonicalJson({
    scope: { tenant_id: scope.tenant_id, namespace: scope.namespace },
    filters,
  });
  return createHash('sha256')
    .update(canonical)
    .digest()
    .subarray(0, BINDING_BYTES)
    .toString('base64url');
}

/**
 * An opaque (base64url) cursor for the page after `position`, bound to the
 * scope and filters of the query that produced it (DESIGN §4).
 */
export function encodeTaskCursor(
  scope: Scope,
  filters: TaskFilters,
  position: TaskPosition,
): string {
  const payload = [
    CURSOR_VERSION,
    taskCursorBinding(scope, filters),
    position.submitted_at,
    position.task_id,
  ];
  return Buffer.from(JSON.stringify(payload), 'utf8').toString('base64url');
}

/**
 * A refused cursor, located at `query.cursor` as every list query parameter is (the cursor is
 * the `cursor` query parameter of `GET {scope}/tasks`; there is no JSON body to point into).
 */
function invalidCursor(message: string): ContractError {
  return new ContractError('invalid_input', `the query parameter cursor ${message}`, {
    reason: 'invalid_cursor',
    path: 'query.cursor',
  });
}

/** A task cursor's parts, as {@link readTaskCursor} reads them. */
export interface TaskCursorParts {
  /** What the cursor was issued for: compared with the query's own binding by {@link decodeTaskCursor}. */
  binding: unknown;
  position: TaskPosition;
}

/**
 * A cursor's parts, checked to be one this server issues but not yet that it was issued for the
 * query's scope and filters: what the edge can check before it knows the caller may read the
 * scope (DESIGN §4.1: decoding, 400, comes before authorization, 403).
 */
export function readTaskCursor(cursor: string): TaskCursorParts {
  if (cursor.length === 0 || cursor.length > TASK_CURSOR_MAX_BYTES) {
    throw invalidCursor(`must be 1..${TASK_CURSOR_MAX_BYTES} characters`);
  }
  if (!BASE64URL.test(cursor)) throw invalidCursor('is not a cursor issued by this server');
  let payload: unknown;
  try {
    payload = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    throw invalidCursor('is not a cursor issued by this server');
  }
  if (!Array.isArray(payload) || payload.length !== 4) {
    throw invalidCursor('is not a cursor issued by this server');
  }
  const [version, binding, submittedAt, taskId] = payload as unknown[];
  if (version !== CURSOR_VERSION) throw invalidCursor('has an unsupported version');
  if (
    typeof submittedAt !== 'number' ||
    !Number.isSafeInteger(submittedAt) ||
    submittedAt < 0 ||
    textProblem(taskId, NAME_MAX_BYTES) !== undefined
  ) {
    throw invalidCursor('is not a cursor issued by this server');
  }
  return { binding, position: { submitted_at: submittedAt, task_id: taskId as string } };
}

/**
 * The position a cursor encodes, after checking it was issued for this very
 * scope and these filters: a cursor replayed with other filters or in another
 * scope is `invalid_input` (DESIGN §4.1). A new page `limit` is allowed.
 */
export function decodeTaskCursor(cursor: string, scope: Scope, filters: TaskFilters): TaskPosition {
  const { binding, position } = readTaskCursor(cursor);
  if (binding !== taskCursorBinding(scope, filters)) {
    throw invalidCursor('was issued for another scope or other filters');
  }
  return position;
}
