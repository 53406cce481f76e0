import {
  type AcquireCommand,
  type AcquireReply,
  type AttemptSnapshot,
  type Authority,
  ContractError,
  type LeaseOwner,
  LONG_POLL_WAIT_MS,
  MAX_RECOVERY_BATCH,
  type OpenSessionCommand,
  type RecordedHistoryEvent,
  type RecoveryProgress,
  type RenewCommand,
  type Scope,
  type SettleCommand,
  type SettleReply,
  type SubmitCommand,
  type TaskListQuery,
  type TaskPage,
  type TaskResult,
  type TaskSnapshot,
  type TaskState,
  type TaskStatus,
  type WorkerSession,
} from '@ledgence/contracts';
import { AcquireReplyBudget } from './acquire.js';
import type {
  AcquireOutcome,
  ItemResult,
  SubmitOutcome,
  TaskStore,
  WakeSource,
  WakeTopic,
  WakeWatch,
} from './ports.js';

/** How long a caller is willing to wait, and how to stop waiting early. */
export interface WaitOptions {
  /** The caller's wait preference; clamped to the service's long-poll maximum. */
  waitMs?: number;
  /** Aborts the wait (e.g. the client disconnected); nothing is consumed then. */
  signal?: AbortSignal;
}

/** Options of {@link createTaskService}. */
export interface TaskServiceOptions {
  /** Where every lifecycle operation persists; its replies follow its commits. */
  store: TaskStore;
  /** Delivers wake hints (e.g. LISTEN/NOTIFY); without one, waits rely on the rescan alone. */
  wake?: WakeSource;
  /** Longest a poll or result wait parks (`LEDGENCE_LONG_POLL_WAIT_MS`). */
  longPollMaxMs?: number;
  /**
   * Fallback rescan period of a parked wait: a hint is only a hint, and a lost
   * one (a dropped LISTEN connection) must not strand a waiter for long. A parked
   * poll also looks again when a task of its queue comes due (a delay, a retry's
   * backoff), which no hint announces: the store's probe reports that time.
   */
  rescanIntervalMs?: number;
  /**
   * Aborted when the server shuts down: parked waits stop parking and answer
   * as if their wait had ended (an acquire records and returns `empty`).
   */
  closing?: AbortSignal;
}

/**
 * The service boundary transport adapters call (seed: `TaskService`). A
 * successful mutation reply follows durable transactional acceptance (the
 * store's); the service adds long polls and result waits on top.
 */
export interface TaskService {
  /** Insert-or-return by `(tenant, namespace, idempotency_key)` (DESIGN §5 Submit). */
  submit(command: SubmitCommand): Promise<SubmitOutcome>;
  /** Many submits; each item succeeds or fails alone, in request order. */
  submitBatch(commands: readonly SubmitCommand[]): Promise<ItemResult<SubmitOutcome>[]>;
  /** Issues a worker session valid for the session validity. */
  openSession(command: OpenSessionCommand): Promise<WorkerSession>;
  /** Pushes a live session's expiry to `now + validity`. */
  extendSession(scope: Scope, sessionId: string): Promise<WorkerSession>;
  /**
   * The scope of a session by its id alone (ids are unique), within `tenant` when given; `null`
   * when there is none, live or not. For a session extended without naming its scope.
   */
  sessionScope(sessionId: string, tenant: string | undefined): Promise<Scope | null>;
  /** One poll; with `waitMs`, an empty poll parks until work may be ready or the wait ends. */
  acquire(command: AcquireCommand, options?: WaitOptions): Promise<AcquireReply>;
  /**
   * Polls of one session's slots; with `waitMs`, parks until at least one slot
   * is answered with something other than a new `empty`, or the wait ends.
   */
  acquireBatch(
    commands: readonly AcquireCommand[],
    options?: WaitOptions,
  ): Promise<ItemResult<AcquireReply>[]>;
  /** Renews a lease (heartbeat or dispatch request); a replayed sequence extends nothing. */
  renew(command: RenewCommand): Promise<Authority>;
  /** Many renewals; each answered on its own. */
  renewBatch(commands: readonly RenewCommand[]): Promise<ItemResult<Authority>[]>;
  /** Settles an attempt exactly once; a replay by operation id answers the stored receipt. */
  settle(command: SettleCommand): Promise<SettleReply>;
  /** Many settlements; each answered on its own. */
  settleBatch(commands: readonly SettleCommand[]): Promise<ItemResult<SettleReply>[]>;
  /** Confirms cleanup of a settled attempt whose report said `unconfirmed`. */
  confirmQuiescence(owner: LeaseOwner): Promise<TaskState>;
  /** Cancels a task; a terminal task answers its state unchanged. */
  cancel(scope: Scope, taskId: string): Promise<TaskState>;
  /** Compact scheduling metadata without application payloads. */
  status(scope: Scope, taskId: string): Promise<TaskStatus>;
  /** The result; with `waitMs`, waits for a terminal state first. */
  result(scope: Scope, taskId: string, options?: WaitOptions): Promise<TaskResult>;
  /** The full scheduling record. */
  inspect(scope: Scope, taskId: string): Promise<TaskSnapshot>;
  /** One attempt as recorded. */
  inspectAttempt(scope: Scope, taskId: string, attemptId: string): Promise<AttemptSnapshot>;
  /** At most 100 ordered history records after `afterSequence`. */
  history(scope: Scope, taskId: string, afterSequence: number): Promise<RecordedHistoryEvent[]>;
  /** One bounded page in descending (submitted_at, task_id) order. */
  listTasks(scope: Scope, query: TaskListQuery): Promise<TaskPage>;
  /** One bounded recovery pass (maintenance). */
  recoverExpiredLeases(limit?: number): Promise<RecoveryProgress>;
}

