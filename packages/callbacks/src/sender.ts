/**
 * The completion sender (DESIGN §8): the loop that leases due deliveries from
 * a `CompletionStore`, POSTs each one's event with {@link deliverEvent} and
 * reports the outcome back, one store call per lease batch and one per set of
 * tries that end together (usually one).
 *
 * No store call spans network I/O: leasing is one transaction that ends
 * before the first byte is sent, and each report is its own transaction after
 * the try. A crash between the two is what the lease is for — the row becomes
 * leasable again when the lease runs out, and the try counts (the core counts
 * tries at lease time), so deliveries are at least once and never endless.
 * Stopping with a signal aborts the tries still in flight when it fires: each
 * is reported as a failed try, never as delivered, so the event is posted
 * again later — unless it was the generation's last try, which ends
 * `exhausted` as after a crash (the core counts it all the same).
 */
import { setMaxListeners } from 'node:events';
import {
  buildCompletionEvent,
  COMPLETION_LEASE_MS,
  COMPLETION_MAX_RETRY_DELAY_MS,
  COMPLETION_RETRY_BASE_MS,
  fitText,
  MAX_COMPLETION_BATCH,
  MESSAGE_MAX_BYTES,
} from '@ledgence/contracts';
import {
  type CompletionLease,
  type CompletionStore,
  type DeliveryNext,
  type DeliveryReport,
  type Failpoints,
  failureRun,
  NO_FAILPOINTS,
} from '@ledgence/core';
import {
  isExhausted,
  type NextDeliveryState,
  nextDeliveryDelayMs,
  nextDeliveryState,
} from './backoff.js';
import {
  type DeliveryOutcome,
  deliverEvent,
  type EncodedEvent,
  encodeCompletionEvent,
  type RetryReason,
} from './deliver.js';
import type { Destinations } from './destinations.js';

/**
 * How long the sender waits before looking again when a lease call found
 * fewer deliveries than it asked for. Nothing wakes the sender when a task
 * becomes terminal or a retry falls due (both are rows changing in the store),
 * so it polls: 250 ms keeps a callback within about a quarter second of the
 * task's end, and an idle poll is one small indexed query — four a second per
 * replica is noise for PostgreSQL.
 */
export const DEFAULT_IDLE_INTERVAL_MS = 250;

/**
 * Time a try's report needs after its deadline, added to the longest
 * destination timeout when choosing the lease (see
 * {@link CompletionSenderOptions.leaseMs}).
 */
export const REPORT_MARGIN_MS = 5_000;

/**
 * The default of {@link CompletionSenderOptions.unconfiguredGraceMs}, in lease periods. A
 * replica that has an alias takes its due deliveries within one poll while idle, and within
 * about one lease period while busy (its window refills as tries end, each bounded by a
 * destination timeout, which the lease exceeds); four periods leave room for that and for a
 * replica restarting during a rolling change, while a delivery to an alias no replica has still
 * fails each try after a wait that is small beside the retry schedule (up to an hour a try).
 */
export const UNCONFIGURED_GRACE_LEASES = 4;

/** The first pause before a failed report is sent again; it doubles up to REPORT_RETRY_MAX_MS. */
const REPORT_RETRY_MIN_MS = 100;

/** The longest pause between tries of one report: a recovered database records it within it. */
const REPORT_RETRY_MAX_MS = 1_000;

/** The longest pause after consecutive store failures: a recovered database is used within it. */
const STORE_RETRY_MAX_MS = 5_000;

/** Structured fields of a log line. */
export type LogFields = Record<string, unknown>;

/**
 * The logger the sender writes to: fields first, message second, which is
 * pino's order (the server passes its pino logger as it is); `console` fits
 * too. Lines carry ids, the destination alias, status and error text — never
 * a URL or a secret.
 */
export interface SenderLogger {
  /** Routine progress: started, a try recorded (delivered or due again), the store back. */
  info(fields: LogFields, message: string): void;
  /** A delivery ended without success (410, exhausted, stale report), or a report is retried. */
  warn(fields: LogFields, message: string): void;
  /** A try left unrecorded (its lease decides), leasing failing, or an unexpected failure. */
  error(fields: LogFields, message: string): void;
}

