/**
 * Cancel racing each step of the lifecycle, repeated so that both orders can occur, with the
 * reply of every racer checked against the final state and history, and the key slot accounted
 * once (DESIGN §5 Cancel; contracts task.ts on concurrency limits).
 */
import type { Assignment, Authority, Scope, SettleReply, TaskState } from '@ledgence/contracts';
import { ContractError } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  failureCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
let other: PostgresTaskStore;
beforeAll(async () => {
  h = await harness('ck_races');
  other = h.makeStore(4);
});
afterAll(() => h.close());

const ROUNDS = 12;
let serial = 0;

async function claimOne(
  queue: string,
  scope: Scope = SCOPE,
  store = h.store,
): Promise<Assignment | null> {
  const s = await store.openSession({ scope, queue, concurrency: 1 });
  const { reply } = await store.acquire(acquireCommand(s.id, 0, 1, queue, scope), {
    recordEmpty: true,
  });
  return reply.disposition === 'assigned' ? reply.assignment : null;
}

async function reasons(taskId: string): Promise<string[]> {
  return (await h.store.history(SCOPE, taskId, 0)).map((e) => e.event.reason);
}

async function keyActive(key: string): Promise<{ active: number; tasks: number }> {
  const [row] = await h.sql`select
      (select active from concurrency_keys where tenant_id = ${SCOPE.tenant_id}
        and namespace = ${SCOPE.namespace} and concurrency_key = ${key}) as active,
      (select count(*)::int from tasks where tenant_id = ${SCOPE.tenant_id}
        and namespace = ${SCOPE.namespace} and concurrency_key = ${key} and state = 'active') as n`;
  return { active: row?.active === null ? 0 : Number(row?.active), tasks: Number(row?.n) };
}

async function code<T>(p: Promise<T>): Promise<T | string> {
  try {
    return await p;
  } catch (e) {
    if (e instanceof ContractError) return e.code;
    throw e;
  }
}

async function keyedTask(key: string, limit = 1, extra: Record<string, unknown> = {}) {
  serial += 1;
  const queue = `ck-q-${serial}`;
  const { snapshot } = await h.store.submit(
    submitCommand(`ck-${serial}`, {
      queue,
      concurrency_key: key,
      concurrency_limit: limit,
      ...extra,
    }),
  );
  return { id: snapshot.task_id, queue };
}

describe('cancel vs dispatch renew', () => {
  it('the grant and the cancel are ordered: replies agree with history and dispatch_count', async () => {
    for (let i = 0; i < ROUNDS; i += 1) {
      const key = `ck-dr-${i}`;
      const { id, queue } = await keyedTask(key);
      const a = (await claimOne(queue)) as Assignment;
      const [auth, cancel] = await Promise.all([
        other.renew(renewCommand(a.lease.owner, 1, 'dispatch')),
        h.store.cancel(SCOPE, id),
      ]);
      expect(cancel).toBe('active');
      const rs = await reasons(id);
      const granted = rs.indexOf('dispatch_authorized');
      const requested = rs.indexOf('cancel_requested');
      if (auth.dispatch_allowed) {
        expect(granted).toBeGreaterThan(-1);
        expect(granted).toBeLessThan(requested);
      } else {
        expect(auth.cancel_requested).toBe(true);
        expect(granted).toBe(-1);
      }
      // Settled by the worker (it aborts): cancelled, slot freed once.
      const reply = await h.store.settle({
        ...failureCommand(a, `op-dr-${i}`, true),
        report: {
          kind: 'failed',
          report: { kind: 'cancelled', message: 'aborted', retryable: true },
        },
      });
      expect(reply.task_state).toBe('cancelled');
      expect(await keyActive(key)).toEqual({ active: 0, tasks: 0 });
    }
  });
});

