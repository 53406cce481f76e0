/**
 * The README's metrics table checked against real traffic on real server processes: each counter
 * moves by exactly the events it names, no more (nothing counted twice), no less, and a gauge
 * goes back to its baseline once the work is done.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, sleep, until } from './test/harness.js';
import {
  call,
  claimNext,
  metricSamples,
  repliesIn,
  settleBody,
  socketExchange,
  submitTask,
  TASKS_BASE,
  taskBody,
} from './test/wire.js';

const stack = new Stack('metrics_counts');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start({ LEDGENCE_LOG_LEVEL: 'info' }, { captureStdout: true });
}, 60_000);
afterAll(async () => {
  await stack.close();
});

/** Samples keyed by `name{labels}` exactly as exposed. */
async function scrape(url: string): Promise<Map<string, number>> {
  return metricSamples(await (await fetch(`${url}/metrics`)).text());
}

/** Requests counted in the HTTP histogram, /metrics scrapes left out. */
function httpRequests(samples: Map<string, number>): number {
  let sum = 0;
  for (const [key, value] of samples) {
    if (!key.startsWith('ledgence_http_request_duration_seconds_count{')) continue;
    if (key.includes('route="/metrics"')) continue;
    sum += value;
  }
  return sum;
}

const H = 'Host: 127.0.0.1\r\n';

describe('ledgence_http_request_duration_seconds counts each request once (README: "HTTP requests by route pattern")', () => {
  it('a malformed chunk in a body the app is reading is one request answered once, so it is counted once, not twice', async () => {
    const beforeSamples = await scrape(server.url);
    const before = httpRequests(beforeSamples);
    const logBefore = server.stdout().length;
    const body = JSON.stringify(taskBody('counts-chunk', 'counts-chunk'));
    const bad = `POST ${TASKS_BASE}/tasks HTTP/1.1\r\n${H}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n${body}\r\n0\r\n\r\n`;
    const { text } = await socketExchange(server.url, bad, 3_000);
    // One request on the wire, one reply to it.
    expect(repliesIn(text).map((r) => r.status)).toHaveLength(1);
    await sleep(300);
    const afterSamples = await scrape(server.url);
    const after = httpRequests(afterSamples);
    const moved = [...afterSamples]
      .filter(([k]) => k.startsWith('ledgence_http_request_duration_seconds_count{'))
      .filter(([k, v]) => v !== (beforeSamples.get(k) ?? 0) && !k.includes('route="/metrics"'))
      .map(([k, v]) => `${k} +${v - (beforeSamples.get(k) ?? 0)}`);
    const requestLines = server
      .stdout()
      .slice(logBefore)
      .split('\n')
      .filter((l) => l.includes('"msg":"request"') && !l.includes('"route":"/metrics"'));
    expect(after - before, `${moved.join('\n')}\n${requestLines.join('\n')}`).toBe(1);
    // Logged once too, under the id its reply carries (the app's record of the request).
    const [reply] = repliesIn(text);
    const replyId = (JSON.parse(reply?.body ?? '{}') as { request_id?: string }).request_id;
    expect(requestLines.map((l) => (JSON.parse(l) as { request_id: string }).request_id)).toEqual([
      replyId,
    ]);
  });
});

