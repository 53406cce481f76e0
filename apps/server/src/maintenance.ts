/**
 * The server's maintenance loops (DESIGN §11): lease recovery, retention, and planner statistics
 * of new and fast-growing tables.
 * Every replica runs both at once; the store's `SKIP LOCKED` selection makes
 * that safe without a leader. Each pass is one bounded transaction, so a
 * loop never holds long locks and a stop waits at most one pass.
 */
import {
  MAX_RECOVERY_BATCH,
  MAX_RETENTION_BATCH,
  type RecoveryProgress,
  type RetentionProgress,
  type Scope,
} from '@ledgence/contracts';
import { type FailureRunOptions, failureRun, type RetentionStore } from '@ledgence/core';
import type { Logger } from 'pino';

/** A running maintenance loop. */
export interface Maintenance {
  /** Stops the loop after the pass in progress, if any, has committed. */
  stop(): Promise<void>;
}

/** Options of {@link startPeriodic}. */
export interface PeriodicOptions {
  /** What the loop does, for its failure log line (e.g. `lease recovery`). */
  name: string;
  /** Pause between rounds. */
  intervalMs: number;
  /** Where failed rounds (spaced by `failureLog`) and the first success after them are logged. */
  logger: Logger;
  /** One round; `stopping()` turns true once stop() was called, so a long round ends early. */
  round(stopping: () => boolean): Promise<void>;
  /** Spacing of the log lines of a run of failed rounds (`failureRun`'s options). */
  failureLog?: FailureRunOptions;
}

/**
 * Runs `round` every `intervalMs` (measured from the end of the previous
 * round, so rounds never overlap). A failed round is logged and the loop goes
 * on: the next round retries whatever was left. Of a run of failed rounds the
 * first is logged, then at most one a minute with the count so far, and the
 * first round that succeeds again says how many failed before it.
 */
export function startPeriodic(options: PeriodicOptions): Maintenance {
  const { name, logger } = options;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> = Promise.resolve();
  const stopping = () => stopped;
  const run = failureRun(options.failureLog);

  function failed(error: unknown): void {
    const { failures, log } = run.failed();
    if (!log) return;
    if (failures === 1) logger.warn({ err: error }, `${name} failed; retrying next round`);
    else {
      logger.warn(
        { err: error, failures },
        `${name} still failing (${failures} rounds in a row); retrying next round`,
      );
    }
  }

  function succeeded(): void {
    const ended = run.succeeded();
    if (ended === 0) return;
    logger.info(
      { failures: ended },
      `${name} works again after ${ended} failed round${ended === 1 ? '' : 's'}`,
    );
  }

  function schedule(): void {
    if (stopped) return;
    timer = setTimeout(() => {
      running = options.round(stopping).then(succeeded, failed).finally(schedule);
    }, options.intervalMs);
    timer.unref();
  }
  schedule();

  return {
    async stop() {
      stopped = true;
      if (timer !== undefined) clearTimeout(timer);
      await running;
    },
  };
}

/** Options of {@link startRecoveryLoop}. */
export interface RecoveryLoopOptions {
  /** One bounded recovery pass (the service's `recoverExpiredLeases`). */
  recover(limit: number): Promise<RecoveryProgress>;
  /** Pause between rounds (`LEDGENCE_MAINTENANCE_INTERVAL_MS`). */
  intervalMs: number;
  /** Where recovered leases and failed rounds are logged. */
  logger: Logger;
  /** Called with each pass's progress (metrics). */
  onProgress?: (progress: RecoveryProgress) => void;
}

/**
 * Lease recovery: passes of at most MAX_RECOVERY_BATCH, repeated within a
 * round while a pass was full.
 */
export function startRecoveryLoop(options: RecoveryLoopOptions): Maintenance {
  return startPeriodic({
    name: 'lease recovery',
    intervalMs: options.intervalMs,
    logger: options.logger,
    async round(stopping) {
      for (;;) {
        const progress = await options.recover(MAX_RECOVERY_BATCH);
        options.onProgress?.(progress);
        if (progress.recovered > 0) options.logger.info({ progress }, 'recovered expired leases');
        if (!progress.has_more || stopping()) break;
      }
    },
  });
}

/** Options of {@link startStatisticsLoop}. */
export interface StatisticsLoopOptions {
  /** The store's statistics pass (`analyzeGrowingTables`): the tables it analyzed. */
  analyze(): Promise<string[]>;
  /** Pause between rounds (`LEDGENCE_MAINTENANCE_INTERVAL_MS`). */
  intervalMs: number;
  logger: Logger;
}

/**
 * Young tables' statistics: each round analyzes the store's tables that hold rows but were never
 * analyzed, or that, while still small, have doubled in size since they last were, so a fresh
 * install stops planning key lookups through the wrong index within one interval instead of at
 * autovacuum's first visit (up to a minute; never, with autovacuum off), and plans cached while
 * a table was tiny (a sequential scan of it) are replaced as it grows. Rounds without such a
 * table are one catalog read. Every replica runs it; two that analyze one table at once only
 * queue on its lock.
 */
export function startStatisticsLoop(options: StatisticsLoopOptions): Maintenance {
  return startPeriodic({
    name: 'table statistics',
    intervalMs: options.intervalMs,
    logger: options.logger,
    async round() {
      const tables = await options.analyze();
      if (tables.length > 0) {
        options.logger.info(
          { tables },
          'analyzed young tables (never analyzed, or doubled in size since)',
        );
      }
    },
  });
}

