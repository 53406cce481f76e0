/**
 * Secrets against the real server process: a server at its most verbose log level (trace) is
 * driven through normal requests, failed authentication,
 * callback deliveries that fail, redirect and succeed, redeliveries, the operations routes and a
 * graceful stop; then everything it wrote (stdout and stderr), every reply it gave and its
 * command line are searched for the API keys, the callback signing secret (as written and as
 * bytes), the DATABASE_URL password and the webhook signatures it sent. The deliveries are
 * checked against Standard Webhooks by an independent verifier (node:crypto only).
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { inspect } from 'node:util';
import {
  createTestDatabase,
  type PgProxy,
  startPgProxy,
  type TestDatabase,
} from '@ledgence/store-postgres/testing';
import { Client, silentLogger, Worker } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, ServerStartError, startServerProcess } from './server-process.js';
import { until } from './test/harness.js';

const KEY = 'lgk_secrets_KEYTEXT_0123456789abcdef';
const WRONG = 'lgk_secrets_WRONGKEY_fedcba987654321';
const SECRET_BYTES = randomBytes(32);
const SECRET = `whsec_${SECRET_BYTES.toString('base64')}`;
const PASSWORD = 'pwSECRETSe2e7f3a9c';
const RECEIVER_MARKER = 'RECEIVER-BODY-MARKER-6d1e';
const TENANT = 'acme';
const NAMESPACE = 'secrets';
const SCOPE_PATH = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;

/** One POST as a receiver saw it. */
interface Post {
  headers: IncomingHttpHeaders;
  body: Buffer;
  receivedAtMs: number;
}

/** A receiver on 127.0.0.1 that records every request and answers with `answer(post, n)`. */
class Receiver {
  readonly posts: Post[] = [];
  answer: (post: Post, n: number) => { status: number; headers?: Record<string, string> } = () => ({
    status: 200,
  });
  #server: Server | undefined;

  url(path = '/hooks'): string {
    const address = this.#server?.address() as AddressInfo | undefined;
    return `http://127.0.0.1:${address?.port}${path}`;
  }

  async start(): Promise<this> {
    this.#server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const post = {
          headers: req.headers,
          body: Buffer.concat(chunks),
          receivedAtMs: Date.now(),
        };
        this.posts.push(post);
        const { status, headers } = this.answer(post, this.posts.length);
        // The body echoes the secret material a careless sender might log as "the response".
        res.writeHead(status, { 'content-type': 'text/plain', ...headers });
        res.end(`${RECEIVER_MARKER} ${String(req.headers['webhook-signature'])}`);
      });
    });
    await new Promise<void>((resolve) => this.#server?.listen(0, '127.0.0.1', resolve));
    return this;
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.#server?.close(() => resolve()));
  }
}

/**
 * The Standard Webhooks check, written from the specification and nothing of Ledgence's:
 * the key is the base64 after `whsec_`; the signed content is `id.timestamp.` followed by the
 * exact body bytes; the header is a space-separated list of `v1,<base64>`.
 */
function verifyStandardWebhook(secret: string, headers: IncomingHttpHeaders, body: Buffer) {
  const id = headers['webhook-id'];
  const timestamp = headers['webhook-timestamp'];
  const signatures = headers['webhook-signature'];
  if (typeof id !== 'string' || typeof timestamp !== 'string' || typeof signatures !== 'string') {
    return false;
  }
  const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
  const expected = createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest();
  return signatures.split(' ').some((entry) => {
    const comma = entry.indexOf(',');
    if (entry.slice(0, comma) !== 'v1') return false;
    const given = Buffer.from(entry.slice(comma + 1), 'base64');
    return given.length === expected.length && timingSafeEqual(given, expected);
  });
}

/** The server at trace level, its JSON logs (stdout) kept. */
function startServer(env: Record<string, string>): Promise<ServerProcess> {
  return startServerProcess({ LEDGENCE_LOG_LEVEL: 'trace', ...env }, { captureStdout: true });
}

/** Everything a server wrote: its JSON logs, then its human-readable lines. */
const outputOf = (server: ServerProcess): string => server.stdout() + server.stderr();

/**
 * Runs the server to its exit (a start failure) and returns everything it wrote. A server that
 * starts instead is asked `probe` (its answer joins the output) and killed: the code is then
 * `'started'`.
 */
