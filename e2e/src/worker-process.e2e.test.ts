/**
 * Worker processes against server processes (DESIGN §13, issue 5): the real
 * SDK worker in child processes, the real server in child processes on one
 * real PostgreSQL, with crash faults — a worker SIGKILLed mid-task, the server
 * restarted mid-run on the same port and database.
 */
import type { RecordedHistoryEvent } from '@ledgence/contracts';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  attemptIds,
  client,
  historyOf,
  idsOf,
  perAttempt,
  portOf,
  reasons,
  Stack,
  settled,
  until,
} from './test/harness.js';
import { type Execution, startWorkerProcess, type WorkerProcess } from './test/worker-process.js';

const stack = new Stack('worker_process_e2e');
let server: ServerProcess;
const processes: WorkerProcess[] = [];

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterEach(async () => {
  await Promise.all(processes.splice(0).map((p) => p.stop('SIGKILL')));
});
afterAll(async () => {
  await stack.close();
});

async function spawnWorkers(
  names: string[],
  url: string,
  queue: string,
  env: Record<string, string> = {},
) {
  const started = await Promise.all(names.map((n) => startWorkerProcess(n, url, queue, env)));
  processes.push(...started);
  return started;
}

/** Executions reported by `event`, counted per attempt id. */
function countBy(lines: Execution[], event: Execution['event']): Map<string, number> {
  const counts = new Map<string, number>();
  for (const line of lines) {
    if (line.event === event && line.attempt_id !== undefined) {
      counts.set(line.attempt_id, (counts.get(line.attempt_id) ?? 0) + 1);
    }
  }
  return counts;
}

/** Every attempt in the history has at most one accepted settlement. */
function expectOneSettlementPerAttempt(events: RecordedHistoryEvent[]): void {
  for (const count of perAttempt(events, 'report_accepted').values()) expect(count).toBe(1);
}

