/**
 * The Client against a real server (review r51a): scope text with URL-special characters,
 * a url with a path prefix (behind a prefix-stripping proxy), batches whose reply is lost
 * with given keys, subscriptions, and configuration checks.
 */
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client, ProblemError, silentLogger, TransportError } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, startHttpProxy, TENANT } from './test/harness.js';

const stack = new Stack('r51a_client');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: {
        url: 'http://127.0.0.1:9/hook',
        secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
        timeout_ms: 500,
      },
    }),
  });
});
afterAll(async () => {
  await stack.close();
});

function clientOf(options: Partial<ConstructorParameters<typeof Client>[0]> = {}): Client {
  return new Client({
    url: server.url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    backoff: { baseMs: 10, maxMs: 50 },
    ...options,
  });
}

/** A proxy serving the server under `prefix`: strips it, answers 404 to anything else. */
async function prefixProxy(prefix: string) {
  const target = new URL(server.url);
  const seen: string[] = [];
  const proxy = createServer((req, res) => {
    const path = req.url ?? '';
    seen.push(path);
    if (!path.startsWith(`${prefix}/`)) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('no');
      return;
    }
    const out = httpRequest(
      {
        host: target.hostname,
        port: target.port,
        method: req.method,
        path: path.slice(prefix.length),
        headers: req.headers,
      },
      (reply) => {
        res.writeHead(reply.statusCode ?? 502, reply.headers);
        reply.pipe(res);
      },
    );
    out.on('error', () => res.destroy());
    req.pipe(out);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  const { port } = proxy.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        proxy.closeAllConnections();
        proxy.close(() => resolve());
      }),
  };
}

describe('scope text with URL-special characters', () => {
  for (const tenant of [
    'a/b',
    'a%b',
    'a?b',
    'a#b',
    'a b',
    'ü+x',
    "a'(b)*!",
    'a%2Fb',
    'a;b',
    'a\\b',
  ]) {
    it(`tenant ${JSON.stringify(tenant)}: every call reaches its own scope`, async () => {
      const c = clientOf({ tenant, namespace: `n ${tenant}` });
      const task = await c.submit({ queue: 'q', program: 'p', labels: { t: 'x' } });
      expect(task.input.tenant_id).toBe(tenant);
      expect(task.input.namespace).toBe(`n ${tenant}`);
      expect((await c.status(task.task_id)).task_id).toBe(task.task_id);
      expect((await c.snapshot(task.task_id)).task_id).toBe(task.task_id);
      const ids: string[] = [];
      for await (const page of c.list({ labels: { t: 'x' } })) {
        for (const t of page.tasks) ids.push(t.task_id);
      }
      expect(ids).toEqual([task.task_id]);
      expect(await c.cancel(task.task_id)).toBe('cancelled');
      const result = await c.result(task.task_id, { waitMs: 100 });
      expect(result.outcome.state).not.toBe('pending');
      const history = [];
      for await (const page of c.history(task.task_id)) history.push(...page);
      expect(history.length).toBeGreaterThan(0);
      // Not visible from the plain scope.
      const other = await clientOf()
        .status(task.task_id)
        .catch((e: unknown) => e);
      expect(other).toBeInstanceOf(ProblemError);
    });
  }
});

describe('url with a path prefix', () => {
  it('every route goes under the prefix, trailing slashes or not', async () => {
    const proxy = await prefixProxy('/ledgence/api');
    try {
      for (const url of [
        `${proxy.url}/ledgence/api`,
        `${proxy.url}/ledgence/api/`,
        `${proxy.url}/ledgence/api///`,
      ]) {
        const c = clientOf({ url, retries: 0 });
        const task = await c.submit({ queue: 'q-prefix', program: 'p' });
        expect((await c.status(task.task_id)).task_id).toBe(task.task_id);
        const r = await c.result(task.task_id, { waitMs: 50 });
        expect(r.outcome.state).toBe('pending');
        const batch = await c.submitBatch([{ queue: 'q-prefix', program: 'p' }]);
        expect(batch[0]).not.toBeInstanceOf(Error);
        const pages = [];
        for await (const page of c.list({ queue: 'q-prefix', limit: 1 })) pages.push(page);
        expect(pages.length).toBeGreaterThan(1);
        await c.cancel(task.task_id);
      }
      expect(proxy.seen.every((p) => p.startsWith('/ledgence/api/v1/'))).toBe(true);
    } finally {
      await proxy.close();
    }
  });

  it('a url missing the server prefix is a ProblemError naming the url (no_route), not retried', async () => {
    const c = clientOf({ url: `${server.url}/wrong/prefix`, retries: 2 });
    const error = (await c.status('tsk_x').catch((e: unknown) => e)) as ProblemError;
    expect(error).toBeInstanceOf(ProblemError);
    expect(error.code).toBe('not_found');
    expect(error.reason).toBe('no_route');
    expect(error.message).toContain('/wrong/prefix');
    expect(error.retryable).toBe(false);
  });
});

