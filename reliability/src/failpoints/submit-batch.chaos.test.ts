/**
 * Crash: a submit batch whose commit outcome is unknown. The store answers every
 * item `unavailable` when a batch's COMMIT may or may not have landed (a connection lost with
 * COMMIT in flight; the `submit.after_commit=error` failpoint is that moment), so that each item
 * is retried "as it would be alone" with its identity (store.ts `submitBatch`). A single submit
 * in that state converges: the SDK retries the request with the same idempotency key. The SDK's
 * `submitBatch` must converge too: a retryable `unavailable` for tasks that exist, under
 * idempotency keys the SDK generated itself and never shows, leaves the caller no safe retry
 * (a retry without keys makes every task twice).
 */
import { ProblemError } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import { crashRun } from './test/crash-run.js';

describe('submitBatch through a commit whose outcome is unknown', () => {
  it('answers each committed task with its snapshot, and a retry makes no second task', async () => {
    await crashRun(
      'submit.after_commit',
      {},
      new Set(),
      async (run) => {
        const entries = [1, 2].map((n) => ({ queue: 'batch', program: 'echo', data: { n } }));
        const answers = await run.client.submitBatch(entries);
        expect(run.armedStderr()).toContain('failpoint fired: submit.after_commit (error)');
        const stored: string[] = [];
        for await (const page of run.client.list({ queue: 'batch' })) {
          stored.push(...page.tasks.map((t) => t.task_id));
        }
        // What a careful caller does with a retryable item problem: send the entry again.
        const retried = answers.some((a) => a instanceof ProblemError);
        if (retried) await run.client.submitBatch(entries);
        const after: string[] = [];
        for await (const page of run.client.list({ queue: 'batch' })) {
          after.push(...page.tasks.map((t) => t.task_id));
        }
        expect
          .soft(
            answers.map((a) => (a instanceof ProblemError ? `problem ${a.code}` : 'task')),
            `the store holds ${stored.length} tasks`,
          )
          .toEqual(['task', 'task']);
        expect(
          after,
          'tasks after the caller retried the entries answered unavailable',
        ).toHaveLength(2);
      },
      'submit.after_commit=error*1',
    );
  });
});
