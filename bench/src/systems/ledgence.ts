/** Ledgence: the real server process, driven over HTTP by `@ledgence/worker`. */
import { MAX_SESSION_CONCURRENCY, RENEW_INTERVAL_MS } from '@ledgence/contracts';
import { Client, type Logger, Worker } from '@ledgence/worker';
import pg from 'pg';
import { processCpuMs } from '../cpu.js';
import type { ServerProcess } from '../server.js';
import { serverRequestCounts } from './requests.js';
import {
  type BenchData,
  type BenchSystem,
  type HeldLeases,
  type RunningWorkers,
  sleep,
  type WorkerMode,
} from './system.js';

const TENANT = 'bench';
const NAMESPACE = 'bench';
const PROGRAM = 'noop';
/** The program of shape 7's long tasks: its handler waits until the shape ends. */
const HOLD_PROGRAM = 'hold';
/** How long shape 7 waits for every long task to start before it gives up. */
const HOLD_START_TIMEOUT_MS = 120_000;
/** PostgreSQL's idle flush interval of backend statistics (PGSTAT_IDLE_INTERVAL) plus slack. */
const STATS_FLUSH_WAIT_MS = 11_000;

/**
 * The queue's queued and active tasks, read the way the server's queue depth gauge reads them
 * (`queueDepths` in store-postgres' hot-sql.ts): queued ones through the partial `tasks_acquire`,
 * active ones through the partial `attempts_active` (an active task has exactly its current
 * attempt active). `state IN ('queued', 'active')` on `tasks` had no index to use and scanned the
 * namespace — every task of the run so far, 19–139 ms per call late in a run — which delayed the
 * moment a drain was seen finished (bench/README.md, "How the counters are read").
 */
const UNFINISHED_SQL = `SELECT
  (SELECT count(*) FROM tasks
    WHERE tenant_id = '${TENANT}' AND namespace = '${NAMESPACE}' AND queue = $1
      AND state = 'queued')
  + (SELECT count(*) FROM attempts a
      JOIN tasks t ON t.tenant_id = a.tenant_id AND t.namespace = a.namespace
        AND t.task_id = a.task_id
      WHERE a.state = 'active' AND t.state = 'active' AND t.current_attempt_id = a.attempt_id
        AND t.tenant_id = '${TENANT}' AND t.namespace = '${NAMESPACE}' AND t.queue = $1)`;

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
  /** The server's database, read to count shape 7's lease renewals. */
  databaseUrl: string;
}

/** Ledgence against a running server. */
export function ledgenceSystem(
  server: ServerProcess,
  database: string,
  options: LedgenceSystemOptions,
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
    async holdLeases(queue, count): Promise<HeldLeases> {
      for (let from = 0; from < count; from += 1_000) {
        const results = await client.submitBatch(
          Array.from({ length: Math.min(1_000, count - from) }, (_, k) => ({
            queue,
            program: HOLD_PROGRAM,
            data: { i: from + k },
          })),
        );
        const failed = results.find((item) => item instanceof Error);
        if (failed !== undefined) throw failed;
      }
      const db = new pg.Client({ connectionString: options.databaseUrl });
      await db.connect();
      let started = 0;
      let release = (): void => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      // A session holds at most MAX_SESSION_CONCURRENCY slots: more leases take more workers.
      const workers: { worker: Worker; running: Promise<void> }[] = [];
      for (let left = count; left > 0; left -= MAX_SESSION_CONCURRENCY) {
        const worker = new Worker({
          url: server.url,
          tenant: TENANT,
          namespace: NAMESPACE,
          queue,
          concurrency: Math.min(left, MAX_SESSION_CONCURRENCY),
          logger: quietLogger,
        });
        worker.register(HOLD_PROGRAM, async () => {
          started += 1;
          await released;
          return null;
        });
        const running = worker.run();
        running.catch((error: unknown) => {
          console.error('[ledgence worker] stopped with an error:', error);
        });
        workers.push({ worker, running });
      }
      const stop = async (): Promise<void> => {
        release();
        for (const { worker, running } of workers) {
          await worker.stop({ graceMs: 30_000 });
          await running.catch(() => {});
        }
        await db.end();
      };
      const deadline = Date.now() + HOLD_START_TIMEOUT_MS;
      while (started < count) {
        if (Date.now() > deadline) {
          await stop();
          throw new Error(`only ${started} of ${count} long tasks started within 120 s`);
        }
        await sleep(20);
      }
      return {
        // The workers above leave renewIntervalMs at the SDK's default.
        renewIntervalMs: RENEW_INTERVAL_MS,
        // Renew sequence 1 is the dispatch grant; every later one is a heartbeat.
        async renewals() {
          const reply = await db.query<{ renewals: string }>(
            `SELECT coalesce(sum(a.renew_sequence), 0)::text AS renewals FROM attempts a
             JOIN tasks t USING (tenant_id, namespace, task_id)
             WHERE t.tenant_id = $1 AND t.namespace = $2 AND t.queue = $3 AND a.state = 'active'`,
            [TENANT, NAMESPACE, queue],
          );
          return Number(reply.rows[0]?.renewals ?? Number.NaN);
        },
        stop,
      };
    },
    unfinishedSql: UNFINISHED_SQL,
    flushStats: () => sleep(statsFlushWaitMs),
    serverCpuMs: () => processCpuMs(server.pid),
    serverRequests: () => serverRequestCounts(server.url),
    describe(mode) {
      return `server process (defaults, LEDGENCE_LOG_LEVEL=warn); one @ledgence/worker Worker, concurrency ${LEDGENCE_CONCURRENCY[mode]}, default renew/poll settings`;
    },
    async close() {},
  };
}