const DEFAULT_RESCAN_INTERVAL_MS = 1_000;

/**
 * Added to a due time's delay before a parked poll looks again. The delay already runs late (it
 * starts when the probe's answer arrived, after the store read its clock), so this only covers
 * rounding: store time in whole ms, a timer that may fire up to a millisecond early. Looking too
 * early costs one more probe, which learns the due time again and parks for the rest.
 */
const DUE_MARGIN_MS = 5;

/** Sleeps `timeoutMs` or until `signal` aborts: a park with no hint to end it early. */
function sleep(timeoutMs: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    if (signal?.aborted || timeoutMs <= 0) return resolve();
    const timer = setTimeout(done, timeoutMs);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}

/** No wake source: every park lasts until the rescan, the deadline or an abort. */
const noWake: WakeSource = { watch: () => ({ next: sleep, close() {} }) };

/** The replies of a batch's outcomes, item failures as they are. */
function replies(outcomes: readonly ItemResult<AcquireOutcome>[]): ItemResult<AcquireReply>[] {
  return outcomes.map((o) => (o.ok ? { ok: true, value: o.value.reply } : o));
}

/** The replies of a batch that are not item failures. */
function okReplies(results: readonly ItemResult<AcquireReply>[]): AcquireReply[] {
  return results.flatMap((r) => (r.ok ? [r.value] : []));
}

/**
 * How long until a task of the probed queues comes due, on the local clock: the earliest of the
 * probes' `nextDue`, each converted from store time once, as a delay from now (the probes'
 * answers just arrived). Store time decides eligibility; this only says when to look again.
 */
function dueDelayMs(outcomes: readonly ItemResult<AcquireOutcome>[]): number {
  let delay = Number.POSITIVE_INFINITY;
  for (const outcome of outcomes) {
    const due = outcome.ok ? outcome.value.nextDue : undefined;
    if (due === undefined) continue;
    delay = Math.min(delay, Math.max(0, due.at - due.observedAt) + DUE_MARGIN_MS);
  }
  return delay;
}

/** A fresh `empty` that the store did not record: probing again is still a new poll. */
function unrecordedEmpty(outcome: AcquireOutcome): boolean {
  return !outcome.recorded;
}

/** The slot a poll is for: its scope, session and consumer. */
function slotOf(command: AcquireCommand): string {
  const { scope, worker_session_id, consumer_id } = command;
  return JSON.stringify([scope.tenant_id, scope.namespace, worker_session_id, consumer_id]);
}

/** Indexes of the first poll of each slot, in request order. */
function firstPollsOfSlots(commands: readonly AcquireCommand[]): number[] {
  const seen = new Set<string>();
  const firsts: number[] = [];
  commands.forEach((command, index) => {
    const slot = slotOf(command);
    if (seen.has(slot)) return;
    seen.add(slot);
    firsts.push(index);
  });
  return firsts;
}

/** The distinct queues of a batch's polls, each a wake topic. */
function queueTopics(commands: readonly AcquireCommand[]): WakeTopic[] {
  const topics = new Map<string, WakeTopic>();
  for (const { scope, queue } of commands) {
    const key = JSON.stringify([scope.tenant_id, scope.namespace, queue]);
    if (!topics.has(key)) topics.set(key, { kind: 'queue', scope, queue });
  }
  return [...topics.values()];
}

