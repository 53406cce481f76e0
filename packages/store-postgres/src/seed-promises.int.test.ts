/**
 * Seed promises (seeds/000 delivery.rs and seeds/001 crate index) held against the PostgreSQL
 * store, where no other suite pins them down. Each test names the seed sentence it holds
 * the store to.
 */
import {
  type Assignment,
  MAX_RECOVERY_BATCH,
  MIN_RETENTION_MS,
  type Scope,
  type SettleCommand,
} from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  CONFIG,
  failureCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('seed_promises');
});
afterAll(() => h.close());

let n = 0;
function scope(): Scope {
  n += 1;
  return { tenant_id: `seedrev${n}`, namespace: 'prod' };
}

async function claimIn(s: Scope, queue = 'q'): Promise<{ taskId: string; a: Assignment }> {
  const { snapshot } = await h.store.submit(
    submitCommand(`k-${queue}-${Math.random()}`, {
      tenant_id: s.tenant_id,
      namespace: s.namespace,
      queue,
      retry: { max_attempts: 3, delay_ms: 0 },
    }),
  );
  const session = await h.store.openSession({ scope: s, queue, concurrency: 1 });
  const reply = await h.store.acquire(acquireCommand(session.id, 0, 1, queue, s), {
    recordEmpty: true,
  });
  if (reply.reply.disposition !== 'assigned') throw new Error('expected an assignment');
  return { taskId: snapshot.task_id, a: reply.reply.assignment };
}

describe('seed 001 validate_task_output: "The lifecycle core verifies the report’s activation identity against the acquired task before acceptance"', () => {
  it('rejects a completed report claiming a workflow activation for an ordinary task', async () => {
    const s = scope();
    const { taskId, a } = await claimIn(s);
    expect(a.workflow_activation_id).toBeUndefined();
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    const command = successCommand(a, 'op-act');
    const forged: SettleCommand = {
      ...command,
      report: {
        kind: 'completed',
        report: {
          context: {
            identity: {
              task_id: a.lease.owner.task_id,
              attempt_id: a.lease.owner.attempt_id,
              activation_id: a.lease.owner.task_id,
            },
          },
          outcome: { kind: 'success', output: { ok: true } },
        },
      },
    };
    expect(await outcomeCode(h.store.settle(forged))).toBe('invalid_input');
    // Nothing was accepted: the task is still active and the honest report still settles it.
    expect((await h.store.status(s, taskId)).state).toBe('active');
    expect((await h.store.settle(command)).task_state).toBe('succeeded');
  });
});

describe('seed 000 WorkerSession: "Unknown/expired session IDs are rejected even after old cursor deletion"', () => {
  it('a session collected by retention (with its cursors) is rejected, never recreated by acquisition', async () => {
    const s = scope();
    await h.store.setRetentionPolicy(s, { retention_ms: MIN_RETENTION_MS });
    const session = await h.store.openSession({ scope: s, queue: 'q', concurrency: 2 });
    // Consume a few polls so the session has cursors.
    expect(
      (await h.store.acquire(acquireCommand(session.id, 0, 1, 'q', s), { recordEmpty: true })).reply
        .disposition,
    ).toBe('empty');
    expect(
      (await h.store.acquire(acquireCommand(session.id, 1, 1, 'q', s), { recordEmpty: true })).reply
        .disposition,
    ).toBe('empty');
    h.advance(MIN_RETENTION_MS + CONFIG.sessionValidityMs + 1_000);
    // Only expired sessions here; collect them (and their cursors).
    const progress = await h.store.collectRetired(s);
    expect(progress.sessions_removed).toBe(1);
    const [cursors] = await h.sql`
      select count(*)::int as n from consumer_cursors where worker_session_id = ${session.id}`;
    expect(Number(cursors?.n)).toBe(0);

    // Work is waiting now: a resurrected session would take it.
    await h.store.submit(
      submitCommand(`after-${session.id}`, { tenant_id: s.tenant_id, namespace: s.namespace }),
    );
    // The cursor is gone, so sequence 1 looks like a first poll, and 2 like the next one.
    for (const sequence of [1, 2]) {
      for (const consumer of [0, 1]) {
        const code = await outcomeCode(
          h.store.acquire(acquireCommand(session.id, consumer, sequence, 'q', s), {
            recordEmpty: true,
          }),
        );
        expect(code).toMatch(/^session_(not_found|expired)$/);
      }
    }
    const [sessions] = await h.sql`
      select count(*)::int as n from worker_sessions where session_id = ${session.id}`;
    expect(Number(sessions?.n)).toBe(0);
    const [cursorsAfter] = await h.sql`
      select count(*)::int as n from consumer_cursors where worker_session_id = ${session.id}`;
    expect(Number(cursorsAfter?.n)).toBe(0);
    await expect(h.store.extendSession(s, session.id)).rejects.toMatchObject({
      code: 'session_not_found',
    });
  });
});

