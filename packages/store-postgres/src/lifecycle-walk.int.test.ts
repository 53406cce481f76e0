/**
 * A seeded random walk over the task lifecycle (review r52c) (DESIGN §5) against the real
 * PostgreSQL store, with a small reference model written from DESIGN §5 (the diagram and every
 * bullet), §4.1 (attempt counting, fresh authority) and seed 000 (TransitionReason, history).
 *
 * After every step the model and the store must agree on each task's state, attempt_count,
 * current_attempt_id, available_at, terminal_at, cancel_requested_at and outcome; on each
 * attempt's state, lease expiry, dispatch grant, settlement and quiescence; and on the exact
 * history (reasons and attempt ids, gapless sequences from 1, times ordered and equal to the
 * transition's store time). Replays of any earlier command must append nothing.
 *
 * Store time moves with the real clock plus the harness offset: the walk keeps every decision
 * away from a boundary (it nudges the clock past one that is too close before each step), so each
 * step has exactly one right answer.
 */
import {
  type AcquireCommand,
  type AcquireReply,
  type Authority,
  ContractError,
  canonicalEqual,
  type LeaseOwner,
  type RecordedHistoryEvent,
  type RenewCommand,
  type Scope,
  type SettleCommand,
  type SettleReply,
  type SubmitCommand,
  type TaskFailure,
  type TaskState,
  type TransitionReason,
} from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { type Harness, harness } from './testdata/fixtures.js';

const CONFIG = lifecycleConfig({
  leaseDurationMs: 2_000,
  cleanupGraceMs: 1_000,
  leaseSafetyMarginMs: 500,
  sessionValidityMs: 100_000_000,
});
const SLOTS = 3;
const QUEUE = 'walk';
/** No decision boundary may lie this close after a step's start. */
const GUARD_MS = 150;

// ---- steps ----------------------------------------------------------------------------------

type Outcome = 'success' | 'exec_retry' | 'exec_fatal' | 'app_default' | 'app_retry' | 'app_fatal';
type Step =
  | { k: 'submit'; key: number; variant: 'same' | 'other' }
  | { k: 'poll'; slot: number; mode: 'next' | 'replay' | 'gap' }
  | {
      k: 'renew';
      slot: number;
      intent: 'dispatch' | 'keep_alive';
      mode: 'next' | 'replay' | 'other_intent' | 'gap' | 'stale_owner';
      batch: 0 | 1 | 2; // 0 single, 1 batch of one, 2 batch of [next, replay]
    }
  | {
      k: 'settle';
      slot: number;
      outcome: Outcome;
      quiescence: 'confirmed' | 'unconfirmed';
      op: 'fresh' | 'same' | 'reuse_other';
      batch: 0 | 1 | 2; // 2: the command twice in one batch
    }
  | { k: 'pollBatch'; modes: ('skip' | 'next' | 'replay')[] }
  | { k: 'confirm'; slot: number }
  | { k: 'cancel'; key: number }
  | { k: 'advance'; ms: number }
  | { k: 'recover' }
  | { k: 'replay'; pick: number; batch: 0 | 1 }
  | {
      k: 'twin';
      what: 'submit' | 'poll' | 'renew' | 'settle' | 'confirm' | 'cancel' | 'recover';
      n: number;
      intent: 'dispatch' | 'keep_alive';
      outcome: Outcome;
      quiescence: 'confirmed' | 'unconfirmed';
    };

function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function generate(seed: number, n: number): Step[] {
  const r = mulberry32(seed);
  const int = (k: number) => Math.floor(r() * k);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)] as T;
  const weights: [Step['k'], number][] = [
    ['submit', 3],
    ['poll', 4],
    ['pollBatch', 1.5],
    ['renew', 6],
    ['settle', 5],
    ['confirm', 1.5],
    ['cancel', 1.5],
    ['advance', 1.5],
    ['recover', 1.5],
    ['replay', 3],
    ['twin', 2.5],
  ];
  const total = weights.reduce((s, [, w]) => s + w, 0);
  const steps: Step[] = [];
  for (let i = 0; i < n; i++) {
    let x = r() * total;
    let kind: Step['k'] = 'submit';
    for (const [k, w] of weights) {
      if (x < w) {
        kind = k;
        break;
      }
      x -= w;
    }
    switch (kind) {
      case 'submit':
        steps.push({ k: 'submit', key: int(16), variant: r() < 0.1 ? 'other' : 'same' });
        break;
      case 'poll':
        steps.push({
          k: 'poll',
          slot: int(SLOTS),
          mode: pick(['next', 'next', 'next', 'replay', 'gap'] as const),
        });
        break;
      case 'renew':
        steps.push({
          k: 'renew',
          slot: int(SLOTS),
          intent: pick(['dispatch', 'dispatch', 'keep_alive'] as const),
          mode: pick([
            'next',
            'next',
            'next',
            'replay',
            'other_intent',
            'gap',
            'stale_owner',
          ] as const),
          batch: pick([0, 0, 1, 2] as const),
        });
        break;
      case 'settle':
        steps.push({
          k: 'settle',
          slot: int(SLOTS),
          outcome: pick([
            'success',
            'exec_retry',
            'exec_fatal',
            'app_default',
            'app_retry',
            'app_fatal',
          ] as const),
          quiescence: pick(['confirmed', 'confirmed', 'unconfirmed'] as const),
          op: pick(['fresh', 'fresh', 'same', 'reuse_other'] as const),
          batch: pick([0, 0, 1, 2] as const),
        });
        break;
      case 'pollBatch':
        steps.push({
          k: 'pollBatch',
          modes: Array.from({ length: SLOTS }, () =>
            pick(['skip', 'next', 'next', 'replay'] as const),
          ),
        });
        break;
      case 'confirm':
        steps.push({ k: 'confirm', slot: int(SLOTS) });
        break;
      case 'cancel':
        steps.push({ k: 'cancel', key: int(16) });
        break;
      case 'advance':
        steps.push({ k: 'advance', ms: r() < 0.8 ? 30 + int(600) : 2_000 + int(3_000) });
        break;
      case 'recover':
        steps.push({ k: 'recover' });
        break;
      case 'replay':
        steps.push({ k: 'replay', pick: r(), batch: pick([0, 1] as const) });
        break;
      case 'twin':
        steps.push({
          k: 'twin',
          what: pick([
            'submit',
            'poll',
            'poll',
            'renew',
            'renew',
            'settle',
            'settle',
            'confirm',
            'cancel',
            'recover',
          ] as const),
          n: int(16),
          intent: pick(['dispatch', 'dispatch', 'keep_alive'] as const),
          outcome: pick([
            'success',
            'exec_retry',
            'exec_fatal',
            'app_default',
            'app_retry',
            'app_fatal',
          ] as const),
          quiescence: pick(['confirmed', 'confirmed', 'unconfirmed'] as const),
        });
        break;
    }
  }
  return steps;
}

// ---- the reference model --------------------------------------------------------------------

