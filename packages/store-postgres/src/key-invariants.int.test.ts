/**
 * Cancellation and concurrency keys under races, as a seeded randomized walk.
 *
 * Each seed drives a sequence of "waves"; a wave is 1..6 operations drawn from the seeded
 * generator (submit with keys and *different limits for the same key*, claim, renew with
 * dispatch/keep-alive, settle success / retry / final failure / unconfirmed, confirm quiescence,
 * cancel of any known task in whatever state it is, lease-expiry recovery, retention) run at once
 * with Promise.all on two replicas. Between waves the clock may move (past leases, past authority
 * deadlines, and now and then past retention). After every wave the invariants below are read in
 * one statement each, and any violation fails the test with the seed, the wave and the log of
 * every wave so far (the interleaving inside a wave is PostgreSQL's, the op sequence is the seed's).
 *
 * "Holding a slot" (store.ts flush: a release is written when a task row goes from `active` to
 * anything else; a claim takes it): the task is in state `active` — a live attempt, a lapsed but not
 * yet recovered lease, or a settlement held `unconfirmed` awaiting confirm_quiescence /
 * authority deadline. So for every key: `concurrency_keys.active` (missing row = 0) equals the
 * number of its tasks in state `active`.
 *
 * Limits: contracts/src/schemas/task.ts documents that each task is held to its own limit at claim
 * time. So the checked bound is: the number of active tasks of a key never exceeds the limit of the
 * most recently claimed active task of that key (which is what "claimed only while fewer than its
 * limit are active" implies, since counts only fall after that claim), and for keys whose tasks
 * all declare one limit, that limit.
 */
import {
  type Assignment,
  ContractError,
  MIN_RETENTION_MS,
  type SettleCommand,
} from '@ledgence/contracts';
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

/** One operation of a wave: its description for the log, and the call that runs it. */
type Op = () => [string, () => Promise<unknown>];

let h: Harness;
let replicas: PostgresTaskStore[];
beforeAll(async () => {
  h = await harness('ck_keys');
  replicas = [h.store, h.makeStore(4)];
});
afterAll(() => h.close());

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

/** Key → limits its tasks may declare (mixed on purpose for r-mix*, uniform for r-uni). */
const KEYS: Record<string, readonly number[]> = {
  'r-mix1': [1, 2, 3],
  'r-mix2': [1, 4],
  'r-uni': [2],
};
const QUEUES = ['rq1', 'rq2'] as const;
const EXPECTED = new Set([
  'conflict',
  'ownership_lost',
  'sequence_conflict',
  'not_found',
  'consumer_busy',
  'session_expired',
  'session_not_found',
]);