/**
 * What became of one try, a fixed set fit for a metrics label: the store
 * recorded it as `delivered`, `retry` (due again after a backoff), `gone`
 * (the receiver answered 410; the delivery is exhausted) or `exhausted` (the
 * generation's last try failed, or the event cannot be built); or the store
 * refused the report as `stale` (the lease ran out and the row moved on; a copy
 * answered stale after an earlier copy's answer was lost keeps the try's own
 * outcome, which that copy recorded), or the report failed
 * until its lease ran out or the sender stopped and the try is `unreported`
 * (the row is tried again when its lease runs out).
 */
export type DeliveryRecordOutcome =
  | 'delivered'
  | 'retry'
  | 'gone'
  | 'exhausted'
  | 'stale'
  | 'unreported';

/**
 * Why a try failed: a {@link RetryReason} from the try itself, or a reason
 * the sender found before sending — the alias is `unconfigured` (the
 * destinations changed since the task subscribed), the event is
 * `invalid_event` (it cannot be encoded; no retry can fix that), or the
 * destination was `unusable` (e.g. a non-http URL).
 */
export type DeliveryFailureReason = RetryReason | 'unconfigured' | 'invalid_event' | 'unusable';

/** One try as the sender saw it: what `onDelivery` receives and `runOnce` returns. */
export interface DeliveryRecord {
  /** What became of the try. */
  readonly outcome: DeliveryRecordOutcome;
  /** The destination alias (never its URL). */
  readonly destination: string;
  /**
   * The task's tenant, namespace and id: what an operator needs to look the subscription up and
   * redeliver it (the routes are scoped), from the log line of an exhausted delivery.
   */
  readonly tenantId: string;
  /** The task's namespace. */
  readonly namespace: string;
  /** The task the event completes. */
  readonly taskId: string;
  /** The subscription the try belongs to. */
  readonly subscriptionId: string;
  /** The event id, also the webhook id. */
  readonly eventId: string;
  /** The subscription's generation. */
  readonly generation: number;
  /** The try's 1-based ordinal within the generation. */
  readonly attempt: number;
  /** How long the try took, leasing and reporting excluded, in ms (process clock). */
  readonly durationMs: number;
  /**
   * Whether a POST went out (or was attempted): false for a try that failed before sending (an
   * unconfigured or unusable destination, an event that cannot be built), whose duration times
   * no delivery.
   */
  readonly posted: boolean;
  /** The receiver's status, when it answered. */
  readonly status?: number;
  /** Why the try failed, when it did. */
  readonly reason?: DeliveryFailureReason;
}

/** The result of {@link CompletionSender.runOnce}. */
export interface SenderPassResult {
  /** How many deliveries the pass leased. */
  readonly leased: number;
  /** One record per leased delivery, in lease order. */
  readonly records: readonly DeliveryRecord[];
}