/**
 * Builds the task service over a store and an optional wake source.
 *
 * @example
 * ```ts
 * const service = createTaskService({ store, wake, longPollMaxMs: 20_000 });
 * const reply = await service.acquire(command, { waitMs: 20_000, signal });
 * ```
 */
export function createTaskService(options: TaskServiceOptions): TaskService {
  const { store } = options;
  const wake = options.wake ?? noWake;
  const longPollMaxMs = options.longPollMaxMs ?? LONG_POLL_WAIT_MS;
  const rescanMs = options.rescanIntervalMs ?? DEFAULT_RESCAN_INTERVAL_MS;

  /**
   * The wait budget of a request: its preference clamped to the maximum, as a deadline on the
   * monotonic clock — a wall clock stepped by NTP mid-wait would stretch or cut the wait.
   */
  function budget(wait: WaitOptions | undefined): { deadline: number; parks: boolean } {
    const waitMs = Math.min(Math.max(wait?.waitMs ?? 0, 0), longPollMaxMs);
    return { deadline: performance.now() + waitMs, parks: waitMs > 0 };
  }

  const closing = options.closing;
  /**
   * The parks in progress, ended together by shutdown through ONE listener on `closing`. Not
   * `AbortSignal.any([signal, closing])` per park: on Node 20 each such signal stays registered
   * with the process-long `closing` until it aborts (a leak of ~70 bytes per park, every rescan of
   * every long poll), and a listener per park on `closing` would pass its listener limit.
   */
  const parked = new Set<() => void>();
  closing?.addEventListener(
    'abort',
    () => {
      for (const end of parked) end();
    },
    { once: true },
  );

  /**
   * Parks on `watch` until a hint (including one that came while the caller was probing), the
   * next rescan, the deadline, `dueMs` (when a task of the probed queues comes due: nothing
   * NOTIFYs then), an abort or shutdown; true while time remains.
   */
  async function park(
    watch: WakeWatch,
    deadline: number,
    signal?: AbortSignal,
    dueMs = Number.POSITIVE_INFINITY,
  ): Promise<boolean> {
    const remaining = deadline - performance.now();
    if (remaining <= 0 || signal?.aborted || closing?.aborted) return false;
    const timeoutMs = Math.min(remaining, rescanMs, dueMs);
    if (closing === undefined) {
      await watch.next(timeoutMs, signal);
    } else {
      const stop = new AbortController();
      const end = () => stop.abort();
      parked.add(end);
      signal?.addEventListener('abort', end, { once: true });
      try {
        await watch.next(timeoutMs, stop.signal);
      } finally {
        parked.delete(end);
        signal?.removeEventListener('abort', end);
      }
    }
    return !signal?.aborted && !closing?.aborted && deadline - performance.now() > 0;
  }

  /**
   * Runs `body` with a watch on `topics` taken before its first probe, so no hint is lost
   * between a probe and the park after it; closes the watch whatever `body` does.
   */
  async function watching<T>(
    topics: readonly WakeTopic[],
    body: (watch: WakeWatch) => Promise<T>,
  ): Promise<T> {
    const watch = watchEach(topics);
    try {
      return await body(watch);
    } finally {
      watch.close();
    }
  }

  /**
   * One watch over several topics (an acquire batch's polls of several queues): its `next` ends
   * at the first hint of any of them. The others' pending `next` are ended before it resolves,
   * so each watch still has one `next` at a time.
   */
  function watchEach(topics: readonly WakeTopic[]): WakeWatch {
    const watches = topics.map((t) => wake.watch(t));
    if (watches.length === 1) return watches[0] as WakeWatch;
    return {
      async next(timeoutMs, signal) {
        const stop = new AbortController();
        const end = () => stop.abort();
        signal?.addEventListener('abort', end, { once: true });
        const pending = watches.map((w) => w.next(timeoutMs, stop.signal));
        try {
          await Promise.race(pending);
        } finally {
          stop.abort();
          signal?.removeEventListener('abort', end);
          await Promise.all(pending);
        }
      },
      close() {
        for (const w of watches) w.close();
      },
    };
  }

  /**
   * A closing server takes no new work: a poll that arrives after shutdown began is refused as
   * `unavailable`, so the worker re-sends the same sequence to another replica (or this one
   * restarted) and nothing is consumed. Renewals and settlements are still served.
   */
  function refuseWhileClosing(): void {
    if (closing?.aborted) {
      throw new ContractError('unavailable', 'the server is shutting down; retry the same poll', {
        reason: 'shutting_down',
      });
    }
  }

  /**
   * DESIGN §5: a client disconnect ends the wait without consuming a task. The server may learn
   * of the disconnect only while a claim for the poll runs (a client gone before its request was
   * looked at), so claims the reply cannot reach are given back, as a worker gives back an
   * assignment at shutdown: a settlement before any user code ran (never granted dispatch, the
   * attempt does not count), re-queuing the task in its old place, due at once (handBackAttempt),
   * instead of leaving it leased to nobody until the lease expires. Best effort: should it fail,
   * the lease still does.
   *
   * Only an assignment nobody has renewed is given back. A replayed poll answers an assignment
   * an earlier request of the same sequence may have delivered: a late copy of an answered poll
   * (one its worker gave up on, held in a proxy or a full pool) whose client is gone must leave
   * the attempt to the worker that renewed it — granted dispatch, its user code runs, and a
   * hand-back would settle the attempt under it, counting it and discarding its result.
   */
  async function handBackUndelivered(
    replies: readonly AcquireReply[],
    signal: AbortSignal | undefined,
  ): Promise<void> {
    if (!signal?.aborted) return;
    const commands: SettleCommand[] = [];
    for (const reply of replies) {
      if (reply.disposition !== 'assigned') continue;
      if (reply.assignment.authority.renew_sequence > 0) continue;
      const owner = reply.assignment.lease.owner;
      commands.push({
        owner,
        operation_id: `undelivered:${owner.attempt_id}`,
        report: {
          kind: 'failed',
          report: {
            kind: 'rejected',
            message: "the poll's client disconnected before its reply: the claim was given back",
            retryable: true,
          },
        },
        quiescence: 'confirmed',
        processing_trace: null,
      });
    }
    if (commands.length === 0) return;
    // The renewal check above saves a transaction; the store checks again under the task's lock,
    // since a worker's renewal may commit between the replay that read the reply and this.
    await store.handBackBatch(commands).catch(() => {});
  }

  /** Whether a poll's closing store call may still claim: not once shutdown began. */
  const stillClaiming = () => closing?.aborted !== true;

  async function acquire(command: AcquireCommand, wait?: WaitOptions): Promise<AcquireReply> {
    refuseWhileClosing();
    const { deadline, parks } = budget(wait);
    if (!parks) {
      const { reply } = await store.acquire(command, { recordEmpty: true });
      await handBackUndelivered([reply], wait?.signal);
      return reply;
    }
    const topic: WakeTopic = { kind: 'queue', scope: command.scope, queue: command.queue };
    const found = await watching([topic], async (watch) => {
      for (;;) {
        const probe = await store.acquire(command, { recordEmpty: false });
        if (!unrecordedEmpty(probe)) return probe.reply;
        const dueMs = dueDelayMs([{ ok: true, value: probe }]);
        if (!(await park(watch, deadline, wait?.signal, dueMs))) return undefined;
      }
    });
    if (found !== undefined) {
      await handBackUndelivered([found], wait?.signal);
      return found;
    }
    // A disconnected client gets nothing and consumes nothing: its retry of the
    // same sequence is still a new poll.
    if (wait?.signal?.aborted) return { disposition: 'empty', sequence: command.sequence };
    // The recording poll may claim (a task came due after the last probe), and its client may
    // leave while it runs. A park ended by shutdown claims nothing: DESIGN §11 ends long polls
    // with `empty` (review r56c: a task whose wake had not arrived yet was assigned).
    const { reply } = await store.acquire(command, { recordEmpty: true, claim: stillClaiming() });
    await handBackUndelivered([reply], wait?.signal);
    return reply;
  }

  async function acquireBatch(
    commands: readonly AcquireCommand[],
    wait?: WaitOptions,
  ): Promise<ItemResult<AcquireReply>[]> {
    refuseWhileClosing();
    const { deadline, parks } = budget(wait);
    const first = commands[0];
    if (!parks || first === undefined) {
      const answered = replies(await store.acquireBatch(commands, { recordEmpty: true }));
      await handBackUndelivered(okReplies(answered), wait?.signal);
      return answered;
    }
    // A slot polled twice (sequences n and n+1): the later poll follows the earlier one's
    // recorded outcome, which a probe (recording no `empty`) does not leave. The probes park on
    // each slot's first poll; the whole batch is then answered in order, as its polls sent one
    // after another would be (the first polls that claimed meanwhile replay their claims).
    const firsts = firstPollsOfSlots(commands);
    const repeats = firsts.length < commands.length;
    const probes = repeats ? firsts.map((i) => commands[i] as AcquireCommand) : commands;
    // Every queue of the batch is watched: a hint for any of its polls' queues ends the park.
    const outcomes = await watching(queueTopics(probes), async (watch) => {
      // DESIGN §6: the batch parks until a slot is assigned or the wait ends, and an item's
      // error does not fail its neighbours — a slot refused (consumer_busy, say) does not end
      // the wait of the others, nor does a replay answering its recorded `empty` (or
      // `ownership_lost`) again; a batch with no slot left to fill answers at once.
      const waiting = (batch: ItemResult<AcquireOutcome>[]) =>
        batch.some((o) => o.ok && unrecordedEmpty(o.value)) &&
        !batch.some((o) => o.ok && o.value.reply.disposition === 'assigned');
      let probed = await store.acquireBatch(probes, { recordEmpty: false });
      // The earliest due time of the batch's queues ends the park.
      while (waiting(probed) && (await park(watch, deadline, wait?.signal, dueDelayMs(probed)))) {
        probed = await store.acquireBatch(probes, { recordEmpty: false });
      }
      return probed;
    });
    // A disconnected client's assignments are given back; its unrecorded empties consumed
    // nothing (a repeated slot's later polls were never run: the reply reaches no one).
    if (wait?.signal?.aborted) {
      const answered = replies(outcomes);
      await handBackUndelivered(okReplies(answered), wait.signal);
      if (!repeats) return answered;
      const unanswered: ItemResult<AcquireReply> = {
        ok: false,
        error: new ContractError('unavailable', "the poll's client disconnected"),
      };
      const byIndex = new Map(firsts.map((index, k) => [index, answered[k]]));
      return commands.map((_, index) => byIndex.get(index) ?? unanswered);
    }
    if (repeats) {
      const answered = replies(
        await store.acquireBatch(commands, { recordEmpty: true, claim: stillClaiming() }),
      );
      await handBackUndelivered(okReplies(answered), wait?.signal);
      return answered;
    }
    // Record the empties this reply reports, so the client's next sequences follow on.
    const unrecorded = outcomes.flatMap((o, i) => (o.ok && unrecordedEmpty(o.value) ? [i] : []));
    if (unrecorded.length > 0) {
      // Polls the probe turned away for the reply's size are among them: what they claim now
      // joins a reply that already holds the probe's claims (one bound for the whole reply).
      const held = new AcquireReplyBudget();
      for (const o of outcomes) if (o.ok && !unrecordedEmpty(o.value)) held.count(o.value.reply);
      const recorded = await store.acquireBatch(
        unrecorded.map((i) => commands[i] as AcquireCommand),
        { recordEmpty: true, replyBytesUsed: held.used, claim: stillClaiming() },
      );
      unrecorded.forEach((index, k) => {
        outcomes[index] = recorded[k] as ItemResult<AcquireOutcome>;
      });
    }
    // The client may have left while the empties were recorded (which can claim, too): every
    // assignment of the batch is then undelivered.
    const answered = replies(outcomes);
    await handBackUndelivered(okReplies(answered), wait?.signal);
    return answered;
  }

  async function result(scope: Scope, taskId: string, wait?: WaitOptions): Promise<TaskResult> {
    const { deadline, parks } = budget(wait);
    if (!parks) return store.result(scope, taskId);
    const topic: WakeTopic = { kind: 'task', scope, task_id: taskId };
    return watching([topic], async (watch) => {
      for (;;) {
        const current = await store.result(scope, taskId);
        if (current.outcome.state !== 'pending') return current;
        if (!(await park(watch, deadline, wait?.signal))) return store.result(scope, taskId);
      }
    });
  }

  return {
    submit: (command) => store.submit(command),
    submitBatch: (commands) => store.submitBatch(commands),
    openSession: (command) => store.openSession(command),
    extendSession: (scope, id) => store.extendSession(scope, id),
    sessionScope: (id, tenant) => store.sessionScope(id, tenant),
    acquire,
    acquireBatch,
    renew: (command) => store.renew(command),
    renewBatch: (commands) => store.renewBatch(commands),
    settle: (command) => store.settle(command),
    settleBatch: (commands) => store.settleBatch(commands),
    confirmQuiescence: (owner) => store.confirmQuiescence(owner),
    cancel: (scope, id) => store.cancel(scope, id),
    status: (scope, id) => store.status(scope, id),
    result,
    inspect: (scope, id) => store.inspect(scope, id),
    inspectAttempt: (scope, id, attemptId) => store.inspectAttempt(scope, id, attemptId),
    history: (scope, id, after) => store.history(scope, id, after),
    listTasks: (scope, query) => store.listTasks(scope, query),
    recoverExpiredLeases: (limit = MAX_RECOVERY_BATCH) => store.recoverExpiredLeases(limit),
  };
}
