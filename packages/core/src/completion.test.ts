import {
  COMPLETION_MAX_ATTEMPTS,
  COMPLETION_MAX_GENERATION,
  type CompletionSubscribeCommand,
  CompletionSubscriptionSchema,
  ContractError,
  type ErrorCode,
  MAX_COMPLETION_SUBSCRIPTIONS,
  parseWith,
  type SubmitCommand,
  type TaskState,
} from '@ledgence/contracts';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { cancelTask } from './cancel.js';
import {
  completionSubscription,
  DELIVERY_LEASE_EXPIRED_ERROR,
  type DeliveryNext,
  type DeliveryReport,
  deliveryLeasable,
  expireLostTry,
  isTerminalState,
  leaseDelivery,
  markDue,
  redeliverSubscription,
  reportDelivery,
  subscribeTask,
} from './completion.js';
import { DEFAULT_LIFECYCLE_CONFIG } from './config.js';
import type { SubscriptionRow, TaskRow } from './rows.js';
import { submitTask } from './submit.js';

const T0 = 1_800_000_000_000;
const LEASE_MS = 30_000;
const scope = { tenant_id: 'acme', namespace: 'prod' };

const queuedTask: TaskRow = (() => {
  const command: SubmitCommand = {
    idempotency_key: 'k1',
    input: { ...scope, queue: 'email', program: { name: 'send' }, data: { to: 'ada' } },
  };
  return submitTask(
    null,
    command,
    T0,
    { task_id: 'tsk_1', run_id: 'run_1' },
    DEFAULT_LIFECYCLE_CONFIG,
  ).task;
})();
const terminalTask: TaskRow = cancelTask(queuedTask, T0 + 1_000).task;

const subscribeCommand = (key = 'billing-1', destination = 'billing') =>
  ({ subscription_key: key, destination }) satisfies CompletionSubscribeCommand;

let idCounter = 0;
const ids = () => {
  idCounter += 1;
  return { subscription_id: `sub_${idCounter}`, event_id: `evt_${idCounter}` };
};

/** A new subscription of `task` created at `at`. */
function subscribed(task: TaskRow = queuedTask, at = T0): SubscriptionRow {
  const result = subscribeTask(task, [], subscribeCommand(), at, ids());
  expect(result.created).toBe(true);
  return result.row;
}

/** A subscription of a terminal task, due at T0 + 1 000. */
const due = (): SubscriptionRow => markDue(subscribed(), T0 + 1_000);

/** `row` leased at `at` (it must be leasable there). */
function leased(row: SubscriptionRow, at: number): SubscriptionRow {
  expect(deliveryLeasable(row, at)).toBe(true);
  return leaseDelivery(row, at, LEASE_MS);
}

/**
 * `row` (due) leased COMPLETION_MAX_ATTEMPTS times, each lease lost: it is
 * delivering the generation's last try until its `next_attempt_at`.
 */
function lastTryLeased(row: SubscriptionRow): SubscriptionRow {
  let at = row.next_attempt_at ?? Number.NaN;
  for (let attempt = 1; attempt <= COMPLETION_MAX_ATTEMPTS; attempt += 1) {
    row = leased(row, at);
    expect(row).toMatchObject({ state: 'delivering', attempts: attempt });
    at += LEASE_MS;
  }
  return row;
}

/** The end of the lease `row` is delivering under. */
function leaseEnd(row: SubscriptionRow): number {
  expect(row.state).toBe('delivering');
  return row.next_attempt_at ?? Number.NaN;
}

/** A report of the try `row` is delivering, deciding `next`. */
function reportOf(
  row: SubscriptionRow,
  next: DeliveryNext,
  extra: Partial<DeliveryReport> = {},
): DeliveryReport {
  return {
    scope,
    subscription_id: row.subscription_id,
    generation: row.generation,
    attempt: row.attempts,
    next,
    ...extra,
  };
}

/** `row` with its current generation finished by a delivered report at `at`. */
function delivered(row: SubscriptionRow, at: number): SubscriptionRow {
  const delivering = leased(row, at);
  const next = reportDelivery(delivering, reportOf(delivering, { state: 'delivered' }), at);
  if (next === undefined) throw new Error('expected the report to apply');
  return next;
}

