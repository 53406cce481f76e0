import {
  API_KEY_MAX_CHARS,
  ContractError,
  LedgenceError,
  TaskStatusSchema,
  WorkerSessionSchema,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import type { BackoffPolicy } from './backoff.js';
import { Client } from './client.js';
import {
  ApplicationError,
  isRetryable,
  ProblemError,
  ProtocolError,
  TransportError,
} from './errors.js';
import { type FetchLike, HttpTransport } from './http.js';
import type { LogFields } from './logger.js';
import { Worker } from './worker.js';

function respond(status: number, body: string, type = 'application/json'): FetchLike {
  return async () => new Response(body, { status, headers: { 'content-type': type } });
}

const session = {
  id: 'ses_1',
  scope: { tenant_id: 'acme', namespace: 'prod' },
  queue: 'q',
  concurrency: 2,
  expires_at: 1_000,
};

function get(fetch: FetchLike, options: { timeoutMs?: number; signal?: AbortSignal } = {}) {
  const http = new HttpTransport({
    url: 'http://h.invalid/',
    fetch,
    requestTimeoutMs: options.timeoutMs ?? 1_000,
  });
  return http.request({
    method: 'GET',
    path: '/x',
    schema: WorkerSessionSchema,
    maxBytes: 1_000,
    signal: options.signal,
  });
}

const problem = (code: string, status: number, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ type: 'about:blank', title: 't', status, code, detail: `d ${code}`, ...extra });

