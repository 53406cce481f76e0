import type { AcquireReply, Assignment, TaskStatus } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Stack, sleep, until } from './test/harness.js';
import {
  call,
  openSession,
  pollBody,
  postAndLeave,
  SCOPE,
  settleBody,
  submitTask,
  TASKS_BASE,
  taskBody,
} from './test/wire.js';

async function statusOf(url: string, taskId: string): Promise<TaskStatus> {
  return (await call<TaskStatus>(url, `${TASKS_BASE}/tasks/${taskId}`)).body;
}

describe('the poll protocol over real servers', () => {
  const stack = new Stack('poll_protocol');
  beforeAll(async () => {
    await stack.open();
  });
  afterAll(async () => {
    await stack.close();
  });

  // DESIGN §5: "A client disconnect ends the wait without consuming a task." A claim the server
  // made for a poll whose client was already gone is given back; the task never ran and must be
  // claimable at once, not parked for its retry delay (an hour here).
  it('a task claimed for a poll whose client left is assigned to the next poll at once, whatever its retry delay', async () => {
    const server = await stack.start({ LEDGENCE_LEASE_DURATION_MS: '60000' });
    let handedBack = 0;
    let delayed = 0;
    // The server may learn of the disconnect before it claims (then there is nothing to give
    // back): five tries, of which the review saw every one claim.
    for (let i = 0; i < 5; i++) {
      const queue = `left-${i}`;
      const session = await openSession(server.url, queue, 2);
      const taskId = await submitTask(
        server.url,
        taskBody(`left-${i}`, queue, { retry: { max_attempts: 3, delay_ms: 3_600_000 } }),
      );
      await postAndLeave(
        server.url,
        '/v1/worker/acquire?wait_ms=5000',
        pollBody(session, queue, 0, 1),
      );
      await sleep(200);
      // A claim made for the gone poll is handed back in a transaction of its own: wait for it.
      await until(async () => (await statusOf(server.url, taskId)).state === 'queued', 10_000);
      const status = await statusOf(server.url, taskId);
      if (status.attempt_count === 0) continue; // the server never claimed for the gone poll
      handedBack += 1;
      const next = await call<AcquireReply>(
        server.url,
        '/v1/worker/acquire?wait_ms=2000',
        pollBody(session, queue, 1, 1),
      );
      if (next.body.disposition !== 'assigned') delayed += 1;
    }
    expect(handedBack).toBeGreaterThan(0);
    expect(delayed).toBe(0);
  });

  it('two polls of one slot with the same sequence at once, parked: one claim, both answered with it', async () => {
    const server = await stack.start();
    const queue = 'twice';
    const session = await openSession(server.url, queue, 1);
    const body = pollBody(session, queue, 0, 1);
    const a = call<AcquireReply>(server.url, '/v1/worker/acquire?wait_ms=3000', body);
    const b = call<AcquireReply>(server.url, '/v1/worker/acquire?wait_ms=3000', body);
    await sleep(200);
    const taskId = await submitTask(server.url, taskBody('twice', queue));
    await submitTask(server.url, taskBody('twice-2', queue));
    const [x, y] = await Promise.all([a, b]);
    expect([x.status, y.status]).toEqual([200, 200]);
    expect(x.body.disposition).toBe('assigned');
    expect(y.body.disposition).toBe('assigned');
    const ox = (x.body as { assignment: Assignment }).assignment.lease.owner;
    const oy = (y.body as { assignment: Assignment }).assignment.lease.owner;
    expect(oy).toEqual(ox);
    const claimed = await statusOf(server.url, ox.task_id);
    expect(claimed.attempt_count).toBe(1);
    // The slot holds it: its next poll is consumer_busy, and the second task stays queued.
    const busy = await call<{ code: string }>(
      server.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 2),
    );
    expect(busy.status).toBe(409);
    expect(busy.body.code).toBe('consumer_busy');
    expect([taskId]).toContain(ox.task_id);
  });

  it('a poll replayed on another replica answers the same assignment, and a sequence gap there is 409', async () => {
    const one = await stack.start();
    const two = await stack.start();
    const queue = 'replicas';
    const session = await openSession(one.url, queue, 1);
    await submitTask(one.url, taskBody('replicas', queue));
    const first = await call<AcquireReply>(
      one.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 1),
    );
    const again = await call<AcquireReply>(
      two.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 1),
    );
    expect(first.body.disposition).toBe('assigned');
    expect(again.body.disposition).toBe('assigned');
    const f = (first.body as { assignment: Assignment }).assignment;
    const g = (again.body as { assignment: Assignment }).assignment;
    expect(g.event).toEqual(f.event);
    expect(g.lease.owner).toEqual(f.lease.owner);
    const gap = await call<{ code: string }>(
      two.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 3),
    );
    expect([gap.status, gap.body.code]).toEqual([409, 'sequence_conflict']);
  });

  it('a session that expires leaves its lease to its worker: renew and settle succeed, its polls and extend are 410', async () => {
    const server = await stack.start({ LEDGENCE_SESSION_VALIDITY_MS: '1000' });
    const queue = 'expiry';
    const session = await openSession(server.url, queue, 1);
    const taskId = await submitTask(server.url, taskBody('expiry', queue));
    const first = await call<AcquireReply>(
      server.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 1),
    );
    const assignment = (first.body as { assignment: Assignment }).assignment;
    let seq = 1;
    const grant = await call<{ dispatch_allowed: boolean }>(server.url, '/v1/worker/renew', {
      owner: assignment.lease.owner,
      sequence: seq,
      intent: 'dispatch',
    });
    expect(grant.body.dispatch_allowed).toBe(true);
    // Heartbeats past the session's validity (the lease is 1 s in the harness's timings).
    const until = performance.now() + 1_600;
    while (performance.now() < until) {
      await sleep(250);
      seq += 1;
      const beat = await call(server.url, '/v1/worker/renew', {
        owner: assignment.lease.owner,
        sequence: seq,
        intent: 'keep_alive',
      });
      expect(beat.status).toBe(200);
    }
    const replay = await call<{ code: string }>(
      server.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 1),
    );
    expect([replay.status, replay.body.code]).toEqual([410, 'session_expired']);
    const next = await call<{ code: string }>(
      server.url,
      '/v1/worker/acquire',
      pollBody(session, queue, 0, 2),
    );
    expect([next.status, next.body.code]).toEqual([410, 'session_expired']);
    const extend = await call<{ code: string }>(
      server.url,
      `/v1/worker/sessions/${session}/extend`,
      {
        scope: SCOPE,
      },
    );
    expect([extend.status, extend.body.code]).toEqual([410, 'session_expired']);
    const settled = await call<{ task_state: string }>(
      server.url,
      '/v1/worker/settle',
      settleBody(assignment, { kind: 'success', output: 1 }),
    );
    expect(settled.status).toBe(200);
    expect((await statusOf(server.url, taskId)).state).toBe('succeeded');
  });
});
