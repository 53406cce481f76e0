import {
  type AcquireCommand,
  ContractError,
  type SettleCommand,
  type SubmitCommand,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { claimTask, classifyPoll, replayPoll } from './acquire.js';
import { cancelTask } from './cancel.js';
import { lifecycleConfig } from './config.js';
import { commandDigest } from './digest.js';
import { leaseOwner } from './lease.js';
import { recoverExpiredLease } from './recovery.js';
import { renewLease } from './renew.js';
import type { AttemptRow, SessionRow, TaskRow } from './rows.js';
import { openSession } from './session.js';
import { confirmQuiescence, heldDecision, settleAttempt } from './settle.js';
import { submitTask } from './submit.js';
import { withKeysReversed } from './testing/fixtures.js';

const T0 = 1_800_000_000_000;
const config = lifecycleConfig({
  leaseDurationMs: 30_000,
  cleanupGraceMs: 30_000,
  leaseSafetyMarginMs: 5_000,
  sessionValidityMs: 300_000,
});
const scope = { tenant_id: 'acme', namespace: 'prod' };

function submitCommand(overrides: Partial<SubmitCommand['input']> = {}, key = 'k1'): SubmitCommand {
  return {
    idempotency_key: key,
    input: {
      tenant_id: scope.tenant_id,
      namespace: scope.namespace,
      queue: 'email',
      program: { name: 'send' },
      data: { to: 'ada' },
      ...overrides,
    },
  };
}

function queuedTask(overrides: Partial<SubmitCommand['input']> = {}): TaskRow {
  const command = submitCommand(overrides);
  return submitTask(null, command, T0, { task_id: 'tsk_1', run_id: 'run_1' }, config).task;
}

const session: SessionRow = openSession(
  { scope, queue: 'email', concurrency: 2 },
  'ses_1',
  T0,
  config,
);

function poll(sequence: number, consumer = 0): AcquireCommand {
  return { scope, queue: 'email', worker_session_id: 'ses_1', consumer_id: consumer, sequence };
}

function claimed(task = queuedTask(), at = T0) {
  return claimTask(task, poll(1), at, { attempt_id: 'att_1', lease_id: 'lse_1' }, config);
}

function settleCommand(
  task: TaskRow,
  attempt: AttemptRow,
  report: SettleCommand['report'],
  quiescence: SettleCommand['quiescence'] = 'confirmed',
  operation = 'op-1',
): SettleCommand {
  return {
    owner: leaseOwner(task, attempt),
    operation_id: operation,
    report,
    quiescence,
    processing_trace: null,
  };
}

const success = (attempt: AttemptRow, output: unknown = { ok: true }): SettleCommand['report'] => ({
  kind: 'completed',
  report: {
    context: { identity: { task_id: attempt.task_id, attempt_id: attempt.attempt_id } },
    outcome: { kind: 'success', output },
  },
});

const crash = (retryable: boolean): SettleCommand['report'] => ({
  kind: 'failed',
  report: { kind: 'crashed', message: 'boom', retryable },
});

function codeOf(run: () => unknown): string {
  try {
    run();
  } catch (error) {
    if (error instanceof ContractError) return error.code;
    throw error;
  }
  return 'no error';
}

/** Claims and grants dispatch, as a worker's first renew does. */
function dispatched(task = queuedTask(), at = T0) {
  const claim = claimed(task, at);
  const renew = renewLease(
    claim.task,
    claim.attempt,
    { owner: leaseOwner(claim.task, claim.attempt), sequence: 1, intent: 'dispatch' },
    at + 10,
    config,
  );
  return {
    task: renew.task,
    attempt: renew.attempt,
    history: [...claim.history, ...renew.history],
  };
}

describe('submitTask', () => {
  it('applies the DESIGN §4.1 defaults and records `submitted` as sequence 1', () => {
    const task = queuedTask();
    expect(task.retry).toEqual({
      max_attempts: 3,
      delay_ms: 1000,
      backoff: 'exponential',
      max_delay_ms: 60_000,
    });
    expect([task.priority, task.timeout_ms, task.state, task.available_at]).toEqual([
      0,
      300_000,
      'queued',
      T0,
    ]);
    expect(task.history_sequence).toBe(1);
  });

  it('returns the existing task for the same command and conflicts on another', () => {
    const command = submitCommand();
    const first = submitTask(null, command, T0, { task_id: 'a', run_id: 'b' }, config);
    const again = submitTask(first.task, command, T0 + 5, { task_id: 'c', run_id: 'd' }, config);
    expect(again.created).toBe(false);
    expect(again.reply.task_id).toBe('a');
    const other = submitCommand({ data: { to: 'bob' } });
    expect(
      codeOf(() => submitTask(first.task, other, T0, { task_id: 'e', run_id: 'f' }, config)),
    ).toBe('conflict');
  });

  it('records no digest and compares a replay with the command rebuilt from the task', () => {
    const trace = { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' };
    const command: SubmitCommand = {
      ...submitCommand({
        data: { z: [1e21, -0, 'é\u2028'], a: { y: null, b: true } },
        labels: { team: 'red' },
        priority: 3,
      }),
      origin_trace: trace,
    };
    const ids = { task_id: 'a', run_id: 'b' };
    const first = submitTask(null, command, T0, ids, config);
    expect(first.task.command_digest).toBeNull();
    // The same command with every object's keys in another order: a replay.
    const reordered = withKeysReversed(command);
    expect(Object.keys(reordered)).toEqual(Object.keys(command).reverse());
    expect(submitTask(first.task, reordered, T0 + 5, ids, config).created).toBe(false);
    // Any difference is another command: deep in the data, a label, the trace, or no trace.
    const { origin_trace: _trace, ...untraced } = command;
    for (const other of [
      {
        ...command,
        input: { ...command.input, data: { ...(command.input.data as object), a: 1 } },
      },
      { ...command, input: { ...command.input, labels: { team: 'blue' } } },
      { ...command, origin_trace: { traceparent: trace.traceparent.replace('01', '00') } },
      untraced,
    ]) {
      expect(codeOf(() => submitTask(first.task, other, T0, ids, config))).toBe('conflict');
    }
  });

  it('compares a replay as sent: a field written out at its default is another command (worker README)', () => {
    const ids = { task_id: 'a', run_id: 'b' };
    const first = submitTask(null, submitCommand(), T0, ids, config);
    expect(first.task.priority).toBe(0);
    expect(first.task.timeout_ms).toBe(300_000);
    for (const spelled of [{ priority: 0 }, { timeout_ms: 300_000 }]) {
      expect(codeOf(() => submitTask(first.task, submitCommand(spelled), T0, ids, config))).toBe(
        'conflict',
      );
    }
    // And the other way round: a task first spelled with the default is not replayed without it.
    const explicit = submitTask(null, submitCommand({ priority: 0 }), T0, ids, config);
    expect(codeOf(() => submitTask(explicit.task, submitCommand(), T0, ids, config))).toBe(
      'conflict',
    );
    expect(submitTask(explicit.task, submitCommand({ priority: 0 }), T0, ids, config).created).toBe(
      false,
    );
  });

  it('treats a null origin trace as none when comparing a replay (DESIGN §4.1)', () => {
    const command = submitCommand();
    const ids = { task_id: 'a', run_id: 'b' };
    const first = submitTask(null, command, T0, ids, config);
    const withNull = { ...command, origin_trace: null } as unknown as SubmitCommand;
    expect(submitTask(first.task, withNull, T0, ids, config).created).toBe(false);
  });

  it('compares by the recorded digest a task submitted by an earlier version holds', () => {
    const command = submitCommand();
    const ids = { task_id: 'a', run_id: 'b' };
    const first = submitTask(null, command, T0, ids, config);
    const recorded = { ...first.task, command_digest: commandDigest(command) };
    expect(submitTask(recorded, command, T0, ids, config).created).toBe(false);
    // A digest that is not the command's decides, though the recorded input is the same.
    const mismatched = { ...first.task, command_digest: commandDigest(submitCommand({}, 'k2')) };
    expect(codeOf(() => submitTask(mismatched, command, T0, ids, config))).toBe('conflict');
  });

  it('replays a fixed retry in any spelling against a task that recorded another (a3s canonical RetryPolicy)', () => {
    const ids = { task_id: 'a', run_id: 'b' };
    const spellings = [
      { max_attempts: 2, delay_ms: 10 },
      { max_attempts: 2, delay_ms: 10, backoff: 'fixed' as const },
      { max_attempts: 2, delay_ms: 10, max_delay_ms: 0 },
      { max_attempts: 2, delay_ms: 10, backoff: 'fixed' as const, max_delay_ms: 0 },
    ];
    for (const stored of spellings) {
      // A task recorded before the decoder canonicalised retry keeps the client's spelling.
      const recorded = submitCommand({ retry: stored });
      const first = submitTask(null, recorded, T0, ids, config);
      const digestRow = { ...first.task, command_digest: commandDigest(recorded) };
      for (const retry of spellings) {
        const replay = submitCommand({ retry });
        expect(submitTask(first.task, replay, T0, ids, config).created).toBe(false);
        expect(submitTask(digestRow, replay, T0, ids, config).created).toBe(false);
      }
      for (const retry of [
        { max_attempts: 3, delay_ms: 10 },
        { max_attempts: 2, delay_ms: 10, backoff: 'exponential' as const, max_delay_ms: 10 },
      ]) {
        const other = submitCommand({ retry });
        expect(codeOf(() => submitTask(first.task, other, T0, ids, config))).toBe('conflict');
        expect(codeOf(() => submitTask(digestRow, other, T0, ids, config))).toBe('conflict');
      }
      // The comparison does not rewrite the row.
      expect(first.task.input).toEqual(recorded.input);
    }
  });

  it('refuses to compare a replay with a task read without its data', () => {
    const command = submitCommand();
    const ids = { task_id: 'a', run_id: 'b' };
    const { task } = submitTask(null, command, T0, ids, config);
    const { data: _data, ...withoutData } = task.input;
    const unloaded = { ...task, input: withoutData } as TaskRow;
    expect(() => submitTask(unloaded, command, T0, ids, config)).toThrow(/loaded without its data/);
  });

  it('refuses a timeout_ms, explicit or default, less than MIN_DISPATCH_WINDOW_MS above the lease safety margin', () => {
    const ids = { task_id: 'x', run_id: 'y' };
    const refusal = (command: SubmitCommand, margin: number) => {
      try {
        submitTask(null, command, T0, ids, lifecycleConfig({ leaseSafetyMarginMs: margin }));
      } catch (error) {
        if (error instanceof ContractError) return error.toJSON();
        throw error;
      }
      return undefined;
    };
    expect(refusal(submitCommand({ timeout_ms: 5_499 }), 5_000)).toEqual({
      code: 'invalid_input',
      message:
        "timeout_ms must be at least 500 ms more than the server's lease safety margin " +
        '(5000 ms): dispatch is granted only while more than the margin remains, so a shorter ' +
        'budget leaves a worker no time to start an attempt; use at least 5500',
      retryable: false,
      reason: 'schema',
      path: '$.input.timeout_ms',
    });
    expect(refusal(submitCommand({ timeout_ms: 5_500 }), 5_000)).toBeUndefined();
    // The default budget (5 min) is held to the same bound.
    expect(refusal(submitCommand(), 299_501)).toMatchObject({ path: '$.input.timeout_ms' });
    expect(refusal(submitCommand(), 299_500)).toBeUndefined();
    // A short margin leaves the contract's least budget (MIN_TIMEOUT_MS) accepted.
    expect(refusal(submitCommand({ timeout_ms: 1_000 }), 500)).toBeUndefined();
  });

  it('answers a replay of a task as before, whatever its timeout and the margin now', () => {
    const command = submitCommand({ timeout_ms: 1_000 });
    const ids = { task_id: 'a', run_id: 'b' };
    // Accepted when the margin was shorter (an earlier configuration, or an earlier version).
    const first = submitTask(null, command, T0, ids, lifecycleConfig({ leaseSafetyMarginMs: 500 }));
    const again = submitTask(first.task, command, T0 + 5, ids, config);
    expect(again).toMatchObject({ created: false, reply: first.reply });
    // Another command on its key is the conflict it always was.
    const other = submitCommand({ timeout_ms: 1_001 });
    expect(codeOf(() => submitTask(first.task, other, T0, ids, config))).toBe('conflict');
  });

  it('schedules by delay_ms or available_at, and defaults a concurrency key to a mutex', () => {
    expect(queuedTask({ delay_ms: 5_000 }).available_at).toBe(T0 + 5_000);
    expect(queuedTask({ available_at: T0 + 9 }).available_at).toBe(T0 + 9);
    expect(queuedTask({ concurrency_key: 'user-1' }).concurrency_limit).toBe(1);
    const tooFar = submitCommand({ available_at: T0 + 366 * 86_400_000 });
    expect(codeOf(() => submitTask(null, tooFar, T0, { task_id: 'x', run_id: 'y' }, config))).toBe(
      'invalid_input',
    );
  });
});

describe('acquisition', () => {
  it('classifies polls in the order of DESIGN §4.1', () => {
    const expired = { ...session, expires_at: T0 };
    expect(codeOf(() => classifyPoll(null, null, null, poll(1), T0))).toBe('session_not_found');
    expect(codeOf(() => classifyPoll(expired, null, null, poll(1), T0))).toBe('session_expired');
    expect(codeOf(() => classifyPoll(session, null, null, { ...poll(1), queue: 'sms' }, T0))).toBe(
      'invalid_input',
    );
    expect(codeOf(() => classifyPoll(session, null, null, poll(1, 2), T0))).toBe('invalid_input');
    expect(codeOf(() => classifyPoll(session, null, null, poll(2), T0))).toBe('sequence_conflict');
    expect(classifyPoll(session, null, null, poll(1), T0)).toEqual({ kind: 'new' });
  });

  it('a claim leases min(now + lease, authority deadline) with a fresh authority', () => {
    const claim = claimed(queuedTask({ timeout_ms: 6_000 }));
    expect(claim.attempt.deadline).toBe(T0 + 6_000);
    expect(claim.attempt.authority_deadline).toBe(T0 + 36_000);
    expect(claim.attempt.lease_expires_at).toBe(T0 + 30_000);
    const short = claimTask(
      queuedTask({ timeout_ms: 6_000 }),
      poll(1),
      T0,
      { attempt_id: 'a', lease_id: 'l' },
      lifecycleConfig({ leaseDurationMs: 60_000, cleanupGraceMs: 1_000 }),
    );
    expect(short.attempt.lease_expires_at).toBe(T0 + 7_000);
    if (claim.reply.disposition !== 'assigned') throw new Error('expected an assignment');
    expect(claim.reply.assignment.authority).toMatchObject({
      renew_sequence: 0,
      dispatch_allowed: false,
      cancel_requested: false,
      remaining_ms: 30_000,
    });
    expect(claim.reply.assignment.event).toMatchObject({
      id: 'att_1',
      ldgattempt: 1,
      ldgtaskid: 'tsk_1',
      data: { to: 'ada' },
    });
    expect(claim.task).toMatchObject({ state: 'active', attempt_count: 1 });
    expect(claim.history.map((h) => [h.sequence, h.reason])).toEqual([[2, 'claimed']]);
  });

  it('a busy slot refuses a new poll until its lease lapses', () => {
    const claim = claimed();
    expect(codeOf(() => classifyPoll(session, claim.cursor, claim.attempt, poll(2), T0 + 1))).toBe(
      'consumer_busy',
    );
    expect(classifyPoll(session, claim.cursor, claim.attempt, poll(2), T0 + 30_000)).toEqual({
      kind: 'new',
    });
  });

  it('a replay samples authority afresh, or reports lost ownership', () => {
    const claim = claimed();
    const later = replayPoll(claim.cursor, claim.task, claim.attempt, T0 + 7_000);
    if (later.disposition !== 'assigned') throw new Error('expected an assignment');
    expect(later.assignment.authority.remaining_ms).toBe(23_000);
    expect(replayPoll(claim.cursor, claim.task, claim.attempt, T0 + 30_000)).toEqual({
      disposition: 'ownership_lost',
      sequence: 1,
      assignment: { task_id: 'tsk_1', attempt_id: 'att_1' },
    });
  });
});

describe('renewLease', () => {
  it('grants dispatch once, counts it, and replays without extending twice', () => {
    const claim = claimed();
    const owner = leaseOwner(claim.task, claim.attempt);
    const first = renewLease(
      claim.task,
      claim.attempt,
      { owner, sequence: 1, intent: 'dispatch' },
      T0 + 1_000,
      config,
    );
    expect(first.reply).toMatchObject({
      dispatch_allowed: true,
      renew_sequence: 1,
      expires_at: T0 + 31_000,
    });
    expect(first.task.dispatch_count).toBe(1);
    expect(first.history.map((h) => h.reason)).toEqual(['dispatch_authorized']);
    const replay = renewLease(
      first.task,
      first.attempt,
      { owner, sequence: 1, intent: 'dispatch' },
      T0 + 5_000,
      config,
    );
    expect(replay.changed).toBe(false);
    expect(replay.reply.expires_at).toBe(T0 + 31_000);
    expect(replay.reply.remaining_ms).toBe(26_000);
    expect(
      codeOf(() =>
        renewLease(
          first.task,
          first.attempt,
          { owner, sequence: 1, intent: 'keep_alive' },
          T0 + 5_000,
          config,
        ),
      ),
    ).toBe('conflict');
    expect(
      codeOf(() =>
        renewLease(
          first.task,
          first.attempt,
          { owner, sequence: 3, intent: 'keep_alive' },
          T0 + 5_000,
          config,
        ),
      ),
    ).toBe('sequence_conflict');
    const again = renewLease(
      first.task,
      first.attempt,
      { owner, sequence: 2, intent: 'dispatch' },
      T0 + 6_000,
      config,
    );
    expect(again.history).toEqual([]);
    expect(again.task.dispatch_count).toBe(1);
  });

  it('refuses dispatch within the safety margin or after cancel, and fences stale owners', () => {
    const claim = claimed(queuedTask({ timeout_ms: 10_000 }));
    const owner = leaseOwner(claim.task, claim.attempt);
    const late = renewLease(
      claim.task,
      claim.attempt,
      { owner, sequence: 1, intent: 'dispatch' },
      T0 + 5_000,
      config,
    );
    expect(late.reply.dispatch_allowed).toBe(false);
    const cancelled = cancelTask(claim.task, T0 + 1).task;
    expect(
      renewLease(
        cancelled,
        claim.attempt,
        { owner, sequence: 1, intent: 'dispatch' },
        T0 + 2,
        config,
      ).reply,
    ).toMatchObject({ dispatch_allowed: false, cancel_requested: true });
    for (const stale of [
      { ...owner, lease_id: 'other' },
      { ...owner, consumer_id: 1 },
      { ...owner, worker_session_id: 'ses_2' },
      { ...owner, generation: 2 },
      { ...owner, scope: { ...scope, namespace: 'dev' } },
    ]) {
      expect(
        codeOf(() =>
          renewLease(
            claim.task,
            claim.attempt,
            { owner: stale, sequence: 1, intent: 'keep_alive' },
            T0 + 1,
            config,
          ),
        ),
      ).toBe('ownership_lost');
    }
    expect(
      codeOf(() =>
        renewLease(
          claim.task,
          claim.attempt,
          { owner, sequence: 1, intent: 'keep_alive' },
          T0 + 30_000,
          config,
        ),
      ),
    ).toBe('ownership_lost');
  });
});

describe('settleAttempt', () => {
  it('succeeds once; the same operation replays, anything else conflicts', () => {
    const { task, attempt } = dispatched();
    const command = settleCommand(task, attempt, success(attempt));
    const first = settleAttempt(task, attempt, command, T0 + 100);
    expect(first.reply).toMatchObject({ already_accepted: false, task_state: 'succeeded' });
    expect(first.task.outcome).toEqual({ state: 'succeeded', output: { ok: true } });
    expect(first.history.map((h) => h.reason)).toEqual(['report_accepted', 'succeeded']);
    // Replayed after the lease ended: the receipt still answers.
    const replay = settleAttempt(first.task, first.attempt, command, T0 + 99_999);
    expect(replay.reply).toEqual({ ...first.reply, already_accepted: true });
    const changed = settleCommand(task, attempt, success(attempt, 2));
    expect(codeOf(() => settleAttempt(first.task, first.attempt, changed, T0 + 200))).toBe(
      'conflict',
    );
    const second = settleCommand(task, attempt, success(attempt), 'confirmed', 'op-2');
    expect(codeOf(() => settleAttempt(first.task, first.attempt, second, T0 + 200))).toBe(
      'conflict',
    );
  });

  it('records no digest and compares a second settlement canonically', () => {
    const { task, attempt } = dispatched();
    const output = { z: [1e21, -0, 'é\u2028'], a: { y: null, b: true } };
    const command = settleCommand(task, attempt, success(attempt, output));
    const first = settleAttempt(task, attempt, command, T0 + 100);
    expect(first.attempt.settlement_digest).toBeNull();
    // The same command with every object's keys in another order (as a JSON column returns
    // it, or a client re-encodes it): the same canonical command, a replay.
    const reordered = withKeysReversed(command);
    expect(Object.keys(reordered)).toEqual(Object.keys(command).reverse());
    expect(settleAttempt(first.task, first.attempt, reordered, T0 + 200).reply).toEqual({
      ...first.reply,
      already_accepted: true,
    });
    // One value deep inside the output differs: the same operation id, another command.
    const deep = settleCommand(
      task,
      attempt,
      success(attempt, { ...output, a: { y: 0, b: true } }),
    );
    expect(codeOf(() => settleAttempt(first.task, first.attempt, deep, T0 + 200))).toBe('conflict');
  });

  it('compares by the recorded digest an attempt settled by an earlier version holds', () => {
    const { task, attempt } = dispatched();
    const command = settleCommand(task, attempt, success(attempt));
    const first = settleAttempt(task, attempt, command, T0 + 100);
    const recorded = { ...first.attempt, settlement_digest: commandDigest(command) };
    expect(settleAttempt(first.task, recorded, command, T0 + 200).reply.already_accepted).toBe(
      true,
    );
    // A digest that is not the command's decides, though the recorded command is the same.
    const other = settleCommand(task, attempt, success(attempt, 2));
    const mismatched = { ...first.attempt, settlement_digest: commandDigest(other) };
    expect(codeOf(() => settleAttempt(first.task, mismatched, command, T0 + 200))).toBe('conflict');
  });

  it('retries retryable failures while dispatched attempts remain, then fails', () => {
    let { task, attempt } = dispatched(queuedTask({ retry: { max_attempts: 2, delay_ms: 250 } }));
    let command = settleCommand(task, attempt, crash(true));
    const retry = settleAttempt(task, attempt, command, T0 + 100);
    expect(retry.task).toMatchObject({ state: 'queued', available_at: T0 + 350 });
    expect(retry.attempt.state).toBe('failed');
    expect(retry.history.map((h) => h.reason)).toEqual(['report_accepted', 'retry_scheduled']);
    ({ task, attempt } = dispatched(retry.task, T0 + 400));
    command = settleCommand(task, attempt, crash(true));
    const final = settleAttempt(task, attempt, command, T0 + 500);
    expect(final.task.state).toBe('failed');
    expect(final.task.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'crashed', message: 'boom', retryable: true } },
    });
    const fatal = dispatched();
    const noRetry = settleCommand(fatal.task, fatal.attempt, crash(false));
    expect(settleAttempt(fatal.task, fatal.attempt, noRetry, T0 + 50).task.state).toBe('failed');
  });

  it('cancels when cancel was requested, and rejects a report about another attempt', () => {
    const { task, attempt } = dispatched();
    const requested = cancelTask(task, T0 + 20).task;
    const command = settleCommand(requested, attempt, success(attempt));
    expect(settleAttempt(requested, attempt, command, T0 + 30).task.outcome).toEqual({
      state: 'cancelled',
    });
    const wrong = settleCommand(task, attempt, success({ ...attempt, attempt_id: 'att_9' }));
    expect(codeOf(() => settleAttempt(task, attempt, wrong, T0 + 30))).toBe('invalid_input');
  });

  it('holds the outcome while cleanup is unconfirmed, then applies it once', () => {
    const { task, attempt } = dispatched();
    const command = settleCommand(task, attempt, success(attempt), 'unconfirmed');
    const held = settleAttempt(task, attempt, command, T0 + 100);
    expect(held.reply.task_state).toBe('active');
    expect(held.history.map((h) => h.reason)).toEqual(['report_accepted']);
    const owner = leaseOwner(task, attempt);
    const confirmed = confirmQuiescence(held.task, held.attempt, owner, T0 + 200);
    expect(confirmed.reply).toBe('succeeded');
    expect(confirmed.history.map((h) => h.reason)).toEqual(['cleanup_confirmed', 'succeeded']);
    expect(confirmQuiescence(confirmed.task, confirmed.attempt, owner, T0 + 300).changed).toBe(
      false,
    );
    expect(codeOf(() => confirmQuiescence(task, attempt, owner, T0 + 1))).toBe('conflict');
  });
});

