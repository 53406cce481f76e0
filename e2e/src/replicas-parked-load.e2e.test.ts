/**
 * Many parked polls on two replicas and a burst of submits (no lost wake-up, no
 * double claim), and a replica stopped with SIGTERM while polls are parked on it. The rescan is
 * ten minutes: a poll left parked with eligible work would wait out its whole wait.
 */
import type { AcquireReply } from '@ledgence/contracts';
import { silentLogger, Worker } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  client,
  historyOf,
  NAMESPACE,
  perAttempt,
  settled,
  sleep,
  TENANT,
} from './test/harness.js';
import { replicaPair } from './test/replicas.js';
import {
  call,
  HINTS_ONLY_ENV,
  openSession,
  pollBody,
  submitTask,
  taskBody,
  WAIT_MS,
} from './test/wire.js';

const ENV = {
  ...HINTS_ONLY_ENV,
  LEDGENCE_LEASE_DURATION_MS: '30000',
  LEDGENCE_RENEW_INTERVAL_MS: '10000',
  LEDGENCE_MAINTENANCE_INTERVAL_MS: '500',
};

const pair = replicaPair('replicas_parked_load', { env: ENV });

/** 200 single-slot polls, parked: 50 slots of each of 4 sessions, two sessions per replica. */
async function park200(queue: string, waitMs: number) {
  const polls: Promise<{ status: number; reply: AcquireReply; ms: number }>[] = [];
  for (const url of [pair.a.url, pair.a.url, pair.b.url, pair.b.url]) {
    const sid = await openSession(url, queue, 50);
    for (let c = 0; c < 50; c += 1) {
      polls.push(
        (async () => {
          const started = performance.now();
          const { status, body } = await call<AcquireReply>(
            url,
            `/v1/worker/acquire?wait_ms=${waitMs}`,
            pollBody(sid, queue, c, 1),
          );
          return { status, reply: body, ms: performance.now() - started };
        })(),
      );
    }
  }
  return polls;
}

describe('200 parked polls over two replicas, a burst of separate submits', () => {
  it('200 tasks for 200 parked polls: every poll assigned promptly, each task once', async () => {
    const queue = 'burst-200';
    const polls = await park200(queue, WAIT_MS);
    await sleep(1_000);
    const burstAt = performance.now();
    const ids = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        submitTask(i % 2 ? pair.a.url : pair.b.url, taskBody(`b200-${i}`, queue)),
      ),
    );
    const replies = await Promise.all(polls);
    const answeredAfterBurst = performance.now() - burstAt;
    const statuses = replies.map((r) => r.status);
    expect(
      statuses.every((s) => s === 200),
      JSON.stringify(statuses),
    ).toBe(true);
    const assigned = replies.flatMap((r) =>
      r.reply.disposition === 'assigned' ? [r.reply.assignment.lease.owner.task_id] : [],
    );
    const slow = replies.filter((r) => r.ms > 15_000).length;
    expect({ assigned: assigned.length, distinct: new Set(assigned).size, slow }).toEqual({
      assigned: 200,
      distinct: 200,
      slow: 0,
    });
    expect(new Set(assigned)).toEqual(new Set(ids));
    expect(answeredAfterBurst).toBeLessThan(15_000);
  }, 120_000);

  it('150 tasks for 200 parked polls: 150 assigned promptly, 50 answered empty at the wait', async () => {
    const queue = 'burst-150';
    const polls = await park200(queue, 8_000);
    await sleep(1_000);
    const ids = await Promise.all(
      Array.from({ length: 150 }, (_, i) =>
        submitTask(i % 2 ? pair.a.url : pair.b.url, taskBody(`b150-${i}`, queue)),
      ),
    );
    const replies = await Promise.all(polls);
    const assigned = replies.filter((r) => r.reply.disposition === 'assigned');
    const taskIds = assigned.map((r) =>
      r.reply.disposition === 'assigned' ? r.reply.assignment.lease.owner.task_id : '',
    );
    expect(new Set(taskIds)).toEqual(new Set(ids));
    expect(assigned.length).toBe(150);
    // Assigned ones came well before the 8 s wait.
    const lateAssigned = assigned.filter((r) => r.ms > 7_000).length;
    expect(lateAssigned).toBe(0);
  }, 120_000);

  it('SDK workers (4 × 50 slots over A and B) drain a burst of 1 000 tasks, each run once', async () => {
    const queue = 'sdk-burst';
    const runs = new Map<string, number>();
    const workers: Worker[] = [];
    for (const url of [pair.a.url, pair.a.url, pair.b.url, pair.b.url]) {
      const w = new Worker({
        url,
        tenant: TENANT,
        namespace: NAMESPACE,
        queue,
        concurrency: 50,
        logger: silentLogger,
        pollWaitMs: WAIT_MS,
      });
      w.register('work', async (_d, ctx) => {
        runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1);
        await sleep(20);
        return null;
      });
      workers.push(w);
    }
    const running = workers.map((w) => w.run());
    try {
      await sleep(2_000); // all parked
      const ca = client(pair.a.url);
      const cb = client(pair.b.url);
      const started = performance.now();
      const batches = await Promise.all(
        Array.from({ length: 10 }, (_, k) =>
          (k % 2 ? ca : cb).submitBatch(
            Array.from({ length: 100 }, (_, i) => ({ queue, program: 'work', data: { k, i } })),
          ),
        ),
      );
      const ids = batches.flat().map((r) => {
        if (r instanceof Error) throw r;
        return r.task_id;
      });
      const results = await settled(ca, ids, 90_000);
      const tookMs = performance.now() - started;
      expect(results.every((r) => r.outcome.state === 'succeeded')).toBe(true);
      const twice = [...runs].filter(([, n]) => n !== 1);
      expect(twice).toEqual([]);
      expect(runs.size).toBe(1_000);
      // 1 000 × 20 ms over 200 slots is ~100 ms of handler time; a lost wake-up costs a 20 s wait.
      expect(tookMs).toBeLessThan(20_000);
      // Sample histories: one report per task.
      for (const id of ids.slice(0, 50)) {
        const reports = [...perAttempt(await historyOf(ca, id), 'report_accepted').values()];
        expect(reports.reduce((x, y) => x + y, 0)).toBe(1);
      }
    } finally {
      await Promise.all(workers.map((w) => w.stop({ graceMs: 0 })));
      await Promise.allSettled(running);
    }
  }, 180_000);
});