describe('cancel vs settle', () => {
  for (const kind of ['success', 'retry', 'fail'] as const) {
    it(`${kind}: the settle reply, the cancel reply, the final state and history agree`, async () => {
      for (let i = 0; i < ROUNDS; i += 1) {
        const key = `ck-cs-${kind}-${i}`;
        const { id, queue } = await keyedTask(key, 1, { retry: { max_attempts: 3, delay_ms: 0 } });
        const a = (await claimOne(queue)) as Assignment;
        await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
        const command =
          kind === 'success'
            ? successCommand(a, `op-cs-${kind}-${i}`)
            : failureCommand(a, `op-cs-${kind}-${i}`, kind === 'retry');
        const [settled, cancel] = (await Promise.all([
          code(other.settle(command)),
          code(h.store.cancel(SCOPE, id)),
        ])) as [SettleReply, TaskState];
        const status = await h.store.status(SCOPE, id);
        const rs = await reasons(id);
        if (settled.task_state === 'cancelled') {
          expect(cancel).toBe('active');
          expect(status.state).toBe('cancelled');
          expect(rs.slice(-3)).toEqual(['cancel_requested', 'report_accepted', 'cancelled']);
        } else {
          const expected = kind === 'success' ? 'succeeded' : kind === 'fail' ? 'failed' : 'queued';
          expect(settled.task_state).toBe(expected);
          // A retry re-queues: the cancel then cancels the queued task at once.
          expect(cancel).toBe(kind === 'retry' ? 'cancelled' : expected);
          expect(status.state).toBe(kind === 'retry' ? 'cancelled' : expected);
          expect(rs.includes('cancel_requested')).toBe(false);
        }
        expect(await keyActive(key)).toEqual({ active: 0, tasks: 0 });
        // Nothing of this task is claimable any more (the retry never ran).
        if (status.state === 'cancelled') expect(await claimOne(queue)).toBeNull();
      }
    });
  }
});

describe('cancel vs recovery vs a late settle', () => {
  it('a lapsed lease: cancel, recovery and the late settle race; cancelled once, never retried', async () => {
    for (let i = 0; i < ROUNDS; i += 1) {
      const key = `ck-cr-${i}`;
      const { id, queue } = await keyedTask(key, 1, { retry: { max_attempts: 3, delay_ms: 0 } });
      const a = (await claimOne(queue)) as Assignment;
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      h.advance(2_500); // past the 2 s lease
      const [cancel, , late] = await Promise.all([
        code(h.store.cancel(SCOPE, id)),
        other.recoverExpiredLeases(100),
        code(other.settle(successCommand(a, `op-cr-${i}`))),
      ]);
      expect(late).toBe('ownership_lost');
      // Whichever runs first, the cancel is answered with the task's state, never refused.
      expect(['active', 'cancelled']).toContain(cancel);
      // Recovery skips a task row the cancel holds (SKIP LOCKED): the next pass finishes it.
      await h.store.recoverExpiredLeases(100);
      const status = await h.store.status(SCOPE, id);
      const rs = await reasons(id);
      // Recovery first re-queues it (attempts left), then the cancel cancels the queued task.
      // Cancel first: recovery cancels it. Either way: cancelled, and no claim after.
      expect(status.state).toBe('cancelled');
      expect(rs.filter((r) => r === 'cancelled')).toHaveLength(1);
      expect(await keyActive(key)).toEqual({ active: 0, tasks: 0 });
      expect(await claimOne(queue)).toBeNull();
    }
  });

  it('a retry re-queued at once races a cancel and a claim: the key never goes past 1, the count settles at the holders', async () => {
    for (let i = 0; i < ROUNDS; i += 1) {
      const key = `ck-rq-${i}`;
      const { id, queue } = await keyedTask(key, 1, { retry: { max_attempts: 3, delay_ms: 0 } });
      // A second task of the key waiting behind it.
      serial += 1;
      await h.store.submit(
        submitCommand(`ck-${serial}`, { queue, concurrency_key: key, concurrency_limit: 1 }),
      );
      const a = (await claimOne(queue)) as Assignment;
      expect(a.lease.owner.task_id).toBe(id);
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      h.advance(1); // the retry's available_at (now + 0) is due for the claims below
      const [settled, cancel, c1, c2] = await Promise.all([
        code(h.store.settle(failureCommand(a, `op-rq-${i}`, true))),
        code(other.cancel(SCOPE, id)),
        claimOne(queue, SCOPE, other),
        claimOne(queue, SCOPE, h.store),
      ]);
      const claimed = [c1, c2].filter((c) => c !== null) as Assignment[];
      // The owner's settle is accepted before or after the cancel: a cancel never refuses it.
      expect(typeof settled).not.toBe('string');
      expect(claimed.length).toBeLessThanOrEqual(1);
      const k = await keyActive(key);
      expect(k.active).toBe(k.tasks);
      expect(k.tasks).toBeLessThanOrEqual(1);
      const status = await h.store.status(SCOPE, id);
      if (claimed[0]?.lease.owner.task_id === id) {
        // Claimed again between the re-queue and the cancel: the cancel became a request.
        expect(cancel).toBe('active');
        expect(status.cancel_requested_at).not.toBeNull();
        const renewed = (await h.store.renew(
          renewCommand(claimed[0].lease.owner, 1, 'dispatch'),
        )) as Authority;
        expect(renewed.dispatch_allowed).toBe(false);
        expect(renewed.cancel_requested).toBe(true);
      }
      // Finish everything: the first task must end cancelled either way.
      for (const c of claimed)
        await h.store.settle(successCommand(c, `op-rq-fin-${i}-${c.lease.owner.attempt_id}`));
      expect((await h.store.status(SCOPE, id)).state).toBe('cancelled');
      expect(await keyActive(key)).toEqual({ active: 0, tasks: 0 });
    }
  });
});

