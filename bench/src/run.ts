/**
 * `pnpm bench`: Ledgence (the real server process, driven over HTTP by `@ledgence/worker`)
 * against pg-boss and graphile-worker, on identical workloads, on one PostgreSQL with one
 * database per system. Prints one table and writes `bench/results/latest.json`.
 *
 *   pnpm bench              full sizes, 3 repetitions
 *   pnpm bench -- --quick   every count ÷ 10, 1 repetition
 *   pnpm bench -- --smoke   tiny counts, 1 repetition, no statistics waits, no results file:
 *                           CI's check that every shape of every system still runs
 *   pnpm bench -- --reps 2  another number of repetitions
 *
 * `DATABASE_URL` (optional) names a PostgreSQL to use instead of the embedded one; the
 * benchmark drops and creates its own databases there. `LEDGENCE_BENCH_DATA_DIR` (optional)
 * moves the embedded one's cluster out of `bench/.data`.
 *
 * SIGINT or SIGTERM stops the server and the embedded PostgreSQL before the process exits.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus, freemem, loadavg, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import {
  type CpuSources,
  closeCpuWindow,
  type MachineWindow,
  machineCpu,
  machineWindow,
  openCpuWindow,
} from './cpu.js';
import { CountingClient, type Postgres, startPostgres } from './db.js';
import { once, type SignalStop, stopOnSignals } from './interrupt.js';
import { HEARTBEATS, METRICS, PICKUP, PICKUP_LOADED, resultsJson, STRICT } from './metrics.js';
import { systemOrder } from './order.js';
import { type ServerProcess, serverEntry, startServer } from './server.js';
import { Starts } from './starts.js';
import {
  type CostReading,
  type CpuBudget,
  costPerS,
  cpuBudget,
  formatNumber,
  formatSummary,
  NO_COST,
  percentile,
  pickupLatencies,
  ratioToBest,
  ratioToBracket,
  type Summary,
  statementsPerTask,
  summarize,
} from './stats.js';
import { graphileSystem } from './systems/graphile.js';
import { ledgenceSystem } from './systems/ledgence.js';
import { pgBossSystem } from './systems/pgboss.js';
import { requestsBetween } from './systems/requests.js';
import {
  type BenchData,
  type BenchSystem,
  SYSTEM_NAMES,
  type SystemName,
  sleep,
  type WorkerMode,
} from './systems/system.js';

const benchDir = join(dirname(fileURLToPath(import.meta.url)), '..');
const root = join(benchDir, '..');
// Where the embedded PostgreSQL keeps its cluster (in `<dir>/pg`); a test points it elsewhere.
const dataDir = process.env.LEDGENCE_BENCH_DATA_DIR ?? join(benchDir, '.data');

// ---------------------------------------------------------------------------------------------
// Options and sizes

const SHAPES = [
  'single1',
  'single8',
  'bulk',
  'strict',
  'batched',
  'pickup',
  'pickupload',
  'heartbeats',
] as const;
type ShapeName = (typeof SHAPES)[number];

/** How big a run is: the real one, a tenth of it, or a CI smoke test that every shape runs. */
type Mode = 'full' | 'quick' | 'smoke';

interface Options {
  mode: Mode;
  reps: number;
  shapes: ShapeName[];
  systems: SystemName[];
}

function listArg<T extends string>(
  value: string | undefined,
  allowed: readonly T[],
  flag: string,
): T[] {
  const items = (value ?? '').split(',').filter((item) => item.length > 0);
  for (const item of items) {
    if (!allowed.includes(item as T)) {
      throw new Error(`${flag} takes a comma-separated list of ${allowed.join(', ')}; got ${item}`);
    }
  }
  if (items.length === 0) throw new Error(`${flag} needs a value`);
  return items as T[];
}

function parseArgs(argv: readonly string[]): Options {
  let mode: Mode = 'full';
  let reps: number | undefined;
  let shapes: ShapeName[] = [...SHAPES];
  let systems: SystemName[] = [...SYSTEM_NAMES];
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === '--') continue;
    if (arg === '--quick') mode = 'quick';
    else if (arg === '--smoke') mode = 'smoke';
    else if (arg === '--reps') {
      reps = Number(argv[i + 1]);
      i += 1;
      if (!Number.isInteger(reps) || reps < 1) throw new Error('--reps needs a positive integer');
    } else if (arg === '--only') {
      shapes = listArg(argv[i + 1], SHAPES, '--only');
      i += 1;
    } else if (arg === '--systems') {
      systems = listArg(argv[i + 1], SYSTEM_NAMES, '--systems');
      i += 1;
    } else {
      throw new Error(
        `unknown argument ${arg} (expected --quick, --smoke, --reps N, --only SHAPES, --systems NAMES)`,
      );
    }
  }
  return { mode, reps: reps ?? (mode === 'full' ? 3 : 1), shapes, systems };
}

interface Sizes {
  single: number;
  bulk: number;
  bulkPerRequest: number;
  drain: number;
  /** A drain that has not finished by then is stopped; its rate counts what completed. */
  drainCapMs: number;
  pickup: number;
  pickupMaxGapMs: number;
  /** Shape 7: long tasks held leased (and heartbeating) beside a strict drain. */
  heldLeases: number;
  /** Shape 6: how long the load runs before the probe starts. */
  loadSettleMs: number;
  /** Shape 7: count heartbeats over a whole number of renew intervals (waits up to one more). */
  wholeIntervals: boolean;
  /**
   * Shape 7: renew intervals the leases stay held after the drain, alone, to cost them (a
   * fraction in a smoke run: too short to mean anything, long enough to run the readings).
   */
  heldIdleIntervals: number;
}

