/**
 * A worker spoken over raw HTTP, for the failpoint scenarios the SDK never takes: the single
 * `/v1/worker/renew` and `/v1/worker/settle` routes (the SDK sends batches), a hand-built
 * settle batch, a session extended on demand. Each request can be sent "through a restart":
 * re-sent unchanged while the server is gone (connection refused or reset) or answers 503,
 * exactly as a careful client retries a request whose outcome it does not know.
 */
import type {
  AcquireReply,
  Assignment,
  LeaseOwner,
  SettleCommand,
  WorkerSession,
} from '@ledgence/contracts';
import { NAMESPACE, sleep, TENANT } from '@ledgence/e2e/harness';

/** A termination bound for a request sent through a restart, not a timing claim. */
const THROUGH_RESTART_MS = 60_000;

export const SCOPE = { tenant_id: TENANT, namespace: NAMESPACE };

/** One HTTP answer: its status and parsed JSON body. */
export interface Answer<T = unknown> {
  readonly status: number;
  readonly body: T;
}

/** One POST; throws only if no answer came (the server is gone). */
export async function post<T = unknown>(
  url: string,
  path: string,
  body: unknown,
): Promise<Answer<T>> {
  const response = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: (text === '' ? null : JSON.parse(text)) as T };
}

/**
 * The same POST until an answer other than 503 comes: a lost connection or a 503 (the store
 * unavailable, an outcome unknown) is retried unchanged, anything else is returned.
 * `attempts` counts the requests sent.
 */
export async function postThroughRestart<T = unknown>(
  url: string,
  path: string,
  body: unknown,
): Promise<Answer<T> & { attempts: number }> {
  const end = Date.now() + THROUGH_RESTART_MS;
  for (let attempts = 1; ; attempts++) {
    try {
      const answer = await post<T>(url, path, body);
      if (answer.status !== 503) return { ...answer, attempts };
    } catch {
      // No answer: the server died or is not listening yet.
    }
    if (Date.now() > end)
      throw new Error(`${path}: no answer but 503 within ${THROUGH_RESTART_MS} ms`);
    await sleep(50);
  }
}

/** A 2xx body, or an error naming the route, status and problem. */
export function ok<T>(path: string, answer: Answer<T>): T {
  if (answer.status < 200 || answer.status > 299) {
    throw new Error(`${path}: ${answer.status} ${JSON.stringify(answer.body)}`);
  }
  return answer.body;
}

/** Opens a session on `queue` (no failpoint on its way) and returns it. */
export async function openSession(
  url: string,
  queue: string,
  concurrency = 1,
): Promise<WorkerSession> {
  const path = '/v1/worker/sessions';
  return ok(path, await post<WorkerSession>(url, path, { scope: SCOPE, queue, concurrency }));
}

/** Claims one task of `queue` on slot `consumer` of `session`; throws unless assigned. */
export async function acquire(
  url: string,
  session: WorkerSession,
  queue: string,
  consumer = 0,
): Promise<Assignment> {
  const path = '/v1/worker/acquire?wait_ms=1000';
  const reply = ok(
    path,
    await post<AcquireReply>(url, path, {
      scope: SCOPE,
      queue,
      worker_session_id: session.id,
      consumer_id: consumer,
      sequence: 1,
    }),
  );
  if (reply.disposition !== 'assigned') {
    throw new Error(`expected an assignment, got ${JSON.stringify(reply)}`);
  }
  return reply.assignment;
}

/** The settle command reporting success with `output` for the attempt `owner` holds. */
export function successOf(owner: LeaseOwner, operationId: string, output: unknown): SettleCommand {
  return {
    owner,
    operation_id: operationId,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  } as SettleCommand;
}
