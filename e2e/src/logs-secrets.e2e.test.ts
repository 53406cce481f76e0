/**
 * Secrets and the log format over the real server process at trace level (review r51d).
 * - every stdout line is one JSON object, whatever request strings carry (line breaks, ANSI
 *   escapes, U+2028 in queue names, program names, labels, idempotency keys, request ids);
 * - refusals of every kind (401 on worker routes, 403 by role and by scope, parser refusals
 *   carrying an Authorization header, header overflow) name no key in a log or reply;
 * - callback destinations whose URL carries a token in its query fail in several ways (TLS,
 *   DNS, timeout, redirect): the token is in no log, no subscription reply.
 */
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer as createHttpServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client, silentLogger } from '@ledgence/worker';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { Stack, until } from './test/harness.js';
import { rawExchange, socketExchange } from './test/wire.js';

const ADMIN = 'r51d_ADMINKEY_0123456789abcdef';
const CLIENT_ONLY = 'r51d_CLIENTKEY_0123456789abcdef';
const OTHER_NS = 'r51d_OTHERNSKEY_0123456789abcdef';
const WRONG = 'r51d_WRONGKEY_0123456789abcdef';
const TOKEN = 'r51dQUERYTOKENabc123';
const SECRET = `whsec_${Buffer.from('r51d-signing-secret-bytes-0123456789').toString('base64')}`;
const TENANT = 'acme';
const NS = 'logs';
const base = `/v1/tenants/${TENANT}/namespaces/${NS}`;

const stack = new Stack('r51d_logs');
let server: ServerProcess;
let redirector: Server;
let slow: Server;
const replies: string[] = [];

function listen(s: Server): Promise<number> {
  return new Promise((resolve) =>
    s.listen(0, '127.0.0.1', () => resolve((s.address() as AddressInfo).port)),
  );
}

beforeAll(async () => {
  await stack.open();
  redirector = createHttpServer((req, res) => {
    req.resume();
    res.writeHead(302, { location: `http://127.0.0.1:1/stolen?token=${TOKEN}` });
    res.end(`redirecting ${req.url}`);
  });
  slow = createHttpServer((req) => {
    req.resume(); // never answers
  });
  const redirectPort = await listen(redirector);
  const slowPort = await listen(slow);
  server = await stack.start(
    {
      LEDGENCE_LOG_LEVEL: 'trace',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: ADMIN, tenant: TENANT, namespaces: ['*'], roles: ['admin'] },
        { key: CLIENT_ONLY, tenant: TENANT, namespaces: [NS], roles: ['client'] },
        { key: OTHER_NS, tenant: TENANT, namespaces: ['elsewhere'], roles: ['client', 'worker'] },
      ]),
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        redirect: {
          url: `http://127.0.0.1:${redirectPort}/h?token=${TOKEN}`,
          secret: SECRET,
          timeout_ms: 1_000,
        },
        slow: {
          url: `http://127.0.0.1:${slowPort}/h?token=${TOKEN}`,
          secret: SECRET,
          timeout_ms: 300,
        },
        tls: {
          url: `https://127.0.0.1:${redirectPort}/h?token=${TOKEN}`,
          secret: SECRET,
          timeout_ms: 1_000,
        },
        dns: {
          url: `http://no-such-host.invalid/h?token=${TOKEN}`,
          secret: SECRET,
          timeout_ms: 1_000,
        },
        refused: { url: `http://127.0.0.1:9/h?token=${TOKEN}`, secret: SECRET, timeout_ms: 500 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    },
    { captureStdout: true },
  );
}, 90_000);
afterAll(async () => {
  await stack.close();
  redirector?.close();
  slow?.closeAllConnections();
  slow?.close();
});

/** A C0 control character other than tab and line feed, or DEL. */
const hasControl = (text: string): boolean =>
  [...text].some((ch) => {
    const c = ch.charCodeAt(0);
    return (c < 0x20 && c !== 0x09 && c !== 0x0a) || c === 0x7f;
  });

