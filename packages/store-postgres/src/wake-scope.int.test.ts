/**
 * Tenant and namespace scoping of wake hints: a hint of scope A — a queue that gained work,
 * a task that became terminal, a namespace whose concurrency slot was freed — wakes only A's
 * watches, never a watch of the same queue name or task id in another tenant or another
 * namespace (whose names may even be prefixes of A's).
 */
import type { Scope } from '@ledgence/contracts';
import type { WakeTopic } from '@ledgence/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import { createPostgresWakeSource, type PostgresWakeSource } from './wake.js';

let h: Harness;
let wake: PostgresWakeSource;
beforeAll(async () => {
  h = await harness('wakescope');
  wake = createPostgresWakeSource({ url: h.db.url });
  await wake.ready();
});
afterAll(async () => {
  await wake.close();
  await h.close();
});

const A: Scope = SCOPE; // acme / prod
const FOREIGN: Scope[] = [
  { tenant_id: 'beta', namespace: SCOPE.namespace },
  { tenant_id: SCOPE.tenant_id, namespace: 'prod2' },
  // Joined without a separator, 'acm' + 'eprod' would read as 'acme' + 'prod'.
  { tenant_id: 'acm', namespace: 'eprod' },
];
const QUIET_MS = 1_500;

/** Parks on `topic`; resolves with whether a hint (not the timeout) ended the wait. */
async function hinted(topic: WakeTopic, timeoutMs: number): Promise<boolean> {
  const watch = wake.watch(topic);
  const started = performance.now();
  try {
    await watch.next(timeoutMs);
  } finally {
    watch.close();
  }
  return performance.now() - started < timeoutMs - 50;
}

it("a scope's queue, task and namespace hints wake none of another scope's watches", async () => {
  const queue = 'wake-scope';
  const { snapshot } = await h.store.submit(
    submitCommand('ws-1', { queue, concurrency_key: 'wk', concurrency_limit: 1 }),
  );
  const session = await h.store.openSession({ scope: A, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error('expected an assignment');

  // Settling sends a `task` hint (terminal) and a `scope` hint (slot freed); a new submit sends
  // a `queue` hint. Each foreign watch names the same queue or task id in its own scope.
  const mine = [
    hinted({ kind: 'task', scope: A, task_id: snapshot.task_id }, 20_000),
    hinted({ kind: 'queue', scope: A, queue }, 20_000),
  ];
  const foreign = FOREIGN.flatMap((scope) => [
    hinted({ kind: 'task', scope, task_id: snapshot.task_id }, QUIET_MS),
    hinted({ kind: 'queue', scope, queue }, QUIET_MS),
  ]);
  await h.store.settle(successCommand(reply.assignment, 'ws-op'));
  await h.store.submit(submitCommand('ws-2', { queue }));
  expect(await Promise.all(mine)).toEqual([true, true]);
  expect(await Promise.all(foreign)).toEqual(foreign.map(() => false));
});