function expectCode(run: () => unknown, code: ErrorCode, reason?: string): void {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ContractError);
    expect(error).toMatchObject({ code, ...(reason === undefined ? {} : { reason }) });
    return;
  }
  throw new Error(`expected a ${code} ContractError`);
}

describe('isTerminalState', () => {
  it('is true exactly for succeeded, failed and cancelled', () => {
    const states: TaskState[] = ['queued', 'active', 'succeeded', 'failed', 'cancelled'];
    expect(states.map((state) => isTerminalState(state))).toEqual([false, false, true, true, true]);
  });
});

describe('subscribeTask', () => {
  it('a live task’s new subscription waits, at generation 1 with no tries', () => {
    const result = subscribeTask(queuedTask, [], subscribeCommand(), T0, {
      subscription_id: 'sub_a',
      event_id: 'evt_a',
    });
    expect(result).toEqual({
      created: true,
      row: {
        tenant_id: 'acme',
        namespace: 'prod',
        subscription_id: 'sub_a',
        task_id: 'tsk_1',
        subscription_key: 'billing-1',
        destination: 'billing',
        event_id: 'evt_a',
        created_at: T0,
        state: 'waiting',
        generation: 1,
        attempts: 0,
        next_attempt_at: null,
        delivered_at: null,
        finished_at: null,
        last_status_code: null,
        last_error: null,
      },
    });
  });

  it('a terminal task’s new subscription is due at once', () => {
    const row = subscribed(terminalTask, T0 + 5_000);
    expect(row).toMatchObject({ state: 'due', next_attempt_at: T0 + 5_000 });
  });

  it('the same key and destination answers the existing row (created: false)', () => {
    const first = subscribed();
    const again = subscribeTask(terminalTask, [first], subscribeCommand(), T0 + 9, ids());
    expect(again).toEqual({ created: false, row: first });
  });

  it('the same key with another destination is conflict', () => {
    const first = subscribed();
    expectCode(
      () => subscribeTask(queuedTask, [first], subscribeCommand('billing-1', 'audit'), T0, ids()),
      'conflict',
      'subscription_key_reused',
    );
  });

  it(`allows ${MAX_COMPLETION_SUBSCRIPTIONS} subscriptions; the next is limit_exceeded, a known key still answers`, () => {
    const existing: SubscriptionRow[] = [];
    for (let n = 1; n <= MAX_COMPLETION_SUBSCRIPTIONS; n += 1) {
      const result = subscribeTask(queuedTask, existing, subscribeCommand(`k${n}`), T0, ids());
      expect(result.created).toBe(true);
      existing.push(result.row);
    }
    expect(existing).toHaveLength(MAX_COMPLETION_SUBSCRIPTIONS);
    expectCode(
      () => subscribeTask(queuedTask, existing, subscribeCommand('one-more'), T0, ids()),
      'limit_exceeded',
      'max_completion_subscriptions',
    );
    expect(subscribeTask(queuedTask, existing, subscribeCommand('k1'), T0, ids())).toEqual({
      created: false,
      row: existing[0],
    });
  });
});

describe('markDue (the terminal hook)', () => {
  it('makes a waiting subscription due at the given time', () => {
    const row = subscribed();
    expect(markDue(row, T0 + 7)).toEqual({ ...row, state: 'due', next_attempt_at: T0 + 7 });
  });

  it('changes no other state', () => {
    const dueRow = due();
    const delivering = leased(dueRow, T0 + 2_000);
    const finished = delivered(dueRow, T0 + 2_000);
    for (const row of [dueRow, delivering, finished]) {
      expect(markDue(row, T0 + 99_000)).toBe(row);
    }
  });
});