/** Every broken invariant, each read in one statement (one snapshot). */
async function violations(namespace: string): Promise<string[]> {
  const found: string[] = [];
  const scope = { t: SCOPE.tenant_id, n: namespace };
  // A: key counts equal active tasks; never negative.
  const counts = await h.sql`
    with t as (
      select concurrency_key as key, count(*) filter (where state = 'active')::int as n
      from tasks where tenant_id = ${scope.t} and namespace = ${scope.n}
        and concurrency_key is not null group by concurrency_key
    ), k as (
      select concurrency_key as key, active from concurrency_keys
      where tenant_id = ${scope.t} and namespace = ${scope.n}
    )
    select coalesce(t.key, k.key) as key, k.active as active, coalesce(t.n, 0)::int as n
    from t full join k on k.key = t.key`;
  for (const row of counts) {
    const active = row.active === null ? 0 : Number(row.active);
    if (active !== Number(row.n))
      found.push(`A ${row.key}: active=${active}, ${row.n} active tasks`);
    if (active < 0) found.push(`A ${row.key}: negative active ${active}`);
  }
  // B: the bound by the most recently claimed active task's limit (ties: the largest).
  const bounds = await h.sql`
    with a as (
      select t.concurrency_key as key, t.concurrency_limit as lim, at.claimed_at
      from tasks t join attempts at on at.tenant_id = t.tenant_id and at.namespace = t.namespace
        and at.task_id = t.task_id and at.attempt_id = t.current_attempt_id
      where t.tenant_id = ${scope.t} and t.namespace = ${scope.n} and t.state = 'active'
        and t.concurrency_key is not null
    ), latest as (select key, max(claimed_at) as at from a group by key)
    select a.key, count(*)::int as n,
      (select max(b.lim) from a b join latest l on l.key = b.key and b.claimed_at = l.at
        where b.key = a.key) as bound,
      max(a.lim) as max_lim, min(a.lim) as min_lim
    from a group by a.key`;
  for (const row of bounds) {
    if (Number(row.n) > Number(row.bound))
      found.push(`B ${row.key}: ${row.n} active, latest claim's limit ${row.bound}`);
    const limits = KEYS[String(row.key)] ?? [];
    if (limits.length === 1 && Number(row.n) > (limits[0] as number))
      found.push(`B ${row.key}: ${row.n} active, uniform limit ${limits[0]}`);
  }
  // C: active tasks <-> active attempts, one to one.
  const attempts = await h.sql`
    select t.task_id, t.state, t.current_attempt_id,
      (select count(*)::int from attempts a where a.tenant_id = t.tenant_id
        and a.namespace = t.namespace and a.task_id = t.task_id and a.state = 'active') as live,
      (select a.state from attempts a where a.tenant_id = t.tenant_id
        and a.namespace = t.namespace and a.task_id = t.task_id
        and a.attempt_id = t.current_attempt_id) as current_state
    from tasks t where t.tenant_id = ${scope.t} and t.namespace = ${scope.n}`;
  for (const row of attempts) {
    const live = Number(row.live);
    if (row.state === 'active') {
      if (live !== 1 || row.current_state !== 'active')
        found.push(
          `C ${row.task_id}: active with ${live} live attempts, current ${row.current_state}`,
        );
    } else if (live !== 0 || row.current_attempt_id !== null) {
      found.push(
        `C ${row.task_id}: ${row.state} with ${live} live attempts, current ${row.current_attempt_id}`,
      );
    }
  }
  // D/E: cancellation and history.
  const tasks = await h.sql`
    select t.task_id, t.state, t.cancel_requested_at, t.history_sequence, t.outcome,
      coalesce((select array_agg(hh.reason order by hh.sequence) from task_history hh
        where hh.tenant_id = t.tenant_id and hh.namespace = t.namespace and hh.task_id = t.task_id),
        '{}') as reasons,
      coalesce((select array_agg(hh.sequence order by hh.sequence) from task_history hh
        where hh.tenant_id = t.tenant_id and hh.namespace = t.namespace and hh.task_id = t.task_id),
        '{}') as seqs
    from tasks t where t.tenant_id = ${scope.t} and t.namespace = ${scope.n}`;
  const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
  for (const row of tasks) {
    const reasons = row.reasons as string[];
    const seqs = (row.seqs as (number | string)[]).map(Number);
    const id = String(row.task_id);
    const trail = reasons.join(',');
    if (seqs.some((s, i) => s !== i + 1) || seqs.length !== Number(row.history_sequence))
      found.push(`E ${id}: history sequence ${seqs.join(',')} vs ${row.history_sequence}`);
    if (row.cancel_requested_at !== null && row.state === 'queued')
      found.push(`D ${id}: queued with cancel_requested_at (${trail})`);
    const firstCancel = reasons.findIndex((r) => r === 'cancel_requested' || r === 'cancelled');
    if (firstCancel !== -1) {
      const after = reasons.slice(firstCancel + 1);
      for (const bad of ['claimed', 'retry_scheduled', 'dispatch_authorized'])
        if (after.includes(bad)) found.push(`D ${id}: ${bad} after cancel (${trail})`);
    }
    const terminals = reasons.filter((r) => TERMINAL.has(r));
    if (TERMINAL.has(String(row.state))) {
      if (terminals.length !== 1 || terminals[0] !== row.state)
        found.push(
          `E ${id}: state ${row.state}, terminal events ${terminals.join(',')} (${trail})`,
        );
      const outcome = row.outcome as { state?: string } | null;
      if (outcome?.state !== row.state)
        found.push(`E ${id}: outcome ${outcome?.state} vs ${row.state}`);
    } else if (terminals.length !== 0) {
      found.push(`E ${id}: ${row.state} after terminal events (${trail})`);
    }
    if (row.state === 'cancelled' && row.cancel_requested_at === null)
      found.push(`D ${id}: cancelled without cancel_requested_at`);
  }
  return found;
}

interface Held {
  assignment: Assignment;
  seq: number;
}

