/**
 * The chaos checker must be able to fail for each violation its checks name, and must pass a
 * correct record. Each test feeds `check()` (or `replayHistory()`) a record of a clean run, or
 * one with a single real violation added, and asserts what the check named for it reports.
 * Pure: no processes, no database (the run itself is `chaos.chaos.test.ts`).
 */
import { describe, expect, it } from 'vitest';
import {
  type AttemptRow,
  CHECKS,
  type CheckResult,
  check,
  type DatabaseRecord,
  type Evidence,
  type HistoryRow,
  replayHistory,
  type TaskRow,
} from './checker.js';
import type { DeliveryRecord, ExecutionRecord, JobData, SubmitRecord } from './model.js';
import { TASK_RETRY } from './submitter.js';

const h = (taskId: string, ...events: [reason: string, attempt: string | null][]): HistoryRow[] =>
  events.map(([reason, attempt], i) => ({
    task_id: taskId,
    sequence: i + 1,
    attempt_id: attempt,
    at: i,
    reason,
  }));

function task(id: string, over: Partial<TaskRow> & { data?: JobData } = {}): TaskRow {
  return {
    tenant_id: 'x',
    namespace: 'y',
    task_id: id,
    idempotency_key: `k-${id}`,
    state: 'succeeded',
    attempt_count: 1,
    dispatch_count: 1,
    history_sequence: 5,
    max_attempts: 3,
    failure_kind: null,
    execution_kind: null,
    data: { i: 0, ms: 5 },
    submitted_at: 0,
    terminal_at: 10,
    ...over,
  };
}

function attempt(taskId: string, id: string, over: Partial<AttemptRow> = {}): AttemptRow {
  return {
    task_id: taskId,
    attempt_id: id,
    ordinal: 1,
    state: 'succeeded',
    claimed_at: 1,
    lease_expires_at: 100,
    dispatch_allowed: true,
    accepted_at: 50,
    ...over,
  };
}

const ack = (t: TaskRow): SubmitRecord => ({
  event: 'ack',
  key: t.idempotency_key,
  tenant: t.tenant_id,
  namespace: t.namespace,
  task_id: t.task_id,
  repeat: false,
  at: 0,
});

const exec = (
  event: 'start' | 'end',
  attemptId: string,
  attemptNumber: number,
  outcome?: 'ok' | 'error',
): ExecutionRecord => ({
  event,
  worker: 'w',
  pid: 1,
  task_id: 't',
  attempt_id: attemptId,
  attempt: attemptNumber,
  at: 0,
  ...(outcome === undefined ? {} : { outcome }),
});

const post = (state: string, at: number, webhookId = 'e'): DeliveryRecord => ({
  webhook_id: webhookId,
  task_id: 't',
  state,
  at,
});

const subscribed = (eventId: string): SubmitRecord => ({
  event: 'subscribed',
  key: 'k-t',
  task_id: 't',
  subscription_id: 's',
  event_id: eventId,
  at: 1,
});

function run(
  one: { task: TaskRow; attempts: AttemptRow[]; history: HistoryRow[] },
  evidence: Partial<Evidence> = {},
  subscriptions: DatabaseRecord['subscriptions'] = [],
): CheckResult[] {
  return check(
    {
      submits: [ack(one.task)],
      executions: [],
      deliveries: [],
      faults: [],
      unexpectedExits: [],
      unrecoveredRestarts: 0,
      ...evidence,
    },
    {
      tasks: new Map([[one.task.task_id, one.task]]),
      attempts: new Map([[one.task.task_id, one.attempts]]),
      history: new Map([[one.task.task_id, one.history]]),
      subscriptions,
    },
  );
}

const failing = (results: CheckResult[]) =>
  results.filter((r) => r.violations > 0).map((r) => r.name);

/** A clean task that succeeded on its first attempt `a`. */
const clean = () => ({
  task: task('t'),
  attempts: [attempt('t', 'a')],
  history: h(
    't',
    ['submitted', null],
    ['claimed', 'a'],
    ['dispatch_authorized', 'a'],
    ['report_accepted', 'a'],
    ['succeeded', 'a'],
  ),
});

