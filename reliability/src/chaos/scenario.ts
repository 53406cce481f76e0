/**
 * T1, the chaos scenario (issue #8): tasks across 2 tenants × 2 namespaces, submitted through
 * a balancer to server replicas while a seeded fault injector kills workers and replicas,
 * stops workers past their lease, terminates database sessions and restarts PostgreSQL; then a
 * bounded drain and the checker. The seed fixes the task mix, the submit order and the fault
 * sequence; process timing is the machine's, so a replay repeats the same pressure, not the
 * same interleaving.
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { prng, RENEW_MS, SHORT_TIMINGS } from '@ledgence/e2e/harness';
import postgres from 'postgres';
import { type CheckResult, check, loadRecord } from './checker.js';
import { Cluster, sleep } from './cluster.js';
import { runFaults } from './faults.js';
import { type ChaosFigures, computeFigures, formatReport } from './figures.js';
import { readJsonl } from './jsonl.js';
import type {
  DeliveryRecord,
  ExecutionRecord,
  FaultRecord,
  FaultType,
  SubmitRecord,
  WorkerScope,
} from './model.js';
import { startReceiver } from './receiver.js';
import { DESTINATION, planSubmits, runSubmitter } from './submitter.js';

/** The fixed default seed (the number), printed by every run. */
export const DEFAULT_SEED = 8;

/** Settings of {@link runChaos}; every field has a default. */
export interface ChaosOptions {
  seed: number;
  /** Distinct tasks to submit. */
  tasks: number;
  /** How long faults are injected; submits are spread over the first three quarters of it. */
  seconds: number;
  replicas: number;
  /** Worker processes. */
  workers: number;
  /** Slots per scope in each worker process. */
  concurrency: number;
  tenants: number;
  namespaces: number;
  /** Fault kinds drawn at random (PostgreSQL restarts are scheduled by `postgresRestarts`). */
  faults: readonly Exclude<FaultType, 'restart_postgres'>[];
  postgresRestarts: number;
  /** Bound on the drain after the faults (a termination bound: what is left is reported). */
  drainSeconds: number;
  /** Keep the run folder (logs, data) even when every check passed. */
  keepLogs: boolean;
  /** Progress lines (default: console.log). */
  say: (line: string) => void;
}

/** The scenario at CI size. */
export const DEFAULT_OPTIONS: ChaosOptions = {
  seed: DEFAULT_SEED,
  tasks: 2_000,
  seconds: 90,
  replicas: 2,
  workers: 4,
  concurrency: 4,
  tenants: 2,
  namespaces: 2,
  faults: ['kill_worker', 'kill_server', 'stop_worker', 'terminate_backends'],
  postgresRestarts: 2,
  drainSeconds: 90,
  keepLogs: false,
  say: (line) => console.log(line),
};

/** What a run found. */
export interface ChaosReport {
  figures: ChaosFigures;
  checks: CheckResult[];
  /** Every check's violations, flattened (empty when the run is clean). */
  violations: string[];
  /** The figures and checks as printed. */
  table: string;
  /** Where the logs are (deleted after a clean run unless `keepLogs`). */
  runDir: string;
}

/** The lease the servers grant in a chaos run ({@link SHORT_TIMINGS}). */
const LEASE_MS = Number(SHORT_TIMINGS.LEDGENCE_LEASE_DURATION_MS);
const QUEUE = 'chaos';
/**
 * How long the faults and submits may run past their period before the run is declared hung.
 * Measured: the phase takes 110–150 s for 90 s of faults (submits that stall until the client's
 * 5 s timeout and retry keep coming for a while after the last fault), so the bound is 240 s —
 * still inside the test's 400 s hook with start-up, the 90 s drain bound and the checks after it.
 */
const PHASE_GRACE_MS = 150_000;

/** The run's scopes: tenants × namespaces, each tenant with its own API key. */
function scopesOf(tenants: number, namespaces: number, seed: number): WorkerScope[] {
  const scopes: WorkerScope[] = [];
  for (let t = 0; t < tenants; t++) {
    for (let n = 0; n < namespaces; n++) {
      scopes.push({
        tenant: `tenant-${t + 1}`,
        namespace: `ns-${n + 1}`,
        apiKey: `chaos-key-${seed}-tenant-${t + 1}`,
      });
    }
  }
  return scopes;
}

/**
 * Runs the chaos scenario and checks it. Every process it started is killed before it returns
 * or throws.
 */