type Decision =
  | { kind: 'succeed'; output: unknown }
  | { kind: 'fail'; failure: TaskFailure }
  | { kind: 'retry'; delay: number }
  | { kind: 'cancel' };

interface MTask {
  key: number;
  id: string;
  command: SubmitCommand;
  maxAttempts: number;
  retryDelay: number;
  timeout: number;
  priority: number;
  state: TaskState;
  attemptCount: number;
  dispatchCount: number;
  current: string | null;
  availableAt: number;
  terminalAt: number | null;
  cancelRequestedAt: number | null;
  outcome:
    | { state: 'succeeded'; output: unknown }
    | { state: 'failed'; failure: TaskFailure }
    | { state: 'cancelled' }
    | null;
  history: [TransitionReason, string | null][];
}

interface MAttempt {
  id: string;
  task: MTask;
  owner: LeaseOwner;
  state: 'active' | 'succeeded' | 'failed' | 'cancelled' | 'lost';
  deadline: number;
  authorityDeadline: number;
  leaseExpiresAt: number;
  renewSeq: number;
  lastRenewal: RenewCommand | null;
  dispatchAllowed: boolean;
  settlement: SettleCommand | null;
  acceptedAt: number | null;
  pending: Decision | null;
  quiescence: 'confirmed' | 'unconfirmed';
  finished: boolean;
}

interface MSlot {
  seq: number;
  assignment: string | null; // attempt id
  renewSeq: number; // what the walker believes
  lastIntent: 'dispatch' | 'keep_alive';
  ops: number;
  lastSettle: SettleCommand | null;
}

type Expect<T> = { ok: true; check?: (value: T) => void } | { ok: false; code: string };

type Logged =
  | { k: 'submit'; command: SubmitCommand }
  | { k: 'acquire'; command: AcquireCommand }
  | { k: 'renew'; command: RenewCommand }
  | { k: 'settle'; command: SettleCommand }
  | { k: 'confirm'; owner: LeaseOwner }
  | { k: 'cancel'; taskKey: number };

class Divergence extends Error {}

function fail(message: string): never {
  throw new Divergence(message);
}

function params(key: number) {
  return {
    maxAttempts: 1 + (key % 3),
    retryDelay: [0, 700, 1_500][(key >> 1) % 3] as number,
    timeout: [1_000, 3_000, 6_000][(key + 1) % 3] as number,
    priority: [0, 1, -1, 0][key % 4] as number,
    delay: key % 5 === 4 ? 1_200 : 0,
  };
}

class Walk {
  readonly tasks = new Map<number, MTask>();
  readonly attempts = new Map<string, MAttempt>();
  readonly slots: MSlot[] = Array.from({ length: SLOTS }, () => ({
    seq: 0,
    assignment: null,
    renewSeq: 0,
    lastIntent: 'keep_alive',
    ops: 0,
    lastSettle: null,
  }));
  readonly log: Logged[] = [];
  readonly trace: string[] = [];
  session = '';
  t0 = 0;
  t1 = 0;

  constructor(
    readonly h: Harness,
    readonly scope: Scope,
  ) {}

  get store() {
    return this.h.store;
  }

  async open() {
    const s = await this.store.openSession({ scope: this.scope, queue: QUEUE, concurrency: SLOTS });
    this.session = s.id;
  }

  submitCommand(key: number, variant: 'same' | 'other'): SubmitCommand {
    const p = params(key);
    return {
      idempotency_key: `key-${key}`,
      input: {
        tenant_id: this.scope.tenant_id,
        namespace: this.scope.namespace,
        queue: QUEUE,
        program: { name: 'walk' },
        data: variant === 'other' ? { key, variant: 'other' } : { key },
        retry: { max_attempts: p.maxAttempts, delay_ms: p.retryDelay },
        timeout_ms: p.timeout,
        priority: p.priority,
        ...(p.delay > 0 ? { delay_ms: p.delay } : {}),
      },
    };
  }

  // Every time a decision of the next step may compare store time with.
  boundaries(): number[] {
    const out: number[] = [];
    for (const t of this.tasks.values()) if (t.state === 'queued') out.push(t.availableAt);
    for (const a of this.attempts.values()) {
      if (a.state !== 'active') continue;
      out.push(a.leaseExpiresAt, a.deadline - CONFIG.leaseSafetyMarginMs);
    }
    return out;
  }

  async guard() {
    for (let i = 0; i < 20; i++) {
      const now = await this.store.now();
      const near = this.boundaries().filter((b) => b >= now - 5 && b <= now + GUARD_MS);
      if (near.length === 0) {
        this.t0 = now;
        return;
      }
      this.h.advance(GUARD_MS + 20);
    }
    throw new Error('could not move away from decision boundaries');
  }

  /** Bounds the op's store time; fails if a boundary could be straddled. */
  async bound(now: number | undefined): Promise<number> {
    this.t1 = await this.store.now();
    const at = now ?? this.t0;
    if (at < this.t0 - 2 || at > this.t1 + 2) {
      fail(`the step's store time ${at} is outside [${this.t0}, ${this.t1}]`);
    }
    const straddled = this.boundaries().filter((b) => b > this.t0 && b <= this.t1);
    if (straddled.length > 0)
      throw new Error(`step took too long (${this.t1 - this.t0} ms): ambiguous`);
    return at;
  }

  private live(a: MAttempt, now: number) {
    return a.state === 'active' && a.leaseExpiresAt > now;
  }

  private record(task: MTask, reason: TransitionReason, attempt: string | null) {
    task.history.push([reason, attempt]);
  }

  /** Applies a decision as DESIGN §5 describes (settle, confirm, recovery share it). */
  private apply(task: MTask, attempt: MAttempt, decision: Decision, now: number, lost = false) {
    attempt.state = lost
      ? 'lost'
      : decision.kind === 'succeed'
        ? 'succeeded'
        : decision.kind === 'cancel'
          ? 'cancelled'
          : 'failed';
    attempt.pending = null;
    attempt.finished = true;
    task.current = null;
    switch (decision.kind) {
      case 'succeed':
        task.state = 'succeeded';
        task.terminalAt = now;
        task.outcome = { state: 'succeeded', output: decision.output };
        this.record(task, 'succeeded', attempt.id);
        break;
      case 'fail':
        task.state = 'failed';
        task.terminalAt = now;
        task.outcome = { state: 'failed', failure: decision.failure };
        this.record(task, 'failed', attempt.id);
        break;
      case 'cancel':
        task.state = 'cancelled';
        task.terminalAt = now;
        task.outcome = { state: 'cancelled' };
        this.record(task, 'cancelled', attempt.id);
        break;
      case 'retry':
        task.state = 'queued';
        task.availableAt = now + decision.delay;
        this.record(task, 'retry_scheduled', attempt.id);
        break;
    }
  }

