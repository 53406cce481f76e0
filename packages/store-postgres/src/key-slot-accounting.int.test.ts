/**
 * Concurrency-key slot accounting end to end: many tasks of a few keys leave `active` by every
 * way there is — settled (success, final failure, retry re-queued at once so it races the next
 * claim, cancelled while active), recovered (lease expiry, the authority deadline of an
 * unconfirmed settlement), confirmed, settled twice (the same operation replayed on two replicas,
 * two different operations at once), settled late after `ownership_lost`, cancelled — on two
 * replicas claiming, settling and recovering at once, while submits (new, replayed, refused as a
 * conflict) create key rows and retention deletes idle ones. A monitor samples, in one statement
 * (one snapshot: a claim or release writes the key row and its tasks in one transaction), that
 * each key's `active` equals its tasks in state `active` and never passes the key's limit; at the
 * end every task is terminal (none stuck behind a key whose count drifted up) and every count 0.
 */
import {
  ACQUIRE_BATCH_REPLY_MAX_BYTES,
  type Assignment,
  ContractError,
  MIN_RETENTION_MS,
  type SettleCommand,
  SUBMISSION_DATA_MAX_BYTES,
  type SubmitCommand,
} from '@ledgence/contracts';
import type { ItemResult } from '@ledgence/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
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

/** Keys and their limits; every task of a key declares the same limit, so the limit is exact. */
const KEYS = [
  { key: 'slots-a', limit: 1 },
  { key: 'slots-b', limit: 2 },
  { key: 'slots-c', limit: 3 },
] as const;
/**
 * Keys of one entity each (a user, say), limit 1, a task or two apiece: idle between their tasks,
 * so retention deletes their rows while later tasks of theirs are submitted and claimed.
 */
const ENTITY_KEYS = Array.from({ length: 12 }, (_, i) => ({ key: `slots-u${i}`, limit: 1 }));
const LIMIT_OF = new Map<string, number>([...KEYS, ...ENTITY_KEYS].map((k) => [k.key, k.limit]));
/** Two queues: a key belongs to the namespace, so both queues' claims share its slots. */
const QUEUES = ['slots-q1', 'slots-q2'] as const;
const SLOTS = 4;
const ROUNDS = 36;

/** Codes a racing command may legitimately meet; anything else (a 5xx) is a finding. */
// `not_found`: a cancel of a task retention removed.
const EXPECTED = new Set(['conflict', 'ownership_lost', 'not_found']);

let h: Harness;
let replicas: PostgresTaskStore[];
beforeAll(async () => {
  h = await harness('key_slots');
  replicas = [h.store, h.makeStore(4)];
});
afterAll(() => h.close());

/**
 * A small seeded generator (mulberry32): every run draws from the same stream, though the order
 * in which concurrent steps draw from it varies with their interleaving.
 */
