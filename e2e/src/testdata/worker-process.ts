/**
 * A worker process for the end-to-end tests: the real `Worker` of
 * `@ledgence/worker` in its own Node process, so a test can SIGKILL it
 * mid-task. It reports every execution on stdout as one JSON line:
 *   {"event":"ready","worker":…}
 *   {"event":"start","worker":…,"task_id":…,"attempt_id":…,"attempt":…}
 *   {"event":"done", …same fields}
 * and logs the SDK's warnings and errors on stderr.
 *
 * Environment: LEDGENCE_URL, WORKER_NAME, QUEUE, CONCURRENCY (default 8),
 * RENEW_MS (default 250). Program `job` sleeps `data.ms` (default 5 ms) and
 * returns `{ i: data.i }`; with `data.hang_on_attempt: n` attempt n never
 * returns (it waits for its signal), so a test can kill the process mid-task.
 * SIGTERM stops the worker gracefully and exits 0; an unhandled rejection exits 3.
 */
import { Worker } from '@ledgence/worker';

const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`${name} is required`);
  return value;
};

const name = env('WORKER_NAME', `worker-${process.pid}`);
const emit = (event: Record<string, unknown>) =>
  process.stdout.write(`${JSON.stringify({ ...event, worker: name })}\n`);
const stderrLine =
  (level: string) =>
  (message: string, fields?: object): void => {
    process.stderr.write(
      `${Date.now()} ${name} ${level} ${message} ${JSON.stringify(fields ?? {})}\n`,
    );
  };

const worker = new Worker({
  url: env('LEDGENCE_URL'),
  tenant: env('TENANT', 'acme'),
  namespace: env('NAMESPACE', 'e2e'),
  queue: env('QUEUE'),
  concurrency: Number(env('CONCURRENCY', '8')),
  renewIntervalMs: Number(env('RENEW_MS', '250')),
  pollWaitMs: 500,
  requestTimeoutMs: 2_000,
  // Reconnect quickly after a server restart: the tests' leases last 1 s.
  backoff: { baseMs: 20, maxMs: 300 },
  // WORKER_LOG=debug also logs the SDK's debug and info lines (for diagnosing a failure).
  logger: {
    debug: process.env.WORKER_LOG === 'debug' ? stderrLine('debug') : () => {},
    info: process.env.WORKER_LOG === 'debug' ? stderrLine('info') : () => {},
    warn: stderrLine('warn'),
    error: stderrLine('error'),
  },
});

interface JobData {
  i?: number;
  ms?: number;
  hang_on_attempt?: number;
}

worker.register('job', async (raw, ctx) => {
  const data = (raw ?? {}) as JobData;
  const fields = { task_id: ctx.taskId, attempt_id: ctx.attemptId, attempt: ctx.attempt };
  emit({ event: 'start', ...fields });
  if (data.hang_on_attempt === ctx.attempt) {
    await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
    throw ctx.signal.reason;
  }
  await new Promise((resolve) => setTimeout(resolve, data.ms ?? 5));
  emit({ event: 'done', ...fields });
  return { i: data.i ?? null };
});

// The SDK promises no unhandled rejection: one fails the process (and the test's exit-code check).
process.on('unhandledRejection', (reason) => {
  process.stderr.write(`${name} unhandled rejection: ${String(reason)}\n`);
  process.exit(3);
});
process.once('SIGTERM', () => {
  void worker.stop({ graceMs: 5_000 });
});
emit({ event: 'ready' });
worker.run().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(`${name} run() failed: ${String(error)}\n`);
    process.exit(1);
  },
);
