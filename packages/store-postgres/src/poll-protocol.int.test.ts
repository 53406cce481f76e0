/**
 * Worker sessions and the poll protocol at the store (DESIGN §4.1, §5 Sessions and
 * Acquire; seed `WorkerSession`, `AcquireCommand`, `ConsumerCursor`), on a real PostgreSQL with a
 * movable store clock (fixtures: lease 2 s, session validity 60 s).
 */
import type { AcquireReply, Assignment } from '@ledgence/contracts';
import { createTaskService, type TaskStore } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('poll_protocol');
});
afterAll(() => h.close());

function assigned(reply: AcquireReply): Assignment {
  if (reply.disposition !== 'assigned') {
    throw new Error(`expected assigned, got ${JSON.stringify(reply)}`);
  }
  return reply.assignment;
}

async function poll(sessionId: string, consumer: number, sequence: number, queue: string) {
  return (
    await h.store.acquire(acquireCommand(sessionId, consumer, sequence, queue), {
      recordEmpty: true,
    })
  ).reply;
}

async function cursorsOf(sessionId: string) {
  return h.sql`select consumer_id, sequence from consumer_cursors
    where worker_session_id = ${sessionId} order by consumer_id`;
}

async function activeAttemptsOf(sessionId: string) {
  return h.sql`select task_id, attempt_id, consumer_id from attempts
    where worker_session_id = ${sessionId} and state = 'active'`;
}

describe('a claim given back for a poll whose client left (core handBackUndelivered)', () => {
  // DESIGN §5: "A client disconnect ends the wait without consuming a task." The claim the
  // server made for a reply nobody can receive is given back: no user code ran, so the task is
  // exactly as claimable as before the poll — not parked for its retry delay (here an hour).
  it('is claimable again at once by another slot, not only after the task retry delay', async () => {
    const queue = 'handback-delay';
    const service = createTaskService({ store: h.store });
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
    const { snapshot } = await h.store.submit(
      submitCommand('handback-delay', {
        queue,
        retry: { max_attempts: 3, delay_ms: 3_600_000 },
      }),
    );
    const gone = new AbortController();
    gone.abort();
    // The poll's client is gone: the claim is made and given back.
    const lost = await service.acquire(acquireCommand(session.id, 0, 1, queue), {
      signal: gone.signal,
    });
    expect(lost.disposition).toBe('assigned');
    const status = await h.store.status(SCOPE, snapshot.task_id);
    expect(status.state).toBe('queued');
    // Another slot's poll, a moment later, finds the task.
    const next = await poll(session.id, 1, 1, queue);
    expect(next.disposition).toBe('assigned');
  });

  /**
   * The real store, whose poll that records the park's outcome (the one a parked wait makes when
   * its wait ends) first moves the store clock past a delayed task's due time and loses the
   * poll's client: that call claims, for a reply nobody receives.
   */
  function clientLeavesDuringRecording(gone: AbortController, dueInMs: number): TaskStore {
    return new Proxy(h.store, {
      get(target, name) {
        const value = Reflect.get(target, name);
        if (typeof value !== 'function') return value;
        if (name !== 'acquire' && name !== 'acquireBatch') return value.bind(target);
        return (command: unknown, options: { recordEmpty: boolean }) => {
          if (options.recordEmpty) {
            h.advance(dueInMs);
            gone.abort();
          }
          return value.call(target, command, options);
        };
      },
    });
  }

  for (const route of ['acquire', 'acquireBatch'] as const) {
    it(`${route}: a claim made by the poll recording the end of a park, whose client left meanwhile, is given back`, async () => {
      const queue = `handback-record-${route}`;
      const delay = 30_000; // within the session validity (60 s)
      const gone = new AbortController();
      const service = createTaskService({ store: clientLeavesDuringRecording(gone, delay + 1) });
      const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
      const { snapshot } = await h.store.submit(
        submitCommand(`handback-record-${route}`, { queue, delay_ms: delay }),
      );
      // Parks 50 ms (the task is not due before the wait ends), then records its outcome.
      const wait = { waitMs: 50, signal: gone.signal };
      const replies =
        route === 'acquire'
          ? [await service.acquire(acquireCommand(session.id, 0, 1, queue), wait)]
          : (await service.acquireBatch([acquireCommand(session.id, 0, 1, queue)], wait)).map(
              (item) => (item.ok ? item.value : item.error),
            );
      expect(replies.map((r) => ('disposition' in r ? r.disposition : r))).toEqual(['assigned']);
      // Nobody could receive it: the task is queued again, and another slot claims it at once.
      const status = await h.store.status(SCOPE, snapshot.task_id);
      expect(status.state).toBe('queued');
      expect((await poll(session.id, 1, 1, queue)).disposition).toBe('assigned');
    });
  }
});

