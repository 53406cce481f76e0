/** What every benchmarked system offers the shapes: the same operations, each its own way. */

/** The systems, in table order. */
export const SYSTEM_NAMES = ['ledgence', 'pg-boss', 'graphile-worker'] as const;
export type SystemName = (typeof SYSTEM_NAMES)[number];

/** The payload of every benchmark task: its index within the run. */
export interface BenchData {
  i: number;
}

/**
 * How workers are set up: `strict` holds at most 32 tasks at once in total; `batched` uses
 * the system's batching options; `pickup` is one idle worker slot.
 */
export type WorkerMode = 'strict' | 'batched' | 'pickup';

/** Running workers. */
export interface RunningWorkers {
  /** Stops them and closes their database connections. */
  stop(): Promise<void>;
}

/** Leases held open by long-running handlers beside a drain (shape 7, heartbeats). */
export interface HeldLeases {
  /** Lease renewals the system's store has recorded for the held tasks so far. */
  renewals(): Promise<number>;
  /** The period at which each held lease heartbeats. */
  readonly renewIntervalMs: number;
  /** Lets the handlers return, then stops their workers. */
  stop(): Promise<void>;
}

/** One system under test, bound to its own database. */
export interface BenchSystem {
  readonly name: SystemName;
  /** Its database on the run's PostgreSQL. */
  readonly database: string;
  /** Makes `queue` usable (pg-boss needs queues created). */
  prepareQueue(queue: string): Promise<void>;
  /** Submits one task; resolves once the system acknowledged it. */
  submitOne(queue: string, data: BenchData): Promise<void>;
  /** Submits `items` in one request or call. */
  submitMany(queue: string, items: BenchData[]): Promise<void>;
  /**
   * Removes the tasks left in `queue` (submitted by a submit shape, or left by a capped
   * drain), where they could slow other queues down; outside any timed window.
   */
  discard(queue: string): Promise<void>;
  /** Starts workers on `queue`; `onStart` runs first thing in every handler (a no-op handler). */
  startWorkers(
    queue: string,
    mode: WorkerMode,
    onStart: (data: BenchData) => void,
  ): Promise<RunningWorkers>;
  /**
   * Submits `count` tasks to `queue` and holds them all leased by handlers that run until
   * `stop`, renewing their leases the way the system does on its own (shape 7); resolves once
   * every handler has started. Absent for a system without lease renewal: pg-boss 10 and
   * graphile-worker 0.17 never extend a job's lock, so they have no heartbeat load to measure.
   */
  holdLeases?(queue: string, count: number): Promise<HeldLeases>;
  /** SQL (parameter $1: the queue) counting the queue's tasks not yet finished. */
  readonly unfinishedSql: string;
  /**
   * Makes sure every commit so far is counted in `pg_stat_database`: PostgreSQL flushes a
   * backend's counters at most once a second while busy and 10 s after it went idle, or when it
   * exits. Peers close their producer connections; Ledgence's server keeps its pool, so this
   * waits for the idle flush.
   */
  flushStats(): Promise<void>;
  /** CPU ms the system's own server process has used so far; NaN for in-process libraries. */
  serverCpuMs(): Promise<number>;
  /**
   * HTTP requests the system's server has answered so far, per `METHOD route`; absent for
   * in-process libraries, which answer none.
   */
  serverRequests?(): Promise<Map<string, number>>;
  /** The configuration used for `mode`, for the report. */
  describe(mode: WorkerMode): string;
  close(): Promise<void>;
}

/** Waits `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