function sizesFor(mode: Mode): Sizes {
  if (mode === 'smoke') {
    // Enough of each shape to take every code path (two bulk requests, a drain past pg-boss's
    // first polling round), small enough that all three systems finish in well under a minute.
    return {
      single: 40,
      bulk: 2_000,
      bulkPerRequest: 1_000,
      drain: 400,
      drainCapMs: 10_000,
      pickup: 10,
      pickupMaxGapMs: 50,
      heldLeases: 20,
      loadSettleMs: 200,
      wholeIntervals: false,
      heldIdleIntervals: 0.05,
    };
  }
  const scale = mode === 'quick' ? 10 : 1;
  return {
    single: 2_000 / scale,
    bulk: 20_000 / scale,
    bulkPerRequest: 1_000,
    drain: 20_000 / scale,
    drainCapMs: mode === 'quick' ? 15_000 : 60_000,
    pickup: 300 / scale,
    pickupMaxGapMs: 500,
    heldLeases: 2_000 / scale,
    loadSettleMs: 2_000,
    wholeIntervals: true,
    heldIdleIntervals: mode === 'quick' ? 1 : 2,
  };
}

const MODE_TITLES: Record<Mode, string> = {
  full: 'full',
  quick: 'quick (counts ÷ 10)',
  smoke: 'smoke (tiny counts; commit and WAL counters not flushed, so not meaningful)',
};

// ---------------------------------------------------------------------------------------------
// Results

const keyOf = (shape: string, metric: string): string => `${shape} / ${metric}`;

/** Every repetition's value per metric and system. */
class Recorder {
  readonly values = new Map<string, Map<SystemName, number[]>>();
  readonly notes: string[] = [];

  record(shape: string, metric: string, system: SystemName, value: number): void {
    const key = keyOf(shape, metric);
    let bySystem = this.values.get(key);
    if (bySystem === undefined) {
      bySystem = new Map();
      this.values.set(key, bySystem);
    }
    const list = bySystem.get(system) ?? [];
    list.push(value);
    bySystem.set(system, list);
  }

  summary(shape: string, metric: string, system: SystemName): Summary {
    return summarize(this.values.get(keyOf(shape, metric))?.get(system) ?? []);
  }

  /** The peers' medians of one metric (NaN for a peer that did not run it). */
  peerMedians(shape: string, metric: string): Record<string, number> {
    return Object.fromEntries(
      SYSTEM_NAMES.filter((name) => name !== 'ledgence').map((name) => [
        name,
        this.summary(shape, metric, name).median,
      ]),
    );
  }
}

/** Records a timed window's machine CPU per task (when `tasks` is given) and its stolen share. */
function recordMachine(
  rec: Recorder,
  shape: string,
  system: SystemName,
  window: MachineWindow,
  tasks?: number,
): void {
  if (tasks !== undefined) rec.record(shape, 'machine CPU', system, window.busyMs / tasks);
  rec.record(shape, 'stolen CPU', system, window.stolenShare);
}

/** A window's stolen share as a progress line gives it. */
const stolenText = (window: { stolenShare: number }): string =>
  `${formatNumber(100 * window.stolenShare)} % stolen`;

// ---------------------------------------------------------------------------------------------
// Shapes

const log = (message: string): void => {
  const time = new Date().toISOString().slice(11, 19);
  console.log(`[${time}] ${message}`);
};

