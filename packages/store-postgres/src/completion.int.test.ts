/**
 * Completion subscriptions on PostgreSQL (DESIGN §8, seed `CompletionStore`): the terminal hook
 * runs in the terminal transition's transaction (never a committed terminal task with a waiting
 * subscription, checked from a second connection while settles and subscribes race), concurrent
 * senders lease disjoint rows, stale reports change nothing, expired leases are leased again, and
 * the set-based lease and report statements agree with the core's pure transitions row by row —
 * reports sent together too: each answered by its own row, in any order, beside stale copies,
 * with text an array literal must escape.
 */
import {
  type Assignment,
  COMPLETION_MAX_ATTEMPTS,
  ContractError,
  fitText,
  MESSAGE_MAX_BYTES,
  type Scope,
} from '@ledgence/contracts';
import {
  type CompletionLease,
  type DeliveryReport,
  leaseDelivery,
  reportDelivery,
  type SubscriptionRow,
} from '@ledgence/core';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { subscriptionFromDb } from './codec.js';
import {
  acquireCommand,
  failureCommand,
  type Harness,
  harness,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('completion');
});
afterAll(() => h.close());

// Leasing is global (every scope), so each test starts with no leasable delivery left behind.
beforeEach(async () => {
  await h.sql`
    update completion_deliveries set state = 'delivered', next_attempt_at = null,
      finished_at = 0, delivered_at = 0
    where state in ('due', 'delivering')`;
});

const subscribeTo = (key: string, destination = 'billing') => ({
  subscription_key: key,
  destination,
});

async function submitted(key: string, scope: Scope = SCOPE): Promise<string> {
  const { snapshot } = await h.store.submit(
    submitCommand(key, { tenant_id: scope.tenant_id, namespace: scope.namespace }),
  );
  return snapshot.task_id;
}

/** A task that is terminal (cancelled while queued), through the store. */
async function terminalTask(key: string): Promise<string> {
  const taskId = await submitted(key);
  await h.store.cancel(SCOPE, taskId);
  return taskId;
}

/** Claims `count` tasks of `queue` with one session; returns their assignments. */
async function claimAll(queue: string, count: number): Promise<Assignment[]> {
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: count });
  const replies = await h.store.acquireBatch(
    Array.from({ length: count }, (_, slot) => acquireCommand(session.id, slot, 1, queue)),
    { recordEmpty: true },
  );
  return replies.map((r) => {
    if (!r.ok || r.value.reply.disposition !== 'assigned') throw new Error('expected a claim');
    return r.value.reply.assignment;
  });
}

async function row(subscriptionId: string): Promise<SubscriptionRow> {
  const [found] = await h.sql`
    select s.*, d.state, d.generation, d.attempts, d.next_attempt_at, d.delivered_at,
      d.finished_at, d.last_status_code, d.last_error
    from completion_subscriptions s join completion_deliveries d using (tenant_id, namespace,
      subscription_id)
    where s.subscription_id = ${subscriptionId}`;
  if (found === undefined) throw new Error(`no subscription ${subscriptionId}`);
  return subscriptionFromDb(found);
}

/** `count` terminal tasks each with one due delivery, seeded set-based (fast). */
async function seedDue(prefix: string, count: number, dueAt = 0): Promise<void> {
  await h.sql`
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
      input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
      available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, ${prefix} || g, 'run_' || ${prefix} || g,
      ${prefix} || g, 'x', '{}', 'q', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}',
      300000, 0, '{}', 'succeeded', 1, 1, 2, 1, 1, '{"state":"succeeded"}', 3
    from generate_series(1, ${count}::int) as g`;
  await h.sql`
    insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
      subscription_key, destination, event_id, created_at)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub_' || ${prefix} || g, ${prefix} || g,
      'k', 'billing', 'evt_' || ${prefix} || g, 2
    from generate_series(1, ${count}::int) as g`;
  await h.sql`
    insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
      generation, attempts, next_attempt_at)
    select ${SCOPE.tenant_id}, ${SCOPE.namespace}, 'sub_' || ${prefix} || g, ${prefix} || g,
      'due', 1, 0, ${dueAt}::bigint
    from generate_series(1, ${count}::int) as g`;
}

