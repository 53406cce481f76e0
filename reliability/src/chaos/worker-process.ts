/**
 * A chaos worker process: the real SDK `Worker`, one per scope (tenant × namespace) of the run,
 * in its own Node process so the fault injector can SIGKILL, SIGSTOP and SIGCONT it. It appends
 * every execution to its JSONL log (`start`, then `end` with the outcome it produced) and prints
 * one `ready` line on stdout once its workers run.
 *
 * Environment: LEDGENCE_URL, WORKER_NAME, LOG_PATH, SCOPES (JSON `WorkerScope[]`), QUEUE,
 * CONCURRENCY (per scope), RENEW_MS. SIGTERM stops gracefully and exits 0; an unhandled rejection
 * exits 3 (the run reports it as a process that exited on its own).
 */
import { ApplicationError, type Logger, Worker } from '@ledgence/worker';
import { JsonlLog } from './jsonl.js';
import type { ExecutionRecord, JobData, WorkerScope } from './model.js';

const env = (name: string): string => {
  const value = process.env[name];
  if (value === undefined) throw new Error(`${name} is required`);
  return value;
};

const name = env('WORKER_NAME');
const log = new JsonlLog(env('LOG_PATH'));
const scopes = JSON.parse(env('SCOPES')) as WorkerScope[];
const line =
  (level: string) =>
  (message: string, fields?: object): void => {
    process.stderr.write(`${Date.now()} ${name} ${level} ${message} ${JSON.stringify(fields)}\n`);
  };
// Warnings are expected by the hundred under faults; they go to the run's stderr file for
// diagnosis, not to the console.
const logger: Logger = {
  debug: () => {},
  info: () => {},
  warn: line('warn'),
  error: line('error'),
};

const workers = scopes.map((scope) => {
  const worker = new Worker({
    url: env('LEDGENCE_URL'),
    apiKey: scope.apiKey,
    tenant: scope.tenant,
    namespace: scope.namespace,
    queue: env('QUEUE'),
    concurrency: Number(env('CONCURRENCY')),
    renewIntervalMs: Number(env('RENEW_MS')),
    pollWaitMs: 500,
    requestTimeoutMs: 2_000,
    // Reconnect quickly after a server or database restart: leases last about a second.
    backoff: { baseMs: 20, maxMs: 300 },
    logger,
  });
  worker.register('job', async (raw, ctx) => {
    const data = raw as JobData;
    const record = (event: 'start' | 'end', extra: Partial<ExecutionRecord> = {}) =>
      log.append({
        event,
        worker: name,
        pid: process.pid,
        task_id: ctx.taskId,
        attempt_id: ctx.attemptId,
        attempt: ctx.attempt,
        at: Date.now(),
        ...extra,
      } satisfies ExecutionRecord);
    record('start');
    // The handler ignores ctx.signal on purpose, like careless user code: a worker resumed
    // after SIGSTOP finishes the work and tries to settle on a lease that has long expired.
    await new Promise((resolve) => setTimeout(resolve, data.ms));
    const fail = data.fail === 'always' || (data.fail === 'once' && ctx.attempt === 1);
    record('end', { outcome: fail ? 'error' : 'ok' });
    if (fail) throw new ApplicationError('chaos_failure', `planned failure (${data.fail})`);
    return { i: data.i };
  });
  return worker;
});

process.on('unhandledRejection', (reason) => {
  process.stderr.write(`${name} unhandled rejection: ${String(reason)}\n`);
  process.exit(3);
});
process.once('SIGTERM', () => {
  void Promise.all(workers.map((w) => w.stop({ graceMs: 2_000 })));
});
process.stdout.write('ready\n');
Promise.all(workers.map((w) => w.run())).then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(`${name} run() failed: ${String(error)}\n`);
    process.exit(1);
  },
);
