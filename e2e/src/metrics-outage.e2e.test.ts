/**
 * `/metrics` of a real server process while its database is unreachable. A scrape
 * must still answer (Prometheus gives up on a target after its scrape timeout, 10 s by default,
 * and then loses every series — the ones that would show the outage included): the depth gauge
 * is left out, `ledgence_queue_depth_errors_total` and `ledgence_callback_backlog_errors_total`
 * count the failed reads, the backlog reads NaN, the HTTP counters stay, and the log says why
 * without the database password.
 */
import { type PgProxy, startPgProxy } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, until } from './test/harness.js';
import { call, metricSamples, submitTask, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('metrics_outage');
let proxy: PgProxy;
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  proxy = await startPgProxy(stack.databaseUrl);
  const { startServerProcess } = await import('./server-process.js');
  server = await startServerProcess(
    {
      DATABASE_URL: proxy.url,
      LEDGENCE_LOG_LEVEL: 'info',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '1000',
      LEDGENCE_RETENTION_INTERVAL_MS: '60000',
    },
    { captureStdout: true },
  );
  stack.servers.push(server);
});
afterAll(async () => {
  await stack.close();
  await proxy?.close();
});

async function timedScrape(url: string) {
  const started = performance.now();
  const response = await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(60_000) });
  const samples = metricSamples(await response.text());
  return { status: response.status, ms: performance.now() - started, samples };
}

const DEPTH = 'ledgence_queue_depth{queue="q",state="queued"}';

describe('/metrics while the database is away', () => {
  it('the scrape whose depth and backlog reads fail (refused connections) counts them in that same scrape, answers well within a scrape timeout and shows no stale depth', async () => {
    await submitTask(server.url, taskBody('o-1', 'q'));
    const healthy = await timedScrape(server.url);
    expect(healthy.samples.get(DEPTH)).toBe(1);
    proxy.refuse(true);
    try {
      // Past the one-second reuse of the last good read.
      await new Promise((resolve) => setTimeout(resolve, 1_200));
      const down = await timedScrape(server.url);
      expect(down.status).toBe(200);
      expect(down.ms).toBeLessThan(10_000);
      expect(down.samples.has(DEPTH)).toBe(false);
      expect(Number.isNaN(down.samples.get('ledgence_callback_due_backlog'))).toBe(true);
      // The scrape whose reads failed is the one that counts them ("scrapes whose queue depth
      // read failed"): the same exposition that lacks the depth and shows the backlog NaN.
      expect({
        depthErrors: down.samples.get('ledgence_queue_depth_errors_total'),
        backlogErrors: down.samples.get('ledgence_callback_backlog_errors_total'),
      }).toEqual({
        depthErrors: (healthy.samples.get('ledgence_queue_depth_errors_total') ?? 0) + 1,
        backlogErrors: (healthy.samples.get('ledgence_callback_backlog_errors_total') ?? 0) + 1,
      });
      expect(down.samples.get('process_resident_memory_bytes')).toBeGreaterThan(0);
      // The child's stdout arrives on its own schedule.
      await until(
        () => server.stdout().includes('queue depth read failed'),
        10_000,
        'the log line',
      );
      const password = new URL(stack.databaseUrl).password;
      if (password.length >= 4) expect(server.stdout().includes(password)).toBe(false);
    } finally {
      proxy.refuse(false);
    }
    // And stay counted.
    const later = await timedScrape(server.url);
    expect(later.samples.get('ledgence_queue_depth_errors_total')).toBeGreaterThanOrEqual(1);
    await until(
      async () => (await timedScrape(server.url)).samples.get(DEPTH) === 1,
      30_000,
      'the depth back',
    );
  });

  it('answers a scrape well within a scrape timeout when every open database connection goes silent (a failover, a forgotten NAT flow)', async () => {
    const taskId = await submitTask(server.url, taskBody('o-2', 'warm'));
    // Warm the pool, as on any busy server: many reads at once open every connection it may
    // hold, so the scrape's reads are handed silent ones (review r53c: 60 s, the wire timeout).
    for (let round = 0; round < 3; round += 1) {
      await Promise.all(
        Array.from({ length: 40 }, () => call(server.url, `${TASKS_BASE}/tasks/${taskId}`)),
      );
    }
    const before = await timedScrape(server.url);
    proxy.silenceOpen();
    await new Promise((resolve) => setTimeout(resolve, 1_200));
    const scraped = await timedScrape(server.url);
    expect({ status: scraped.status, within10s: scraped.ms < 10_000 }).toEqual({
      status: 200,
      within10s: true,
    });
    // No stale depth: read afresh (on a connection the pool opened since), or left out with the
    // failed read counted.
    const errors = (samples: Map<string, number>) =>
      samples.get('ledgence_queue_depth_errors_total') ?? 0;
    const depth = scraped.samples.get(DEPTH);
    expect(
      depth === undefined
        ? { depth, errors: errors(scraped.samples) - errors(before.samples) }
        : { depth },
    ).toEqual(depth === undefined ? { depth, errors: 1 } : { depth: 1 });
  });
});
