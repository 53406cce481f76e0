/**
 * A worker's parked poll gets work when it COMES DUE — a delayed task, a retry's backoff — over
 * the real server and worker SDK. Nothing NOTIFYs at a due time (DESIGN §5: a wake is only a
 * hint, the rescan decides), so the server learns its queue's next due time from the empty probe
 * and looks again then. The server's rescan here is longer than a poll's wait: without the due
 * time, the task would reach the worker only when the poll's wait ends. Store-level detail:
 * packages/store-postgres/src/due-wake.int.test.ts.
 */
import type { RecordedHistoryEvent } from '@ledgence/contracts';
import { expect, it } from 'vitest';
import { client, historyOf, settled, sleep, workerSuite } from './test/harness.js';

/** The server's long-poll maximum, which the workers ask for; the rescan is far past it. */
const WAIT_MS = 10_000;
const suite = workerSuite('due_wake_e2e', {
  LEDGENCE_RESCAN_INTERVAL_MS: '60000',
  LEDGENCE_LONG_POLL_WAIT_MS: String(WAIT_MS),
});

/** A one-slot worker on `queue` whose polls park for the whole wait, running `handler`. */
function parkedWorker(queue: string, handler: () => Promise<unknown>) {
  const worker = suite.worker(queue, { pollWaitMs: WAIT_MS });
  worker.register('due', handler);
  return { worker, running: worker.run() };
}

/** Store times of a task's claims, in order. */
function claims(events: RecordedHistoryEvent[]): number[] {
  return events.filter((e) => e.event.reason === 'claimed').map((e) => e.event.at);
}

/**
 * Claimed once due (store time), and well before the parked poll's wait ended: its final probe
 * would have found the task only then, `WAIT_MS` after the poll started.
 */
function expectClaimedWhenDue(claimedAt: number, dueAt: number, what: string): void {
  console.log(`[due-wake e2e] ${what}: claimed ${claimedAt - dueAt} ms after it came due`);
  expect(claimedAt).toBeGreaterThanOrEqual(dueAt);
  expect(claimedAt - dueAt).toBeLessThan(WAIT_MS / 2);
}

it('a task delayed 300 ms reaches the worker whose poll is parked when it comes due', async () => {
  const queue = 'due-delay';
  const c = client(suite.server.url);
  const { worker, running } = parkedWorker(queue, async () => ({ ok: true }));
  // The worker's first poll parks on the idle queue.
  await sleep(300);
  const task = await c.submit({ queue, program: 'due', data: null, delay_ms: 300 });
  const [result] = await settled(c, [task.task_id]);
  expect(result?.outcome.state).toBe('succeeded');
  const [claimed] = claims(await historyOf(c, task.task_id));
  expectClaimedWhenDue(claimed ?? Number.NaN, task.available_at, 'delay_ms 300');
  await worker.stop();
  await running;
});

it("a retry's fixed 200 ms delay is ~200 ms, not the poll's wait", async () => {
  const queue = 'due-retry';
  const c = client(suite.server.url);
  let calls = 0;
  const { worker, running } = parkedWorker(queue, async () => {
    calls += 1;
    if (calls === 1) throw new Error('the first attempt fails');
    return { ok: true };
  });
  const task = await c.submit({
    queue,
    program: 'due',
    data: null,
    retry: { max_attempts: 2, delay_ms: 200, backoff: 'fixed' },
  });
  const [result] = await settled(c, [task.task_id]);
  expect(result?.outcome.state).toBe('succeeded');
  const events = await historyOf(c, task.task_id);
  const scheduled = events.find((e) => e.event.reason === 'retry_scheduled');
  if (scheduled === undefined) throw new Error('no retry was scheduled');
  const [, retried] = claims(events);
  // The retry is available delay_ms after the failure's settlement, at store time.
  expectClaimedWhenDue(retried ?? Number.NaN, scheduled.event.at + 200, 'retry delay_ms 200');
  await worker.stop();
  await running;
});
