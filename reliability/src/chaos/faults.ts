/**
 * The fault injector: for the run's duration, one fault every 2–5 s, drawn from a seeded PRNG.
 * The first faults are one of each non-database kind in a seeded order, so even a short run
 * covers the mix; PostgreSQL restarts come at fixed fractions of the duration (the issue asks
 * for exactly two). Faults run one at a time and each is logged once it has been injected and
 * undone (a killed process restarted, a stopped one continued).
 */
import type { Cluster } from './cluster.js';
import { sleep } from './cluster.js';
import { JsonlLog } from './jsonl.js';
import type { FaultRecord, FaultType } from './model.js';

/** Settings of {@link runFaults}. */
export interface FaultOptions {
  cluster: Cluster;
  random: () => number;
  /** How long to inject faults. */
  durationMs: number;
  /** Fault kinds to draw from (PostgreSQL restarts are scheduled separately). */
  kinds: readonly Exclude<FaultType, 'restart_postgres'>[];
  /** How many immediate PostgreSQL restarts, spread evenly over the duration. */
  postgresRestarts: number;
  /** The servers' lease duration: a stopped worker stays stopped past it. */
  leaseMs: number;
  /** Gap between faults, drawn uniformly from this range. */
  gapMs: readonly [number, number];
  logPath: string;
  /** Progress lines. */
  say: (line: string) => void;
}

/** What the injector did. */
export interface FaultSummary {
  faults: FaultRecord[];
  /** After each PostgreSQL restart, how long until every replica was ready again. */
  recoveryMs: number[];
  /** Restarts after which a replica did not become ready within the bound. */
  unrecovered: number;
}

const READY_BOUND_MS = 60_000;

/** Injects faults until `durationMs` has passed; returns the log of what was done. */
export async function runFaults(options: FaultOptions): Promise<FaultSummary> {
  const { cluster, random, durationMs } = options;
  const log = new JsonlLog(options.logPath);
  const opening = [...options.kinds];
  for (let i = opening.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [opening[i], opening[j]] = [
      opening[j] as (typeof opening)[number],
      opening[i] as (typeof opening)[number],
    ];
  }
  const restartsAt = Array.from(
    { length: options.postgresRestarts },
    (_, k) => ((k + 1) * durationMs) / (options.postgresRestarts + 1),
  );
  const summary: FaultSummary = { faults: [], recoveryMs: [], unrecovered: 0 };
  const started = Date.now();
  for (;;) {
    // Exactly four draws per fault, used or not, so the seed fixes every fault's gap, kind,
    // target and length whatever the timing; timing decides only where the restarts fall.
    const [gapRoll, kindRoll, targetRoll, lengthRoll] = [random(), random(), random(), random()];
    const [low, high] = options.gapMs;
    await sleep(low + gapRoll * (high - low));
    const elapsed = Date.now() - started;
    if (elapsed >= durationMs) break;
    const restart = restartsAt[0] !== undefined && elapsed >= restartsAt[0];
    if (restart) restartsAt.shift();
    const type: FaultType = restart
      ? 'restart_postgres'
      : (opening.shift() ??
        (options.kinds[Math.floor(kindRoll * options.kinds.length)] as FaultType));
    const at = Date.now();
    const record: FaultRecord = { type, at, took_ms: 0 };
    switch (type) {
      case 'kill_worker': {
        const target = Math.floor(targetRoll * cluster.options.workers);
        record.target = target;
        await cluster.killWorker(target);
        await cluster.startWorker(target);
        break;
      }
      case 'kill_server': {
        const target = Math.floor(targetRoll * cluster.options.replicas);
        record.target = target;
        await cluster.killReplica(target);
        await cluster.startReplica(target);
        break;
      }
      case 'stop_worker': {
        const target = Math.floor(targetRoll * cluster.options.workers);
        const pausedMs = options.leaseMs + 500 + Math.floor(lengthRoll * 1_500);
        record.target = target;
        record.detail = `stopped ${pausedMs} ms`;
        cluster.pauseWorker(target, true);
        await sleep(pausedMs);
        cluster.pauseWorker(target, false);
        break;
      }
      case 'terminate_backends':
        record.detail = `${await cluster.database.terminateBackends()} sessions`;
        break;
      case 'restart_postgres': {
        await cluster.database.restartImmediate();
        const restarted = Date.now();
        const bound = restarted + READY_BOUND_MS;
        while (!(await cluster.ready()) && Date.now() < bound) await sleep(50);
        if (Date.now() < bound) summary.recoveryMs.push(Date.now() - restarted);
        else summary.unrecovered += 1;
        record.detail = `replicas ready after ${Date.now() - restarted} ms`;
        break;
      }
    }
    record.took_ms = Date.now() - at;
    log.append(record);
    summary.faults.push(record);
    options.say(
      `fault ${summary.faults.length} at ${((at - started) / 1000).toFixed(1)} s: ${type}` +
        `${record.target === undefined ? '' : ` #${record.target}`}` +
        `${record.detail === undefined ? '' : ` (${record.detail})`} in ${record.took_ms} ms`,
    );
  }
  return summary;
}