describe('replayed polls', () => {
  it('a replay answers the same assignment (event, descriptor, lease owner, deadline) with fresh authority', async () => {
    const queue = 'replay-same';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(submitCommand('replay-same', { queue, data: { n: 1 } }));
    const first = assigned(await poll(session.id, 0, 1, queue));
    h.advance(500);
    const authority = await h.store.renew(renewCommand(first.lease.owner, 1, 'dispatch'));
    expect(authority.dispatch_allowed).toBe(true);
    h.advance(500);
    const again = assigned(await poll(session.id, 0, 1, queue));
    expect(again.event).toEqual(first.event);
    expect(again.descriptor).toEqual(first.descriptor);
    expect(again.lease.owner).toEqual(first.lease.owner);
    expect(again.attempt_deadline).toBe(first.attempt_deadline);
    // Freshly sampled: the renewal shows, and the remaining time is measured now.
    expect(again.authority.renew_sequence).toBe(1);
    expect(again.authority.dispatch_allowed).toBe(true);
    expect(again.authority.expires_at).toBe(authority.expires_at);
    expect(again.authority.remaining_ms).toBeLessThan(first.authority.remaining_ms);
    // Nothing was claimed twice.
    expect(await activeAttemptsOf(session.id)).toHaveLength(1);
  });

  it('lower and skipped sequences are sequence_conflict and move nothing; last replays, last + 1 is new', async () => {
    const queue = 'seq';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    expect(await outcomeCode(poll(session.id, 0, 0, queue))).toBe('sequence_conflict');
    expect(await outcomeCode(poll(session.id, 0, 2, queue))).toBe('sequence_conflict');
    expect(await cursorsOf(session.id)).toHaveLength(0);
    expect((await poll(session.id, 0, 1, queue)).disposition).toBe('empty');
    expect((await poll(session.id, 0, 2, queue)).disposition).toBe('empty');
    expect(await outcomeCode(poll(session.id, 0, 1, queue))).toBe('sequence_conflict');
    expect(await outcomeCode(poll(session.id, 0, 4, queue))).toBe('sequence_conflict');
    expect((await cursorsOf(session.id)).map((r) => Number(r.sequence))).toEqual([2]);
    await h.store.submit(submitCommand('seq', { queue }));
    // The replay of 2 is `empty` again although a task is now there; 3 claims it.
    expect(await poll(session.id, 0, 2, queue)).toEqual({ disposition: 'empty', sequence: 2 });
    expect((await poll(session.id, 0, 3, queue)).disposition).toBe('assigned');
  });

  it('two polls of one slot with the same new sequence at once, on two pools: one claim, the same assignment', async () => {
    const queue = 'same-slot';
    const other = h.makeStore(2);
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(submitCommand('same-slot-1', { queue }));
    await h.store.submit(submitCommand('same-slot-2', { queue }));
    const command = acquireCommand(session.id, 0, 1, queue);
    const [a, b] = await Promise.all([
      h.store.acquire(command, { recordEmpty: true }),
      other.acquire(command, { recordEmpty: true }),
    ]);
    const x = assigned(a.reply);
    const y = assigned(b.reply);
    expect(y.lease.owner).toEqual(x.lease.owner);
    expect(y.event).toEqual(x.event);
    expect(await activeAttemptsOf(session.id)).toHaveLength(1);
  });
});