describe('a replica stopped with SIGTERM while polls are parked on it', () => {
  it('answers every parked poll (single and batch) with empty, promptly, and exits 0', async () => {
    const c = await pair.stack.start(ENV);
    const queue = 'sigterm-parked';
    const sid = await openSession(c.url, queue, 20);
    const singles = Array.from({ length: 10 }, (_, k) =>
      (async () => {
        const started = performance.now();
        const r = await call<AcquireReply>(
          c.url,
          `/v1/worker/acquire?wait_ms=${WAIT_MS}`,
          pollBody(sid, queue, k, 1),
        );
        return { ...r, ms: performance.now() - started };
      })(),
    );
    const batch = (async () => {
      const started = performance.now();
      const r = await call<{ replies: AcquireReply[] }>(
        c.url,
        `/v1/worker/acquire:batch?wait_ms=${WAIT_MS}`,
        { commands: Array.from({ length: 10 }, (_, k) => pollBody(sid, queue, 10 + k, 1)) },
      );
      return { ...r, ms: performance.now() - started };
    })();
    await sleep(1_500);
    const stopAt = performance.now();
    const exited = c.stop('SIGTERM');
    const single = await Promise.all(singles);
    const batched = await batch;
    const answeredAfterStop = performance.now() - stopAt;
    expect(single.map((s) => [s.status, (s.body as AcquireReply).disposition])).toEqual(
      Array.from({ length: 10 }, () => [200, 'empty']),
    );
    expect(batched.status).toBe(200);
    expect(batched.body.replies.map((r) => r.disposition)).toEqual(Array(10).fill('empty'));
    // Answered by the stop, not by the end of their 20 s wait.
    expect(answeredAfterStop).toBeLessThan(10_000);
    expect(await exited).toBe(0);
    // The empties were recorded: the same sequence replayed on another replica is `empty`
    // again, the next one is a new poll there.
    const replay = await call<AcquireReply>(
      pair.b.url,
      '/v1/worker/acquire',
      pollBody(sid, queue, 0, 1),
    );
    expect(replay.body.disposition).toBe('empty');
    const next = await call<AcquireReply>(
      pair.b.url,
      '/v1/worker/acquire',
      pollBody(sid, queue, 0, 2),
    );
    expect(next.status).toBe(200);
  }, 120_000);
});