function generator(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

/**
 * Each key's broken promises, read in one statement: a count that is not its active tasks (a
 * missing row counts as 0), or active tasks past the key's limit.
 */
async function violations(): Promise<string[]> {
  const rows = await h.sql`
    with t as (
      select concurrency_key as key, count(*) filter (where state = 'active')::int as n
      from tasks
      where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and concurrency_key like 'slots-%'
      group by concurrency_key
    ), k as (
      select concurrency_key as key, active from concurrency_keys
      where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and concurrency_key like 'slots-%'
    )
    select coalesce(t.key, k.key) as key, coalesce(k.active, 0)::int as active,
      coalesce(t.n, 0)::int as n
    from t full join k on k.key = t.key`;
  const found: string[] = [];
  for (const row of rows) {
    const key = String(row.key);
    const active = Number(row.active);
    const n = Number(row.n);
    if (active !== n) found.push(`${key}: active ${active}, ${n} active tasks`);
    if (n > (LIMIT_OF.get(key) ?? 0))
      found.push(`${key}: ${n} active tasks, limit ${LIMIT_OF.get(key)}`);
  }
  return found;
}

it('every key’s count equals its active tasks and stays within its limit, through every exit from active', async () => {
  const random = generator(20_240_611);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)] as T;
  const unexpected: string[] = [];
  const sampled = new Set<string>();

  /** Runs a command whose rejection with an expected code is part of the race. */
  const tolerate = async <T>(what: string, run: () => Promise<T>): Promise<T | undefined> => {
    try {
      return await run();
    } catch (error) {
      if (error instanceof ContractError && EXPECTED.has(error.code)) return undefined;
      unexpected.push(`${what}: ${error instanceof Error ? error.message : String(error)}`);
      return undefined;
    }
  };
  const items = <T>(what: string, results: ItemResult<T>[]): T[] =>
    results.flatMap((r) => {
      if (r.ok) return [r.value];
      if (!EXPECTED.has(r.error.code)) unexpected.push(`${what}: ${r.error.message}`);
      return [];
    });

  // Every task created, by id, and every command sent (later replayed and contradicted).
  const created = new Set<string>();
  const commands: SubmitCommand[] = [];
  let serial = 0;
  const newCommand = (): SubmitCommand => {
    serial += 1;
    const roll = random();
    const keyed = roll < 0.6 ? pick(KEYS) : roll < 0.85 ? pick(ENTITY_KEYS) : undefined;
    return submitCommand(`slots-${serial}`, {
      queue: pick(QUEUES),
      priority: Math.floor(random() * 3) - 1,
      timeout_ms: 2_000,
      retry: { max_attempts: random() < 0.5 ? 1 : 3, delay_ms: 0 },
      ...(keyed === undefined
        ? {}
        : { concurrency_key: keyed.key, concurrency_limit: keyed.limit }),
    });
  };
  const submitSome = async (store: PostgresTaskStore, fresh: number): Promise<void> => {
    const batch = Array.from({ length: fresh }, newCommand);
    if (commands.length > 0) {
      const old = pick(commands);
      batch.push(old); // a replay: no task, no key row
      // A conflict: its idempotency key, held by a task of another concurrency key (or none).
      batch.push({
        ...old,
        input: { ...old.input, concurrency_key: 'slots-z', concurrency_limit: 1 },
      });
    }
    const outcomes = items('submit', await store.submitBatch(batch));
    for (const outcome of outcomes) if (outcome.created) created.add(outcome.snapshot.task_id);
    commands.push(...batch.slice(0, fresh));
  };

  // Assignments whose owner went quiet (abandoned, or settled unconfirmed and never confirmed):
  // a later round settles or confirms them late, racing recovery — most some rounds on, when
  // recovery has usually taken them, a few in the next round, while the lease may still run.
  let round = 0;
  const late: { assignment: Assignment; unconfirmed: boolean; due: number }[] = [];
  const quiet = (assignment: Assignment, unconfirmed: boolean) =>
    late.push({ assignment, unconfirmed, due: round + (random() < 0.25 ? 1 : 5) });
  let operation = 0;
  const op = () => {
    operation += 1;
    return `op-${operation}`;
  };
  const unconfirmed = (assignment: Assignment): SettleCommand =>
    successCommand(assignment, op(), { held: true }, 'unconfirmed');

  /** Drives one claimed attempt out of `active` by one of the ways there are, on either replica. */
  const fate = async (assignment: Assignment): Promise<void> => {
    const owner = assignment.lease.owner;
    const [one, other] = random() < 0.5 ? replicas : [...replicas].reverse();
    if (one === undefined || other === undefined) throw new Error('two replicas');
    const roll = Math.floor(random() * 13);
    // Most attempts start user code, so failures spend the retry budget and end.
    if (random() < 0.85) {
      await tolerate('dispatch', () => one.renew(renewCommand(owner, 1, 'dispatch')));
    }
    switch (roll) {
      case 0:
        await tolerate('success', () => one.settle(successCommand(assignment, op())));
        return;
      case 1: // re-queued at once: the retry races the next claims of its key
      case 2:
        await tolerate('retry', () => one.settle(failureCommand(assignment, op(), true)));
        return;
      case 3:
        await tolerate('fail', () => one.settle(failureCommand(assignment, op(), false)));
        return;
      case 4: {
        // Unconfirmed, then confirmed on the other replica while recovery runs.
        await tolerate('unconfirmed', () => one.settle(unconfirmed(assignment)));
        await Promise.all([
          tolerate('confirm', () => other.confirmQuiescence(owner)),
          tolerate('recover', () => one.recoverExpiredLeases(50)),
        ]);
        return;
      }
      case 5:
        // Unconfirmed and never confirmed: held until the authority deadline, then recovered.
        await tolerate('unconfirmed', () => one.settle(unconfirmed(assignment)));
        quiet(assignment, true);
        return;
      case 6: {
        // One operation replayed on both replicas at once: one settlement, one release.
        const command = successCommand(assignment, op());
        await Promise.all([
          tolerate('settle', () => one.settle(command)),
          tolerate('replay', () => other.settle(command)),
        ]);
        return;
      }
      case 7:
        // Two different settlements at once: one wins, the other is a conflict.
        await Promise.all([
          tolerate('settle', () => one.settle(failureCommand(assignment, op(), true))),
          tolerate('settle', () => other.settle(successCommand(assignment, op()))),
        ]);
        return;
      case 8:
        // Cancelled while active, settled on the other replica at the same time.
        await Promise.all([
          tolerate('cancel', () => one.cancel(SCOPE, owner.task_id)),
          tolerate('settle', () => other.settle(successCommand(assignment, op()))),
        ]);
        return;
      case 9: // the exit recovery alone takes, twice as often as the others
      case 11:
        // Abandoned: the lease expires, recovery re-queues or fails it, a late settle follows.
        quiet(assignment, false);
        return;
      case 10: {
        // One batch settling the attempt twice (a worker's retried flush): one release.
        const command = failureCommand(assignment, op(), random() < 0.5);
        items('settle batch', await one.settleBatch([command, command]));
        return;
      }
      default:
        // Cancelled while active, then abandoned: recovery cancels it.
        await tolerate('cancel', () => one.cancel(SCOPE, owner.task_id));
        quiet(assignment, false);
        return;
    }
  };

  /** Polls every slot of a new session per replica and queue, in one batch or one by one. */
  const claimRound = async (batched: boolean): Promise<Assignment[]> => {
    const claims = replicas.flatMap((store) =>
      QUEUES.map(async (queue) => {
        const session = await store.openSession({ scope: SCOPE, queue, concurrency: SLOTS });
        const polls = Array.from({ length: SLOTS }, (_, slot) =>
          acquireCommand(session.id, slot, 1, queue),
        );
        const replies = batched
          ? items('acquire', await store.acquireBatch(polls, { recordEmpty: true }))
          : (
              await Promise.all(
                polls.map((poll) =>
                  tolerate('acquire', () => store.acquire(poll, { recordEmpty: true })),
                ),
              )
            ).flatMap((r) => (r === undefined ? [] : [r]));
        return replies.flatMap((r) =>
          r.reply.disposition === 'assigned' ? [r.reply.assignment] : [],
        );
      }),
    );
    return (await Promise.all(claims)).flat();
  };

  // What recovery did over the run, on both replicas: the exits it is the one to take.
  const recovered = { requeued: 0, failed: 0, cancelled: 0, finalized: 0 };
  const recover = (store: PostgresTaskStore, limit?: number) =>
    tolerate('recover', async () => {
      const progress = await store.recoverExpiredLeases(limit);
      recovered.requeued += progress.requeued;
      recovered.failed += progress.failed;
      recovered.cancelled += progress.cancelled;
      recovered.finalized += progress.finalized;
    });

  let running = true;
  const monitor = (async () => {
    while (running) {
      for (const v of await violations()) sampled.add(v);
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
  })();
  try {
    await h.store.setRetentionPolicy(SCOPE, { retention_ms: MIN_RETENTION_MS });
    await submitSome(h.store, 60);
    // Each round's claims run beside the previous round's settles, retries, cancels, recoveries,
    // submits and collections: a retry re-queued at once races the claims of its key.
    let inFlight: Promise<unknown> = Promise.resolve();
    for (; round < ROUNDS; round += 1) {
      const [assigned] = await Promise.all([claimRound(round % 2 === 0), inFlight]);
      expect(await violations()).toEqual([]);
      // Past some leases (and now and then past retention, every task retired that can be).
      h.advance(round % 12 === 11 ? MIN_RETENTION_MS + 1_000 : Math.floor(random() * 1_500));
      const lateNow = late.filter((l) => l.due <= round);
      late.splice(0, late.length, ...late.filter((l) => l.due > round));
      const work: Promise<unknown>[] = [
        ...assigned.map(fate),
        ...replicas.map((store) => recover(store, 50)),
        submitSome(pick(replicas), 4),
        // Cancels of known tasks, queued or active.
        ...[0, 1].map(() =>
          tolerate('cancel', () => pick(replicas).cancel(SCOPE, pick([...created]))),
        ),
        // Late calls of quiet owners: ownership_lost, or taken while their lease still runs.
        ...lateNow.map(({ assignment, unconfirmed: held }) =>
          held
            ? tolerate('late confirm', () =>
                pick(replicas).confirmQuiescence(assignment.lease.owner),
              )
            : tolerate('late settle', () =>
                pick(replicas).settle(successCommand(assignment, op())),
              ),
        ),
      ];
      if (round % 6 === 5) {
        // Retention deletes idle keys' rows while claims, settles and submits of those keys run.
        work.push(
          ...replicas.map((store) => tolerate('collect', () => store.collectRetired(SCOPE))),
        );
      }
      inFlight = Promise.all(work);
    }
    await inFlight;

    // Drain: everything still queued or held must end, or a key's count kept it from running. A
    // key of limit 1 runs one task per pass: the passes are bounded by progress, not a count.
    for (let idle = 0; idle < 5; ) {
      h.advance(4_000);
      await Promise.all(replicas.map((store) => recover(store)));
      const assigned = await claimRound(true);
      await Promise.all(
        assigned.map((a) =>
          tolerate('drain', () => pick(replicas).settle(successCommand(a, op()))),
        ),
      );
      const [left] = await h.sql`select count(*)::int as n from tasks
        where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
          and state in ('queued', 'active')`;
      if (Number(left?.n) === 0) break;
      idle = assigned.length === 0 ? idle + 1 : 0;
    }
  } finally {
    running = false;
    await monitor;
  }

  expect(unexpected).toEqual([]);
  expect([...sampled]).toEqual([]);
  expect(await violations()).toEqual([]);
  const stuck = await h.sql`select task_id, state, concurrency_key from tasks
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
      and state in ('queued', 'active')`;
  expect(stuck).toEqual([]);
  const counts = await h.sql`select concurrency_key, active from concurrency_keys
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace} and active <> 0`;
  expect(counts).toEqual([]);
  // The run took the exits it means to: recovery re-queued, failed, cancelled and finalized.
  expect(created.size).toBeGreaterThan(150);
  expect(recovered.requeued).toBeGreaterThan(0);
  expect(recovered.failed).toBeGreaterThan(0);
  expect(recovered.cancelled).toBeGreaterThan(0);
  expect(recovered.finalized).toBeGreaterThan(0);
  // Every task is terminal: one more collection past retention leaves no key row behind.
  h.advance(MIN_RETENTION_MS + 1_000);
  for (;;) if (!(await h.store.collectRetired(SCOPE)).has_more) break;
  expect(
    await h.sql`select concurrency_key, active from concurrency_keys
    where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}`,
  ).toEqual([]);
}, 120_000);