describe('deliveryLeasable and leaseDelivery', () => {
  it('a due row is leasable from its next_attempt_at on; a waiting or finished one never', () => {
    const row = due();
    expect(deliveryLeasable(row, T0 + 999)).toBe(false);
    expect(deliveryLeasable(row, T0 + 1_000)).toBe(true);
    expect(deliveryLeasable(subscribed(), T0 + 10 ** 9)).toBe(false);
    expect(deliveryLeasable(delivered(row, T0 + 1_000), T0 + 10 ** 9)).toBe(false);
  });

  it('a lease starts the next try and holds the row until now + lease', () => {
    const row = leased(due(), T0 + 2_000);
    expect(row).toMatchObject({
      state: 'delivering',
      attempts: 1,
      next_attempt_at: T0 + 2_000 + LEASE_MS,
    });
    expect(deliveryLeasable(row, T0 + 2_000 + LEASE_MS - 1)).toBe(false);
    expect(deliveryLeasable(row, T0 + 2_000 + LEASE_MS)).toBe(true);
    expect(leased(row, T0 + 2_000 + LEASE_MS)).toMatchObject({ state: 'delivering', attempts: 2 });
  });

  it(`an expired lease after try ${COMPLETION_MAX_ATTEMPTS} exhausts the row instead of trying again`, () => {
    const row = lastTryLeased(due());
    const at = leaseEnd(row);
    const withStatus = { ...row, last_status_code: 503 };
    expect(leaseDelivery(withStatus, at, LEASE_MS)).toEqual({
      ...row,
      state: 'exhausted',
      next_attempt_at: null,
      finished_at: at,
      last_status_code: null,
      last_error: DELIVERY_LEASE_EXPIRED_ERROR,
    });
  });
});

describe('expireLostTry (a lost last try as the views show it)', () => {
  it('a last try is exhausted from its lease’s end on, exactly as the next lease writes it', () => {
    const row = { ...lastTryLeased(due()), last_status_code: 503, last_error: 'status 503' };
    const end = leaseEnd(row);
    expect(expireLostTry(row, end - 1)).toBe(row);
    for (const now of [end, end + 10 ** 9]) {
      expect(expireLostTry(row, now)).toEqual(leaseDelivery(row, now, LEASE_MS));
      expect(expireLostTry(row, now)).toMatchObject({
        state: 'exhausted',
        attempts: COMPLETION_MAX_ATTEMPTS,
        next_attempt_at: null,
        finished_at: now,
        last_status_code: null,
        last_error: DELIVERY_LEASE_EXPIRED_ERROR,
      });
    }
  });

  it('returns any other row as it is, an earlier try’s lost lease included (it is tried again)', () => {
    const late = T0 + 10 ** 9;
    const exhausted = expireLostTry(lastTryLeased(due()), late);
    for (const row of [
      subscribed(),
      due(),
      leased(due(), T0 + 2_000),
      delivered(due(), T0 + 2_000),
      exhausted,
    ]) {
      expect(expireLostTry(row, late)).toBe(row);
    }
  });

  it('a replayed subscribe answers the found subscription as it stands at its time', () => {
    const row = lastTryLeased(subscribed(terminalTask));
    const end = leaseEnd(row);
    const replay = (at: number) =>
      subscribeTask(terminalTask, [row], subscribeCommand(), at, ids());
    expect(replay(end - 1)).toEqual({ created: false, row });
    expect(replay(end)).toEqual({ created: false, row: leaseDelivery(row, end, LEASE_MS) });
  });
});