describe('slots and their leases', () => {
  it('a consumer_id at the session concurrency is invalid_input and writes no cursor; the last slot polls', async () => {
    const queue = 'range';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 3 });
    await h.store.submit(submitCommand('range', { queue }));
    expect(await outcomeCode(poll(session.id, 3, 1, queue))).toBe('invalid_input');
    expect(await cursorsOf(session.id)).toHaveLength(0);
    expect((await h.sql`select state from tasks where idempotency_key = 'range'`)[0]?.state).toBe(
      'queued',
    );
    expect((await poll(session.id, 2, 1, queue)).disposition).toBe('assigned');
  });

  it('a slot whose lease lapsed (not yet recovered) polls again; the stale owner is fenced and recovery requeues its task', async () => {
    const queue = 'lapsed';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(submitCommand('lapsed-1', { queue }));
    const a = assigned(await poll(session.id, 0, 1, queue));
    await h.store.submit(submitCommand('lapsed-2', { queue }));
    // Live: the next poll of the slot is consumer_busy and moves nothing.
    expect(await outcomeCode(poll(session.id, 0, 2, queue))).toBe('consumer_busy');
    h.advance(2_100);
    const b = assigned(await poll(session.id, 0, 2, queue));
    expect(b.lease.owner.task_id).not.toBe(a.lease.owner.task_id);
    expect(await outcomeCode(h.store.renew(renewCommand(a.lease.owner, 1)))).toBe('ownership_lost');
    expect(await outcomeCode(h.store.settle(successCommand(a, 'lapsed-a')))).toBe('ownership_lost');
    // The poll that claimed `a` is no longer the slot's last: it cannot be replayed.
    expect(await outcomeCode(poll(session.id, 0, 1, queue))).toBe('sequence_conflict');
    await h.store.recoverExpiredLeases(100);
    const status = await h.store.status(SCOPE, a.lease.owner.task_id);
    expect(status.state).toBe('queued');
    // The slot still holds only `b`.
    expect((await activeAttemptsOf(session.id)).map((r) => r.attempt_id)).toEqual([
      b.lease.owner.attempt_id,
    ]);
  });

  it('a session that expires does not end the leases it holds: they renew and settle; its polls are 410, a replay too', async () => {
    const queue = 'expiry';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(submitCommand('expiry', { queue, timeout_ms: 600_000 }));
    const a = assigned(await poll(session.id, 0, 1, queue));
    let seq = 1;
    await h.store.renew(renewCommand(a.lease.owner, seq, 'dispatch'));
    // Keep the 2 s lease alive past the 60 s session.
    for (let moved = 0; moved <= 61_000; moved += 1_500) {
      h.advance(1_500);
      seq += 1;
      await h.store.renew(renewCommand(a.lease.owner, seq));
    }
    expect(await outcomeCode(poll(session.id, 0, 1, queue))).toBe('session_expired');
    expect(await outcomeCode(poll(session.id, 0, 2, queue))).toBe('session_expired');
    expect(await outcomeCode(h.store.extendSession(SCOPE, session.id))).toBe('session_expired');
    const reply = await h.store.settle(successCommand(a, 'expiry-op'));
    expect(reply.task_state).toBe('succeeded');
  });

  it('a session of another namespace is session_not_found, even with its own queue and slot', async () => {
    const queue = 'foreign';
    const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const foreign = { ...SCOPE, namespace: 'elsewhere' };
    expect(
      await outcomeCode(
        h.store.acquire(acquireCommand(session.id, 0, 1, queue, foreign), { recordEmpty: true }),
      ),
    ).toBe('session_not_found');
    expect(await outcomeCode(h.store.extendSession(foreign, session.id))).toBe('session_not_found');
  });
});
