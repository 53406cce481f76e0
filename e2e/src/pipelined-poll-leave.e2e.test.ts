/**
 * A poll pipelined behind another request on one keep-alive connection, whose
 * client closes the connection while the request ahead of it is still being answered.
 *
 * DESIGN §5: "a client disconnect ends the wait without consuming a task". The server runs
 * pipelined requests one after another (apps/server/src/listener.ts, inOrderPerConnection), so
 * the poll behind is started only once the request ahead is answered — here, once the client's
 * close ended it. node:http never emits 'close' on a response still queued behind another when
 * its socket closes, so a poll started after the client left would never be told it left: it
 * would park, claim the next task and keep it, leased to nobody. A request whose client left
 * while it was queued is not served.
 */
import { connect } from 'node:net';
import type { TaskStatus } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Stack, sleep } from './test/harness.js';
import { call, openSession, pollBody, submitTask, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('pipelined_poll_leave');
beforeAll(async () => {
  await stack.open();
}, 60_000);
afterAll(async () => {
  await stack.close();
});

async function statusOf(url: string, taskId: string): Promise<TaskStatus> {
  return (await call<TaskStatus>(url, `${TASKS_BASE}/tasks/${taskId}`)).body;
}

describe('a poll pipelined behind a parked request, whose client then leaves (DESIGN §5)', () => {
  it('consumes no task submitted after the client left: the task stays queued, never attempted', async () => {
    const server = await stack.start({ LEDGENCE_LEASE_DURATION_MS: '60000' });
    // The request ahead: a result wait on a task no one runs (another queue).
    const ahead = await submitTask(server.url, taskBody('edge-ahead', 'edge-other'));
    const queue = 'edge-behind';
    const session = await openSession(server.url, queue, 1);
    const poll = JSON.stringify(pollBody(session, queue, 0, 1));
    const { port } = new URL(server.url);
    await new Promise<void>((resolve) => {
      const socket = connect(Number(port), '127.0.0.1', () => {
        socket.write(
          `GET ${TASKS_BASE}/tasks/${ahead}/result?wait_ms=5000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n` +
            `POST /v1/worker/acquire?wait_ms=5000 HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
            `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(poll)}\r\n\r\n${poll}`,
        );
        // Both requests are read; the client leaves while the first one waits.
        setTimeout(() => socket.destroy(), 300);
      });
      socket.on('error', () => undefined);
      socket.on('close', () => resolve());
    });
    await sleep(300);
    // The client is gone: a task submitted now must not be claimed for its poll.
    const taskId = await submitTask(server.url, taskBody('edge-after-leave', queue));
    await sleep(1_500);
    const status = await statusOf(server.url, taskId);
    expect(
      { state: status.state, attempt_count: status.attempt_count },
      "a task submitted after the poll's client left was claimed for it (leased to nobody)",
    ).toEqual({ state: 'queued', attempt_count: 0 });
  });
});
