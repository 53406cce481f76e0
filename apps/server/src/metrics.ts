/**
 * The server's Prometheus metrics (DESIGN §11, `/metrics`): HTTP durations, acquire outcomes and
 * long-poll waits, settle outcomes, lease expiries, queue depth (read from the store on scrape),
 * and Node's process metrics — all in a private registry, never prom-client's global one.
 *
 * Every label value comes from a bounded set: route patterns (never raw paths), a fixed list of
 * methods, status classes, acquire dispositions, the contracts' ERROR_CODES, task states, and at
 * most `maxQueues` queue names with the rest summed under `_other`. Tenants and namespaces are
 * never labels: their number is unbounded, and so would be the series.
 */
import {
  ContractError,
  type ErrorCode,
  isErrorCode,
  type RecoveryProgress,
  type RetentionProgress,
  TaskStateSchema,
} from '@ledgence/contracts';
import type { TaskService, WaitOptions } from '@ledgence/core';
import type { HttpResponseInfo } from '@ledgence/http';
import type { QueueDepth } from '@ledgence/store-postgres';
import type { Logger } from 'pino';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

/** The default number of queues that get their own `queue` label value. */
export const DEFAULT_MAX_QUEUES = 50;

/** The `queue` label value of the queues past the limit, summed. */
export const OTHER_QUEUE = '_other';

/** The `route` label value of a request no route matched (its path is never a label). */
export const UNMATCHED_ROUTE = 'unmatched';

/** The `code` / `task_state` label value where the label does not apply. */
export const NONE = 'none';

/** The `outcome` of an acquire wait whose client left before the reply (it answered no one). */
export const LEFT = 'left';

/** Options of {@link createServerMetrics}. */
export interface ServerMetricsOptions {
  /**
   * Reads non-terminal task counts on each scrape (the store's `queueDepths`), asked for at most
   * `limit` queues; without it no queue depth is exported.
   */
  queueDepths?: (limit: number) => Promise<readonly QueueDepth[]>;
  /** Queues that get their own label value, deepest first; default {@link DEFAULT_MAX_QUEUES}. */
  maxQueues?: number;
  /** Node process metrics (`process_*`, `nodejs_*`); default true. */
  defaultMetrics?: boolean;
  /**
   * Counts completion deliveries due now and not leased, up to `limit`, on each scrape (the
   * store's `dueBacklog`); without it no backlog gauge is exported.
   */
  dueBacklog?: (limit: number) => Promise<number>;
  /** Where a failed queue depth or backlog read is reported; default nowhere. */
  logger?: Logger;
  /**
   * How long a queue depth or backlog read answers later scrapes (default
   * {@link DEFAULT_READ_REUSE_MS}); scrapes meanwhile share the read in flight whatever this is.
   */
  readReuseMs?: number;
  /**
   * How long a scrape waits for its queue depth and backlog reads before it renders without them
   * (counted as failed reads); default {@link DEFAULT_SCRAPE_READ_TIMEOUT_MS}.
   */
  readTimeoutMs?: number;
}

/** Default {@link ServerMetricsOptions.readReuseMs}: well under any scrape interval. */
export const DEFAULT_READ_REUSE_MS = 1_000;

/**
 * Default {@link ServerMetricsOptions.readTimeoutMs}: as long as `/readyz` gives its read, and
 * well within Prometheus' default scrape timeout (10 s).
 */
export const DEFAULT_SCRAPE_READ_TIMEOUT_MS = 2_000;

/**
 * `reading`, or a rejection once `ms` pass without its answer. A scrape must answer whatever the
 * database does: a read handed a pool connection gone silent (a failover that moved the
 * database's address, a NAT that forgot the flow) waits out the store's 60 s wire timeout, and
 * Prometheus, giving up after 10 s, would lose every series, the ones showing the outage
 * included (review r53c). The read goes on; {@link sharedRead} lets later scrapes wait on it
 * (each for its own `ms`) rather than start another.
 */