const auth = (key: string) => `\r\nAuthorization: Bearer ${key}`;

describe('logs and secrets', () => {
  it('control characters in request strings cannot forge or split a log line', async () => {
    const nasty = [
      'q\n{"level":30,"msg":"forged"}',
      'q\r\n{"level":60}',
      'q\u001b[31mred\u001b[0m',
      'q\u2028x\u2029y',
      'q\u0000z',
      'q\ud800',
    ];
    for (const s of nasty) {
      for (const body of [
        {
          idempotency_key: s,
          input: { tenant_id: TENANT, namespace: NS, queue: s, program: { name: 'p' } },
        },
        {
          idempotency_key: 'k',
          input: { tenant_id: TENANT, namespace: NS, queue: 'q', program: { name: s } },
        },
        {
          idempotency_key: `k-${Buffer.from(s).toString('hex')}`,
          input: {
            tenant_id: TENANT,
            namespace: NS,
            queue: 'q',
            program: { name: 'p' },
            labels: { [s]: s },
          },
        },
        {
          idempotency_key: 'k2',
          input: { tenant_id: s, namespace: NS, queue: 'q', program: { name: 'p' } },
        },
      ]) {
        const r = await rawExchange(
          server.url,
          `POST ${base}/tasks HTTP/1.1${auth(ADMIN)}`,
          JSON.stringify(body),
        );
        replies.push(r.headers, r.body);
      }
      const encoded = s.includes('\ud800') ? 'q%ED%A0%80%FF' : encodeURIComponent(s);
      for (const path of [
        `${base}/tasks?queue=${encoded}`,
        `${base}/tasks/${encoded}`,
        `/v1/tenants/${encoded}/namespaces/${NS}/tasks`,
        `${base}/tasks?label.${encoded}=${encoded}`,
      ]) {
        const r = await rawExchange(server.url, `GET ${path} HTTP/1.1${auth(ADMIN)}`);
        replies.push(r.headers, r.body);
      }
    }
    // Header values node:http lets through: obs-text and tab, in the request id and others.
    for (const id of ['a\tb', 'id\u00ff\u00fe', 'x'.repeat(200), '{"level":60}']) {
      const { text } = await socketExchange(
        server.url,
        `GET ${base}/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: ${id}${auth(ADMIN)}\r\nConnection: close\r\n\r\n`,
        10_000,
      );
      replies.push(text);
    }
    await until(() => server.stdout().includes('"msg":"request"'), 5_000, 'request lines');
    const out = server.stdout();
    const bad = out
      .split('\n')
      .filter((l) => l !== '')
      .filter((l) => {
        try {
          const v = JSON.parse(l);
          return typeof v !== 'object' || v === null || Array.isArray(v);
        } catch {
          return true;
        }
      });
    expect(bad).toEqual([]);
    expect(hasControl(out)).toBe(false);
    expect(out).not.toContain('"msg":"forged"');
    expect(hasControl(server.stderr())).toBe(false);
  });

  it('refusals of every kind name no key in logs or replies', async () => {
    const heads = [
      // worker routes: no key, wrong key, a client-only key (403), a key of another namespace
      `POST /v1/worker/sessions HTTP/1.1${auth(WRONG)}`,
      `POST /v1/worker/sessions HTTP/1.1${auth(CLIENT_ONLY)}`,
      `POST /v1/worker/acquire?wait_ms=0 HTTP/1.1${auth(CLIENT_ONLY)}`,
      `POST /v1/worker/settle HTTP/1.1${auth(OTHER_NS)}`,
      `GET ${base}/tasks HTTP/1.1${auth(OTHER_NS)}`,
      `GET /v1/tenants/globex/namespaces/${NS}/tasks HTTP/1.1${auth(ADMIN)}`,
      `DELETE ${base}/tasks HTTP/1.1${auth(ADMIN)}`,
      `GET /nowhere HTTP/1.1${auth(WRONG)}`,
      `GET /metrics HTTP/1.1${auth(WRONG)}`,
    ];
    for (const head of heads) {
      const r = await rawExchange(
        server.url,
        head,
        '{"scope":{"tenant_id":"acme","namespace":"logs"},"queue":"q","concurrency":1}',
      );
      replies.push(r.headers, r.body);
    }
    // Refused by the parser with the key on the wire.
    for (const raw of [
      `GET ${base}/tasks HTTP/1.1\r\nAuthorization: Bearer ${ADMIN}\r\nX-Big: ${'a'.repeat(30_000)}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`,
      `POST ${base}/tasks HTTP/1.1\r\nAuthorization: Bearer ${ADMIN}\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n`,
      `GET ${base}/tasks HTTP/1.1\r\nAuthorization: Bearer ${WRONG}\r\nHost: a\r\nHost: b\r\n\r\n`,
      `GET ${base}/tasks HTTP/1.1\r\nAuthorization: Bearer ${WRONG}\r\nExpect: nothing\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`,
      `CONNECT 127.0.0.1:1 HTTP/1.1\r\nAuthorization: Bearer ${WRONG}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`,
      `GET ${base}/tasks HTTP/1.1\r\nAuthorization: Bearer ${WRONG}\x01\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`,
      `GET /${ADMIN} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`,
      `GET ${base}/tasks\\${WRONG} HTTP/1.1\r\nAuthorization: Bearer ${WRONG}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`,
    ]) {
      const { text } = await socketExchange(server.url, raw, 10_000);
      replies.push(text);
    }
    const everything = `${server.stdout()}${server.stderr()}`;
    const keys = [ADMIN, CLIENT_ONLY, OTHER_NS, WRONG];
    expect(keys.filter((k) => everything.includes(k))).toEqual([]);
    // A path is the client's own: only what we put in a path may come back in a reply.
    const reply = replies.join('\n');
    expect([CLIENT_ONLY, OTHER_NS, WRONG].filter((k) => reply.includes(k))).toEqual([]);
  });

  it('a query token of a destination URL appears in no log and no subscription reply', async () => {
    const client = new Client({
      url: server.url,
      apiKey: ADMIN,
      tenant: TENANT,
      namespace: NS,
      logger: silentLogger,
    });
    const task = await client.submit({ queue: 'cb', program: 'p' });
    for (const destination of ['redirect', 'slow', 'tls', 'dns', 'refused']) {
      await client.subscribe(task.task_id, { destination, subscriptionKey: destination });
    }
    await client.cancel(task.task_id);
    await until(
      async () => {
        const subs = await client.subscriptions(task.task_id);
        return (
          subs.length === 5 && subs.every((s) => s.attempts >= 2 && s.last_error !== undefined)
        );
      },
      30_000,
      'two failed tries at each destination',
    );
    const subs = await client.subscriptions(task.task_id);
    const errors = subs.map((s) => `${s.destination}: ${s.last_error}`);
    replies.push(JSON.stringify(subs));
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const everything = `${server.stdout()}${server.stderr()}\n${JSON.stringify(subs)}\n${metrics}`;
    expect({
      errors,
      token: everything.includes(TOKEN),
      stolen: everything.includes('/stolen'),
    }).toEqual({
      errors,
      token: false,
      stolen: false,
    });
  }, 60_000);
});

