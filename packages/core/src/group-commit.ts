import {
  ACQUIRE_BATCH_REPLY_MAX_BYTES,
  type AcquireCommand,
  type Authority,
  BATCH_MAX_BYTES,
  type RenewCommand,
  type SettleCommand,
  type SettleReply,
  SUBMISSION_MAX_BYTES,
  type SubmitCommand,
} from '@ledgence/contracts';
import type {
  AcquireOutcome,
  AcquireStoreOptions,
  ItemResult,
  SubmitOutcome,
  TaskStore,
} from './ports.js';

/**
 * Single submits grouped into one transaction at most: a group never carries more bytes than one
 * batch request may (BATCH_MAX_BYTES / SUBMISSION_MAX_BYTES = 8 maximal submissions), so grouping
 * cannot build a statement larger than the API already allows.
 */
const SUBMIT_GROUP_MAX = Math.floor(BATCH_MAX_BYTES / SUBMISSION_MAX_BYTES);

/**
 * Single polls grouped into one claim at most: a claim stops before its assignments pass
 * ACQUIRE_BATCH_REPLY_MAX_BYTES, and an assignment carries at most a submission's bytes, so a
 * group of this many always fits whole — no poll is answered `empty` for its neighbours' bytes,
 * which alone it would not have been.
 */
const ACQUIRE_GROUP_MAX = Math.floor(ACQUIRE_BATCH_REPLY_MAX_BYTES / SUBMISSION_MAX_BYTES);

/** Options of {@link withGroupCommit}. */
export interface GroupCommitOptions {
  /** Most items one batch carries; a full batch is sent at once. */
  maxBatch?: number;
  /**
   * Batches of one key in flight at once. Arrivals while all are busy wait for
   * the next batch, which is how batches grow under load (group commit) while
   * a lone request still runs immediately.
   */
  maxInFlight?: number;
}

interface Pending<C, R> {
  command: C;
  resolve: (value: R) => void;
  reject: (error: unknown) => void;
}

/**
 * Coalesces concurrent single calls that share a key into batch calls: one
 * statement set and one commit for many requests, each still answered with
 * exactly its own reply or its own error. If a batch fails as a whole (a
 * backend error, a deadlock), each of its items is retried alone, so one bad
 * item cannot fail its neighbours.
 */
class Coalescer<C, R> {
  private readonly queues = new Map<string, Pending<C, R>[]>();
  private readonly inFlight = new Map<string, number>();

  constructor(
    private readonly runBatch: (commands: C[]) => Promise<ItemResult<R>[]>,
    private readonly runOne: (command: C) => Promise<R>,
    private readonly maxBatch: number,
    private readonly maxInFlight: number,
  ) {}

  submit(key: string, command: C): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      const queue = this.queues.get(key) ?? [];
      queue.push({ command, resolve, reject });
      this.queues.set(key, queue);
      this.pump(key);
    });
  }

  private pump(key: string): void {
    for (;;) {
      const queue = this.queues.get(key);
      const running = this.inFlight.get(key) ?? 0;
      if (queue === undefined || queue.length === 0 || running >= this.maxInFlight) return;
      const batch = queue.splice(0, this.maxBatch);
      if (queue.length === 0) this.queues.delete(key);
      this.inFlight.set(key, running + 1);
      void this.execute(batch).finally(() => {
        const left = (this.inFlight.get(key) ?? 1) - 1;
        if (left === 0) this.inFlight.delete(key);
        else this.inFlight.set(key, left);
        this.pump(key);
      });
    }
  }

  private async execute(batch: Pending<C, R>[]): Promise<void> {
    if (batch.length === 1) {
      const only = batch[0] as Pending<C, R>;
      await this.runOne(only.command).then(only.resolve, only.reject);
      return;
    }
    let results: ItemResult<R>[];
    try {
      results = await this.runBatch(batch.map((p) => p.command));
    } catch {
      await Promise.all(batch.map((p) => this.runOne(p.command).then(p.resolve, p.reject)));
      return;
    }
    batch.forEach((pending, index) => {
      const result = results[index];
      if (result === undefined) pending.reject(new Error('batch reply is missing an item'));
      else if (result.ok) pending.resolve(result.value);
      else pending.reject(result.error);
    });
  }
}