describe('heldDecision', () => {
  it('lets a later cancel win over a held retry, but not over a known outcome', () => {
    const { task } = dispatched();
    const requested = cancelTask(task, T0 + 5).task;
    const failure = { kind: 'lease_expired' as const, attempts: 1 };
    expect(heldDecision(requested, { kind: 'retry', delay_ms: 10, failure })).toEqual({
      kind: 'cancel',
    });
    expect(heldDecision(task, { kind: 'retry', delay_ms: 10, failure }).kind).toBe('retry');
    expect(heldDecision(requested, { kind: 'succeed', output: 1 })).toEqual({
      kind: 'succeed',
      output: 1,
    });
    expect(heldDecision(requested, { kind: 'fail', failure }).kind).toBe('fail');
  });
});

describe('recoverExpiredLease', () => {
  it('ignores a live lease, and re-queues a lost dispatched attempt with attempts left', () => {
    const { task, attempt } = dispatched();
    expect(recoverExpiredLease(task, attempt, T0 + 29_000)).toBeNull();
    const recovered = recoverExpiredLease(task, attempt, T0 + 31_000);
    expect(recovered?.outcome).toBe('requeued');
    expect(recovered?.attempt.state).toBe('lost');
    expect(recovered?.history.map((h) => h.reason)).toEqual(['lease_expired', 'retry_scheduled']);
  });

  it('does not count an attempt never granted dispatch against max_attempts', () => {
    const claim = claimed(queuedTask({ retry: { max_attempts: 1, delay_ms: 0 } }));
    const recovered = recoverExpiredLease(claim.task, claim.attempt, T0 + 30_000);
    expect(recovered?.outcome).toBe('requeued');
    expect(recovered?.task).toMatchObject({ state: 'queued', attempt_count: 1, dispatch_count: 0 });
  });

  it('fails with lease_expired once dispatched attempts are exhausted, and cancels when asked', () => {
    const one = dispatched(queuedTask({ retry: { max_attempts: 1, delay_ms: 0 } }));
    const failed = recoverExpiredLease(one.task, one.attempt, T0 + 40_000);
    expect(failed?.task.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'lease_expired', attempts: 1 },
    });
    const two = dispatched();
    const requested = cancelTask(two.task, T0 + 5).task;
    expect(recoverExpiredLease(requested, two.attempt, T0 + 40_000)?.task.outcome).toEqual({
      state: 'cancelled',
    });
  });

  it('applies a held decision rather than losing a settled attempt', () => {
    const { task, attempt } = dispatched();
    const command = settleCommand(task, attempt, success(attempt), 'unconfirmed');
    const held = settleAttempt(task, attempt, command, T0 + 100);
    // Held to the authority deadline (DESIGN §5), not to the lease the attempt had.
    expect(held.attempt.lease_expires_at).toBe(attempt.authority_deadline);
    expect(attempt.lease_expires_at).toBeLessThan(attempt.authority_deadline);
    expect(recoverExpiredLease(held.task, held.attempt, attempt.lease_expires_at + 1)).toBeNull();
    const recovered = recoverExpiredLease(held.task, held.attempt, attempt.authority_deadline);
    expect(recovered?.outcome).toBe('finalized');
    expect(recovered?.task.state).toBe('succeeded');
    expect(recovered?.attempt.state).toBe('succeeded');
  });
});

