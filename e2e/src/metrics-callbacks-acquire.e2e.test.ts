/**
 * DESIGN §11: `/metrics` exposes callback outcomes and acquire latency. The unit tests feed the
 * metrics module by hand; here a real server process delivers to a real receiver and serves a
 * real SDK worker, so what is checked is the wiring: the sender's try outcomes reach
 * `ledgence_callback_deliveries_total` under their own labels (not folded into `other`), and the
 * SDK's parked polls reach `ledgence_acquire_wait_seconds`.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Worker } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { client, Stack, settled, shortWorker, until } from './test/harness.js';
import { metricSamples } from './test/wire.js';

const SECRET = `whsec_${Buffer.alloc(32, 5).toString('base64')}`;

const stack = new Stack('metrics_cb_acquire');
let receiver: Server;
let server: ServerProcess;
/** POSTs per receiver path. */
const seen = new Map<string, number>();

beforeAll(async () => {
  await stack.open();
  // `/flaky` fails its first try (500) and takes the next; `/gone` answers 410 Gone.
  receiver = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      const path = request.url ?? '';
      const count = (seen.get(path) ?? 0) + 1;
      seen.set(path, count);
      const status = path === '/gone' ? 410 : path === '/flaky' && count === 1 ? 500 : 204;
      response.writeHead(status).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const origin = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      flaky: { url: `${origin}/flaky`, secret: SECRET, timeout_ms: 2_000 },
      gone: { url: `${origin}/gone`, secret: SECRET, timeout_ms: 2_000 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  });
});

afterAll(async () => {
  await stack.close();
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
});

/** The samples of a scrape, keyed by `name{labels}` exactly as exposed. */
async function scrape(): Promise<Map<string, number>> {
  const response = await fetch(`${server.url}/metrics`);
  expect(response.status).toBe(200);
  return metricSamples(await response.text());
}

/** Runs every task of `queue` with an echo worker until `taskIds` are terminal. */
async function runAll(queue: string, taskIds: string[]): Promise<void> {
  const worker: Worker = shortWorker(server.url, queue);
  worker.register('echo', (data) => data);
  const running = worker.run();
  try {
    await settled(client(server.url), taskIds);
  } finally {
    await worker.stop({ graceMs: 0 });
    await running;
  }
}

describe('/metrics of a sending server process', () => {
  it('counts each delivery try by destination under its own outcome (retry, delivered, gone) and times it', async () => {
    const c = client(server.url);
    const queue = 'metrics-cb';
    const flaky = await c.submit({ queue, program: 'echo', data: 1 });
    const gone = await c.submit({ queue, program: 'echo', data: 2 });
    await c.subscribe(flaky.task_id, { destination: 'flaky' });
    await c.subscribe(gone.task_id, { destination: 'gone' });
    await runAll(queue, [flaky.task_id, gone.task_id]);
    await until(
      async () =>
        (await c.subscriptions(flaky.task_id))[0]?.state === 'delivered' &&
        (await c.subscriptions(gone.task_id))[0]?.state === 'exhausted',
      30_000,
      'both deliveries finished',
    );
    // A try is counted once its report is written, just after the state the view shows.
    let samples = await scrape();
    const tries = (destination: string, outcome: string) =>
      samples.get(
        `ledgence_callback_deliveries_total{destination="${destination}",outcome="${outcome}"}`,
      );
    await until(
      async () => {
        samples = await scrape();
        // The backlog read answers the scrapes of the next second (metrics.ts sharedRead).
        return (
          tries('flaky', 'delivered') !== undefined &&
          tries('gone', 'gone') !== undefined &&
          samples.get('ledgence_callback_due_backlog') === 0
        );
      },
      10_000,
      'the last tries counted',
    ).catch(() => undefined);
    expect(tries('flaky', 'retry')).toBe(1);
    expect(tries('flaky', 'delivered')).toBe(1);
    expect(tries('gone', 'gone')).toBe(1);
    expect(tries('flaky', 'other')).toBeUndefined();
    expect(tries('gone', 'other')).toBeUndefined();
    expect(samples.get('ledgence_callback_delivery_duration_seconds_count{outcome="retry"}')).toBe(
      1,
    );
    expect(
      samples.get('ledgence_callback_delivery_duration_seconds_count{outcome="delivered"}'),
    ).toBe(1);
    // Nothing is left due once both are finished.
    expect(samples.get('ledgence_callback_due_backlog')).toBe(0);
  });

  it('times the long polls of an SDK worker in ledgence_acquire_wait_seconds', async () => {
    const before = await scrape();
    const parked = (samples: Map<string, number>, outcome: string) =>
      samples.get(`ledgence_acquire_wait_seconds_count{long_poll="true",outcome="${outcome}"}`) ??
      0;
    const c = client(server.url);
    const queue = 'metrics-acquire';
    const task = await c.submit({ queue, program: 'echo', data: null });
    await runAll(queue, [task.task_id]);
    const after = await scrape();
    // The worker's first poll was assigned the task; a later parked poll may end empty.
    expect(parked(after, 'assigned')).toBeGreaterThanOrEqual(parked(before, 'assigned') + 1);
    const sum = after.get('ledgence_acquire_wait_seconds_sum{long_poll="true",outcome="assigned"}');
    expect(sum).toBeGreaterThanOrEqual(0);
  });
});