/** Options of {@link createCompletionSender}. */
export interface CompletionSenderOptions {
  /** Where deliveries are leased and their outcomes recorded. */
  store: Pick<CompletionStore, 'leaseDeliveries' | 'reportDeliveries'>;
  /**
   * The operator's destinations. A delivery to another alias is left to the replicas that have
   * it for `unconfiguredGraceMs`; after that this sender takes it and the try fails as
   * `unconfigured`.
   */
  destinations: Destinations;
  /**
   * The first backoff cap, `LEDGENCE_COMPLETION_RETRY_BASE_MS`
   * (1..COMPLETION_MAX_RETRY_DELAY_MS); COMPLETION_RETRY_BASE_MS by default.
   */
  retryBaseMs?: number;
  /**
   * Deliveries leased per store call and in flight at once
   * (1..MAX_COMPLETION_BATCH); MAX_COMPLETION_BATCH by default.
   */
  batchSize?: number;
  /**
   * How long a leased delivery is held, COMPLETION_LEASE_MS by default —
   * raised to the longest destination timeout plus REPORT_MARGIN_MS, so a
   * try always reports within its lease. (A shorter lease would let a slow
   * but successful receiver's every report go stale while the row is leased
   * and posted again, until it exhausts.)
   */
  leaseMs?: number;
  /**
   * How long (store time) a delivery to an alias missing from `destinations` must have been due
   * before this sender leases it, and fails the try as `unconfigured`; by default
   * UNCONFIGURED_GRACE_LEASES lease periods (0..). While the destinations differ between
   * replicas (a rolling configuration change), a replica without an alias leaves its deliveries
   * to the replicas that have it instead of spending their tries; an alias that no replica has
   * (removed from the configuration) still has its deliveries tried, each try late by this
   * wait, until they are exhausted with `destination not configured`.
   */
  unconfiguredGraceMs?: number;
  /** The pause when nothing more was due; DEFAULT_IDLE_INTERVAL_MS by default. */
  idleIntervalMs?: number;
  /** Where the sender logs; nowhere by default. */
  logger?: SenderLogger;
  /** Called once per try (metrics); a throwing hook is logged and ignored. */
  onDelivery?: (record: DeliveryRecord) => void;
  /**
   * TEST ONLY: crash points of a try (`delivery.before_send`, `delivery.after_send`,
   * `delivery.after_report`; see `FAILPOINTS` in `@ledgence/core`). Default: none armed.
   */
  failpoints?: Failpoints;
}

/** Options of {@link CompletionSender.stop}. */
export interface CompletionSenderStopOptions {
  /**
   * The end of the wait (e.g. the shutdown budget): when it aborts, every try
   * still in flight is aborted and reported as a failed try (`aborted`), due
   * again on the usual schedule — the receiver may or may not have the event,
   * and a redelivery under the same `webhook-id` is what at-least-once allows.
   * As with a crash, the try counts: aborting a generation's last try
   * exhausts it. A report that fails leaves the row to its lease running
   * out. Without a signal, stop() waits up to each try's destination timeout.
   */
  signal?: AbortSignal;
}

/** A completion sender. */
export interface CompletionSender {
  /**
   * Starts the loop: lease, deliver, report, again at once while leases come
   * back full and after `idleIntervalMs` otherwise; a failing store is retried
   * with a growing pause, its first failure logged, then one a minute (`failureRun`). Up to `batchSize` deliveries are in
   * flight, so a hanging receiver holds one slot per try until the try's deadline, not the loop:
   * the slots left free are leased at least every `idleIntervalMs`. Calling it
   * again, or after {@link stop}, does nothing.
   */
  start(): void;
  /**
   * Stops leasing at once and resolves once every in-flight try has finished
   * (each is bounded by its destination's timeout, or ended by
   * `options.signal`) and been reported; the drain of a delivered 2xx's body
   * still going on then is ended, so no try's socket or timer outlives it.
   * Safe to call more than once; every call resolves together, and any
   * call's signal aborts the tries.
   */
  stop(options?: CompletionSenderStopOptions): Promise<void>;
  /**
   * One pass outside the loop: leases up to `batchSize` deliveries, tries
   * them all at once and resolves when every try is reported. Rejects only
   * if leasing fails; after {@link stop} it leases nothing.
   */
  runOnce(): Promise<SenderPassResult>;
}

/**
 * The completion sender over a store and the operator's destinations. Each
 * try builds the event from the lease's immutable task facts (the same bytes
 * on every try and generation), POSTs it with {@link deliverEvent} and
 * reports the state {@link nextDeliveryState} decides. Nothing it meets —
 * an unknown alias, a receiver misbehaving, a store failing — escapes as an
 * exception; each is a recorded outcome or a log line. Throws a `RangeError`
 * for options out of range.
 *
 * @example
 * const sender = createCompletionSender({ store, destinations, logger });
 * sender.start();
 * process.once('SIGTERM', () => void sender.stop());
 */
