import type { AcquireReply, Problem, TaskResult } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { expectJson } from './testdata/expect.js';
import {
  ACME_PROD,
  acquireBody,
  assignTask,
  createHarness,
  KEYS,
  openSession,
  scopePath,
  settleBody,
  submitTask,
} from './testdata/harness.js';

/** Lets parked requests reach their wait. */
const tick = () => new Promise((resolve) => setTimeout(resolve, 30));

describe('long polls', () => {
  it('a parked acquire is answered assigned after a submit', async () => {
    const h = createHarness();
    const session = await openSession(h);
    let answered = false;
    const parked = h
      .call('/v1/worker/acquire?wait_ms=2000', {
        key: KEYS.worker,
        json: acquireBody(session, 0, 1),
      })
      .finally(() => {
        answered = true;
      });
    await tick();
    expect(answered).toBe(false);
    await submitTask(h);
    const reply = await expectJson<AcquireReply>(await parked, 200);
    expect(reply.disposition).toBe('assigned');
  });

  it('a client that goes away consumes nothing: the same sequence then assigns', async () => {
    const h = createHarness();
    const session = await openSession(h);
    const controller = new AbortController();
    const parked = h.call('/v1/worker/acquire?wait_ms=2000', {
      key: KEYS.worker,
      json: acquireBody(session, 0, 1),
      signal: controller.signal,
    });
    await tick();
    controller.abort();
    // The app still answers the (gone) client; what matters is what was recorded.
    await parked.catch(() => undefined);
    await submitTask(h);
    const next = await h.call('/v1/worker/acquire', {
      key: KEYS.worker,
      json: acquireBody(session, 0, 1),
    });
    expect((await expectJson<AcquireReply>(next, 200)).disposition).toBe('assigned');
  });

  it('a parked batch acquire is answered once a slot is assigned', async () => {
    const h = createHarness();
    const session = await openSession(h);
    const parked = h.call('/v1/worker/acquire:batch?wait_ms=2000', {
      key: KEYS.worker,
      json: { commands: [acquireBody(session, 0, 1), acquireBody(session, 1, 1)] },
    });
    await tick();
    await submitTask(h);
    const { replies } = await expectJson<{ replies: (AcquireReply | Problem)[] }>(
      await parked,
      200,
    );
    expect(replies.map((r) => ('code' in r ? r.code : r.disposition)).sort()).toEqual([
      'assigned',
      'empty',
    ]);
  });

  it('a parked result wait is answered when the task settles', async () => {
    const h = createHarness();
    const { task, assignment } = await assignTask(h);
    const parked = h.call(`${scopePath(ACME_PROD)}/tasks/${task.task_id}/result?wait_ms=2000`, {
      key: KEYS.client,
    });
    await tick();
    await h.call('/v1/worker/settle', { key: KEYS.worker, json: settleBody(assignment) });
    const result = await expectJson<TaskResult>(await parked, 200);
    expect(result.outcome.state).toBe('succeeded');
  });

  it('clamps wait_ms to the configured maximum', async () => {
    const h = createHarness({ longPollMaxMs: 50 });
    const session = await openSession(h);
    const res = await h.call('/v1/worker/acquire?wait_ms=99999999999', {
      key: KEYS.worker,
      json: acquireBody(session, 0, 1),
    });
    expect(await expectJson(res, 200)).toEqual({ disposition: 'empty', sequence: 1 });
    const task = await submitTask(h);
    const result = await h.call(
      `${scopePath(ACME_PROD)}/tasks/${task.task_id}/result?wait_ms=99999999999`,
      { key: KEYS.client },
    );
    expect((await expectJson<TaskResult>(result, 200)).outcome).toEqual({ state: 'pending' });
  });
});
