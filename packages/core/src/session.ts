import {
  ContractError,
  type OpenSessionCommand,
  type Scope,
  type Timestamp,
  type WorkerSession,
} from '@ledgence/contracts';
import type { LifecycleConfig } from './config.js';
import type { SessionRow } from './rows.js';

/** A new session valid for the configured session validity. */
export function openSession(
  command: OpenSessionCommand,
  id: string,
  now: Timestamp,
  config: LifecycleConfig,
): SessionRow {
  return {
    id,
    tenant_id: command.scope.tenant_id,
    namespace: command.scope.namespace,
    queue: command.queue,
    concurrency: command.concurrency,
    created_at: now,
    expires_at: now + config.sessionValidityMs,
  };
}

/**
 * The session, checked to exist in `scope` (else `404 session_not_found`) and
 * to be unexpired at store time (else `410 session_expired`). Sessions are
 * issued by the service and never recreated by acquisition.
 */
export function requireLiveSession(
  session: SessionRow | null,
  scope: Scope,
  sessionId: string,
  now: Timestamp,
): SessionRow {
  if (
    session === null ||
    session.tenant_id !== scope.tenant_id ||
    session.namespace !== scope.namespace
  ) {
    throw new ContractError('session_not_found', `worker session ${sessionId} was not found`);
  }
  if (session.expires_at <= now) {
    throw new ContractError(
      'session_expired',
      `worker session ${sessionId} expired; open a new session`,
    );
  }
  return session;
}

/** `extend` sets `expires_at = now + session validity` (DESIGN §4.1). */
export function extendSession(
  session: SessionRow,
  now: Timestamp,
  config: LifecycleConfig,
): SessionRow {
  return { ...session, expires_at: now + config.sessionValidityMs };
}

/** A session row in its wire shape. */
export function workerSession(session: SessionRow): WorkerSession {
  return {
    id: session.id,
    scope: { tenant_id: session.tenant_id, namespace: session.namespace },
    queue: session.queue,
    concurrency: session.concurrency,
    expires_at: session.expires_at,
  };
}
