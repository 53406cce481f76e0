/**
 * A task re-queued by lease expiry with a retry delay (DESIGN §5 Lease expiry: "re-queued
 * with the retry delay") is handed to a poll parked before the recovery when it comes due, not at
 * the next rescan (the parked poll learns the due time; nothing NOTIFYs at a due time). The
 * settle-path twin is due-wake.int.test.ts; this covers the recovery path.
 */
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { createTaskService, type TaskService } from '@ledgence/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
let service: TaskService;
/** The poll's wait; the rescan is twice as long, so only a due time can end the park early. */
const WAIT = 5_000;
beforeAll(async () => {
  h = await harness('due_wake_recovery');
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
  service = createTaskService({ store: h.store, wake, rescanIntervalMs: 2 * WAIT });
});
afterAll(async () => {
  await wake.close();
  await h.close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function assignmentOf(reply: AcquireReply | undefined): Assignment {
  if (reply?.disposition !== 'assigned')
    throw new Error(`expected an assignment: ${reply?.disposition}`);
  return reply.assignment;
}

it('a lease-expiry retry delayed 300 ms is handed to a poll parked before the recovery when due, not at the rescan', async () => {
  const queue = 'dwr-dw-lost';
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
  const { snapshot } = await h.store.submit(
    submitCommand('dwr-dw-lost', { queue, retry: { max_attempts: 3, delay_ms: 300 } }),
  );
  const first = assignmentOf(
    (await h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true })).reply,
  );
  await h.store.renew(renewCommand(first.lease.owner, 1, 'dispatch'));
  h.advance(CONFIG.leaseDurationMs + 50);
  const started = performance.now();
  const parked = service.acquire(acquireCommand(session.id, 1, 1, queue), { waitMs: WAIT });
  await sleep(100);
  expect(await h.store.recoverExpiredLeases()).toMatchObject({ recovered: 1, requeued: 1 });
  const { available_at } = await h.store.status(SCOPE, snapshot.task_id);
  const second = assignmentOf(await parked);
  const elapsed = performance.now() - started;
  expect(second.lease.owner.task_id).toBe(snapshot.task_id);
  expect(second.event.ldgattempt).toBe(2);
  const claimed = (await h.store.history(SCOPE, snapshot.task_id, 0)).find(
    (e) => e.event.reason === 'claimed' && e.event.attempt_id === second.lease.owner.attempt_id,
  );
  expect(claimed?.event.at).toBeGreaterThanOrEqual(available_at);
  expect(elapsed).toBeLessThan(WAIT / 2);
});
