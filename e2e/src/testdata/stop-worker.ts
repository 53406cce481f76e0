/**
 * A worker process for the shutdown tests (worker-stop.e2e.test.ts): the real `Worker`
 * in its own Node process that never calls `process.exit`, so a test can see whether the
 * process ends on its own once `run()` has resolved (no referenced timer or socket left).
 *
 * It prints one JSON line per event on stdout:
 *   {"event":"ready"}                          run() was called
 *   {"event":"start","task_id":…,"attempt":…}  a handler started
 *   {"event":"stopped"}                        stop() resolved
 *   {"event":"run","ok":true|false,…}         run() settled (with the error's code/name)
 *   {"event":"log","level":…,"message":…}     every SDK log line at warn and error, and at
 *                                              info/debug with WORKER_LOG=debug
 *   {"event":"timers","after":…,"count":n}    the referenced timers left, TIMERS_AFTER
 *                                              (a log message) after stop() resolved
 *
 * Environment: LEDGENCE_URL, QUEUE, CONCURRENCY (1), GRACE_MS (5000), EXTEND_MS (session
 * extension period, the SDK's default when unset), REQUEST_TIMEOUT_MS (2000), POLL_WAIT_MS (500).
 * Program `hang` waits for its signal and throws its reason; `job` returns after `data.ms`.
 * SIGTERM calls stop({ graceMs: GRACE_MS }); an unhandled rejection exits 3.
 */
import { Worker } from '@ledgence/worker';

const env = (name: string, fallback?: string): string | undefined => process.env[name] ?? fallback;
const emit = (event: Record<string, unknown>): void => {
  process.stdout.write(`${JSON.stringify(event)}\n`);
};

let stopped = false;
const timersAfter = env('TIMERS_AFTER');
const log =
  (level: string) =>
  (message: string, fields?: object): void => {
    emit({ event: 'log', level, message, fields: fields ?? {} });
    if (stopped && timersAfter !== undefined && message === timersAfter) {
      // After the SDK has finished reacting to what it logged.
      setImmediate(() => {
        const count = process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
        emit({ event: 'timers', after: message, count });
      });
    }
  };
const debug = env('WORKER_LOG') === 'debug';

const extend = env('EXTEND_MS');
const worker = new Worker({
  url: env('LEDGENCE_URL') as string,
  tenant: env('TENANT', 'acme') as string,
  namespace: env('NAMESPACE', 'e2e') as string,
  queue: env('QUEUE') as string,
  concurrency: Number(env('CONCURRENCY', '1')),
  renewIntervalMs: 250,
  pollWaitMs: Number(env('POLL_WAIT_MS', '500')),
  requestTimeoutMs: Number(env('REQUEST_TIMEOUT_MS', '2000')),
  ...(extend === undefined ? {} : { sessionExtendIntervalMs: Number(extend) }),
  backoff: { baseMs: 20, maxMs: 300 },
  logger: {
    debug: debug ? log('debug') : () => {},
    info: debug ? log('info') : () => {},
    warn: log('warn'),
    error: log('error'),
  },
});

worker.register('hang', async (_data, ctx) => {
  emit({ event: 'start', task_id: ctx.taskId, attempt: ctx.attempt });
  await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
  throw ctx.signal.reason;
});
worker.register('job', async (raw, ctx) => {
  emit({ event: 'start', task_id: ctx.taskId, attempt: ctx.attempt });
  const ms = ((raw ?? {}) as { ms?: number }).ms ?? 5;
  await new Promise((resolve) => setTimeout(resolve, ms));
  return { attempt: ctx.attempt };
});

process.on('unhandledRejection', (reason) => {
  process.stderr.write(`unhandled rejection: ${String(reason)}\n`);
  process.exit(3);
});
process.once('SIGTERM', () => {
  void worker.stop({ graceMs: Number(env('GRACE_MS', '5000')) }).then(() => {
    stopped = true;
    emit({ event: 'stopped' });
  });
});
emit({ event: 'ready' });
worker.run().then(
  () => emit({ event: 'run', ok: true }),
  (error: unknown) =>
    emit({
      event: 'run',
      ok: false,
      name: (error as Error)?.name,
      code: (error as { code?: unknown })?.code,
      message: String((error as Error)?.message ?? error),
    }),
);