async function walk(
  seed: number,
  waves: number,
): Promise<{ log: string[]; unexpected: string[]; stats: Record<string, number> }> {
  const namespace = `ck-${seed}`;
  const scope = { tenant_id: SCOPE.tenant_id, namespace };
  const random = generator(seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)] as T;
  const log: string[] = [];
  const unexpected: string[] = [];
  const stats: Record<string, number> = {};
  const bump = (k: string) => {
    stats[k] = (stats[k] ?? 0) + 1;
  };
  const created: string[] = [];
  const held: Held[] = [];
  let serial = 0;
  let op = 0;
  /** A held assignment, mostly a recent one (older ones are usually stale: ownership_lost). */
  const pickHeld = (): Held => (random() < 0.8 ? pick(held.slice(-6)) : pick(held));

  const tolerate = async <T>(what: string, run: () => Promise<T>): Promise<T | undefined> => {
    try {
      const value = await run();
      bump(`${what}:ok`);
      return value;
    } catch (error) {
      if (error instanceof ContractError && EXPECTED.has(error.code)) {
        bump(`${what}:${error.code}`);
        return undefined;
      }
      unexpected.push(
        `${what}: ${error instanceof Error ? `${error.name} ${error.message}` : String(error)}`,
      );
      return undefined;
    }
  };

  const ops: { submit: Op; claim: Op; [name: string]: Op } = {
    submit: () => {
      serial += 1;
      const roll = random();
      const keyName = roll < 0.8 ? pick(Object.keys(KEYS)) : undefined;
      const limit = keyName === undefined ? undefined : pick(KEYS[keyName] as number[]);
      const delay = random() < 0.25 ? Math.floor(random() * 3_000) : 0;
      const attempts = 1 + Math.floor(random() * 3);
      const command = submitCommand(`ck-${seed}-${serial}`, {
        ...scope,
        queue: pick(QUEUES),
        timeout_ms: 2_000,
        delay_ms: delay,
        retry: { max_attempts: attempts, delay_ms: random() < 0.5 ? 0 : 500 },
        ...(keyName === undefined ? {} : { concurrency_key: keyName, concurrency_limit: limit }),
      });
      const store = pick(replicas);
      return [
        `submit ${serial} key=${keyName ?? '-'} limit=${limit ?? '-'} delay=${delay} max=${attempts}`,
        async () => {
          const r = await tolerate('submit', () => store.submit(command));
          if (r?.created) created.push(r.snapshot.task_id);
        },
      ];
    },
    claim: () => {
      const store = pick(replicas);
      const queue = pick(QUEUES);
      const slots = 1 + Math.floor(random() * 3);
      const batched = random() < 0.5;
      return [
        `claim ${queue} slots=${slots} ${batched ? 'batch' : 'single'}`,
        async () => {
          const session = await store.openSession({ scope, queue, concurrency: slots });
          const polls = Array.from({ length: slots }, (_, s) =>
            acquireCommand(session.id, s, 1, queue, scope),
          );
          const replies = batched
            ? (await store.acquireBatch(polls, { recordEmpty: true })).flatMap((r) => {
                if (r.ok) return [r.value];
                if (!EXPECTED.has(r.error.code)) unexpected.push(`acquire: ${r.error.message}`);
                return [];
              })
            : (
                await Promise.all(
                  polls.map((p) =>
                    tolerate('acquire', () => store.acquire(p, { recordEmpty: true })),
                  ),
                )
              ).flatMap((r) => (r === undefined ? [] : [r]));
          for (const r of replies)
            if (r.reply.disposition === 'assigned') {
              bump('claimed');
              held.push({ assignment: r.reply.assignment, seq: 0 });
            }
        },
      ];
    },
    renew: () => {
      if (held.length === 0) return ops.submit();
      const hh = pickHeld();
      const intent = random() < 0.6 ? 'dispatch' : 'keep_alive';
      const store = pick(replicas);
      return [
        `renew ${hh.assignment.lease.owner.task_id} ${intent}`,
        async () => {
          const seq = hh.seq + 1;
          const a = await tolerate('renew', () =>
            store.renew(renewCommand(hh.assignment.lease.owner, seq, intent)),
          );
          if (a !== undefined) {
            hh.seq = Math.max(hh.seq, seq);
            if (a.dispatch_allowed) bump('dispatch_granted');
          }
        },
      ];
    },
    settle: () => {
      if (held.length === 0) return ops.claim();
      const hh = pickHeld();
      const kind = Math.floor(random() * 6);
      op += 1;
      const id = `op-${seed}-${op}`;
      const command: SettleCommand =
        kind === 0
          ? successCommand(hh.assignment, id)
          : kind === 1
            ? failureCommand(hh.assignment, id, true)
            : kind === 2
              ? failureCommand(hh.assignment, id, false)
              : kind === 3
                ? successCommand(hh.assignment, id, { held: true }, 'unconfirmed')
                : kind === 4
                  ? { ...failureCommand(hh.assignment, id, true), quiescence: 'unconfirmed' }
                  : failureCommand(hh.assignment, id, true);
      const store = pick(replicas);
      const twice = kind === 5; // the same operation on both replicas at once
      return [
        `settle ${hh.assignment.lease.owner.task_id} kind=${['success', 'retry', 'fail', 'success-unconfirmed', 'retry-unconfirmed', 'retry-x2'][kind]}`,
        async () => {
          if (twice) {
            await Promise.all(replicas.map((r) => tolerate('settle', () => r.settle(command))));
          } else await tolerate('settle', () => store.settle(command));
        },
      ];
    },
    confirm: () => {
      if (held.length === 0) return ops.claim();
      const hh = pickHeld();
      const store = pick(replicas);
      return [
        `confirm ${hh.assignment.lease.owner.task_id}`,
        () => tolerate('confirm', () => store.confirmQuiescence(hh.assignment.lease.owner)),
      ];
    },
    cancel: () => {
      if (created.length === 0) return ops.submit();
      // Prefer tasks that are held (active) half of the time.
      const id =
        held.length > 0 && random() < 0.5
          ? pickHeld().assignment.lease.owner.task_id
          : pick(created);
      const store = pick(replicas);
      return [
        `cancel ${id}`,
        async () => {
          // Coverage only: what state the cancel is aimed at (read just before, unlocked).
          const [row] = await h.sql`select t.state, t.cancel_requested_at is not null as req,
              t.available_at > ${await h.store.now()}::bigint as delayed,
              (select a.pending is not null from attempts a where a.tenant_id = t.tenant_id
                and a.namespace = t.namespace and a.task_id = t.task_id
                and a.attempt_id = t.current_attempt_id) as held,
              (select a.dispatch_allowed from attempts a where a.tenant_id = t.tenant_id
                and a.namespace = t.namespace and a.task_id = t.task_id
                and a.attempt_id = t.current_attempt_id) as dispatched
            from tasks t where t.tenant_id = ${scope.tenant_id} and t.namespace = ${namespace}
              and t.task_id = ${id}`;
          if (row)
            bump(
              `cancel@${row.state}${row.req ? '+requested' : ''}${row.held ? '+held' : ''}${row.dispatched ? '+dispatched' : ''}${row.delayed ? '+delayed' : ''}`,
            );
          await tolerate('cancel', () => store.cancel(scope, id));
        },
      ];
    },
    recover: () => {
      const store = pick(replicas);
      const limit = 1 + Math.floor(random() * 5);
      return [
        `recover limit=${limit}`,
        async () => {
          const p = await tolerate('recover', () => store.recoverExpiredLeases(limit));
          if (p) {
            stats.recovered_requeued = (stats.recovered_requeued ?? 0) + p.requeued;
            stats.recovered_cancelled = (stats.recovered_cancelled ?? 0) + p.cancelled;
            stats.recovered_failed = (stats.recovered_failed ?? 0) + p.failed;
            stats.recovered_finalized = (stats.recovered_finalized ?? 0) + p.finalized;
          }
        },
      ];
    },
    collect: () => {
      const store = pick(replicas);
      return ['collect', () => tolerate('collect', () => store.collectRetired(scope))];
    },
  };
  const weights: [string, number][] = [
    ['submit', 5],
    ['claim', 5],
    ['renew', 4],
    ['settle', 5],
    ['confirm', 2],
    ['cancel', 5],
    ['recover', 3],
    ['collect', 1],
  ];
  const total = weights.reduce((s, [, w]) => s + w, 0);
  const draw = (): string => {
    let x = random() * total;
    for (const [name, w] of weights) {
      x -= w;
      if (x < 0) return name;
    }
    return 'submit';
  };

  await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
  for (let wave = 0; wave < waves; wave += 1) {
    if (wave % 25 === 0) {
      const burst = 12;
      const made = Array.from({ length: burst }, () => ops.submit());
      log.push(`#${wave} burst [${made.map(([d]) => d).join(' | ')}]`);
      await Promise.all(made.map(([, run]) => run()));
    }
    const roll = random();
    if (roll < 0.02) {
      h.advance(MIN_RETENTION_MS + 1_000);
      log.push(`#${wave} advance retention`);
    } else if (roll < 0.25) {
      const ms = Math.floor(random() * 2_500);
      h.advance(ms);
      log.push(`#${wave} advance ${ms}`);
    }
    const n = 1 + Math.floor(random() * Number(process.env.KEY_CHECK_WAVE_MAX ?? 6));
    const chosen = Array.from({ length: n }, () => {
      const name = draw();
      const op = ops[name];
      if (op === undefined) throw new Error(`no operation ${name}`);
      return op();
    });
    log.push(`#${wave} [${chosen.map(([d]) => d).join(' | ')}]`);
    await Promise.all(chosen.map(([, run]) => run()));
    const v = await violations(namespace);
    if (v.length > 0 || unexpected.length > 0) {
      return { log: [...log, `VIOLATIONS after #${wave}: ${v.join('; ')}`], unexpected, stats };
    }
  }
  // Drain: recover, settle everything, claim what remains; every count must end 0.
  for (let i = 0; i < 40; i += 1) {
    h.advance(4_000);
    await tolerate('recover', () => h.store.recoverExpiredLeases());
    for (const queue of QUEUES) {
      const session = await h.store.openSession({ scope, queue, concurrency: 4 });
      const replies = await h.store.acquireBatch(
        Array.from({ length: 4 }, (_, s) => acquireCommand(session.id, s, 1, queue, scope)),
        { recordEmpty: true },
      );
      for (const r of replies)
        if (r.ok && r.value.reply.disposition === 'assigned') {
          op += 1;
          await tolerate('drain', () =>
            h.store.settle(
              successCommand(
                r.value.reply.disposition === 'assigned'
                  ? r.value.reply.assignment
                  : (undefined as never),
                `d-${op}`,
              ),
            ),
          );
        }
    }
    const v = await violations(namespace);
    if (v.length > 0)
      return { log: [...log, `VIOLATIONS in drain: ${v.join('; ')}`], unexpected, stats };
    const [left] =
      await h.sql`select count(*)::int as n from tasks where tenant_id = ${scope.tenant_id}
      and namespace = ${namespace} and state in ('queued','active')`;
    if (Number(left?.n) === 0) break;
  }
  const [left] =
    await h.sql`select count(*)::int as n from tasks where tenant_id = ${scope.tenant_id}
      and namespace = ${namespace} and state in ('queued','active')`;
  if (Number(left?.n) !== 0) log.push(`STUCK: ${left?.n} tasks not terminal after drain`);
  const nonzero = await h.sql`select concurrency_key, active from concurrency_keys
    where tenant_id = ${scope.tenant_id} and namespace = ${namespace} and active <> 0`;
  if (nonzero.length > 0) log.push(`NONZERO: ${JSON.stringify(nonzero)}`);
  return { log, unexpected, stats };
}