  private decide(task: MTask, command: SettleCommand): Decision {
    if (task.cancelRequestedAt !== null) return { kind: 'cancel' };
    const report = command.report;
    let failure: TaskFailure;
    let retryable: boolean;
    if (report.kind === 'completed') {
      const o = report.report.outcome;
      if (o.kind === 'success') return { kind: 'succeed', output: o.output };
      failure = { kind: 'application', error: o.error };
      retryable = o.error.retryable !== false;
    } else {
      failure = { kind: 'execution', error: report.report };
      retryable = report.report.retryable;
    }
    // DESIGN §4.1: the retry budget counts only attempts granted dispatch.
    if (retryable && task.dispatchCount < task.maxAttempts)
      return { kind: 'retry', delay: task.retryDelay };
    return { kind: 'fail', failure };
  }

  // ---- model transitions: each returns what the store must answer --------------------------

  mSubmit(
    command: SubmitCommand,
    key: number,
    now: number,
    snapshotAt: number | undefined,
  ): Expect<{ created: boolean; snapshot: { task_id: string } }> {
    const existing = this.tasks.get(key);
    if (existing !== undefined) {
      if (!canonicalEqual(existing.command, command)) return { ok: false, code: 'conflict' };
      return {
        ok: true,
        check: (v) => {
          if (v.created) fail(`replayed submit of key ${key} created a task`);
          if (v.snapshot.task_id !== existing.id) fail('replayed submit answered another task');
        },
      };
    }
    return {
      ok: true,
      check: (v) => {
        if (!v.created) fail(`first submit of key ${key} did not create`);
        const p = params(key);
        const submitted = snapshotAt ?? now;
        const task: MTask = {
          key,
          id: v.snapshot.task_id,
          command,
          maxAttempts: p.maxAttempts,
          retryDelay: p.retryDelay,
          timeout: p.timeout,
          priority: p.priority,
          state: 'queued',
          attemptCount: 0,
          dispatchCount: 0,
          current: null,
          availableAt: submitted + p.delay,
          terminalAt: null,
          cancelRequestedAt: null,
          outcome: null,
          history: [['submitted', null]],
        };
        this.tasks.set(key, task);
      },
    };
  }

  mAcquire(command: AcquireCommand, now: number): Expect<AcquireReply> {
    const slot = this.slots[command.consumer_id] as MSlot;
    if (slot.seq > 0 && command.sequence === slot.seq) {
      return {
        ok: true,
        check: (reply) => {
          const a = slot.assignment === null ? null : (this.attempts.get(slot.assignment) ?? null);
          const want =
            a === null
              ? 'empty'
              : this.live(a, now) && a.settlement === null
                ? 'assigned'
                : 'ownership_lost';
          if (reply.disposition !== want)
            fail(`replayed poll answered ${reply.disposition}, model ${want}`);
          if (reply.disposition === 'assigned' && reply.assignment.lease.owner.attempt_id !== a?.id)
            fail('replayed poll assigned another attempt');
          if (reply.disposition === 'ownership_lost' && reply.assignment.attempt_id !== a?.id)
            fail('replayed poll named another attempt');
        },
      };
    }
    if (command.sequence !== slot.seq + 1) return { ok: false, code: 'sequence_conflict' };
    const held = slot.assignment === null ? null : this.attempts.get(slot.assignment);
    if (held && this.live(held, now)) return { ok: false, code: 'consumer_busy' };
    const eligible = [...this.tasks.values()]
      .filter((t) => t.state === 'queued' && t.availableAt <= now)
      .sort(
        (a, b) =>
          b.priority - a.priority ||
          a.availableAt - b.availableAt ||
          (a.id < b.id ? -1 : a.id > b.id ? 1 : 0),
      );
    const best = eligible[0];
    return {
      ok: true,
      check: (reply) => {
        slot.seq = command.sequence;
        if (best === undefined) {
          if (reply.disposition !== 'empty')
            fail(
              `poll answered ${reply.disposition} (${JSON.stringify(reply).slice(0, 200)}), model: nothing eligible`,
            );
          slot.assignment = null;
          return;
        }
        if (reply.disposition !== 'assigned')
          fail(`poll answered ${reply.disposition}, model: claim ${best.id}`);
        if (reply.assignment.lease.owner.task_id !== best.id)
          fail(
            `poll claimed ${reply.assignment.lease.owner.task_id}, model: best eligible is ${best.id}`,
          );
        this.applyClaim(slot, best, reply, now);
      },
    };
  }

  eligible(now: number): MTask[] {
    return [...this.tasks.values()]
      .filter((t) => t.state === 'queued' && t.availableAt <= now)
      .sort(
        (a, b) =>
          b.priority - a.priority ||
          a.availableAt - b.availableAt ||
          (a.id < b.id ? -1 : a.id > b.id ? 1 : 0),
      );
  }

  applyClaim(
    slot: MSlot,
    best: MTask,
    reply: AcquireReply & { disposition: 'assigned' },
    now: number,
  ) {
    const asg = reply.assignment;
    if (asg.authority.renew_sequence !== 0 || asg.authority.dispatch_allowed !== false)
      fail('fresh authority is not renew_sequence 0 / dispatch_allowed false');
    if (asg.event.ldgattempt !== best.attemptCount + 1) fail(`ldgattempt ${asg.event.ldgattempt}`);
    const deadline = now + best.timeout;
    const authorityDeadline = deadline + CONFIG.cleanupGraceMs;
    const attempt: MAttempt = {
      id: asg.lease.owner.attempt_id,
      task: best,
      owner: asg.lease.owner,
      state: 'active',
      deadline,
      authorityDeadline,
      leaseExpiresAt: Math.min(now + CONFIG.leaseDurationMs, authorityDeadline),
      renewSeq: 0,
      lastRenewal: null,
      dispatchAllowed: false,
      settlement: null,
      acceptedAt: null,
      pending: null,
      quiescence: 'unconfirmed',
      finished: false,
    };
    if (asg.attempt_deadline !== deadline)
      fail(`attempt_deadline ${asg.attempt_deadline}, model ${deadline}`);
    if (asg.lease.expires_at !== attempt.leaseExpiresAt)
      fail(`claim lease expires ${asg.lease.expires_at}, model ${attempt.leaseExpiresAt}`);
    this.attempts.set(attempt.id, attempt);
    best.state = 'active';
    best.attemptCount += 1;
    best.current = attempt.id;
    this.record(best, 'claimed', attempt.id);
    slot.assignment = attempt.id;
    slot.renewSeq = 0;
    slot.lastIntent = 'keep_alive';
    slot.lastSettle = null;
  }

