/**
 * Forced interleavings of lease recovery against a settle or a heartbeat
 * (issue #8, T3a), on real PostgreSQL through the real store.
 *
 * A lane is one database with three stores (three pools) on one movable
 * store clock: the worker's store settles or renews, the recoverer's store
 * runs `recoverExpiredLeases`, and the observer's store holds row locks (the
 * barrier) and reads row snapshots. Each round claims a fresh task, moves the
 * clock to within a few milliseconds of the lease's expiry (seeded), starts
 * the two calls in a seeded order with seeded pauses, lets one periodic
 * recovery pass sweep up, and checks what the contract promises:
 *
 * - exactly one of {the worker's call accepted, recovery lost the attempt};
 * - a call started at or after the lease's expiry (`skewMs >= 0`) is never
 *   accepted, and an accepted settle's receipt is dated before the expiry;
 * - a rejected call is `409 ownership_lost` (no other code) and changed
 *   nothing; repeating it (late) answers `ownership_lost` again (a second,
 *   different settle of a settled attempt: `conflict`) and changes nothing
 *   (row snapshots compared);
 * - a terminal task never reopens: no history record follows a terminal one.
 */
import {
  type Assignment,
  ContractError,
  type Scope,
  type SettleCommand,
} from '@ledgence/contracts';
import { type LifecycleConfig, lifecycleConfig } from '@ledgence/core';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';

export const SCOPE: Scope = { tenant_id: 'acme', namespace: 'races' };

/** Short leases: the clock moves by about one lease per round. */
export const RACE_CONFIG: LifecycleConfig = lifecycleConfig({
  leaseDurationMs: 2_000,
  cleanupGraceMs: 1_000,
  leaseSafetyMarginMs: 500,
  sessionValidityMs: 60_000,
});

/** What the worker's side races recovery with. */
export type RaceKind = 'settle' | 'renew';

/**
 * How the two calls are started: the worker's call first, recovery first,
 * both in the same tick, or the worker's call held at the task's row lock
 * (the barrier) while recovery runs, then released.
 */
export type RaceMode = 'worker_first' | 'recovery_first' | 'same_tick' | 'worker_blocked';
export const RACE_MODES: readonly RaceMode[] = [
  'worker_first',
  'recovery_first',
  'same_tick',
  'worker_blocked',
];

/** The worker call's answer: accepted, or the error code it got. */
export type CallAnswer = 'accepted' | string;

/** One round's result. */
export interface RoundResult {
  readonly kind: RaceKind;
  readonly mode: RaceMode;
  /** The worker's call in the race. */
  readonly answer: CallAnswer;
  /** Who took the attempt away: the racing recovery, the sweep after it, or nobody. */
  readonly lostBy: 'race' | 'sweep' | null;
  /** Contract violations found (empty when the round is correct). */
  readonly violations: readonly string[];
}

/** One seeded round's choices. */
export interface RoundPlan {
  readonly kind: RaceKind;
  readonly mode: RaceMode;
  /** Store time at the race, relative to the lease's expiry (ms; negative = before it). */
  readonly skewMs: number;
  /** Pause between starting the first call and the second (ms; 0 = next macrotask). */
  readonly pauseMs: number;
  /** 1: recovery fails the task; 2: recovery re-queues it. */
  readonly maxAttempts: 1 | 2;
}

interface Snapshot {
  readonly text: string;
  readonly state: string;
  readonly history: { reason: string; attempt_id: string | null; sequence: number }[];
}

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const TERMINAL_REASONS = new Set(['succeeded', 'failed', 'cancelled']);

/** A lane: one database, three stores, one clock. */
export class RaceLane {
  readonly #db: TestDatabase;
  readonly worker: PostgresTaskStore;
  readonly recoverer: PostgresTaskStore;
  readonly observer: PostgresTaskStore;
  #offset = 0;
  #round = 0;