describe('cancel of tasks that are not running', () => {
  it('a task waiting on a full key is cancelled at once, the holder keeps the slot, and the next waiter (not it) gets the slot', async () => {
    const key = 'ck-full';
    const queue = 'ck-full-q';
    const ids: string[] = [];
    for (let i = 0; i < 3; i += 1) {
      const { snapshot } = await h.store.submit(
        submitCommand(`ck-full-${i}`, { queue, concurrency_key: key, concurrency_limit: 1 }),
      );
      ids.push(snapshot.task_id);
    }
    const holder = (await claimOne(queue)) as Assignment;
    expect(holder.lease.owner.task_id).toBe(ids[0]);
    expect(await claimOne(queue)).toBeNull();
    // The waiter is cancelled while the holder's slot is released and claims poll, all at once.
    const [cancel, , c1, c2] = await Promise.all([
      other.cancel(SCOPE, ids[1] as string),
      h.store.settle(successCommand(holder, 'op-full')),
      claimOne(queue, SCOPE, other),
      claimOne(queue, SCOPE, h.store),
    ]);
    const claimed = [c1, c2].filter((c) => c !== null) as Assignment[];
    expect(claimed.length).toBeLessThanOrEqual(1);
    if (cancel === 'cancelled') {
      // Cancelled while queued: never claimed; only the third may run.
      for (const c of claimed) expect(c.lease.owner.task_id).toBe(ids[2]);
    }
    const k = await keyActive(key);
    expect(k.active).toBe(k.tasks);
    expect(k.tasks).toBeLessThanOrEqual(1);
    expect(await reasons(ids[1] as string)).toEqual(
      cancel === 'cancelled'
        ? ['submitted', 'cancelled']
        : expect.arrayContaining(['cancel_requested']),
    );
  });

  it('a delayed task is cancelled at once and is never claimed when it comes due', async () => {
    const queue = 'ck-delayed';
    const { snapshot } = await h.store.submit(
      submitCommand('ck-delayed', {
        queue,
        delay_ms: 5_000,
        concurrency_key: 'ck-dk',
        concurrency_limit: 1,
      }),
    );
    expect(await h.store.cancel(SCOPE, snapshot.task_id)).toBe('cancelled');
    h.advance(6_000);
    expect(await claimOne(queue)).toBeNull();
    const status = await h.store.status(SCOPE, snapshot.task_id);
    expect(status.state).toBe('cancelled');
    expect(status.attempt_count).toBe(0);
    expect(await reasons(snapshot.task_id)).toEqual(['submitted', 'cancelled']);
    expect(await keyActive('ck-dk')).toEqual({ active: 0, tasks: 0 });
  });
});

