/**
 * Numeric query values written with leading zeros mean the number they spell, however many zeros
 * (DESIGN §4.1's ranges are of values, not of spellings): `submitted_from=005` is 5 and binds the
 * same cursor as `5` (listing-filters.int); until 2026-12-05 a spelling past 16 characters was
 * read as Infinity before its value was looked at, so `wait_ms=0` so spelled parked for the whole
 * long-poll maximum, `after_sequence=0` was refused as "at most 2^53−1", `limit=1` as "outside
 * 1..500".
 */
import type { RecordedHistoryEvent, TaskPage, TaskResult, TaskSnapshot } from '@ledgence/contracts';
import { submitCommand } from '@ledgence/core/testing';
import { describe, expect, it } from 'vitest';
import { appOverPostgres, scopeFor, tasksPath } from './testdata/app-over-postgres.js';

const call = appOverPostgres('query_numbers', ['client']);

const zeros = (count: number) => '0'.repeat(count);

describe('numeric query values with leading zeros mean the number they spell', () => {
  it('result?wait_ms=0 spelled with 17 zeros answers at once, as wait_ms=0 does (not after the long-poll maximum)', async () => {
    const scope = scopeFor('wait_zero');
    const created = await call<TaskSnapshot>(tasksPath(scope), submitCommand(scope));
    expect(created.status).toBe(201);
    const path = `${tasksPath(scope)}/${created.body.task_id}/result`;
    const plain = await call<TaskResult>(`${path}?wait_ms=0`);
    expect([plain.status, plain.body.outcome]).toEqual([200, { state: 'pending' }]);
    const started = performance.now();
    const padded = await call<TaskResult>(`${path}?wait_ms=${zeros(17)}`);
    const tookMs = performance.now() - started;
    expect([padded.status, padded.body.outcome]).toEqual([200, { state: 'pending' }]);
    // wait_ms=0 is "no wait"; the long-poll maximum is 20 000 ms.
    expect(tookMs).toBeLessThan(3_000);
  }, 40_000);

  it('history?after_sequence=0 spelled with 17 zeros returns the history from the start, as after_sequence=0 does', async () => {
    const scope = scopeFor('history_zero');
    const created = await call<TaskSnapshot>(tasksPath(scope), submitCommand(scope));
    const path = `${tasksPath(scope)}/${created.body.task_id}/history`;
    const plain = await call<RecordedHistoryEvent[]>(`${path}?after_sequence=0`);
    const short = await call<RecordedHistoryEvent[]>(`${path}?after_sequence=${zeros(3)}`);
    expect([plain.status, plain.body.length]).toEqual([200, 1]);
    expect(short.body).toEqual(plain.body);
    const padded = await call<RecordedHistoryEvent[]>(`${path}?after_sequence=${zeros(17)}`);
    expect([padded.status, padded.body]).toEqual([200, plain.body]);
  });

  it('tasks?limit=1 and submitted_from=1 padded past 16 characters list what the short spelling lists', async () => {
    const scope = scopeFor('list_zero');
    const batch = await call<{ results: TaskSnapshot[] }>(`${tasksPath(scope)}:batch`, {
      commands: [submitCommand(scope), submitCommand(scope)],
    });
    expect(batch.status).toBe(200);
    const short = await call<TaskPage>(`${tasksPath(scope)}?limit=001&submitted_from=01`);
    expect([short.status, short.body.tasks.length]).toEqual([200, 1]);
    const padded = await call<TaskPage>(
      `${tasksPath(scope)}?limit=${zeros(17)}1&submitted_from=${zeros(19)}1`,
    );
    expect([padded.status, padded.body.tasks?.map((t) => t.task_id)]).toEqual([
      200,
      short.body.tasks.map((t) => t.task_id),
    ]);
    // The same filters: the cursor of one spelling continues under the other.
    const next = await call<TaskPage>(
      `${tasksPath(scope)}?limit=${zeros(17)}1&submitted_from=${zeros(19)}1&cursor=${short.body.next_cursor}`,
    );
    expect([next.status, next.body.tasks?.length]).toEqual([200, 1]);
  });
});
