/**
 * An upgrade from rows the 0000-era code wrote (06b2d23, the last commit before migration 0001):
 * tasks in every state — queued, retrying, active with dispatch, active with a cancel requested,
 * active with an unconfirmed settlement, succeeded, failed, cancelled, one ended 10 days ago —
 * with their attempts, history, payloads, cursors, sessions and a concurrency key
 * (testdata/upgrade/README.md). README "Upgrading" promises that every task, lease and
 * idempotency key carries on; migrate.int.test.ts checks the schema, this the rows.
 *
 * Migrated to 0000, the old rows loaded, migrated to current, then driven through the current
 * store with its clock at the dump's store time.
 */

import type { LeaseOwner, Scope } from '@ledgence/contracts';
import type postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  failureCommand,
  outcomeCode,
  renewCommand,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import {
  type OlderDump,
  readOlderDump,
  type Upgraded,
  upgradedFrom,
} from './testdata/upgrade/older.js';

const SCOPE: Scope = { tenant_id: 'acme', namespace: 'prod' };

/** A lease the old store granted: the owner to renew and settle with, and its slot. */
interface OldLease {
  owner: LeaseOwner;
  consumer: number;
}

const FIXTURE = readOlderDump<
  OlderDump & { session: string; ids: Record<string, string>; owners: Record<string, OldLease> }
>('from-0000.json');

const ids = FIXTURE.ids as Record<string, string>;
let upgraded: Upgraded;
let store: PostgresTaskStore;
let sql: postgres.Sql;

beforeAll(async () => {
  upgraded = await upgradedFrom('upgrade_from_0000', 1, FIXTURE);
  ({ store, sql } = upgraded);
  expect(upgraded.migrated).toEqual({
    before: ['0000_init'],
    upgrade: ['0001_completion_retention', '0002_submit_digest_optional', '0003_retention_floor'],
  });
});

afterAll(async () => {
  await upgraded?.close();
});

describe('an upgrade from rows written by the 0000-era code (06b2d23)', () => {
  it('reads every task in the state the old code left it, with results and history', async () => {
    const states: Record<string, string> = {};
    for (const [key, id] of Object.entries(ids))
      states[key] = (await store.status(SCOPE, id)).state;
    expect(states).toEqual({
      ancient: 'succeeded',
      succeeded: 'succeeded',
      failed: 'failed',
      retrying: 'queued',
      active: 'active',
      cancel_requested: 'active',
      pending_cleanup: 'active',
      queued: 'queued',
      cancelled: 'cancelled',
    });
    const result = await store.result(SCOPE, ids.succeeded as string);
    expect(result).toMatchObject({ outcome: { state: 'succeeded', output: { answer: 42 } } });
    for (const id of Object.values(ids)) {
      expect((await store.history(SCOPE, id, 0)).length).toBeGreaterThan(0);
      await store.inspect(SCOPE, id);
    }
    const page = await store.listTasks(SCOPE, { filters: {} });
    expect(page.tasks.length).toBe(Object.keys(ids).length);
  });

  it('replays old submits to the same task, and refuses a different command with the key', async () => {
    const replay = await store.submit(submitCommand('succeeded'));
    expect(replay).toMatchObject({ created: false, snapshot: { task_id: ids.succeeded } });
    const replayQueued = await store.submit(
      submitCommand('queued', { priority: 5, labels: { kind: 'queued' } }),
    );
    expect(replayQueued).toMatchObject({ created: false, snapshot: { task_id: ids.queued } });
    const replayRetry = await store.submit(
      submitCommand('retrying', { retry: { max_attempts: 3, delay_ms: 3_600_000 } } as never),
    );
    expect(replayRetry).toMatchObject({ created: false, snapshot: { task_id: ids.retrying } });
    expect(await outcomeCode(store.submit(submitCommand('queued', { priority: 6 })))).toBe(
      'conflict',
    );
  });

  it('replays an old poll, and lets the held lease renew (replay and next) and settle', async () => {
    const { owner, consumer } = FIXTURE.owners.active as OldLease;
    const polled = await store.acquire(acquireCommand(FIXTURE.session, consumer, 1), {
      recordEmpty: true,
    });
    expect(polled.reply).toMatchObject({
      disposition: 'assigned',
      assignment: { lease: { owner: { attempt_id: owner.attempt_id } } },
    });
    expect(await outcomeCode(store.renew(renewCommand(owner, 1, 'dispatch')))).toBe('ok');
    expect(await outcomeCode(store.renew(renewCommand(owner, 2)))).toBe('ok');
    if (polled.reply.disposition !== 'assigned') throw new Error('the old poll was not replayed');
    const { assignment } = polled.reply;
    await store.settle(successCommand(assignment, 'op-after-upgrade', { upgraded: true }));
    expect(await store.result(SCOPE, ids.active as string)).toMatchObject({
      outcome: { state: 'succeeded', output: { upgraded: true } },
    });
  });

  it('replays an old settlement, confirms an old unconfirmed one, and ends a cancel request', async () => {
    const succeeded = FIXTURE.owners.succeeded as OldLease;
    const oldSettle = successCommand(
      { lease: { owner: succeeded.owner } } as never,
      'op-succeeded',
      {
        answer: 42,
      },
    );
    expect(await outcomeCode(store.settle(oldSettle))).toBe('ok');
    const pending = FIXTURE.owners.pending_cleanup as OldLease;
    expect(await store.confirmQuiescence(pending.owner)).toBe('succeeded');
    expect(await store.result(SCOPE, ids.pending_cleanup as string)).toMatchObject({
      outcome: { output: { later: true } },
    });
    const cancel = FIXTURE.owners.cancel_requested as OldLease;
    await store.settle(failureCommand({ lease: { owner: cancel.owner } } as never, 'op-c', true));
    expect((await store.status(SCOPE, ids.cancel_requested as string)).state).toBe('cancelled');
  });

  it('claims an old queued task with a new session, and subscribes old terminal tasks', async () => {
    const session = await store.openSession({ scope: SCOPE, queue: 'q', concurrency: 1 });
    const polled = await store.acquire(acquireCommand(session.id, 0, 1), { recordEmpty: true });
    expect(polled.reply).toMatchObject({
      disposition: 'assigned',
      assignment: { lease: { owner: { task_id: ids.queued } } },
    });
    const sub = await store.subscribe(SCOPE, ids.failed as string, {
      subscription_key: 'after-upgrade',
      destination: 'billing',
    });
    expect(sub).toMatchObject({ created: true, subscription: { state: 'due' } });
    const leases = await store.leaseDeliveries(10, 30_000);
    expect(leases.map((l) => l.task_id)).toContain(ids.failed);
  });

  it('collects the old task that ended 10 days ago and frees its key; keeps the rest', async () => {
    const progress = await store.collectRetired(SCOPE);
    expect(progress.tasks_removed).toBe(1);
    expect(await outcomeCode(store.status(SCOPE, ids.ancient as string))).toBe('not_found');
    for (const key of ['succeeded', 'failed', 'cancelled']) {
      expect((await store.status(SCOPE, ids[key] as string)).state).not.toBe('queued');
    }
    const again = await store.submit(submitCommand('ancient'));
    expect(again.created).toBe(true);
    const [left] =
      await sql`select count(*)::int as n from task_payloads where task_id = ${ids.ancient as string}`;
    expect(left?.n).toBe(0);
  });
});
