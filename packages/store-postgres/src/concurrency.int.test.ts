/**
 * Races the store must win: many claimers, competing settlements, recovery against a late settle
 * (River issue #1302), concurrency keys under contention.
 */
import { type Assignment, ContractError, MAX_SUBMIT_BATCH } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('races');
});
afterAll(() => h.close());

async function submitMany(
  prefix: string,
  count: number,
  queue: string,
  extra = {},
): Promise<string[]> {
  const ids: string[] = [];
  for (let start = 0; start < count; start += MAX_SUBMIT_BATCH) {
    const commands = Array.from({ length: Math.min(MAX_SUBMIT_BATCH, count - start) }, (_, i) =>
      submitCommand(`${prefix}-${start + i}`, { queue, ...extra }),
    );
    for (const result of await h.store.submitBatch(commands)) {
      if (!result.ok) throw result.error;
      ids.push(result.value.snapshot.task_id);
    }
  }
  return ids;
}

/** Drains a queue with one session of `slots` slots, polling all slots in one batch. */
async function drain(store: PostgresTaskStore, queue: string, slots: number): Promise<string[]> {
  const session = await store.openSession({ scope: SCOPE, queue, concurrency: slots });
  const claimed: string[] = [];
  let sequence = 0;
  for (;;) {
    sequence += 1;
    const polls = Array.from({ length: slots }, (_, slot) =>
      acquireCommand(session.id, slot, sequence, queue),
    );
    const replies = await store.acquireBatch(polls, { recordEmpty: true });
    const assignments: Assignment[] = [];
    for (const item of replies) {
      if (!item.ok) throw item.error;
      if (item.value.reply.disposition === 'assigned')
        assignments.push(item.value.reply.assignment);
    }
    if (assignments.length === 0) return claimed;
    claimed.push(...assignments.map((a) => a.lease.owner.task_id));
    const settled = await store.settleBatch(assignments.map((a, i) => successCommand(a, `op${i}`)));
    for (const item of settled) if (!item.ok) throw item.error;
  }
}