describe('reportDelivery', () => {
  const at = T0 + 3_000;
  const delivering = () => leased(due(), T0 + 2_000);

  it('delivered: finished now, with the receiver’s status', () => {
    const row = delivering();
    const next = reportDelivery(
      row,
      reportOf(row, { state: 'delivered' }, { status_code: 204 }),
      at,
    );
    expect(next).toEqual({
      ...row,
      state: 'delivered',
      next_attempt_at: null,
      delivered_at: at,
      finished_at: at,
      last_status_code: 204,
      last_error: null,
    });
  });

  it('exhausted: finished now without delivery', () => {
    const row = delivering();
    const next = reportDelivery(
      row,
      reportOf(row, { state: 'exhausted' }, { status_code: 410, error: 'gone' }),
      at,
    );
    expect(next).toEqual({
      ...row,
      state: 'exhausted',
      next_attempt_at: null,
      finished_at: at,
      last_status_code: 410,
      last_error: 'gone',
    });
  });

  it('due: the next try after the delay (a negative delay means now), recording the failure', () => {
    const row = delivering();
    const next = reportDelivery(
      row,
      reportOf(row, { state: 'due', delay_ms: 5_000 }, { error: 'timeout' }),
      at,
    );
    expect(next).toEqual({
      ...row,
      state: 'due',
      next_attempt_at: at + 5_000,
      last_status_code: null,
      last_error: 'timeout',
    });
    const soon = reportDelivery(row, reportOf(row, { state: 'due', delay_ms: -5 }), at);
    expect(soon?.next_attempt_at).toBe(at);
  });

  it(`due after try ${COMPLETION_MAX_ATTEMPTS} exhausts the row: no try beyond the limit`, () => {
    const row = { ...delivering(), attempts: COMPLETION_MAX_ATTEMPTS };
    const next = reportDelivery(
      row,
      reportOf(row, { state: 'due', delay_ms: 0 }, { status_code: 500 }),
      at,
    );
    expect(next).toMatchObject({
      state: 'exhausted',
      attempts: COMPLETION_MAX_ATTEMPTS,
      next_attempt_at: null,
      finished_at: at,
      last_status_code: 500,
    });
  });

  it('is fenced: another try, another generation or a row not delivering → undefined', () => {
    const row = delivering();
    const report = reportOf(row, { state: 'delivered' });
    expect(reportDelivery(row, { ...report, attempt: row.attempts + 1 }, at)).toBeUndefined();
    expect(reportDelivery(row, { ...report, attempt: row.attempts - 1 }, at)).toBeUndefined();
    expect(reportDelivery(row, { ...report, generation: row.generation + 1 }, at)).toBeUndefined();
    for (const state of ['waiting', 'due', 'delivered', 'exhausted'] as const) {
      expect(reportDelivery({ ...row, state }, report, at)).toBeUndefined();
    }
  });
});

