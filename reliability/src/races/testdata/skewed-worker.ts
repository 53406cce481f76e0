/**
 * A worker process for the skewed-clock races: the real SDK `Worker`, run with
 * `testdata/skew-clock.mjs` preloaded, so its wall clock is off by
 * `LEDGENCE_CLOCK_SKEW_MS`. One JSON line per event on stdout:
 *   {"event":"ready","now":<its Date.now()>}
 *   {"event":"start"|"done","task_id":…,"attempt_id":…}
 *   {"event":"aborted",…,"reason":…} when the SDK aborts the handler
 * SDK warnings and errors go to stderr, one line each. Program `job` sleeps
 * `data.ms` on a timer (monotonic, like real work), or until aborted, and
 * returns `{ ok: true }`.
 * Environment: LEDGENCE_URL, QUEUE, TENANT, NAMESPACE. SIGTERM stops it gracefully.
 */
import { Worker } from '@ledgence/worker';

const required = (name: string): string => {
  const value = process.env[name];
  if (value === undefined) throw new Error(`${name} is required`);
  return value;
};
const emit = (event: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(event)}\n`);
const log =
  (level: string) =>
  (message: string, fields?: object): void => {
    process.stderr.write(`${level} ${message} ${JSON.stringify(fields ?? {})}\n`);
  };

const worker = new Worker({
  url: required('LEDGENCE_URL'),
  tenant: required('TENANT'),
  namespace: required('NAMESPACE'),
  queue: required('QUEUE'),
  concurrency: 4,
  renewIntervalMs: 250,
  pollWaitMs: 500,
  requestTimeoutMs: 2_000,
  backoff: { baseMs: 20, maxMs: 300 },
  logger: { debug: () => {}, info: () => {}, warn: log('warn'), error: log('error') },
});

worker.register('job', async (raw, ctx) => {
  const ms = (raw as { ms?: number } | null)?.ms ?? 5;
  const fields = { task_id: ctx.taskId, attempt_id: ctx.attemptId };
  emit({ event: 'start', ...fields });
  // Like well-behaved work, it stops when the SDK aborts it (cancel, lease lost).
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    ctx.signal.addEventListener('abort', () => {
      clearTimeout(timer);
      emit({ event: 'aborted', ...fields, reason: String(ctx.signal.reason) });
      resolve();
    });
  });
  emit({ event: 'done', ...fields });
  return { ok: true };
});

process.on('unhandledRejection', (reason) => {
  process.stderr.write(`unhandled rejection: ${String(reason)}\n`);
  process.exit(3);
});
process.once('SIGTERM', () => {
  void worker.stop({ graceMs: 2_000 }).then(() => process.exit(0));
});
emit({ event: 'ready', now: Date.now() });
worker.run().catch((error: unknown) => {
  process.stderr.write(`worker failed: ${String(error)}\n`);
  process.exit(1);
});
