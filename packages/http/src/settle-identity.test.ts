/**
 * Seed promise (seeds/001 `validate_task_output`): "The lifecycle core verifies the
 * report’s activation identity against the acquired task before acceptance." An ordinary task has
 * no workflow activation, so a report naming one does not match the acquired task, over HTTP too.
 */
import type { Problem } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { expectProblem } from './testdata/expect.js';
import {
  ACME_PROD,
  assignTask,
  createHarness,
  KEYS,
  scopePath,
  settleBody,
} from './testdata/harness.js';

describe('POST /v1/worker/settle: report identity', () => {
  it('rejects an activation_id in the report of an ordinary (non-workflow) task, changing nothing', async () => {
    const h = createHarness();
    const { task, assignment } = await assignTask(h);
    expect(assignment.workflow_activation_id).toBeUndefined();
    expect(assignment.event.ldgactivationid).toBeUndefined();
    const renew = await h.call('/v1/worker/renew', {
      key: KEYS.both,
      json: { owner: assignment.lease.owner, sequence: 1, intent: 'dispatch' },
    });
    expect(renew.status).toBe(200);
    const body = settleBody(assignment, 'op-activation');
    body.report.report.context.identity = {
      ...body.report.report.context.identity,
      activation_id: assignment.lease.owner.task_id,
    } as typeof body.report.report.context.identity;
    const res = await h.call('/v1/worker/settle', { key: KEYS.both, json: body });
    const problem: Problem = await expectProblem(res, 'invalid_input');
    expect(problem.status).toBe(400);
    const status = await h.call(`${scopePath(ACME_PROD)}/tasks/${task.task_id}`, {
      key: KEYS.both,
    });
    expect(((await status.json()) as { state: string }).state).toBe('active');
  });
});
