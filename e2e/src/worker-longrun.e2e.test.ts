/**
 * A worker runs for weeks and a client for as long as its application: nothing either keeps in
 * memory may grow with the number of tasks, requests or sessions it has served. The real server
 * (two of them, on databases of their own, for sessions lost to a balancer) serves the real
 * worker SDK and client in this process; what they keep is read from heap snapshots, counted by
 * kind of object (heap sizes are noise), and from `process.getActiveResourcesInfo()`.
 */
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { getHeapSnapshot, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { ApplicationError, Client, type Logger, silentLogger, Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, RENEW_MS, Stack, settled, TENANT, until } from './test/harness.js';

let stack: Stack;
let other: Stack;
let server: ServerProcess;
let otherServer: ServerProcess;

beforeAll(async () => {
  stack = await new Stack('longrun_sdk').open();
  other = await new Stack('longrun_sdk_b').open();
  const env = { LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200', LEDGENCE_LONG_POLL_WAIT_MS: '300' };
  [server, otherServer] = await Promise.all([stack.start(env), other.start(env)]);
}, 120_000);
afterAll(async () => {
  await Promise.all([stack?.close(), other?.close()]);
});

/** Run after each test, passed or failed: a worker left running would skew the next counts. */
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** Runs `worker`, stopping it after the test whatever happens. */
function runWorker(worker: Worker): void {
  const running = worker.run();
  cleanups.push(async () => {
    await worker.stop({ graceMs: 0 });
    await running;
  });
}

interface Snapshot {
  /** Reachable heap nodes by `type:name` (e.g. `object:AbortController`). */
  counts: Map<string, number>;
  /** The text of every reachable string. */
  strings: string[];
}

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

/**
 * A heap snapshot, counted by kind of node. Garbage is collected a few times first, a turn of the
 * event loop apart: what a `FinalizationRegistry` lets go of once its target is collected (undici
 * unhooks each `fetch`'s abort listener so) is then gone too, as it would be in a process running
 * on.
 */
async function snapshot(): Promise<Snapshot> {
  for (let i = 0; i < 4; i++) {
    await new Promise((resolve) => setTimeout(resolve, 25));
    gc();
  }
  const chunks: Buffer[] = [];
  for await (const chunk of getHeapSnapshot()) chunks.push(chunk as Buffer);
  const heap = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
    snapshot: { meta: { node_fields: string[]; node_types: [string[]] } };
    nodes: number[];
    strings: string[];
  };
  const fields = heap.snapshot.meta.node_fields;
  const width = fields.length;
  const typeAt = fields.indexOf('type');
  const nameAt = fields.indexOf('name');
  const types = heap.snapshot.meta.node_types[0];
  const counts = new Map<string, number>();
  for (let i = 0; i < heap.nodes.length; i += width) {
    const key = `${types[heap.nodes[i + typeAt] as number]}:${heap.strings[heap.nodes[i + nameAt] as number]}`;
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return { counts, strings: heap.strings };
}

/**
 * The kinds of JavaScript object (objects, closures, their contexts, promise reactions) that grew
 * by at least `atLeast` from `a` to `b`. V8's own bookkeeping (maps, code dependencies, feedback)
 * grows while the JIT warms up, and is left out.
 */
function grown(a: Snapshot, b: Snapshot, atLeast: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [key, count] of b.counts) {
    const js =
      key.startsWith('object:') ||
      key.startsWith('closure:') ||
      key === 'hidden:system / PromiseReaction';
    if (!js) continue;
    const growth = count - (a.counts.get(key) ?? 0);
    if (growth >= atLeast) out[key] = growth;
  }
  return out;
}

/** The distinct `marker-<n>` texts still reachable. */
function reachable(heap: Snapshot, marker: string): Set<string> {
  const found = new Set<string>();
  const pattern = new RegExp(`${marker}-\\d+`, 'g');
  for (const text of heap.strings) for (const m of text.matchAll(pattern)) found.add(m[0]);
  return found;
}

/** Active handles and requests of this process by kind (timers, sockets). */
function resources(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const kind of process.getActiveResourcesInfo()) out[kind] = (out[kind] ?? 0) + 1;
  return out;
}

/**
 * A TCP proxy whose target can be switched (a balancer moving a worker to another deployment)
 * or taken down (new connections closed at once). Switching or going down destroys the open
 * connections.
 */
