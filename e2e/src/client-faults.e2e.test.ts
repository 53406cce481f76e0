/**
 * The SDK `Client` against the real server when the network and the
 * server misbehave — oversized batches, authentication failures, restarts during a result wait.
 */
import { BATCH_MAX_BYTES } from '@ledgence/contracts';
import { Client, ProblemError, silentLogger, TransportError } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  NAMESPACE,
  portOf,
  Stack,
  shortWorker,
  startHttpProxy,
  startProxy,
  TENANT,
} from './test/harness.js';

/** How many tasks of the scope `c` lists with `labels`, over every page. */
async function tasksLabelled(c: Client, labels: Record<string, string>): Promise<number> {
  let count = 0;
  for await (const page of c.list({ labels })) count += page.tasks.length;
  return count;
}

/** A client of the test scope whose retries back off briefly (10–20 ms). */
function retryingClient(url: string): Client {
  return new Client({
    url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    backoff: { baseMs: 10, maxMs: 20 },
  });
}

const stack = new Stack('client_faults');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterAll(async () => {
  await stack.close();
});

describe('Client faults', () => {
  it('a batch over the server body limit fails as payload_too_large, sent once, not as a retried network error', async () => {
    const retried: unknown[] = [];
    const logger = {
      ...silentLogger,
      warn: (message: string, fields?: unknown) => retried.push([message, fields]),
    };
    {
      const c = new Client({
        url: server.url,
        tenant: TENANT,
        namespace: NAMESPACE,
        logger,
        backoff: { baseMs: 10, maxMs: 20 },
      });
      // Every entry is valid on its own (≤ 1 MiB of data); together they exceed BATCH_MAX_BYTES.
      const data = 'x'.repeat(1024 * 1024 - 16);
      const count = Math.ceil(BATCH_MAX_BYTES / (1024 * 1024)) + 1;
      const entries = Array.from({ length: count }, (_, i) => ({
        queue: 'q-big',
        program: 'p',
        data: `${i}${data}`.slice(0, 1024 * 1024 - 16),
      }));
      const error = await c.submitBatch(entries).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ProblemError);
      expect(error).toMatchObject({ code: 'payload_too_large', retryable: false });
      // Again on a kept-alive connection the client already used.
      await c.submit({ queue: 'q-big', program: 'p' });
      const again = await c.submitBatch(entries).catch((e: unknown) => e);
      expect(again).toBeInstanceOf(ProblemError);
      expect(again).toMatchObject({ code: 'payload_too_large', retryable: false });
      expect(retried).toEqual([]);
    }
  });

  it('401 and 403 are ProblemErrors, not retried, with the server detail as message', async () => {
    const key = 'client-faults-key-1';
    const keyed = await stack.start({
      LEDGENCE_API_KEYS: JSON.stringify([
        { key, tenant: TENANT, namespaces: ['other'], roles: ['client'] },
      ]),
      HOST: '127.0.0.1',
    });
    let sent = 0;
    const proxy = await startHttpProxy(keyed.url, {
      observe: () => {
        sent += 1;
        return undefined;
      },
    });
    try {
      const base = { url: proxy.url, tenant: TENANT, logger: silentLogger, retries: 3 };
      const unauthorized = await new Client({ ...base, namespace: NAMESPACE, apiKey: 'wrong' })
        .submit({ queue: 'q', program: 'p' })
        .catch((e: unknown) => e);
      expect(unauthorized).toBeInstanceOf(ProblemError);
      expect(unauthorized).toMatchObject({ code: 'unauthorized', status: 401, retryable: false });
      expect((unauthorized as Error).message).toMatch(/API key/);
      expect(sent).toBe(1);
      const forbidden = await new Client({ ...base, namespace: NAMESPACE, apiKey: key })
        .submit({ queue: 'q', program: 'p' })
        .catch((e: unknown) => e);
      expect(forbidden).toBeInstanceOf(ProblemError);
      expect(forbidden).toMatchObject({ code: 'forbidden', status: 403, retryable: false });
      expect((forbidden as Error).message).toMatch(/API key/);
      expect(sent).toBe(2);
    } finally {
      await proxy.close();
    }
  });

  it('result() with a wait rides out a server killed and restarted on the same port', async () => {
    const first = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '10000' });
    const proxy = await startProxy(first.url);
    try {
      const c = new Client({
        url: proxy.url,
        tenant: TENANT,
        namespace: NAMESPACE,
        logger: silentLogger,
        retries: 50,
        backoff: { baseMs: 20, maxMs: 100 },
      });
      const task = await c.submit({ queue: 'q-restart', program: 'p', data: 7 });
      const waiting = c.result(task.task_id, { waitMs: 10_000 });
      await new Promise((r) => setTimeout(r, 300));
      await first.stop('SIGKILL');
      const second = await stack.start({
        PORT: portOf(first.url),
        LEDGENCE_LONG_POLL_WAIT_MS: '10000',
      });
      const worker = shortWorker(second.url, 'q-restart');
      worker.register('p', async (data) => data);
      const running = worker.run();
      try {
        const result = await waiting;
        expect(result.outcome).toMatchObject({ state: 'succeeded', output: 7 });
      } finally {
        await worker.stop();
        await running;
      }
    } finally {
      await proxy.close();
    }
  });

  it('a TransportError is what a request meets when nothing listens', async () => {
    const c = new Client({
      url: 'http://127.0.0.1:1',
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
      retries: 1,
      backoff: { baseMs: 1, maxMs: 2 },
    });
    const error = await c.status('tsk_x').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TransportError);
  });

  it('submitBatch whose reply is lost is retried with the same keys: each entry makes one task', async () => {
    const proxy = await startProxy(server.url);
    const bodies: string[] = [];
    const observer = await startHttpProxy(proxy.url, {
      observe: (request) => {
        bodies.push(request.body.toString());
        return undefined;
      },
    });
    try {
      const c = retryingClient(observer.url);
      proxy.dropReplies(1);
      const results = await c.submitBatch([
        { queue: 'q-batch-lost', program: 'p', data: 1, labels: { case: 'batch-lost' } },
        { queue: 'q-batch-lost', program: 'p', data: 2, labels: { case: 'batch-lost' } },
      ]);
      expect(bodies).toHaveLength(2);
      expect(bodies[1]).toBe(bodies[0]);
      expect(await tasksLabelled(c, { case: 'batch-lost' })).toBe(2);
      expect(results.every((r) => !(r instanceof Error))).toBe(true);
    } finally {
      await observer.close();
      await proxy.close();
    }
  });

  // The server holds the first read for its whole wait; its reply is then lost, and the client
  // sends the read again: by a retry on a fresh connection, or by the exchange's resend when the
  // lost reply was on a connection kept alive from an earlier call (the submit through `c`).
  it.each([
    ['retried after a lost reply', 'fresh'],
    ['on a kept-alive connection, its reply lost,', 'kept-alive'],
  ] as const)('result() %s asks only for what is left of its wait', async (_, connection) => {
    const slow = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '5000' });
    const proxy = await startProxy(slow.url);
    const waits: number[] = [];
    const observer = await startHttpProxy(proxy.url, {
      observe: (request) => {
        const match = /[?&]wait_ms=(\d+)/.exec(request.path);
        if (request.path.includes('/result')) waits.push(match ? Number(match[1]) : 0);
        return undefined;
      },
    });
    try {
      const c = retryingClient(observer.url);
      const submitter = connection === 'kept-alive' ? c : client(slow.url);
      const task = await submitter.submit({ queue: 'q-nobody-wait', program: 'p' });
      proxy.dropReplies(1);
      const result = await c.result(task.task_id, { waitMs: 1_500 });
      expect(result.outcome).toEqual({ state: 'pending' });
      expect(waits).toHaveLength(2);
      // The first read asks for what is left when it is sent (all of it, unless a loaded
      // machine held the call a few milliseconds first); the server held it that long, so a
      // second full wait would make the call wait twice as long as asked.
      const [first = 0, second] = waits;
      expect(first).toBeLessThanOrEqual(1_500);
      expect(first).toBeGreaterThan(1_000);
      expect(second).toBeLessThan(1_500 - first + 100);
    } finally {
      await observer.close();
      await proxy.close();
    }
  });

  it('a submit with every optional field whose reply is lost returns the one task, not a conflict', async () => {
    const proxy = await startProxy(server.url);
    try {
      const c = retryingClient(proxy.url);
      const input = {
        queue: 'q-full',
        program: { name: 'p', version: 'v1' },
        data: { a: [1, 2, { b: null }], s: 'é\u2028' },
        retry: {
          max_attempts: 5,
          delay_ms: 100,
          backoff: 'exponential' as const,
          max_delay_ms: 1000,
        },
        timeout_ms: 60_000,
        delay_ms: 5_000,
        priority: 3,
        concurrency_key: 'ck',
        concurrency_limit: 2,
        labels: { case: 'full-lost', z: '1', a: '2' },
      };
      const originTrace = {
        traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
        tracestate: 'congo=t61rcWkgMzE',
      };
      proxy.dropReplies(1);
      const task = await c.submit(input, { originTrace });
      proxy.dropReplies(1);
      const batch = await c.submitBatch([{ ...input, labels: { case: 'full-lost-batch' } }]);
      expect(batch[0]).not.toBeInstanceOf(Error);
      expect(await tasksLabelled(c, { case: 'full-lost' })).toBe(1);
      expect(task.state).toBe('queued');
    } finally {
      await proxy.close();
    }
  });

  it('a result wait parked when the server is stopped (SIGTERM) resolves or is retried, never fails', async () => {
    const stopping = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '10000' });
    const c = new Client({
      url: stopping.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
      retries: 2,
      backoff: { baseMs: 10, maxMs: 20 },
    });
    const task = await c.submit({ queue: 'q-sigterm', program: 'p' });
    const waiting = c.result(task.task_id, { waitMs: 10_000 }).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    await stopping.stop('SIGTERM');
    const outcome = await waiting;
    expect(outcome).not.toBeInstanceOf(Error);
  });

  it('over a connection that drops requests and replies at random, every call makes exactly its tasks', async () => {
    const proxy = await startProxy(server.url, 0.15, 7);
    try {
      const c = new Client({
        url: proxy.url,
        tenant: TENANT,
        namespace: NAMESPACE,
        logger: silentLogger,
        retries: 30,
        backoff: { baseMs: 5, maxMs: 20 },
      });
      const labels = { case: 'flaky' };
      const ids = new Set<string>();
      for (let i = 0; i < 20; i++) {
        ids.add((await c.submit({ queue: 'q-flaky', program: 'p', data: i, labels })).task_id);
      }
      for (let i = 0; i < 5; i++) {
        const batch = await c.submitBatch(
          Array.from({ length: 4 }, (_, j) => ({
            queue: 'q-flaky',
            program: 'p',
            data: [i, j],
            labels,
          })),
        );
        for (const item of batch) {
          if (item instanceof Error) throw item;
          ids.add(item.task_id);
        }
      }
      const listed: string[] = [];
      for await (const page of c.list({ labels, limit: 7 }))
        listed.push(...page.tasks.map((t) => t.task_id));
      expect(ids.size).toBe(40);
      expect(new Set(listed)).toEqual(ids);
      expect(listed).toHaveLength(40);
      for (const id of [...ids].slice(0, 5)) {
        expect(await c.cancel(id)).toBe('cancelled');
        const history = [];
        for await (const page of c.history(id)) history.push(...page);
        expect(history.map((e) => e.event.reason)).toEqual(['submitted', 'cancelled']);
      }
      expect(proxy.drops()).toBeGreaterThan(0);
    } finally {
      await proxy.close();
    }
  });

  it('a list cursor from one server process continues on another (replica or restart)', async () => {
    const other = await stack.start();
    const a = new Client({
      url: server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
    });
    const b = new Client({
      url: other.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
    });
    const labels = { case: 'cursor-replica' };
    for (let i = 0; i < 5; i++)
      await a.submit({ queue: 'q-cursor', program: 'p', data: i, labels });
    const first = await a.list({ labels, limit: 2 }).next();
    const cursor = first.value?.next_cursor;
    expect(cursor).toBeDefined();
    const rest: string[] = [];
    for await (const page of b.list({ labels, limit: 2, cursor }))
      rest.push(...page.tasks.map((t) => t.task_id));
    expect(rest).toHaveLength(3);
  });

  it('a submit and a batch answered 503 unavailable are sent again with the same keys', async () => {
    let refusals = 3;
    const keys: string[] = [];
    const proxy = await startHttpProxy(server.url, {
      refuse: (request) => {
        if (request.method !== 'POST') return false;
        keys.push(request.body.toString());
        if (refusals === 0) return false;
        refusals -= 1;
        return true;
      },
    });
    try {
      const c = new Client({
        url: proxy.url,
        tenant: TENANT,
        namespace: NAMESPACE,
        logger: silentLogger,
        backoff: { baseMs: 5, maxMs: 10 },
      });
      const labels = { case: 'refused-503' };
      const task = await c.submit({ queue: 'q-503', program: 'p', labels });
      expect(new Set(keys).size).toBe(1);
      expect(keys).toHaveLength(4);
      refusals = 2;
      keys.length = 0;
      const batch = await c.submitBatch([{ queue: 'q-503', program: 'p', data: 2, labels }]);
      expect(new Set(keys).size).toBe(1);
      expect(keys).toHaveLength(3);
      expect(batch[0]).not.toBeInstanceOf(Error);
      expect(await tasksLabelled(c, labels)).toBe(2);
      expect(task.state).toBe('queued');
    } finally {
      await proxy.close();
    }
  });

  it('submitBatch committed but answered unavailable item by item (reply lost after COMMIT) converges to one task each', async () => {
    // The store answers each item `unavailable` when the batch's commit outcome is unknown; the
    // failpoint makes that happen after a real COMMIT.
    const lossy = await stack.start({ LEDGENCE_FAILPOINTS: 'submit.after_commit=error*1' });
    const c = new Client({
      url: lossy.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
      backoff: { baseMs: 5, maxMs: 10 },
    });
    const labels = { case: 'batch-after-commit' };
    const answers = await c.submitBatch([
      { queue: 'q-after-commit', program: 'p', data: 1, labels },
      { queue: 'q-after-commit', program: 'p', data: 2, labels },
    ]);
    expect(await tasksLabelled(c, labels)).toBe(2);
    expect(answers.map((a) => (a instanceof Error ? `${a.name}: ${a.message}` : a.state))).toEqual([
      'queued',
      'queued',
    ]);
  });
});