/** Runs `count` calls of `fn`, at most `inFlight` at once. */
async function pool(
  count: number,
  inFlight: number,
  fn: (i: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  const lane = async (): Promise<void> => {
    while (next < count) {
      const i = next;
      next += 1;
      await fn(i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(inFlight, count) }, lane));
}

/** The same few submits for every system before a timed submit shape: connections and plans warm. */
async function warmUp(system: BenchSystem, queue: string): Promise<void> {
  const warm = `${queue}_warm`;
  await system.prepareQueue(warm);
  for (let i = 0; i < 20; i += 1) await system.submitOne(warm, { i });
  await system.submitMany(
    warm,
    Array.from({ length: 100 }, (_, i) => ({ i })),
  );
}

async function singleSubmit(
  system: BenchSystem,
  postgres: Postgres,
  queue: string,
  count: number,
  inFlight: number,
  rec: Recorder,
): Promise<void> {
  const shape = `single submit, ${inFlight} in flight`;
  await system.prepareQueue(queue);
  await warmUp(system, queue);
  const latencies: number[] = [];
  const before = await postgres.counters(system.database);
  const statementsBefore = await postgres.statements(system.database);
  const machineBefore = await machineCpu();
  const t0 = performance.now();
  await pool(count, inFlight, async (i) => {
    const start = performance.now();
    await system.submitOne(queue, { i });
    latencies.push(performance.now() - start);
  });
  const seconds = (performance.now() - t0) / 1000;
  const machine = machineWindow(machineBefore, await machineCpu());
  const after = await postgres.counters(system.database);
  if (inFlight === 1) {
    rec.record(shape, 'write xacts', system.name, (after.nextXid - before.nextXid) / count);
    const statementsAfter = await postgres.statements(system.database);
    const { statements, execMs } = statementsPerTask(statementsBefore, statementsAfter, 0, count);
    rec.record(shape, 'statements', system.name, statements);
    rec.record(shape, 'PostgreSQL exec time', system.name, execMs);
  }
  await system.discard(queue);
  await system.discard(`${queue}_warm`);
  rec.record(shape, 'rate', system.name, count / seconds);
  rec.record(shape, 'p50', system.name, percentile(latencies, 50));
  rec.record(shape, 'p99', system.name, percentile(latencies, 99));
  recordMachine(rec, shape, system.name, machine, count);
  log(
    `  ${system.name}: ${formatNumber(count / seconds)} tasks/s, p50 ${formatNumber(percentile(latencies, 50))} ms, p99 ${formatNumber(percentile(latencies, 99))} ms, machine CPU ${formatNumber(machine.busyMs / count)} ms/task (${stolenText(machine)})`,
  );
}

async function seed(system: BenchSystem, queue: string, count: number, per: number) {
  for (let from = 0; from < count; from += per) {
    const items = Array.from({ length: Math.min(per, count - from) }, (_, k) => ({ i: from + k }));
    await system.submitMany(queue, items);
  }
}

async function bulkSubmit(
  system: BenchSystem,
  postgres: Postgres,
  queue: string,
  sizes: Sizes,
  rec: Recorder,
): Promise<void> {
  await system.prepareQueue(queue);
  await warmUp(system, queue);
  const before = await postgres.counters(system.database);
  const machineBefore = await machineCpu();
  const t0 = performance.now();
  await seed(system, queue, sizes.bulk, sizes.bulkPerRequest);
  const rate = sizes.bulk / ((performance.now() - t0) / 1000);
  const machine = machineWindow(machineBefore, await machineCpu());
  const after = await postgres.counters(system.database);
  const wal = (await postgres.walBytes(before, after)) / sizes.bulk;
  await system.discard(queue);
  await system.discard(`${queue}_warm`);
  rec.record('bulk submit, 1 000 per request', 'rate', system.name, rate);
  rec.record('bulk submit, 1 000 per request', 'WAL', system.name, wal);
  recordMachine(rec, 'bulk submit, 1 000 per request', system.name, machine, sizes.bulk);
  log(
    `  ${system.name}: ${formatNumber(rate)} tasks/s, ${formatNumber(wal)} WAL bytes/task, machine CPU ${formatNumber(machine.busyMs / sizes.bulk)} ms/task (${stolenText(machine)})`,
  );
}

/** What one drain measured, besides what it recorded. */
interface DrainResult {
  /** Tasks finished per second, first handler start to the last completion. */
  rate: number;
  /**
   * CPU ms the whole machine was busy per second of the drain (workers started to stopped),
   * steal left out.
   */
  machineBusyMsPerS: number;
  /** The share of the CPUs' time over the same window that the hypervisor gave elsewhere. */
  stolenShare: number;
}

/** The CPU readers of a drain's window for `system`. */
function drainCpuSources(system: BenchSystem, postgres: Postgres): CpuSources {
  return {
    server: () => system.serverCpuMs(),
    postgres: () => postgres.cpuMs(),
    bench: () => process.cpuUsage(),
    machine: machineCpu,
    now: () => performance.now(),
  };
}

async function drain(
  system: BenchSystem,
  postgres: Postgres,
  queue: string,
  mode: WorkerMode,
  sizes: Sizes,
  rec: Recorder,
  shape: string = mode === 'strict' ? STRICT : 'drain batched',
): Promise<DrainResult> {
  const count = sizes.drain;
  await system.prepareQueue(queue);
  await seed(system, queue, count, sizes.bulkPerRequest);
  // A scrape of the server's /metrics reads queue depths from PostgreSQL: scraped outside the
  // windows of the commit, statement and CPU counters (this one before the statistics flush),
  // so they count none of it.
  const requestsBefore = await system.serverRequests?.();
  await system.flushStats();
  const probe = new CountingClient(postgres.urlFor(system.database));
  await probe.connect();
  const before = await postgres.counters(system.database);
  const statementsBefore = await postgres.statements(system.database);
  const cpuSources = drainCpuSources(system, postgres);
  const cpuBefore = await openCpuWindow(cpuSources);

  const starts = new Starts(count);
  const workers = await system.startWorkers(queue, mode, () => starts.record());
  const deadline = performance.now() + sizes.drainCapMs;
  let lastProgress = performance.now();
  let end: number | undefined;
  let capped = false;
  let completedAtEnd = count;
  for (;;) {
    const now = performance.now();
    if (now >= deadline) {
      capped = true;
      end = now;
      completedAtEnd = count - (await probe.scalar(system.unfinishedSql, [queue]));
      break;
    }
    if (starts.started >= count) {
      // Every handler ran; the drain ends when the database shows every task finished.
      if ((await probe.scalar(system.unfinishedSql, [queue])) === 0) {
        end = performance.now();
        break;
      }
      await sleep(5);
    } else {
      await starts.wait(20);
    }
    if (now - lastProgress >= 5_000) {
      lastProgress = now;
      log(`    ${system.name}: ${starts.started}/${count} started`);
    }
  }
  await workers.stop();
  const cpuAfter = await closeCpuWindow(cpuSources);
  const completedAfterStop = count - (await probe.scalar(system.unfinishedSql, [queue]));
  const statementsAfter = await postgres.statements(system.database);
  await probe.end();
  await system.flushStats();
  const after = await postgres.counters(system.database);
  const requestsAfter = await system.serverRequests?.();
  // A capped drain's leftovers are removed only now: the discard is not the drain's work, and
  // its statements, commits, WAL and transactions would land in the drain's readings.
  if (capped) await system.discard(queue);
  const commits = after.xactCommit - before.xactCommit - probe.statements;
  const wal = await postgres.walBytes(before, after);
  const seconds = ((end ?? performance.now()) - (starts.first ?? end ?? 0)) / 1000;
  // A drain in which no handler started did no work: its rate is 0, not the 0 / 0 that
  // `summarize` would leave out of the median as unmeasured (review r53d).
  const rate = completedAtEnd === 0 ? 0 : completedAtEnd / seconds;
  const perTask = Math.max(1, completedAfterStop);
  rec.record(shape, 'rate', system.name, rate);
  rec.record(shape, 'commits', system.name, commits / perTask);
  rec.record(shape, 'write xacts', system.name, (after.nextXid - before.nextXid) / perTask);
  const statements = statementsPerTask(
    statementsBefore,
    statementsAfter,
    probe.statements,
    perTask,
  );
  rec.record(shape, 'statements', system.name, statements.statements);
  rec.record(shape, 'PostgreSQL exec time', system.name, statements.execMs);
  rec.record(shape, 'WAL', system.name, wal / perTask);
  const serverCpu = (cpuAfter.serverMs - cpuBefore.serverMs) / perTask;
  const postgresCpu = (cpuAfter.postgresMs - cpuBefore.postgresMs) / perTask;
  const workersCpu = (cpuAfter.benchMs - cpuBefore.benchMs) / perTask;
  rec.record(shape, 'CPU server', system.name, serverCpu);
  // PostgreSQL's CPU is printed but not tabled: summed from /proc over the postmaster and its
  // children it gave implausible values (graphile-worker's strict drain, 2 commits per task,
  // at 0.003–0.3 ms/task) and is not yet understood.
  rec.record(shape, 'CPU workers', system.name, workersCpu);
  const machine = machineWindow(cpuBefore.machine, cpuAfter.machine);
  recordMachine(rec, shape, system.name, machine, perTask);
  const requests =
    requestsBefore && requestsAfter && requestsBetween(requestsBefore, requestsAfter);
  if (requests) {
    const total = [...requests.values()].reduce((sum, count) => sum + count, 0);
    rec.record(shape, 'HTTP requests', system.name, total / perTask);
  }
  if (capped) {
    rec.notes.push(
      `${shape}, ${system.name}, queue ${queue}: stopped at the ${sizes.drainCapMs / 1000} s cap with ${completedAtEnd}/${count} done; rate = done / elapsed`,
    );
  }
  log(
    `  ${system.name}: ${formatNumber(rate)} tasks/s${capped ? ` (capped: ${completedAtEnd}/${count})` : ''}, ${formatNumber(commits / perTask)} commits/task, ${formatNumber((after.nextXid - before.nextXid) / perTask)} write xacts/task, ${formatNumber(statements.statements)} statements/task (${formatNumber(statements.execMs)} ms executing), ${formatNumber(wal / perTask)} WAL bytes/task; CPU ms/task: machine ${formatNumber(machine.busyMs / perTask)} (${stolenText(machine)}), server ${formatNumber(serverCpu)}, PostgreSQL (unverified) ${formatNumber(postgresCpu)}, workers ${formatNumber(workersCpu)}${requests ? `; tasks per request: ${tasksPerRequest(requests, perTask)}` : ''}`,
  );
  const machineBusyMsPerS = machine.busyMs / ((cpuAfter.at - cpuBefore.at) / 1000);
  return { rate, machineBusyMsPerS, stolenShare: machine.stolenShare };
}

/** Tasks per request of each route a drain used, e.g. `acquire:batch 31.9, settle:batch 32.0`. */
function tasksPerRequest(requests: ReadonlyMap<string, number>, tasks: number): string {
  return [...requests]
    .map(([key, count]) => `${key.slice(key.lastIndexOf('/') + 1)} ${formatNumber(tasks / count)}`)
    .join(', ');
}

/** A small deterministic generator, so every system sees the same gaps. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function pickup(
  system: BenchSystem,
  queue: string,
  sizes: Sizes,
  seedValue: number,
  rec: Recorder,
  shape: string = PICKUP,
): Promise<void> {
  const count = sizes.pickup;
  await system.prepareQueue(queue);
  const acknowledged = new Map<number, number>();
  const started = new Map<number, number>();
  const workers = await system.startWorkers(queue, 'pickup', (data: BenchData) => {
    if (!started.has(data.i)) started.set(data.i, performance.now());
  });
  // Let the worker settle into its idle state (parked poll, LISTEN, or polling loop).
  await sleep(1_000);
  const machineBefore = await machineCpu();
  const gap = random(seedValue);
  for (let i = 0; i < count; i += 1) {
    await sleep(gap() * sizes.pickupMaxGapMs);
    await system.submitOne(queue, { i });
    acknowledged.set(i, performance.now());
    if ((i + 1) % 100 === 0) log(`    ${system.name}: ${i + 1}/${count} submitted`);
  }
  const deadline = performance.now() + 30_000;
  while (started.size < count && performance.now() < deadline) await sleep(10);
  const gaveUpAt = performance.now();
  const machine = machineWindow(machineBefore, await machineCpu());
  const { latencies, missing } = pickupLatencies(acknowledged, started, gaveUpAt);
  await workers.stop();
  if (missing > 0) {
    rec.notes.push(
      `${shape}, ${system.name}: ${missing}/${count} not picked up within 30 s of the last submit; each counts as the time it had waited then (a lower bound)`,
    );
  }
  rec.record(shape, 'p50', system.name, percentile(latencies, 50));
  rec.record(shape, 'p99', system.name, percentile(latencies, 99));
  rec.record(shape, 'max', system.name, percentile(latencies, 100));
  recordMachine(rec, shape, system.name, machine);
  log(
    `  ${system.name}: p50 ${formatNumber(percentile(latencies, 50))} ms, p99 ${formatNumber(percentile(latencies, 99))} ms, max ${formatNumber(percentile(latencies, 100))} ms (${stolenText(machine)})`,
  );
}

/**
 * The system's strict drain rate in this repetition (shape 3), the yardstick of shapes 6 and 7;
 * measured now, on a tenth of the tasks and not recorded, when shape 3 did not run.
 */
async function strictRate(
  system: BenchSystem,
  postgres: Postgres,
  rep: number,
  sizes: Sizes,
  rec: Recorder,
): Promise<number> {
  const measured = rec.values.get(keyOf(STRICT, 'rate'))?.get(system.name)?.[rep - 1];
  if (measured !== undefined) return measured;
  log(`  ${system.name}: measuring the strict drain rate first (shape 3 is not in this run)`);
  const small = { ...sizes, drain: Math.max(100, Math.round(sizes.drain / 10)) };
  return (await drain(system, postgres, `calibrate_r${rep}`, 'strict', small, new Recorder())).rate;
}

/**
 * Shape 6: the pickup probe of shape 5 while a strict drain runs beside it at about half the
 * system's strict drain rate: a producer submits to another queue at that rate (in small
 * batches every 50 ms) and strict workers drain it.
 */
async function pickupUnderLoad(
  system: BenchSystem,
  postgres: Postgres,
  rep: number,
  sizes: Sizes,
  rec: Recorder,
): Promise<void> {
  const target = (await strictRate(system, postgres, rep, sizes, rec)) / 2;
  const loadQueue = `load_r${rep}`;
  await system.prepareQueue(loadQueue);
  let drained = 0;
  const loadWorkers = await system.startWorkers(loadQueue, 'strict', () => {
    drained += 1;
  });
  let producing = true;
  let submitted = 0;
  const t0 = performance.now();
  const producer = (async () => {
    while (producing) {
      const due = Math.floor(((performance.now() - t0) / 1000) * target) - submitted;
      const n = Math.min(due, sizes.bulkPerRequest);
      if (n > 0) {
        await system.submitMany(
          loadQueue,
          Array.from({ length: n }, (_, k) => ({ i: submitted + k })),
        );
        submitted += n;
      }
      await sleep(50);
    }
  })();
  // The load settles into its pace before the probe starts.
  await sleep(sizes.loadSettleMs);
  const drainedBefore = drained;
  const probeStart = performance.now();
  try {
    await pickup(system, `pickupload_r${rep}`, sizes, 9_000 + rep, rec, PICKUP_LOADED);
  } finally {
    producing = false;
    await producer;
  }
  const achieved = (drained - drainedBefore) / ((performance.now() - probeStart) / 1000);
  await loadWorkers.stop();
  await system.discard(loadQueue);
  rec.record(PICKUP_LOADED, 'load drained', system.name, achieved);
  log(
    `  ${system.name}: load drained ${formatNumber(achieved)} tasks/s during the probe (target ${formatNumber(target)}: half the strict drain rate)`,
  );
}

/** The CPU and statement time the benchmark can attribute to `system` so far. */
async function costReading(system: BenchSystem, postgres: Postgres): Promise<CostReading> {
  const bench = process.cpuUsage();
  return {
    serverMs: await system.serverCpuMs(),
    benchMs: (bench.user + bench.system) / 1000,
    execMs: (await postgres.statements(system.database))?.execMs ?? Number.NaN,
    at: performance.now(),
  };
}

/**
 * Shape 7: the strict drain of shape 3 while `sizes.heldLeases` long tasks stay leased and
 * heartbeat at the worker's renew interval. Its rate is given relative to shape 3's, and to the
 * geometric mean of two strict drains of the same size run in this shape, one just before the
 * leases are taken and one just after they are released: shape 3 ran minutes earlier, this VM's
 * speed drifts by more than the 10 % the target allows over minutes, and the pair brackets a
 * drift that is linear over the three drains. One drain still differs from its neighbour by up
 * to ±20 % on a quiet machine (bench/README.md, "Heartbeats: the cost under the noise"), so the
 * cost is also measured without a race: after the drain the leases stay held for
 * `sizes.heldIdleIntervals` whole renew intervals with nothing else running, and the server's,
 * the workers' and PostgreSQL's statements' time per second there is divided by the machine's
 * busy CPU per second during the drain beside them — the share of what the drain used that the
 * heartbeats alone take.
 */
async function heartbeats(
  system: BenchSystem,
  postgres: Postgres,
  rep: number,
  sizes: Sizes,
  rec: Recorder,
): Promise<void> {
  if (system.holdLeases === undefined) {
    log(`  ${system.name}: no lease renewal to load (its locks are never extended); not measured`);
    return;
  }
  const baseline = await strictRate(system, postgres, rep, sizes, rec);
  const adjacentDrain = (queue: string): Promise<DrainResult> =>
    drain(system, postgres, queue, 'strict', sizes, new Recorder());
  log(`  ${system.name}: the adjacent strict drain before the leases are taken`);
  const before = await adjacentDrain(`adjacent_r${rep}`);
  const held = await system.holdLeases(`held_r${rep}`, sizes.heldLeases);
  let beside: DrainResult;
  let renewals: number;
  let seconds: number;
  let heldCost = NO_COST;
  try {
    const renewalsBefore = await held.renewals();
    const t0 = performance.now();
    beside = await drain(system, postgres, `beside_r${rep}`, 'strict', sizes, rec, HEARTBEATS);
    // The leases were taken within about a second of each other, so they heartbeat in rounds;
    // a window of any other length holds one round more or less depending on its phase (153
    // against 195 heartbeats/s for the same 2 000 leases). Each lease renews exactly once per
    // interval, so a window of whole intervals counts every one of them once per interval.
    const interval = held.renewIntervalMs;
    if (sizes.wholeIntervals) {
      const elapsed = performance.now() - t0;
      await sleep(Math.ceil(elapsed / interval) * interval - elapsed);
    }
    renewals = (await held.renewals()) - renewalsBefore;
    seconds = (performance.now() - t0) / 1000;
    if (sizes.heldIdleIntervals > 0) {
      log(
        `  ${system.name}: the ${sizes.heldLeases} leases held with nothing else running for ${sizes.heldIdleIntervals} renew intervals`,
      );
      const from = await costReading(system, postgres);
      await sleep(sizes.heldIdleIntervals * interval);
      heldCost = costPerS(from, await costReading(system, postgres));
    }
  } finally {
    await held.stop();
  }
  log(`  ${system.name}: the adjacent strict drain after the leases are released`);
  const after = await adjacentDrain(`after_r${rep}`);
  const vsAdjacent = ratioToBracket(beside.rate, before.rate, after.rate);
  const share = heldCost.total / beside.machineBusyMsPerS;
  rec.record(HEARTBEATS, 'rate vs strict', system.name, beside.rate / baseline);
  rec.record(HEARTBEATS, 'rate vs adjacent strict', system.name, vsAdjacent);
  rec.record(HEARTBEATS, 'heartbeats', system.name, renewals / seconds);
  rec.record(HEARTBEATS, 'heartbeat CPU share', system.name, share);
  log(
    `  ${system.name}: ${formatNumber(beside.rate / baseline)} × shape 3's strict drain rate, ${formatNumber(vsAdjacent)} × the adjacent ones (${formatNumber(before.rate)} before, ${formatNumber(after.rate)} after; CPU time stolen in the three drains: ${[before, beside, after].map((d) => formatNumber(100 * d.stolenShare)).join(', ')} %), beside ${sizes.heldLeases} held leases (${formatNumber(renewals / seconds)} heartbeats/s); held alone they took ${formatNumber(heldCost.total)} ms of CPU per s (server ${formatNumber(heldCost.server)}, workers ${formatNumber(heldCost.workers)}, PostgreSQL statements ${formatNumber(heldCost.statements)}), ${formatNumber(share)} of the machine's ${formatNumber(beside.machineBusyMsPerS)} ms/s during the drain`,
  );
}

// ---------------------------------------------------------------------------------------------
// Report

function table(rec: Recorder): string {
  const header = ['shape', 'metric', ...SYSTEM_NAMES, 'Ledgence / best peer'];
  const measured = METRICS.filter((spec) =>
    SYSTEM_NAMES.some((name) => !Number.isNaN(rec.summary(spec.shape, spec.metric, name).median)),
  );
  const rows = measured.map((spec) => {
    const cells = SYSTEM_NAMES.map((name) =>
      formatSummary(rec.summary(spec.shape, spec.metric, name)),
    );
    const ledgence = rec.summary(spec.shape, spec.metric, 'ledgence').median;
    const { best, ratio } = ratioToBest(
      ledgence,
      rec.peerMedians(spec.shape, spec.metric),
      spec.better,
    );
    const ratioCell = best === undefined || spec.context ? '–' : `${formatNumber(ratio)} (${best})`;
    const arrow = spec.context ? '' : spec.better === 'higher' ? ' ↑' : ' ↓';
    const metric = spec.unit === '' ? spec.metric : `${spec.metric} ${spec.unit}`;
    return [spec.shape, `${metric}${arrow}`, ...cells, ratioCell];
  });
  const lines = [header, header.map(() => '---'), ...rows].map(
    (cells) => `| ${cells.join(' | ')} |`,
  );
  return lines.join('\n');
}

/** Issue 7's throughput target: this many times the best peer's rate. */
const TARGET_RATIO = 1.2;
const THROUGHPUT_SHAPES = [
  'single submit, 1 in flight',
  'single submit, 8 in flight',
  'bulk submit, 1 000 per request',
  STRICT,
  'drain batched',
];

/** A throughput shape's CPU budget at the target rate, and what the systems spent per task. */
interface ShapeBudget extends CpuBudget {
  shape: string;
  bestPeer: string;
  bestPeerRate: number;
  /** The machine's busy CPU per task, ms (medians). */
  ledgenceMs: number;
  bestPeerMs: number;
}

/**
 * For each throughput shape where Ledgence and a peer ran: the CPU per task this machine's CPUs
 * allow at {@link TARGET_RATIO} × the best peer's rate, against the machine CPU Ledgence spent
 * (bench/README.md, "The CPU budget of each target").
 */
function budgets(rec: Recorder, cpuCount: number): ShapeBudget[] {
  return THROUGHPUT_SHAPES.flatMap((shape) => {
    // ratioToBest picks the fastest peer; Ledgence's own rate plays no part in the budget.
    const { best, bestValue } = ratioToBest(Number.NaN, rec.peerMedians(shape, 'rate'), 'higher');
    const ledgenceMs = rec.summary(shape, 'machine CPU', 'ledgence').median;
    if (best === undefined || Number.isNaN(ledgenceMs)) return [];
    return [
      {
        shape,
        bestPeer: best,
        bestPeerRate: bestValue,
        ledgenceMs,
        bestPeerMs: rec.summary(shape, 'machine CPU', best as SystemName).median,
        ...cpuBudget(TARGET_RATIO * bestValue, cpuCount, ledgenceMs),
      },
    ];
  });
}

/** The lines printed after the table: one per throughput shape, none without a peer. */
function formatBudgets(list: readonly ShapeBudget[], cpuCount: number): string[] {
  if (list.length === 0) return [];
  return [
    `CPU budget at ${TARGET_RATIO}× the best peer's rate (${cpuCount} CPUs give ${cpuCount * 1000} ms of CPU a second), against the machine CPU spent per task:`,
    ...list.map(
      (b) =>
        `  ${b.shape}: ${formatNumber(b.targetRate)} tasks/s allows ${formatNumber(b.budgetMs)} ms/task; Ledgence spent ${formatNumber(b.ledgenceMs)} (${formatNumber(b.overBudget)}× the budget), ${b.bestPeer} ${formatNumber(b.bestPeerMs)}`,
    ),
  ];
}

// ---------------------------------------------------------------------------------------------
// Main

async function main(): Promise<void> {
  const options = parseArgs(process.argv.slice(2));
  const sizes = sizesFor(options.mode);
  const main = serverEntry(root);
  const startedAt = new Date();
  const loadAverageAtStart = loadavg().map((l) => Number(l.toFixed(2)));
  log(`Ledgence benchmark: ${MODE_TITLES[options.mode]}, ${options.reps} repetition(s)`);

  // Installed before anything starts, so a signal at any point stops what has started so far.
  const started: { server?: ServerProcess; postgres?: Postgres } = {};
  const stopProcesses = once(async () => {
    await started.server?.stop();
    await started.postgres?.stop();
  });
  interruption = stopOnSignals(stopProcesses, {
    what:
      process.env.DATABASE_URL === undefined
        ? 'the Ledgence server and the embedded PostgreSQL'
        : 'the Ledgence server',
    log,
  });
  const postgres = await startPostgres(dataDir, process.env.DATABASE_URL);
  started.postgres = postgres;
  const pgVersion = await postgres.version();
  if (postgres.statementsUnavailable !== undefined) log(postgres.statementsUnavailable);
  log(`PostgreSQL ${pgVersion} ready`);
  const databases: Record<SystemName, string> = {
    ledgence: 'bench_ledgence',
    'pg-boss': 'bench_pgboss',
    'graphile-worker': 'bench_graphile',
  };
  for (const database of Object.values(databases)) await postgres.recreate(database);

  const systems: BenchSystem[] = [];
  const rec = new Recorder();
  const rss: { rep: number; bytes: number }[] = [];
  try {
    const server = await startServer(main, { DATABASE_URL: postgres.urlFor(databases.ledgence) });
    started.server = server;
    log(`Ledgence server pid ${server.pid} at ${server.url}`);
    if (options.systems.includes('ledgence')) {
      // A smoke run checks that the shapes run, not the counters: it skips the statistics flush.
      systems.push(
        ledgenceSystem(server, databases.ledgence, {
          statsFlushWaitMs: options.mode === 'smoke' ? 0 : undefined,
          databaseUrl: postgres.urlFor(databases.ledgence),
        }),
      );
    }
    if (options.systems.includes('pg-boss')) {
      systems.push(await pgBossSystem(postgres.urlFor(databases['pg-boss']), databases['pg-boss']));
    }
    if (options.systems.includes('graphile-worker')) {
      systems.push(
        await graphileSystem(
          postgres.urlFor(databases['graphile-worker']),
          databases['graphile-worker'],
        ),
      );
    }

    for (let rep = 1; rep <= options.reps; rep += 1) {
      // Each repetition starts with another system, and no system always follows the same one.
      const order = systemOrder(systems, rep);
      const each = async (
        name: ShapeName,
        title: string,
        fn: (system: BenchSystem) => Promise<unknown>,
      ) => {
        if (!options.shapes.includes(name)) return;
        log(`rep ${rep}/${options.reps} · ${title}`);
        for (const system of order) await fn(system);
      };
      await each('single1', `single submit, ${sizes.single} tasks, 1 in flight`, (s) =>
        singleSubmit(s, postgres, `single1_r${rep}`, sizes.single, 1, rec),
      );
      await each('single8', `single submit, ${sizes.single} tasks, 8 in flight`, (s) =>
        singleSubmit(s, postgres, `single8_r${rep}`, sizes.single, 8, rec),
      );
      await each(
        'bulk',
        `bulk submit, ${sizes.bulk} tasks, ${sizes.bulkPerRequest} per request`,
        (s) => bulkSubmit(s, postgres, `bulk_r${rep}`, sizes, rec),
      );
      await each('strict', `drain strict, ${sizes.drain} no-op tasks, ≤ 32 held`, (s) =>
        drain(s, postgres, `strict_r${rep}`, 'strict', sizes, rec),
      );
      await each('batched', `drain batched, ${sizes.drain} no-op tasks`, (s) =>
        drain(s, postgres, `batched_r${rep}`, 'batched', sizes, rec),
      );
      await each(
        'pickup',
        `pickup latency, ${sizes.pickup} tasks, 0–${sizes.pickupMaxGapMs} ms gaps`,
        (s) => pickup(s, `pickup_r${rep}`, sizes, 7_000 + rep, rec),
      );
      await each(
        'pickupload',
        `pickup latency under load, ${sizes.pickup} tasks beside a drain at half the strict rate`,
        (s) => pickupUnderLoad(s, postgres, rep, sizes, rec),
      );
      await each(
        'heartbeats',
        `drain strict, ${sizes.drain} no-op tasks, beside ${sizes.heldLeases} heartbeating leases`,
        (s) => heartbeats(s, postgres, rep, sizes, rec),
      );
      const bytes = await server.rss();
      rss.push({ rep, bytes });
      log(`rep ${rep} done; Ledgence server RSS ${formatNumber(bytes / 2 ** 20)} MiB`);
    }
  } finally {
    for (const system of systems) await system.close().catch(() => {});
    await stopProcesses();
  }
  interruption.dispose();

  const printed = table(rec);
  console.log(`\n${printed}\n`);
  console.log(
    '↑ higher is better, ↓ lower is better; cells are median [min–max] of the repetitions.',
  );
  // Memory flatness compares the last two repetitions (the 2nd and 3rd of a full run): the
  // first one includes warm-up (JIT, pools, caches).
  const last = rss.at(-1);
  const previous = rss.at(-2);
  const rssLine =
    last !== undefined && previous !== undefined
      ? `Ledgence server RSS after repetition ${previous.rep}: ${formatNumber(previous.bytes / 2 ** 20)} MiB, after ${last.rep}: ${formatNumber(last.bytes / 2 ** 20)} MiB (${formatNumber(((last.bytes - previous.bytes) / previous.bytes) * 100)} %)`
      : `Ledgence server RSS: ${rss.map((r) => `after repetition ${r.rep} ${formatNumber(r.bytes / 2 ** 20)} MiB`).join(', ')}`;
  console.log(rssLine);
  const cpuCount = cpus().length;
  const budgetList = budgets(rec, cpuCount);
  for (const line of formatBudgets(budgetList, cpuCount)) console.log(line);
  for (const note of rec.notes) console.log(`note: ${note}`);

  const machine = {
    cpus: cpuCount,
    cpuModel: cpus()[0]?.model ?? 'unknown',
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    freeMemoryGiBAtEnd: Math.round(freemem() / 2 ** 30),
    loadAverageAtStart,
    loadAverageAtEnd: loadavg().map((l) => Number(l.toFixed(2))),
    node: process.version,
    postgres: pgVersion,
    platform: `${process.platform}-${process.arch}`,
  };
  const results = {
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    mode: options.mode,
    repetitions: options.reps,
    shapes: options.shapes,
    systems: options.systems,
    sizes,
    machine,
    postgresSource: process.env.DATABASE_URL === undefined ? 'embedded (fsync on)' : 'DATABASE_URL',
    statementCounts:
      postgres.statementsUnavailable ??
      'pg_stat_statements: top-level statements, utility included',
    configuration: Object.fromEntries(
      systems.map((s) => [
        s.name,
        {
          strict: s.describe('strict'),
          batched: s.describe('batched'),
          pickup: s.describe('pickup'),
        },
      ]),
    ),
    metrics: METRICS.map((spec) => {
      const bySystem = Object.fromEntries(
        SYSTEM_NAMES.map((name) => [name, rec.summary(spec.shape, spec.metric, name)]),
      );
      const { best, ratio } = ratioToBest(
        bySystem.ledgence?.median ?? Number.NaN,
        rec.peerMedians(spec.shape, spec.metric),
        spec.better,
      );
      return {
        ...spec,
        systems: bySystem,
        bestPeer: spec.context ? null : (best ?? null),
        ratioToBestPeer: spec.context ? null : ratio,
      };
    }),
    serverRssBytes: rss,
    cpuBudget: budgetList,
    notes: rec.notes,
    table: printed,
  };
  // Built in every mode, so that CI's smoke run checks the serialization a full run ends with.
  const text = resultsJson(results);
  // A smoke run's numbers mean nothing: it must never replace the recorded results.
  if (options.mode === 'smoke') {
    log(`smoke run: ${text.length} bytes of results built, not written`);
    return;
  }
  await mkdir(join(benchDir, 'results'), { recursive: true });
  const file = join(benchDir, 'results', 'latest.json');
  await writeFile(file, text);
  log(`wrote ${file}`);
}

// Set by main() before it starts anything. After a signal its handler ends the process
// (with 130 or 143) once the server and PostgreSQL are down; what the interrupted run then
// throws or returns is not the outcome.
let interruption: SignalStop | undefined;

main().then(
  () => {
    if (interruption?.signal === undefined) process.exit(0);
  },
  (error: unknown) => {
    if (interruption?.signal !== undefined) return;
    console.error(error);
    process.exit(1);
  },
);
