/**
 * The SDK (Client and Worker) behind a proxy that misbehaves — rewrites replies,
 * answers with its own pages — against the real server process over real sockets.
 */

import { type AddressInfo, createConnection, createServer, type Socket } from 'node:net';
import { ContractError, problemDocument, type TaskResult } from '@ledgence/contracts';
import { Client, type Logger, ProtocolError, silentLogger } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  client,
  NAMESPACE,
  settled,
  sleep,
  startHttpProxy,
  TENANT,
  until,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('proxy_faults', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '60000',
});

/** A logger keeping its warnings. */
function warnings(): { logger: Logger; warned: [string, unknown][] } {
  const warned: [string, unknown][] = [];
  return {
    warned,
    logger: { ...silentLogger, warn: (message, fields) => warned.push([message, fields]) },
  };
}

const UNAVAILABLE = problemDocument(new ContractError('unavailable', 'commit outcome unknown'));

describe('Client behind a misbehaving proxy', () => {
  it('batch items answered unavailable and retried log one warning for the run, not one per retry', async () => {
    let rewrites = 0;
    const proxy = await startHttpProxy(suite.server.url, {
      reply: (exchange) => {
        if (!exchange.path.endsWith('/tasks:batch') || rewrites === 0) return 'pass';
        rewrites -= 1;
        const results = (JSON.parse(exchange.reply) as { results: unknown[] }).results;
        return { body: JSON.stringify({ results: results.map(() => UNAVAILABLE) }) };
      },
    });
    suite.proxies.push(proxy);
    const { logger, warned } = warnings();
    const c = new Client({
      url: proxy.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger,
      retries: 3,
      backoff: { baseMs: 5, maxMs: 10 },
    });
    // Two calls in a row, each through three unavailable answers before its items are taken.
    for (const data of [1, 2]) {
      rewrites = 3;
      const answers = await c.submitBatch([{ queue: 'pf-batch-log', program: 'p', data }]);
      expect(answers[0]).not.toBeInstanceOf(Error);
    }
    // README (Logging): "A `Client` logs the retries of all its calls the same way": a run's
    // first failure is a warning (then one a minute), and its end says so. Each call's three
    // unavailable answers are one run, ended when its items are taken: one warning each, not three.
    const messages = warned.map(([m]) => m);
    expect(messages).toEqual([
      'batch items unavailable; retrying them',
      'batch items unavailable; retrying them',
    ]);
  });

  it('a submit whose 200 reply a proxy truncates (complete JSON cut, right length) is a ProtocolError, sent once, one task', async () => {
    let submits = 0;
    const proxy = await startHttpProxy(suite.server.url, {
      reply: (exchange) => {
        if (exchange.method !== 'POST' || !exchange.path.endsWith('/tasks')) return 'pass';
        submits += 1;
        return { body: exchange.reply.slice(0, Math.floor(exchange.reply.length / 2)) };
      },
    });
    suite.proxies.push(proxy);
    const c = new Client({
      url: proxy.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
      backoff: { baseMs: 5, maxMs: 10 },
    });
    const labels = { case: 'pf-truncated' };
    const error = await c
      .submit({ queue: 'pf-trunc', program: 'p', labels }, { idempotencyKey: 'pf-trunc-1' })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProtocolError);
    expect(error).toMatchObject({ code: 'protocol_error', retryable: false, status: 201 });
    expect(submits).toBe(1);
    // The same key through a sound path converges on the one task.
    const direct = client(suite.server.url);
    const again = await direct.submit(
      { queue: 'pf-trunc', program: 'p', labels },
      { idempotencyKey: 'pf-trunc-1' },
    );
    let count = 0;
    for await (const page of direct.list({ labels })) count += page.tasks.length;
    expect(count).toBe(1);
    expect(again.state).toBe('queued');
  });
});

/**
 * A TCP proxy to `target` that sends the first reply of each connection twice, the copy a
 * moment later, when the connection is idle and kept alive for the next request.
 */