describe('concurrency', () => {
  it('8 concurrent acquirers over 2 000 tasks: every task assigned exactly once', async () => {
    const ids = await submitMany('many', 2_000, 'many');
    const stores = Array.from({ length: 8 }, () => h.makeStore(2));
    const started = performance.now();
    const claimed = (await Promise.all(stores.map((store) => drain(store, 'many', 8)))).flat();
    const elapsed = performance.now() - started;
    expect(claimed).toHaveLength(2_000);
    expect(new Set(claimed)).toEqual(new Set(ids));
    const [row] = await h.sql`
      select count(*)::int as attempts, count(distinct task_id)::int as tasks
      from attempts where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and task_id = any(${ids}::text[])`;
    expect(row).toEqual({ attempts: 2_000, tasks: 2_000 });
    console.log(
      `[races] 2000 claim+settle lifecycles by 8 batching acquirers in ${elapsed.toFixed(0)} ms`,
    );
  });

  it('4 concurrent settles of one attempt with different operation ids: exactly one accepted', async () => {
    await h.store.submit(submitCommand('contested', { queue: 'contested' }));
    const session = await h.store.openSession({ scope: SCOPE, queue: 'contested', concurrency: 1 });
    const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, 'contested'), {
      recordEmpty: true,
    });
    if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
    await h.store.renew(renewCommand(reply.assignment.lease.owner, 1, 'dispatch'));
    const stores = Array.from({ length: 4 }, () => h.makeStore(1));
    const outcomes = await Promise.allSettled(
      stores.map((store, i) => store.settle(successCommand(reply.assignment, `op-${i}`, i))),
    );
    const accepted = outcomes.filter((o) => o.status === 'fulfilled');
    const rejected = outcomes.flatMap((o) => (o.status === 'rejected' ? [o.reason] : []));
    expect(accepted).toHaveLength(1);
    expect(rejected).toHaveLength(3);
    for (const error of rejected) {
      expect(error).toBeInstanceOf(ContractError);
      expect((error as ContractError).code).toBe('conflict');
    }
    const history = await h.store.history(SCOPE, reply.assignment.lease.owner.task_id, 0);
    expect(history.filter((e) => e.event.reason === 'report_accepted')).toHaveLength(1);
  });

  it('recovery racing a late settle: exactly one outcome, consistent history', async () => {
    const count = 24;
    await submitMany('rescue', count, 'rescue');
    const session = await h.store.openSession({
      scope: SCOPE,
      queue: 'rescue',
      concurrency: count,
    });
    const replies = await h.store.acquireBatch(
      Array.from({ length: count }, (_, slot) => acquireCommand(session.id, slot, 1, 'rescue')),
      { recordEmpty: true },
    );
    const assignments = replies.map((item) => {
      if (!item.ok || item.value.reply.disposition !== 'assigned') throw new Error('unassigned');
      return item.value.reply.assignment;
    });
    // Move store time to a few ms before the leases end, then race settles against recovery.
    const recoverer = h.makeStore(2);
    const settler = h.makeStore(2);
    await Promise.all([recoverer.now(), settler.now()]); // connected before the clock matters
    const now = await h.store.now();
    const expiresAt = Math.min(...assignments.map((a) => a.lease.expires_at));
    h.advance(expiresAt - now - 40);
    let settling = true;
    const settles = (async () => {
      const out: PromiseSettledResult<unknown>[] = [];
      for (const [i, a] of assignments.entries()) {
        out.push(...(await Promise.allSettled([settler.settle(successCommand(a, `late-${i}`))])));
      }
      settling = false;
      return out;
    })();
    // Recovery passes run back to back while the settles straddle the expiry.
    const recoveries = (async () => {
      while (settling) await recoverer.recoverExpiredLeases(4);
    })();
    const settled = await settles;
    await recoveries;
    h.advance(10);
    await recoverer.recoverExpiredLeases();
    const won = settled.filter((o) => o.status === 'fulfilled').length;
    console.log(`[races] settle won ${won} of ${count} races against recovery`);
    for (const [i, assignment] of assignments.entries()) {
      const taskId = assignment.lease.owner.task_id;
      const outcome = settled[i];
      const history = (await h.store.history(SCOPE, taskId, 0)).map((e) => e.event.reason);
      const attempt = await h.store.inspectAttempt(
        SCOPE,
        taskId,
        assignment.lease.owner.attempt_id,
      );
      const status = await h.store.status(SCOPE, taskId);
      if (outcome?.status === 'fulfilled') {
        expect(status.state).toBe('succeeded');
        expect(attempt.state).toBe('succeeded');
        expect(history).toEqual(['submitted', 'claimed', 'report_accepted', 'succeeded']);
      } else {
        expect(outcome?.status === 'rejected' && (outcome.reason as ContractError).code).toBe(
          'ownership_lost',
        );
        expect(status.state).toBe('queued');
        expect(attempt.state).toBe('lost');
        expect(attempt.settlement).toBeNull();
        expect(history).toEqual(['submitted', 'claimed', 'lease_expired', 'retry_scheduled']);
      }
    }
  });

  it('a concurrency key never exceeds its limit under 8 concurrent acquirers', async () => {
    const limit = 2;
    await submitMany('keyed', 120, 'keyed', { concurrency_key: 'k', concurrency_limit: limit });
    let running = true;
    let maxSeen = 0;
    const monitor = (async () => {
      while (running) {
        const [row] = await h.sql`
          select count(*)::int as active from tasks
          where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
            and concurrency_key = 'k' and state = 'active'`;
        maxSeen = Math.max(maxSeen, Number(row?.active));
      }
    })();
    const stores = Array.from({ length: 8 }, () => h.makeStore(1));
    const claimed = await Promise.all(
      stores.map(async (store) => {
        const session = await store.openSession({ scope: SCOPE, queue: 'keyed', concurrency: 1 });
        let sequence = 0;
        let mine = 0;
        let empties = 0;
        while (empties < 20) {
          sequence += 1;
          const { reply } = await store.acquire(acquireCommand(session.id, 0, sequence, 'keyed'), {
            recordEmpty: true,
          });
          if (reply.disposition !== 'assigned') {
            empties += 1;
            await new Promise((resolve) => setTimeout(resolve, 2));
            continue;
          }
          empties = 0;
          mine += 1;
          await store.settle(successCommand(reply.assignment, 'done'));
        }
        return mine;
      }),
    );
    running = false;
    await monitor;
    expect(claimed.reduce((a, b) => a + b, 0)).toBe(120);
    expect(maxSeen).toBeLessThanOrEqual(limit);
    const [key] = await h.sql`select active from concurrency_keys where concurrency_key = 'k'`;
    expect(key?.active).toBe(0);
  });
});

