/**
 * A worker process for the quiescence tests (quiescence.e2e.test.ts): the real
 * `Worker` in its own Node process that never calls `process.exit`, so a test sees what the
 * process did before it ended on its own.
 *
 * Program `deaf` ignores its signal and returns `data.ms` after it started (a referenced timer:
 * the process lives until then). SIGTERM calls stop({ graceMs: 0 }).
 *
 * It prints one JSON line per event on stdout: {"event":"ready"}, {"event":"start",…},
 * {"event":"returned",…} (the deaf handler returned), {"event":"stopped"} (stop() resolved),
 * {"event":"log",…} for every SDK line at warn and error.
 *
 * Environment: LEDGENCE_URL, QUEUE, REQUEST_TIMEOUT_MS (2000).
 */
import { Worker } from '@ledgence/worker';

const emit = (event: Record<string, unknown>): void => {
  process.stdout.write(`${JSON.stringify(event)}\n`);
};
const log =
  (level: string) =>
  (message: string, fields?: object): void =>
    emit({ event: 'log', level, message, fields: fields ?? {} });

const worker = new Worker({
  url: process.env.LEDGENCE_URL as string,
  tenant: 'acme',
  namespace: 'e2e',
  queue: process.env.QUEUE as string,
  concurrency: 1,
  renewIntervalMs: 250,
  pollWaitMs: 500,
  abortGraceMs: 50,
  requestTimeoutMs: Number(process.env.REQUEST_TIMEOUT_MS ?? '2000'),
  // The SDK's default backoff: a first retry 50–100 ms after a failure.
  logger: { debug: () => {}, info: () => {}, warn: log('warn'), error: log('error') },
});

worker.register('deaf', async (raw, ctx) => {
  emit({ event: 'start', task_id: ctx.taskId });
  const ms = ((raw ?? {}) as { ms?: number }).ms ?? 1_000;
  await new Promise((resolve) => setTimeout(resolve, ms));
  emit({ event: 'returned', task_id: ctx.taskId });
  return 'late';
});

process.on('unhandledRejection', (reason) => {
  process.stderr.write(`unhandled rejection: ${String(reason)}\n`);
  process.exit(3);
});
process.once('SIGTERM', () => {
  void worker.stop({ graceMs: 0 }).then(() => emit({ event: 'stopped' }));
});
emit({ event: 'ready' });
void worker.run().then(
  () => emit({ event: 'run', ok: true }),
  (error: unknown) => emit({ event: 'run', ok: false, message: String(error) }),
);