it('a keyed task won for a poll and passed over for the reply budget gives its slot back', async () => {
  // As acquire-reply.int: tasks of the largest data, more than one batch reply holds, all of one
  // key whose limit takes them all, so only the reply budget holds any back.
  const scope = { tenant_id: SCOPE.tenant_id, namespace: 'slots-budget' };
  const queue = 'large';
  const data = 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2);
  const tasks = Math.ceil(ACQUIRE_BATCH_REPLY_MAX_BYTES / SUBMISSION_DATA_MAX_BYTES) + 4;
  for (let i = 0; i < tasks; i += 1) {
    await h.store.submit(
      submitCommand(`large-${i}`, {
        ...scope,
        queue,
        data,
        concurrency_key: 'big',
        concurrency_limit: tasks,
      }),
    );
  }
  const counts = async () => {
    const [row] = await h.sql`
      select (select active from concurrency_keys where tenant_id = ${scope.tenant_id}
          and namespace = ${scope.namespace} and concurrency_key = 'big') as active,
        (select count(*)::int from tasks where tenant_id = ${scope.tenant_id}
          and namespace = ${scope.namespace} and state = 'active') as n`;
    return { active: Number(row?.active), n: Number(row?.n) };
  };
  const session = await h.store.openSession({ scope, queue, concurrency: tasks });
  const poll = async (sequence: number, slots: number[]) =>
    (
      await h.store.acquireBatch(
        slots.map((slot) => ({ ...acquireCommand(session.id, slot, sequence, queue), scope })),
        { recordEmpty: true },
      )
    ).map((r) => {
      if (!r.ok) throw r.error;
      return r.value.reply.disposition;
    });
  const first = await poll(
    1,
    Array.from({ length: tasks }, (_, slot) => slot),
  );
  const assigned = first.filter((d) => d === 'assigned').length;
  expect(assigned).toBeLessThan(tasks);
  expect(await counts()).toEqual({ active: assigned, n: assigned });
  // The slots answered empty get the rest: the passed-over tasks' slots were free again.
  const emptySlots = first.flatMap((d, slot) => (d === 'empty' ? [slot] : []));
  const second = await poll(2, emptySlots);
  expect(second.filter((d) => d === 'assigned')).toHaveLength(tasks - assigned);
  expect(await counts()).toEqual({ active: tasks, n: tasks });
});
