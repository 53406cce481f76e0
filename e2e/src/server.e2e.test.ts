import type {
  AcquireReply,
  Assignment,
  SettleReply,
  TaskStatus,
  WorkerSession,
} from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { call, SCOPE, settleBody, TASKS_BASE, taskBody } from './test/wire.js';

async function openSession(url: string, queue: string, concurrency: number) {
  const { body } = await call<WorkerSession>(url, '/v1/worker/sessions', {
    scope: SCOPE,
    queue,
    concurrency,
  });
  return body;
}

function poll(session: WorkerSession, consumer: number, sequence: number) {
  return {
    scope: SCOPE,
    queue: session.queue,
    worker_session_id: session.id,
    consumer_id: consumer,
    sequence,
  };
}

describe('the server over real sockets', () => {
  let database: TestDatabase;
  const servers: ServerProcess[] = [];
  const start = async (env: Record<string, string> = {}) => {
    const server = await startServerProcess({ DATABASE_URL: database.url, ...env });
    servers.push(server);
    return server;
  };

  beforeAll(async () => {
    database = await createTestDatabase({ prefix: 'server_e2e' });
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop('SIGKILL')));
    await database.drop();
  });

  it('wakes a long poll on one replica when another replica accepts a submit (NOTIFY)', async () => {
    // A rescan far beyond the wait: only the cross-replica NOTIFY can answer the poll.
    const env = { LEDGENCE_RESCAN_INTERVAL_MS: '600000', LEDGENCE_LONG_POLL_WAIT_MS: '20000' };
    const [a, b] = await Promise.all([start(env), start(env)]);
    const session = await openSession(a.url, 'wake', 1);
    const parked = call<AcquireReply>(
      a.url,
      '/v1/worker/acquire?wait_ms=20000',
      poll(session, 0, 1),
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    const submitted = await call(b.url, `${TASKS_BASE}/tasks`, taskBody('wake-1', 'wake'));
    const acknowledged = performance.now();
    expect(submitted.status).toBe(201);
    const reply = await parked;
    const latency = performance.now() - acknowledged;
    expect(reply.body.disposition).toBe('assigned');
    console.log(`cross-replica wake: poll answered ${latency.toFixed(1)} ms after the submit`);
  });

  it('consumes no task when the client disconnects during a long poll', async () => {
    const server = await start();
    const session = await openSession(server.url, 'disconnect', 1);
    const gone = new AbortController();
    const parked = call(
      server.url,
      '/v1/worker/acquire?wait_ms=20000',
      poll(session, 0, 1),
      gone.signal,
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    gone.abort();
    await expect(parked).rejects.toThrow();
    const { body: task } = await call<{ task_id: string }>(
      server.url,
      `${TASKS_BASE}/tasks`,
      taskBody('disconnect-1', 'disconnect'),
    );
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const status = await call<TaskStatus>(server.url, `${TASKS_BASE}/tasks/${task.task_id}`);
    expect(status.body.state).toBe('queued');
    // Sequence 1 was not consumed by the abandoned poll: it is still a new poll.
    const again = await call<AcquireReply>(server.url, '/v1/worker/acquire', poll(session, 0, 1));
    expect(again.body.disposition).toBe('assigned');
  });

  it('ends parked polls with empty on SIGTERM and exits 0', async () => {
    const server = await start();
    const session = await openSession(server.url, 'shutdown', 2);
    const parked = [0, 1].map((slot) =>
      call<AcquireReply>(server.url, '/v1/worker/acquire?wait_ms=20000', poll(session, slot, 1)),
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    const exit = server.stop('SIGTERM');
    const replies = await Promise.all(parked);
    for (const reply of replies) {
      expect(reply.status).toBe(200);
      expect(reply.body).toEqual({ disposition: 'empty', sequence: 1 });
      // Keep-alive connections are told to close, so they drain instead of lingering.
      expect(reply.headers.get('connection')).toBe('close');
    }
    expect(await exit).toBe(0);
  });

  it('two replicas on one database run 2 000 tasks, each exactly once', async () => {
    const [a, b] = await Promise.all([start(), start()]);
    const queue = 'bulk';
    const total = 2_000;
    for (let chunk = 0; chunk < total / 1_000; chunk++) {
      const commands = Array.from({ length: 1_000 }, (_, i) =>
        taskBody(`bulk-${chunk * 1_000 + i}`, queue),
      );
      const { status } = await call(a.url, `${TASKS_BASE}/tasks:batch`, { commands });
      expect(status).toBe(200);
    }
    const executions = new Map<string, number>();
    const workers = [a, b, a, b].map((server) => drain(server.url, queue, 16, executions, total));
    await Promise.all(workers);
    expect(executions.size).toBe(total);
    expect([...executions.values()].every((count) => count === 1)).toBe(true);
    const page = await call<{ tasks: TaskStatus[] }>(
      b.url,
      `${TASKS_BASE}/tasks?queue=${queue}&state=succeeded&limit=500`,
    );
    expect(page.body.tasks).toHaveLength(500);
  });
});

/**
 * A minimal raw-protocol worker over the batch routes: polls every slot, asks
 * for dispatch, "runs" the task (counting executions) and settles it, until
 * `total` tasks have run across all workers sharing `executions`.
 */
async function drain(
  url: string,
  queue: string,
  concurrency: number,
  executions: Map<string, number>,
  total: number,
): Promise<void> {
  const session = await openSession(url, queue, concurrency);
  const sequences = Array.from({ length: concurrency }, () => 0);
  const deadline = Date.now() + 90_000;
  while (executions.size < total && Date.now() < deadline) {
    const commands = sequences.map((last, slot) => poll(session, slot, last + 1));
    const { body } = await call<{ replies: (AcquireReply | { code: string })[] }>(
      url,
      '/v1/worker/acquire:batch?wait_ms=500',
      { commands },
    );
    const assigned: Assignment[] = [];
    body.replies.forEach((reply, slot) => {
      if (!('disposition' in reply)) throw new Error(`poll failed: ${JSON.stringify(reply)}`);
      sequences[slot] = reply.sequence;
      if (reply.disposition === 'assigned') assigned.push(reply.assignment);
    });
    if (assigned.length === 0) continue;
    const renewals = await call<{ results: { dispatch_allowed?: boolean }[] }>(
      url,
      '/v1/worker/renew:batch',
      {
        commands: assigned.map((a) => ({ owner: a.lease.owner, sequence: 1, intent: 'dispatch' })),
      },
    );
    const settles = assigned.map((assignment, i) => {
      if (renewals.body.results[i]?.dispatch_allowed !== true) {
        throw new Error(`dispatch refused: ${JSON.stringify(renewals.body.results[i])}`);
      }
      const taskId = assignment.lease.owner.task_id;
      executions.set(taskId, (executions.get(taskId) ?? 0) + 1);
      return settleBody(assignment, { kind: 'success', output: null });
    });
    const settled = await call<{ results: (SettleReply | { code: string })[] }>(
      url,
      '/v1/worker/settle:batch',
      { commands: settles },
    );
    for (const result of settled.body.results) {
      if (!('receipt' in result) || result.task_state !== 'succeeded') {
        throw new Error(`settle failed: ${JSON.stringify(result)}`);
      }
    }
  }
}
