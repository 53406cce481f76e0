/** The figures a chaos run prints: counts, latencies and throughput, as a compact table. */
import type { CheckResult, DatabaseRecord } from './checker.js';
import type {
  DeliveryRecord,
  ExecutionRecord,
  FaultRecord,
  FaultType,
  SubmitRecord,
} from './model.js';
import { FAULT_TYPES } from './model.js';

/** The figures of one run. */
export interface ChaosFigures {
  seed: number;
  durationS: number;
  faultSeconds: number;
  faults: Record<FaultType, number>;
  tasks: number;
  submits: {
    acked: number;
    /** Distinct planned tasks (scope and key) acknowledged at least once. */
    keys: number;
    repeats: number;
    repeatsAcrossServerKill: number;
    failed: number;
  };
  executions: number;
  /** Executions of attempts that ended without an accepted settlement (at-least-once's cost). */
  duplicateExecutions: number;
  lostAttempts: number;
  /**
   * Tasks that failed although their program does not always fail, by failure kind: work lost
   * to infrastructure (leases lost, or the SDK giving up on an attempt before running it).
   */
  unplannedFailures: Record<string, number>;
  /** From a lease's expiry to its recovery (`lease_expired` recorded), ms. */
  recoveryLagMs: { p50: number; p99: number; max: number };
  /** From a lost lease's expiry to the task's next claim, ms. */
  releaseMs: { p50: number; p99: number; max: number };
  /** Tasks settled per second, from the first submit to the last terminal state. */
  throughput: number;
  subscriptions: number;
  deliveryPosts: number;
  postgresRecoveryMs: number[];
  drainMs: number;
  violations: number;
}

function summarise(sorted: readonly number[]): { p50: number; p99: number; max: number } {
  return {
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    max: sorted[sorted.length - 1] ?? 0,
  };
}

/** Nearest-rank percentile of ascending `sorted` (0 when empty). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? 0;
}

/** Inputs of {@link computeFigures} beyond the logs and the database. */
export interface FigureContext {
  seed: number;
  durationS: number;
  faultSeconds: number;
  drainMs: number;
  postgresRecoveryMs: number[];
  submitsFailed: number;
}

/** Computes the figures from the logs and the database's record. */
export function computeFigures(
  context: FigureContext,
  logs: {
    submits: SubmitRecord[];
    executions: ExecutionRecord[];
    deliveries: DeliveryRecord[];
    faults: FaultRecord[];
  },
  record: DatabaseRecord,
  checks: CheckResult[],
): ChaosFigures {
  const faults = Object.fromEntries(FAULT_TYPES.map((t) => [t, 0])) as Record<FaultType, number>;
  for (const f of logs.faults) faults[f.type] += 1;

  const acks = logs.submits.filter((s) => s.event === 'ack');
  const serverKills = logs.faults.filter((f) => f.type === 'kill_server').map((f) => f.at);
  const firstAck = new Map<string, number>();
  let repeatsAcrossServerKill = 0;
  for (const ack of acks) {
    const first = firstAck.get(ack.key);
    if (first === undefined) firstAck.set(ack.key, ack.at);
    else if (serverKills.some((k) => k > first && k < ack.at)) repeatsAcrossServerKill += 1;
  }

  const attempts = new Map<string, { state: string; accepted: boolean }>();
  const release: number[] = [];
  let lostAttempts = 0;
  for (const rows of record.attempts.values()) {
    rows.forEach((a, i) => {
      attempts.set(a.attempt_id, { state: a.state, accepted: a.accepted_at !== null });
      if (a.state !== 'lost') return;
      lostAttempts += 1;
      const next = rows[i + 1];
      if (next !== undefined) release.push(next.claimed_at - a.lease_expires_at);
    });
  }
  release.sort((a, b) => a - b);
  const expiryOf = new Map<string, number>();
  for (const rows of record.attempts.values()) {
    for (const a of rows) expiryOf.set(a.attempt_id, a.lease_expires_at);
  }
  const lag: number[] = [];
  for (const events of record.history.values()) {
    for (const e of events) {
      const expiry = e.attempt_id === null ? undefined : expiryOf.get(e.attempt_id);
      if (e.reason === 'lease_expired' && expiry !== undefined) lag.push(e.at - expiry);
    }
  }
  lag.sort((a, b) => a - b);
  const starts = logs.executions.filter((e) => e.event === 'start');
  const duplicateExecutions = starts.filter((e) => !attempts.get(e.attempt_id)?.accepted).length;

  const unplannedFailures: Record<string, number> = {};
  for (const task of record.tasks.values()) {
    if (task.state !== 'failed' || task.data.fail === 'always') continue;
    const kind = [task.failure_kind, task.execution_kind].filter((k) => k !== null).join('/');
    unplannedFailures[kind] = (unplannedFailures[kind] ?? 0) + 1;
  }

  let first = Number.POSITIVE_INFINITY;
  let last = 0;
  let terminal = 0;
  for (const task of record.tasks.values()) {
    first = Math.min(first, task.submitted_at);
    if (task.terminal_at !== null) {
      terminal += 1;
      last = Math.max(last, task.terminal_at);
    }
  }
  return {
    seed: context.seed,
    durationS: context.durationS,
    faultSeconds: context.faultSeconds,
    faults,
    tasks: record.tasks.size,
    submits: {
      acked: acks.length,
      keys: new Set(acks.map((a) => JSON.stringify([a.tenant, a.namespace, a.key]))).size,
      repeats: acks.filter((a) => a.repeat).length,
      repeatsAcrossServerKill,
      failed: context.submitsFailed,
    },
    executions: starts.length,
    duplicateExecutions,
    lostAttempts,
    unplannedFailures,
    recoveryLagMs: summarise(lag),
    releaseMs: summarise(release),
    throughput: last > first ? terminal / ((last - first) / 1000) : 0,
    subscriptions: record.subscriptions.length,
    deliveryPosts: logs.deliveries.length,
    postgresRecoveryMs: context.postgresRecoveryMs,
    drainMs: context.drainMs,
    violations: checks.reduce((n, c) => n + c.violations, 0),
  };
}