  private constructor(db: TestDatabase) {
    this.#db = db;
    const make = (max: number) =>
      createPostgresTaskStore({
        url: db.url,
        config: RACE_CONFIG,
        max,
        clockOffsetMs: () => this.#offset,
      });
    this.worker = make(2);
    this.recoverer = make(2);
    this.observer = make(2);
  }

  /** A lane on a fresh migrated database. */
  static async open(prefix: string): Promise<RaceLane> {
    return new RaceLane(await createMigratedTestDatabase(prefix));
  }

  async close(): Promise<void> {
    await Promise.allSettled([this.worker.close(), this.recoverer.close(), this.observer.close()]);
    await this.#db.drop();
  }

  /** Runs one round as `plan` says. */
  async round(plan: RoundPlan): Promise<RoundResult> {
    this.#round += 1;
    const queue = `q${this.#round}`;
    const session = await this.worker.openSession({ scope: SCOPE, queue, concurrency: 1 });
    const submitted = await this.worker.submit({
      idempotency_key: `k${this.#round}`,
      input: {
        ...SCOPE,
        queue,
        program: { name: 'race' },
        data: null,
        retry: { max_attempts: plan.maxAttempts, delay_ms: 0 },
      },
    });
    const taskId = submitted.snapshot.task_id;
    const polled = await this.worker.acquire(
      { scope: SCOPE, queue, worker_session_id: session.id, consumer_id: 0, sequence: 1 },
      { recordEmpty: true },
    );
    if (polled.reply.disposition !== 'assigned') {
      throw new Error(`round ${this.#round}: nothing to claim`);
    }
    const assignment = polled.reply.assignment;
    const owner = assignment.lease.owner;
    // Dispatch granted: the attempt counts, so with one attempt recovery fails the task.
    await this.worker.renew({ owner, sequence: 1, intent: 'dispatch' });
    const expiresAt = await this.leaseExpiry(owner.task_id, owner.attempt_id);
    const now = await this.worker.now();
    this.#offset += expiresAt - now + plan.skewMs;

    // The racing renew is the one after the dispatch grant (sequence 1): sequence 2.
    const RACING_RENEW = 2;
    let acceptedAt: number | undefined;
    const call = async (): Promise<unknown> => {
      if (plan.kind === 'renew') {
        return this.worker.renew({ owner, sequence: RACING_RENEW, intent: 'keep_alive' });
      }
      const reply = await this.worker.settle(settleCommand(assignment, `op-${this.#round}`));
      acceptedAt = reply.receipt.accepted_at;
      return reply;
    };
    const race = await this.race(plan, taskId, call);
    const sweep = await this.recoverer.recoverExpiredLeases();
    const after = await this.snapshot(taskId);

    const violations: string[] = [];
    const lostRecords = after.history.filter(
      (h) => h.reason === 'lease_expired' && h.attempt_id === owner.attempt_id,
    ).length;
    const accepted = race.answer === 'accepted';
    // DESIGN §4.1/§5: a call on a lease that expired at store time is `ownership_lost`; any
    // other refusal (even another 409, such as `conflict`) is the wrong answer.
    if (!accepted && race.answer !== 'ownership_lost') {
      violations.push(`the late ${plan.kind} got ${race.answer}, not ownership_lost`);
    }
    // Store time was moved to `expiry + skewMs` before the call started and only moves forward:
    // with `skewMs >= 0` the call is late by construction and must be refused.
    if (accepted && plan.skewMs >= 0) {
      violations.push(
        `the ${plan.kind} was accepted although it started ${plan.skewMs} ms after the lease expired`,
      );
    }
    // A settle is accepted only while the lease is live at store time (expiry is exclusive).
    if (
      plan.kind === 'settle' &&
      accepted &&
      !(acceptedAt !== undefined && acceptedAt < expiresAt)
    ) {
      violations.push(`settle accepted at ${acceptedAt}, the lease expired at ${expiresAt}`);
    }
    if (lostRecords > 1) violations.push(`the attempt was lost ${lostRecords} times`);
    if (accepted === (lostRecords === 1)) {
      violations.push(
        `${plan.kind} ${race.answer} and the attempt lost ${lostRecords} times: not exactly one`,
      );
    }
    const reportAccepted = after.history.some((h) => h.reason === 'report_accepted');
    if (plan.kind === 'settle' && accepted !== reportAccepted) {
      violations.push(`settle ${race.answer} but report_accepted recorded: ${reportAccepted}`);
    }
    if (plan.kind === 'settle' && accepted && after.state !== 'succeeded') {
      violations.push(`settle accepted, task ${after.state}`);
    }
    if (!accepted) {
      const expected = plan.maxAttempts === 1 ? 'failed' : 'queued';
      if (after.state !== expected)
        violations.push(`lost with ${plan.maxAttempts}: ${after.state}`);
    }

    // Late calls: the loser repeats itself, and the worker tries the other call too.
    if (plan.kind === 'renew' && accepted) {
      // Still owned (lease extended): finish it, then every late call must bounce off.
      await this.worker.settle(settleCommand(assignment, `op-${this.#round}`));
    }
    const settledOrLost = await this.snapshot(taskId);
    const settled = settledOrLost.state === 'succeeded';
    // Each late call with the one answer the contract gives it (DESIGN §5): the losing renew's
    // own sequence again (a replay of the last renewal is answered only on a live lease), the
    // same settle (a replay of the accepted settlement, or ownership_lost), another settle
    // (`conflict` against a recorded settlement, else ownership_lost), and recovery (runs; the
    // snapshot below shows it changed nothing).
    const late: [string, () => Promise<unknown>, CallAnswer][] = [
      [
        'renew',
        () => this.worker.renew({ owner, sequence: RACING_RENEW, intent: 'keep_alive' }),
        'ownership_lost',
      ],
      [
        'settle',
        () => this.worker.settle(settleCommand(assignment, `op-${this.#round}`)),
        settled ? 'accepted' : 'ownership_lost',
      ],
      [
        'other settle',
        () => this.worker.settle(settleCommand(assignment, `late-${this.#round}`)),
        settled ? 'conflict' : 'ownership_lost',
      ],
      ['recovery', () => this.recoverer.recoverExpiredLeases(), 'accepted'],
    ];
    for (const [what, run, expected] of late) {
      const answer = await answerOf(run);
      if (answer !== expected) {
        violations.push(`late ${what} got ${answer}, not ${expected}`);
      }
    }
    const final = await this.snapshot(taskId);
    if (final.text !== settledOrLost.text) violations.push('a late call changed the rows');
    violations.push(...reopenings(final));

    return {
      kind: plan.kind,
      mode: plan.mode,
      answer: race.answer,
      lostBy: race.recovered > 0 ? 'race' : sweep.recovered > 0 ? 'sweep' : null,
      violations,
    };
  }