async function duplicatingProxy(target: string): Promise<{ url: string; close(): Promise<void> }> {
  const port = Number(new URL(target).port);
  const sockets = new Set<Socket>();
  const server = createServer((down) => {
    const up = createConnection({ host: '127.0.0.1', port });
    for (const s of [down, up]) {
      sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => {
        down.destroy();
        up.destroy();
      });
    }
    down.on('data', (chunk) => up.write(chunk));
    const first: Buffer[] = [];
    let replies = 0;
    up.on('data', (chunk: Buffer) => {
      down.write(chunk);
      if (replies === 0) {
        replies = 1;
        setTimeout(() => {
          for (const part of first) down.write(part);
          replies = 2;
        }, 50);
      }
      if (replies === 1) first.push(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port: own } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${own}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

describe('Client behind a proxy that duplicates a reply on a kept-alive connection', () => {
  it('the next call on that connection gets its own answer, not the stale copy', async () => {
    const direct = client(suite.server.url);
    const a = await direct.submit({ queue: 'pf-dup', program: 'p', data: 'a' });
    const b = await direct.submit({ queue: 'pf-dup', program: 'p', data: 'b' });
    const proxy = await duplicatingProxy(suite.server.url);
    suite.proxies.push(proxy);
    const c = new Client({
      url: proxy.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
      backoff: { baseMs: 5, maxMs: 10 },
    });
    expect((await c.status(a.task_id)).task_id).toBe(a.task_id);
    await sleep(200);
    const second = await c.status(b.task_id).catch((e: unknown) => e);
    expect(second).not.toBeInstanceOf(Error);
    expect((second as { task_id: string }).task_id).toBe(b.task_id);
    const third = await c.snapshot(b.task_id);
    expect(third.task_id).toBe(b.task_id);
  });
});

describe('Worker behind a misbehaving proxy', () => {
  it('a quiescence confirmation retried through an outage is a warning once, not one per retry', async () => {
    let refusals = 6;
    const proxy = await startHttpProxy(suite.server.url, {
      refuse: (request) => {
        if (request.path !== '/v1/worker/quiescence' || refusals === 0) return false;
        refusals -= 1;
        return true;
      },
    });
    suite.proxies.push(proxy);
    const c = client(suite.server.url);
    const task = await c.submit({
      queue: 'pf-quiesce',
      program: 'p',
      timeout_ms: 1_000,
      retry: { max_attempts: 1, delay_ms: 100 },
    });
    const { logger, warned } = warnings();
    const w = suite.worker('pf-quiesce', {
      url: proxy.url,
      logger,
      abortGraceMs: 20,
      backoff: { baseMs: 10, maxMs: 40 },
    });
    let returned = false;
    w.register('p', async () => {
      // Deaf to its signal: reported `unconfirmed` once its budget and abort grace end.
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      returned = true;
      return null;
    });
    const running = w.run();
    await until(() => returned && refusals === 0, 30_000, 'the confirmations refused');
    const [result] = await settled(c, [task.task_id]);
    expect(result?.outcome.state).toBe('failed');
    await w.stop({ graceMs: 0 });
    await running;
    const confirmations = warned.filter(([m]) => m.includes('quiescence'));
    // Six refusals in a row are one outage of one loop: README (Logging) "with the default
    // logger, the warnings stop" — one warning at the run's first failure, not one per retry.
    expect(confirmations.length, JSON.stringify(confirmations)).toBeLessThanOrEqual(1);
  });

  it('settlements sharing a request that a gateway refuses with its 413 page are each sent alone, not dropped', async () => {
    // A gateway in front of the server with a 1 MiB body limit (nginx's default
    // client_max_body_size) answers its own HTML 413 page to a larger request.
    let refused = 0;
    const settleSizes: number[] = [];
    const proxy = await startHttpProxy(suite.server.url, {
      answer: (request) => {
        if (!request.path.startsWith('/v1/worker/settle')) return undefined;
        settleSizes.push(request.body.length);
        // Once: the attempts that follow pass whatever their size.
        if (request.body.length <= 1024 * 1024 || refused > 0) return undefined;
        refused += 1;
        return {
          status: 413,
          headers: { 'content-type': 'text/html' },
          body: '<html><head><title>413 Request Entity Too Large</title></head><body><center><h1>413 Request Entity Too Large</h1></center><hr><center>nginx</center></body></html>',
        };
      },
    });
    suite.proxies.push(proxy);
    const c = client(suite.server.url);
    const retry = { max_attempts: 3, delay_ms: 100 };
    const a = await c.submit({ queue: 'pf-413', program: 'p', data: 'a', retry });
    const b = await c.submit({ queue: 'pf-413', program: 'p', data: 'b', retry });
    const { logger, warned } = warnings();
    const w = suite.worker('pf-413', { url: proxy.url, concurrency: 2, logger });
    const runs = new Map<string, number>();
    let started = 0;
    let release = () => {};
    const both = new Promise<void>((resolve) => {
      release = resolve;
    });
    w.register('p', async (data) => {
      runs.set(String(data), (runs.get(String(data)) ?? 0) + 1);
      started += 1;
      if (started === 2) release();
      await both;
      // Each output fits the gateway alone (600 KB); two in one request do not.
      return { data, pad: 'x'.repeat(600_000) };
    });
    const running = w.run();
    const [ra, rb] = (await settled(c, [a.task_id, b.task_id])) as [TaskResult, TaskResult];
    await w.stop({ graceMs: 0 });
    await running;
    const seen = JSON.stringify({
      settleSizes,
      runs: Object.fromEntries(runs),
      a: ra.outcome,
      b: rb.outcome,
      warned: warned.map(([m]) => m),
    }).slice(0, 2000);
    expect(refused, seen).toBe(1);
    expect(ra.outcome.state, seen).toBe('succeeded');
    expect(rb.outcome.state, seen).toBe('succeeded');
    // README (Settlement): "A request of several settlements refused as payload_too_large loses
    // none of them: each is sent again in a request of its own." Each handler ran once.
    expect(Object.fromEntries(runs)).toEqual({ a: 1, b: 1 });
    expect((await c.snapshot(a.task_id)).attempt_count).toBe(1);
    expect((await c.snapshot(b.task_id)).attempt_count).toBe(1);
  });
});
