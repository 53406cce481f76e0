/**
 * `BenchSystem.flushStats` promises that "every commit so far is counted in
 * `pg_stat_database`" when it returns; the drain reads its `xact_commit` window right after it
 * (run.ts: `await system.flushStats(); … const before = await postgres.counters(…)`). For
 * graphile-worker it is `WorkerUtils.release()`, whose pool releaser calls `pgPool.end()` without
 * awaiting it (graphile-worker 0.17.3 dist/lib.js `makeNewPool`): the producer's backends may
 * still be alive, their last second of commits unpublished, when the reading is taken.
 * Real PostgreSQL (the e2e project's server), real graphile-worker.
 */
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { graphileSystem } from './graphile.js';
import type { BenchSystem } from './system.js';

let db: TestDatabase;
let admin: pg.Client;
let system: BenchSystem;

const commits = async (): Promise<number> => {
  const reply = await admin.query<{ n: string }>(
    'SELECT xact_commit::text AS n FROM pg_stat_database WHERE datname = $1',
    [db.name],
  );
  return Number(reply.rows[0]?.n);
};

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'flush' });
  const adminUrl = new URL(db.url);
  adminUrl.pathname = '/postgres';
  admin = new pg.Client({ connectionString: adminUrl.toString() });
  await admin.connect();
  system = await graphileSystem(db.url, db.name);
  // Autovacuum's transactions count in this database's xact_commit too, and an analyze of
  // graphile-worker's tables is due after a few hundred jobs: a CI run saw 14 commits arrive in
  // a round's 1.5 s settle after every connection of the test's had gone (autovacuum is the one
  // other backend that commits here). The bench takes autovacuum as the system's own cost; this
  // file checks only that flushStats() leaves no commit of the bench's connections unpublished.
  const owner = new pg.Client({ connectionString: db.url });
  await owner.connect();
  try {
    const { rows } = await owner.query<{ name: string }>(
      "SELECT format('%I.%I', schemaname, relname) AS name FROM pg_stat_user_tables WHERE schemaname LIKE 'graphile_worker%'",
    );
    expect(rows.length).toBeGreaterThan(0);
    for (const { name } of rows) {
      await owner.query(`ALTER TABLE ${name} SET (autovacuum_enabled = off)`);
    }
    // The migration churned the catalogs too (pg_class, pg_attribute, … and, once analyzed,
    // pg_statistic), which autovacuum would visit during the rounds: two CI runs saw the same 10
    // commits arrive in the first round's settle. Analyzed, then vacuumed (which also cleans what
    // the analyze left in pg_statistic), the database gives autovacuum nothing to do.
    await owner.query('ANALYZE');
    await owner.query('VACUUM');
  } finally {
    await owner.end();
  }
  // Let the migration's connections go and their statistics settle.
  await sleep(12_000);
}, 60_000);

afterAll(async () => {
  await system?.close().catch(() => {});
  await admin?.end();
  await db?.drop();
});

it('graphile-worker: after flushStats() every commit of a burst so far is already counted in pg_stat_database (a few strays aside)', async () => {
  const rounds: { atReturn: number; settled: number; from: number; to: number }[] = [];
  for (let round = 0; round < 5; round += 1) {
    // A burst of single-job commits, under a second, on the producer's connections: their
    // counts are still pending in the backends (published at most once a second while busy).
    await Promise.all(
      Array.from({ length: 8 }, async (_, lane) => {
        for (let i = 0; i < 25; i += 1)
          await system.submitOne(`flush_${round}`, { i: lane * 100 + i });
      }),
    );
    await system.flushStats();
    const from = Date.now();
    const atReturn = await commits();
    // Nothing of this database's is connected any more: whatever arrives now was pending.
    await sleep(1_500);
    rounds.push({ atReturn, settled: await commits(), from, to: Date.now() });
  }
  // What autovacuum did meanwhile (read after the rounds: this read commits in the database
  // too). Shared catalogs (pg_database, pg_shdepend: every test file makes and drops a
  // database) are vacuumed from whichever database a worker connects to, this one included,
  // and their commits count here: a CI run saw 4 arrive in a round's settle, beside an
  // autovacuum of pg_database. Such a round proves nothing either way and is set aside.
  const reader = new pg.Client({ connectionString: db.url });
  await reader.connect();
  const { rows: vacuumed } = await reader
    .query<{ name: string; at: string; ms: number }>(
      `SELECT relname AS name, greatest(last_autovacuum, last_autoanalyze)::text AS at,
         (extract(epoch FROM greatest(last_autovacuum, last_autoanalyze)) * 1000)::float8 AS ms
       FROM pg_stat_all_tables WHERE greatest(last_autovacuum, last_autoanalyze) IS NOT NULL`,
    )
    .finally(() => reader.end());
  const beside = (round: { from: number; to: number }) =>
    vacuumed.some(({ ms }) => ms >= round.from - 2_000 && ms <= round.to + 500);
  const clean = rounds.filter((round) => !beside(round));
  const why = JSON.stringify({ rounds, autovacuumed: vacuumed });
  expect(clean.length, why).toBeGreaterThanOrEqual(3);
  // Unflushed, most of a round's 200 commits would still be pending at return (published at
  // most once a second while busy). A few strays are not the bench's: a CI run saw 2 arrive in
  // a round's settle with no autovacuum in sight (pg_stat_all_tables keeps only each table's
  // last run, and shared catalogs are vacuumed from whichever database a worker connects to).
  for (const { atReturn, settled } of clean) {
    expect(settled - atReturn, why).toBeGreaterThanOrEqual(0);
    expect(settled - atReturn, why).toBeLessThanOrEqual(STRAY_COMMITS);
  }
}, 60_000);

/** Commits of background work a round may see arrive besides the bench's own. */
const STRAY_COMMITS = 4;

it('graphile-worker: a drain’s closing commit reading, taken the way run.ts takes it after workers.stop(), counts every commit of the workers', async () => {
  const { closeCpuWindow, machineCpu, treeCpuMs } = await import('../cpu.js');
  const { CountingClient } = await import('../db.js');
  const { performance } = await import('node:perf_hooks');
  const rounds: { atReading: number; settled: number; missed: number }[] = [];
  for (let round = 0; round < 4; round += 1) {
    const queue = `drain_${round}`;
    const count = 1_000;
    for (let from = 0; from < count; from += 500) {
      await system.submitMany(
        queue,
        Array.from({ length: 500 }, (_, k) => ({ i: from + k })),
      );
    }
    await system.flushStats();
    await sleep(1_500);
    const probe = new CountingClient(db.url);
    await probe.connect();
    let started = 0;
    const workers = await system.startWorkers(queue, 'strict', () => {
      started += 1;
    });
    while (started < count || (await probe.scalar(system.unfinishedSql, [queue])) > 0) {
      await sleep(5);
    }
    // run.ts drain(), from here: stop, close the CPU window (a walk of /proc), count the
    // unfinished tasks, read the statements, end the probe, flushStats, read the counters.
    await workers.stop();
    await closeCpuWindow({
      server: async () => Number.NaN,
      postgres: () => treeCpuMs(process.pid),
      bench: () => process.cpuUsage(),
      machine: machineCpu,
      now: () => performance.now(),
    });
    await probe.scalar(system.unfinishedSql, [queue]);
    await admin.query('SELECT 1');
    await probe.end();
    await system.flushStats();
    const atReading = await commits();
    await sleep(1_500);
    const settled = await commits();
    rounds.push({ atReading, settled, missed: settled - atReading });
  }
  for (const { missed } of rounds) expect(missed, JSON.stringify(rounds)).toBe(0);
}, 120_000);