function expectCode(error: unknown, code: string): void {
  expect(error).toBeInstanceOf(ContractError);
  expect((error as ContractError).code).toBe(code);
}

describe('subscribe, list and the terminal hook', () => {
  it('a waiting subscription becomes due in the transaction that settles its task', async () => {
    await h.store.submit(submitCommand('hook-settle', { queue: 'hook' }));
    const [assignment] = await claimAll('hook', 1);
    if (assignment === undefined) throw new Error('no claim');
    const taskId = assignment.lease.owner.task_id;
    const first = await h.store.subscribe(SCOPE, taskId, subscribeTo('a'));
    expect(first.created).toBe(true);
    expect(first.subscription).toMatchObject({ state: 'waiting', generation: 1, attempts: 0 });
    expect(first.subscription.next_attempt_at).toBeUndefined();
    await h.store.settle(successCommand(assignment, 'op'));
    const status = await h.store.status(SCOPE, taskId);
    const [listed] = await h.store.listSubscriptions(SCOPE, taskId);
    expect(listed).toMatchObject({ id: first.subscription.id, state: 'due' });
    // markDue's time is the transition's own: the task's terminal_at.
    expect(listed?.next_attempt_at).toBe(status.terminal_at);
  });

  it('subscribing to a terminal task is due at once; a key is idempotent and bound', async () => {
    const taskId = await terminalTask('hook-terminal');
    const created = await h.store.subscribe(SCOPE, taskId, subscribeTo('k1'));
    expect(created.created).toBe(true);
    expect(created.subscription.state).toBe('due');
    expect(created.subscription.next_attempt_at).toBeTypeOf('number');
    const again = await h.store.subscribe(SCOPE, taskId, subscribeTo('k1'));
    expect(again).toEqual({ created: false, subscription: created.subscription });
    const conflict = await h.store
      .subscribe(SCOPE, taskId, subscribeTo('k1', 'other'))
      .catch((e) => e);
    expectCode(conflict, 'conflict');
    const second = await h.store.subscribe(SCOPE, taskId, subscribeTo('k2'));
    const list = await h.store.listSubscriptions(SCOPE, taskId);
    expect(list.map((s) => s.id)).toEqual([created.subscription.id, second.subscription.id]);
    expect(created.subscription.event_id).not.toBe(second.subscription.event_id);
  });

  it('answers not_found for a missing task or subscription, and limit_exceeded past 16', async () => {
    expectCode(
      await h.store.subscribe(SCOPE, 'tsk_nope', subscribeTo('x')).catch((e) => e),
      'not_found',
    );
    expectCode(await h.store.listSubscriptions(SCOPE, 'tsk_nope').catch((e) => e), 'not_found');
    expectCode(
      await h.store.redeliver(SCOPE, 'sub_nope', { generation: 1 }).catch((e) => e),
      'not_found',
    );
    const taskId = await submitted('limit');
    expect(await h.store.listSubscriptions(SCOPE, taskId)).toEqual([]);
    // Another scope does not see the task.
    const elsewhere = { tenant_id: SCOPE.tenant_id, namespace: 'other' };
    expectCode(await h.store.listSubscriptions(elsewhere, taskId).catch((e) => e), 'not_found');
    for (let i = 0; i < 16; i += 1) await h.store.subscribe(SCOPE, taskId, subscribeTo(`s${i}`));
    expectCode(
      await h.store.subscribe(SCOPE, taskId, subscribeTo('s16')).catch((e) => e),
      'limit_exceeded',
    );
  });

  it('never commits a terminal task with a waiting subscription (settles race subscribes)', async () => {
    const count = 40;
    for (let i = 0; i < count; i += 1)
      await h.store.submit(submitCommand(`race-${i}`, { queue: 'race' }));
    const assignments = await claimAll('race', count);
    const settler = h.makeStore(4);
    const subscriber = h.makeStore(4);
    let done = false;
    let samples = 0;
    let violations = 0;
    // A second connection samples committed state while the race runs.
    const checker = (async () => {
      while (!done) {
        const [found] = await h.sql`
          select count(*)::int as n from completion_deliveries d
          join tasks t on t.tenant_id = d.tenant_id and t.namespace = d.namespace
            and t.task_id = d.task_id
          where t.terminal_at is not null and d.state = 'waiting'`;
        violations += found?.n ?? 0;
        samples += 1;
      }
    })();
    const work: Promise<unknown>[] = [];
    assignments.forEach((assignment, i) => {
      const taskId = assignment.lease.owner.task_id;
      // Interleave: some subscribe before the settle is sent, some after, some both.
      if (i % 3 !== 0) work.push(subscriber.subscribe(SCOPE, taskId, subscribeTo('before')));
      work.push(
        i % 2 === 0
          ? settler.settle(successCommand(assignment, `op-${i}`))
          : settler.settle(failureCommand(assignment, `op-${i}`, false)),
      );
      work.push(subscriber.subscribe(SCOPE, taskId, subscribeTo('after')));
    });
    await Promise.all(work);
    done = true;
    await checker;
    const [left] = await h.sql`
      select count(*) filter (where d.state = 'waiting')::int as waiting,
        count(*) filter (where d.state = 'due')::int as due
      from completion_deliveries d
      where d.task_id = any(${assignments.map((a) => a.lease.owner.task_id)}::text[])`;
    console.log(
      `[completion] hook race: ${samples} committed-state samples, ${violations} violations`,
    );
    expect(violations).toBe(0);
    const subscribed = count + assignments.filter((_, i) => i % 3 !== 0).length;
    expect(left).toEqual({ waiting: 0, due: subscribed });
  });
});

