/**
 * The order in which queued tasks reach a worker, over the real server and the real
 * worker SDK (DESIGN §4 `priority`, `delay_ms`, `concurrency_key`; §5 Acquire): a one-slot worker
 * runs a backlog by priority then FIFO and a delayed task only once due (store time, read from the
 * task's history); a two-slot worker keeps taking tasks of other keys while one key's backlog
 * waits, and never runs two tasks of a limit-1 key at once. Store-level detail:
 * packages/store-postgres/src/ordering.int.test.ts.
 */
import type { TaskSnapshot } from '@ledgence/contracts';
import { expect, it } from 'vitest';
import { client, historyOf, idsOf, settled, sleep, workerSuite } from './test/harness.js';

const suite = workerSuite('ordering_e2e');

/** The store time of a task's first claim. */
async function firstClaim(taskId: string): Promise<number> {
  const events = await historyOf(client(suite.server.url), taskId);
  const claimed = events.find((e) => e.event.reason === 'claimed');
  if (claimed === undefined) throw new Error(`task ${taskId} was never claimed`);
  return claimed.event.at;
}

it('a one-slot worker runs a backlog by priority, FIFO within a priority, and a delayed task only once due', async () => {
  const queue = 'rev-e2e-order';
  const c = client(suite.server.url);
  const plan = [
    { name: 'a', priority: 0 },
    { name: 'b', priority: 5 },
    { name: 'c', priority: -5 },
    { name: 'd', priority: 5 },
    { name: 'e', priority: 0 },
  ];
  const ready = idsOf(
    await c.submitBatch(
      plan.map(({ name, priority }) => ({ queue, program: 'rec', data: { name }, priority })),
    ),
  );
  const delayed = (await c.submit({
    queue,
    program: 'rec',
    data: { name: 'later' },
    priority: 100,
    delay_ms: 1_500,
  })) as TaskSnapshot;
  const ran: string[] = [];
  const worker = suite.worker(queue).register('rec', (data) => {
    ran.push((data as { name: string }).name);
    return null;
  });
  void worker.run();
  await settled(c, [...ready, delayed.task_id]);
  // The ready tasks, whenever the delayed one came due among them, kept their order.
  expect(ran.filter((name) => name !== 'later')).toEqual(['b', 'd', 'a', 'e', 'c']);
  expect(await firstClaim(delayed.task_id)).toBeGreaterThanOrEqual(delayed.available_at);
});

it('a two-slot worker keeps running unkeyed tasks while a limit-1 key’s backlog waits, and never runs two of that key at once', async () => {
  const queue = 'rev-e2e-keys';
  const c = client(suite.server.url);
  const keyed = idsOf(
    await c.submitBatch(
      Array.from({ length: 8 }, (_, i) => ({
        queue,
        program: 'keyed',
        data: { i },
        priority: 10,
        concurrency_key: 'rev-e2e-hot',
      })),
    ),
  );
  const plain = idsOf(
    await c.submitBatch(
      Array.from({ length: 3 }, (_, i) => ({ queue, program: 'plain', data: { i } })),
    ),
  );
  let running = 0;
  let most = 0;
  const keyedStarts: number[] = [];
  const plainEnds: number[] = [];
  const worker = suite
    .worker(queue, { concurrency: 2 })
    .register('keyed', async () => {
      running += 1;
      most = Math.max(most, running);
      keyedStarts.push(performance.now());
      await sleep(200);
      running -= 1;
      return null;
    })
    .register('plain', () => {
      plainEnds.push(performance.now());
      return null;
    });
  void worker.run();
  await settled(c, [...keyed, ...plain]);
  expect(most).toBe(1);
  // Eight keyed tasks of 200 ms each run one after another; the unkeyed ones, ranked below them
  // all, are not held back behind the key's backlog: all three ran before its last task began.
  expect(Math.max(...plainEnds)).toBeLessThan(Math.max(...keyedStarts));
});