/** The figures and the checks as a compact two-column table. */
export function formatReport(figures: ChaosFigures, checks: CheckResult[]): string {
  const rows: [string, string][] = [
    ['seed', String(figures.seed)],
    [
      'duration',
      `${figures.durationS.toFixed(1)} s (faults for ${figures.faultSeconds} s, drain ${(figures.drainMs / 1000).toFixed(1)} s)`,
    ],
    ['faults', FAULT_TYPES.map((t) => `${t} ${figures.faults[t]}`).join(', ')],
    ['tasks', String(figures.tasks)],
    [
      'submits acked',
      `${figures.submits.acked} (repeats ${figures.submits.repeats}, across a server kill ${figures.submits.repeatsAcrossServerKill}, failed after retries ${figures.submits.failed})`,
    ],
    ['executions', `${figures.executions} (duplicates ${figures.duplicateExecutions})`],
    ['lost attempts', String(figures.lostAttempts)],
    [
      'unplanned failures',
      Object.entries(figures.unplannedFailures)
        .map(([kind, n]) => `${kind} ${n}`)
        .join(', ') || '0',
    ],
    [
      'recovery lag',
      `p50 ${figures.recoveryLagMs.p50} ms, p99 ${figures.recoveryLagMs.p99} ms, max ${figures.recoveryLagMs.max} ms`,
    ],
    [
      're-lease latency',
      `p50 ${figures.releaseMs.p50} ms, p99 ${figures.releaseMs.p99} ms, max ${figures.releaseMs.max} ms`,
    ],
    ['throughput', `${figures.throughput.toFixed(1)} tasks/s`],
    ['deliveries', `${figures.subscriptions} subscriptions, ${figures.deliveryPosts} POSTs`],
    ['pg recovery', figures.postgresRecoveryMs.map((ms) => `${ms} ms`).join(', ') || '-'],
    ['violations', String(figures.violations)],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  const lines = rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`);
  for (const c of checks) {
    lines.push(
      `  ${c.violations === 0 ? 'ok  ' : 'FAIL'} ${c.name}${c.violations === 0 ? '' : ` (${c.violations})`}`,
    );
    for (const example of c.examples) lines.push(`         e.g. ${example}`);
  }
  return lines.join('\n');
}
