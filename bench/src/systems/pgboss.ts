/** pg-boss, in this process (it is a library), on its own database. */
import PgBoss from 'pg-boss';
import type { BenchData, BenchSystem, RunningWorkers, WorkerMode } from './system.js';

/**
 * Workers per mode and each one's `batchSize`. pg-boss 10 has no per-worker concurrency: each
 * `work()` call is one polling loop that fetches `batchSize` jobs, runs the handler on the
 * array, completes them all in one statement, and then waits out the rest of its polling
 * interval before it fetches again, found jobs or not.
 */
export const PGBOSS_WORKERS: Record<WorkerMode, { workers: number; batchSize: number }> = {
  strict: { workers: 32, batchSize: 1 },
  batched: { workers: 4, batchSize: 250 },
  // One loop fetching one job per 0.5 s serves 2 tasks/s, below the probe's ~4 arrivals/s: the
  // probe would measure a growing backlog. Up to 10 per fetch measures the polling delay.
  pickup: { workers: 1, batchSize: 10 },
};
/** The shortest polling interval pg-boss 10 allows (its default is 2 s). */
export const PGBOSS_POLLING_INTERVAL_SECONDS = 0.5;

function onError(error: unknown): void {
  console.error('[pg-boss]', error);
}

/** pg-boss on `url`'s database, its schema installed by the first start. */
export async function pgBossSystem(url: string, database: string): Promise<BenchSystem> {
  const start = async (): Promise<PgBoss> => {
    const boss = new PgBoss({ connectionString: url });
    boss.on('error', onError);
    await boss.start();
    return boss;
  };
  // The producer is opened on first use and closed by flushStats, so that its connections'
  // statistics are flushed before a measured window starts.
  let producer: Promise<PgBoss> | undefined;
  const getProducer = (): Promise<PgBoss> => {
    producer ??= start();
    return producer;
  };
  const closeProducer = async (): Promise<void> => {
    const open = producer;
    producer = undefined;
    if (open !== undefined) await (await open).stop({ graceful: false, wait: true });
  };
  return {
    name: 'pg-boss',
    database,
    async prepareQueue(queue) {
      await (await getProducer()).createQueue(queue);
    },
    async submitOne(queue, data) {
      const id = await (await getProducer()).send(queue, data);
      if (id === null) throw new Error('pg-boss did not create the job');
    },
    async submitMany(queue, items) {
      await (await getProducer()).insert(items.map((data) => ({ name: queue, data })));
    },
    // pg-boss 10 keeps each queue's jobs in its own partition: left over, they are never
    // scanned by another queue's fetches.
    async discard() {},
    async startWorkers(queue, mode, onStart): Promise<RunningWorkers> {
      const boss = await start();
      const { workers, batchSize } = PGBOSS_WORKERS[mode];
      for (let n = 0; n < workers; n += 1) {
        await boss.work<BenchData>(
          queue,
          { batchSize, pollingIntervalSeconds: PGBOSS_POLLING_INTERVAL_SECONDS },
          async (jobs) => {
            for (const job of jobs) onStart(job.data);
          },
        );
      }
      return {
        async stop() {
          await boss.stop({ graceful: true, wait: true, timeout: 10_000 });
        },
      };
    },
    unfinishedSql: `SELECT count(*) FROM pgboss.job WHERE name = $1 AND state <> 'completed'`,
    flushStats: closeProducer,
    serverCpuMs: async () => Number.NaN,
    describe(mode) {
      const { workers, batchSize } = PGBOSS_WORKERS[mode];
      return `pg-boss defaults (pool max 10, supervise on) except: ${workers} × work({ batchSize: ${batchSize}, pollingIntervalSeconds: ${PGBOSS_POLLING_INTERVAL_SECONDS} })`;
    },
    close: closeProducer,
  };
}
