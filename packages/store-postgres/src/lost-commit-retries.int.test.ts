/**
 * "Committed, reply lost" for every store transaction the failpoint suite reaches
 * only with failpoints ARMED. Arming a failpoint changes the path under test: `transact` then
 * sends COMMIT as a step of its own instead of pipelining it behind the writes (`finish`), and
 * submit leaves its one-statement form. Production runs the pipelined path. Here a TCP proxy
 * drops the first server chunk carrying the COMMIT tag (PostgreSQL has committed; the client
 * sees a lost connection), no failpoint armed, and the operation must answer `unavailable`
 * (DESIGN §1.1: never a wrong success, an empty poll or ownership lost), and the retry with the
 * same identity (sequence, operation id, subscription key, generation, report) must converge on
 * what was committed, writing nothing twice (DESIGN §1.3, §5, §8).
 */
import type { Assignment, LeaseOwner, SettleCommand } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore, type PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  claimedTask,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import { type PgProxy, startPgProxy } from './testing/pg-proxy.js';

const CONFIG = lifecycleConfig({
  leaseDurationMs: 2_000,
  cleanupGraceMs: 1_000,
  leaseSafetyMarginMs: 500,
  sessionValidityMs: 60_000,
});

let h: Harness;
/** The harness clock's offset, mirrored for the stores behind the proxy. */
let offset = 0;
const advance = (ms: number) => {
  offset += ms;
  h.advance(ms);
};

beforeAll(async () => {
  h = await harness('lost_commit_retries', CONFIG);
});
afterAll(() => h.close());

/** Runs `body` with a store behind a proxy whose next COMMIT reply is lost once armed. */
async function throughProxy(
  body: (store: PostgresTaskStore, proxy: PgProxy) => Promise<void>,
): Promise<void> {
  const proxy = await startPgProxy(h.db.url);
  const store = createPostgresTaskStore({
    url: proxy.url,
    max: 2,
    config: CONFIG,
    clockOffsetMs: () => offset,
  });
  try {
    await store.now(); // a warm connection; its COMMIT passes (not armed yet)
    let armed = 0;
    const counting = Object.create(proxy) as PgProxy;
    counting.loseReplyCarrying = (tag: string) => {
      armed += 1;
      proxy.loseReplyCarrying(tag);
    };
    await body(store, counting);
    // Every armed COMMIT reply was lost: PostgreSQL committed what the caller never heard of.
    expect(proxy.lostReplies()).toBe(armed);
  } finally {
    await store.close();
    await proxy.close();
  }
}

let n = 0;
/** A task of a queue of its own, claimed (and renewed with dispatch when `dispatch`). */
async function claimed(dispatch = true, input = {}): Promise<Assignment> {
  n += 1;
  const assignment = await claimedTask(h, `lc-${n}`, input);
  if (dispatch) await h.store.renew(renewCommand(assignment.lease.owner, 1, 'dispatch'));
  return assignment;
}

async function reasons(taskId: string): Promise<string[]> {
  return (await h.store.history(SCOPE, taskId, 0)).map((e) => e.event.reason);
}

const count = (all: readonly string[], reason: string) => all.filter((r) => r === reason).length;

