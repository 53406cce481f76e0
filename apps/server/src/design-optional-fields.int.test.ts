/**
 * DESIGN §4.1 "Optional fields" over the real server on PostgreSQL. In requests an optional
 * field may be omitted or `null`, and the two spell the same command: a replay that spells
 * absent fields the other way is the same submission (200, the same task) and the same
 * settlement (`already_accepted`), not a 409. In replies, fields the seed does not skip are
 * present with `null` (`terminal_at`, `current_attempt_id`, `cancel_requested_at`,
 * `origin_trace`, `finished_at`, `settlement`, `last_renewal`).
 */
import type {
  AcquireReply,
  Assignment,
  Scope,
  SettleReply,
  TaskSnapshot,
  WorkerSession,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'of-acme-star-key-000000001';
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const SCOPE = `/v1/tenants/${A.tenant_id}/namespaces/${A.namespace}`;

const server = keyedServer('optional_fields', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});
const { post, get } = server.as(KEY);

/** Every optional field of a submission, spelled `null`. */
const NULL_TASK_FIELDS = {
  retry: null,
  timeout_ms: null,
  available_at: null,
  delay_ms: null,
  priority: null,
  concurrency_key: null,
  concurrency_limit: null,
  labels: null,
};

async function assignOne(queue: string) {
  const submitted = await post<TaskSnapshot>(`${SCOPE}/tasks`, {
    idempotency_key: queue,
    input: { ...A, queue, program: { name: 'p' }, data: 1 },
  });
  const session = (
    await post<WorkerSession>('/v1/worker/sessions', { scope: A, queue, concurrency: 1 })
  ).body;
  const reply = await post<AcquireReply>('/v1/worker/acquire', {
    scope: A,
    queue,
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  return {
    task: submitted.body,
    assignment: (reply.body as { assignment: Assignment }).assignment,
  };
}

describe('DESIGN §4.1 optional request fields: omitted or null', () => {
  it('a submission spelled with nulls and one spelled without them are one command, either first', async () => {
    const submission = (key: string, spelled: 'null' | 'omitted') => {
      const nulls = spelled === 'null';
      return {
        idempotency_key: key,
        input: {
          ...A,
          queue: 'of',
          program: { name: 'p', ...(nulls ? { version: null } : {}) },
          data: null,
          ...(nulls ? NULL_TASK_FIELDS : {}),
        },
        ...(nulls ? { origin_trace: null } : {}),
      };
    };
    for (const [first, second] of [
      ['null', 'omitted'],
      ['omitted', 'null'],
    ] as const) {
      const key = `of-submit-${first}`;
      const created = await post<TaskSnapshot>(`${SCOPE}/tasks`, submission(key, first));
      expect(created.status).toBe(201);
      const replayed = await post<TaskSnapshot>(`${SCOPE}/tasks`, submission(key, second));
      expect([replayed.status, replayed.body.task_id]).toEqual([200, created.body.task_id]);
    }
  });

  it('a settlement spelled with nulls and one spelled without them are one command: already_accepted, not 409', async () => {
    const { assignment } = await assignOne('of-settle');
    const owner = assignment.lease.owner;
    await post('/v1/worker/renew', { owner, sequence: 1, intent: 'dispatch' });
    const settle = (spelled: 'null' | 'omitted') => {
      const n = spelled === 'null';
      return {
        owner,
        operation_id: 'op',
        report: {
          kind: 'completed',
          report: {
            context: {
              identity: {
                task_id: owner.task_id,
                attempt_id: owner.attempt_id,
                ...(n ? { activation_id: null } : {}),
              },
            },
            outcome: {
              kind: 'application_error',
              error: { code: 'e', message: 'm', ...(n ? { details: null, retryable: null } : {}) },
            },
            ...(n ? { started_at: null, finished_at: null } : {}),
          },
        },
        quiescence: 'confirmed',
        processing_trace: null,
      };
    };
    const first = await post<SettleReply>('/v1/worker/settle', settle('null'));
    expect([first.status, first.body.already_accepted]).toEqual([200, false]);
    const again = await post<SettleReply>('/v1/worker/settle', settle('omitted'));
    expect([again.status, again.body.already_accepted, again.body.receipt]).toEqual([
      200,
      true,
      first.body.receipt,
    ]);
  });
});

describe('DESIGN §4.1 optional reply fields: null unless the seed skips them', () => {
  it('a queued task and a fresh attempt carry the null fields', async () => {
    const queued = await post<TaskSnapshot>(`${SCOPE}/tasks`, {
      idempotency_key: 'of-reply',
      input: { ...A, queue: 'of-reply', program: { name: 'p' }, data: 1 },
    });
    for (const field of ['terminal_at', 'current_attempt_id', 'origin_trace'] as const) {
      expect([field, field in queued.body, queued.body[field]]).toEqual([field, true, null]);
    }
    const status = await get(`${SCOPE}/tasks/${queued.body.task_id}`);
    for (const field of ['terminal_at', 'cancel_requested_at']) {
      expect([field, field in status.body, status.body[field]]).toEqual([field, true, null]);
    }
    const { task, assignment } = await assignOne('of-attempt');
    const attempt = await get(
      `${SCOPE}/tasks/${task.task_id}/attempts/${assignment.lease.owner.attempt_id}`,
    );
    for (const field of ['finished_at', 'settlement', 'last_renewal']) {
      expect([field, field in attempt.body, attempt.body[field]]).toEqual([field, true, null]);
    }
  });
});