describe('leasing and reporting', () => {
  it('4 concurrent senders over 500 due rows: each row leased exactly once per lease period', async () => {
    await seedDue('tsk_many_', 500);
    const senders = Array.from({ length: 4 }, () => h.makeStore(2));
    const leased: CompletionLease[] = [];
    const started = performance.now();
    await Promise.all(
      senders.map(async (sender) => {
        for (;;) {
          const batch = await sender.leaseDeliveries(50, 60_000);
          if (batch.length === 0) return;
          leased.push(...batch);
        }
      }),
    );
    const elapsed = performance.now() - started;
    const ids = leased.map((l) => l.subscription_id);
    expect(ids).toHaveLength(500);
    expect(new Set(ids).size).toBe(500);
    expect(leased.every((l) => l.attempt === 1 && l.generation === 1)).toBe(true);
    expect(leased[0]).toMatchObject({ queue: 'q', state: 'succeeded', terminal_at: 2 });
    expect(await h.store.leaseDeliveries(100, 60_000)).toEqual([]);
    console.log(
      `[completion] 4 senders leased 500 deliveries in ${elapsed.toFixed(0)} ms ` +
        `(${((500 / elapsed) * 1000).toFixed(0)}/s)`,
    );
    // After the lease period the rows are leasable again, once each, as try 2.
    h.advance(60_001);
    const again = (await Promise.all(senders.map((s) => s.leaseDeliveries(100, 60_000)))).flat();
    const more = await h.store.leaseDeliveries(100, 60_000);
    const second = [...again, ...more];
    expect(second.length).toBeLessThanOrEqual(500);
    expect(new Set(second.map((l) => l.subscription_id)).size).toBe(second.length);
    expect(second.every((l) => l.attempt === 2)).toBe(true);
  });

  it('a stale report changes nothing; the current one does', async () => {
    const taskId = await terminalTask('stale');
    const { subscription } = await h.store.subscribe(SCOPE, taskId, subscribeTo('s'));
    const [first] = await h.store.leaseDeliveries(10, 1_000);
    expect(first).toMatchObject({ subscription_id: subscription.id, attempt: 1, task_id: taskId });
    h.advance(1_001);
    const [second] = await h.store.leaseDeliveries(10, 1_000);
    expect(second).toMatchObject({ subscription_id: subscription.id, attempt: 2 });
    const before = await row(subscription.id);
    const report = {
      scope: SCOPE,
      subscription_id: subscription.id,
      generation: 1,
      next: { state: 'delivered' as const },
      status_code: 200,
    };
    expect(await h.store.reportDelivery({ ...report, attempt: 1 })).toBe(false);
    expect(await h.store.reportDelivery({ ...report, attempt: 2, generation: 2 })).toBe(false);
    expect(await row(subscription.id)).toEqual(before);
    expect(await h.store.reportDelivery({ ...report, attempt: 2 })).toBe(true);
    const after = await row(subscription.id);
    expect(after).toMatchObject({ state: 'delivered', attempts: 2, last_status_code: 200 });
    expect(after.delivered_at).toBe(after.finished_at);
    // Once delivered, the same report is stale.
    expect(await h.store.reportDelivery({ ...report, attempt: 2 })).toBe(false);
    expect(
      await h.store.reportDelivery({ ...report, subscription_id: 'sub_gone', attempt: 1 }),
    ).toBe(false);
  });

  it('lease and report statements agree with the core transitions, through exhaustion', async () => {
    const taskId = await terminalTask('agree');
    const { subscription } = await h.store.subscribe(SCOPE, taskId, subscribeTo('s'));
    const leaseMs = 500;
    const longError = `é${'x'.repeat(MESSAGE_MAX_BYTES)}`;
    for (let attempt = 1; attempt <= COMPLETION_MAX_ATTEMPTS; attempt += 1) {
      const before = await row(subscription.id);
      const [lease] = await h.store.leaseDeliveries(10, leaseMs);
      if (lease === undefined) throw new Error(`try ${attempt} was not leased`);
      const now = lease.lease_expires_at - leaseMs;
      const leased = await row(subscription.id);
      expect(leased).toEqual(leaseDelivery(before, now, leaseMs));
      expect(lease.attempt).toBe(attempt);
      if (attempt % 2 === 1) {
        // A failed try reported as due in 100 ms (the last one is exhausted by the report).
        const t0 = await h.store.now();
        const report = {
          scope: SCOPE,
          subscription_id: subscription.id,
          generation: 1,
          attempt,
          next: { state: 'due' as const, delay_ms: 100 },
          status_code: 503,
          error: longError,
        };
        expect(await h.store.reportDelivery(report)).toBe(true);
        const reported = await row(subscription.id);
        const at =
          reported.next_attempt_at !== null ? reported.next_attempt_at - 100 : reported.finished_at;
        expect(at).toBeGreaterThanOrEqual(t0);
        const clipped = { ...report, error: reported.last_error ?? '' };
        expect(Buffer.byteLength(clipped.error)).toBeLessThanOrEqual(MESSAGE_MAX_BYTES);
        // Cut at a character boundary, and marked as cut.
        expect(clipped.error.endsWith('…')).toBe(true);
        expect(longError.startsWith(clipped.error.slice(0, -1))).toBe(true);
        expect(reported).toEqual(reportDelivery(leased, clipped, at ?? 0));
        h.advance(100);
      } else {
        // The sender crashed mid-try: its lease runs out and the row is leasable again.
        h.advance(leaseMs);
      }
    }
    const last = await row(subscription.id);
    // The last try (12) crashed: the next lease finds the lease expired after the last try.
    expect(last).toMatchObject({ state: 'delivering', attempts: COMPLETION_MAX_ATTEMPTS });
    const t0 = await h.store.now();
    expect(await h.store.leaseDeliveries(10, leaseMs)).toEqual([]);
    const exhausted = await row(subscription.id);
    expect(exhausted.finished_at).toBeGreaterThanOrEqual(t0);
    expect(exhausted).toEqual(leaseDelivery(last, exhausted.finished_at ?? 0, leaseMs));
    expect(exhausted.state).toBe('exhausted');

    // Redelivery: generation 2 from try 0, the same event; a repeat answers it unchanged.
    const next = await h.store.redeliver(SCOPE, subscription.id, { generation: 1 });
    expect(next).toMatchObject({ state: 'due', generation: 2, attempts: 0 });
    expect(next.event_id).toBe(subscription.event_id);
    expect(await h.store.redeliver(SCOPE, subscription.id, { generation: 1 })).toEqual(next);
    expectCode(
      await h.store.redeliver(SCOPE, subscription.id, { generation: 2 }).catch((e) => e),
      'conflict',
    );
    const [lease] = await h.store.leaseDeliveries(10, leaseMs);
    expect(lease).toMatchObject({ generation: 2, attempt: 1, event_id: subscription.event_id });
  });

  it('a due report of the last try exhausts the delivery', async () => {
    const taskId = await terminalTask('last-due');
    const { subscription } = await h.store.subscribe(SCOPE, taskId, subscribeTo('s'));
    await h.sql`
      update completion_deliveries set state = 'delivering',
        attempts = ${COMPLETION_MAX_ATTEMPTS}, next_attempt_at = 1e15
      where subscription_id = ${subscription.id}`;
    const report = {
      scope: SCOPE,
      subscription_id: subscription.id,
      generation: 1,
      attempt: COMPLETION_MAX_ATTEMPTS,
      next: { state: 'due' as const, delay_ms: 1 },
    };
    expect(await h.store.reportDelivery(report)).toBe(true);
    expect(await row(subscription.id)).toMatchObject({
      state: 'exhausted',
      next_attempt_at: null,
      attempts: COMPLETION_MAX_ATTEMPTS,
    });
  });

  it('counts the due backlog up to a limit, without leased rows', async () => {
    await seedDue('tsk_backlog_', 30);
    expect(await h.store.dueBacklog(1_000)).toBe(30);
    expect(await h.store.dueBacklog(10)).toBe(10);
    await h.store.leaseDeliveries(20, 60_000);
    expect(await h.store.dueBacklog(1_000)).toBe(10);
    expectCode(await h.store.leaseDeliveries(0, 1).catch((e) => e), 'invalid_input');
    expectCode(await h.store.leaseDeliveries(101, 1).catch((e) => e), 'invalid_input');
  });

  it('counts in the due backlog a delivery whose lease ran out (a sender gone mid-try): it is due again', async () => {
    const { snapshot } = await h.store.submit(submitCommand('backlog-expired-lease'));
    await h.store.cancel(SCOPE, snapshot.task_id);
    await h.store.subscribe(SCOPE, snapshot.task_id, {
      subscription_key: 'k1',
      destination: 'billing',
    });
    expect(await h.store.dueBacklog(1_000)).toBe(1);
    // A sender leases it for 50 ms and is gone: no report ever comes.
    const leased = await h.store.leaseDeliveries(10, 50);
    expect(leased).toHaveLength(1);
    expect(await h.store.dueBacklog(1_000)).toBe(0);
    await new Promise((resolve) => setTimeout(resolve, 300));
    const backlog = await h.store.dueBacklog(1_000);
    // Due indeed: the next lease takes it at once.
    const again = await h.store.leaseDeliveries(10, 60_000);
    expect(again.map((l) => l.subscription_id)).toEqual(leased.map((l) => l.subscription_id));
    expect(backlog).toBe(1);
  });
});