describe('HttpTransport', () => {
  it('parses a valid reply strictly', async () => {
    const reply = await get(respond(200, JSON.stringify(session)));
    expect(reply).toEqual({ status: 200, body: session, date: null });
  });

  it("reads the reply's Date header, and ignores one it cannot read", async () => {
    const dated =
      (date: string): FetchLike =>
      async () =>
        new Response(JSON.stringify(session), {
          headers: { 'content-type': 'application/json', date },
        });
    const reply = await get(dated('Thu, 03 Dec 2026 11:30:00 GMT'));
    expect(reply.date).toBe(Date.UTC(2026, 11, 3, 11, 30, 0));
    expect((await get(dated('yesterday-ish'))).date).toBeNull();
  });

  it('sends the key, the JSON content type and the query', async () => {
    let seen: { url: string; init: RequestInit } | undefined;
    const http = new HttpTransport({
      url: 'http://h.invalid',
      apiKey: 'k1',
      fetch: async (url, init) => {
        seen = { url, init };
        return new Response(JSON.stringify(session), {
          headers: { 'content-type': 'application/json; charset=utf-8' },
        });
      },
    });
    await http.request({
      method: 'POST',
      path: '/p',
      query: { a: 1, b: undefined },
      body: { x: 1 },
      schema: WorkerSessionSchema,
      maxBytes: 1_000,
    });
    expect(seen?.url).toBe('http://h.invalid/p?a=1');
    const headers = seen?.init.headers as Record<string, string>;
    expect(headers.authorization).toBe('Bearer k1');
    expect(headers['content-type']).toBe('application/json');
    expect(seen?.init.body).toBe('{"x":1}');
  });

  it('maps a problem document to a ProblemError that is a ContractError', async () => {
    const error = await get(
      respond(
        409,
        problem('ownership_lost', 409, { request_id: 'r1', reason: 'expired' }),
        'application/problem+json',
      ),
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toBeInstanceOf(ContractError);
    expect(error).toMatchObject({
      code: 'ownership_lost',
      status: 409,
      message: 'd ownership_lost',
      requestId: 'r1',
      reason: 'expired',
      retryable: false,
    });
    expect(isRetryable(error)).toBe(false);
  });

  it('maps unavailable to a retryable ProblemError', async () => {
    const error = await get(
      respond(503, problem('unavailable', 503), 'application/problem+json'),
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProblemError);
    expect(isRetryable(error)).toBe(true);
  });

  it('maps gateway pages and 429 to retryable transport errors', async () => {
    for (const status of [500, 502, 504, 429]) {
      const error = await get(respond(status, '<html>bad gateway</html>', 'text/html')).catch(
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(TransportError);
      expect(error).toMatchObject({ reason: 'server', status });
      expect(isRetryable(error)).toBe(true);
    }
  });

  it('maps network failures and timeouts to transport errors', async () => {
    const network = await get(async () => {
      throw new TypeError('fetch failed', { cause: new Error('ECONNRESET') });
    }).catch((e: unknown) => e);
    expect(network).toMatchObject({ reason: 'network' });
    expect((network as Error).message).toContain('ECONNRESET');
    const slow: FetchLike = (_url, init) =>
      new Promise((_resolve, reject) => {
        init.signal?.addEventListener('abort', () => reject(init.signal?.reason));
      });
    const timeout = await get(slow, { timeoutMs: 20 }).catch((e: unknown) => e);
    expect(timeout).toBeInstanceOf(TransportError);
    expect(timeout).toMatchObject({ reason: 'timeout' });
  });

  it("rethrows the caller's abort reason as it is", async () => {
    const controller = new AbortController();
    const reason = new Error('mine');
    const slow: FetchLike = (_url, init) =>
      new Promise((_resolve, reject) => {
        init.signal?.addEventListener('abort', () => reject(init.signal?.reason));
      });
    const pending = get(slow, { signal: controller.signal }).catch((e: unknown) => e);
    controller.abort(reason);
    expect(await pending).toBe(reason);
  });

  it('rejects replies that break the contract as ProtocolErrors', async () => {
    const cases: [FetchLike, string | RegExp][] = [
      [respond(200, '{"id":'), /strict JSON/],
      [respond(200, JSON.stringify({ ...session, extra: 1 })), /\$\.extra/],
      [respond(200, JSON.stringify({ ...session, concurrency: '2' })), /\$\.concurrency/],
      [respond(200, '{"id":"a","id":"b"}'), /strict JSON/],
      [respond(200, `{"n":${'9'.repeat(20)}}`), /strict JSON/],
      [respond(200, JSON.stringify(session), 'text/plain'), /content type/],
      [respond(200, JSON.stringify({ ...session, queue: 'x'.repeat(2_000) })), /exceeds/],
      [respond(400, 'not a problem', 'text/plain'), /without a valid problem/],
      [respond(409, problem('ownership_lost', 400)), /without a valid problem/],
      [respond(201, JSON.stringify(session)), /answered 201/],
    ];
    for (const [fetch, message] of cases) {
      const error = await get(fetch).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ProtocolError);
      expect((error as Error).message).toMatch(message);
      expect(isRetryable(error)).toBe(false);
    }
  });

  it('keeps a status schema strict about nulls the contract requires', async () => {
    const http = new HttpTransport({
      url: 'http://h.invalid',
      fetch: respond(
        200,
        JSON.stringify({
          task_id: 't',
          run_id: 'r',
          queue: 'q',
          program: { name: 'p' },
          state: 'queued',
          submitted_at: 1,
          available_at: 1,
          attempt_count: 0,
          max_attempts: 3,
          cancel_requested_at: null,
        }),
      ),
    });
    await expect(
      http.request({ method: 'GET', path: '/t', schema: TaskStatusSchema, maxBytes: 10_000 }),
    ).rejects.toThrow(/terminal_at is required/);
  });
});

describe('Client.submitBatch with entries refused locally', () => {
  it("renumbers a server item problem's path to the caller's index", async () => {
    const sent: unknown[] = [];
    const c = new Client({
      url: 'http://h.invalid',
      tenant: 'acme',
      namespace: 'prod',
      fetch: async (_input, init) => {
        sent.push(JSON.parse(init.body as string));
        const item = JSON.parse(
          problem('invalid_input', 400, { path: '$.commands[0].input.data' }),
        );
        return new Response(JSON.stringify({ results: [item] }), {
          status: 200,
          headers: { 'content-type': 'application/json' },
        });
      },
    });
    const results = await c.submitBatch([
      { queue: 'q', program: 'p', priority: 1_000 },
      { queue: 'q', program: 'p', data: 2 },
    ]);
    expect(sent).toHaveLength(1);
    expect((sent[0] as { commands: unknown[] }).commands).toHaveLength(1);
    expect(results[0]).toMatchObject({
      code: 'invalid_input',
      path: '$.commands[0].input.priority',
    });
    // The server saw entry 1 as its command 0; the caller reads its own index.
    expect(results[1]).toBeInstanceOf(ProblemError);
    expect(results[1]).toMatchObject({ code: 'invalid_input', path: '$.commands[1].input.data' });
  });
});

describe('typed errors across copies', () => {
  it('recognise an error made by another copy of the package by its brand', () => {
    // What a second installed copy of @ledgence/worker would define.
    class CopiedTransportError extends LedgenceError {
      static override readonly brand = '@ledgence/worker/TransportError';
    }
    class CopiedApplicationError extends LedgenceError {
      static override readonly brand = '@ledgence/worker/ApplicationError';
    }
    expect(new CopiedTransportError('x')).toBeInstanceOf(TransportError);
    expect(new CopiedApplicationError('x')).toBeInstanceOf(ApplicationError);
    expect(new CopiedApplicationError('x')).not.toBeInstanceOf(TransportError);
    expect(new ApplicationError('c', 'm')).toBeInstanceOf(LedgenceError);
    expect(new ApplicationError('c', 'm').name).toBe('ApplicationError');
  });
});

describe('HttpTransport configuration', () => {
  it('refuses a URL fetch could never reach, instead of retrying it forever', () => {
    for (const url of ['', 'localhost:8080', 'ftp://h/', 'Error: x']) {
      expect(() => new HttpTransport({ url, fetch: respond(200, '{}') })).toThrow(TypeError);
    }
  });

  it('refuses a URL with whitespace or a control character, saying where, though the URL parser would drop it', () => {
    const scope = { tenant: 'acme', namespace: 'prod' };
    const cases: [string, RegExp][] = [
      // From an env file or a YAML value: every route was appended after the space.
      ['http://127.0.0.1:8080 ', /url contains whitespace .*\(at character 22 of 22\); trim it/],
      ['http://127.0.0.1:8080/ ', /at character 23 of 23/],
      [' http://127.0.0.1:8080', /at character 1 of 22/],
      ['http://127.0.0.1:8080\n', /whitespace or a control character/],
      ['http://127.0.0.1:\t8080', /at character 18 of 22/],
    ];
    for (const [url, message] of cases) {
      expect(URL.canParse(url)).toBe(true);
      expect(() => new HttpTransport({ url })).toThrow(message);
      expect(() => new Client({ ...scope, url })).toThrow(TypeError);
      expect(() => new Worker({ ...scope, url, queue: 'q', concurrency: 1 })).toThrow(TypeError);
    }
    expect(() => new HttpTransport({ url: 'http://127.0.0.1:8080/ledgence/' })).not.toThrow();
  });

  it('refuses an API key it could not send as it is, saying what to fix', () => {
    const url = 'http://127.0.0.1:1';
    const scope = { url, tenant: 'acme', namespace: 'prod' };
    const cases: [string, RegExp][] = [
      ['key-from-a-file\n', /apiKey contains a line break \(at character 16 of 16\); trim it/],
      ['key\r\n', /line break/],
      [' key', /apiKey contains whitespace \(at character 1 of 4\); trim it/],
      ['key\u0000', /apiKey contains a control character/],
      ['kéy', /not printable ASCII/],
    ];
    for (const [apiKey, message] of cases) {
      // Each would otherwise fail every request as a network error, retried without end.
      expect(() => new HttpTransport({ url, apiKey })).toThrow(message);
      expect(() => new Client({ ...scope, apiKey })).toThrow(TypeError);
      expect(() => new Worker({ ...scope, apiKey, queue: 'q', concurrency: 1 })).toThrow(TypeError);
    }
    expect(() => new HttpTransport({ url, apiKey: 'e2e-worker-key_0123+/=' })).not.toThrow();
  });

  it('refuses an API key no server could hold — empty, too long, or outside the bearer token form', () => {
    const url = 'http://127.0.0.1:1';
    const cases: [string, RegExp][] = [
      // `process.env.KEY ?? ''` with the variable unset: sent, it would be `Bearer `.
      ['', /apiKey is empty; pass the key, or leave apiKey out/],
      ['x'.repeat(API_KEY_MAX_CHARS + 1), /apiKey is 4097 characters long, over the 4096/],
      ['k!ey', /apiKey contains "!" \(at character 2 of 4\), which no API key holds/],
      ['a=b', /apiKey contains "=" \(at character 2 of 3\)/],
      ['"quoted"', /apiKey contains "\\"" \(at character 1 of 8\)/],
    ];
    for (const [apiKey, message] of cases) {
      expect(() => new HttpTransport({ url, apiKey })).toThrow(message);
    }
    for (const apiKey of ['x'.repeat(API_KEY_MAX_CHARS), 'a', 'b64+/==', 'A-Z.a_z~0']) {
      expect(() => new HttpTransport({ url, apiKey })).not.toThrow();
    }
  });

  it('refuses credentials in the URL without echoing them, over both transports', async () => {
    // `fetch` refuses such a URL with an error quoting it (password included), which was then
    // logged and retried; `node:http` sends it as Basic auth, which the server ignores.
    const logged: string[] = [];
    const log = (message: string, fields?: LogFields) =>
      void logged.push(`${message} ${JSON.stringify(fields ?? {})}`);
    const logger = { debug: log, info: log, warn: log, error: log };
    const scope = { tenant: 'acme', namespace: 'prod', logger, retries: 2 };
    for (const url of ['http://ops:s3cret-pw@127.0.0.1:1', 'https://s3cret-pw@h.invalid/']) {
      for (const fetch of [
        undefined,
        ((input, init) => globalThis.fetch(input, init)) as FetchLike,
      ]) {
        const refusals = [
          () => new Client({ ...scope, url, fetch }),
          () => new Worker({ ...scope, url, fetch, queue: 'q', concurrency: 1 }),
        ];
        for (const construct of refusals) {
          const error = (() => {
            try {
              construct();
            } catch (e) {
              return e as Error;
            }
          })();
          expect(error).toBeInstanceOf(TypeError);
          expect(error?.message).toMatch(/credentials .*pass an apiKey/);
          expect(error?.message).not.toContain('s3cret-pw');
        }
      }
    }
    expect(logged).toEqual([]);
  });

  it('refuses a request timeout, retry count or backoff that could not bound a call', () => {
    const url = 'http://127.0.0.1:1';
    const scope = { url, tenant: 'acme', namespace: 'prod' };
    const worker = { ...scope, queue: 'q', concurrency: 1 };
    // NaN or a negative timeout made every request time out at once.
    for (const requestTimeoutMs of [Number.NaN, 0, -1, '5000' as unknown as number]) {
      expect(() => new HttpTransport({ url, requestTimeoutMs })).toThrow(
        /^requestTimeoutMs must be a number > 0/,
      );
      expect(() => new Client({ ...scope, requestTimeoutMs })).toThrow(TypeError);
      expect(() => new Worker({ ...worker, requestTimeoutMs })).toThrow(TypeError);
    }
    // Infinity: as long as a Node timer holds (beyond it, a timer fires after 1 ms).
    expect(new HttpTransport({ url, requestTimeoutMs: Infinity }).requestTimeoutMs).toBe(
      2 ** 31 - 1,
    );
    // `failures >= NaN` is never true: a NaN (an unset environment variable through Number())
    // retried forever.
    for (const retries of [Number.NaN, Number.POSITIVE_INFINITY, -1, 1.5]) {
      expect(() => new Client({ ...scope, retries })).toThrow(/^retries must be an integer ≥ 0$/);
    }
    expect(() => new Client({ ...scope, retries: 0 })).not.toThrow();
    const backoffs: [unknown, RegExp][] = [
      [null, /^backoff must be an object/],
      [{ baseMs: 0, maxMs: 10 }, /^backoff\.baseMs must be a finite number > 0$/],
      [{ baseMs: Number.NaN, maxMs: 10 }, /baseMs/],
      [
        { baseMs: 10, maxMs: Number.POSITIVE_INFINITY },
        /^backoff\.maxMs must be a finite number ≥ backoff\.baseMs$/,
      ],
      [{ baseMs: 10, maxMs: 5 }, /maxMs/],
    ];
    for (const [backoff, message] of backoffs) {
      const policy = backoff as BackoffPolicy;
      expect(() => new Client({ ...scope, backoff: policy })).toThrow(message);
      expect(() => new Worker({ ...worker, backoff: policy })).toThrow(message);
    }
  });

  it('refuses an id of "." or "..", which URL normalisation would turn into another route', async () => {
    const fetched: string[] = [];
    const c = new Client({
      url: 'http://h.invalid',
      tenant: 'acme',
      namespace: 'prod',
      fetch: async (input) => {
        fetched.push(input);
        return new Response('{}', { status: 500 });
      },
      retries: 0,
    });
    // `%2E` does not help: the WHATWG URL parser treats it as a dot segment too.
    expect(new URL('http://h/tasks/%2E/result').pathname).toBe('/tasks/result');
    for (const call of [
      () => c.result('.'),
      () => c.status('..'),
      () => c.attempt('tsk_1', '.'),
      () => c.subscriptions('..'),
    ]) {
      await expect(call()).rejects.toThrow(/^an id cannot be "\.\.?": URL normalisation/);
    }
    expect(() => new Client({ url: 'http://h.invalid', tenant: '..', namespace: 'prod' })).toThrow(
      TypeError,
    );
    expect(fetched).toEqual([]);
  });

  it('reports a request that cannot be built as a non-retryable TypeError, not a network failure', async () => {
    // The default node:http exchange: the base URL and this path make no URL, so nothing is sent.
    const http = new HttpTransport({ url: 'http://127.0.0.1:1' });
    const error = await http
      .request({ method: 'GET', path: ':2/x', schema: WorkerSessionSchema, maxBytes: 1_000 })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TypeError);
    expect(error).not.toBeInstanceOf(TransportError);
    expect((error as Error).message).toMatch(/^GET :2\/x cannot be sent: /);
    expect(isRetryable(error)).toBe(false);
  });
});