describe('redeliverSubscription (the generation rule)', () => {
  const at = T0 + 60_000;

  it('naming the finished current generation starts the next: same event, due now, outcome cleared', () => {
    for (const finished of [
      delivered(due(), T0 + 2_000),
      {
        ...leased(due(), T0 + 2_000),
        state: 'exhausted' as const,
        finished_at: T0 + 3_000,
        last_error: 'x',
        last_status_code: 500,
      },
    ]) {
      const result = redeliverSubscription(finished, { generation: 1 }, at);
      expect(result).toEqual({
        changed: true,
        row: {
          ...finished,
          state: 'due',
          generation: 2,
          attempts: 0,
          next_attempt_at: at,
          delivered_at: null,
          finished_at: null,
          last_status_code: null,
          last_error: null,
        },
      });
      expect(result.row.event_id).toBe(finished.event_id);
    }
  });

  it('naming the previous generation once the next exists answers the row unchanged', () => {
    const next = redeliverSubscription(delivered(due(), T0 + 2_000), { generation: 1 }, at).row;
    expect(redeliverSubscription(next, { generation: 1 }, at + 1)).toEqual({
      changed: false,
      row: next,
    });
    // Whatever the next generation's state by then.
    const nextDelivering = leased(next, at);
    expect(redeliverSubscription(nextDelivering, { generation: 1 }, at + 1).row).toBe(
      nextDelivering,
    );
  });

  it('naming the current generation while it is waiting, due or delivering is conflict', () => {
    const rows = [subscribed(), due(), leased(due(), T0 + 2_000)];
    for (const row of rows) {
      expectCode(
        () => redeliverSubscription(row, { generation: 1 }, at),
        'conflict',
        'generation_in_progress',
      );
    }
  });

  it('a lost last try: conflict while its lease runs, the next generation once it ended', () => {
    const row = lastTryLeased(due());
    const end = leaseEnd(row);
    expectCode(
      () => redeliverSubscription(row, { generation: 1 }, end - 1),
      'conflict',
      'generation_in_progress',
    );
    expect(redeliverSubscription(row, { generation: 1 }, end)).toEqual({
      changed: true,
      row: {
        ...row,
        state: 'due',
        generation: 2,
        attempts: 0,
        next_attempt_at: end,
        delivered_at: null,
        finished_at: null,
        last_status_code: null,
        last_error: null,
      },
    });
  });

  it('naming the previous generation of a lost last try answers it exhausted, to be written', () => {
    const next = redeliverSubscription(delivered(due(), T0 + 2_000), { generation: 1 }, at).row;
    const row = lastTryLeased(next);
    const end = leaseEnd(row);
    expect(redeliverSubscription(row, { generation: 1 }, end - 1)).toEqual({
      changed: false,
      row,
    });
    const repeated = redeliverSubscription(row, { generation: 1 }, end);
    expect(repeated).toEqual({ changed: true, row: leaseDelivery(row, end, LEASE_MS) });
    expect(repeated.row).toMatchObject({ state: 'exhausted', generation: 2 });
  });

  it('naming any other generation is conflict', () => {
    const finished = delivered(due(), T0 + 2_000);
    const third = delivered(redeliverSubscription(finished, { generation: 1 }, at).row, at);
    expect(third.generation).toBe(2);
    for (const generation of [3, 4, COMPLETION_MAX_GENERATION]) {
      expectCode(
        () => redeliverSubscription(third, { generation }, at),
        'conflict',
        'generation_mismatch',
      );
    }
  });

  it('naming any earlier generation again answers the subscription unchanged (a late copy)', () => {
    // Generation 1's request started 2 and its answer was lost; generation 2's started 3; the
    // first request, sent again, is still the same request (DESIGN §1.3; until 2026-12-05 it
    // was a conflict two generations later).
    const second = delivered(
      redeliverSubscription(delivered(due(), T0 + 2_000), { generation: 1 }, at).row,
      at,
    );
    const third = redeliverSubscription(second, { generation: 2 }, at).row;
    expect(third.generation).toBe(3);
    for (const generation of [1, 2]) {
      expect(redeliverSubscription(third, { generation }, at)).toEqual({
        changed: false,
        row: third,
      });
    }
  });

  it(`generation ${COMPLETION_MAX_GENERATION} is the last: redelivering it is limit_exceeded`, () => {
    let row = delivered(due(), T0 + 2_000);
    for (let generation = 1; generation < COMPLETION_MAX_GENERATION; generation += 1) {
      row = delivered(redeliverSubscription(row, { generation }, at).row, at);
    }
    expect(row.generation).toBe(COMPLETION_MAX_GENERATION);
    expectCode(
      () => redeliverSubscription(row, { generation: COMPLETION_MAX_GENERATION }, at),
      'limit_exceeded',
      'max_completion_generation',
    );
    // The previous generation's repeat still answers unchanged at the limit.
    expect(
      redeliverSubscription(row, { generation: COMPLETION_MAX_GENERATION - 1 }, at).changed,
    ).toBe(false);
  });
});

describe('completionSubscription (wire view)', () => {
  it('omits absent fields instead of sending null, and validates', () => {
    const view = completionSubscription(subscribed());
    expect(view).toEqual({
      id: view.id,
      task_id: 'tsk_1',
      subscription_key: 'billing-1',
      destination: 'billing',
      event_id: view.event_id,
      state: 'waiting',
      attempts: 0,
      generation: 1,
    });
    expect(parseWith(CompletionSubscriptionSchema, view)).toEqual(view);
  });

  it('carries every present delivery field, and validates', () => {
    const report = (row: SubscriptionRow) =>
      reportOf(row, { state: 'delivered' }, { status_code: 200, error: 'slow' });
    const row = leased(due(), T0 + 2_000);
    const finished = reportDelivery(row, report(row), T0 + 3_000);
    if (finished === undefined) throw new Error('expected the report to apply');
    const view = completionSubscription(finished);
    expect(view).toMatchObject({
      state: 'delivered',
      attempts: 1,
      delivered_at: T0 + 3_000,
      last_status_code: 200,
      last_error: 'slow',
    });
    expect(view).not.toHaveProperty('next_attempt_at');
    expect(parseWith(CompletionSubscriptionSchema, view)).toEqual(view);
    const dueView = completionSubscription(due());
    expect(dueView.next_attempt_at).toBe(T0 + 1_000);
    expect(parseWith(CompletionSubscriptionSchema, dueView)).toEqual(dueView);
  });
});

