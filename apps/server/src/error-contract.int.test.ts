/**
 * The HTTP error contract over the real server (DESIGN §6, §4.1). Client mistakes
 * never get a 5xx, every error is application/problem+json with the documented fields, and the
 * statuses the server answers to a documented operation's request are in that operation's
 * responses in /openapi.json.
 */
import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import { REQUEST_HEADER_MAX_BYTES } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const KEY = 'errors-acme-all-key-000000001';
const S = '/v1/tenants/acme/namespaces/ns';
let db: TestDatabase;
let server: RunningServer;
// biome-ignore lint/suspicious/noExplicitAny: the document is read loosely
let doc: any;

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'error_contract' });
  const config = loadConfig(
    {
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
      ]),
    },
    (p) => {
      throw new Error(`no file ${p}`);
    },
  );
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
  doc = await (await fetch(`${server.url}/openapi.json`)).json();
}, 60_000);
afterAll(async () => {
  await server?.stop();
  await db?.drop();
});

interface Raw {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

function send(
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: string,
): Promise<Raw> {
  const url = new URL(server.url);
  const h: Record<string, string> = { ...headers };
  if (body !== undefined) h['content-length'] = String(Buffer.byteLength(body));
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path, method, headers: h },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            text: Buffer.concat(chunks).toString('utf8'),
          }),
        );
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

/** One request written byte for byte; its status line's code and its body. */
function rawStatus(text: string): Promise<{ status: number; body: string }> {
  const url = new URL(server.url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname, () => socket.write(text));
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('end', () => {
      const all = Buffer.concat(chunks).toString('utf8');
      resolve({
        status: Number(/^HTTP\/1\.1 (\d{3})/.exec(all)?.[1]),
        body: all.slice(all.indexOf('\r\n\r\n') + 4),
      });
    });
    socket.on('error', reject);
  });
}

const auth = { authorization: `Bearer ${KEY}` };
const jsonAuth = { ...auth, 'content-type': 'application/json' };

describe('client mistakes over the real server (DESIGN §6: no 5xx by content alone)', () => {
  it('unknown methods, HEAD on POST routes, trailing and double slashes, %2F in ids: 4xx problem+json with type, title, status, code, detail, request_id', async () => {
    const cases: [string, string, Record<string, string>?, string?][] = [
      ['GET', '/nope'],
      ['DELETE', `${S}/tasks/x`, auth],
      ['PATCH', `${S}/tasks`, auth],
      ['OPTIONS', `${S}/tasks`, auth],
      ['TRACE', '/v1/worker/renew', auth],
      ['FOO', '/v1/worker/renew', auth],
      ['POST', '/healthz'],
      ['GET', '/v1/worker/renew', auth],
      ['GET', `${S}/tasks/`, auth],
      ['GET', `${S}/tasks/x/`, auth],
      ['POST', '/v1/worker/renew/', jsonAuth, '{}'],
      ['POST', '/v1//worker/renew', jsonAuth, '{}'],
      ['GET', `${S}//tasks`, auth],
      ['GET', `/${S}/tasks`, auth],
      ['GET', `${S}/tasks/a%2Fb`, auth],
      ['GET', `${S}/tasks/a%2Fb/history`, auth],
      ['POST', `${S}/tasks/a%2Fb/cancel`, auth],
      ['GET', `/v1/tenants/acme%2Fx/namespaces/ns/tasks`, auth],
      ['GET', `${S}/tasks/%`, auth],
      ['GET', `${S}/tasks/%C0%AF`, auth],
      ['GET', `${S}/tasks/%00`, auth],
      ['POST', `${S}/tasks%3Abatch`, jsonAuth, '{"commands":[]}'],
      ['POST', `${S}/tasks`, { ...jsonAuth, 'content-encoding': 'gzip' }, '{}'],
      ['PUT', `${S}/retention-policy`, { ...auth, 'content-type': 'text/plain' }, 'x'],
      ['GET', `${S}/tasks`, { authorization: 'Basic abc' }],
      ['GET', `${S}/tasks`, { authorization: 'Bearer wrong' }],
    ];
    const wrong: string[] = [];
    for (const [method, path, headers, body] of cases) {
      const r = await send(method, path, headers, body);
      const label = `${method} ${path} → ${r.status}`;
      if (r.status < 400 || r.status >= 500) wrong.push(`${label}: not a 4xx`);
      if (r.headers['content-type'] !== 'application/problem+json')
        wrong.push(`${label}: content-type ${r.headers['content-type']}`);
      const p = JSON.parse(r.text);
      for (const field of ['type', 'title', 'status', 'code', 'detail', 'request_id']) {
        if (p[field] === undefined) wrong.push(`${label}: no ${field}`);
      }
      if (p.status !== r.status) wrong.push(`${label}: body status ${p.status}`);
      if (p.request_id !== r.headers['x-request-id'])
        wrong.push(`${label}: request_id differs from x-request-id`);
      if (r.status === 401 && r.headers['www-authenticate'] === undefined)
        wrong.push(`${label}: no WWW-Authenticate`);
      if (p.code === 'unsupported_media_type' && r.status !== 415)
        wrong.push(`${label}: 415 expected`);
    }
    // HEAD on a POST route: a 4xx without a body, still typed as a problem.
    const head = await send('HEAD', '/v1/worker/renew', auth);
    if (head.status !== 404 || head.headers['content-type'] !== 'application/problem+json') {
      wrong.push(`HEAD /v1/worker/renew → ${head.status} ${head.headers['content-type']}`);
    }
    expect(wrong).toEqual([]);
  }, 60_000);
});

describe('/openapi.json documents the statuses the server answers to requests of its operations', () => {
  /** The statuses `operation` documents. */
  const documented = (template: string, method: string): string[] =>
    Object.keys(doc.paths[template][method].responses);

  it('a header block over REQUEST_HEADER_MAX_BYTES on GET listTasks, GET getTaskStatus and GET /healthz is answered 413, which each of them documents', async () => {
    const host = new URL(server.url).host;
    const big = `X-Big: ${'a'.repeat(REQUEST_HEADER_MAX_BYTES + 1024)}\r\n`;
    const wrong: string[] = [];
    for (const [path, template] of [
      [`${S}/tasks`, '/v1/tenants/{tenant_id}/namespaces/{namespace}/tasks'],
      [`${S}/tasks/x`, '/v1/tenants/{tenant_id}/namespaces/{namespace}/tasks/{task_id}'],
      ['/healthz', '/healthz'],
    ] as const) {
      const reply = await rawStatus(
        `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${KEY}\r\n${big}Connection: close\r\n\r\n`,
      );
      expect(reply.status).toBe(413);
      const statuses = documented(template, 'get');
      if (!statuses.includes(String(reply.status))) {
        wrong.push(
          `GET ${template} → ${reply.status} not documented (only ${statuses.join(', ')}): ${reply.body}`,
        );
      }
    }
    expect(wrong).toEqual([]);
  });

  it('an Expect other than 100-continue on GET /healthz and GET /openapi.json is answered 400, which each of them documents', async () => {
    const host = new URL(server.url).host;
    const wrong: string[] = [];
    for (const path of ['/healthz', '/openapi.json']) {
      const reply = await rawStatus(
        `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nExpect: x-unknown\r\nConnection: close\r\n\r\n`,
      );
      expect(reply.status).toBe(400);
      const statuses = documented(path, 'get');
      if (!statuses.includes(String(reply.status))) {
        wrong.push(
          `GET ${path} → ${reply.status} not documented (only ${statuses.join(', ')}): ${reply.body}`,
        );
      }
    }
    expect(wrong).toEqual([]);
  });
});
