/**
 * An upgrade across 0002 and 0003 from rows the 0001-era code wrote (ddb7654, the last commit
 * before migration 0002): a retention policy without a retiring floor, and completion
 * subscriptions in every delivery state — waiting on an active task, due, delivering (a sender's
 * lease in flight), delivered, and two tasks that ended 10 days ago (one delivered then, one with
 * its delivery still in flight) (testdata/upgrade/README.md).
 */

import type { Assignment, Scope } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import { outcomeCode, submitCommand, successCommand } from './testdata/fixtures.js';
import {
  type OlderDump,
  readOlderDump,
  type Upgraded,
  upgradedFrom,
} from './testdata/upgrade/older.js';

const SCOPE: Scope = { tenant_id: 'acme', namespace: 'prod' };

const FIXTURE = readOlderDump<
  OlderDump & {
    ids: Record<string, string>;
    subscriptions: Record<
      string,
      { id: string; state: string; generation: number; event_id: string }[]
    >;
    /** The sender's lease the old code left outstanding. */
    delivering_lease: { subscription_id: string; generation: number; attempt: number };
    /** The assignment of the task a subscription waits on, to settle it with. */
    waiting_assignment: Assignment;
  }
>('from-0001.json');

const ids = FIXTURE.ids;
const subs = FIXTURE.subscriptions;
let upgraded: Upgraded;
let store: PostgresTaskStore;

beforeAll(async () => {
  upgraded = await upgradedFrom('upgrade_from_0001', 2, FIXTURE);
  ({ store } = upgraded);
  expect(upgraded.migrated).toEqual({
    before: ['0000_init', '0001_completion_retention'],
    upgrade: ['0002_submit_digest_optional', '0003_retention_floor'],
  });
});

afterAll(async () => {
  await upgraded?.close();
});

describe('an upgrade from rows written by the 0001-era code (ddb7654)', () => {
  it('lists every old subscription as the old code left it', async () => {
    for (const [key, id] of Object.entries(ids)) {
      const listed = (await store.listSubscriptions(SCOPE, id)).map((s) => ({
        id: s.id,
        state: s.state,
        generation: s.generation,
      }));
      expect(listed, key).toEqual(
        (subs[key] ?? []).map(({ id: sid, state, generation }) => ({ id: sid, state, generation })),
      );
    }
  });

  it('accepts the in-flight sender lease report, and redelivers an old delivered one', async () => {
    const lease = FIXTURE.delivering_lease;
    expect(
      await store.reportDelivery({
        scope: SCOPE,
        subscription_id: lease.subscription_id,
        generation: lease.generation,
        attempt: lease.attempt,
        next: { state: 'delivered' },
        status_code: 200,
      }),
    ).toBe(true);
    const [delivered] = subs.delivered ?? [];
    const again = await store.redeliver(SCOPE, delivered?.id as string, { generation: 1 });
    expect(again).toMatchObject({ state: 'due', generation: 2 });
  });

  it('releases the waiting subscription when its old active task settles, with the old event id', async () => {
    await store.settle(successCommand(FIXTURE.waiting_assignment, 'op-waiting-after'));
    const leases = await store.leaseDeliveries(10, 30_000);
    const byTask = new Map(leases.map((l) => [l.task_id, l]));
    const [waiting] = subs.waiting ?? [];
    expect(byTask.get(ids.waiting as string)?.event_id).toBe(waiting?.event_id);
    const [due] = subs.due ?? [];
    expect(byTask.get(ids.due as string)?.event_id).toBe(due?.event_id);
  });

  it('collects under the old policy (no retiring floor): the delivered ancient task only', async () => {
    const preview = await store.previewRetention(SCOPE);
    expect(preview.retention_ms).toBe(2 * 3_600_000);
    const progress = await store.collectRetired(SCOPE);
    expect(progress.tasks_removed).toBe(1);
    expect(await outcomeCode(store.status(SCOPE, ids.ancient_delivered as string))).toBe(
      'not_found',
    );
    expect(await outcomeCode(store.status(SCOPE, ids.ancient_due as string))).toBe('ok');
    // The old policy can be set again (the floor column appears), and the key of the gone task is free.
    await store.setRetentionPolicy(SCOPE, { retention_ms: 3 * 3_600_000 });
    expect(
      (await store.submit(submitCommand('ancient_delivered', { queue: 'ancient_delivered' })))
        .created,
    ).toBe(true);
  });
});