async function switchingProxy(target: string) {
  let port = Number(new URL(target).port);
  let down = false;
  const sockets = new Set<Socket>();
  const proxy: Server = createServer((downstream) => {
    downstream.on('error', () => {});
    if (down) {
      downstream.destroy();
      return;
    }
    const upstream = createConnection({ host: '127.0.0.1', port });
    upstream.on('error', () => {});
    for (const socket of [downstream, upstream]) {
      sockets.add(socket);
      socket.on('close', () => {
        sockets.delete(socket);
        downstream.destroy();
        upstream.destroy();
      });
    }
    downstream.pipe(upstream);
    upstream.pipe(downstream);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  const address = proxy.address() as { port: number };
  const cut = () => {
    for (const socket of sockets) socket.destroy();
  };
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        cut();
        proxy.close(() => resolve());
      }),
  );
  return {
    url: `http://127.0.0.1:${address.port}`,
    switchTo(url: string) {
      port = Number(new URL(url).port);
      cut();
    },
    setDown(value: boolean) {
      down = value;
      if (value) cut();
    },
  };
}

/** A logger counting its lines by message, keeping nothing else. */
function countingLogger(): Logger & { count(message: string): number } {
  const counts = new Map<string, number>();
  const line = (message: string) => {
    counts.set(message, (counts.get(message) ?? 0) + 1);
  };
  return { debug: line, info: line, warn: line, error: line, count: (m) => counts.get(m) ?? 0 };
}

function clientOf(url: string, options: { fetch?: typeof fetch } = {}): Client {
  return new Client({
    url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    retries: 20,
    backoff: { baseMs: 20, maxMs: 200 },
    ...options,
  });
}

describe('a worker over thousands of tasks of every outcome', () => {
  it('keeps nothing per task once its tasks are settled (no map entry, timer, signal or promise)', async () => {
    const queue = 'longrun-tasks';
    const client = clientOf(server.url);
    const worker = new Worker({
      url: server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue,
      concurrency: 32,
      logger: silentLogger,
      renewIntervalMs: RENEW_MS,
      pollWaitMs: 300,
      requestTimeoutMs: 5_000,
      abortGraceMs: 200,
      backoff: { baseMs: 10, maxMs: 100 },
    });
    const untilAborted = (signal: AbortSignal) =>
      new Promise<never>((_, reject) => {
        if (signal.aborted) reject(signal.reason);
        signal.addEventListener('abort', () => reject(signal.reason), { once: true });
      });
    type Data = { m: string };
    worker
      .register('ok', (data) => ({ m: (data as Data).m }))
      .register('app', (data) => {
        throw new ApplicationError('nope', `refused ${(data as Data).m}`, {
          retryable: false,
          details: { m: (data as Data).m },
        });
      })
      .register('boom', (data) => {
        throw new Error(`boom ${(data as Data).m}`);
      })
      .register('cancel', async (_data, ctx) => {
        await client.cancel(ctx.taskId);
        return untilAborted(ctx.signal);
      })
      .register('timeout', (_data, ctx) => untilAborted(ctx.signal))
      .register('lose', async (_data, ctx) => {
        // Blocks this process past its 1 s lease: the lease is lost locally, then aborted.
        const end = performance.now() + 1_300;
        while (performance.now() < end) {
          // busy
        }
        return untilAborted(ctx.signal);
      });
    runWorker(worker);

    const round = async (marker: string, count: number, extras: boolean) => {
      const kinds = ['ok', 'ok', 'ok', 'app', 'boom'];
      const entries = Array.from({ length: count }, (_, i) => ({
        queue,
        program: kinds[i % kinds.length] as string,
        data: { m: `${marker}-${i}` },
        retry: { max_attempts: 1, delay_ms: 0 },
      }));
      if (extras) {
        for (let i = 0; i < 40; i++) {
          entries.push({
            queue,
            program: i % 2 === 0 ? 'cancel' : 'timeout',
            data: { m: `${marker}-x${i}` },
            retry: { max_attempts: 1, delay_ms: 0 },
            ...(i % 2 === 0 ? {} : { timeout_ms: 1_000 }),
          });
        }
        entries.push({
          queue,
          program: 'lose',
          data: { m: `${marker}-lose` },
          retry: { max_attempts: 1, delay_ms: 0 },
        });
      }
      const ids: string[] = [];
      for (let start = 0; start < entries.length; start += 500) {
        for (const r of await client.submitBatch(entries.slice(start, start + 500))) {
          if (r instanceof Error) throw r;
          ids.push(r.task_id);
        }
      }
      // Each task's result, waited for in turn (a terminal one answers at once).
      const results = await settled(client, ids, 120_000);
      await until(() => worker.inFlight === 0, 30_000, 'the worker holding nothing');
      // The states prove each outcome's path ran.
      const states = new Map<string, number>();
      for (const { outcome } of results) {
        states.set(outcome.state, (states.get(outcome.state) ?? 0) + 1);
      }
      return states;
    };

    const tasks = 1_000;
    await round('zla', tasks, true);
    const first = await snapshot();
    const firstResources = resources();
    const states = await round('zlb', tasks, true);
    expect([...states.keys()].sort()).toEqual(
      expect.arrayContaining(['cancelled', 'failed', 'succeeded']),
    );
    const second = await snapshot();
    const secondResources = resources();

    const kept = reachable(second, 'zla');
    expect(kept.size, [...kept].slice(0, 10).join(' ')).toBeLessThan(tasks / 100);
    // Per task, nothing: allow one object of a kind per 5 tasks of noise (what the process
    // around the SDK allocates meanwhile; a structure kept per task grows by 1 000 or more).
    expect(grown(first, second, tasks / 5)).toEqual({});
    for (const kind of ['Timeout', 'TCPSocketWrap', 'Immediate']) {
      expect(secondResources[kind] ?? 0, kind).toBeLessThanOrEqual((firstResources[kind] ?? 0) + 5);
    }
  }, 240_000);
});