describe('a poll that waited for a concurrency key decides at the time after the wait', () => {
  /** Holds a key's row in another transaction, as a concurrent claim or settle of that key does. */
  async function holdKey(key: string): Promise<() => Promise<void>> {
    const holder = await h.sql.reserve();
    await holder`begin`;
    await holder`select 1 from concurrency_keys where concurrency_key = ${key} for update`;
    return async () => {
      await holder`commit`;
      holder.release();
    };
  }

  async function firstLease(queue: string, session: string): Promise<Assignment> {
    const { reply } = await h.store.acquire(acquireCommand(session, 0, 1, queue), {
      recordEmpty: true,
    });
    if (reply.disposition !== 'assigned')
      throw new Error(`expected assigned: ${reply.disposition}`);
    return reply.assignment;
  }

  it('a replay in the same batch answers ownership_lost once its attempt was lost and re-leased during the wait', async () => {
    const queue = 'waited-replay';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
    const thief = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(
      submitCommand('waited-replay-t', { queue, retry: { max_attempts: 3, delay_ms: 0 } }),
    );
    const held = await firstLease(queue, session.id);
    await h.store.submit(
      submitCommand('waited-replay-k', { queue, concurrency_key: 'waited-replay' }),
    );
    const release = await holdKey('waited-replay');
    // Slot 0 replays its poll 1; slot 1's new poll claims the keyed task and waits for its key.
    const batch = h.store.acquireBatch(
      [acquireCommand(session.id, 0, 1, queue), acquireCommand(session.id, 1, 1, queue)],
      { recordEmpty: true },
    );
    await h.untilLockWaits();
    // Meanwhile slot 0's lease ends, recovery takes it, and another session claims its task.
    h.advance(held.lease.expires_at - (await h.store.now()) + 1);
    const other = h.makeStore(2);
    expect((await other.recoverExpiredLeases()).requeued).toBe(1);
    const { reply: taken } = await other.acquire(acquireCommand(thief.id, 0, 1, queue), {
      recordEmpty: true,
    });
    expect(taken.disposition === 'assigned' && taken.assignment.lease.owner.task_id).toBe(
      held.lease.owner.task_id,
    );
    await release();
    const [replayed, claimed] = await batch;
    // DESIGN §5: a replay answers `ownership_lost` once that attempt is no longer owned.
    expect(replayed?.ok && replayed.value.reply.disposition).toBe('ownership_lost');
    expect(claimed?.ok && claimed.value.reply.disposition).toBe('assigned');
  });

  it('a claim made after the wait grants a lease counted from after the wait', async () => {
    const queue = 'waited-claim';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(
      submitCommand('waited-claim-k', { queue, concurrency_key: 'waited-claim' }),
    );
    const release = await holdKey('waited-claim');
    const poll = h.store.acquire(acquireCommand(session.id, 0, 1, queue), { recordEmpty: true });
    await h.untilLockWaits();
    // The wait outlasts a whole lease.
    h.advance(CONFIG.leaseDurationMs + 1_000);
    await release();
    const { reply } = await poll;
    if (reply.disposition !== 'assigned')
      throw new Error(`expected assigned: ${reply.disposition}`);
    const { authority } = reply.assignment;
    expect(authority.expires_at).toBeGreaterThan(await h.store.now());
    // The worker's first renewal, sent at once, finds its lease live.
    const renewed = await h.store.renew(renewCommand(authority.owner, 1, 'dispatch'));
    expect(renewed.dispatch_allowed).toBe(true);
  });
});