async function failedStart(
  env: Record<string, string>,
  probe?: (url: string) => Promise<string>,
): Promise<{ code: unknown; output: string }> {
  let server: ServerProcess;
  try {
    server = await startServer(env);
  } catch (error) {
    if (error instanceof ServerStartError) return { code: error.code, output: error.output };
    throw error;
  }
  try {
    const said = await (probe?.(server.url) ?? Promise.resolve('started'));
    return { code: 'started', output: `${outputOf(server)}\n${said}\n` };
  } finally {
    await server.stop('SIGKILL');
  }
}

/** One raw HTTP/1.1 exchange, so headers go out exactly as written (repeated lines included). */
function rawRequest(
  url: string,
  head: string,
): Promise<{ status: number; headers: string; body: string }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => {
      socket.write(`${head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
    });
    let text = '';
    socket.setEncoding('latin1');
    socket.on('data', (c: string) => {
      text += c;
    });
    socket.on('error', reject);
    socket.on('end', () => {
      const split = text.indexOf('\r\n\r\n');
      const headers = text.slice(0, split);
      resolve({
        status: Number(/^HTTP\/1\.1 (\d{3})/.exec(headers)?.[1]),
        headers,
        body: text.slice(split + 4),
      });
    });
  });
}

/** Every form a secret could take in text: as configured, as base64 and hex of its bytes. */
function secretForms(): string[] {
  return [
    KEY,
    WRONG,
    SECRET,
    SECRET.slice('whsec_'.length),
    SECRET_BYTES.toString('hex'),
    SECRET_BYTES.toString('base64url'),
    PASSWORD,
  ];
}

function leaked(text: string, secrets: readonly string[]): string[] {
  return secrets.filter((s) => text.includes(s));
}

describe('secrets never leave the server', () => {
  let database: TestDatabase;
  let receiver: Receiver;
  let elsewhere: Receiver;
  let server: ServerProcess;
  let databaseUrl: string;
  let proxy: PgProxy;
  const replies: string[] = [];

  beforeAll(async () => {
    // A password in DATABASE_URL: the database's own login role has it, whatever the server's
    // authentication (the embedded server's fixed password is a word of ordinary log lines).
    database = await createTestDatabase({ prefix: 'secrets_e2e', password: PASSWORD });
    databaseUrl = database.url;
    // The server reaches it through a proxy, so a test can take the database away.
    proxy = await startPgProxy(databaseUrl);
    receiver = await new Receiver().start();
    elsewhere = await new Receiver().start();
    server = await startServer({
      DATABASE_URL: proxy.url,
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: KEY, tenant: TENANT, namespaces: ['*'], roles: ['admin'] },
      ]),
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url: receiver.url(), secret: SECRET, timeout_ms: 2_000 },
        // Nothing listens there: every try is a refused connection.
        dead: { url: 'http://127.0.0.1:9/hooks', secret: SECRET, timeout_ms: 500 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      LEDGENCE_LEASE_DURATION_MS: '1000',
      LEDGENCE_RENEW_INTERVAL_MS: '250',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '100',
      LEDGENCE_LONG_POLL_WAIT_MS: '500',
    });
  });
  afterAll(async () => {
    server?.child.kill('SIGKILL');
    await receiver?.close();
    await elsewhere?.close();
    await proxy?.close();
    await database?.drop();
  });

  it('signs every delivery as Standard Webhooks says, follows no redirect, and shows no secret in a reply', async () => {
    // Try 1 fails (500), try 2 is redirected to another receiver, try 3 is accepted.
    receiver.answer = (_, n) =>
      n === 1
        ? { status: 500 }
        : n === 2
          ? { status: 307, headers: { location: elsewhere.url('/stolen') } }
          : { status: 200 };
    const options = { url: server.url, tenant: TENANT, namespace: NAMESPACE, apiKey: KEY };
    const client = new Client({ ...options, logger: silentLogger });
    const task = await client.submit({ queue: 'q', program: 'echo', data: { n: 1 } });
    const billing = await client.subscribe(task.task_id, { destination: 'billing' });
    const dead = await client.subscribe(task.task_id, { destination: 'dead' });
    const worker = new Worker({
      ...options,
      queue: 'q',
      concurrency: 1,
      logger: silentLogger,
      pollWaitMs: 300,
      renewIntervalMs: 250,
    });
    worker.register('echo', (data) => data);
    void worker.run();
    try {
      await until(() => receiver.posts.length >= 3, 30_000, 'three tries at billing');
      // A redelivery of the delivered generation: same id and bytes, signed anew.
      await until(
        async () => (await client.subscriptions(task.task_id)).some((s) => s.state === 'delivered'),
        10_000,
        'billing delivered',
      );
      await client.redeliver(billing.id, 1);
      await until(() => receiver.posts.length >= 4, 10_000, 'the redelivery');
      await until(
        async () =>
          (await client.subscriptions(task.task_id)).some(
            (s) => s.id === dead.id && s.attempts >= 2,
          ),
        10_000,
        'two failed tries at dead',
      );
      const subscriptions = await client.subscriptions(task.task_id);
      replies.push(JSON.stringify(subscriptions));
    } finally {
      await worker.stop({ graceMs: 0 });
    }

    // The redirect was not followed: the other host got nothing, signed or not.
    expect(elsewhere.posts).toEqual([]);
    const [first] = receiver.posts;
    for (const post of receiver.posts) {
      expect(verifyStandardWebhook(SECRET, post.headers, post.body)).toBe(true);
      // One id across tries and the redelivery, the CloudEvent's own; the same bytes each time.
      expect(post.headers['webhook-id']).toBe(first?.headers['webhook-id']);
      expect(JSON.parse(post.body.toString('utf8')).id).toBe(post.headers['webhook-id']);
      expect(post.body.equals(first?.body as Buffer)).toBe(true);
      expect(post.headers['content-length']).toBe(String(post.body.byteLength));
      expect(post.headers['content-type']).toBe('application/cloudevents+json');
      // Unix seconds, the time of this try.
      const timestamp = String(post.headers['webhook-timestamp']);
      expect(timestamp).toMatch(/^\d{10}$/);
      expect(Math.abs(Number(timestamp) - post.receivedAtMs / 1000)).toBeLessThan(5);
      expect(String(post.headers['webhook-signature'])).toMatch(/^v1,[A-Za-z0-9+/]{43}=$/);
      // Not signed with another key: a verifier holding a different secret refuses it.
      const other = `whsec_${randomBytes(32).toString('base64')}`;
      expect(verifyStandardWebhook(other, post.headers, post.body)).toBe(false);
    }

    // Everything a client or an operator can read: operations routes and the replies above.
    for (const path of ['/metrics', '/openapi.json', '/healthz', '/readyz']) {
      const res = await fetch(new URL(path, server.url));
      replies.push(await res.text());
    }
    const signatures = receiver.posts.map((p) =>
      String(p.headers['webhook-signature']).slice('v1,'.length),
    );
    const secrets = [...secretForms(), ...signatures];
    expect(leaked(replies.join('\n'), secrets)).toEqual([]);
    expect(replies.join('\n')).not.toContain(RECEIVER_MARKER);
    expect(replies.join('\n')).not.toContain(receiver.url());
    expect(readFileSync(`/proc/${server.child.pid}/cmdline`, 'utf8')).not.toContain(KEY);
  });

  it('answers every failed authentication 401 problem+json without echoing the token', async () => {
    const target = `${SCOPE_PATH}/tasks?limit=1`;
    const refused = [
      `GET ${target} HTTP/1.1`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${WRONG}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer `,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer`,
      `GET ${target} HTTP/1.1\r\nAuthorization: ${KEY}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Basic ${Buffer.from(`x:${KEY}`).toString('base64')}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer\t${KEY}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${KEY}x`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${KEY.slice(0, -1)}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer "${KEY}"`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${KEY} ${WRONG}`,
      // Two lines: not one key, whichever comes first.
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${KEY}\r\nAuthorization: Bearer ${WRONG}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${WRONG}\r\nAuthorization: Bearer ${KEY}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${KEY}\r\nAuthorization: Bearer ${KEY}`,
      `GET ${target} HTTP/1.1\r\nAuthorization: Bearer ${'A'.repeat(5_000)}`,
    ];
    for (const head of refused) {
      const reply = await rawRequest(server.url, head);
      expect({ head: head.slice(0, 120), status: reply.status }).toEqual({
        head: head.slice(0, 120),
        status: 401,
      });
      expect(reply.headers).toMatch(/content-type: application\/problem\+json/i);
      expect(reply.headers).toMatch(/www-authenticate: Bearer/i);
      expect(JSON.parse(reply.body)).toMatchObject({ status: 401, code: 'unauthorized' });
      expect(leaked(reply.headers + reply.body, [KEY, WRONG])).toEqual([]);
      replies.push(reply.headers, reply.body);
    }
    // RFC 9110 §11.1: the scheme is case-insensitive; one or more spaces separate it (§11.4).
    for (const authorization of [
      `Bearer ${KEY}`,
      `bearer ${KEY}`,
      `BEARER ${KEY}`,
      `Bearer   ${KEY}`,
      `Bearer ${KEY}  `,
    ]) {
      const reply = await rawRequest(
        server.url,
        `GET ${target} HTTP/1.1\r\nAuthorization: ${authorization}`,
      );
      expect({ authorization, status: reply.status }).toEqual({ authorization, status: 200 });
    }
  });

  it('the SDK shows a refused key nowhere: not in its logs at debug level, nor in its errors', async () => {
    const lines: string[] = [];
    const capture = (level: string) => (message: string, fields?: Record<string, unknown>) =>
      lines.push(`${level} ${message} ${inspect(fields, { depth: 8, showHidden: true })}`);
    const logger = {
      debug: capture('debug'),
      info: capture('info'),
      warn: capture('warn'),
      error: capture('error'),
    };
    const options = { url: server.url, tenant: TENANT, namespace: NAMESPACE, apiKey: WRONG };
    const client = new Client({
      ...options,
      logger,
      retries: 1,
      backoff: { baseMs: 10, maxMs: 20 },
    });
    const error = await client.submit({ queue: 'q', program: 'echo' }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(Error);
    const shown = [
      String(error),
      (error as Error).stack ?? '',
      JSON.stringify(error),
      inspect(error, { depth: 8, showHidden: true }),
    ].join('\n');
    expect(shown).toMatch(/401|unauthorized/);
    const worker = new Worker({
      ...options,
      queue: 'q',
      concurrency: 1,
      logger,
      pollWaitMs: 100,
      backoff: { baseMs: 10, maxMs: 50 },
    });
    worker.register('echo', (data) => data);
    const running = worker.run().catch((e: unknown) => {
      lines.push(`run rejected ${inspect(e, { depth: 8, showHidden: true })}`);
    });
    await until(() => lines.length > 0, 10_000, 'the worker logs its refusal');
    await worker.stop({ graceMs: 0 });
    await running;
    expect(leaked(`${shown}\n${lines.join('\n')}`, [WRONG])).toEqual([]);
  });

  it('writes no secret to its logs at trace level, through a database outage and a graceful stop', async () => {
    expect(new URL(proxy.url).password).toBe(PASSWORD);
    // The database away: requests fail, the loops log their failures; then it is back.
    const before = server.stdout().length;
    proxy.refuse(true);
    const during = await fetch(new URL(`${SCOPE_PATH}/tasks?limit=1`, server.url), {
      headers: { authorization: `Bearer ${KEY}` },
    });
    replies.push(await during.text());
    expect(during.status).toBe(503);
    await until(
      () => /"level":(40|50)/.test(server.stdout().slice(before)),
      10_000,
      'a store failure logged',
    );
    proxy.refuse(false);
    await until(
      async () => (await fetch(new URL('/readyz', server.url))).status === 200,
      20_000,
      'ready again',
    );
    server.child.kill('SIGTERM');
    expect(await server.exited).toBe(0);
    const output = outputOf(server);
    // The log is not empty: request lines and delivery lines were written.
    expect(output).toMatch(/"msg":"request"/);
    expect(output).toMatch(/completion delivered/);
    expect(output).toMatch(/completion delivery failed/);
    expect(output).toMatch(/ECONNRESET|ECONNREFUSED|CONNECTION_/);
    const signatures = receiver.posts.map((p) =>
      String(p.headers['webhook-signature']).slice('v1,'.length),
    );
    expect(leaked(output, [...secretForms(), ...signatures])).toEqual([]);
    expect(output).not.toContain(RECEIVER_MARKER);
    expect(output).not.toContain('/stolen');
    expect(output).not.toContain(receiver.url());
  });

  it('refuses to start with an API key that has a space around it, which could never authenticate', async () => {
    // Before: the server started ("API keys: 1 configured") and answered every request 401,
    // whether the client sent the key with its space or without (Node trims header values).
    const { code, output } = await failedStart(
      {
        DATABASE_URL: databaseUrl,
        LEDGENCE_API_KEYS: JSON.stringify([
          { key: `${KEY} `, tenant: TENANT, namespaces: ['*'], roles: ['admin'] },
        ]),
      },
      async (url) => {
        const res = await fetch(new URL(`${SCOPE_PATH}/tasks`, url), {
          headers: { authorization: `Bearer ${KEY} ` },
        });
        return `started, and the key's request was answered ${res.status}`;
      },
    );
    expect({ code, output }).toEqual({
      code: 2,
      output: expect.stringContaining('LEDGENCE_API_KEYS[0].key must be a bearer token'),
    });
    expect(output).not.toContain(KEY);
  });

  it('names no secret when the start fails', async () => {
    const keys = JSON.stringify([
      { key: KEY, tenant: TENANT, namespaces: ['*'], roles: ['admin'] },
    ]);
    // Configuration problems are all reported at once, so each start below carries several.
    const cases: Record<string, string>[] = [
      // Nothing listens on the port of this DATABASE_URL.
      { DATABASE_URL: `postgres://postgres:${PASSWORD}@127.0.0.1:9/x`, LEDGENCE_API_KEYS: keys },
      {
        // A password that is not valid percent-encoding.
        DATABASE_URL: `postgres://postgres:${PASSWORD}%zz@127.0.0.1:5432/x`,
        // A key entry with a problem, and one with a field the server does not know.
        LEDGENCE_API_KEYS: JSON.stringify([
          { key: `${KEY} `, tenant: TENANT, namespaces: ['*'], roles: ['admin'] },
          { key: WRONG, tenant: TENANT, namespaces: ['*'], roles: ['admin'], secret: PASSWORD },
        ]),
        // Destinations whose secret is short, not base64, misnamed, or whose URL has credentials.
        LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
          a: { url: 'http://127.0.0.1:1/h', secret: SECRET.slice(0, 20) },
          b: { url: 'http://127.0.0.1:1/h', secret: `${SECRET}!` },
          c: { url: `http://user:${PASSWORD}@127.0.0.1:1/h`, secret: SECRET },
          d: { url: 'http://127.0.0.1:1/h', secret: SECRET, signing_key: PASSWORD },
          e: { url: 'http://127.0.0.1:1/h', secret: SECRET.replace('whsec_', 'wsec_') },
        }),
      },
      {
        // A port out of range; JSON broken around a key and around a secret.
        DATABASE_URL: `postgres://postgres:${PASSWORD}@127.0.0.1:99999/x`,
        LEDGENCE_API_KEYS: `[{"key": "${KEY}", "tenant": "acme" "namespaces": ["*"]}]`,
        LEDGENCE_CALLBACK_DESTINATIONS: `{"a": {"url": "http://x/", "secret": "${SECRET}" }`,
      },
      {
        LEDGENCE_API_KEYS: JSON.stringify([KEY]),
        LEDGENCE_CALLBACK_DESTINATIONS: `{"a": {"url": "http://x/", "secret": "${SECRET}\u0001"}}`,
      },
      {
        LEDGENCE_API_KEYS: keys,
        LEDGENCE_CALLBACK_DESTINATIONS: `{"a": {"url": "http://x/", "secret": "${SECRET}", "secret": "${SECRET}"}}`,
      },
    ];
    // All at once: each is a process start, and the unreachable database takes a few seconds.
    const outcomes = await Promise.all(cases.map((env) => failedStart(env)));
    cases.forEach((env, at) => {
      const { code, output } = outcomes[at] as { code: unknown; output: string };
      // Each start fails (exit 1 or 2, never 'started' nor 0), saying something, naming no secret.
      expect({ env, code }).toEqual({ env, code: expect.toSatisfy((c) => c === 1 || c === 2) });
      expect(output.length).toBeGreaterThan(0);
      expect({ env, leaked: leaked(output, secretForms()) }).toEqual({ env, leaked: [] });
    });
  });
});