export function createCompletionSender(options: CompletionSenderOptions): CompletionSender {
  const { store, destinations } = options;
  const baseMs = integerOption('retryBaseMs', options.retryBaseMs, COMPLETION_RETRY_BASE_MS, {
    max: COMPLETION_MAX_RETRY_DELAY_MS,
  });
  const batchSize = integerOption('batchSize', options.batchSize, MAX_COMPLETION_BATCH, {
    max: MAX_COMPLETION_BATCH,
  });
  const idleIntervalMs = integerOption(
    'idleIntervalMs',
    options.idleIntervalMs,
    DEFAULT_IDLE_INTERVAL_MS,
  );
  const leaseMs = Math.max(
    integerOption('leaseMs', options.leaseMs, COMPLETION_LEASE_MS),
    longestTimeoutMs(destinations) + REPORT_MARGIN_MS,
  );
  const unconfiguredGraceMs = integerOption(
    'unconfiguredGraceMs',
    options.unconfiguredGraceMs,
    Math.min(UNCONFIGURED_GRACE_LEASES * leaseMs, Number.MAX_SAFE_INTEGER),
    { min: 0 },
  );
  // Aliases are fixed for the sender's life (the server reads them at start).
  const only = {
    destinations: [...destinations.keys()],
    otherDestinationsAfterMs: unconfiguredGraceMs,
  };
  // Refill once half the window is free: under load that leases in batches
  // rather than one row per finished try, and a hanging try still holds one slot.
  const refillAt = Math.ceil(batchSize / 2);
  const logger = safeLogger(options.logger);
  const failpoints = options.failpoints ?? NO_FAILPOINTS;

  const inFlight = new Set<Promise<DeliveryRecord>>();
  const leasing = new Set<Promise<unknown>>();
  // Aborted by a stop() signal (every try, in flight or still to start, ends as `aborted`), and
  // once stop() has every try reported (only 2xx drains are left to end then).
  const tries = new AbortController();
  // Every try in flight listens here and stops listening when it ends: a full window (and any
  // overlapping runOnce) is no leak, so Node's warning past 10 listeners would only mislead.
  setMaxListeners(0, tries.signal);
  const abortTries = (): void => tries.abort();
  let loop: Promise<void> | undefined;
  let stopping = false;
  let stopped: Promise<void> | undefined;
  let interrupt: (() => void) | undefined;
  // Reports waiting to be tried again; stop() ends their waits (and their retries).
  const reportWaits = new Set<() => void>();

  const recordReport = reportsTogether(store, batchSize);

  /** Waits `ms`, or less if {@link stop} is called meanwhile. */
  function pause(ms: number, waits?: Set<() => void>): Promise<void> {
    if (stopping) return Promise.resolve();
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        if (waits === undefined) interrupt = undefined;
        else waits.delete(done);
        resolve();
      };
      // Unref'd like the server's other loops: the sender alone never keeps a process alive.
      const timer = setTimeout(done, ms).unref();
      if (waits === undefined) interrupt = done;
      else waits.add(done);
    });
  }

  /** Starts one try; the promise never rejects and leaves the window when it settles. */
  function dispatch(lease: CompletionLease, clock: () => number): Promise<DeliveryRecord> {
    const running = tryDelivery(lease, clock).catch((error: unknown): DeliveryRecord => {
      // Unreachable by design (every step above catches its own failures); kept so
      // that a bug costs one try, recovered when its lease runs out, never the loop.
      logger.error(
        { err: error, event_id: lease.event_id },
        'a completion try failed unexpectedly',
      );
      return { ...identityOf(lease), outcome: 'unreported', durationMs: 0, posted: false };
    });
    inFlight.add(running);
    void running.finally(() => inFlight.delete(running));
    return running;
  }

  async function tryDelivery(lease: CompletionLease, clock: () => number): Promise<DeliveryRecord> {
    const started = performance.now();
    const decided = await decide(lease, clock);
    const durationMs = Math.round(performance.now() - started);
    const report: DeliveryReport = {
      scope: lease.scope,
      subscription_id: lease.subscription_id,
      generation: lease.generation,
      attempt: lease.attempt,
      next: decided.next,
    };
    if (decided.status !== undefined) report.status_code = decided.status;
    if (decided.error !== undefined) report.error = fitText(decided.error, MESSAGE_MAX_BYTES);

    let outcome: DeliveryRecordOutcome = decided.outcome;
    let reportError: unknown;
    try {
      // Between the receiver's answer and the report: the receiver has the event, the store
      // does not know yet, so the lease running out must lead to a redelivery of the same id.
      if (failpoints.enabled) failpoints.hit('delivery.after_send');
      if ((await reportWithinLease(report, lease, clock)) === 'stale') outcome = 'stale';
      if (failpoints.enabled) failpoints.hit('delivery.after_report');
    } catch (error) {
      outcome = 'unreported';
      reportError = error;
    }
    const record: DeliveryRecord = {
      ...identityOf(lease),
      outcome,
      durationMs,
      posted: decided.posted,
      ...(decided.status === undefined ? {} : { status: decided.status }),
      ...(decided.reason === undefined ? {} : { reason: decided.reason }),
    };
    logRecord(record, report.error, reportError);
    try {
      options.onDelivery?.(record);
    } catch (error) {
      logger.warn({ err: error, event_id: record.eventId }, 'the onDelivery hook threw');
    }
    return record;
  }

  /**
   * Records a try's outcome, trying again while the lease lasts (by store time) when the store
   * fails: the row is still this sender's, and a report given up would leave it to its lease
   * running out, so an event the receiver acknowledged would be posted again (DESIGN §8: 2xx =
   * delivered). The report is fenced by generation and try, so a second copy after a first
   * that committed unseen changes nothing (it answers stale). Such a copy is sent only while the
   * lease still holds the row (by the lease clock's reckoning of store time), which no one else
   * can have moved on meanwhile: its stale answer
   * means the earlier copy was recorded (`recorded_unseen`), not that the lease ran out. Not
   * retried once stopping: a shutdown leaves the row to its lease, as a crash does. Rejects with
   * the last failure.
   */
  async function reportWithinLease(
    report: DeliveryReport,
    lease: CompletionLease,
    clock: () => number,
  ): Promise<'recorded' | 'recorded_unseen' | 'stale'> {
    let delayMs = REPORT_RETRY_MIN_MS;
    for (let copy = 1; ; copy += 1) {
      try {
        if (await recordReport(report)) return 'recorded';
        return copy === 1 ? 'stale' : 'recorded_unseen';
      } catch (error) {
        if (stopping || lease.lease_expires_at - clock() <= delayMs + REPORT_RETRY_MIN_MS) {
          throw error;
        }
        logger.warn(
          { err: error, event_id: lease.event_id, retry_in_ms: delayMs },
          'recording a completion delivery failed; retrying within its lease',
        );
        await pause(delayMs, reportWaits);
        delayMs = Math.min(delayMs * 2, REPORT_RETRY_MAX_MS);
      }
    }
  }

  /** Makes the try and decides what the subscription becomes; never rejects. */
  async function decide(lease: CompletionLease, clock: () => number): Promise<Decision> {
    const destination = destinations.get(lease.destination);
    if (destination === undefined) {
      return failedBeforeSending(lease, 'unconfigured', 'destination not configured');
    }
    let event: EncodedEvent;
    try {
      event = encodeLeaseEvent(lease);
    } catch (error) {
      // Built from immutable facts only, so no later try could encode it: stop now.
      return {
        outcome: 'exhausted',
        next: { state: 'exhausted' },
        posted: false,
        reason: 'invalid_event',
        error: `the completion event cannot be built: ${messageOf(error)}`,
      };
    }
    let delivery: DeliveryOutcome;
    try {
      // Leased (the try already counts), nothing sent: a crash here must cost one try, no event.
      if (failpoints.enabled) failpoints.hit('delivery.before_send');
      delivery = await deliverEvent({ destination, event, signal: tries.signal, now: clock });
    } catch (error) {
      // deliverEvent rejects only for a destination it cannot use at all (its own
      // messages name no URL); retried, so fixing the configuration resumes delivery.
      return failedBeforeSending(lease, 'unusable', `destination unusable: ${messageOf(error)}`);
    }
    switch (delivery.kind) {
      case 'delivered':
        return {
          outcome: 'delivered',
          next: { state: 'delivered' },
          posted: true,
          status: delivery.status,
        };
      case 'gone':
        return {
          outcome: 'gone',
          next: { state: 'exhausted' },
          posted: true,
          status: delivery.status,
          error: 'the receiver answered 410 Gone',
        };
      case 'retry':
        return {
          ...failed(
            nextDeliveryState({
              outcome: delivery,
              attempt: lease.attempt,
              eventId: lease.event_id,
              baseMs,
            }),
          ),
          // A signal fired before the request (a stop's budget ran out): nothing was sent.
          posted: delivery.unsent !== true,
          reason: delivery.reason,
          error: delivery.error,
          ...(delivery.status === undefined ? {} : { status: delivery.status }),
        };
    }
  }

  function failedBeforeSending(
    lease: CompletionLease,
    reason: DeliveryFailureReason,
    error: string,
  ): Decision {
    // The same schedule as a failed POST, without a receiver's Retry-After.
    const next: NextDeliveryState = isExhausted(lease.attempt)
      ? { state: 'exhausted' }
      : {
          state: 'due',
          delayMs: nextDeliveryDelayMs({ attempt: lease.attempt, eventId: lease.event_id, baseMs }),
        };
    return { ...failed(next), posted: false, reason, error };
  }

  function logRecord(record: DeliveryRecord, error?: string, reportError?: unknown): void {
    const fields: LogFields = {
      tenant_id: record.tenantId,
      namespace: record.namespace,
      task_id: record.taskId,
      event_id: record.eventId,
      subscription_id: record.subscriptionId,
      destination: record.destination,
      generation: record.generation,
      attempt: record.attempt,
      outcome: record.outcome,
      duration_ms: record.durationMs,
    };
    if (record.status !== undefined) fields.status = record.status;
    if (record.reason !== undefined) fields.reason = record.reason;
    if (error !== undefined) fields.error = error;
    const [level, message] = LOG_LINES[record.outcome];
    if (reportError !== undefined) fields.err = reportError;
    logger[level](fields, message);
  }

  /** Waits until a try in flight ends, or `ms` has passed. Tries never reject. */
  async function tryEndOrPause(ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const paused = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms).unref();
    });
    try {
      await Promise.race([Promise.race(inFlight), paused]);
    } finally {
      clearTimeout(timer);
    }
  }

  async function run(): Promise<void> {
    const storeFailures = failureRun();
    let lastLeaseAt = Number.NEGATIVE_INFINITY;
    while (!stopping) {
      const free = batchSize - inFlight.size;
      // The window is not empty while fewer than refillAt slots are free.
      if (free === 0) {
        await Promise.race(inFlight);
        continue;
      }
      if (free < refillAt) {
        // Under load the loop leases in batches, once half the window is free; but tries that
        // hang (many to one receiver that stopped answering) may keep it from freeing for as
        // long as their deadline, and deliveries to other receivers wait behind them: the free
        // slots are leased an idle interval after the last lease all the same.
        const waitMs = lastLeaseAt + idleIntervalMs - performance.now();
        if (waitMs > 0) {
          await tryEndOrPause(waitMs);
          continue;
        }
      }
      lastLeaseAt = performance.now();
      let leases: CompletionLease[];
      let leasedAt: number;
      try {
        leases = await store.leaseDeliveries(free, leaseMs, only);
        leasedAt = performance.now();
        const ended = storeFailures.succeeded();
        if (ended > 0) {
          logger.info(
            { failures: ended },
            `leasing completion deliveries works again after ${ended} failed pass${ended === 1 ? '' : 'es'}`,
          );
        }
      } catch (error) {
        const { failures, log } = storeFailures.failed();
        const retryInMs = Math.min(idleIntervalMs * 2 ** (failures - 1), STORE_RETRY_MAX_MS);
        if (log) {
          logger.error(
            { err: error, failures, retry_in_ms: retryInMs },
            'leasing completion deliveries failed; retrying',
          );
        }
        await pause(retryInMs);
        continue;
      }
      // Leased rows are tried even if stop() came meanwhile: their leases are taken.
      for (const lease of leases) dispatch(lease, leaseClock(lease, leaseMs, leasedAt));
      if (leases.length < free) await pause(idleIntervalMs);
    }
  }

  return {
    start() {
      if (loop !== undefined || stopping) return;
      logger.info(
        { batch_size: batchSize, lease_ms: leaseMs, destinations: destinations.size },
        'completion sender started',
      );
      loop = run();
    },
    stop(stopOptions = {}) {
      const { signal } = stopOptions;
      signal?.addEventListener('abort', abortTries, { once: true });
      if (signal?.aborted) abortTries();
      stopped ??= (async () => {
        stopping = true;
        interrupt?.();
        for (const wake of [...reportWaits]) wake();
        await loop;
        // A runOnce may be between its lease and its tries: wait for both to drain.
        while (leasing.size + inFlight.size > 0) {
          await Promise.allSettled([...leasing, ...inFlight]);
        }
        // Every try is decided and reported, but a delivered 2xx may still be draining its body
        // (for keep-alive), holding a socket and a ref'd deadline timer for up to the
        // destination's timeout; the sender will send nothing more, so end those drains now.
        abortTries();
      })();
      if (signal !== undefined) {
        void stopped.then(() => signal.removeEventListener('abort', abortTries));
      }
      return stopped;
    },
    async runOnce() {
      if (stopping) return { leased: 0, records: [] };
      const call = store.leaseDeliveries(batchSize, leaseMs, only);
      leasing.add(call);
      let leases: CompletionLease[];
      try {
        leases = await call;
      } finally {
        leasing.delete(call);
      }
      const leasedAt = performance.now();
      const records = await Promise.all(
        leases.map((lease) => dispatch(lease, leaseClock(lease, leaseMs, leasedAt))),
      );
      return { leased: leases.length, records };
    },
  };
}