describe('a cancelled task frees its slot exactly once', () => {
  it('held unconfirmed, cancel requested: confirm, recovery, a second cancel and claims race; limit 1 never lets 2 run', async () => {
    for (let i = 0; i < ROUNDS; i += 1) {
      const key = `ck-once-${i}`;
      const { id, queue } = await keyedTask(key, 1, { retry: { max_attempts: 3, delay_ms: 0 } });
      for (let j = 0; j < 3; j += 1) {
        serial += 1;
        await h.store.submit(
          submitCommand(`ck-${serial}`, { queue, concurrency_key: key, concurrency_limit: 1 }),
        );
      }
      const a = (await claimOne(queue)) as Assignment;
      expect(a.lease.owner.task_id).toBe(id);
      await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
      // A retryable failure held unconfirmed: the cancel turns the held retry into a cancel.
      await h.store.settle({
        ...failureCommand(a, `op-once-${i}`, true),
        quiescence: 'unconfirmed',
      });
      expect(await h.store.cancel(SCOPE, id)).toBe('active');
      // Around the authority deadline: confirmation and recovery compete.
      h.advance(i % 2 === 0 ? 1_000 : 3_500);
      const [confirm, , , c1, c2, c3] = await Promise.all([
        code(other.confirmQuiescence(a.lease.owner)),
        other.recoverExpiredLeases(100),
        code(h.store.cancel(SCOPE, id)),
        claimOne(queue, SCOPE, other),
        claimOne(queue, SCOPE, h.store),
        claimOne(queue, SCOPE, other),
      ]);
      const claimed = [c1, c2, c3].filter((c) => c !== null) as Assignment[];
      expect(claimed.length, `round ${i}: confirm ${String(confirm)}`).toBeLessThanOrEqual(1);
      for (const c of claimed) expect(c.lease.owner.task_id).not.toBe(id);
      const k = await keyActive(key);
      expect(k.active).toBe(k.tasks);
      expect(k.tasks).toBeLessThanOrEqual(1);
      const status = await h.store.status(SCOPE, id);
      const rs = await reasons(id);
      if (status.state !== 'active') {
        expect(status.state).toBe('cancelled');
        expect(rs.filter((r) => r === 'cancelled')).toHaveLength(1);
        expect(rs.includes('retry_scheduled')).toBe(false);
      }
      // Drain so the key ends at 0.
      h.advance(4_000);
      await h.store.recoverExpiredLeases(100);
      for (const c of claimed) await code(h.store.settle(successCommand(c, `op-once-fin-${i}`)));
      for (;;) {
        const next = await claimOne(queue);
        if (next === null) break;
        expect((await keyActive(key)).tasks).toBe(1);
        await h.store.settle(successCommand(next, `op-once-d-${next.lease.owner.attempt_id}`));
      }
      expect(await keyActive(key)).toEqual({ active: 0, tasks: 0 });
      expect((await h.store.status(SCOPE, id)).state).toBe('cancelled');
    }
  });
});

describe('one key, different limits (spec question: DESIGN §4 "at most concurrency_limit active tasks share a key")', () => {
  it('a limit-1 task runs beside three others of its key when they declare limit 5; the limit-5 tasks wait for nothing', async () => {
    const key = 'ck-mixed';
    const queue = 'ck-mixed-q';
    const strict = await h.store.submit(
      submitCommand('ck-mixed-strict', { queue, concurrency_key: key, concurrency_limit: 1 }),
    );
    for (let i = 0; i < 3; i += 1)
      await h.store.submit(
        submitCommand(`ck-mixed-loose-${i}`, { queue, concurrency_key: key, concurrency_limit: 5 }),
      );
    const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 4 });
    const replies = await h.store.acquireBatch(
      [0, 1, 2, 3].map((slot) => acquireCommand(s.id, slot, 1, queue)),
      { recordEmpty: true },
    );
    const assigned = replies.filter((r) => r.ok && r.value.reply.disposition === 'assigned');
    expect(assigned).toHaveLength(4);
    // The task that asked for "at most 1 active task of this key" runs with 3 others.
    expect((await h.store.status(SCOPE, strict.snapshot.task_id)).state).toBe('active');
    expect(await keyActive(key)).toEqual({ active: 4, tasks: 4 });
  });

  it('reversed: a limit-1 task waits while limit-5 tasks of its key keep arriving', async () => {
    const key = 'ck-mixed2';
    const queue = 'ck-mixed2-q';
    const loose = async (i: number) =>
      h.store.submit(
        submitCommand(`ck-mixed2-loose-${i}`, {
          queue,
          concurrency_key: key,
          concurrency_limit: 5,
          priority: 1,
        }),
      );
    await loose(0);
    const strict = await h.store.submit(
      submitCommand('ck-mixed2-strict', { queue, concurrency_key: key, concurrency_limit: 1 }),
    );
    const first = (await claimOne(queue)) as Assignment;
    expect(first.lease.owner.task_id).not.toBe(strict.snapshot.task_id);
    // While any limit-5 task is active, the limit-1 task is refused; overlapping limit-5 work
    // keeps it out for as long as it overlaps.
    let holder = first;
    for (let i = 1; i < 4; i += 1) {
      await loose(i);
      const next = (await claimOne(queue)) as Assignment;
      expect(next.lease.owner.task_id).not.toBe(strict.snapshot.task_id);
      await h.store.settle(successCommand(holder, `op-mixed2-${i}`));
      holder = next;
    }
    expect((await h.store.status(SCOPE, strict.snapshot.task_id)).state).toBe('queued');
  });
});