/** A task that always failed: `attempts` dispatched, each settled with the handler's error. */
function exhausted(attempts: string[], over: Partial<TaskRow> = {}) {
  const events: [string, string | null][] = [['submitted', null]];
  attempts.forEach((a, i) => {
    events.push(['claimed', a], ['dispatch_authorized', a], ['report_accepted', a]);
    events.push([i === attempts.length - 1 ? 'failed' : 'retry_scheduled', a]);
  });
  return {
    task: task('t', {
      state: 'failed',
      failure_kind: 'application',
      data: { i: 0, ms: 5, fail: 'always' },
      attempt_count: attempts.length,
      dispatch_count: attempts.length,
      max_attempts: attempts.length,
      history_sequence: 1 + 4 * attempts.length,
      ...over,
    }),
    attempts: attempts.map((a, i) =>
      attempt('t', a, { ordinal: i + 1, state: 'failed', report: 'application_error' }),
    ),
    history: h('t', ...events),
  };
}

describe('replayHistory', () => {
  const hh = (...events: [reason: string, attempt: string | null][]) => h('t', ...events);

  it('accepts legal histories and ends in their state', () => {
    expect(
      replayHistory(
        hh(
          ['submitted', null],
          ['claimed', 'a'],
          ['lease_expired', 'a'],
          ['retry_scheduled', 'a'],
          ['claimed', 'b'],
          ['dispatch_authorized', 'b'],
          ['report_accepted', 'b'],
          ['succeeded', 'b'],
        ),
      ),
    ).toEqual({ state: 'succeeded' });
  });

  it.each([
    [
      'a second settlement',
      [
        ['report_accepted', 'a'],
        ['report_accepted', 'a'],
      ],
    ],
    [
      'a settlement from a stale lease',
      [
        ['lease_expired', 'a'],
        ['report_accepted', 'a'],
      ],
    ],
    [
      'success after lease expiry',
      [
        ['lease_expired', 'a'],
        ['succeeded', 'a'],
      ],
    ],
    ['an outcome with no report', [['succeeded', 'a']]],
    ['a record for another attempt', [['dispatch_authorized', 'z']]],
    [
      'a second dispatch',
      [
        ['dispatch_authorized', 'a'],
        ['dispatch_authorized', 'a'],
      ],
    ],
    [
      'a cancelled active task without cancel_requested',
      [
        ['report_accepted', 'a'],
        ['cancelled', 'a'],
      ],
    ],
  ] as [string, [string, string][]][])('rejects %s', (_, tail) => {
    expect(replayHistory(hh(['submitted', null], ['claimed', 'a'], ...tail))).toHaveProperty(
      'error',
    );
  });

  it('rejects gaps and records after a terminal state', () => {
    const gap = hh(['submitted', null], ['claimed', 'a']);
    gap[1] = { ...(gap[1] as (typeof gap)[number]), sequence: 3 };
    expect(replayHistory(gap)).toHaveProperty('error');
    expect(
      replayHistory(hh(['submitted', null], ['cancelled', null], ['claimed', 'a'])),
    ).toHaveProperty('error');
  });

  // DESIGN §5 Settle: "a settlement while `cancel_requested` → cancelled"; Cancel: "if it never
  // does, lease expiry finishes it as cancelled (never retried)"; Renew: dispatch is granted
  // "only if not cancel-requested".
  it.each([
    [
      'a success after cancel was requested',
      [
        ['cancel_requested', 'a'],
        ['report_accepted', 'a'],
        ['succeeded', 'a'],
      ],
    ],
    [
      'a retry after cancel was requested and the lease expired',
      [
        ['cancel_requested', 'a'],
        ['lease_expired', 'a'],
        ['retry_scheduled', 'a'],
      ],
    ],
    [
      'a failure after cancel was requested and the lease expired',
      [
        ['cancel_requested', 'a'],
        ['lease_expired', 'a'],
        ['failed', 'a'],
      ],
    ],
    [
      'a retry of a decision held before cancel was requested',
      [
        ['report_accepted', 'a'],
        ['cancel_requested', 'a'],
        ['cleanup_confirmed', 'a'],
        ['retry_scheduled', 'a'],
      ],
    ],
  ] as [string, [string, string][]][])(
    'rejects %s: after cancel_requested the task ends cancelled',
    (_, tail) => {
      const events = h(
        't',
        ['submitted', null],
        ['claimed', 'a'],
        ['dispatch_authorized', 'a'],
        ...tail,
      );
      expect(replayHistory(events)).toHaveProperty('error');
    },
  );

  it('rejects a dispatch granted after cancel was requested', () => {
    expect(
      replayHistory(
        h(
          't',
          ['submitted', null],
          ['claimed', 'a'],
          ['cancel_requested', 'a'],
          ['dispatch_authorized', 'a'],
        ),
      ),
    ).toHaveProperty('error');
  });

  it.each([
    [
      'a settlement after cancel_requested',
      [
        ['cancel_requested', 'a'],
        ['report_accepted', 'a'],
        ['cancelled', 'a'],
      ],
      'cancelled',
    ],
    [
      'a lease expiry after cancel_requested',
      [
        ['cancel_requested', 'a'],
        ['lease_expired', 'a'],
        ['cancelled', 'a'],
      ],
      'cancelled',
    ],
    [
      'a success held before cancel_requested',
      [
        ['report_accepted', 'a'],
        ['cancel_requested', 'a'],
        ['cleanup_confirmed', 'a'],
        ['succeeded', 'a'],
      ],
      'succeeded',
    ],
    [
      'a failure held before cancel_requested, finalized at the authority deadline',
      [
        ['report_accepted', 'a'],
        ['cancel_requested', 'a'],
        ['failed', 'a'],
      ],
      'failed',
    ],
    [
      'a retry held before cancel_requested, turned into cancelled',
      [
        ['report_accepted', 'a'],
        ['cancel_requested', 'a'],
        ['cleanup_confirmed', 'a'],
        ['cancelled', 'a'],
      ],
      'cancelled',
    ],
  ] as [string, [string, string][], string][])('accepts %s', (_, tail, end) => {
    const events = h(
      't',
      ['submitted', null],
      ['claimed', 'a'],
      ['dispatch_authorized', 'a'],
      ...tail,
    );
    expect(replayHistory(events)).toEqual({ state: end });
  });
});

