/**
 * Micro-benchmark behind the SDK's default HTTP client (bench/README.md, "The SDK's HTTP
 * client"): the same `@ledgence/worker` Client reads one task's status from the real server
 * process, through its default transport (`node:http`, kept-alive connections) and through
 * Node's global `fetch` (the `fetch` option), alternating in one process run. Prints the
 * benchmark process's CPU per request (the server's is the same for both) and the latency.
 *
 *   pnpm --filter @ledgence/bench micro:transport
 *
 * Uses the embedded PostgreSQL in `bench/.data/pg` (or `DATABASE_URL`) and the built server.
 */
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { Client } from '@ledgence/worker';
import { startPostgres } from '../db.js';
import { serverEntry, startServer } from '../server.js';
import { percentile } from '../stats.js';

const REQUESTS = 2_000;
const ROUNDS = 4;

const benchDir = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const postgres = await startPostgres(join(benchDir, '.data'), process.env.DATABASE_URL);
await postgres.recreate('ledgence_micro_transport');
const server = await startServer(serverEntry(join(benchDir, '..')), {
  DATABASE_URL: postgres.urlFor('ledgence_micro_transport'),
});
try {
  const clientWith = (fetch: typeof globalThis.fetch | undefined) =>
    new Client({ url: server.url, tenant: 'micro', namespace: 'micro', fetch });
  const viaNodeHttp = clientWith(undefined);
  const clients = [
    ['node:http (default)', viaNodeHttp],
    ['global fetch', clientWith(globalThis.fetch)],
  ] as const;
  const task = await viaNodeHttp.submit({ queue: 'q', program: 'p', data: null });
  const results = new Map<string, { cpuUs: number[]; p50: number[]; p99: number[] }>();
  for (let round = 0; round <= ROUNDS; round++) {
    for (const [name, client] of clients) {
      const latencies: number[] = [];
      const cpuBefore = process.cpuUsage();
      for (let i = 0; i < REQUESTS; i++) {
        const started = performance.now();
        await client.status(task.task_id);
        latencies.push(performance.now() - started);
      }
      const cpu = process.cpuUsage(cpuBefore);
      // Round 0 warms up both (JIT, connections) and is not counted.
      if (round === 0) continue;
      const entry = results.get(name) ?? { cpuUs: [], p50: [], p99: [] };
      entry.cpuUs.push((cpu.user + cpu.system) / REQUESTS);
      entry.p50.push(percentile(latencies, 50));
      entry.p99.push(percentile(latencies, 99));
      results.set(name, entry);
    }
  }
  const median = (values: number[]) => percentile(values, 50);
  console.log(`${REQUESTS} status reads per round, ${ROUNDS} rounds, medians over rounds:`);
  for (const [name, entry] of results) {
    console.log(
      `${name.padEnd(20)} client CPU ${median(entry.cpuUs).toFixed(0).padStart(4)} µs/request` +
        `   p50 ${median(entry.p50).toFixed(3)} ms   p99 ${median(entry.p99).toFixed(3)} ms` +
        `   (CPU per round: ${entry.cpuUs.map((v) => v.toFixed(0)).join(', ')})`,
    );
  }
} finally {
  await server.stop();
  await postgres.stop();
}
