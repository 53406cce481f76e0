/**
 * Lease paths item by item: a concurrency key's count through every way a task leaves `active`,
 * duplicates inside renew and acquire batches answered as if alone (DESIGN §7.1), replays after
 * the task was leased again, attempt counting in recovery, and a batch that fails as a whole.
 */
import type { Assignment, ContractError } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  failureCommand,
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
  h = await harness('lease_paths');
});
afterAll(() => h.close());

async function keyActive(key: string): Promise<number> {
  const rows = await h.sql`select active from concurrency_keys
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace} and concurrency_key = ${key}`;
  return rows.length === 0 ? -1 : Number(rows[0]?.active);
}

async function activeWithKey(key: string): Promise<number> {
  const [row] = await h.sql`select count(*)::int as n from tasks
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
      and concurrency_key = ${key} and state = 'active'`;
  return Number(row?.n);
}

async function assign(queue: string, session: string, consumer: number, sequence: number) {
  const { reply } = await h.store.acquire(acquireCommand(session, consumer, sequence, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned')
    throw new Error(`expected assigned, got ${reply.disposition}`);
  return reply.assignment;
}

describe('concurrency key counts follow the active tasks', () => {
  it('settle success / retry / unconfirmed+confirm / recovery paths keep the count equal to active tasks', async () => {
    const queue = 'ck1';
    const key = 'ck1';
    const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 4 });
    await h.store.submit(
      submitCommand('ck1-a', {
        queue,
        concurrency_key: key,
        concurrency_limit: 2,
        retry: { max_attempts: 3, delay_ms: 1 },
      }),
    );
    await h.store.submit(
      submitCommand('ck1-b', {
        queue,
        concurrency_key: key,
        concurrency_limit: 2,
        retry: { max_attempts: 3, delay_ms: 1 },
      }),
    );
    const a1 = await assign(queue, s.id, 0, 1);
    const b1 = await assign(queue, s.id, 1, 1);
    expect(await keyActive(key)).toBe(2);
    // a: failure, retried; b: unconfirmed settle.
    await h.store.renew(renewCommand(a1.lease.owner, 1, 'dispatch'));
    await h.store.settle(failureCommand(a1, 'a1'));
    expect(await keyActive(key)).toBe(await activeWithKey(key));
    await h.store.settle(successCommand(b1, 'b1', { ok: 1 }, 'unconfirmed'));
    expect(await keyActive(key)).toBe(1);
    await h.store.confirmQuiescence(b1.lease.owner);
    expect(await keyActive(key)).toBe(0);
    h.advance(10);
    const a2 = await assign(queue, s.id, 0, 2);
    expect(await keyActive(key)).toBe(1);
    // lease expiry → recovery requeues, then the re-claim takes it again.
    h.advance(3_000);
    await h.store.recoverExpiredLeases();
    expect(await keyActive(key)).toBe(await activeWithKey(key));
    h.advance(5_000);
    const a3 = await assign(queue, s.id, 0, 3);
    expect(a3.lease.owner.task_id).toBe(a2.lease.owner.task_id);
    expect(await keyActive(key)).toBe(1);
    await h.store.cancel(SCOPE, a3.lease.owner.task_id);
    h.advance(3_000);
    await h.store.recoverExpiredLeases();
    expect(await keyActive(key)).toBe(0);
    expect(await activeWithKey(key)).toBe(0);
  });
});

describe('renew batches with duplicates behave as alone', () => {
  it('[seq1 dispatch, seq1 dispatch, seq2 keep, seq2 keep]', async () => {
    const queue = 'rb1';
    const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(submitCommand('rb1', { queue }));
    const a = await assign(queue, s.id, 0, 1);
    const o = a.lease.owner;
    const results = await h.store.renewBatch([
      renewCommand(o, 1, 'dispatch'),
      renewCommand(o, 1, 'dispatch'),
      renewCommand(o, 2),
      renewCommand(o, 2),
      renewCommand(o, 1, 'dispatch'),
      renewCommand(o, 4),
    ]);
    const summary = results.map((r) =>
      r.ok
        ? `${r.value.renew_sequence}:${r.value.dispatch_allowed}`
        : (r.error as ContractError).code,
    );
    expect(summary).toEqual([
      '1:true',
      '1:true',
      '2:true',
      '2:true',
      'sequence_conflict',
      'sequence_conflict',
    ]);
    const hist = await h.store.history(SCOPE, o.task_id, 0);
    expect(hist.filter((e) => e.event.reason === 'dispatch_authorized')).toHaveLength(1);
    const [row] = await h.sql`select dispatch_count from tasks where task_id = ${o.task_id}`;
    expect(row?.dispatch_count).toBe(1);
  });
});