describe('a lost COMMIT reply on the production (unarmed) path, then the same request again', () => {
  it('acquire: the poll answers unavailable, its retry (same sequence) replays the one claim', async () => {
    n += 1;
    const queue = `lc-acq-${n}`;
    const { snapshot } = await h.store.submit(submitCommand(`lc-acq-${n}`, { queue }));
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const poll = acquireCommand(session.id, 0, 1, queue);
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.acquire(poll, { recordEmpty: true }))).toBe('unavailable');
      expect(proxy.lostReplies()).toBe(1);
      const { reply } = await store.acquire(poll, { recordEmpty: true });
      expect(reply.disposition).toBe('assigned');
      const again = await store.acquire(poll, { recordEmpty: true });
      expect(again.reply).toMatchObject({ disposition: 'assigned' });
      if (reply.disposition === 'assigned' && again.reply.disposition === 'assigned') {
        expect(again.reply.assignment.lease.owner).toEqual(reply.assignment.lease.owner);
      }
    });
    const history = await reasons(snapshot.task_id);
    expect(count(history, 'claimed'), history.join(', ')).toBe(1);
  });

  it('renew (dispatch): unavailable, then the same sequence answers dispatch granted; one grant counted', async () => {
    const a = await claimed(false);
    const owner = a.lease.owner;
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.renew(renewCommand(owner, 1, 'dispatch')))).toBe(
        'unavailable',
      );
      const retried = await store.renew(renewCommand(owner, 1, 'dispatch'));
      expect(retried).toMatchObject({ renew_sequence: 1, dispatch_allowed: true });
    });
    const history = await reasons(owner.task_id);
    expect(count(history, 'dispatch_authorized')).toBe(1);
    const [row] = await h.sql`select dispatch_count from tasks where task_id = ${owner.task_id}`;
    expect(Number(row?.dispatch_count)).toBe(1);
  });

  it('settle of a failure that schedules a retry: unavailable, then a replay; one retry scheduled', async () => {
    const a = await claimed(true, { retry: { max_attempts: 3, delay_ms: 0 } });
    const command = failureCommand(a, 'lc-fail');
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.settle(command))).toBe('unavailable');
      const retried = await store.settle(command);
      expect(retried).toMatchObject({ already_accepted: true, task_state: 'queued' });
    });
    const history = await reasons(a.lease.owner.task_id);
    expect(count(history, 'report_accepted')).toBe(1);
    expect(count(history, 'retry_scheduled')).toBe(1);
  });

  it('confirm quiescence: unavailable, then the confirmation again answers the applied state; confirmed once', async () => {
    const a = await claimed();
    const owner = a.lease.owner;
    await h.store.settle(successCommand(a, 'lc-held', { ok: 1 }, 'unconfirmed'));
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.confirmQuiescence(owner))).toBe('unavailable');
      expect(await store.confirmQuiescence(owner)).toBe('succeeded');
    });
    const history = await reasons(owner.task_id);
    expect(count(history, 'cleanup_confirmed')).toBe(1);
    expect(count(history, 'succeeded')).toBe(1);
  });

  it('cancel of a running task: unavailable, then the cancel again answers active; requested once', async () => {
    const a = await claimed();
    const taskId = a.lease.owner.task_id;
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.cancel(SCOPE, taskId))).toBe('unavailable');
      expect(await store.cancel(SCOPE, taskId)).toBe('active');
    });
    const history = await reasons(taskId);
    expect(count(history, 'cancel_requested')).toBe(1);
    expect((await h.store.renew(renewCommand(a.lease.owner, 2))).cancel_requested).toBe(true);
  });

  it('hand-back of an undelivered claim: the item is unavailable, the hand-back again replays; the slot of its concurrency key is given back once', async () => {
    const a = await claimed(false, { concurrency_key: 'lc-key', concurrency_limit: 1 });
    const owner: LeaseOwner = a.lease.owner;
    const handBack: SettleCommand = {
      owner,
      operation_id: `undelivered:${owner.attempt_id}`,
      report: { kind: 'failed', report: { kind: 'rejected', message: 'gone', retryable: true } },
      quiescence: 'confirmed',
      processing_trace: null,
    };
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      const [first] = await store.handBackBatch([handBack]);
      expect(first?.ok === false && first.error.code).toBe('unavailable');
      const [again] = await store.handBackBatch([handBack]);
      expect(again?.ok && again.value).toMatchObject({
        already_accepted: true,
        task_state: 'queued',
      });
    });
    const history = await reasons(owner.task_id);
    expect(count(history, 'report_accepted')).toBe(1);
    expect(count(history, 'retry_scheduled')).toBe(1);
    const [key] = await h.sql`
      select active from concurrency_keys
      where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and concurrency_key = 'lc-key'`;
    expect(Number(key?.active ?? 0)).toBe(0);
    const [task] = await h.sql`
      select state, dispatch_count from tasks where task_id = ${owner.task_id}`;
    expect(task).toMatchObject({ state: 'queued' });
    expect(Number(task?.dispatch_count)).toBe(0);
  });

  it('recovery: the pass fails unavailable, the next pass recovers nothing more; one lease_expired', async () => {
    const a = await claimed(false, { retry: { max_attempts: 2, delay_ms: 0 } });
    advance(CONFIG.leaseDurationMs + 1_000);
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.recoverExpiredLeases())).toBe('unavailable');
      const next = await store.recoverExpiredLeases();
      expect(next.scanned).toBe(0);
    });
    const history = await reasons(a.lease.owner.task_id);
    expect(count(history, 'lease_expired')).toBe(1);
  });

  it('subscribe and redeliver: unavailable, then the same key / generation find the one subscription and the one new generation', async () => {
    n += 1;
    const { snapshot } = await h.store.submit(submitCommand(`lc-sub-${n}`, { queue: 'sub' }));
    await h.store.cancel(SCOPE, snapshot.task_id);
    const command = { subscription_key: 'once', destination: 'billing' };
    let subscriptionId = '';
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.subscribe(SCOPE, snapshot.task_id, command))).toBe(
        'unavailable',
      );
      const again = await store.subscribe(SCOPE, snapshot.task_id, command);
      expect(again.created).toBe(false);
      subscriptionId = again.subscription.id;
    });
    // Deliver generation 1, then redeliver it through a lost COMMIT.
    const [lease] = (await h.store.leaseDeliveries(100, 60_000)).filter(
      (l) => l.subscription_id === subscriptionId,
    );
    if (lease === undefined) throw new Error('not leased');
    const report = {
      scope: SCOPE,
      subscription_id: subscriptionId,
      generation: 1,
      attempt: lease.attempt,
      next: { state: 'delivered' as const },
      status_code: 204,
    };
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.reportDelivery(report))).toBe('unavailable');
      // The sender's retry within its lease: the first copy committed, the second is stale.
      expect(await store.reportDelivery(report)).toBe(false);
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.redeliver(SCOPE, subscriptionId, { generation: 1 }))).toBe(
        'unavailable',
      );
      const again = await store.redeliver(SCOPE, subscriptionId, { generation: 1 });
      expect(again).toMatchObject({ generation: 2, state: 'due', attempts: 0 });
    });
    const rows = await h.store.listSubscriptions(SCOPE, snapshot.task_id);
    expect(rows.map((r) => [r.id, r.generation, r.state])).toEqual([[subscriptionId, 2, 'due']]);
  });

  it('session extend and retention policy: unavailable, then the same request again answers as the first would have', async () => {
    const session = await h.store.openSession({ scope: SCOPE, queue: 'ext', concurrency: 1 });
    const scope = { tenant_id: SCOPE.tenant_id, namespace: 'lc-retention' };
    await throughProxy(async (store, proxy) => {
      proxy.loseReplyCarrying('COMMIT');
      expect(await outcomeCode(store.extendSession(SCOPE, session.id))).toBe('unavailable');
      const extended = await store.extendSession(SCOPE, session.id);
      expect(extended.id).toBe(session.id);
      expect(extended.expires_at).toBeGreaterThanOrEqual(session.expires_at);
      proxy.loseReplyCarrying('COMMIT');
      const policy = { retention_ms: 2 * 3_600_000 };
      expect(await outcomeCode(store.setRetentionPolicy(scope, policy))).toBe('unavailable');
      expect(await store.setRetentionPolicy(scope, policy)).toMatchObject({
        retention_ms: policy.retention_ms,
        source: 'namespace',
      });
    });
    const [rows] = await h.sql`
      select count(*)::int as n from worker_sessions where session_id = ${session.id}`;
    expect(rows?.n).toBe(1);
  });
});
