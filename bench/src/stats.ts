/**
 * Pure statistics helpers of the benchmark: percentiles, the median and range of repetitions,
 * the ratio of Ledgence to the best peer, statements per task from two counter readings, and
 * CPU per second between two cost readings. No I/O.
 */

/**
 * The `p`-th percentile (0..100) of `values` by the nearest-rank method: the smallest value
 * with at least `p` % of the values at or below it. NaN for an empty list.
 */
export function percentile(values: readonly number[], p: number): number {
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile must be within 0..100, got ${p}`);
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  // p · n first: (p / 100) · n carries float noise that ceil rounds up (0.07 · 100 = 7.000…01,
  // so p7 of 1..100 came out 8; review r53d).
  const rank = Math.max(1, Math.ceil((p * sorted.length) / 100));
  return sorted[rank - 1] as number;
}

/** The median, minimum and maximum of a set of repetitions. */
export interface Summary {
  median: number;
  min: number;
  max: number;
  /** Every repetition's value, in run order. */
  values: number[];
}

/**
 * Median (the mean of the two middle values for an even count), minimum and maximum of
 * `values`; NaN everywhere for an empty list. NaN entries (a metric a repetition could not
 * measure) are left out.
 */
export function summarize(values: readonly number[]): Summary {
  const kept = values.filter((v) => !Number.isNaN(v));
  if (kept.length === 0) {
    return { median: Number.NaN, min: Number.NaN, max: Number.NaN, values: [...values] };
  }
  const sorted = [...kept].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  const median =
    sorted.length % 2 === 1
      ? (sorted[mid] as number)
      : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
  return {
    median,
    min: sorted[0] as number,
    max: sorted[sorted.length - 1] as number,
    values: [...values],
  };
}

/** Whether a larger value of a metric is better (throughput) or a smaller one (latency, cost). */
export type Better = 'higher' | 'lower';

/**
 * The best peer's median and Ledgence's median divided by it. The best peer has the highest
 * median when higher is better, the lowest otherwise; peers with no value (NaN) are skipped.
 * The ratio is NaN when there is no peer value or Ledgence has none; Infinity when the best
 * peer's median is 0 and Ledgence's is not.
 */
export function ratioToBest(
  ledgence: number,
  peers: Readonly<Record<string, number>>,
  better: Better,
): { best: string | undefined; bestValue: number; ratio: number } {
  let best: string | undefined;
  let bestValue = Number.NaN;
  for (const [name, value] of Object.entries(peers)) {
    if (Number.isNaN(value)) continue;
    if (best === undefined || (better === 'higher' ? value > bestValue : value < bestValue)) {
      best = name;
      bestValue = value;
    }
  }
  if (best === undefined || Number.isNaN(ledgence)) return { best, bestValue, ratio: Number.NaN };
  if (bestValue === 0)
    return { best, bestValue, ratio: ledgence === 0 ? 1 : Number.POSITIVE_INFINITY };
  return { best, bestValue, ratio: ledgence / bestValue };
}

/** A number with about three significant digits, for the table. */
export function formatNumber(value: number): string {
  if (Number.isNaN(value)) return '–';
  if (!Number.isFinite(value)) return value > 0 ? '∞' : '-∞';
  // The decade is the rounded value's: 99.96 is "100", not "100.0" (review r53d).
  const abs = Math.abs(Number(value.toPrecision(3)));
  if (abs >= 100) return Math.round(value).toString();
  if (abs >= 10) return value.toFixed(1);
  if (abs >= 1) return value.toFixed(2);
  if (abs === 0) return '0';
  return value.toPrecision(2);
}

/** `median [min–max]`, or just the value when the range is one point. */
export function formatSummary(summary: Summary): string {
  const median = formatNumber(summary.median);
  if (Number.isNaN(summary.median)) return median;
  if (summary.min === summary.max) return median;
  return `${median} [${formatNumber(summary.min)}–${formatNumber(summary.max)}]`;
}

/**
 * Top-level statements of one database (`pg_stat_statements.track = top`, its default, with
 * `track_utility` on: BEGIN, COMMIT, NOTIFY and LISTEN count as statements, and a function
 * call counts once however many statements run inside it).
 */
export interface StatementCounters {
  /** Statements completed so far. */
  calls: number;
  /** Their execution time so far, ms (`total_exec_time`: not parsing, planning or the wire). */
  execMs: number;
  /**
   * Entries the extension has evicted so far, cluster-wide: if this moves during a window, some
   * counts were lost and the window's figures are not complete.
   */
  evictions: number;
}

/**
 * Statements and their execution ms per task between two readings, less `own` statements the
 * benchmark itself ran in the window (its probes, whose execution time is left in: small, and
 * not separable). NaN for both when a reading is missing or entries were evicted in between
 * (some counts were lost).
 */
export function statementsPerTask(
  from: StatementCounters | undefined,
  to: StatementCounters | undefined,
  own: number,
  tasks: number,
): { statements: number; execMs: number } {
  if (from === undefined || to === undefined || to.evictions !== from.evictions) {
    return { statements: Number.NaN, execMs: Number.NaN };
  }
  return {
    statements: (to.calls - from.calls - own) / tasks,
    execMs: (to.execMs - from.execMs) / tasks,
  };
}

/**
 * `value` against the geometric mean of the measurements just before and just after it: a drift
 * that is linear over the three (a warming server, the VM's hour) cancels to first order, where
 * a ratio to one neighbour carries it whole.
 */
export function ratioToBracket(value: number, before: number, after: number): number {
  return value / Math.sqrt(before * after);
}

/** What the benchmark can attribute to one system's processes and statements, at one moment. */
export interface CostReading {
  /** The server process's CPU so far (NaN for a system without one). */
  serverMs: number;
  /** The benchmark process's CPU so far: the system's workers. */
  benchMs: number;
  /** PostgreSQL's execution time of the system's statements so far (NaN without the counts). */
  execMs: number;
  /** `performance.now()` of the reading. */
  at: number;
}

/** Where a window's time went, in ms per second of the window. */
export interface CostPerS {
  server: number;
  workers: number;
  /** PostgreSQL's execution time of the system's statements. */
  statements: number;
  total: number;
}

/** Nothing measured: every figure NaN. */
export const NO_COST: CostPerS = {
  server: Number.NaN,
  workers: Number.NaN,
  statements: Number.NaN,
  total: Number.NaN,
};

/** The time between two readings, per second of the window between them. */
export function costPerS(from: CostReading, to: CostReading): CostPerS {
  const seconds = (to.at - from.at) / 1000;
  const server = (to.serverMs - from.serverMs) / seconds;
  const workers = (to.benchMs - from.benchMs) / seconds;
  const statements = (to.execMs - from.execMs) / seconds;
  return { server, workers, statements, total: server + workers + statements };
}

/** What a target rate leaves per task on this machine, against what was spent. */
export interface CpuBudget {
  /** The rate asked for, tasks/s. */
  targetRate: number;
  /** The most CPU a task can take at that rate with every CPU busy all the time, ms. */
  budgetMs: number;
  /** Spent ÷ budget: above 1, the rate cannot be reached without less work per task. */
  overBudget: number;
}

/**
 * The CPU budget of a rate: `cpus` CPUs give `cpus × 1 000` ms of CPU a second, so `rate` tasks
 * a second can spend at most that divided by `rate` per task, whatever the overlap.
 *
 * @param rate the target rate (1.2× the best peer's, for issue 7), tasks/s.
 * @param spentMs the machine's busy CPU per task measured at the rate reached, ms.
 */
export function cpuBudget(rate: number, cpus: number, spentMs: number): CpuBudget {
  const budgetMs = (cpus * 1000) / rate;
  return { targetRate: rate, budgetMs, overBudget: spentMs / budgetMs };
}

/**
 * Pickup latencies, ms: from each submit's acknowledgement (`acknowledged`, by task) to its
 * handler's start (`started`), 0 for a handler that started before the acknowledgement arrived.
 * A task whose handler had not started when the probe gave up (`gaveUpAt`, counted in `missing`)
 * counts as the time it had waited by then, a lower bound of its latency: left out, it made a
 * system that loses tasks look faster, its slowest pickups gone from p99 and max.
 */
export function pickupLatencies(
  acknowledged: ReadonlyMap<number, number>,
  started: ReadonlyMap<number, number>,
  gaveUpAt: number,
): { latencies: number[]; missing: number } {
  const latencies: number[] = [];
  let missing = 0;
  for (const [task, ack] of acknowledged) {
    const start = started.get(task);
    if (start === undefined) missing += 1;
    latencies.push(Math.max(0, (start ?? gaveUpAt) - ack));
  }
  return { latencies, missing };
}