describe('check', () => {
  it('passes every check for a clean succeeded task', () => {
    expect(failing(run(clean()))).toEqual([]);
  });

  it('passes every check for a correct record of retries, exhaustion, executions and deliveries', () => {
    // Fails once: attempt a1 ends in the handler's error and retries, a2 returns and succeeds.
    const once = {
      task: task('t', {
        data: { i: 0, ms: 5, fail: 'once' },
        attempt_count: 2,
        dispatch_count: 2,
        history_sequence: 9,
      }),
      attempts: [
        attempt('t', 'a1', { state: 'failed', report: 'application_error', accepted_at: 20 }),
        attempt('t', 'a2', { ordinal: 2, report: 'success' }),
      ],
      history: h(
        't',
        ['submitted', null],
        ['claimed', 'a1'],
        ['dispatch_authorized', 'a1'],
        ['report_accepted', 'a1'],
        ['retry_scheduled', 'a1'],
        ['claimed', 'a2'],
        ['dispatch_authorized', 'a2'],
        ['report_accepted', 'a2'],
        ['succeeded', 'a2'],
      ),
    };
    const results = run(
      once,
      {
        submits: [ack(once.task), subscribed('e')],
        executions: [
          exec('start', 'a1', 1),
          exec('end', 'a1', 1, 'error'),
          exec('start', 'a2', 2),
          exec('end', 'a2', 2, 'ok'),
        ],
        // At least once: the same event twice.
        deliveries: [post('succeeded', 1), post('succeeded', 2)],
      },
      [{ subscription_id: 's', task_id: 't', event_id: 'e', state: 'delivered' }],
    );
    expect(failing(results)).toEqual([]);
    // Exhausted: failed after max_attempts dispatches, by the handler or by lease expiry.
    expect(failing(run(exhausted(['a1', 'a2', 'a3'])))).toEqual([]);
    const expired = exhausted(['a1', 'a2', 'a3'], { failure_kind: 'lease_expired' });
    expired.history[expired.history.length - 2] = {
      ...(expired.history[expired.history.length - 2] as HistoryRow),
      reason: 'lease_expired',
    };
    expired.attempts[2] = {
      ...(expired.attempts[2] as AttemptRow),
      state: 'lost',
      accepted_at: null,
      report: null,
    };
    expect(failing(run(expired))).toEqual([]);
  });

  it('reports lost submits, split keys, stale settlements and missing deliveries', () => {
    const history = (id: string) =>
      h(
        id,
        ['submitted', null],
        ['claimed', `${id}-a`],
        ['dispatch_authorized', `${id}-a`],
        ['report_accepted', `${id}-a`],
        ['succeeded', `${id}-a`],
      );
    const results = check(
      {
        submits: [
          { ...ack(task('t1')), key: 'k1' },
          { ...ack(task('t2')), key: 'k1' },
          { ...ack(task('missing')), key: 'k3' },
        ],
        executions: [],
        deliveries: [],
        faults: [],
        unexpectedExits: [],
        unrecoveredRestarts: 0,
      },
      {
        tasks: new Map([
          ['t1', task('t1', { idempotency_key: 'k1' })],
          ['t2', task('t2', { idempotency_key: 'k1' })],
        ]),
        attempts: new Map([
          ['t1', [attempt('t1', 't1-a', { accepted_at: 50 })]],
          ['t2', [attempt('t2', 't2-a', { accepted_at: 150 })]],
        ]),
        history: new Map([
          ['t1', history('t1')],
          ['t2', history('t2')],
        ]),
        subscriptions: [{ subscription_id: 's', task_id: 't1', event_id: 'e', state: 'delivered' }],
      },
    );
    expect(failing(results).sort()).toEqual(
      [CHECKS.submitsDurable, CHECKS.settlements, CHECKS.idempotency, CHECKS.deliveries].sort(),
    );
  });

  // DESIGN §4.1 "a task fails for exhaustion when its dispatched attempts reach max_attempts";
  // §5 "lease expired, attempts left → queued".
  it('reports a task failed with lease_expired before its dispatched attempts reached max_attempts', () => {
    const t = task('t', {
      state: 'failed',
      failure_kind: 'lease_expired',
      attempt_count: 1,
      dispatch_count: 1,
      max_attempts: 3,
      history_sequence: 5,
    });
    const results = run({
      task: t,
      attempts: [attempt('t', 'a', { state: 'lost', accepted_at: null })],
      history: h(
        't',
        ['submitted', null],
        ['claimed', 'a'],
        ['dispatch_authorized', 'a'],
        ['lease_expired', 'a'],
        ['failed', 'a'],
      ),
    });
    expect(failing(results)).toContain(CHECKS.dispatch);
  });

  it('reports a task failed with a retryable execution failure before max_attempts', () => {
    const t = task('t', {
      state: 'failed',
      failure_kind: 'execution',
      execution_kind: 'timed_out',
      failure_retryable: true,
    });
    const results = run({
      ...clean(),
      task: t,
      attempts: [attempt('t', 'a', { state: 'failed', report: 'execution' })],
      history: clean().history.map((e) =>
        e.reason === 'succeeded' ? { ...e, reason: 'failed' } : e,
      ),
    });
    expect(failing(results)).toEqual([CHECKS.dispatch]);
    // Not retryable: failing at once is the policy.
    const final = run({
      ...clean(),
      task: { ...t, failure_retryable: false },
      attempts: [attempt('t', 'a', { state: 'failed', report: 'execution' })],
      history: clean().history.map((e) =>
        e.reason === 'succeeded' ? { ...e, reason: 'failed' } : e,
      ),
    });
    expect(failing(final)).toEqual([]);
  });

  // The handler of a `fail: 'once'` task throws on attempt 1 (worker-process.ts), and the worker
  // logged that execution's end as `error`.
  it("reports a task that succeeded on an attempt whose logged execution ended in the handler's error", () => {
    const results = run(
      { ...clean(), task: task('t', { data: { i: 0, ms: 5, fail: 'once' } }) },
      { executions: [exec('start', 'a', 1), exec('end', 'a', 1, 'error')] },
    );
    expect(failing(results)).toContain(CHECKS.outcomes);
  });

  it('reports an attempt settled as an application error whose logged execution returned', () => {
    const results = run(exhausted(['a1', 'a2', 'a3']), {
      executions: [exec('start', 'a2', 2), exec('end', 'a2', 2, 'ok')],
    });
    expect(failing(results)).toEqual([CHECKS.outcomes]);
  });

  // Deliveries are at least once, "always with the same event id and bytes" (README T2).
  it('reports a delivery of the event with the wrong state even when a later POST is right', () => {
    const results = run(clean(), { deliveries: [post('failed', 1), post('succeeded', 2)] }, [
      { subscription_id: 's', task_id: 't', event_id: 'e', state: 'delivered' },
    ]);
    expect(failing(results)).toContain(CHECKS.deliveries);
  });

  // README T2: "always with the same event id".
  it('reports a subscription whose acknowledged event id never reached the receiver', () => {
    const one = clean();
    const results = run(
      one,
      {
        submits: [ack(one.task), subscribed('e-told')],
        deliveries: [post('succeeded', 2)],
      },
      [{ subscription_id: 's', task_id: 't', event_id: 'e', state: 'delivered' }],
    );
    expect(failing(results)).toContain(CHECKS.deliveries);
  });

  // The run submits every task with TASK_RETRY (max_attempts 3, submitter.ts); the database's
  // own `max_attempts` is not the yardstick.
  it('reports a task dispatched more often than the retry policy it was submitted with', () => {
    const results = run(exhausted(['a1', 'a2', 'a3', 'a4', 'a5']));
    expect(TASK_RETRY.max_attempts).toBe(3);
    expect(failing(results)).toContain(CHECKS.dispatch);
  });

  // DESIGN §5 Acquire: "create the attempt and lease, append history `claimed` … all in one
  // transaction".
  it('reports an attempt row that has no claimed record in the history', () => {
    const results = run({
      ...clean(),
      task: task('t', { attempt_count: 2, history_sequence: 5 }),
      attempts: [
        attempt('t', 'a'),
        attempt('t', 'b', {
          ordinal: 2,
          state: 'failed',
          dispatch_allowed: false,
          accepted_at: null,
        }),
      ],
    });
    expect(failing(results)).toContain(CHECKS.history);
  });

  it('reports claimed attempts in another order than the attempt rows', () => {
    const one = {
      task: task('t', { attempt_count: 2, history_sequence: 8 }),
      // Rows by ordinal: a, then b; the history claimed b first.
      attempts: [
        attempt('t', 'a'),
        attempt('t', 'b', {
          ordinal: 2,
          state: 'lost',
          accepted_at: null,
          dispatch_allowed: false,
        }),
      ],
      history: h(
        't',
        ['submitted', null],
        ['claimed', 'b'],
        ['lease_expired', 'b'],
        ['retry_scheduled', 'b'],
        ['claimed', 'a'],
        ['dispatch_authorized', 'a'],
        ['report_accepted', 'a'],
        ['succeeded', 'a'],
      ),
    };
    expect(failing(run(one))).toEqual([CHECKS.history]);
  });
});