function scopeKey(scope: { tenant_id: string; namespace: string }): string {
  return JSON.stringify([scope.tenant_id, scope.namespace]);
}

/**
 * A store whose single submit, acquire, renew and settle calls are grouped
 * (DESIGN §7.1): concurrent submits of one scope, acquisitions of one queue,
 * renewals of one scope and settlements of one scope share a batch call.
 * Every other method passes through unchanged.
 *
 * Submits joined in issue #7: with 8 single submits in flight each was its
 * own transaction and commit (bench/README.md, "Changes and their measured
 * effect"). A batch answers each item exactly as alone (a repeated key in one
 * batch is a replay of the first, as it would be after the first committed).
 */
export function withGroupCommit(store: TaskStore, options: GroupCommitOptions = {}): TaskStore {
  const maxBatch = options.maxBatch ?? 64;
  const maxInFlight = options.maxInFlight ?? 2;
  const acquirers = new Map<boolean, Coalescer<AcquireCommand, AcquireOutcome>>();
  const acquirer = (opts: AcquireStoreOptions) => {
    let coalescer = acquirers.get(opts.recordEmpty);
    if (coalescer === undefined) {
      coalescer = new Coalescer(
        (commands) => store.acquireBatch(commands, opts),
        (command) => store.acquire(command, opts),
        Math.min(maxBatch, ACQUIRE_GROUP_MAX),
        maxInFlight,
      );
      acquirers.set(opts.recordEmpty, coalescer);
    }
    return coalescer;
  };
  const renewals = new Coalescer<RenewCommand, Authority>(
    (commands) => store.renewBatch(commands),
    (command) => store.renew(command),
    maxBatch,
    maxInFlight,
  );
  const settlements = new Coalescer<SettleCommand, SettleReply>(
    (commands) => store.settleBatch(commands),
    (command) => store.settle(command),
    maxBatch,
    maxInFlight,
  );
  const submissions = new Coalescer<SubmitCommand, SubmitOutcome>(
    (commands) => store.submitBatch(commands),
    (command) => store.submit(command),
    Math.min(maxBatch, SUBMIT_GROUP_MAX),
    maxInFlight,
  );
  return {
    ...bindAll(store),
    submit: (command) => submissions.submit(scopeKey(command.input), command),
    acquire: (command, opts) =>
      acquirer(opts).submit(`${scopeKey(command.scope)}:${command.queue}`, command),
    renew: (command) => renewals.submit(scopeKey(command.owner.scope), command),
    settle: (command) => settlements.submit(scopeKey(command.owner.scope), command),
  };
}

/** Every method of a {@link TaskStore}: {@link bindAll} binds each. */
const STORE_METHODS = [
  'now',
  'submit',
  'submitBatch',
  'openSession',
  'extendSession',
  'sessionScope',
  'acquire',
  'acquireBatch',
  'renew',
  'renewBatch',
  'settle',
  'settleBatch',
  'handBackBatch',
  'confirmQuiescence',
  'cancel',
  'status',
  'result',
  'inspect',
  'inspectAttempt',
  'history',
  'listTasks',
  'recoverExpiredLeases',
] as const satisfies readonly (keyof TaskStore)[];

// A method added to TaskStore and missing above would be left unbound (undefined once spread):
// this fails to compile until it is listed.
const everyStoreMethod: Exclude<keyof TaskStore, (typeof STORE_METHODS)[number]> extends never
  ? true
  : never = true;
void everyStoreMethod;

/** The store's methods bound to it, so spreading them keeps `this` for class-based stores. */
function bindAll(store: TaskStore): TaskStore {
  const bound = {} as Record<string, unknown>;
  for (const name of STORE_METHODS) {
    const method = (store as unknown as Record<string, (...args: unknown[]) => unknown>)[name];
    bound[name] = method?.bind(store);
  }
  return bound as unknown as TaskStore;
}