async function answeredWithin<T>(reading: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the database did not answer within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([reading, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * `read` shared by the scrapes that want it: one in flight at a time, its answer reused for
 * `reuseMs` after it came (a failure is not: the next scrape reads again). `/metrics` needs no
 * key (DESIGN §6) and its depth read counts every queued task on the store's pool: 30 clients
 * looping on it took a submit's p50 from 36 ms to 2.6 s beside 200 000 queued tasks, and made
 * one fail `unavailable` (review r36d). Shared, a scrape storm costs one read a second.
 */
export function sharedRead<T>(
  read: () => Promise<T>,
  reuseMs: number,
  now: () => number = () => performance.now(),
): () => Promise<T> {
  let inFlight: Promise<T> | undefined;
  let last: { value: T; at: number } | undefined;
  return () => {
    if (last !== undefined && now() - last.at < reuseMs) return Promise.resolve(last.value);
    inFlight ??= read().then(
      (value) => {
        last = { value, at: now() };
        inFlight = undefined;
        return value;
      },
      (error: unknown) => {
        inFlight = undefined;
        throw error;
      },
    );
    return inFlight;
  };
}

/** One completion delivery try as the sender reports it (see {@link ServerMetrics.recordDelivery}). */
export interface DeliveryObservation {
  /**
   * `delivered`, `retry`, `gone`, `exhausted`, `stale` (the lease was lost) or `unreported` (the
   * report failed); anything else is counted as `other`.
   */
  outcome: string;
  /** The destination alias: operator configuration, so a bounded label. */
  destination: string;
  /** From the POST's start to its outcome. */
  durationMs: number;
  /**
   * False for a try that ended before any POST (the callbacks `DeliveryRecord.posted`): it is
   * counted, but its duration times no delivery and is not observed. Absent: a POST went out.
   */
  posted?: boolean;
}

/** The server's metrics and the hooks that feed them. */
export interface ServerMetrics {
  /** The private registry every metric is in. */
  readonly registry: Registry;
  /** The `Content-Type` of {@link render}'s text (Prometheus text format 0.0.4). */
  readonly contentType: string;
  /**
   * Renders every metric, reading the queue depths and the due backlog first: a failed read is
   * counted in the scrape it failed in.
   */
  render(): Promise<string>;
  /** Observes one answered HTTP request (pass as the HTTP app's `onResponse`). */
  observeHttp(info: HttpResponseInfo): void;
  /** Counts one recovery pass's outcomes (pass as the maintenance loop's `onProgress`). */
  recordRecovery(progress: RecoveryProgress): void;
  /** Counts and times one completion delivery try (pass from the sender's delivery hook). */
  recordDelivery(observation: DeliveryObservation): void;
  /** Counts one retention transaction's removals (pass as the retention loop's `onProgress`). */
  recordRetention(progress: RetentionProgress): void;
  /** Counts one completed retention round (pass as the retention loop's `onRound`). */
  recordRetentionRound(): void;
  /**
   * The service with `acquire`/`acquireBatch` timed and counted and `settle`/`settleBatch`
   * counted; every other method is the service's own.
   */
  instrumentService(service: TaskService): TaskService;
}

/** Methods of the HTTP API, and HEAD/OPTIONS; any other is labelled `other`. */
const METHODS: ReadonlySet<string> = new Set([
  'GET',
  'HEAD',
  'POST',
  'PUT',
  'PATCH',
  'DELETE',
  'OPTIONS',
]);

const TASK_STATES: ReadonlySet<string> = new Set(TaskStateSchema.options);

/** The `outcome` label values of completion deliveries (a bounded set). */
const DELIVERY_OUTCOMES: ReadonlySet<string> = new Set([
  'delivered',
  'retry',
  'gone',
  'exhausted',
  'stale',
  'unreported',
]);

/**
 * The due backlog is counted up to this many rows per scrape: enough to tell "a few" from
 * "a receiver outage", and a scrape never counts an unbounded table.
 */
export const DUE_BACKLOG_CAP = 10_000;

// Seconds. A delivery is one POST bounded by its destination's total deadline (≤ 60 s).
const DELIVERY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

// Seconds. Short requests resolve in milliseconds; long polls park up to the configured wait
// (20 s by default, clamped by the server), so the top buckets reach past it.
const HTTP_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60];
const ACQUIRE_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30];

/** A call's result: its value, or what it threw (not necessarily a ContractError). */
type Outcome<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** `2xx`, `4xx`, … from a status code. */
export function statusClass(status: number): string {
  return Number.isInteger(status) && status >= 100 && status <= 599
    ? `${Math.floor(status / 100)}xx`
    : 'other';
}

/** The stable code of a rejection; anything but a ContractError reaches clients as `unavailable`. */
function codeOf(error: unknown): ErrorCode {
  return error instanceof ContractError && isErrorCode(error.code) ? error.code : 'unavailable';
}

/**
 * Bounds the queue label: keeps the `maxQueues` queues with the most tasks (ties by name), each
 * with both states (0 when absent), and sums the rest — and rows the source already folded
 * (`queue: null`) — per state under {@link OTHER_QUEUE}, which appears only when something folds.
 * A queue that is itself named {@link OTHER_QUEUE} (a valid name) is always summed there: given
 * a series of its own, it would share the fold's label set, and one would overwrite the other.
 */
export function foldQueueDepths(
  rows: readonly QueueDepth[],
  maxQueues: number,
): { queue: string; state: 'queued' | 'active'; count: number }[] {
  const byQueue = new Map<string, { queued: number; active: number }>();
  const other = { queued: 0, active: 0 };
  let folded = false;
  for (const row of rows) {
    if (row.state !== 'queued' && row.state !== 'active') continue;
    if (row.queue === null || row.queue === OTHER_QUEUE) {
      other[row.state] += row.count;
      folded = true;
      continue;
    }
    const entry = byQueue.get(row.queue) ?? { queued: 0, active: 0 };
    entry[row.state] += row.count;
    byQueue.set(row.queue, entry);
  }
  const ranked = [...byQueue].sort(
    ([a, x], [b, y]) => y.queued + y.active - (x.queued + x.active) || (a < b ? -1 : a > b ? 1 : 0),
  );
  const out: { queue: string; state: 'queued' | 'active'; count: number }[] = [];
  ranked.forEach(([queue, counts], index) => {
    if (index < maxQueues) {
      out.push({ queue, state: 'queued', count: counts.queued });
      out.push({ queue, state: 'active', count: counts.active });
    } else {
      other.queued += counts.queued;
      other.active += counts.active;
      folded = true;
    }
  });
  if (folded) {
    out.push({ queue: OTHER_QUEUE, state: 'queued', count: other.queued });
    out.push({ queue: OTHER_QUEUE, state: 'active', count: other.active });
  }
  return out;
}

/**
 * Creates the server's metrics in a private registry.
 *
 * @example
 * ```ts
 * const metrics = createServerMetrics({ queueDepths: (limit) => store.queueDepths(limit) });
 * const service = metrics.instrumentService(createTaskService({ store }));
 * const app = createHttpApp({ service, auth, metrics, onResponse: metrics.observeHttp });
 * ```
 */
export function createServerMetrics(options: ServerMetricsOptions = {}): ServerMetrics {
  const maxQueues = options.maxQueues ?? DEFAULT_MAX_QUEUES;
  if (!Number.isSafeInteger(maxQueues) || maxQueues < 1) {
    throw new RangeError('maxQueues must be a positive integer');
  }
  const registry = new Registry();
  const registers = [registry];
  if (options.defaultMetrics ?? true) collectDefaultMetrics({ register: registry });

  const httpDuration = new Histogram({
    name: 'ledgence_http_request_duration_seconds',
    help: 'HTTP request duration by route pattern, method and status class (long polls included).',
    labelNames: ['route', 'method', 'status_class'] as const,
    buckets: HTTP_BUCKETS,
    registers,
  });
  const acquireOutcomes = new Counter({
    name: 'ledgence_acquire_outcomes_total',
    help: 'Polls answered, per slot: disposition (assigned, empty, ownership_lost, rejected) and error code.',
    labelNames: ['disposition', 'code'] as const,
    registers,
  });
  const acquireWait = new Histogram({
    name: 'ledgence_acquire_wait_seconds',
    help: 'Time an acquire or acquire batch took, parked long-poll wait included, by its best outcome (left: its client left first).',
    labelNames: ['outcome', 'long_poll'] as const,
    buckets: ACQUIRE_BUCKETS,
    registers,
  });
  const settleOutcomes = new Counter({
    name: 'ledgence_settle_outcomes_total',
    help: 'Settlements: accepted, replayed (already accepted) or rejected (by code), with the resulting task state.',
    labelNames: ['outcome', 'code', 'task_state'] as const,
    registers,
  });
  const leaseExpiries = new Counter({
    name: 'ledgence_lease_expiries_total',
    help: 'Attempts whose lease expired (recovered as lost), by what became of their task.',
    labelNames: ['outcome'] as const,
    registers,
  });
  const leaseFinalized = new Counter({
    name: 'ledgence_lease_cleanup_finalized_total',
    help: 'Settled attempts whose cleanup was never confirmed, given their recorded outcome at authority end.',
    registers,
  });
  // Present from the first scrape, so rates start at zero rather than at the first event.
  for (const outcome of ['requeued', 'failed', 'cancelled']) leaseExpiries.inc({ outcome }, 0);
  const depthErrors = new Counter({
    name: 'ledgence_queue_depth_errors_total',
    help: 'Scrapes whose queue depth read failed (the gauge is then empty for that scrape).',
    registers,
  });

  const deliveries = new Counter({
    name: 'ledgence_callback_deliveries_total',
    help: 'Completion delivery tries by destination alias and outcome: delivered, retry (due again), gone (410), exhausted, stale (lease lost), unreported (report failed).',
    labelNames: ['destination', 'outcome'] as const,
    registers,
  });
  const deliveryDuration = new Histogram({
    name: 'ledgence_callback_delivery_duration_seconds',
    help: 'Duration of one completion delivery POST, by outcome.',
    labelNames: ['outcome'] as const,
    buckets: DELIVERY_BUCKETS,
    registers,
  });
  const retentionRemoved = new Counter({
    name: 'ledgence_retention_removed_total',
    help: 'Records removed by retention: tasks, attempts, history, subscriptions, sessions.',
    labelNames: ['kind'] as const,
    registers,
  });
  const retentionTransactions = new Counter({
    name: 'ledgence_retention_transactions_total',
    help: 'Bounded retention transactions committed.',
    registers,
  });
  // Rounds apart from transactions: a round with nothing due commits none, yet shows the loop runs.
  const retentionRounds = new Counter({
    name: 'ledgence_retention_rounds_total',
    help: 'Retention rounds completed (a round where nothing is due commits no transaction).',
    registers,
  });
  const backlogErrors = new Counter({
    name: 'ledgence_callback_backlog_errors_total',
    help: 'Scrapes whose due-backlog read failed (the gauge is then empty for that scrape).',
    registers,
  });

  const reuseMs = options.readReuseMs ?? DEFAULT_READ_REUSE_MS;
  const readTimeoutMs = options.readTimeoutMs ?? DEFAULT_SCRAPE_READ_TIMEOUT_MS;
  /** A scrape's read: shared between scrapes, and bounded for each. */
  const scrapeRead = <T>(read: () => Promise<T>): (() => Promise<T>) => {
    const shared = sharedRead(read, reuseMs);
    return () => answeredWithin(shared(), readTimeoutMs);
  };
  const dueBacklog = options.dueBacklog;
  const readBacklog =
    dueBacklog === undefined ? undefined : scrapeRead(() => dueBacklog(DUE_BACKLOG_CAP));
  const backlogGauge =
    readBacklog === undefined
      ? undefined
      : new Gauge({
          name: 'ledgence_callback_due_backlog',
          help: `Completion deliveries due now and not leased (counted up to ${DUE_BACKLOG_CAP}).`,
          registers,
        });

  const queueDepths = options.queueDepths;
  const readDepths =
    queueDepths === undefined ? undefined : scrapeRead(() => queueDepths(maxQueues));
  // Read on scrape: a count kept in memory would drift from the database across replicas.
  const depthGauge =
    readDepths === undefined
      ? undefined
      : new Gauge({
          name: 'ledgence_queue_depth',
          help: `Non-terminal tasks by queue and state (the ${maxQueues} deepest queues; the rest summed as ${OTHER_QUEUE}).`,
          labelNames: ['queue', 'state'] as const,
          registers,
        });

  /**
   * The scrape's database reads, done before the registry renders: prom-client renders every
   * metric at once, so an error counter rendered beside a gauge whose own collect() failed would
   * show that failure a scrape late. Each gauge is reset only after its read, with no await
   * before its sets: two scrapes in flight share these gauges.
   */
  async function readForScrape(): Promise<void> {
    await Promise.all([
      readBacklog?.().then(
        (due) => {
          backlogGauge?.set(due);
        },
        (error: unknown) => {
          // A label-less gauge always renders; NaN says "unknown" where 0 would claim "none due".
          backlogGauge?.set(Number.NaN);
          backlogErrors.inc();
          options.logger?.warn({ err: error }, 'callback backlog read failed');
        },
      ),
      readDepths?.().then(
        (rows) => {
          depthGauge?.reset();
          for (const { queue, state, count } of foldQueueDepths(rows, maxQueues)) {
            depthGauge?.set({ queue, state }, count);
          }
        },
        (error: unknown) => {
          // The other metrics still render; a stale depth would mislead, so none is shown.
          depthGauge?.reset();
          depthErrors.inc();
          options.logger?.warn({ err: error }, 'queue depth read failed');
        },
      ),
    ]);
  }

  /**
   * Whether a poll's reply reaches its client: one whose client left was answered to no one (the
   * service hands back what it claimed, and a slot's later polls in a batch are never run), so
   * `ledgence_acquire_outcomes_total` ("polls answered") does not count it — not as `empty`, nor
   * as the `unavailable` its unrun polls carry (review r53c) — and its wait is timed as `left`.
   */
  function answeredTo(wait: WaitOptions | undefined): boolean {
    return wait?.signal?.aborted !== true;
  }

  function countAcquire(result: Outcome<{ disposition: string }>): string {
    const disposition = result.ok ? result.value.disposition : 'rejected';
    acquireOutcomes.inc({ disposition, code: result.ok ? NONE : codeOf(result.error) });
    return disposition;
  }

  /** The most telling outcome of a batch, for its wait: work beats loss beats empty. */
  function bestOutcome(dispositions: readonly string[]): string {
    for (const candidate of ['assigned', 'ownership_lost', 'empty']) {
      if (dispositions.includes(candidate)) return candidate;
    }
    return 'rejected';
  }

  function countSettle(result: Outcome<{ already_accepted: boolean; task_state: string }>) {
    if (!result.ok) {
      settleOutcomes.inc({ outcome: 'rejected', code: codeOf(result.error), task_state: NONE });
      return;
    }
    const { already_accepted, task_state } = result.value;
    settleOutcomes.inc({
      outcome: already_accepted ? 'replayed' : 'accepted',
      code: NONE,
      task_state: TASK_STATES.has(task_state) ? task_state : NONE,
    });
  }

  return {
    registry,
    contentType: registry.contentType,
    async render() {
      await readForScrape();
      return registry.metrics();
    },

    observeHttp(info) {
      httpDuration.observe(
        {
          route: info.route ?? UNMATCHED_ROUTE,
          method: METHODS.has(info.method) ? info.method : 'other',
          status_class: statusClass(info.status),
        },
        Math.max(0, info.durationMs) / 1000,
      );
    },

    recordRecovery(progress) {
      if (progress.requeued > 0) leaseExpiries.inc({ outcome: 'requeued' }, progress.requeued);
      if (progress.failed > 0) leaseExpiries.inc({ outcome: 'failed' }, progress.failed);
      if (progress.cancelled > 0) leaseExpiries.inc({ outcome: 'cancelled' }, progress.cancelled);
      if (progress.finalized > 0) leaseFinalized.inc(progress.finalized);
    },

    recordDelivery({ outcome, destination, durationMs, posted }) {
      const label = DELIVERY_OUTCOMES.has(outcome) ? outcome : 'other';
      deliveries.inc({ destination, outcome: label });
      if (posted === false) return;
      deliveryDuration.observe({ outcome: label }, Math.max(0, durationMs) / 1000);
    },

    recordRetentionRound() {
      retentionRounds.inc();
    },

    recordRetention(progress) {
      retentionTransactions.inc();
      const removed = {
        tasks: progress.tasks_removed,
        attempts: progress.attempts_removed,
        history: progress.history_removed,
        subscriptions: progress.subscriptions_removed,
        sessions: progress.sessions_removed,
      };
      for (const [kind, count] of Object.entries(removed)) {
        if (count > 0) retentionRemoved.inc({ kind }, count);
      }
    },

    instrumentService(service) {
      // createTaskService returns a plain object: its methods are own properties and close
      // over their state (no `this`), so spreading keeps every method the service has.
      return {
        ...service,
        async acquire(command, wait) {
          const longPoll = String((wait?.waitMs ?? 0) > 0);
          const stop = acquireWait.startTimer({ long_poll: longPoll });
          try {
            const reply = await service.acquire(command, wait);
            stop({ outcome: answeredTo(wait) ? countAcquire({ ok: true, value: reply }) : LEFT });
            return reply;
          } catch (error) {
            stop({ outcome: answeredTo(wait) ? countAcquire({ ok: false, error }) : LEFT });
            throw error;
          }
        },
        async acquireBatch(commands, wait) {
          const longPoll = String((wait?.waitMs ?? 0) > 0);
          const stop = acquireWait.startTimer({ long_poll: longPoll });
          try {
            const results = await service.acquireBatch(commands, wait);
            stop({ outcome: answeredTo(wait) ? bestOutcome(results.map(countAcquire)) : LEFT });
            return results;
          } catch (error) {
            if (answeredTo(wait)) {
              // The whole batch was refused: each poll in it was answered with the error.
              acquireOutcomes.inc(
                { disposition: 'rejected', code: codeOf(error) },
                commands.length,
              );
            }
            stop({ outcome: answeredTo(wait) ? 'rejected' : LEFT });
            throw error;
          }
        },
        async settle(command) {
          try {
            const reply = await service.settle(command);
            countSettle({ ok: true, value: reply });
            return reply;
          } catch (error) {
            countSettle({ ok: false, error });
            throw error;
          }
        },
        async settleBatch(commands) {
          try {
            const results = await service.settleBatch(commands);
            for (const result of results) countSettle(result);
            return results;
          } catch (error) {
            const labels = { outcome: 'rejected', code: codeOf(error), task_state: NONE };
            settleOutcomes.inc(labels, commands.length);
            throw error;
          }
        },
      };
    },
  };
}
