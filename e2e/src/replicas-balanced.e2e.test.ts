/**
 * Replicas: SDK workers and a client behind a round-robin TCP balancer over two
 * server processes on one database; one replica is stopped (SIGTERM) or crashes (SIGKILL)
 * while they work. Every task must end succeeded, run to completion exactly once.
 */
import type { Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  historyOf,
  idsOf,
  perAttempt,
  portOf,
  Stack,
  settled,
  shortWorker,
  sleep,
  until,
  watchUnhandledRejections,
} from './test/harness.js';
import { type Balancer, startBalancer } from './test/replicas.js';

const stack = new Stack('replicas_balanced');
const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];
let balancer: Balancer;
let replicas: ServerProcess[] = [];

beforeAll(async () => {
  await stack.open();
  replicas = await Promise.all([stack.start(), stack.start()]);
  balancer = await startBalancer(() => replicas.map((r) => r.url));
}, 120_000);
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await balancer.close();
  await stack.close();
});

async function runThrough(signal: 'SIGTERM' | 'SIGKILL', queue: string) {
  const c = client(balancer.url);
  const total = 300;
  const ids = idsOf(
    await c.submitBatch(
      Array.from({ length: total }, (_, i) => ({ queue, program: 'work', data: { i } })),
    ),
  );
  const runs = new Map<string, number>();
  for (let w = 0; w < 3; w += 1) {
    const worker = shortWorker(balancer.url, queue, { concurrency: 4 });
    worker.register('work', async (_data, ctx) => {
      const id = ctx.taskId;
      runs.set(id, (runs.get(id) ?? 0) + 1);
      await sleep(20);
      return null;
    });
    workers.push(worker);
    void worker.run();
  }
  // Let them get going, then take one replica away and bring it back on the same port.
  await until(async () => runs.size >= 60, 60_000, 'work under way');
  const victim = replicas[0] as ServerProcess;
  expect(await victim.stop(signal)).toBe(signal === 'SIGTERM' ? 0 : 'SIGKILL');
  await sleep(500);
  replicas[0] = await stack.start({ PORT: portOf(victim.url) });

  const results = await settled(c, ids, 120_000);
  const states = new Map<string, number>();
  for (const r of results) states.set(r.outcome.state, (states.get(r.outcome.state) ?? 0) + 1);
  expect(Object.fromEntries(states)).toEqual({ succeeded: total });
  // Every task settled once: one report_accepted in its history, on one attempt.
  const doubly: string[] = [];
  for (const id of ids) {
    const events = await historyOf(c, id);
    const reports = [...perAttempt(events, 'report_accepted').values()].reduce((a, b) => a + b, 0);
    if (reports !== 1) doubly.push(`${id}: ${reports} reports`);
  }
  expect(doubly).toEqual([]);
  return { runs, ids };
}

describe('workers behind a round-robin balancer over two replicas', () => {
  it('one replica stopped with SIGTERM and restarted: every task succeeds, settled once', async () => {
    const { ids } = await runThrough('SIGTERM', 'lb-term');
    expect(ids.length).toBe(300);
  }, 240_000);

  it('one replica SIGKILLed with parked polls and leased tasks: the SDK goes on via the other', async () => {
    const { ids } = await runThrough('SIGKILL', 'lb-kill');
    expect(ids.length).toBe(300);
  }, 240_000);
});