describe('submitBatch with given keys, reply lost', () => {
  it('converges on one task per key; conflicts and local refusals stay in their slots', async () => {
    let drops = 1;
    const proxy = await startHttpProxy(server.url, {
      reply: (ex) => {
        if (ex.path.endsWith('tasks:batch') && drops > 0) {
          drops -= 1;
          return 'drop';
        }
        return 'pass';
      },
    });
    try {
      const c = clientOf({ url: proxy.url });
      const labels = { run: 'batch-lost' };
      await c.submit({ queue: 'q-b', program: 'p', data: 'x', labels }, { idempotencyKey: 'held' });
      const answers = await c.submitBatch([
        { queue: 'q-b', program: 'p', data: 1, labels, idempotencyKey: 'b-1' },
        { queue: 'q-b', program: 'p', data: 2, labels, priority: 9999 },
        { queue: 'q-b', program: 'p', data: 'other', labels, idempotencyKey: 'held' },
        { queue: 'q-b', program: 'p', data: 3, labels },
        { queue: 'q-b', program: 'p', data: 1, labels, idempotencyKey: 'b-1' },
      ]);
      expect(answers[1]).toBeInstanceOf(ProblemError);
      expect((answers[1] as ProblemError).path).toMatch(/^\$\.commands\[1\]/);
      expect(answers[2]).toBeInstanceOf(ProblemError);
      expect((answers[2] as ProblemError).code).toBe('conflict');
      const a0 = answers[0] as { task_id: string };
      const a4 = answers[4] as { task_id: string };
      expect(a0.task_id).toBe(a4.task_id);
      let count = 0;
      for await (const page of c.list({ labels })) count += page.tasks.length;
      expect(count).toBe(3); // held, b-1, and the un-keyed data 3
      expect(drops).toBe(0);
    } finally {
      await proxy.close();
    }
  });
});

describe('completion subscriptions', () => {
  it('a subscription key is idempotent; another destination under it is a conflict', async () => {
    const c = clientOf();
    const task = await c.submit({ queue: 'q-subs', program: 'p' });
    const a = await c.subscribe(task.task_id, { destination: 'billing', subscriptionKey: 's1' });
    const b = await c.subscribe(task.task_id, { destination: 'billing', subscriptionKey: 's1' });
    expect(b.id).toBe(a.id);
    const list = await c.subscriptions(task.task_id);
    expect(JSON.stringify(list)).toContain(a.id);
    const unknown = await c
      .subscribe(task.task_id, { destination: 'nope' })
      .catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(ProblemError);
    expect((unknown as ProblemError).retryable).toBe(false);
  });
});

describe('configuration', () => {
  it('refuses bad urls and keys with a TypeError', () => {
    const bad = [
      { url: 'ftp://127.0.0.1' },
      { url: 'ws://127.0.0.1' },
      { url: 'file:///tmp/x' },
      { url: '127.0.0.1:8080' },
      { url: 'localhost:8080' },
      { url: '' },
      { url: 'http://127.0.0.1:8080?x=1' },
      { url: 'http://127.0.0.1:8080/#' },
      { url: ' http://127.0.0.1:8080' },
      { url: 'http://127.0.0.1:8080\n' },
      { url: 'http://u:p@127.0.0.1:8080' },
      { url: 'http://127.0.0.1:8080', apiKey: 'k_live_1\n' },
      { url: 'http://127.0.0.1:8080', apiKey: ' k_live_1' },
      { url: 'http://127.0.0.1:8080', apiKey: 'k live' },
      { url: 'http://127.0.0.1:8080', apiKey: '' },
      { url: 'http://127.0.0.1:8080', apiKey: 'a=b' },
      { url: 'http://127.0.0.1:8080', requestTimeoutMs: 0 },
      { url: 'http://127.0.0.1:8080', requestTimeoutMs: Number.NaN },
      { url: 'http://127.0.0.1:8080', retries: -1 },
      { url: 'http://127.0.0.1:8080', retries: 1.5 },
      { url: 'http://127.0.0.1:8080', retries: Number.POSITIVE_INFINITY },
      { url: 'http://127.0.0.1:8080', backoff: { baseMs: 0, maxMs: 1 } },
      { url: 'http://127.0.0.1:8080', tenant: ' acme' },
      { url: 'http://127.0.0.1:8080', namespace: '' },
      { url: 'http://127.0.0.1:8080', tenant: '..' },
    ];
    const accepted: unknown[] = [];
    for (const options of bad) {
      try {
        new Client({ tenant: TENANT, namespace: NAMESPACE, ...options } as never);
        accepted.push(options);
      } catch (error) {
        if (!(error instanceof TypeError)) accepted.push({ options, error: String(error) });
      }
    }
    expect(accepted).toEqual([]);
  });

  it('a url with a non-default scheme case or host form still works', async () => {
    const u = new URL(server.url);
    for (const url of [`HTTP://127.0.0.1:${u.port}`, `http://localhost:${u.port}`]) {
      const c = clientOf({ url, retries: 0 });
      const task = await c.submit({ queue: 'q-case', program: 'p' });
      expect(task.task_id).toMatch(/./);
    }
  });

  it('a network error is a TransportError; JSON of errors is data', async () => {
    const c = clientOf({ url: 'http://127.0.0.1:9', retries: 0 });
    const e = (await c.status('t').catch((x: unknown) => x)) as TransportError;
    expect(e).toBeInstanceOf(TransportError);
    expect(JSON.parse(JSON.stringify(e))).toMatchObject({
      name: 'TransportError',
      code: 'transport_error',
      retryable: true,
      reason: 'network',
    });
    const p = (await clientOf()
      .status('tsk_nope')
      .catch((x: unknown) => x)) as ProblemError;
    expect(JSON.parse(JSON.stringify(p))).toMatchObject({
      name: 'ProblemError',
      code: 'not_found',
      retryable: false,
      status: 404,
    });
  });
});