const SEEDS = (process.env.KEY_CHECK_SEEDS ?? '1,2,3,4,5,6,7,8').split(',').map(Number);
const WAVES = Number(process.env.KEY_CHECK_WAVES ?? 80);

for (const seed of SEEDS) {
  it(`seed ${seed}: key counts equal holders, limits hold, cancel is final, after every wave`, async () => {
    const { log, unexpected, stats } = await walk(seed, WAVES);
    const bad = log.filter((l) => /VIOLATIONS|STUCK|NONZERO/.test(l));
    if (bad.length > 0 || unexpected.length > 0 || process.env.KEY_CHECK_VERBOSE) {
      console.log(
        `seed ${seed}\n${log.join('\n')}\nunexpected: ${unexpected.join('\n')}\n${JSON.stringify(stats)}`,
      );
    }
    expect(unexpected).toEqual([]);
    expect(bad).toEqual([]);
  }, 120_000);
}

it('the checker itself sees a drifted count and a limit overrun', async () => {
  const namespace = 'ck-selfcheck';
  const scope = { tenant_id: SCOPE.tenant_id, namespace };
  for (let i = 0; i < 2; i += 1)
    await h.store.submit(
      submitCommand(`self-${i}`, {
        ...scope,
        queue: 'rq1',
        concurrency_key: 'r-uni',
        concurrency_limit: 2,
      }),
    );
  const session = await h.store.openSession({ scope, queue: 'rq1', concurrency: 2 });
  await h.store.acquireBatch(
    [0, 1].map((s) => acquireCommand(session.id, s, 1, 'rq1', scope)),
    { recordEmpty: true },
  );
  expect(await violations(namespace)).toEqual([]);
  await h.sql`update concurrency_keys set active = active + 1
    where tenant_id = ${scope.tenant_id} and namespace = ${namespace}`;
  expect((await violations(namespace)).some((v) => v.startsWith('A r-uni'))).toBe(true);
  await h.sql`update tasks set concurrency_limit = 1
    where tenant_id = ${scope.tenant_id} and namespace = ${namespace}`;
  expect((await violations(namespace)).some((v) => v.startsWith('B r-uni'))).toBe(true);
});