/** The level and message of each outcome's log line. */
const LOG_LINES: Readonly<Record<DeliveryRecordOutcome, [keyof SenderLogger, string]>> = {
  delivered: ['info', 'completion delivered'],
  retry: ['info', 'completion delivery failed; retrying later'],
  gone: ['warn', 'completion receiver answered 410 Gone; delivery exhausted'],
  exhausted: ['warn', 'completion delivery exhausted'],
  stale: ['warn', 'completion report was stale: the lease had run out'],
  unreported: [
    'error',
    'recording a completion delivery failed; it is tried again when its lease runs out',
  ],
};

/** What one try decided, before the store has a say. */
interface Decision {
  outcome: 'delivered' | 'retry' | 'gone' | 'exhausted';
  next: DeliveryNext;
  /** False when the try failed before any POST. */
  posted: boolean;
  status?: number;
  reason?: DeliveryFailureReason;
  error?: string;
}

/** The fields of a record that name the try. */
function identityOf(
  lease: CompletionLease,
): Pick<
  DeliveryRecord,
  | 'destination'
  | 'tenantId'
  | 'namespace'
  | 'taskId'
  | 'subscriptionId'
  | 'eventId'
  | 'generation'
  | 'attempt'
> {
  return {
    destination: lease.destination,
    tenantId: lease.scope.tenant_id,
    namespace: lease.scope.namespace,
    taskId: lease.task_id,
    subscriptionId: lease.subscription_id,
    eventId: lease.event_id,
    generation: lease.generation,
    attempt: lease.attempt,
  };
}