  mRenew(command: RenewCommand, now: number): Expect<Authority> {
    const a = this.attempts.get(command.owner.attempt_id);
    if (a === undefined) return { ok: false, code: 'not_found' };
    if (!canonicalEqual(a.owner, command.owner)) return { ok: false, code: 'ownership_lost' };
    if (!this.live(a, now)) return { ok: false, code: 'ownership_lost' };
    const task = a.task;
    const sample = (reply: Authority) => {
      if (reply.renew_sequence !== a.renewSeq)
        fail(`renew_sequence ${reply.renew_sequence}, model ${a.renewSeq}`);
      if (reply.dispatch_allowed !== a.dispatchAllowed)
        fail(`dispatch_allowed ${reply.dispatch_allowed}, model ${a.dispatchAllowed}`);
      if (reply.expires_at !== a.leaseExpiresAt)
        fail(`lease expires ${reply.expires_at}, model ${a.leaseExpiresAt}`);
      if (reply.cancel_requested !== (task.cancelRequestedAt !== null))
        fail(`cancel_requested ${reply.cancel_requested}, model ${task.cancelRequestedAt}`);
    };
    if (command.sequence === a.renewSeq && a.lastRenewal !== null) {
      if (!canonicalEqual(a.lastRenewal, command)) return { ok: false, code: 'conflict' };
      return { ok: true, check: sample };
    }
    if (command.sequence !== a.renewSeq + 1) return { ok: false, code: 'sequence_conflict' };
    return {
      ok: true,
      check: (reply) => {
        const grant =
          command.intent === 'dispatch' &&
          !a.dispatchAllowed &&
          task.cancelRequestedAt === null &&
          a.settlement === null &&
          a.deadline - now > CONFIG.leaseSafetyMarginMs;
        if (command.intent === 'dispatch') {
          const why = grant
            ? 'granted'
            : a.dispatchAllowed
              ? 'already'
              : task.cancelRequestedAt !== null
                ? 'cancel'
                : a.settlement !== null
                  ? 'settled'
                  : 'budget';
          this.stats.set(`dispatch:${why}`, (this.stats.get(`dispatch:${why}`) ?? 0) + 1);
        }
        a.renewSeq = command.sequence;
        a.lastRenewal = command;
        if (a.pending === null)
          a.leaseExpiresAt = Math.min(now + CONFIG.leaseDurationMs, a.authorityDeadline);
        if (grant) {
          a.dispatchAllowed = true;
          task.dispatchCount += 1;
          this.record(task, 'dispatch_authorized', a.id);
        }
        sample(reply);
      },
    };
  }

  mSettle(command: SettleCommand, now: number): Expect<SettleReply> {
    const a = this.attempts.get(command.owner.attempt_id);
    if (a === undefined) return { ok: false, code: 'not_found' };
    if (!canonicalEqual(a.owner, command.owner)) return { ok: false, code: 'ownership_lost' };
    const task = a.task;
    if (a.settlement !== null) {
      if (
        a.settlement.operation_id === command.operation_id &&
        canonicalEqual(a.settlement, command)
      ) {
        return {
          ok: true,
          check: (reply) => {
            if (!reply.already_accepted) fail('a replayed settlement was not already_accepted');
            if (reply.task_state !== task.state)
              fail(`replayed settle task_state ${reply.task_state}, model ${task.state}`);
            if (reply.receipt.accepted_at !== a.acceptedAt)
              fail('replayed settle answered another receipt');
          },
        };
      }
      return { ok: false, code: 'conflict' };
    }
    if (!this.live(a, now)) return { ok: false, code: 'ownership_lost' };
    return {
      ok: true,
      check: (reply) => {
        const decision = this.decide(task, command);
        a.settlement = command;
        a.acceptedAt = now;
        a.quiescence = command.quiescence;
        this.record(task, 'report_accepted', a.id);
        if (command.quiescence === 'unconfirmed') {
          a.pending = decision;
          a.leaseExpiresAt = a.authorityDeadline;
        } else {
          this.apply(task, a, decision, now);
        }
        if (reply.already_accepted) fail('a first settlement was already_accepted');
        if (reply.receipt.accepted_at !== now) fail('receipt accepted_at is not the store time');
        if (reply.task_state !== task.state)
          fail(`settle task_state ${reply.task_state}, model ${task.state}`);
      },
    };
  }

  mConfirm(owner: LeaseOwner, now: number): Expect<TaskState> {
    const a = this.attempts.get(owner.attempt_id);
    if (a === undefined) return { ok: false, code: 'not_found' };
    if (!canonicalEqual(a.owner, owner)) return { ok: false, code: 'ownership_lost' };
    const task = a.task;
    if (a.pending === null) {
      if (a.settlement === null)
        return { ok: false, code: this.live(a, now) ? 'conflict' : 'ownership_lost' };
      if (a.quiescence === 'unconfirmed') return { ok: false, code: 'ownership_lost' };
      return {
        ok: true,
        check: (s) => {
          if (s !== task.state) fail(`confirm answered ${s}, model ${task.state}`);
        },
      };
    }
    if (!this.live(a, now)) return { ok: false, code: 'ownership_lost' };
    return {
      ok: true,
      check: (s) => {
        const held = a.pending as Decision;
        const decision: Decision =
          held.kind === 'retry' && task.cancelRequestedAt !== null ? { kind: 'cancel' } : held;
        a.quiescence = 'confirmed';
        this.record(task, 'cleanup_confirmed', a.id);
        this.apply(task, a, decision, now);
        if (s !== task.state) fail(`confirm answered ${s}, model ${task.state}`);
      },
    };
  }

  mCancel(key: number, now: number): Expect<TaskState> {
    const task = this.tasks.get(key);
    if (task === undefined) return { ok: false, code: 'not_found' };
    return {
      ok: true,
      check: (s) => {
        if (task.state === 'queued') {
          task.state = 'cancelled';
          task.terminalAt = now;
          task.cancelRequestedAt = now;
          task.outcome = { state: 'cancelled' };
          this.record(task, 'cancelled', null);
        } else if (task.state === 'active' && task.cancelRequestedAt === null) {
          task.cancelRequestedAt = now;
          this.record(task, 'cancel_requested', task.current);
        }
        if (s !== task.state) fail(`cancel answered ${s}, model ${task.state}`);
      },
    };
  }

  mRecover(times: Map<MTask, number>, fallback: number) {
    const counts = { recovered: 0, requeued: 0, failed: 0, cancelled: 0, finalized: 0 };
    for (const a of this.attempts.values()) {
      if (a.state !== 'active' || a.leaseExpiresAt > fallback) continue;
      const task = a.task;
      const now = times.get(task) ?? fallback;
      if (a.pending !== null) {
        const held = a.pending;
        const decision: Decision =
          held.kind === 'retry' && task.cancelRequestedAt !== null ? { kind: 'cancel' } : held;
        this.apply(task, a, decision, now);
        counts.finalized += 1;
        continue;
      }
      this.record(task, 'lease_expired', a.id);
      const decision: Decision =
        task.cancelRequestedAt !== null
          ? { kind: 'cancel' }
          : task.dispatchCount < task.maxAttempts
            ? { kind: 'retry', delay: task.retryDelay }
            : { kind: 'fail', failure: { kind: 'lease_expired', attempts: task.attemptCount } };
      this.apply(task, a, decision, now, true);
      counts.recovered += 1;
      if (decision.kind === 'cancel') counts.cancelled += 1;
      else if (decision.kind === 'retry') counts.requeued += 1;
      else counts.failed += 1;
    }
    return counts;
  }

