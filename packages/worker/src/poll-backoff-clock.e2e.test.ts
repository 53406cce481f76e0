/**
 * A slot refused as `consumer_busy` polls again once its backoff ends, however the clock moves
 * between the worker's readings of it. On a loaded machine the process may be descheduled
 * between any two statements, so two readings taken one after the other can straddle the end of
 * a backoff: the acquire loop once skipped the slot by one reading ("still backing off") and
 * computed its wait from a later one ("no backoff left"), then waited, with no timeout, for a
 * notification nothing would send — the worker never polled again (seen as a flaky
 * handler-outcomes e2e test under CPU pressure: the next task was never claimed).
 *
 * The test's clock is the real one plus `step` ms per reading (each reading comes `step` after
 * the last, as if the worker were descheduled before each); backoff jitter is pinned, so every
 * backoff is 50 ms. Sweeping `step` puts a backoff's end between two consecutive readings
 * whatever the number of readings the loop takes — over real sockets, against a stand-in server.
 */
import type { AcquireCommand } from '@ledgence/contracts';
import { afterEach, expect, it, vi } from 'vitest';
import { silentLogger } from './logger.js';
import { stubServers } from './testdata/stub-servers.js';
import { Worker } from './worker.js';

const scope = { tenant_id: 'acme', namespace: 'prod' };
const stubs = stubServers();
const workers: Worker[] = [];
afterEach(async () => {
  vi.restoreAllMocks();
  await Promise.all(workers.splice(0).map((worker) => worker.stop({ graceMs: 0 })));
});

/** A stand-in server: sessions open; the first poll is refused `consumer_busy`, later ones park. */
async function busyOnceServer(): Promise<{ url: string; polls: () => number }> {
  let polls = 0;
  const url = await stubs.serve((req, res, body) => {
    const json = (status: number, value: unknown) =>
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));
    if (req.url?.startsWith('/v1/worker/sessions')) {
      json(201, {
        id: 'ses_1',
        scope,
        queue: 'q',
        concurrency: 1,
        expires_at: Date.now() + 300_000,
      });
      return;
    }
    const commands = (JSON.parse(body) as { commands: AcquireCommand[] }).commands;
    polls += 1;
    if (polls === 1) {
      json(200, {
        replies: commands.map(() => ({
          type: 'https://ledgence.dev/problems/consumer_busy',
          title: 'Consumer busy',
          status: 409,
          code: 'consumer_busy',
          detail: 'consumer 0 still holds attempt att_0; settle it first',
        })),
      });
      return;
    }
    const timer = setTimeout(
      () =>
        json(200, {
          replies: commands.map((c) => ({ disposition: 'empty', sequence: c.sequence })),
        }),
      Number(new URL(req.url ?? '', 'http://x').searchParams.get('wait_ms') ?? 0),
    );
    res.on('close', () => clearTimeout(timer));
  });
  return { url, polls: () => polls };
}

const steps = Array.from({ length: 25 }, (_, i) => 2 * (i + 1));

it.for(steps)(
  'polls again after a consumer_busy backoff when %i ms pass between clock readings',
  async (step) => {
    const server = await busyOnceServer();
    const real = performance.now.bind(performance);
    let offset = 0;
    vi.spyOn(performance, 'now').mockImplementation(() => {
      offset += step;
      return real() + offset;
    });
    // Full jitter at its floor: every backoff is half its ceiling, 50 ms.
    vi.spyOn(Math, 'random').mockReturnValue(0);
    const worker = new Worker({
      url: server.url,
      tenant: 'acme',
      namespace: 'prod',
      queue: 'q',
      concurrency: 1,
      logger: silentLogger,
      pollWaitMs: 200,
      backoff: { baseMs: 100, maxMs: 100 },
    });
    workers.push(worker);
    worker.register('p', () => null);
    void worker.run();
    const deadline = Date.now() + 3_000;
    while (server.polls() < 2 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect(server.polls()).toBeGreaterThanOrEqual(2);
  },
);