async function rows(prefix: string): Promise<Map<string, SubscriptionRow>> {
  const found = await h.sql`
    select s.*, d.state, d.generation, d.attempts, d.next_attempt_at, d.delivered_at,
      d.finished_at, d.last_status_code, d.last_error
    from completion_subscriptions s join completion_deliveries d using (tenant_id, namespace,
      subscription_id)
    where s.subscription_id like ${`sub_${prefix}%`}`;
  return new Map(found.map((r) => [String(r.subscription_id), subscriptionFromDb(r)]));
}

/** A deterministic shuffle. */
function shuffled<T>(items: readonly T[], seed: number): T[] {
  const out = [...items];
  let s = seed;
  for (let i = out.length - 1; i > 0; i -= 1) {
    s = (s * 1_103_515_245 + 12_345) % 2_147_483_648;
    const j = s % (i + 1);
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

const NASTY_ERRORS = [
  'a "quoted" word',
  'back\\slash and \\"both\\"',
  '{braces,and,commas}',
  'NULL',
  'null',
  '',
  ' padded ',
  "it's",
  'tab\tand\nnewline',
  'é ü 漢字 🚀',
  '\ud800 lone surrogate',
  `long ${'y'.repeat(MESSAGE_MAX_BYTES)}`,
  '}',
  '{',
  '"',
  '\\',
];

describe('reports sent together (reportDeliveries), against the core row by row', () => {
  it('answers and applies each report by its own row, in any order, beside stale copies and nasty text', async () => {
    await seedDue('batch_mx_', 48);
    // Some rows at their generation's last try: a `due` report of those exhausts them.
    await h.sql`
      update completion_deliveries set attempts = ${COMPLETION_MAX_ATTEMPTS - 1}
      where subscription_id like 'sub_batch_mx_%' and (substring(subscription_id from 14))::int % 4 = 0`;
    const leases = await h.store.leaseDeliveries(100, 60_000);
    expect(leases).toHaveLength(48);
    const before = await rows('batch_mx_');
    const fresh: DeliveryReport[] = leases.map((lease: CompletionLease, i) => {
      const base = {
        scope: lease.scope,
        subscription_id: lease.subscription_id,
        generation: lease.generation,
        attempt: lease.attempt,
      };
      switch (i % 3) {
        case 0:
          return { ...base, next: { state: 'delivered' as const }, status_code: 200 + i };
        case 1:
          return {
            ...base,
            next: { state: 'due' as const, delay_ms: 1_000 * (i + 1) },
            status_code: 500 + i,
            error: NASTY_ERRORS[i % NASTY_ERRORS.length] as string,
          };
        default:
          return {
            ...base,
            next: { state: 'exhausted' as const },
            ...(i % 2 === 0 ? {} : { status_code: 400 + i }),
            error: NASTY_ERRORS[(i + 7) % NASTY_ERRORS.length] as string,
          };
      }
    });
    const stale: DeliveryReport[] = [];
    for (const [i, report] of fresh.entries()) {
      if (i % 5 === 0) stale.push({ ...report, attempt: report.attempt - 1, status_code: 999 });
      if (i % 7 === 0) stale.push({ ...report, generation: 2, error: 'wrong generation' });
      if (i % 11 === 0) {
        stale.push({ ...report, scope: { ...report.scope, namespace: 'other' }, error: 'scope' });
      }
    }
    stale.push({ ...(fresh[0] as DeliveryReport), subscription_id: 'sub_batch_missing' });
    const all = shuffled(
      [...fresh.map((r) => ({ r, fresh: true })), ...stale.map((r) => ({ r, fresh: false }))],
      46,
    );
    const t0 = await h.store.now();
    const answered = await h.store.reportDeliveries(all.map((x) => x.r));
    const t1 = await h.store.now();
    expect(answered).toEqual(all.map((x) => x.fresh));

    const after = await rows('batch_mx_');
    // The one store time the statement used, found from any row it finished.
    const times = new Set<number>();
    for (const report of fresh) {
      const row = after.get(report.subscription_id) as SubscriptionRow;
      times.add(
        row.state === 'due'
          ? (row.next_attempt_at as number) - (report.next as { delay_ms: number }).delay_ms
          : (row.finished_at as number),
      );
    }
    expect(times.size).toBe(1);
    const [now] = [...times] as [number];
    expect(now).toBeGreaterThanOrEqual(t0);
    expect(now).toBeLessThanOrEqual(t1);
    for (const report of fresh) {
      const was = before.get(report.subscription_id) as SubscriptionRow;
      const clipped = {
        ...report,
        ...(report.error === undefined ? {} : { error: fitText(report.error, MESSAGE_MAX_BYTES) }),
      };
      const expected = reportDelivery(was, clipped, now);
      expect(expected, report.subscription_id).toBeDefined();
      expect(after.get(report.subscription_id), report.subscription_id).toEqual(expected);
    }
    // Rows at their last try reported due are exhausted, not due again.
    const lastTries = fresh.filter((r) => r.attempt === COMPLETION_MAX_ATTEMPTS);
    expect(lastTries.length).toBeGreaterThan(0);
    for (const report of lastTries) {
      if (report.next.state === 'due') {
        expect(after.get(report.subscription_id)?.state).toBe('exhausted');
      }
    }
    // The same reports again: every one stale now.
    expect(await h.store.reportDeliveries(all.map((x) => x.r))).toEqual(all.map(() => false));
    expect(await rows('batch_mx_')).toEqual(after);
  });

  it('a fresh report after its own stale copy in one call (the copy first) is applied once', async () => {
    await seedDue('batch_dp_', 2);
    const first = await h.store.leaseDeliveries(10, 1_000);
    expect(first).toHaveLength(2);
    h.advance(1_001);
    const second = await h.store.leaseDeliveries(10, 60_000);
    expect(second).toHaveLength(2);
    const reportOf = (lease: CompletionLease, code: number): DeliveryReport => ({
      scope: lease.scope,
      subscription_id: lease.subscription_id,
      generation: lease.generation,
      attempt: lease.attempt,
      next: { state: 'due', delay_ms: 5_000 },
      status_code: code,
      error: `try ${lease.attempt}`,
    });
    const byId = (ls: CompletionLease[], id: string) =>
      ls.find((l) => l.subscription_id === id) as CompletionLease;
    const [a, b] = [first[0]?.subscription_id, first[1]?.subscription_id] as [string, string];
    const reports = [
      reportOf(byId(first, a), 501),
      reportOf(byId(second, a), 502),
      reportOf(byId(second, b), 503),
      reportOf(byId(first, b), 504),
    ];
    expect(await h.store.reportDeliveries(reports)).toEqual([false, true, true, false]);
    const after = await rows('batch_dp_');
    expect(after.get(a)).toMatchObject({ state: 'due', attempts: 2, last_status_code: 502 });
    expect(after.get(b)).toMatchObject({ state: 'due', attempts: 2, last_status_code: 503 });
  });

  it('a call of far more than a window of reports (1 000) answers each', async () => {
    await seedDue('batch_bg_', 1_000);
    const leases: CompletionLease[] = [];
    for (;;) {
      const batch = await h.store.leaseDeliveries(100, 60_000);
      if (batch.length === 0) break;
      leases.push(...batch);
    }
    expect(leases).toHaveLength(1_000);
    const reports = leases.map(
      (lease, i): DeliveryReport => ({
        scope: lease.scope,
        subscription_id: lease.subscription_id,
        generation: lease.generation,
        attempt: i % 2 === 0 ? lease.attempt : lease.attempt + 1,
        next: { state: 'delivered' },
        status_code: 200 + (i % 100),
      }),
    );
    const answered = await h.store.reportDeliveries(reports);
    expect(answered).toEqual(reports.map((_, i) => i % 2 === 0));
    const after = await rows('batch_bg_');
    for (const [i, report] of reports.entries()) {
      const row = after.get(report.subscription_id);
      if (i % 2 === 0) {
        expect(row).toMatchObject({ state: 'delivered', last_status_code: 200 + (i % 100) });
      } else expect(row).toMatchObject({ state: 'delivering', last_status_code: null });
    }
  });
});
