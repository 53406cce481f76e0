import {
  type AcquireReply,
  type Assignment,
  COMPLETION_MAX_ATTEMPTS,
  ContractError,
  MAX_COMPLETION_BATCH,
  MAX_RECOVERY_BATCH,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
  MIN_RETENTION_MS,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { DEFAULT_LIFECYCLE_CONFIG } from '../config.js';
import {
  type CompletionConformanceHarness,
  runCompletionStoreConformance,
  runRetentionStoreConformance,
} from './completion-conformance.js';
import { expectContractError, runTaskStoreConformance } from './conformance.js';
import {
  acquireCommand,
  freshScope,
  openSessionCommand,
  renewCommand,
  settleSuccess,
  submitCommand,
} from './fixtures.js';
import { createMemoryTaskStore, type MemoryTaskStoreOptions } from './memory-store.js';

/** 2026-11-29T00:00:00Z: a frozen store clock makes every timestamp exact. */
const EPOCH = Date.UTC(2026, 10, 29);

function harnessOf(options: MemoryTaskStoreOptions): () => Promise<CompletionConformanceHarness> {
  return async () => {
    const store = createMemoryTaskStore(options);
    return {
      store,
      config: store.config,
      advance: async (ms) => store.advance(ms),
      close: async () => {},
    };
  };
}

// Frozen: time moves only by advance(), the strictest setting for exact checks.
runTaskStoreConformance('memory store (frozen clock)', harnessOf({ now: () => EPOCH }));
// Running: the default clock keeps moving between calls, as PostgreSQL's does,
// which proves the suite does not assume time stands still.
runTaskStoreConformance('memory store (running clock)', harnessOf({}));
// Short leases and grace, as integration tests configure them.
runTaskStoreConformance(
  'memory store (short leases)',
  harnessOf({
    now: () => EPOCH,
    config: { leaseDurationMs: 1_000, cleanupGraceMs: 500, leaseSafetyMarginMs: 200 },
  }),
);
// A lease longer than a short attempt's whole authority, so claims and
// renewals hit the authority-deadline cap.
runTaskStoreConformance(
  'memory store (lease beyond authority)',
  harnessOf({ config: { leaseDurationMs: 60_000, cleanupGraceMs: 2_000 } }),
);

// The completion and retention suites, on a frozen and on a running clock,
// with short leases and the shortest retention the contract allows.
for (const [clock, now] of [
  ['frozen clock', () => EPOCH],
  ['running clock', undefined],
] as const) {
  const options: MemoryTaskStoreOptions = {
    ...(now === undefined ? {} : { now }),
    config: {
      leaseDurationMs: 1_000,
      cleanupGraceMs: 500,
      leaseSafetyMarginMs: 200,
      sessionValidityMs: 5_000,
      terminalRetentionMs: MIN_RETENTION_MS,
    },
  };
  runCompletionStoreConformance(`memory completion store (${clock})`, harnessOf(options));
  runRetentionStoreConformance(`memory retention store (${clock})`, harnessOf(options));
}

function assignmentOf(reply: AcquireReply): Assignment {
  if (reply.disposition !== 'assigned')
    throw new Error(`expected assigned, got ${reply.disposition}`);
  return reply.assignment;
}

/** A store on a frozen clock with one task claimed by slot 0 of a one-slot session. */
async function claimedStore(
  options: MemoryTaskStoreOptions,
  overrides: Parameters<typeof submitCommand>[1] = {},
) {
  const store = createMemoryTaskStore({ now: () => EPOCH, ...options });
  const scope = freshScope();
  const { snapshot } = await store.submit(submitCommand(scope, overrides));
  const session = await store.openSession(openSessionCommand(scope, { concurrency: 1 }));
  const { reply } = await store.acquire(acquireCommand(session, 0, 1), { recordEmpty: true });
  return { store, scope, task: snapshot, session, assignment: assignmentOf(reply) };
}

describe('createMemoryTaskStore', () => {
  it('uses the contract defaults unless configured', () => {
    expect(createMemoryTaskStore().config).toEqual(DEFAULT_LIFECYCLE_CONFIG);
    expect(createMemoryTaskStore({ config: { leaseDurationMs: 5 } }).config).toEqual({
      ...DEFAULT_LIFECYCLE_CONFIG,
      leaseDurationMs: 5,
    });
  });

  it('reads the given clock and advance() moves it forward', async () => {
    let now = EPOCH;
    const store = createMemoryTaskStore({ now: () => now });
    expect(await store.now()).toBe(EPOCH);
    store.advance(1_500);
    expect(await store.now()).toBe(EPOCH + 1_500);
    now += 10;
    expect(await store.now()).toBe(EPOCH + 1_510);
    expect(() => store.advance(-1)).toThrow(RangeError);
    expect(() => store.advance(Number.NaN)).toThrow(RangeError);
  });

  it('advance() also moves the default clock', async () => {
    const store = createMemoryTaskStore();
    const before = await store.now();
    store.advance(3_600_000);
    expect(await store.now()).toBeGreaterThanOrEqual(before + 3_600_000);
  });

  it('issues ids with the core prefixes', async () => {
    const { session, task, assignment } = await claimedStore({});
    expect(task.task_id).toMatch(/^tsk_[0-9a-f]{32}$/);
    expect(task.run_id).toMatch(/^run_[0-9a-f]{32}$/);
    expect(session.id).toMatch(/^ses_[0-9a-f]{32}$/);
    expect(assignment.event.id).toMatch(/^att_[0-9a-f]{32}$/);
    expect(assignment.lease.owner.lease_id).toMatch(/^lse_[0-9a-f]{32}$/);
  });

  it('replies with copies: mutating a reply or a sent command changes nothing stored', async () => {
    const store = createMemoryTaskStore({ now: () => EPOCH });
    const scope = freshScope();
    const command = submitCommand(scope, { data: { n: 1 }, labels: { a: 'b' } });
    const { snapshot } = await store.submit(command);
    (command.input.data as { n: number }).n = 2;
    snapshot.state = 'failed';
    const status = await store.status(scope, snapshot.task_id);
    if (status.labels !== undefined) status.labels.a = 'changed';
    const stored = await store.inspect(scope, snapshot.task_id);
    expect(stored.input.data).toEqual({ n: 1 });
    expect(stored.state).toBe('queued');
    expect((await store.status(scope, snapshot.task_id)).labels).toEqual({ a: 'b' });
  });

  it('grants dispatch with more than the safety margin left, and refuses it at exactly the margin', async () => {
    const config = { leaseSafetyMarginMs: 5_000 };
    const granted = await claimedStore({ config }, { timeout_ms: 10_000 });
    granted.store.advance(4_999);
    const yes = await granted.store.renew(renewCommand(granted.assignment, 1, 'dispatch'));
    expect(yes.execution_remaining_ms).toBe(5_001);
    expect(yes.dispatch_allowed).toBe(true);

    const refused = await claimedStore({ config }, { timeout_ms: 10_000 });
    refused.store.advance(5_000);
    const no = await refused.store.renew(renewCommand(refused.assignment, 1, 'dispatch'));
    expect(no.execution_remaining_ms).toBe(5_000);
    expect(no.dispatch_allowed).toBe(false);
  });

  it('caps a claimed lease at the authority deadline', async () => {
    const { assignment } = await claimedStore(
      { config: { leaseDurationMs: 30_000, cleanupGraceMs: 1_000 } },
      { timeout_ms: 6_000 },
    );
    expect(assignment.attempt_deadline).toBe(EPOCH + 6_000);
    expect(assignment.lease.expires_at).toBe(EPOCH + 7_000);
    expect(assignment.authority.remaining_ms).toBe(7_000);
  });

  it('a lease expires exactly at expires_at', async () => {
    const { store, assignment } = await claimedStore({ config: { leaseDurationMs: 1_000 } });
    store.advance(999);
    expect((await store.renew(renewCommand(assignment, 1))).expires_at).toBe(EPOCH + 1_999);
    store.advance(1_000);
    await expectContractError(store.renew(renewCommand(assignment, 2)), 'ownership_lost');
  });

  it('counts concurrency keys across the queues of a scope', async () => {
    const store = createMemoryTaskStore({ now: () => EPOCH });
    const scope = freshScope();
    await store.submit(submitCommand(scope, { queue: 'q1', concurrency_key: 'k' }));
    await store.submit(submitCommand(scope, { queue: 'q2', concurrency_key: 'k' }));
    // Another scope's key of the same name is another key.
    const other = freshScope();
    await store.submit(submitCommand(other, { queue: 'q2', concurrency_key: 'k' }));
    const s1 = await store.openSession(openSessionCommand(scope, { queue: 'q1' }));
    const s2 = await store.openSession(openSessionCommand(scope, { queue: 'q2' }));
    const so = await store.openSession(openSessionCommand(other, { queue: 'q2' }));
    const poll = async (session: typeof s1) =>
      (await store.acquire(acquireCommand(session, 0, 1), { recordEmpty: true })).reply.disposition;
    expect(await poll(s1)).toBe('assigned');
    expect(await poll(s2)).toBe('empty');
    expect(await poll(so)).toBe('assigned');
  });

  it('recovery: has_more is exact, limits clamp to MAX_RECOVERY_BATCH, and bad limits are rejected', async () => {
    const store = createMemoryTaskStore({ now: () => EPOCH, config: { leaseDurationMs: 1_000 } });
    const scope = freshScope();
    const session = await store.openSession(openSessionCommand(scope, { concurrency: 3 }));
    for (let consumer = 0; consumer < 3; consumer += 1) {
      await store.submit(submitCommand(scope));
      await store.acquire(acquireCommand(session, consumer, 1), { recordEmpty: true });
    }
    store.advance(1_000);
    const first = await store.recoverExpiredLeases(2);
    expect(first).toEqual({
      scanned: 2,
      recovered: 2,
      requeued: 2,
      failed: 0,
      cancelled: 0,
      finalized: 0,
      has_more: true,
    });
    const second = await store.recoverExpiredLeases(MAX_RECOVERY_BATCH * 10);
    expect(second).toMatchObject({ scanned: 1, recovered: 1, has_more: false });
    expect(await store.recoverExpiredLeases()).toMatchObject({ scanned: 0, has_more: false });
    for (const bad of [0, -1, 1.5]) {
      await expectContractError(store.recoverExpiredLeases(bad), 'invalid_input');
    }
  });

  it('recovery finalises an unconfirmed settlement without counting it as recovered', async () => {
    const { store, scope, task, assignment } = await claimedStore({
      config: { leaseDurationMs: 1_000 },
    });
    await store.settle(settleSuccess(assignment, 'x', { quiescence: 'unconfirmed' }));
    const held = await store.inspectAttempt(scope, task.task_id, assignment.event.id);
    store.advance(held.authority_deadline - (await store.now()));
    const progress = await store.recoverExpiredLeases();
    expect(progress).toMatchObject({ scanned: 1, recovered: 0 });
    expect((await store.status(scope, task.task_id)).state).toBe('succeeded');
  });

  it('a batch surfaces a non-contract failure instead of answering it as an item', async () => {
    const store = createMemoryTaskStore({ now: () => EPOCH });
    const broken = { idempotency_key: 'k', input: null } as unknown as Parameters<
      typeof store.submit
    >[0];
    await expect(store.submitBatch([broken])).rejects.not.toBeInstanceOf(ContractError);
  });
});

describe('createMemoryTaskStore: completions and retention', () => {
  /** A store on a frozen clock with a cancelled task in a fresh scope. */
  async function terminalStore() {
    const store = createMemoryTaskStore({ now: () => EPOCH });
    const scope = freshScope();
    const { snapshot } = await store.submit(submitCommand(scope));
    await store.cancel(scope, snapshot.task_id);
    const subscribe = (key: string) =>
      store.subscribe(scope, snapshot.task_id, { subscription_key: key, destination: 'billing' });
    return { store, scope, taskId: snapshot.task_id, subscribe };
  }

  it('leases the longest-due delivery first, then by subscription id', async () => {
    const { store, subscribe } = await terminalStore();
    const older = await subscribe('a');
    store.advance(1);
    await subscribe('b');
    const [first] = await store.leaseDeliveries(1, 1_000);
    expect(first?.subscription_id).toBe(older.subscription.id);
    // Same due time: the smaller id first.
    const { store: tied, subscribe: subscribeTied } = await terminalStore();
    const ids = [
      (await subscribeTied('a')).subscription.id,
      (await subscribeTied('b')).subscription.id,
    ];
    const leases = await tied.leaseDeliveries(2, 1_000);
    expect(leases.map((lease) => lease.subscription_id)).toEqual([...ids].sort());
  });

  it('a delivery exhausted by its lease is not returned but uses up its place in the batch', async () => {
    const { store, scope, taskId, subscribe } = await terminalStore();
    const stuck = await subscribe('stuck');
    for (let attempt = 1; attempt <= COMPLETION_MAX_ATTEMPTS; attempt += 1) {
      expect(await store.leaseDeliveries(1, 1_000)).toHaveLength(1);
      store.advance(1_000);
    }
    // Due strictly after the stuck lease ran out: ids of one millisecond tie randomly.
    store.advance(1);
    await subscribe('fresh');
    expect(await store.leaseDeliveries(1, 1_000)).toEqual([]);
    const [exhausted] = await store.listSubscriptions(scope, taskId);
    expect(exhausted).toMatchObject({ id: stuck.subscription.id, state: 'exhausted' });
    expect(await store.leaseDeliveries(1, 1_000)).toHaveLength(1);
  });

  it('replies with copies of subscriptions', async () => {
    const { store, scope, taskId, subscribe } = await terminalStore();
    const { subscription } = await subscribe('k');
    subscription.state = 'delivered';
    const [listed] = await store.listSubscriptions(scope, taskId);
    expect(listed?.state).toBe('due');
  });

  it('rejects out-of-range limits, lease lengths and retention lengths as invalid_input', async () => {
    const { store, scope } = await terminalStore();
    for (const bad of [0, -1, 1.5, MAX_COMPLETION_BATCH + 1]) {
      await expectContractError(store.leaseDeliveries(bad, 1_000), 'invalid_input');
    }
    await expectContractError(store.leaseDeliveries(1, 0), 'invalid_input');
    await expectContractError(store.dueBacklog(0), 'invalid_input');
    for (const bad of [0, MAX_RETENTION_BATCH + 1]) {
      await expectContractError(store.previewRetention(scope, bad), 'invalid_input');
      await expectContractError(store.collectRetired(scope, bad), 'invalid_input');
      await expectContractError(store.retentionScopes(undefined, bad), 'invalid_input');
    }
    for (const retention_ms of [MIN_RETENTION_MS - 1, MAX_RETENTION_MS + 1]) {
      await expectContractError(store.setRetentionPolicy(scope, { retention_ms }), 'invalid_input');
    }
    expect((await store.retentionPolicy(scope)).source).toBe('default');
  });

  it('collection forgets a removed task’s idempotency key, so the key submits anew', async () => {
    const store = createMemoryTaskStore({ now: () => EPOCH });
    const scope = freshScope();
    const command = submitCommand(scope);
    const { snapshot } = await store.submit(command);
    await store.cancel(scope, snapshot.task_id);
    store.advance(store.config.terminalRetentionMs + 1);
    expect((await store.collectRetired(scope)).tasks_removed).toBe(1);
    const again = await store.submit(command);
    expect(again.created).toBe(true);
    expect(again.snapshot.task_id).not.toBe(snapshot.task_id);
  });
});
