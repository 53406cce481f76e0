/**
 * The SDK Client's result wait (`client.result(id, { waitMs })`) across a graceful restart of the
 * server it talks to (the Client JSDoc: "the server holds the request until the task is terminal
 * or the wait ends"). Until 2026-12-05 the stopping server answered a parked wait with the
 * task's current state, `pending`, and the Client handed that to its caller with 14 s of the
 * wait left; the wait is now refused `unavailable` (shutting_down), and the Client asks again
 * for what is left of it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { client, portOf, Stack, sleep } from './test/harness.js';
import { call, claimNext, settleBody, submitTask, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('result_wait_restart');
let other: ServerProcess;

const ENV = { LEDGENCE_LONG_POLL_WAIT_MS: '20000', LEDGENCE_SHUTDOWN_TIMEOUT_MS: '3000' };

beforeAll(async () => {
  await stack.open();
  // A second replica that stays up: the test's own changes go through it.
  other = await stack.start(ENV);
}, 120_000);
afterAll(() => stack.close());

describe('Client.result with waitMs across a restart of its server', () => {
  // A SIGKILL restart is covered by client-faults.e2e ("rides out a server killed and restarted").
  it('after a SIGTERM (graceful rolling restart) on the same port, the wait is answered by the later success, not with pending early', async () => {
    const signal = 'SIGTERM';
    const server = await stack.start(ENV);
    const c = client(server.url);
    const queue = `restart-${signal}`;
    const id = await submitTask(other.url, taskBody(queue, queue));
    const started = performance.now();
    let answeredAt = 0;
    const waiting = c.result(id, { waitMs: 15_000 }).then((r) => {
      answeredAt = performance.now();
      return r;
    });
    await sleep(500);
    await server.stop(signal);
    await stack.start({ ...ENV, PORT: portOf(server.url) });
    const assignment = await claimNext(other.url, queue);
    await sleep(300);
    const settled = performance.now();
    const reply = await call<{ task_state: string }>(
      other.url,
      '/v1/worker/settle',
      settleBody(assignment, { kind: 'success', output: 7 }),
    );
    expect(reply.body.task_state).toBe('succeeded');
    const result = await waiting;
    const ms = answeredAt - started;
    expect({
      state: result.outcome.state,
      answeredAfterSettle: answeredAt >= settled,
      answeredAtMs: ms < 1_000 ? 'within 1 s of the call' : 'later',
    }).toEqual({
      state: 'succeeded',
      answeredAfterSettle: true,
      answeredAtMs: 'later',
    });
    expect(ms).toBeLessThan(15_000);
    // The task stays readable through the restarted server.
    expect(
      (await call<{ state: string }>(server.url, `${TASKS_BASE}/tasks/${id}`)).body.state,
    ).toBe('succeeded');
  }, 90_000);
});