  // ---- driving --------------------------------------------------------------------------------

  private async attempt<T>(
    run: () => Promise<T>,
  ): Promise<{ ok: true; value: T } | { ok: false; code: string }> {
    try {
      return { ok: true, value: await run() };
    } catch (error) {
      if (error instanceof ContractError) return { ok: false, code: error.code };
      throw error;
    }
  }

  readonly stats = new Map<string, number>();
  private compare<T>(
    what: string,
    expect: Expect<T>,
    got: { ok: true; value: T } | { ok: false; code: string },
  ) {
    const label = `${what.split(' ')[0]}:${got.ok ? ((got.value as { disposition?: string })?.disposition ?? 'ok') : got.code}`;
    this.stats.set(label, (this.stats.get(label) ?? 0) + 1);
    if (expect.ok && !got.ok) fail(`${what}: store rejected with ${got.code}, model accepts`);
    if (!expect.ok && got.ok)
      fail(
        `${what}: store accepted (${JSON.stringify(got.value).slice(0, 300)}), model: ${expect.code}`,
      );
    if (!expect.ok && !got.ok && expect.code !== got.code)
      fail(`${what}: store ${got.code}, model ${expect.code}`);
    if (expect.ok && got.ok) expect.check?.(got.value);
    this.trace.push(`  -> ${label}`);
  }

  /** New history of every task since the model's record, for the step's store time. */
  private async newEvents(): Promise<Map<MTask, RecordedHistoryEvent[]>> {
    const out = new Map<MTask, RecordedHistoryEvent[]>();
    for (const t of this.tasks.values()) {
      const events = await this.store.history(this.scope, t.id, t.history.length);
      if (events.length > 0) out.set(t, events);
    }
    return out;
  }

  private async stepTime(extra?: number): Promise<number> {
    const fresh = await this.newEvents();
    const times = new Set<number>();
    for (const events of fresh.values()) for (const e of events) times.add(e.event.at);
    if (times.size > 1)
      fail(`one step recorded history at several store times: ${[...times].join(', ')}`);
    const [at] = [...times];
    return this.bound(at ?? extra);
  }

  /** The step's slot, or the first slot holding an assignment when it holds none. */
  private slotFor(n: number): number {
    const activeAt = (i: number) => {
      const id = (this.slots[i] as MSlot).assignment;
      return id !== null && this.attempts.get(id)?.state === 'active';
    };
    if (activeAt(n)) return n;
    for (let i = 0; i < SLOTS; i++) if (activeAt(i)) return i;
    return n;
  }

  async run(input: Step) {
    const step: Step =
      input.k === 'renew' || input.k === 'settle' || input.k === 'confirm'
        ? { ...input, slot: this.slotFor(input.slot) }
        : input.k === 'twin' && ['renew', 'settle', 'confirm'].includes(input.what)
          ? { ...input, n: this.slotFor(input.n % SLOTS) }
          : input;
    this.trace.push(JSON.stringify(step));
    if (step.k === 'advance') {
      this.h.advance(step.ms);
      return;
    }
    await this.guard();
    switch (step.k) {
      case 'submit': {
        const command = this.submitCommand(step.key, step.variant);
        await this.doSubmit(command, step.key);
        break;
      }
      case 'poll': {
        const slot = this.slots[step.slot] as MSlot;
        const sequence =
          step.mode === 'next' ? slot.seq + 1 : step.mode === 'replay' ? slot.seq : slot.seq + 2;
        if (sequence < 1) return;
        await this.doAcquire({
          scope: this.scope,
          queue: QUEUE,
          worker_session_id: this.session,
          consumer_id: step.slot,
          sequence,
        });
        break;
      }
      case 'pollBatch': {
        const commands: AcquireCommand[] = [];
        step.modes.forEach((mode, i) => {
          const slot = this.slots[i] as MSlot;
          const sequence = mode === 'next' ? slot.seq + 1 : slot.seq;
          if (mode === 'skip' || sequence < 1) return;
          commands.push({
            scope: this.scope,
            queue: QUEUE,
            worker_session_id: this.session,
            consumer_id: i,
            sequence,
          });
        });
        if (commands.length === 0) return;
        await this.doAcquireBatch(commands);
        break;
      }
      case 'renew': {
        const slot = this.slots[step.slot] as MSlot;
        if (slot.assignment === null) return;
        const a = this.attempts.get(slot.assignment) as MAttempt;
        let owner = a.owner;
        let sequence = slot.renewSeq + 1;
        let intent = step.intent;
        if (step.mode === 'replay' || step.mode === 'other_intent') {
          sequence = slot.renewSeq;
          intent =
            step.mode === 'replay'
              ? slot.lastIntent
              : slot.lastIntent === 'dispatch'
                ? 'keep_alive'
                : 'dispatch';
        } else if (step.mode === 'gap') sequence = slot.renewSeq + 2;
        else if (step.mode === 'stale_owner')
          owner = { ...owner, generation: owner.generation + 1 };
        if (sequence < 1) return;
        const command: RenewCommand = { owner, sequence, intent };
        const commands = step.batch === 2 ? [command, command] : [command];
        await this.doRenew(commands, step.batch > 0);
        break;
      }
      case 'settle': {
        const slot = this.slots[step.slot] as MSlot;
        if (slot.assignment === null) return;
        const a = this.attempts.get(slot.assignment) as MAttempt;
        let command: SettleCommand;
        if (step.op === 'same' && slot.lastSettle !== null) command = slot.lastSettle;
        else {
          if (step.op !== 'reuse_other' || slot.lastSettle === null) slot.ops += 1;
          command = settleCommand(
            a.owner,
            `op-${a.id}-${slot.ops}`,
            step.outcome,
            step.quiescence,
            slot.ops,
          );
        }
        slot.lastSettle = command;
        const commands = step.batch === 2 ? [command, command] : [command];
        await this.doSettle(commands, step.batch > 0);
        break;
      }
      case 'confirm': {
        const slot = this.slots[step.slot] as MSlot;
        if (slot.assignment === null) return;
        await this.doConfirm((this.attempts.get(slot.assignment) as MAttempt).owner);
        break;
      }
      case 'cancel':
        if (!this.tasks.has(step.key)) return;
        await this.doCancel(step.key);
        break;
      case 'recover':
        await this.doRecover();
        break;
      case 'twin':
        if ((await this.doTwin(step)) === false) return;
        break;
      case 'replay': {
        if (this.log.length === 0) return;
        const entry = this.log[Math.floor(step.pick * this.log.length)] as Logged;
        this.trace.push(`  replaying ${JSON.stringify(entry).slice(0, 400)}`);
        switch (entry.k) {
          case 'submit':
            await this.doSubmit(entry.command, Number(entry.command.idempotency_key.slice(4)));
            break;
          case 'acquire':
            await this.doAcquire(entry.command, true);
            break;
          case 'renew':
            await this.doRenew([entry.command], step.batch === 1, true);
            break;
          case 'settle':
            await this.doSettle([entry.command], step.batch === 1, true);
            break;
          case 'confirm':
            await this.doConfirm(entry.owner);
            break;
          case 'cancel':
            await this.doCancel(entry.taskKey);
            break;
        }
        break;
      }
    }
    await this.check();
  }

