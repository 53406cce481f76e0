/**
 * The HTTP edge over the real PostgreSQL store, driven through `app.request()`: what a request's
 * content alone can reach in the store ("No request may produce a 5xx by its content alone",
 * DESIGN §6), and the status reply limit of DESIGN §12 that a submission decides.
 */
import type {
  RecordedHistoryEvent,
  Scope,
  TaskPage,
  TaskSnapshot,
  TaskState,
} from '@ledgence/contracts';
import { TASK_STATUS_MAX_BYTES } from '@ledgence/contracts';
import { createTaskService } from '@ledgence/core';
import { submitCommand, submitCommandWithStatusBytes } from '@ledgence/core/testing';
import { createHttpApp } from '@ledgence/http';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const KEY = 'acme-key-0123456789';

let db: TestDatabase;
let store: PostgresTaskStore;
let app: ReturnType<typeof createHttpApp>;

beforeAll(async () => {
  db = await createMigratedTestDatabase('edge');
  store = createPostgresTaskStore({ url: db.url, max: 4 });
  app = createHttpApp({
    service: createTaskService({ store }),
    auth: { keys: [{ key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client'] }] },
  });
});
afterAll(async () => {
  await store?.close();
  await db?.drop();
});

/** A namespace of its own for each test, so listings see only that test's tasks. */
function scopeFor(namespace: string): Scope {
  return { tenant_id: 'acme', namespace };
}

const tasksPath = (scope: Scope) =>
  `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks`;

/** A problem document (DESIGN §6), as a batch item or a whole reply. */
interface Problem {
  status: number;
  code: string;
  reason?: string;
  path?: string;
}

/**
 * One request as the client key: a GET, or a POST of `json`. The reply's status, its body's
 * byte length and its body parsed as `T`.
 */
async function call<T>(
  path: string,
  json?: unknown,
): Promise<{ status: number; bytes: number; body: T }> {
  const headers: Record<string, string> = { authorization: `Bearer ${KEY}` };
  let body: string | undefined;
  if (json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const res = await app.request(path, {
    method: body === undefined ? 'GET' : 'POST',
    headers,
    body,
  });
  const bytes = new Uint8Array(await res.arrayBuffer());
  return {
    status: res.status,
    bytes: bytes.byteLength,
    body: JSON.parse(new TextDecoder().decode(bytes)) as T,
  };
}

/** The task ids a scope lists, newest first. */
async function listed(scope: Scope): Promise<string[]> {
  const page = await call<TaskPage>(tasksPath(scope));
  expect(page.status).toBe(200);
  return page.body.tasks.map((task) => task.task_id);
}

describe('GET {scope}/tasks/{id}/history?after_sequence (DESIGN §4.1: sequences are 0..2^53−1)', () => {
  it('answers 200 for any after_sequence the wire allows, [] past the end; 2^53 is 400', async () => {
    const scope = scopeFor('history');
    const created = await call<TaskSnapshot>(tasksPath(scope), submitCommand(scope));
    expect(created.status).toBe(201);
    const history = `${tasksPath(scope)}/${created.body.task_id}/history`;
    const first = await call<RecordedHistoryEvent[]>(`${history}?after_sequence=0`);
    expect([first.status, first.body.length]).toEqual([200, 1]);
    // Both sides of PostgreSQL's `integer` range, and the largest sequence the wire allows.
    for (const after of ['2147483647', '2147483648', '9007199254740991']) {
      const page = await call<RecordedHistoryEvent[]>(`${history}?after_sequence=${after}`);
      expect([after, page.status, page.body]).toEqual([after, 200, []]);
    }
    const beyond = await call<Problem>(`${history}?after_sequence=9007199254740992`);
    expect([beyond.status, beyond.body.code]).toEqual([400, 'invalid_input']);
  });
});

describe('TASK_STATUS_MAX_BYTES at submit (DESIGN §12)', () => {
  it('POST {scope}/tasks takes a task whose widest status is exactly the limit; one byte more is 413 and stores nothing', async () => {
    const scope = scopeFor('status-single');
    const atLimit = submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES);
    const created = await call<TaskSnapshot>(tasksPath(scope), atLimit);
    expect(created.status).toBe(201);
    const statusPath = `${tasksPath(scope)}/${created.body.task_id}`;
    expect((await call<unknown>(statusPath)).bytes).toBeLessThanOrEqual(TASK_STATUS_MAX_BYTES);
    // Terminal: the state and terminal_at the status carries at the end of the task's life.
    const cancelled = await call<{ task_state: TaskState }>(`${statusPath}/cancel`, {});
    expect(cancelled.body).toEqual({ task_state: 'cancelled' });
    expect((await call<unknown>(statusPath)).bytes).toBeLessThanOrEqual(TASK_STATUS_MAX_BYTES);

    const over = submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES + 1);
    const rejected = await call<Problem>(tasksPath(scope), over);
    expect(rejected.status).toBe(413);
    expect(rejected.body).toMatchObject({
      code: 'payload_too_large',
      reason: 'status_too_large',
      path: '$.input',
    });
    expect(await listed(scope)).toEqual([created.body.task_id]);
    // The rejected key was not taken: a valid command under it creates a task.
    const retried = await call<TaskSnapshot>(
      tasksPath(scope),
      submitCommand(scope, { idempotency_key: over.idempotency_key }),
    );
    expect(retried.status).toBe(201);
  });

  it('POST {scope}/tasks:batch answers 413 for the item over the limit alone', async () => {
    const scope = scopeFor('status-batch');
    const atLimit = submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES);
    const over = submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES + 1);
    const batch = await call<{ results: [Problem, TaskSnapshot] }>(`${tasksPath(scope)}:batch`, {
      commands: [over, atLimit],
    });
    expect(batch.status).toBe(200);
    const [rejected, created] = batch.body.results;
    expect(rejected).toMatchObject({
      status: 413,
      code: 'payload_too_large',
      reason: 'status_too_large',
      path: '$.commands[0].input',
    });
    expect(typeof created.task_id).toBe('string');
    expect(await listed(scope)).toEqual([created.task_id]);
  });
});
