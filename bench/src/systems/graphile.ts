/** graphile-worker, in this process (it is a library), on its own database. */
import {
  Logger,
  makeWorkerUtils,
  type Runner,
  run,
  runMigrations,
  type WorkerUtils,
} from 'graphile-worker';
import pg from 'pg';
import type { BenchData, BenchSystem, RunningWorkers, WorkerMode } from './system.js';

/**
 * Worker pool settings per mode. `batched` turns on the local queue (jobs fetched and locked
 * in batches) and batched completions; graphile-worker still runs at most `concurrency` jobs
 * at once, but holds (locks) up to `localQueue.size` more.
 */
export const GRAPHILE_SETTINGS: Record<
  WorkerMode,
  { concurrency: number; localQueueSize?: number; completeJobBatchDelay?: number }
> = {
  strict: { concurrency: 32 },
  batched: { concurrency: 32, localQueueSize: 250, completeJobBatchDelay: 0 },
  pickup: { concurrency: 1 },
};

/** Errors printed, everything else dropped. */
const logger = new Logger(() => (level, message) => {
  if (level === 'error') console.error(`[graphile-worker] ${message}`);
});

/** The `application_name` of the producer's connections. */
const PRODUCER = 'bench-graphile-producer';

/** graphile-worker on `url`'s database, its schema installed up front. */
export async function graphileSystem(url: string, database: string): Promise<BenchSystem> {
  await runMigrations({ connectionString: url, logger });
  // The producer's pool is ours, ended and its backends waited out: WorkerUtils.release() ends a
  // pool it made without awaiting it (graphile-worker 0.17.3 makeNewPool), and a backend reports
  // its last commits to pg_stat_database only as it exits, so they could outlive flushStats() and
  // land in the next window.
  let producer: { pool: pg.Pool; utils: Promise<WorkerUtils> } | undefined;
  const getProducer = (): Promise<WorkerUtils> => {
    if (producer === undefined) {
      const pool = new pg.Pool({ connectionString: url, application_name: PRODUCER });
      producer = { pool, utils: makeWorkerUtils({ pgPool: pool, logger }) };
    }
    return producer.utils;
  };
  const closeProducer = async (): Promise<void> => {
    const open = producer;
    producer = undefined;
    if (open === undefined) return;
    await (await open.utils).release();
    await open.pool.end();
    // Watched from another database, so that the watcher's own commits stay out of this one's.
    const admin = new URL(url);
    admin.pathname = '/postgres';
    const watcher = new pg.Client({ connectionString: admin.toString() });
    await watcher.connect();
    try {
      // Bounded: a backend that never goes would cost a reading's precision, not the run.
      for (const end = Date.now() + 10_000; Date.now() < end; ) {
        const { rows } = await watcher.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1',
          [PRODUCER],
        );
        if ((rows[0]?.n ?? 0) === 0) break;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    } finally {
      await watcher.end();
    }
  };
  return {
    name: 'graphile-worker',
    database,
    async prepareQueue() {},
    async submitOne(queue, data) {
      await (await getProducer()).addJob(queue, data);
    },
    async submitMany(queue, items) {
      await (await getProducer()).addJobs(items.map((payload) => ({ identifier: queue, payload })));
    },
    // Jobs of every task identifier share one table: left over, they would slow down the
    // job fetches of later shapes.
    async discard(queue) {
      await (await getProducer()).withPgClient((client) =>
        client.query(
          'DELETE FROM graphile_worker._private_jobs WHERE task_id IN (SELECT id FROM graphile_worker._private_tasks WHERE identifier = $1)',
          [queue],
        ),
      );
    },
    async startWorkers(queue, mode, onStart): Promise<RunningWorkers> {
      const settings = GRAPHILE_SETTINGS[mode];
      const runner: Runner = await run({
        connectionString: url,
        concurrency: settings.concurrency,
        noHandleSignals: true,
        logger,
        taskList: {
          [queue]: async (payload) => {
            onStart(payload as BenchData);
          },
        },
        preset: {
          worker: {
            ...(settings.localQueueSize === undefined
              ? {}
              : { localQueue: { size: settings.localQueueSize } }),
            ...(settings.completeJobBatchDelay === undefined
              ? {}
              : {
                  completeJobBatchDelay: settings.completeJobBatchDelay,
                  failJobBatchDelay: settings.completeJobBatchDelay,
                }),
          },
        },
      });
      return {
        async stop() {
          await runner.stop();
        },
      };
    },
    // Finished jobs are deleted; the unfinished ones are those left of the task identifier.
    unfinishedSql:
      'SELECT count(*) FROM graphile_worker._private_jobs j JOIN graphile_worker._private_tasks t ON t.id = j.task_id WHERE t.identifier = $1',
    flushStats: closeProducer,
    serverCpuMs: async () => Number.NaN,
    describe(mode) {
      const s = GRAPHILE_SETTINGS[mode];
      const extra =
        s.localQueueSize === undefined
          ? ''
          : `, preset.worker.localQueue.size ${s.localQueueSize}, completeJobBatchDelay ${s.completeJobBatchDelay}`;
      return `graphile-worker defaults (LISTEN/NOTIFY, pollInterval 2 s, pool max 10) with concurrency ${s.concurrency}${extra}`;
    },
    close: closeProducer,
  };
}
