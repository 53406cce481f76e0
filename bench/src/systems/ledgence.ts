/** Ledgence: the real server process, driven over HTTP by `@ledgence/worker`. */
import { Client, type Logger, Worker } from '@ledgence/worker';
import { processCpuMs } from '../cpu.js';
import type { ServerProcess } from '../server.js';
import {
  type BenchData,
  type BenchSystem,
  type RunningWorkers,
  sleep,
  type WorkerMode,
} from './system.js';

const TENANT = 'bench';
const NAMESPACE = 'bench';
const PROGRAM = 'noop';
/** PostgreSQL's idle flush interval of backend statistics (PGSTAT_IDLE_INTERVAL) plus slack. */
const STATS_FLUSH_WAIT_MS = 11_000;

/** Slots per worker mode: `batched` gives the SDK more slots to batch polls and settlements over. */
export const LEDGENCE_CONCURRENCY: Record<WorkerMode, number> = {
  strict: 32,
  batched: 256,
  pickup: 1,
};

/** Warnings and errors of the SDK, printed; the rest dropped. */
const quietLogger: Logger = {
  debug() {},
  info() {},
  warn(message, fields) {
    console.warn(`[ledgence worker] ${message}`, fields ?? '');
  },
  error(message, fields) {
    console.error(`[ledgence worker] ${message}`, fields ?? '');
  },
};

/** Options of {@link ledgenceSystem}. */
export interface LedgenceSystemOptions {
  /** How long `flushStats` waits for PostgreSQL's idle statistics flush; 11 s by default. */
  statsFlushWaitMs?: number | undefined;
}

/** Ledgence against a running server. */
export function ledgenceSystem(
  server: ServerProcess,
  database: string,
  options: LedgenceSystemOptions = {},
): BenchSystem {
  const statsFlushWaitMs = options.statsFlushWaitMs ?? STATS_FLUSH_WAIT_MS;
  const client = new Client({
    url: server.url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: quietLogger,
  });
  return {
    name: 'ledgence',
    database,
    async prepareQueue() {},
    async submitOne(queue, data) {
      await client.submit({ queue, program: PROGRAM, data });
    },
    async submitMany(queue, items) {
      const results = await client.submitBatch(
        items.map((data) => ({ queue, program: PROGRAM, data })),
      );
      const failed = results.find((item) => item instanceof Error);
      if (failed !== undefined) throw failed;
    },
    // Ledgence has no route that deletes tasks. Left queued, they sit in their own queue's
    // part of the partial index of queued tasks, which other queues' acquisitions never scan.
    async discard() {},
    async startWorkers(queue, mode, onStart): Promise<RunningWorkers> {
      const worker = new Worker({
        url: server.url,
        tenant: TENANT,
        namespace: NAMESPACE,
        queue,
        concurrency: LEDGENCE_CONCURRENCY[mode],
        logger: quietLogger,
      });
      worker.register(PROGRAM, async (data) => {
        onStart(data as BenchData);
        return null;
      });
      const running = worker.run();
      running.catch((error: unknown) => {
        console.error('[ledgence worker] stopped with an error:', error);
      });
      return {
        async stop() {
          await worker.stop({ graceMs: 5_000 });
          await running.catch(() => {});
        },
      };
    },
    unfinishedSql: `SELECT count(*) FROM tasks WHERE tenant_id = '${TENANT}' AND namespace = '${NAMESPACE}' AND queue = $1 AND state IN ('queued', 'active')`,
    flushStats: () => sleep(statsFlushWaitMs),
    serverCpuMs: () => processCpuMs(server.pid),
    describe(mode) {
      return `server process (defaults, LEDGENCE_LOG_LEVEL=warn); one @ledgence/worker Worker, concurrency ${LEDGENCE_CONCURRENCY[mode]}, default renew/poll settings`;
    },
    async close() {},
  };
}