describe('a worker whose session is lost and re-opened many times', () => {
  it('keeps nothing per lost session (no reaction on its stop promise, no old session)', async () => {
    const proxy = await switchingProxy(server.url);
    const logger = countingLogger();
    const worker = new Worker({
      url: proxy.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue: 'longrun-sessions',
      concurrency: 2,
      logger,
      pollWaitMs: 100,
      requestTimeoutMs: 3_000,
      backoff: { baseMs: 1, maxMs: 5 },
    });
    worker.register('noop', () => null);
    runWorker(worker);
    const servers = [server.url, otherServer.url];
    let at = 0;
    // Each switch sends the worker's polls to a deployment that never heard of its session:
    // 404 session_not_found, and a new session is opened there.
    const lose = async (times: number) => {
      for (let i = 0; i < times; i++) {
        const opened = logger.count('session opened');
        at = 1 - at;
        proxy.switchTo(servers[at] as string);
        await until(() => logger.count('session opened') > opened, 20_000, 'a new session');
      }
    };
    await lose(20);
    const first = await snapshot();
    const losses = 200;
    await lose(losses);
    const second = await snapshot();
    const sessionIds = (heap: Snapshot) =>
      heap.strings.filter((s) => /^ses_[0-9a-f]{32}$/.test(s)).length;
    // One object of a kind per two losses is noise; a reaction kept per race is 200 or more.
    expect(grown(first, second, losses / 2)).toEqual({});
    expect(sessionIds(second) - sessionIds(first)).toBeLessThan(losses / 4);
  }, 240_000);

  it('keeps nothing per failed session open while the server is unreachable', async () => {
    const proxy = await switchingProxy(server.url);
    proxy.setDown(true);
    const logger = countingLogger();
    const worker = new Worker({
      url: proxy.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue: 'longrun-opens',
      concurrency: 1,
      logger,
      backoff: { baseMs: 1, maxMs: 2 },
    });
    worker.register('noop', () => null);
    runWorker(worker);
    const failed = () => logger.count('opening a session failed; retrying');
    await until(() => failed() >= 200, 60_000, 'failed opens');
    const first = await snapshot();
    const before = failed();
    await until(() => failed() >= before + 1_000, 120_000, 'more failed opens');
    const second = await snapshot();
    const opens = failed() - before;
    expect(grown(first, second, opens / 4)).toEqual({});
  }, 240_000);
});

describe('a long-lived client', () => {
  for (const transport of ['default', 'fetch'] as const) {
    it(`keeps nothing per call over the ${transport} transport, with an application's long-lived signal`, async () => {
      const client = clientOf(
        server.url,
        transport === 'fetch' ? { fetch: (input, init) => fetch(input, init) } : {},
      );
      // One signal for the application's life, passed to every call (its shutdown).
      const life = new AbortController();
      const signal = life.signal;
      const queue = `longrun-client-${transport}`;
      const calls = async (marker: string, count: number) => {
        for (let i = 0; i < count; i++) {
          const task = await client.submit(
            { queue, program: 'p', data: { m: `${marker}-${i}` } },
            { signal },
          );
          await client.status(task.task_id, { signal });
          // A result wait that parks and ends without a result.
          await client.result(task.task_id, { waitMs: 1, signal });
          if (i % 20 === 0) {
            for await (const page of client.list({ queue, limit: 5, signal })) {
              expect(page.tasks.length).toBeGreaterThan(0);
              break;
            }
          }
        }
      };
      await calls('zca', 100);
      const first = await snapshot();
      const count = 300;
      await calls('zcb', count);
      const second = await snapshot();
      // 3 calls a round: allow one object of a kind per 5 calls of noise.
      expect(grown(first, second, (count * 3) / 5)).toEqual({});
      const kept = reachable(second, 'zca');
      expect(kept.size, [...kept].slice(0, 10).join(' ')).toBeLessThan(10);
      life.abort();
    }, 240_000);
  }
});