describe('seed 001 MAX_RECOVERY_BATCH: "Maximum number of task candidates shortlisted by one recovery operation"', () => {
  it('one recovery call handles at most MAX_RECOVERY_BATCH expired leases, whatever limit it is given', async () => {
    // Clear expired leases other tests may have left, so the counts below are ours.
    while ((await h.store.recoverExpiredLeases()).has_more) {
      /* drain */
    }
    const s = scope();
    const total = MAX_RECOVERY_BATCH + 7;
    const session = await h.store.openSession({ scope: s, queue: 'rb', concurrency: total });
    for (let i = 0; i < total; i += 1) {
      await h.store.submit(
        submitCommand(`rb-${i}`, {
          tenant_id: s.tenant_id,
          namespace: s.namespace,
          queue: 'rb',
        }),
      );
    }
    for (let consumer = 0; consumer < total; consumer += 1) {
      const { reply } = await h.store.acquire(acquireCommand(session.id, consumer, 1, 'rb', s), {
        recordEmpty: true,
      });
      expect(reply.disposition).toBe('assigned');
    }
    h.advance(CONFIG.leaseDurationMs + 1_000);
    const first = await h.store.recoverExpiredLeases(MAX_RECOVERY_BATCH * 10);
    expect(first.scanned).toBeLessThanOrEqual(MAX_RECOVERY_BATCH);
    expect(first.recovered).toBeLessThanOrEqual(MAX_RECOVERY_BATCH);
    expect(first.has_more).toBe(true);
    const second = await h.store.recoverExpiredLeases(MAX_RECOVERY_BATCH * 10);
    expect(first.recovered + second.recovered).toBe(total);
  });
});

describe('seed 001 TraceContext: "Origin and processing contexts have the same wire format but different lifetimes"', () => {
  it('a processing trace stays with its settlement; the origin trace stays with the task and its next attempt', async () => {
    const s = scope();
    const origin = {
      traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
      tracestate: 'vendor=origin',
    };
    const processing = {
      traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
      tracestate: 'vendor=processing',
    };
    const { snapshot } = await h.store.submit({
      ...submitCommand(`trace-${s.tenant_id}`, {
        tenant_id: s.tenant_id,
        namespace: s.namespace,
        queue: 'tr',
        retry: { max_attempts: 3, delay_ms: 0 },
      }),
      origin_trace: origin,
    });
    const session = await h.store.openSession({ scope: s, queue: 'tr', concurrency: 1 });
    const first = await h.store.acquire(acquireCommand(session.id, 0, 1, 'tr', s), {
      recordEmpty: true,
    });
    if (first.reply.disposition !== 'assigned') throw new Error('expected assigned');
    const a = first.reply.assignment;
    expect(a.event.traceparent).toBe(origin.traceparent);
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    const failed = { ...failureCommand(a, 'op-trace', true), processing_trace: processing };
    expect((await h.store.settle(failed)).task_state).toBe('queued');

    const attempt = await h.store.inspectAttempt(s, snapshot.task_id, a.lease.owner.attempt_id);
    expect(attempt.settlement?.command.processing_trace).toEqual(processing);
    const task = await h.store.inspect(s, snapshot.task_id);
    expect(task.origin_trace).toEqual(origin);

    const second = await h.store.acquire(acquireCommand(session.id, 0, 2, 'tr', s), {
      recordEmpty: true,
    });
    if (second.reply.disposition !== 'assigned') throw new Error('expected assigned');
    expect(second.reply.assignment.event.traceparent).toBe(origin.traceparent);
    expect(second.reply.assignment.event.tracestate).toBe(origin.tracestate);
  });
});

describe('seed 001 CompletionStore: "Delivery leasing only locks subscription rows; it must never lock executions afterward"', () => {
  it('leases and reports a due delivery while another transaction holds its task row lock', async () => {
    const s = scope();
    const { snapshot } = await h.store.submit(
      submitCommand(`cb-${s.tenant_id}`, { tenant_id: s.tenant_id, namespace: s.namespace }),
    );
    expect(await h.store.cancel(s, snapshot.task_id)).toBe('cancelled');
    const { subscription } = await h.store.subscribe(s, snapshot.task_id, {
      subscription_key: 'lock-free',
      destination: 'billing',
    });
    expect(subscription.state).toBe('due');

    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let locked: () => void = () => {};
    const isLocked = new Promise<void>((resolve) => {
      locked = resolve;
    });
    const holder = h.sql.begin(async (tx) => {
      await tx`select 1 from tasks where tenant_id = ${s.tenant_id} and namespace = ${s.namespace}
        and task_id = ${snapshot.task_id} for update`;
      locked();
      await released;
    });
    await isLocked;
    try {
      const within = <T>(p: Promise<T>, what: string) =>
        Promise.race([
          p,
          new Promise<never>((_, reject) =>
            setTimeout(() => reject(new Error(`${what} waited on the task row lock`)), 3_000),
          ),
        ]);
      const leases = (await within(h.store.leaseDeliveries(100, 30_000), 'leaseDeliveries')).filter(
        (l) => l.subscription_id === subscription.id,
      );
      expect(leases).toHaveLength(1);
      const lease = leases[0];
      if (lease === undefined) throw new Error('no lease');
      const reported = await within(
        h.store.reportDelivery({
          scope: lease.scope,
          subscription_id: lease.subscription_id,
          generation: lease.generation,
          attempt: lease.attempt,
          next: { state: 'delivered' },
          status_code: 204,
        }),
        'reportDelivery',
      );
      expect(reported).toBe(true);
    } finally {
      release();
      await holder;
    }
    const [after] = await h.store.listSubscriptions(s, snapshot.task_id);
    expect(after?.state).toBe('delivered');
  });
});