describe('data PostgreSQL refuses', () => {
  it('a value PostgreSQL cannot store is not copied into the log', async () => {
    const MARK = 'r51dDATAMARKER';
    const values: unknown[] = [
      { s: `${MARK}\u0000` },
      { [`${MARK}\u0000`]: 1 },
      { s: `${MARK}\ud800` },
      { n: 1e308, s: MARK },
    ];
    const statuses: number[] = [];
    for (const [i, data] of values.entries()) {
      for (const body of [
        {
          idempotency_key: `d${i}`,
          input: { tenant_id: TENANT, namespace: NS, queue: 'q', program: { name: 'p' }, data },
        },
        {
          idempotency_key: `l${i}`,
          input: {
            tenant_id: TENANT,
            namespace: NS,
            queue: 'q',
            program: { name: 'p' },
            labels: { k: `${MARK}\u0000` },
          },
        },
        {
          idempotency_key: `${MARK}\u0000${i}`,
          input: { tenant_id: TENANT, namespace: NS, queue: 'q', program: { name: 'p' } },
        },
      ]) {
        const text = JSON.stringify(body).replaceAll('\\\\u0000', '\\u0000');
        const r = await rawExchange(server.url, `POST ${base}/tasks HTTP/1.1${auth(ADMIN)}`, text);
        statuses.push(r.status);
      }
    }
    await new Promise((r) => setTimeout(r, 300));
    const out = server.stdout();
    expect({ statuses, logged: out.includes(MARK) }).toEqual({ statuses, logged: false });
  });
});