/** The decision of a failed try, from the backoff's next state. */
function failed(next: NextDeliveryState): Pick<Decision, 'outcome' | 'next'> {
  // A failed try's next state is `due` or `exhausted`, never `delivered`.
  return next.state === 'due'
    ? { outcome: 'retry', next: { state: 'due', delay_ms: next.delayMs } }
    : { outcome: 'exhausted', next: { state: 'exhausted' } };
}

/**
 * The exact event a lease posts: built from the terminal task's facts the
 * lease carries, which never change, so every try and every generation of a
 * subscription sends the same bytes under the same webhook id. Throws a
 * `ContractError` if the facts do not make a valid event.
 */
export function encodeLeaseEvent(lease: CompletionLease): EncodedEvent {
  return encodeCompletionEvent(
    buildCompletionEvent({
      scope: lease.scope,
      queue: lease.queue,
      task_id: lease.task_id,
      run_id: lease.run_id,
      state: lease.state,
      event_id: lease.event_id,
      time: lease.terminal_at,
    }),
  );
}

/**
 * Store time for a leased try (DESIGN §1.2: store time is the clock), for `webhook-timestamp`
 * and an HTTP-date `Retry-After`: the store's time when it leased the delivery (its lease ends
 * `leaseMs` after it), advanced by the monotonic clock since the lease call answered
 * (`leasedAt`, a `performance.now()` reading). A receiver refuses a timestamp more than a few
 * minutes from its own clock (Standard Webhooks allows 5), so a replica whose process clock is
 * wrong must not sign with it: every try would be refused until the delivery exhausts.
 */
