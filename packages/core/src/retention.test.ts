import {
  MIN_RETENTION_MS,
  parseWith,
  RetentionPolicySchema,
  type SubmitCommand,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { cancelTask } from './cancel.js';
import { markDue, subscribeTask } from './completion.js';
import { DEFAULT_LIFECYCLE_CONFIG } from './config.js';
import {
  retentionCandidate,
  retentionCutoff,
  retentionPolicyView,
  retired,
  subscriptionProtects,
} from './retention.js';
import type { SubscriptionRow, TaskRow } from './rows.js';
import { submitTask } from './submit.js';

const T0 = 1_800_000_000_000;
const TERMINAL_AT = T0 + 1_000;
const DEFAULT_MS = 7 * 24 * 3_600_000;

const queued: TaskRow = (() => {
  const command: SubmitCommand = {
    idempotency_key: 'k1',
    input: { tenant_id: 'acme', namespace: 'prod', queue: 'q', program: { name: 'p' }, data: 1 },
  };
  return submitTask(
    null,
    command,
    T0,
    { task_id: 'tsk_1', run_id: 'run_1' },
    DEFAULT_LIFECYCLE_CONFIG,
  ).task;
})();
const terminal: TaskRow = cancelTask(queued, TERMINAL_AT).task;

/** A subscription of the task in `state`; finished ones finished at `finishedAt`. */
function subscription(state: SubscriptionRow['state'], finishedAt = TERMINAL_AT): SubscriptionRow {
  const row = subscribeTask(queued, [], { subscription_key: 'k', destination: 'billing' }, T0, {
    subscription_id: 'sub_1',
    event_id: 'evt_1',
  }).row;
  if (state === 'waiting') return row;
  const due = markDue(row, TERMINAL_AT);
  if (state === 'due') return due;
  if (state === 'delivering') return { ...due, state, attempts: 1 };
  return { ...due, state, attempts: 1, next_attempt_at: null, finished_at: finishedAt };
}

describe('retentionPolicyView', () => {
  it('a namespace without a row has the default, with no updated_at', () => {
    const view = retentionPolicyView(undefined, DEFAULT_MS);
    expect(view).toEqual({ retention_ms: DEFAULT_MS, source: 'default' });
    expect(parseWith(RetentionPolicySchema, view)).toEqual(view);
  });

  it('a namespace’s own row wins over the default', () => {
    const view = retentionPolicyView(
      { tenant_id: 'acme', namespace: 'prod', retention_ms: MIN_RETENTION_MS, updated_at: T0 },
      DEFAULT_MS,
    );
    expect(view).toEqual({ retention_ms: MIN_RETENTION_MS, source: 'namespace', updated_at: T0 });
    expect(parseWith(RetentionPolicySchema, view)).toEqual(view);
  });
});

describe('retentionCutoff', () => {
  it('is now − retention', () => {
    expect(retentionCutoff(T0, MIN_RETENTION_MS)).toBe(T0 - MIN_RETENTION_MS);
  });
});

describe('retentionCandidate', () => {
  it('a terminal task is a candidate only when it became terminal strictly before the cutoff', () => {
    expect(retentionCandidate(terminal, TERMINAL_AT + 1)).toBe(true);
    expect(retentionCandidate(terminal, TERMINAL_AT)).toBe(false);
    expect(retentionCandidate(terminal, TERMINAL_AT - 1)).toBe(false);
  });

  it('a live task is never a candidate, however old', () => {
    expect(retentionCandidate(queued, T0 + 10 ** 12)).toBe(false);
    expect(retentionCandidate({ ...queued, state: 'active' }, T0 + 10 ** 12)).toBe(false);
    // Even with a stray terminal_at: the state decides.
    expect(retentionCandidate({ ...queued, terminal_at: T0 }, T0 + 10 ** 12)).toBe(false);
  });
});

describe('subscriptionProtects', () => {
  it('a pending delivery (waiting, due or delivering) protects whatever its age', () => {
    for (const state of ['waiting', 'due', 'delivering'] as const) {
      expect(subscriptionProtects(subscription(state), T0 + 10 ** 12)).toBe(true);
    }
  });

  it('a finished delivery protects until its finish is strictly before the cutoff', () => {
    for (const state of ['delivered', 'exhausted'] as const) {
      const row = subscription(state, T0 + 5_000);
      expect(subscriptionProtects(row, T0 + 4_999)).toBe(true);
      expect(subscriptionProtects(row, T0 + 5_000)).toBe(true);
      expect(subscriptionProtects(row, T0 + 5_001)).toBe(false);
    }
  });
});

describe('retired', () => {
  const cutoff = TERMINAL_AT + 1;

  it('a candidate without subscriptions, or with only long-finished ones, is retired', () => {
    expect(retired(terminal, [], cutoff)).toBe(true);
    expect(retired(terminal, [subscription('delivered'), subscription('exhausted')], cutoff)).toBe(
      true,
    );
  });

  it('one protecting subscription keeps the task', () => {
    expect(retired(terminal, [subscription('delivered'), subscription('due')], cutoff)).toBe(false);
    expect(retired(terminal, [subscription('delivered', cutoff)], cutoff)).toBe(false);
  });

  it('a non-candidate is never retired', () => {
    expect(retired(terminal, [], TERMINAL_AT)).toBe(false);
    expect(retired(queued, [], T0 + 10 ** 12)).toBe(false);
  });
});