describe('worker processes', () => {
  it('run 500 tasks over 3 worker processes, each exactly once', async () => {
    const c = client(server.url);
    const queue = 'bulk';
    const ids = idsOf(
      await c.submitBatch(
        Array.from({ length: 500 }, (_, i) => ({ queue, program: 'job', data: { i, ms: 2 } })),
      ),
    );
    const workers = await spawnWorkers(['w1', 'w2', 'w3'], server.url, queue);
    const results = await settled(c, ids, 120_000);
    const exits = await Promise.all(workers.map((w) => w.stop('SIGTERM')));
    expect(exits).toEqual([0, 0, 0]);
    // Each task ran once, in exactly one process.
    const lines = workers.flatMap((w) => w.lines);
    for (const [i, result] of results.entries()) {
      expect(result.outcome).toEqual({ state: 'succeeded', output: { i } });
      // A second attempt failed a run under heavy load once: the message says what happened.
      const history = async () =>
        JSON.stringify({
          reasons: reasons(await historyOf(c, result.status.task_id)),
          lines: lines.filter((l) => l.task_id === result.status.task_id),
        });
      if (result.status.attempt_count !== 1) expect.fail(await history());
    }
    const started = lines.filter((l) => l.event === 'start');
    expect(started).toHaveLength(500);
    expect(new Set(started.map((l) => l.task_id))).toEqual(new Set(ids));
    // And the record says the same: one claim, one settlement, one success each.
    for (const id of ids) {
      const r = reasons(await historyOf(c, id));
      expect(r).toEqual([
        'submitted',
        'claimed',
        'dispatch_authorized',
        'report_accepted',
        'succeeded',
      ]);
    }
    const share = workers.map(
      (w) => `${w.name}: ${w.lines.filter((l) => l.event === 'start').length}`,
    );
    console.log(`500 tasks over 3 worker processes: ${share.join(', ')}`);
  });

  it('completes a task on another worker after SIGKILL mid-task; the killed attempt is lost', async () => {
    const c = client(server.url);
    const queue = 'kill';
    const task = await c.submit({ queue, program: 'job', data: { i: 7, hang_on_attempt: 1 } });
    const [victim] = await spawnWorkers(['victim'], server.url, queue);
    await until(
      () => victim?.lines.some((l) => l.event === 'start' && l.task_id === task.task_id) ?? false,
      30_000,
      'the victim starting the task',
    );
    const [survivor] = await spawnWorkers(['survivor'], server.url, queue);
    expect(await victim?.stop('SIGKILL')).toBe('SIGKILL');
    const [result] = await settled(c, [task.task_id]);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: { i: 7 } });
    expect(result?.status.attempt_count).toBe(2);
    expect(
      survivor?.lines.some(
        (l) => l.event === 'done' && l.task_id === task.task_id && l.attempt === 2,
      ),
    ).toBe(true);
    const events = await historyOf(c, task.task_id);
    expect(reasons(events)).toContain('lease_expired');
    const [killed, completed] = attemptIds(events);
    const lost = await c.attempt(task.task_id, killed as string);
    expect(lost.state).toBe('lost');
    expect(lost.settlement).toBeNull();
    expect(lost.lease.owner.worker_session_id).not.toBe(
      (await c.attempt(task.task_id, completed as string)).lease.owner.worker_session_id,
    );
    expect((await c.attempt(task.task_id, completed as string)).state).toBe('succeeded');
    expectOneSettlementPerAttempt(events);
  });

  it('survive server restarts mid-run (SIGTERM, then SIGKILL) without losing tasks', async () => {
    // Every restart outlasts the 1 s lease, so the attempts held across it are
    // lost and retried; the shutdown timeout is short because a stopping server
    // keeps serving (and claiming) on open keep-alive connections until it
    // passes (see the report on apps/server), which would cost more attempts.
    const env = { LEDGENCE_SHUTDOWN_TIMEOUT_MS: '1000' };
    const first = await stack.start(env);
    const port = portOf(first.url);
    const c = client(first.url);
    const queue = 'restart';
    const retry = { max_attempts: 10, delay_ms: 100 };
    const ids = idsOf(
      await c.submitBatch(
        Array.from({ length: 200 }, (_, i) => ({
          queue,
          program: 'job',
          data: { i, ms: 20 },
          retry,
        })),
      ),
    );
    // Debug logs, so a failure below can show each lost task's story.
    const workers = await spawnWorkers(['r1', 'r2'], first.url, queue, {
      CONCURRENCY: '4',
      WORKER_LOG: 'debug',
    });
    const done = () =>
      workers.reduce((n, w) => n + w.lines.filter((l) => l.event === 'done').length, 0);
    await until(() => done() >= 40, 60_000, '40 tasks done before the first restart');
    // A graceful stop ends parked polls with `empty`; a new server takes the same port.
    const downAt = Date.now();
    expect(await first.stop('SIGTERM')).toBe(0);
    const shutdown = Date.now() - downAt;
    const second = await stack.start({ ...env, PORT: port });
    const firstOutage = Date.now() - downAt;
    await until(() => done() >= 100, 60_000, '100 tasks done before the second restart');
    // A crash: connections reset, nothing finished gracefully.
    const killedAt = Date.now();
    expect(await second.stop('SIGKILL')).toBe('SIGKILL');
    const third = await stack.start({ ...env, PORT: port });
    const secondOutage = Date.now() - killedAt;
    expect(third.url).toBe(first.url);
    const results = await settled(c, ids, 120_000);
    const exits = await Promise.all(workers.map((w) => w.stop('SIGTERM')));
    expect(exits).toEqual([0, 0]);
    // Each task that did not succeed, with its outcome and history, to say why.
    const unexpected = [];
    for (const [i, result] of results.entries()) {
      if (result.outcome.state === 'succeeded') continue;
      const id = ids[i] as string;
      const events = await historyOf(c, id);
      unexpected.push({
        outcome: result.outcome,
        history: events.map((e) => `${e.event.at} ${e.event.reason} ${e.event.attempt_id}`),
        executions: workers.flatMap((w) => w.lines.filter((l) => l.task_id === id)),
        logs: workers.flatMap((w) =>
          w
            .stderr()
            .split('\n')
            .filter((l) => l.includes(id)),
        ),
      });
    }
    expect(unexpected).toEqual([]);
    results.forEach((result, i) => {
      expect(result.outcome).toEqual({ state: 'succeeded', output: { i } });
    });
    // User code at most once per attempt; at most one accepted settlement per
    // attempt; one success per task, whatever the restarts cost in attempts.
    const lines = workers.flatMap((w) => w.lines);
    expect([...countBy(lines, 'start').values()].every((n) => n === 1)).toBe(true);
    let retried = 0;
    for (const id of ids) {
      const events = await historyOf(c, id);
      expectOneSettlementPerAttempt(events);
      expect(reasons(events).filter((r) => r === 'succeeded')).toHaveLength(1);
      if (attemptIds(events).length > 1) retried += 1;
    }
    console.log(
      `server restarts: outages of ${firstOutage} ms (SIGTERM; ${shutdown} ms to exit) and ` +
        `${secondOutage} ms (SIGKILL); ` +
        `${retried} of 200 tasks needed more than one attempt`,
    );
  });
});