describe('delivery state machine (property)', () => {
  /**
   * A sender's try (it waits until the row is leasable, leases it, then
   * reports `outcome`, or loses its lease when `outcome` is null), a stale
   * report, or a redelivery naming the current generation shifted by `back`.
   * Lost leases and `due` outcomes are weighted up, so runs of
   * COMPLETION_MAX_ATTEMPTS failing tries in one generation are common.
   */
  type Step =
    | { kind: 'try'; outcome: DeliveryNext | null }
    | { kind: 'stale'; next: DeliveryNext }
    | { kind: 'redeliver'; back: number };
  const outcome: fc.Arbitrary<DeliveryNext> = fc.oneof(
    {
      weight: 8,
      arbitrary: fc.nat(10_000).map((delay_ms): DeliveryNext => ({ state: 'due', delay_ms })),
    },
    { weight: 1, arbitrary: fc.constant<DeliveryNext>({ state: 'delivered' }) },
    { weight: 1, arbitrary: fc.constant<DeliveryNext>({ state: 'exhausted' }) },
  );
  const step: fc.Arbitrary<Step> = fc.oneof(
    {
      weight: 10,
      arbitrary: fc.record({
        kind: fc.constant('try' as const),
        outcome: fc.option(outcome, { freq: 4 }),
      }),
    },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('stale' as const), next: outcome }) },
    {
      weight: 2,
      arbitrary: fc.record({
        kind: fc.constant('redeliver' as const),
        back: fc.integer({ min: -1, max: 1 }),
      }),
    },
  );

  it('keeps the event, bounds attempts and generations, and fences every report', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 200, size: 'max' }), (steps) => {
        const start = due();
        let row = start;
        let now = T0 + 1_000;
        for (const s of steps) {
          const before = row;
          if (s.kind === 'try') {
            if (row.next_attempt_at !== null) {
              now = Math.max(now, row.next_attempt_at);
              expect(deliveryLeasable(row, now)).toBe(true);
              row = leaseDelivery(row, now, LEASE_MS);
              if (row.state === 'delivering' && s.outcome !== null) {
                // The current try's own report always applies.
                const next = reportDelivery(row, reportOf(row, s.outcome), now);
                expect(next).toBeDefined();
                row = next ?? row;
              }
            }
          } else if (s.kind === 'stale') {
            const stale = reportOf(row, s.next, { attempt: row.attempts + 1 });
            expect(reportDelivery(row, stale, now)).toBeUndefined();
          } else {
            try {
              row = redeliverSubscription(row, { generation: row.generation + s.back }, now).row;
            } catch (error) {
              if (!(error instanceof ContractError)) throw error;
              expect(row).toBe(before);
            }
          }
          expect(row.event_id).toBe(start.event_id);
          expect(row.subscription_id).toBe(start.subscription_id);
          expect(row.attempts).toBeLessThanOrEqual(COMPLETION_MAX_ATTEMPTS);
          expect(row.generation).toBeGreaterThanOrEqual(before.generation);
          expect(row.generation).toBeLessThanOrEqual(COMPLETION_MAX_GENERATION);
          // Finished exactly when delivered or exhausted; scheduled exactly when due or delivering.
          const finished = row.state === 'delivered' || row.state === 'exhausted';
          expect(row.finished_at !== null).toBe(finished);
          expect(row.next_attempt_at !== null).toBe(!finished);
          const view = completionSubscription(row);
          expect(parseWith(CompletionSubscriptionSchema, view)).toEqual(view);
        }
      }),
      { numRuns: 100 },
    );
    // 100 runs of up to 200 steps: about a second here, more on a busy CI machine.
  }, 30_000);
});
