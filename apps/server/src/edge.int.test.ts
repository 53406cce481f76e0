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
import { submitCommand, submitCommandWithStatusBytes } from '@ledgence/core/testing';
import { describe, expect, it } from 'vitest';
import { appOverPostgres, scopeFor, tasksPath } from './testdata/app-over-postgres.js';

const call = appOverPostgres('edge', ['client']);

/** A problem document (DESIGN §6), as a batch item or a whole reply. */
interface Problem {
  status: number;
  code: string;
  reason?: string;
  path?: string;
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