export async function runChaos(overrides: Partial<ChaosOptions> = {}): Promise<ChaosReport> {
  const options: ChaosOptions = { ...DEFAULT_OPTIONS, ...overrides };
  const { seed, say } = options;
  const began = Date.now();
  const runDir = mkdtempSync(join(tmpdir(), `ledgence-chaos-${seed}-`));
  // As root, PostgreSQL runs as an unprivileged user, who must be able to enter the folder.
  chmodSync(runDir, 0o755);
  say(
    `chaos: seed ${seed}, ${options.tasks} tasks, faults for ${options.seconds} s, logs in ${runDir}`,
  );
  // One stream per concern, so adding a fault kind never shifts the task plan.
  const planRandom = prng(seed);
  const faultRandom = prng(seed ^ 0x5eed);
  const scopes = scopesOf(options.tenants, options.namespaces, seed);
  const plan = planSubmits(planRandom, options.tasks, scopes.length, seed);

  const receiver = await startReceiver(join(runDir, 'deliveries.jsonl'));
  const tenants = [...new Set(scopes.map((s) => s.tenant))];
  const cluster = new Cluster({
    runDir,
    replicas: options.replicas,
    workers: options.workers,
    concurrency: options.concurrency,
    scopes,
    queue: QUEUE,
    renewMs: RENEW_MS,
    serverEnv: {
      ...SHORT_TIMINGS,
      LEDGENCE_LOG_LEVEL: 'error',
      LEDGENCE_API_KEYS: JSON.stringify(
        tenants.map((tenant) => ({
          key: scopes.find((s) => s.tenant === tenant)?.apiKey,
          tenant,
          namespaces: ['*'],
          roles: ['client', 'worker'],
        })),
      ),
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        [DESTINATION]: {
          url: receiver.url,
          secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
          timeout_ms: 2_000,
        },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      // A delivery in flight when its replica dies is retried after this lease.
      LEDGENCE_COMPLETION_LEASE_MS: '2000',
    },
  });
  let sql: postgres.Sql | undefined;
  let clean = false;
  try {
    await cluster.start();
    say(
      `chaos: ${options.replicas} replicas, ${options.workers} workers up in ${Date.now() - began} ms`,
    );
    const faultsDone = runFaults({
      cluster,
      random: faultRandom,
      durationMs: options.seconds * 1000,
      kinds: options.faults,
      postgresRestarts: options.postgresRestarts,
      leaseMs: LEASE_MS,
      gapMs: [2_000, 5_000],
      logPath: join(runDir, 'faults.jsonl'),
      say,
    });
    const submitted = runSubmitter({
      url: cluster.url,
      scopes,
      queue: QUEUE,
      plan,
      windowMs: options.seconds * 750,
      parallel: 8,
      logPath: join(runDir, 'submits.jsonl'),
    });
    // Both run to the end even if one fails, so no promise is left unhandled. Bounded: a request
    // the servers never answer would otherwise hang the run past the test's hook timeout, which
    // skips the `finally` below and leaves every process of the cluster running.
    const phaseBoundMs = options.seconds * 1000 + PHASE_GRACE_MS;
    let bound: ReturnType<typeof setTimeout> | undefined;
    const phase = await Promise.race([
      Promise.allSettled([faultsDone, submitted]),
      new Promise<undefined>((resolve) => {
        bound = setTimeout(() => resolve(undefined), phaseBoundMs);
      }),
    ]);
    clearTimeout(bound);
    if (phase === undefined) {
      throw new Error(
        `the fault and submit phase did not end within ${phaseBoundMs / 1000} s: a submit or a fault is hanging (a server that stopped answering?); logs in ${runDir}`,
      );
    }
    const [faultOutcome, submitOutcome] = phase;
    if (faultOutcome.status === 'rejected') throw faultOutcome.reason;
    if (submitOutcome.status === 'rejected') throw submitOutcome.reason;
    const faults = faultOutcome.value;
    const submits = submitOutcome.value;
    say(
      `chaos: faults done; ${submits.acked} submits acked, ${submits.unacknowledged} tasks never acked`,
    );

    // Drain: every task terminal, every delivery made and received, or the bound.
    const drainStart = Date.now();
    sql = postgres(cluster.database.url, { max: 2, onnotice: () => {} });
    const db = sql;
    const pending = async () => {
      const [row] = await db<{ tasks: number; deliveries: number }[]>`
        select (select count(*)::int from tasks where state not in ('succeeded','failed','cancelled')) as tasks,
               (select count(*)::int from completion_deliveries where state <> 'delivered') as deliveries`;
      const events = await db<
        { event_id: string }[]
      >`select event_id from completion_subscriptions`;
      const unreceived = events.filter((e) => !receiver.ids.has(e.event_id)).length;
      return { tasks: row?.tasks ?? 0, deliveries: row?.deliveries ?? 0, unreceived };
    };
    let left = await pending();
    while (left.tasks + left.deliveries + left.unreceived > 0) {
      if (Date.now() - drainStart > options.drainSeconds * 1000) {
        say(`chaos: drain bound reached with ${JSON.stringify(left)}`);
        break;
      }
      await sleep(250);
      left = await pending();
    }
    const drainMs = Date.now() - drainStart;
    await cluster.stopWorkers();

    const logs = {
      submits: readJsonl<SubmitRecord>(join(runDir, 'submits.jsonl')),
      executions: cluster.workerLogs().flatMap((path) => readJsonl<ExecutionRecord>(path)),
      deliveries: readJsonl<DeliveryRecord>(join(runDir, 'deliveries.jsonl')),
      faults: readJsonl<FaultRecord>(join(runDir, 'faults.jsonl')),
    };
    const record = await loadRecord(db);
    const checks = check(
      {
        ...logs,
        unexpectedExits: cluster.exits.unexpected,
        unrecoveredRestarts: faults.unrecovered,
      },
      record,
    );
    const figures = computeFigures(
      {
        seed,
        durationS: (Date.now() - began) / 1000,
        faultSeconds: options.seconds,
        drainMs,
        postgresRecoveryMs: faults.recoveryMs,
        submitsFailed: submits.failed,
      },
      logs,
      record,
      checks,
    );
    const table = formatReport(figures, checks);
    const violations = checks.flatMap((c) => c.examples.map((e) => `${c.name}: ${e}`));
    clean = figures.violations === 0;
    return { figures, checks, violations, table, runDir };
  } finally {
    await sql?.end({ timeout: 5 });
    await cluster.close();
    await receiver.close();
    if (clean && !options.keepLogs) rmSync(runDir, { recursive: true, force: true });
  }
}