  /** Starts the worker's call and recovery as the plan's mode says. */
  private async race(
    plan: RoundPlan,
    taskId: string,
    call: () => Promise<unknown>,
  ): Promise<{ answer: CallAnswer; recovered: number }> {
    const recover = () => this.recoverer.recoverExpiredLeases();
    const pause = () => new Promise((resolve) => setTimeout(resolve, plan.pauseMs));
    // Promise.all observes both calls from the start: a failing one never goes unhandled.
    const both = async (first: Promise<CallAnswer>, second: Promise<{ recovered: number }>) => {
      const [answer, progress] = await Promise.all([first, second]);
      return { answer, recovered: progress.recovered };
    };
    switch (plan.mode) {
      case 'worker_first':
        return both(answerOf(call), pause().then(recover));
      case 'recovery_first': {
        const recovering = recover();
        return both(
          pause().then(() => answerOf(call)),
          recovering,
        );
      }
      case 'same_tick':
        return both(answerOf(call), recover());
      case 'worker_blocked':
        return this.blocked(taskId, call, recover, pause);
    }
  }

  /**
   * The barrier: the observer holds the task's row lock; the worker's call
   * queues behind it; recovery runs meanwhile (it skips locked rows); the
   * lock is released after the pause, and the worker's call decides at the
   * store time it gets the lock at.
   */
  private async blocked(
    taskId: string,
    call: () => Promise<unknown>,
    recover: () => Promise<{ recovered: number }>,
    pause: () => Promise<unknown>,
  ): Promise<{ answer: CallAnswer; recovered: number }> {
    const holder = await this.observer.sql.reserve();
    let open = false;
    let answer: Promise<CallAnswer> | undefined;
    try {
      await holder.unsafe('begin');
      open = true;
      await holder`select 1 from tasks where tenant_id = ${SCOPE.tenant_id}
        and namespace = ${SCOPE.namespace} and task_id = ${taskId} for update`;
      answer = answerOf(call);
      const progress = await recover();
      await pause();
      await holder.unsafe('commit');
      open = false;
      return { answer: await answer, recovered: progress.recovered };
    } finally {
      // On a failure above: end the transaction, and leave no call's rejection unobserved.
      if (open) await holder.unsafe('rollback').catch(() => {});
      holder.release();
      await answer?.catch(() => {});
    }
  }