describe('gauges and cross-replica counters', () => {
  it('ledgence_queue_depth of a queue goes back to nothing queued or active once its tasks are settled', async () => {
    const queue = 'counts-depth';
    const ids: string[] = [];
    for (let i = 0; i < 3; i += 1)
      ids.push(await submitTask(server.url, taskBody(`counts-d-${i}`, queue)));
    const depth = (s: Map<string, number>, state: string) =>
      s.get(`ledgence_queue_depth{queue="${queue}",state="${state}"}`) ?? 0;
    await until(async () => depth(await scrape(server.url), 'queued') === 3, 10_000, 'depth 3');
    // Each claimed and settled at once: the leases here last a second (SHORT_TIMINGS).
    const claimed = [];
    for (let i = 0; i < 3; i += 1) claimed.push(await claimNext(server.url, queue));
    for (const a of claimed) {
      const settled = await call(
        server.url,
        '/v1/worker/settle',
        settleBody(a, { kind: 'success', output: null }),
      );
      expect(settled.status).toBe(200);
    }
    await until(
      async () => {
        const s = await scrape(server.url);
        return depth(s, 'queued') === 0 && depth(s, 'active') === 0;
      },
      10_000,
      'back to baseline',
    );
  });

  it('ledgence_retention_removed_total summed over two replicas equals the rows removed, kind by kind (attempts and subscriptions included)', async () => {
    const receiver = createServer((request, response) => {
      request.resume();
      request.on('end', () => response.writeHead(204).end());
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    const origin = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
    const destinations = JSON.stringify({
      ok: { url: `${origin}/ok`, secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}` },
    });
    const env = {
      LEDGENCE_RETENTION_INTERVAL_MS: '200',
      LEDGENCE_CALLBACK_DESTINATIONS: destinations,
    };
    const replicas = [await stack.start(env), await stack.start(env)];
    const store = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
    const sql = store.sql;
    try {
      const [a, b] = replicas as [ServerProcess, ServerProcess];
      const queue = 'counts-ret';
      const run = await submitTask(a.url, taskBody('counts-ret-run', queue));
      const sub = await call<{ id: string }>(
        a.url,
        `${TASKS_BASE}/tasks/${run}/completion-subscriptions`,
        { subscription_key: 'k1', destination: 'ok' },
      );
      expect(sub.status).toBeLessThan(300);
      const assignment = await claimNext(b.url, queue);
      expect(
        (
          await call(
            b.url,
            '/v1/worker/settle',
            settleBody(assignment, { kind: 'success', output: null }),
          )
        ).status,
      ).toBe(200);
      const cancelled = await submitTask(a.url, taskBody('counts-ret-cancel', queue));
      expect((await call(b.url, `${TASKS_BASE}/tasks/${cancelled}/cancel`, {})).status).toBe(200);
      await until(
        async () =>
          (
            await sql`select 1 from completion_deliveries where task_id = ${run} and state = 'delivered'`
          ).length === 1,
        20_000,
        'delivered',
      );
      const ids = [run, cancelled];
      const count = async (table: string) =>
        Number(
          (await sql`select count(*)::int as n from ${sql(table)} where task_id in ${sql(ids)}`)[0]
            ?.n,
        );
      const expected = {
        tasks: 2,
        attempts: await count('attempts'),
        history: await count('task_history'),
        subscriptions: await count('completion_subscriptions'),
      };
      expect(expected.attempts).toBe(1);
      expect(expected.subscriptions).toBe(1);
      const removedOf = (s: Map<string, number>, kind: string) =>
        s.get(`ledgence_retention_removed_total{kind="${kind}"}`) ?? 0;
      const sum = async (kind: string) => {
        let n = 0;
        for (const r of replicas) n += removedOf(await scrape(r.url), kind);
        return n;
      };
      const before = {
        tasks: await sum('tasks'),
        attempts: await sum('attempts'),
        history: await sum('history'),
        subscriptions: await sum('subscriptions'),
      };
      const week = 8 * 24 * 3600 * 1000;
      await sql`update tasks set terminal_at = terminal_at - ${week}::bigint where task_id in ${sql(ids)}`;
      await sql`update completion_deliveries set finished_at = finished_at - ${week}::bigint
        where task_id in ${sql(ids)}`;
      await until(async () => (await count('tasks')) === 0, 20_000, 'both tasks removed');
      await sleep(300);
      expect({
        tasks: (await sum('tasks')) - before.tasks,
        attempts: (await sum('attempts')) - before.attempts,
        history: (await sum('history')) - before.history,
        subscriptions: (await sum('subscriptions')) - before.subscriptions,
      }).toEqual(expected);
    } finally {
      await store.close();
      receiver.closeAllConnections();
      await new Promise<void>((resolve) => receiver.close(() => resolve()));
    }
  });
});