  /** The same fresh command twice at once: exactly one applies, the other answers as its replay. */
  async doTwin(step: Step & { k: 'twin' }): Promise<boolean> {
    const twice = async <T>(
      what: string,
      call: () => Promise<T>,
      model: (now: number) => Expect<T>,
      first: (v: T) => boolean,
      timeOf: (v: T) => number | undefined = () => undefined,
    ) => {
      let [a, b] = await Promise.all([this.attempt(call), this.attempt(call)]);
      if (b.ok && first(b.value) && !(a.ok && first(a.value))) [a, b] = [b, a];
      // The one that applied acted first: the earliest store time of the two.
      const times = [a, b]
        .map((r) => (r.ok ? timeOf(r.value) : undefined))
        .filter((t) => t !== undefined);
      const now = await this.stepTime(times.length > 0 ? Math.min(...times) : undefined);
      this.compare(`${what} (twin 1)`, model(now), a);
      this.compare(`${what} (twin 2)`, model(now), b);
    };
    const slot = this.slots[step.n % SLOTS] as MSlot;
    const attempt = slot.assignment === null ? undefined : this.attempts.get(slot.assignment);
    switch (step.what) {
      case 'submit': {
        const command = this.submitCommand(step.n, 'same');
        this.log.push({ k: 'submit', command });
        await twice(
          'submit',
          () => this.store.submit(command),
          (now) => this.mSubmit(command, step.n, now, now),
          (v) => v.created,
          (v) => (v.created ? v.snapshot.submitted_at : undefined),
        );
        return true;
      }
      case 'poll': {
        const command: AcquireCommand = {
          scope: this.scope,
          queue: QUEUE,
          worker_session_id: this.session,
          consumer_id: step.n % SLOTS,
          sequence: slot.seq + 1,
        };
        this.log.push({ k: 'acquire', command });
        await twice(
          `acquire seq ${command.sequence} slot ${command.consumer_id}`,
          async () => (await this.store.acquire(command, { recordEmpty: true })).reply,
          (now) => this.mAcquire(command, now),
          () => false,
        );
        return true;
      }
      case 'renew': {
        if (attempt === undefined) return false;
        const command: RenewCommand = {
          owner: attempt.owner,
          sequence: slot.renewSeq + 1,
          intent: step.intent,
        };
        this.log.push({ k: 'renew', command });
        await twice(
          `renew seq ${command.sequence} ${command.intent}`,
          () => this.store.renew(command),
          (now) => this.mRenew(command, now),
          () => false,
          (v) => (v.remaining_ms > 0 ? v.expires_at - v.remaining_ms : undefined),
        );
        for (const s of this.slots) {
          const a = s.assignment === null ? undefined : this.attempts.get(s.assignment);
          if (a !== undefined && a.lastRenewal !== null) {
            s.renewSeq = a.renewSeq;
            s.lastIntent = a.lastRenewal.intent;
          }
        }
        return true;
      }
      case 'settle': {
        if (attempt === undefined) return false;
        slot.ops += 1;
        const command = settleCommand(
          attempt.owner,
          `op-${attempt.id}-${slot.ops}`,
          step.outcome,
          step.quiescence,
          slot.ops,
        );
        slot.lastSettle = command;
        this.log.push({ k: 'settle', command });
        await twice(
          `settle ${command.operation_id} ${command.quiescence}`,
          () => this.store.settle(command),
          (now) => this.mSettle(command, now),
          (v) => !v.already_accepted,
          (v) => (v.already_accepted ? undefined : v.receipt.accepted_at),
        );
        return true;
      }
      case 'confirm': {
        if (attempt === undefined) return false;
        this.log.push({ k: 'confirm', owner: attempt.owner });
        await twice(
          `confirm ${attempt.id}`,
          () => this.store.confirmQuiescence(attempt.owner),
          (now) => this.mConfirm(attempt.owner, now),
          () => false,
        );
        return true;
      }
      case 'cancel': {
        const task = this.tasks.get(step.n);
        if (task === undefined) return false;
        this.log.push({ k: 'cancel', taskKey: step.n });
        await twice(
          `cancel key ${step.n}`,
          () => this.store.cancel(this.scope, task.id),
          (now) => this.mCancel(step.n, now),
          () => false,
        );
        return true;
      }
      case 'recover': {
        const [p, q] = await Promise.all([
          this.store.recoverExpiredLeases(100),
          this.store.recoverExpiredLeases(100),
        ]);
        await this.afterRecovery({
          recovered: p.recovered + q.recovered,
          requeued: p.requeued + q.requeued,
          failed: p.failed + q.failed,
          cancelled: p.cancelled + q.cancelled,
          finalized: p.finalized + q.finalized,
        });
        return true;
      }
    }
  }

  async doSubmit(command: SubmitCommand, key: number) {
    this.log.push({ k: 'submit', command });
    const got = await this.attempt(() => this.store.submit(command));
    const snapshotAt = got.ok && got.value.created ? got.value.snapshot.submitted_at : undefined;
    const now = await this.stepTime(snapshotAt);
    this.compare('submit', this.mSubmit(command, key, now, snapshotAt), got);
  }

  async doAcquire(command: AcquireCommand, replay = false) {
    if (!replay) this.log.push({ k: 'acquire', command });
    const got = await this.attempt(
      async () => (await this.store.acquire(command, { recordEmpty: true })).reply,
    );
    const now = await this.stepTime();
    this.compare(
      `acquire seq ${command.sequence} slot ${command.consumer_id}`,
      this.mAcquire(command, now),
      got,
    );
  }