/** Namespaces read per page of the retention walk. */
const RETENTION_SCOPES_PAGE = 100;

/** Options of {@link startRetentionLoop} and {@link collectRetention}. */
export interface RetentionLoopOptions {
  /** The retention operations the walk uses; the PostgreSQL store fits as it is. */
  store: Pick<RetentionStore, 'retentionScopes' | 'collectRetired'> & {
    /**
     * The walk's namespaces that have something due now (the PostgreSQL store's
     * `dueRetentionScopes`); when present the round walks these instead of `retentionScopes`,
     * so namespaces holding only young terminal tasks cost no collection transaction.
     */
    dueRetentionScopes?: RetentionStore['retentionScopes'];
  };
  /** Pause between rounds (`LEDGENCE_RETENTION_INTERVAL_MS`). */
  intervalMs: number;
  /** Where removals and failed rounds are logged. */
  logger: Logger;
  /** Tasks removed per transaction; MAX_RETENTION_BATCH by default. */
  batchSize?: number;
  /** Called with each transaction's progress (metrics). */
  onProgress?: (scope: Scope, progress: RetentionProgress) => void;
  /** Called after each completed round, whether or not anything was due (metrics). */
  onRound?: () => void;
}

/**
 * One retention round: walks every namespace that holds terminal tasks or
 * expired worker sessions and collects its retired records in bounded
 * transactions, repeated while a transaction was full. With a store that
 * answers `dueRetentionScopes`, only namespaces with something due are
 * collected: a round where nothing is due is a few reads, however many
 * namespaces hold terminal tasks. Logs each namespace's
 * totals when it removed anything. A namespace whose collection fails is left
 * to a later round and the walk goes on to the next one; the round's first
 * such failure is logged with its error, and a round with more of them ends
 * with one line counting them (a database that reads but refuses writes fails
 * every namespace due, every round). Returns the tasks removed.
 */
export async function collectRetention(
  options: Omit<RetentionLoopOptions, 'intervalMs'>,
  stopping: () => boolean = () => false,
): Promise<number> {
  const { logger } = options;
  const failed: Scope[] = [];
  try {
    return await walkRetention(options, stopping, (scope, totals, error) => {
      // A collection that meets a row another transaction holds gives up after the store's
      // lock_timeout (`unavailable`), by design. Ending the round here would leave every
      // namespace after this one uncollected for as long as this one keeps failing, since each
      // round starts the walk over.
      if (failed.length === 0) {
        logger.warn(
          { ...scope, ...totals, err: error },
          'retention of a namespace failed; retrying it next round',
        );
      }
      failed.push(scope);
    });
  } finally {
    if (failed.length > 1) {
      logger.warn(
        {
          failed_namespaces: failed.length,
          namespaces: failed
            .slice(0, FAILED_SCOPES_LOGGED)
            .map((scope) => `${scope.tenant_id}/${scope.namespace}`),
        },
        `retention of ${failed.length} namespaces failed this round; retrying them next round`,
      );
    }
  }
}

/** Namespaces a round's failure summary names (it counts them all). */
const FAILED_SCOPES_LOGGED = 10;

/** Totals of one namespace's collection in a round. */
interface ScopeTotals {
  tasks: number;
  sessions: number;
  transactions: number;
}

/** {@link collectRetention}'s walk; `failed` hears of each namespace whose collection failed. */
async function walkRetention(
  options: Omit<RetentionLoopOptions, 'intervalMs'>,
  stopping: () => boolean,
  failed: (scope: Scope, totals: ScopeTotals, error: unknown) => void,
): Promise<number> {
  const { store, logger } = options;
  const batchSize = options.batchSize ?? MAX_RETENTION_BATCH;
  let removed = 0;
  let after: Scope | undefined;
  for (;;) {
    const scopes =
      store.dueRetentionScopes !== undefined
        ? await store.dueRetentionScopes(after, RETENTION_SCOPES_PAGE)
        : await store.retentionScopes(after, RETENTION_SCOPES_PAGE);
    for (const scope of scopes) {
      const totals: ScopeTotals = { tasks: 0, sessions: 0, transactions: 0 };
      try {
        for (;;) {
          const progress = await store.collectRetired(scope, batchSize);
          options.onProgress?.(scope, progress);
          totals.tasks += progress.tasks_removed;
          totals.sessions += progress.sessions_removed;
          totals.transactions += 1;
          if (!progress.has_more || stopping()) break;
        }
      } catch (error) {
        failed(scope, totals, error);
      }
      removed += totals.tasks;
      if (totals.tasks + totals.sessions > 0) {
        logger.info({ ...scope, ...totals }, 'retention removed retired records');
      }
      if (stopping()) return removed;
    }
    if (scopes.length < RETENTION_SCOPES_PAGE) return removed;
    after = scopes.at(-1);
  }
}

/** Retention: a {@link collectRetention} round every `intervalMs`. */
export function startRetentionLoop(options: RetentionLoopOptions): Maintenance {
  return startPeriodic({
    name: 'retention',
    intervalMs: options.intervalMs,
    logger: options.logger,
    round: async (stopping) => {
      await collectRetention(options, stopping);
      options.onRound?.();
    },
  });
}