function leaseClock(lease: CompletionLease, leaseMs: number, leasedAt: number): () => number {
  const storeNow = lease.lease_expires_at - leaseMs;
  return () => storeNow + Math.max(0, Math.round(performance.now() - leasedAt));
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function longestTimeoutMs(destinations: Destinations): number {
  let longest = 0;
  for (const destination of destinations.values()) {
    longest = Math.max(longest, destination.timeoutMs);
  }
  return longest;
}

function integerOption(
  name: string,
  value: number | undefined,
  fallback: number,
  { min = 1, max = Number.MAX_SAFE_INTEGER }: { min?: number; max?: number } = {},
): number {
  const chosen = value ?? fallback;
  if (!Number.isSafeInteger(chosen) || chosen < min || chosen > max) {
    throw new RangeError(`${name} must be an integer from ${min} to ${max}`);
  }
  return chosen;
}

const noop = (): void => {};
const SILENT: SenderLogger = { info: noop, warn: noop, error: noop };

/** The caller's logger behind a guard: a throwing logger must not lose a report or the loop. */
function safeLogger(logger: SenderLogger = SILENT): SenderLogger {
  const guard =
    (level: keyof SenderLogger) =>
    (fields: LogFields, message: string): void => {
      try {
        logger[level](fields, message);
      } catch {
        // Logging is best effort.
      }
    };
  return { info: guard('info'), warn: guard('warn'), error: guard('error') };
}

/**
 * Sends the reports made in the same turn of the event loop to the store as one call (one
 * transaction), up to `max` at a time, and answers each with its own row's outcome. Tries that
 * end together — above all a window aborted at once when the shutdown budget runs out — are
 * recorded in one commit rather than one each, so they fit in what is left of the budget; a
 * lone report waits no timer, only the end of the current turn. A failed call fails each of its
 * reports (each is retried on its own terms, within its lease).
 */
function reportsTogether(
  store: Pick<CompletionStore, 'reportDeliveries'>,
  max: number,
): (report: DeliveryReport) => Promise<boolean> {
  interface Waiting {
    report: DeliveryReport;
    resolve: (changed: boolean) => void;
    reject: (error: unknown) => void;
  }
  let waiting: Waiting[] = [];
  const send = async (batch: readonly Waiting[]): Promise<void> => {
    try {
      const changed = await store.reportDeliveries(batch.map((item) => item.report));
      for (const [i, item] of batch.entries()) item.resolve(changed[i] === true);
    } catch (error) {
      for (const item of batch) item.reject(error);
    }
  };
  const flush = (): void => {
    const batch = waiting.slice(0, max);
    waiting = waiting.slice(max);
    if (waiting.length > 0) setImmediate(flush);
    void send(batch);
  };
  return (report) =>
    new Promise<boolean>((resolve, reject) => {
      waiting.push({ report, resolve, reject });
      if (waiting.length === 1) setImmediate(flush);
    });
}
