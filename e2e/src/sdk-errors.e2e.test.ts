/**
 * The SDK's error model against the real server process, over real sockets.
 * Bad caller input must surface as the documented error (a TypeError for configuration, the
 * server's `invalid_input` otherwise), never a stray URIError or a silently different request;
 * replies that break the contract (an HTML page where JSON was due, a gateway's 502 page, a
 * problem body cut short) must reach the Worker as typed errors, retried exactly when retryable.
 */
import { Client, ProblemError, ProtocolError } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import {
  client,
  type HttpProxyOptions,
  NAMESPACE,
  startHttpProxy,
  TENANT,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('sdk_errors');

/** A proxy in front of the suite's server whose `answer` may reply in the server's place. */
async function answeringProxy(answer: HttpProxyOptions['answer']): Promise<string> {
  const proxy = await startHttpProxy(suite.server.url, { answer });
  suite.proxies.push(proxy);
  return proxy.url;
}

const HTML = { 'content-type': 'text/html' };
const PAGE = '<html><body><h1>502 Bad Gateway</h1></body></html>';

describe('bad caller input surfaces as the documented error', () => {
  it('a Client or Worker whose tenant is not well-formed text is refused at construction with a TypeError naming it', () => {
    // README (Worker section): "`Client` and `Worker` check their configuration when constructed
    // and throw a `TypeError` saying what to fix".
    let thrown: unknown;
    try {
      new Client({ url: suite.server.url, tenant: 'acme\ud800', namespace: NAMESPACE });
    } catch (error) {
      thrown = error;
    }
    expect(thrown, `threw ${String(thrown)}`).toBeInstanceOf(TypeError);
    expect((thrown as Error).message).toMatch(/tenant/);
    // A Worker sends its tenant in bodies, not paths, yet no request could carry it either.
    expect(() => suite.worker('se-queue', { tenant: 'acme\udc00' })).toThrow(
      expect.objectContaining({ name: 'TypeError', message: expect.stringMatching(/tenant/) }),
    );
  });

  it('a Client or Worker whose scope or queue is not identifier text is refused at construction, saying why', () => {
    // DESIGN §3's text rules, which the server applies to every call: until 2026-12-05 these
    // constructed, and every call then failed 400 invalid_input.
    const client = (override: Record<string, string>) => () =>
      new Client({ url: suite.server.url, tenant: TENANT, namespace: NAMESPACE, ...override });
    const cases: [() => unknown, string][] = [
      [client({ tenant: ' acme' }), 'tenant must not start or end with whitespace (trim it)'],
      [client({ tenant: 'acme\n' }), 'tenant must not contain control characters (trim it)'],
      [client({ namespace: 'e2\u0007e' }), 'namespace must not contain control characters'],
      [client({ tenant: 'a'.repeat(129) }), 'tenant must be at most 128 UTF-8 bytes'],
      [
        () => suite.worker('se-queue ', {}),
        'queue must not start or end with whitespace (trim it)',
      ],
      [() => suite.worker('q'.repeat(129), {}), 'queue must be at most 128 UTF-8 bytes'],
    ];
    for (const [construct, message] of cases) {
      expect(construct).toThrow(expect.objectContaining({ name: 'TypeError', message }));
    }
    // The limit itself is accepted.
    expect(client({ tenant: 'a'.repeat(128) })()).toBeInstanceOf(Client);
  });

  it('a task id that is not well-formed text rejects as a TypeError or invalid_input, not a URIError', async () => {
    const c = client(suite.server.url);
    for (const call of [() => c.status('tsk_\ud800'), () => c.cancel('tsk_\udc00')]) {
      const error = await call().catch((e: unknown) => e);
      const documented =
        error instanceof TypeError ||
        (error instanceof ProblemError && error.code === 'invalid_input');
      expect(documented, `rejected with ${String(error)}`).toBe(true);
    }
  });

  it('a list filter with a lone surrogate is refused, not sent as U+FFFD and matched against another label', async () => {
    const c = client(suite.server.url);
    const task = await c.submit({
      queue: 'se-fffd',
      program: 'p',
      labels: { team: '\ufffd' },
    });
    // The server refuses escaped surrogates in a query so that "distinct malformed filters [do
    // not] silently match a task labelled U+FFFD" (packages/http/src/query.ts), and DESIGN §4.1
    // rejects lone surrogates; the SDK must not defeat that by rewriting the value before it
    // goes out.
    const answer = await (async () => {
      const ids: string[] = [];
      for await (const page of c.list({ labels: { team: '\ud800' } })) {
        for (const t of page.tasks) ids.push(t.task_id);
      }
      return ids;
    })().catch((e: unknown) => e);
    expect(
      answer,
      `the filter team=\\ud800 listed ${JSON.stringify(answer)} (the task ${task.task_id} is labelled team=\\ufffd)`,
    ).toBeInstanceOf(ProblemError);
    expect(answer).toMatchObject({ code: 'invalid_input' });
  });
});

describe('replies that break the contract reach the Worker as typed errors', () => {
  it('a poll answered 200 with an HTML page stops the worker: run() rejects with a ProtocolError', async () => {
    const proxyUrl = await answeringProxy((req) =>
      req.path.startsWith('/v1/worker/acquire')
        ? { status: 200, headers: HTML, body: '<html>captive portal</html>' }
        : undefined,
    );
    const w = suite.worker('se-html-poll', { url: proxyUrl });
    w.register('p', async () => null);
    const error = await w.run().then(
      () => 'resolved',
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ProtocolError);
    expect(error).toMatchObject({ code: 'protocol_error', retryable: false, status: 200 });
    expect(error).not.toBeInstanceOf(TypeError);
  });

  it('a settlement answered by a gateway 502 page, then cut short, is retried and accepted once', async () => {
    let settles = 0;
    const proxyUrl = await answeringProxy((req) => {
      if (!req.path.startsWith('/v1/worker/settle')) return undefined;
      settles += 1;
      if (settles === 1) return { status: 502, headers: HTML, body: PAGE };
      if (settles === 2) {
        return {
          status: 503,
          headers: { 'content-type': 'application/problem+json' },
          body: '{"type":"https://ledgence.dev/problems/unavail',
          cut: true,
        };
      }
      return undefined;
    });
    const c = client(suite.server.url);
    const task = await c.submit({ queue: 'se-settle-502', program: 'p', data: 5 });
    const w = suite.worker('se-settle-502', { url: proxyUrl });
    let runs = 0;
    w.register('p', async (data) => {
      runs += 1;
      return data;
    });
    const running = w.run();
    const result = await c.result(task.task_id, { waitMs: 20_000 });
    expect(result.outcome).toMatchObject({ state: 'succeeded', output: 5 });
    expect(settles).toBe(3);
    expect(runs).toBe(1);
    const snapshot = await c.snapshot(task.task_id);
    expect(snapshot.attempt_count).toBe(1);
    await w.stop({ graceMs: 0 });
    await running;
  });

  it('a session open answered by a gateway page is retried; a 401 problem stops the worker with its request id', async () => {
    let opens = 0;
    const proxyUrl = await answeringProxy((req) => {
      if (req.path !== '/v1/worker/sessions') return undefined;
      opens += 1;
      if (opens === 1) return { status: 502, headers: HTML, body: PAGE };
      return {
        status: 401,
        headers: { 'content-type': 'application/problem+json' },
        body: JSON.stringify({
          type: 'https://ledgence.dev/problems/unauthorized',
          title: 'Unauthorized',
          status: 401,
          code: 'unauthorized',
          detail: 'A valid API key is required',
          reason: 'key_revoked',
          request_id: 'req-gateway-1',
        }),
      };
    });
    const w = suite.worker('se-open', { url: proxyUrl });
    w.register('p', async () => null);
    const error = await w.run().then(
      () => 'resolved',
      (e: unknown) => e,
    );
    expect(opens).toBe(2);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toMatchObject({
      code: 'unauthorized',
      status: 401,
      retryable: false,
      reason: 'key_revoked',
      requestId: 'req-gateway-1',
    });
  });
});