  async doAcquireBatch(commands: AcquireCommand[]) {
    for (const command of commands) this.log.push({ k: 'acquire', command });
    const items = await this.store.acquireBatch(commands, { recordEmpty: true });
    const results = items.map((i) =>
      i.ok
        ? { ok: true as const, value: i.value.reply }
        : { ok: false as const, code: i.error.code },
    );
    const now = await this.stepTime();
    const eligible = this.eligible(now);
    const fresh: number[] = [];
    commands.forEach((command, i) => {
      const slot = this.slots[command.consumer_id] as MSlot;
      const isNew =
        !(slot.seq > 0 && command.sequence === slot.seq) && command.sequence === slot.seq + 1;
      const held = slot.assignment === null ? null : this.attempts.get(slot.assignment);
      if (isNew && !(held && this.live(held, now))) fresh.push(i);
      else
        this.compare(
          `acquire(batch) seq ${command.sequence} slot ${command.consumer_id}`,
          this.mAcquire(command, now),
          results[i] as never,
        );
    });
    const k = Math.min(fresh.length, eligible.length);
    const want = eligible
      .slice(0, k)
      .map((t) => t.id)
      .sort();
    const got: string[] = [];
    for (const i of fresh) {
      const r = results[i] as (typeof results)[number];
      if (!r.ok)
        fail(`acquire(batch) new poll of slot ${commands[i]?.consumer_id} rejected ${r.code}`);
      if (r.value.disposition === 'assigned') got.push(r.value.assignment.lease.owner.task_id);
      else if (r.value.disposition !== 'empty')
        fail(`acquire(batch) new poll answered ${r.value.disposition}`);
    }
    if (!canonicalEqual([...got].sort(), want))
      fail(
        `acquire(batch) claimed ${JSON.stringify(got)}, model: the best ${k} eligible ${JSON.stringify(want)}`,
      );
    for (const i of fresh) {
      const command = commands[i] as AcquireCommand;
      const slot = this.slots[command.consumer_id] as MSlot;
      const reply = (results[i] as { ok: true; value: AcquireReply }).value;
      slot.seq = command.sequence;
      const label = `acquire(batch):${reply.disposition}`;
      this.stats.set(label, (this.stats.get(label) ?? 0) + 1);
      if (reply.disposition === 'assigned') {
        const task = [...this.tasks.values()].find(
          (t) => t.id === reply.assignment.lease.owner.task_id,
        ) as MTask;
        this.applyClaim(slot, task, reply, now);
      } else slot.assignment = null;
    }
  }

  async doRenew(commands: RenewCommand[], batch: boolean, replay = false) {
    if (!replay) for (const c of commands) this.log.push({ k: 'renew', command: c });
    let results: ({ ok: true; value: Authority } | { ok: false; code: string })[];
    if (batch) {
      const items = await this.store.renewBatch(commands);
      results = items.map((i) =>
        i.ok ? { ok: true, value: i.value } : { ok: false, code: i.error.code },
      );
    } else {
      results = [await this.attempt(() => this.store.renew(commands[0] as RenewCommand))];
    }
    let fromReply: number | undefined;
    for (const r of results)
      if (r.ok && r.value.remaining_ms > 0) fromReply ??= r.value.expires_at - r.value.remaining_ms;
    const now = await this.stepTime(fromReply);
    commands.forEach((c, i) => {
      const expect = this.mRenew(c, now);
      this.compare(
        `renew seq ${c.sequence} ${c.intent} (${batch ? 'batch' : 'single'} item ${i})`,
        expect,
        results[i] as never,
      );
    });
    for (const slot of this.slots) {
      const a = slot.assignment === null ? undefined : this.attempts.get(slot.assignment);
      if (a !== undefined && a.lastRenewal !== null) {
        slot.renewSeq = a.renewSeq;
        slot.lastIntent = a.lastRenewal.intent;
      }
    }
  }

  async doSettle(commands: SettleCommand[], batch: boolean, replay = false) {
    if (!replay) this.log.push({ k: 'settle', command: commands[0] as SettleCommand });
    let results: ({ ok: true; value: SettleReply } | { ok: false; code: string })[];
    if (batch) {
      const items = await this.store.settleBatch(commands);
      results = items.map((i) =>
        i.ok ? { ok: true, value: i.value } : { ok: false, code: i.error.code },
      );
    } else {
      results = [await this.attempt(() => this.store.settle(commands[0] as SettleCommand))];
    }
    let fromReply: number | undefined;
    for (const r of results)
      if (r.ok && !r.value.already_accepted) fromReply ??= r.value.receipt.accepted_at;
    const now = await this.stepTime(fromReply);
    commands.forEach((c, i) => {
      this.compare(
        `settle ${c.operation_id} ${c.quiescence} (${batch ? 'batch' : 'single'} item ${i})`,
        this.mSettle(c, now),
        results[i] as never,
      );
    });
  }

  async doConfirm(owner: LeaseOwner) {
    this.log.push({ k: 'confirm', owner });
    const got = await this.attempt(() => this.store.confirmQuiescence(owner));
    const now = await this.stepTime();
    this.compare(`confirm ${owner.attempt_id}`, this.mConfirm(owner, now), got);
  }

  async doCancel(key: number) {
    this.log.push({ k: 'cancel', taskKey: key });
    const task = this.tasks.get(key) as MTask;
    const got = await this.attempt(() => this.store.cancel(this.scope, task.id));
    const now = await this.stepTime();
    this.compare(`cancel key ${key}`, this.mCancel(key, now), got);
  }

  async doRecover() {
    await this.afterRecovery(await this.store.recoverExpiredLeases(100));
  }

  async afterRecovery(progress: {
    recovered: number;
    requeued: number;
    failed: number;
    cancelled: number;
    finalized: number;
  }) {
    const fresh = await this.newEvents();
    const times = new Map<MTask, number>();
    for (const [t, events] of fresh) times.set(t, (events[0] as RecordedHistoryEvent).event.at);
    const fallback = await this.bound(undefined);
    for (const at of times.values())
      if (at < this.t0 - 2 || at > this.t1 + 2) fail(`recovery time ${at} outside the step`);
    const want = this.mRecover(times, fallback);
    const got = {
      recovered: progress.recovered,
      requeued: progress.requeued,
      failed: progress.failed,
      cancelled: progress.cancelled,
      finalized: progress.finalized,
    };
    for (const [k, v] of Object.entries(got))
      if (v > 0) this.stats.set(`recover:${k}`, (this.stats.get(`recover:${k}`) ?? 0) + v);
    if (!canonicalEqual(want, got))
      fail(`recovery progress ${JSON.stringify(got)}, model ${JSON.stringify(want)}`);
  }

  // ---- the check after every step ---------------------------------------------------------