describe('a task no attempt of which could ever be granted dispatch', () => {
  // Submit refuses a timeout_ms within the safety margin; one stored earlier, or before the
  // margin was raised, is failed rather than re-queued forever (its attempts never count).
  const raised = lifecycleConfig({ ...config, leaseSafetyMarginMs: 60_000 });

  it('fails on a retryable failure settled for an attempt refused dispatch', () => {
    const claim = claimed(queuedTask({ timeout_ms: 30_000 }));
    const command = settleCommand(claim.task, claim.attempt, crash(true));
    expect(settleAttempt(claim.task, claim.attempt, command, T0 + 10, raised).task.state).toBe(
      'failed',
    );
    // Under the margin it was submitted with, the same report retries.
    expect(settleAttempt(claim.task, claim.attempt, command, T0 + 10, config).task.state).toBe(
      'queued',
    );
  });

  it('fails with lease_expired when its lease is lost', () => {
    const claim = claimed(queuedTask({ timeout_ms: 30_000 }));
    const recovered = recoverExpiredLease(claim.task, claim.attempt, T0 + 30_000, raised);
    expect(recovered?.task.outcome).toEqual({
      state: 'failed',
      failure: { kind: 'lease_expired', attempts: 1 },
    });
  });
});

describe('cancelTask', () => {
  it('cancels queued tasks at once, requests it for active ones, and leaves terminal ones', () => {
    const queued = cancelTask(queuedTask(), T0 + 1);
    expect(queued).toMatchObject({ changed: true, reply: 'cancelled' });
    expect(queued.task.outcome).toEqual({ state: 'cancelled' });
    const active = cancelTask(claimed().task, T0 + 1);
    expect(active).toMatchObject({ changed: true, reply: 'active' });
    expect(active.task.cancel_requested_at).toBe(T0 + 1);
    expect(cancelTask(active.task, T0 + 2).changed).toBe(false);
    expect(cancelTask(queued.task, T0 + 3)).toMatchObject({ changed: false, reply: 'cancelled' });
  });
});