describe('acquire batches: same slot twice', () => {
  it('[seq1, seq1] of one slot: the second replays the first', async () => {
    const queue = 'ab1';
    const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
    await h.store.submit(submitCommand('ab1-a', { queue }));
    await h.store.submit(submitCommand('ab1-b', { queue }));
    const out = await h.store.acquireBatch(
      [
        acquireCommand(s.id, 0, 1, queue),
        acquireCommand(s.id, 0, 1, queue),
        acquireCommand(s.id, 0, 2, queue),
      ],
      { recordEmpty: true },
    );
    const r0 = out[0];
    const r1 = out[1];
    expect(r0?.ok && r0.value.reply.disposition).toBe('assigned');
    expect(r1?.ok && r1.value.reply.disposition).toBe('assigned');
    if (
      r0?.ok &&
      r1?.ok &&
      r0.value.reply.disposition === 'assigned' &&
      r1.value.reply.disposition === 'assigned'
    ) {
      expect(r1.value.reply.assignment.lease).toEqual(r0.value.reply.assignment.lease);
    }
    expect(out[2]?.ok === false && (out[2].error as ContractError).code).toBe('consumer_busy');
  });
});

describe('replay after the task was re-claimed by another owner', () => {
  it('answers ownership_lost, never the new owner', async () => {
    const queue = 'rp1';
    const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 2 });
    await h.store.submit(submitCommand('rp1', { queue, retry: { max_attempts: 3, delay_ms: 1 } }));
    const a1 = await assign(queue, s.id, 0, 1);
    h.advance(3_000);
    await h.store.recoverExpiredLeases();
    h.advance(2_000);
    const a2 = await assign(queue, s.id, 1, 1);
    expect(a2.lease.owner.task_id).toBe(a1.lease.owner.task_id);
    const { reply } = await h.store.acquire(acquireCommand(s.id, 0, 1, queue), {
      recordEmpty: true,
    });
    expect(reply.disposition).toBe('ownership_lost');
  });
});

describe('recovery counts and cancel', () => {
  it('never-dispatched lost attempts do not count; cancel_requested → cancelled', async () => {
    const queue = 'rc1';
    const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
    await h.store.submit(submitCommand('rc1', { queue, retry: { max_attempts: 1, delay_ms: 1 } }));
    let seq = 0;
    let a: Assignment | undefined;
    for (let i = 0; i < 3; i += 1) {
      seq += 1;
      a = await assign(queue, s.id, 0, seq);
      h.advance(3_000);
      const p = await h.store.recoverExpiredLeases();
      expect(p.requeued).toBeGreaterThanOrEqual(1);
      h.advance(2_000);
    }
    seq += 1;
    a = await assign(queue, s.id, 0, seq);
    await h.store.renew(renewCommand(a.lease.owner, 1, 'dispatch'));
    await h.store.cancel(SCOPE, a.lease.owner.task_id);
    h.advance(3_000);
    await h.store.recoverExpiredLeases();
    const st = await h.store.status(SCOPE, a.lease.owner.task_id);
    expect(st.state).toBe('cancelled');
    expect(st.attempt_count).toBe(4);
    expect(await outcomeCode(h.store.renew(renewCommand(a.lease.owner, 2)))).toBe('ownership_lost');
  });
});

describe('a batch that fails as a whole is retried item by item', () => {
  it('acquire: replies as alone, and the key count equals the active keyed tasks', async () => {
    const queue = 'fb1';
    const key = 'fb1k';
    await h.sql`create sequence if not exists injected_fail_fb1`;
    await h.sql`
      create or replace function injected_fail_fb1() returns trigger language plpgsql as $$
      begin
        if exists (
          select 1 from worker_sessions w where w.session_id = new.worker_session_id and w.queue = 'fb1')
          and nextval('injected_fail_fb1') = 1 then
          raise exception 'injected batch failure';
        end if;
        return new;
      end $$`;
    await h.sql`create trigger injected_fail_fb1 before insert or update on consumer_cursors
      for each row execute function injected_fail_fb1()`;
    try {
      const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 3 });
      for (const n of ['a', 'b', 'c']) {
        await h.store.submit(
          submitCommand(`fb1-${n}`, { queue, concurrency_key: key, concurrency_limit: 2 }),
        );
      }
      const out = await h.store.acquireBatch(
        [0, 1, 2].map((c) => acquireCommand(s.id, c, 1, queue)),
        { recordEmpty: true },
      );
      const kinds = out.map((r) =>
        r.ok ? r.value.reply.disposition : (r.error as ContractError).code,
      );
      const [seq] = await h.sql`select last_value::int as v from injected_fail_fb1`;
      expect(Number(seq?.v)).toBeGreaterThan(1); // the injected failure fired, items ran again
      expect(kinds).toEqual(['assigned', 'assigned', 'empty']);
      expect(await keyActive(key)).toBe(2);
      expect(await activeWithKey(key)).toBe(2);
    } finally {
      await h.sql`drop trigger injected_fail_fb1 on consumer_cursors`;
    }
  });
});