  async check() {
    for (const t of this.tasks.values()) {
      const snap = await this.store.inspect(this.scope, t.id);
      const status = await this.store.status(this.scope, t.id);
      const model = {
        state: t.state,
        attempt_count: t.attemptCount,
        current_attempt_id: t.current,
        available_at: t.availableAt,
        terminal_at: t.terminalAt,
        cancel_requested_at: t.cancelRequestedAt,
      };
      const seen = {
        state: snap.state,
        attempt_count: snap.attempt_count,
        current_attempt_id: snap.current_attempt_id,
        available_at: snap.available_at,
        terminal_at: snap.terminal_at,
        cancel_requested_at: snap.cancel_requested_at,
      };
      if (!canonicalEqual(model, seen))
        fail(
          `task key ${t.key} ${t.id}: store ${JSON.stringify(seen)}, model ${JSON.stringify(model)}`,
        );
      const statusSeen = {
        state: status.state,
        attempt_count: status.attempt_count,
        current_attempt_id: snap.current_attempt_id,
        available_at: status.available_at,
        terminal_at: status.terminal_at,
        cancel_requested_at: status.cancel_requested_at,
      };
      if (!canonicalEqual(model, statusSeen))
        fail(
          `task key ${t.key} status: ${JSON.stringify(statusSeen)}, model ${JSON.stringify(model)}`,
        );
      const history = await this.store.history(this.scope, t.id, 0);
      const got = history.map((e) => [e.event.reason, e.event.attempt_id ?? null]);
      if (!canonicalEqual(got, t.history)) {
        fail(
          `task key ${t.key} history:\n  store ${JSON.stringify(got)}\n  model ${JSON.stringify(t.history)}`,
        );
      }
      history.forEach((e, i) => {
        if (e.sequence !== i + 1)
          fail(`task key ${t.key} history sequence ${e.sequence} at index ${i}`);
        if (e.event.task_id !== t.id) fail('history event names another task');
        if (i > 0 && e.event.at < (history[i - 1] as RecordedHistoryEvent).event.at)
          fail(`task key ${t.key} history times go back`);
      });
      const first = history[0] as RecordedHistoryEvent;
      if (first.event.at !== snap.submitted_at)
        fail(
          `task key ${t.key}: its submitted event is at ${first.event.at}, submitted_at ${snap.submitted_at}`,
        );
      const last = history[history.length - 1] as RecordedHistoryEvent;
      if (t.terminalAt !== null && last.event.at !== t.terminalAt)
        fail(
          `task key ${t.key} terminal_at ${t.terminalAt} is not its last event's time ${last.event.at}`,
        );
      if (
        t.state === 'queued' &&
        t.history.length > 1 &&
        last.event.reason === 'retry_scheduled' &&
        t.availableAt !== last.event.at + t.retryDelay
      ) {
        fail(`task key ${t.key} available_at is not retry time + delay`);
      }
      if (t.state === 'succeeded' || t.state === 'failed' || t.state === 'cancelled') {
        const result = await this.store.result(this.scope, t.id);
        if (!canonicalEqual(result.outcome, t.outcome))
          fail(
            `task key ${t.key} outcome ${JSON.stringify(result.outcome)}, model ${JSON.stringify(t.outcome)}`,
          );
      }
    }
    for (const a of this.attempts.values()) {
      if (
        a.task.state !== 'active' &&
        a.finished &&
        a.task.current === null &&
        a.state !== 'active'
      ) {
        // Checked once more below only while recently finished: cheap enough to check all.
      }
      const snap = await this.store.inspectAttempt(this.scope, a.task.id, a.id);
      const model = {
        state: a.state,
        expires_at: a.leaseExpiresAt,
        deadline: a.deadline,
        authority_deadline: a.authorityDeadline,
        execution_may_have_started: a.dispatchAllowed,
        renew_sequence: a.lastRenewal?.sequence ?? null,
        operation_id: a.settlement?.operation_id ?? null,
        quiescence: a.quiescence,
        finished: a.finished,
      };
      const seen = {
        state: snap.state,
        expires_at: a.state === 'active' ? snap.lease.expires_at : a.leaseExpiresAt,
        deadline: snap.deadline,
        authority_deadline: snap.authority_deadline,
        execution_may_have_started: snap.execution_may_have_started,
        renew_sequence: snap.last_renewal?.sequence ?? null,
        operation_id: snap.settlement?.receipt.operation_id ?? null,
        quiescence: snap.quiescence,
        finished: snap.finished_at !== null,
      };
      if (!canonicalEqual(model, seen))
        fail(
          `attempt ${a.id} (task key ${a.task.key}): store ${JSON.stringify(seen)}, model ${JSON.stringify(model)}`,
        );
    }
  }
}

function settleCommand(
  owner: LeaseOwner,
  operationId: string,
  outcome: Outcome,
  quiescence: 'confirmed' | 'unconfirmed',
  n: number,
): SettleCommand {
  const identity = { task_id: owner.task_id, attempt_id: owner.attempt_id };
  const app = (retryable: boolean | undefined) => ({
    kind: 'completed' as const,
    report: {
      context: { identity },
      outcome: {
        kind: 'application_error' as const,
        error: { code: 'E', message: `m${n}`, ...(retryable === undefined ? {} : { retryable }) },
      },
    },
  });
  const report: SettleCommand['report'] =
    outcome === 'success'
      ? {
          kind: 'completed',
          report: { context: { identity }, outcome: { kind: 'success', output: { n } } },
        }
      : outcome === 'exec_retry'
        ? { kind: 'failed', report: { kind: 'crashed', message: `c${n}`, retryable: true } }
        : outcome === 'exec_fatal'
          ? { kind: 'failed', report: { kind: 'crashed', message: `c${n}`, retryable: false } }
          : outcome === 'app_default'
            ? app(undefined)
            : app(outcome === 'app_retry');
  return { owner, operation_id: operationId, report, quiescence, processing_trace: null };
}

let h: Harness;
let scopes = 0;
beforeAll(async () => {
  h = await harness('walk_r52c', CONFIG);
});
afterAll(() => h.close());

async function walk(seed: number, steps: readonly Step[]): Promise<Walk> {
  scopes += 1;
  const w = new Walk(h, { tenant_id: `walk-${seed}-${scopes}`, namespace: 'r52c' });
  await w.open();
  try {
    for (const step of steps) await w.run(step);
    // Drain: every live lease ends, so the next walk's recovery counts only its own.
    w.h.advance(20_000);
    await w.run({ k: 'recover' });
  } catch (error) {
    // End this walk's leases, so that the next walk's recovery counts only its own.
    w.h.advance(20_000);
    await w.store.recoverExpiredLeases(100).catch(() => undefined);
    if (error instanceof Divergence) {
      error.message = `seed ${seed}, step ${w.trace.filter((s) => !s.startsWith('  ')).length}: ${error.message}\n${w.trace.slice(-12).join('\n')}`;
    }
    throw error;
  }
  return w;
}

const STEPS = Number(process.env.WALK_STEPS ?? 250);
// Two seeds in the suite (~8 s each); WALK_SEEDS=1,2,…,13 WALK_STEPS=300 walks further.
const SEEDS = (process.env.WALK_SEEDS ?? '1,2').split(',').map(Number);

describe('task state vs history: seeded random walk (DESIGN §5)', () => {
  for (const seed of SEEDS) {
    it(`seed ${seed}: ${STEPS} steps keep state, attempts and history in agreement with the model`, async () => {
      const w = await walk(seed, generate(seed, STEPS));
      if (process.env.WALK_STATS) {
        const reasons = new Map<string, number>();
        for (const t of w.tasks.values())
          for (const [r] of t.history) reasons.set(r, (reasons.get(r) ?? 0) + 1);
        console.log(seed, JSON.stringify([...w.stats].sort()), JSON.stringify([...reasons].sort()));
        if (process.env.WALK_STATS === 'trace') console.log(w.trace.join('\n'));
      }
    }, 240_000);
  }
});