describe('the embedded PostgreSQL password', () => {
  it('appears in no output at trace level: requests, backends terminated, the postmaster killed, a restart', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ledgence-logs-embedded-'));
    // Root runs PostgreSQL as the OS user `postgres`, which must be able to enter the folder.
    chmodSync(dir, 0o755);
    const dataDir = join(dir, 'pg');
    const env = {
      DATABASE_URL: '', // the embedded PostgreSQL, also where the suite runs on DATABASE_URL
      LEDGENCE_DATA_DIR: dataDir,
      LEDGENCE_LOG_LEVEL: 'trace',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '100',
      LEDGENCE_RESCAN_INTERVAL_MS: '200',
    };
    let output = '';
    let first: ServerProcess | undefined;
    let second: ServerProcess | undefined;
    try {
      first = await startServerProcess(env, { captureStdout: true });
      const password = readFileSync(join(dataDir, 'ledgence-password'), 'utf8').trim();
      expect(password.length).toBeGreaterThan(8);
      const port = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[3]);
      const c = new Client({ url: first.url, tenant: TENANT, namespace: NS, logger: silentLogger });
      await c.submit({ queue: 'q', program: 'p' });
      // Every backend of the server terminated under it: its pool and its LISTEN fail.
      const admin = postgres({
        host: '127.0.0.1',
        port,
        user: 'postgres',
        password,
        database: 'postgres',
        max: 1,
        onnotice: () => {},
      });
      await admin`select pg_terminate_backend(pid) from pg_stat_activity where datname = 'ledgence' and pid <> pg_backend_pid()`;
      await admin.end();
      for (const path of ['/readyz', '/metrics', `${base}/tasks`, `${base}/tasks/nope`]) {
        await fetch(`${first.url}${path}`).then((r) => r.text());
      }
      await new Promise((r) => setTimeout(r, 500));
      // The postmaster killed: the server logs why and exits 1.
      const postmaster = Number(
        readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0],
      );
      process.kill(postmaster, 'SIGKILL');
      const code = await first.exited;
      output += `${first.stdout()}\n${first.stderr()}\n`;
      expect(code).toBe(1);
      // And a start on the same folder, stopped gracefully.
      second = await startServerProcess(env, { captureStdout: true });
      await fetch(`${second.url}/readyz`).then((r) => r.text());
      await second.stop('SIGTERM');
      output += `${second.stdout()}\n${second.stderr()}\n`;
      const forms = [
        password,
        encodeURIComponent(password),
        Buffer.from(password).toString('base64'),
      ];
      expect({
        hasLastLog: /lastLog/.test(output),
        leaked: forms.filter((f) => output.includes(f)),
      }).toEqual({ hasLastLog: true, leaked: [] });
    } finally {
      first?.child.kill('SIGKILL');
      second?.child.kill('SIGKILL');
      await new Promise((r) => setTimeout(r, 300));
      try {
        const pid = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
        process.kill(pid, 'SIGQUIT');
        await new Promise((r) => setTimeout(r, 500));
      } catch {
        // No postmaster left: the server stopped it.
      }
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);
});
