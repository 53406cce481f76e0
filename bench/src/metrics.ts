/**
 * The rows of the benchmark's table: each shape's metrics, whether a larger value is better,
 * and which rows are context (never ranked against the best peer). No I/O.
 */
import type { Better } from './stats.js';

/** One row of the table. */
export interface MetricSpec {
  shape: string;
  metric: string;
  unit: string;
  better: Better;
  /**
   * Context for the row (what the shape ran against, or a figure that does not cover the same
   * work for every system), not a result to rank: no ratio.
   */
  context?: true;
}

export const STRICT = 'drain strict (≤ 32 held)';
export const PICKUP = 'pickup latency (idle)';
export const PICKUP_LOADED = 'pickup latency (under load)';
export const HEARTBEATS = 'drain strict beside heartbeating leases';

/**
 * The share of the CPUs' time in a shape's timed window that the hypervisor gave to another
 * guest (`/proc/stat` steal): context for reading the window's other rows on a shared VM, where
 * a slow repetition may be one the machine was not fully given.
 */
const STOLEN = (shape: string): MetricSpec => ({
  shape,
  metric: 'stolen CPU',
  unit: 'share',
  better: 'lower',
  context: true,
});

/**
 * The whole machine's busy CPU per task over a shape's timed window (`/proc/stat`, steal left
 * out): every system's processes — PostgreSQL's backends, the kernel's work for them, the
 * Ledgence server — on one scale, which the per-process rows cannot give (PostgreSQL's own
 * reading is unverified); and the window's stolen share beside it.
 */
const MACHINE_CPU = (shape: string): MetricSpec[] => [
  { shape, metric: 'machine CPU', unit: 'ms/task', better: 'lower' },
  STOLEN(shape),
];

/** The rows every drain shape reports (what `drain()` records). */
function drainMetrics(shape: string): MetricSpec[] {
  return [
    { shape, metric: 'rate', unit: 'tasks/s', better: 'higher' },
    { shape, metric: 'commits', unit: 'per task', better: 'lower' },
    { shape, metric: 'write xacts', unit: 'per task', better: 'lower' },
    { shape, metric: 'statements', unit: 'per task', better: 'lower' },
    { shape, metric: 'PostgreSQL exec time', unit: 'ms/task', better: 'lower' },
    { shape, metric: 'WAL', unit: 'bytes/task', better: 'lower' },
    { shape, metric: 'CPU server', unit: 'ms/task', better: 'lower' },
    // Context: Ledgence's SDK workers hand the queue's work to the server process (the row
    // above), where a peer's library does all of it here; ranked, Ledgence's part stood against
    // a peer's whole (0.89× graphile-worker's in the strict drain, against 2.6× with the server).
    { shape, metric: 'CPU workers', unit: 'ms/task', better: 'lower', context: true },
    { shape, metric: 'HTTP requests', unit: 'per task', better: 'lower' },
    ...MACHINE_CPU(shape),
  ];
}

/** Every row, in table order. */
export const METRICS: MetricSpec[] = [
  { shape: 'single submit, 1 in flight', metric: 'rate', unit: 'tasks/s', better: 'higher' },
  { shape: 'single submit, 1 in flight', metric: 'p50', unit: 'ms', better: 'lower' },
  { shape: 'single submit, 1 in flight', metric: 'p99', unit: 'ms', better: 'lower' },
  { shape: 'single submit, 1 in flight', metric: 'write xacts', unit: 'per task', better: 'lower' },
  { shape: 'single submit, 1 in flight', metric: 'statements', unit: 'per task', better: 'lower' },
  {
    shape: 'single submit, 1 in flight',
    metric: 'PostgreSQL exec time',
    unit: 'ms/task',
    better: 'lower',
  },
  ...MACHINE_CPU('single submit, 1 in flight'),
  { shape: 'single submit, 8 in flight', metric: 'rate', unit: 'tasks/s', better: 'higher' },
  { shape: 'single submit, 8 in flight', metric: 'p50', unit: 'ms', better: 'lower' },
  { shape: 'single submit, 8 in flight', metric: 'p99', unit: 'ms', better: 'lower' },
  ...MACHINE_CPU('single submit, 8 in flight'),
  { shape: 'bulk submit, 1 000 per request', metric: 'rate', unit: 'tasks/s', better: 'higher' },
  { shape: 'bulk submit, 1 000 per request', metric: 'WAL', unit: 'bytes/task', better: 'lower' },
  ...MACHINE_CPU('bulk submit, 1 000 per request'),
  ...drainMetrics(STRICT),
  ...drainMetrics('drain batched'),
  { shape: PICKUP, metric: 'p50', unit: 'ms', better: 'lower' },
  { shape: PICKUP, metric: 'p99', unit: 'ms', better: 'lower' },
  { shape: PICKUP, metric: 'max', unit: 'ms', better: 'lower' },
  STOLEN(PICKUP),
  { shape: PICKUP_LOADED, metric: 'p50', unit: 'ms', better: 'lower' },
  { shape: PICKUP_LOADED, metric: 'p99', unit: 'ms', better: 'lower' },
  { shape: PICKUP_LOADED, metric: 'max', unit: 'ms', better: 'lower' },
  STOLEN(PICKUP_LOADED),
  {
    shape: PICKUP_LOADED,
    metric: 'load drained',
    unit: 'tasks/s',
    better: 'higher',
    context: true,
  },
  { shape: HEARTBEATS, metric: 'rate', unit: 'tasks/s', better: 'higher' },
  { shape: HEARTBEATS, metric: 'rate vs strict', unit: '', better: 'higher' },
  { shape: HEARTBEATS, metric: 'rate vs adjacent strict', unit: '', better: 'higher' },
  { shape: HEARTBEATS, metric: 'heartbeats', unit: 'per s', better: 'higher', context: true },
  { shape: HEARTBEATS, metric: 'heartbeat CPU share', unit: '', better: 'lower' },
  { shape: HEARTBEATS, metric: 'commits', unit: 'per task', better: 'lower' },
  { shape: HEARTBEATS, metric: 'statements', unit: 'per task', better: 'lower' },
  { shape: HEARTBEATS, metric: 'PostgreSQL exec time', unit: 'ms/task', better: 'lower' },
  { shape: HEARTBEATS, metric: 'CPU server', unit: 'ms/task', better: 'lower' },
  STOLEN(HEARTBEATS),
];

/**
 * The text of `results/latest.json`: numbers to six significant digits, and the non-finite ones
 * (a metric a system did not measure, a ratio to a peer's 0) as `null`, which JSON has for them.
 */
export function resultsJson(results: unknown): string {
  const replacer = (_key: string, value: unknown): unknown => {
    if (typeof value !== 'number') return value;
    return Number.isFinite(value) ? Number(value.toPrecision(6)) : null;
  };
  return `${JSON.stringify(results, replacer, 2)}\n`;
}