  private async leaseExpiry(taskId: string, attemptId: string): Promise<number> {
    const [row] = await this.observer.sql`select lease_expires_at from attempts
      where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and task_id = ${taskId} and attempt_id = ${attemptId}`;
    return Number(row?.lease_expires_at);
  }

  /** Every row of the task (task, payloads, attempts, history) as one JSON text. */
  private async snapshot(taskId: string): Promise<Snapshot> {
    const key = [SCOPE.tenant_id, SCOPE.namespace, taskId];
    const [row] = await this.observer.sql.unsafe(
      `select json_build_object(
         'task', (select to_jsonb(t) from tasks t
           where tenant_id = $1 and namespace = $2 and task_id = $3),
         'payloads', (select coalesce(jsonb_agg(to_jsonb(p) order by to_jsonb(p)::text), '[]')
           from task_payloads p where tenant_id = $1 and namespace = $2 and task_id = $3),
         'attempts', (select coalesce(jsonb_agg(to_jsonb(a) order by a.attempt_id), '[]')
           from attempts a where tenant_id = $1 and namespace = $2 and task_id = $3),
         'history', (select coalesce(jsonb_agg(to_jsonb(h) order by h.sequence), '[]')
           from task_history h where tenant_id = $1 and namespace = $2 and task_id = $3)
       )::text as snapshot`,
      key,
    );
    const text = String(row?.snapshot);
    const parsed = JSON.parse(text) as {
      task: { state: string };
      history: Snapshot['history'];
    };
    return { text, state: parsed.task.state, history: parsed.history };
  }
}

/** Resolves with `accepted` or the ContractError code; anything else is a bug and rejects. */
async function answerOf(run: () => Promise<unknown>): Promise<CallAnswer> {
  try {
    await run();
    return 'accepted';
  } catch (error) {
    if (error instanceof ContractError) return error.code;
    throw error;
  }
}

/** History records after the first terminal one: a terminal task that reopened. */
function reopenings(snapshot: Snapshot): string[] {
  const end = snapshot.history.findIndex((h) => TERMINAL_REASONS.has(h.reason));
  if (end >= 0 && end < snapshot.history.length - 1) {
    const after = snapshot.history.slice(end + 1).map((h) => h.reason);
    return [`terminal task reopened: ${after.join(', ')} after ${snapshot.history[end]?.reason}`];
  }
  if (end >= 0 && !TERMINAL.has(snapshot.state)) {
    return [`history is terminal, the task is ${snapshot.state}`];
  }
  return [];
}

/** A successful, confirmed settlement of the assignment. */
function settleCommand(assignment: Assignment, operationId: string): SettleCommand {
  const owner = assignment.lease.owner;
  return {
    owner,
    operation_id: operationId,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: { ok: true } },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}
