/**
 * The real server process with API keys, at trace level.
 * 1. Paths that could confuse scoping (encoded slashes, dot segments, backslashes, case, unicode
 *    variants, double slashes, absolute-form targets, HEAD) sent byte for byte by a key bound to
 *    acme/x: never an answer with namespace y's data, never a 2xx without a key.
 * 2. Everything the server wrote and answered through error paths (bad keys, foreign scopes,
 *    malformed bodies, a database outage, a graceful stop) holds no API key, no key hash, no
 *    signing secret and no database password.
 */
import { createHash, randomBytes } from 'node:crypto';
import {
  createTestDatabase,
  type PgProxy,
  startPgProxy,
  type TestDatabase,
} from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { until } from './test/harness.js';
import { rawExchange } from './test/wire.js';

const KX = 'tmKX_acme_x_0123456789abcdefKEY';
const KY = 'tmKY_acme_y_0123456789abcdefKEY';
const KG = 'tmKG_globex_0123456789abcdefKEY';
const WRONG = 'tmWRONG_0123456789abcdefKEYxx';
const SECRET_BYTES = randomBytes(32);
const SECRET = `whsec_${SECRET_BYTES.toString('base64')}`;
const PASSWORD = 'pwR36aSecret9f8e7d';

function forms(): string[] {
  const out = [SECRET, SECRET.slice(6), SECRET_BYTES.toString('hex'), PASSWORD];
  for (const k of [KX, KY, KG, WRONG]) {
    const h = createHash('sha256').update(k).digest();
    out.push(k, h.toString('hex'), h.toString('base64'), Buffer.from(k).toString('base64'));
  }
  return out;
}

describe('paths and secrets over the real server process', () => {
  let db: TestDatabase;
  let proxy: PgProxy;
  let server: ServerProcess;
  const replies: string[] = [];
  let yTask = '';

  beforeAll(async () => {
    db = await createTestDatabase({ prefix: 'tm_e2e', password: PASSWORD });
    proxy = await startPgProxy(db.url);
    server = await startServerProcess(
      {
        LEDGENCE_LOG_LEVEL: 'trace',
        DATABASE_URL: proxy.url,
        LEDGENCE_API_KEYS: JSON.stringify([
          { key: KX, tenant: 'acme', namespaces: ['x'], roles: ['client', 'worker'] },
          { key: KY, tenant: 'acme', namespaces: ['y'], roles: ['client', 'worker'] },
          { key: KG, tenant: 'globex', namespaces: ['*'], roles: ['admin'] },
        ]),
        LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
          dead: {
            url: 'http://127.0.0.1:9/hook?token=tmHOOKTOKEN',
            secret: SECRET,
            timeout_ms: 300,
          },
        }),
        LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      },
      { captureStdout: true },
    );
    const sub = await fetch(`${server.url}/v1/tenants/acme/namespaces/y/tasks`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KY}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        idempotency_key: 'y1',
        input: {
          tenant_id: 'acme',
          namespace: 'y',
          queue: 'q',
          program: { name: 'p' },
          data: { secret: 'YDATA' },
        },
      }),
    });
    expect(sub.status).toBe(201);
    yTask = ((await sub.json()) as { task_id: string }).task_id;
  }, 90_000);
  afterAll(async () => {
    server?.child.kill('SIGKILL');
    await proxy?.close();
    await db?.drop();
  });

  it('no path variant reaches namespace y with the key of x, and none reaches anything without a key', async () => {
    const y = `/v1/tenants/acme/namespaces/y`;
    const paths = [
      `${y}/tasks`,
      `/${y}/tasks`,
      `/v1//tenants/acme/namespaces/y/tasks`,
      `/v1/tenants/acme/namespaces/x/../y/tasks`,
      `/v1/tenants/acme/namespaces/x/%2e%2e/y/tasks`,
      `/v1/tenants/acme/namespaces/x/.%2E/y/tasks`,
      `/v1/tenants/acme/namespaces/x%2f..%2fy/tasks`,
      `/v1/tenants/acme/namespaces/x%2F..%2Fy/tasks`,
      `/v1/tenants/acme/namespaces/x\\..\\y/tasks`,
      `/v1/tenants/acme/namespaces/x/tasks/..%2f..%2fy%2ftasks`,
      `/v1/tenants/acme/namespaces/x/tasks/%2e%2e/%2e%2e/y/tasks/${yTask}`,
      `/v1/tenants/acme/namespaces/x/tasks/..\\..\\y\\tasks\\${yTask}`,
      `/v1/tenants/acme/namespaces/%79/tasks`,
      `/v1/tenants/acme/namespaces/Y/tasks`,
      `/v1/tenants/ACME/namespaces/y/tasks`,
      `/v1/tenants/acme/namespaces/%EF%BD%99/tasks`,
      `/v1/tenants/acme/namespaces/y%20/tasks`,
      `/v1/tenants/acme/namespaces/y%00/tasks`,
      `/v1/tenants/acme/namespaces/y%09/tasks`,
      `/v1/tenants/acme%2Fnamespaces%2Fy/namespaces/x/tasks`,
      `/V1/tenants/acme/namespaces/y/tasks`,
      `${y}/tasks/`,
      `${y}/tasks/${yTask}`,
      `${y}/tasks/${yTask}/`,
      `${y}/tasks/${yTask}/snapshot`,
      `${y}/tasks/${yTask}%2Fsnapshot`,
      `${y}/tasks/${yTask}/result?wait_ms=0`,
      `/v1/tenants/acme/namespaces/x/tasks/${yTask}/snapshot`,
      `/v1/tenants/acme/namespaces/x/tasks/${yTask}%2F..%2F..%2F..%2Fy%2Ftasks%2F${yTask}`,
      `http://127.0.0.1/v1/tenants/acme/namespaces/y/tasks/${yTask}`,
    ];
    const seen: unknown[] = [];
    for (const path of paths) {
      for (const method of ['GET', 'HEAD']) {
        for (const auth of [`\r\nAuthorization: Bearer ${KX}`, '']) {
          const r = await rawExchange(server.url, `${method} ${path} HTTP/1.1${auth}`);
          replies.push(r.headers, r.body);
          // Anything 2xx must not carry y's task or y's data.
          const leak =
            r.body.includes('YDATA') || r.body.includes(yTask) || (r.status < 300 && auth === '');
          seen.push({
            method,
            path,
            auth: auth !== '',
            status: r.status,
            leak,
            code: /"code":"(\w+)"/.exec(r.body)?.[1],
          });
        }
      }
    }
    expect(seen.filter((s) => (s as { leak: boolean }).leak)).toEqual([]);
  }, 120_000);

  it('a backslash in the path is answered problem+json like every other error (DESIGN §6)', async () => {
    const r = await rawExchange(
      server.url,
      `GET /v1/tenants/acme/namespaces/x\\y/tasks HTTP/1.1\r\nAuthorization: Bearer ${KX}`,
    );
    expect({
      status: r.status,
      problem: /content-type: application\/problem\+json/i.test(r.headers),
    }).toEqual({
      status: 400,
      problem: true,
    });
  });

  it('writes no secret anywhere through error paths, an outage and a stop', async () => {
    const y = `/v1/tenants/acme/namespaces/y`;
    const heads = [
      `GET ${y}/tasks HTTP/1.1\r\nAuthorization: Bearer ${WRONG}`,
      `GET ${y}/tasks HTTP/1.1\r\nAuthorization: Bearer ${KX}`,
      `GET ${y}/tasks HTTP/1.1\r\nAuthorization: Bearer ${KX}${KY}`,
      `GET ${y}/tasks HTTP/1.1\r\nAuthorization: Token ${KX}`,
      `GET ${y}/tasks HTTP/1.1\r\nX-Api-Key: ${KX}`,
      `GET ${y}/tasks?cursor=${KX} HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
      `GET ${y}/tasks/${KX} HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
      `GET /v1/tenants/${KX}/namespaces/y/tasks HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
    ];
    for (const head of heads) {
      const r = await rawExchange(server.url, head);
      replies.push(r.headers, r.body);
    }
    // Bodies quoting the key (a client that pasted it into a field).
    for (const body of [
      `{"idempotency_key":"${KY}","input":{"tenant_id":"acme","namespace":"y","queue":"q","program":{"name":"p"}}}`,
      `{"idempotency_key":"a","input":{"tenant_id":"${KX}","namespace":"y","queue":"q","program":{"name":"p"}}}`,
      `{"idempotency_key":"a","input":${KX}}`,
      `{"subscription_key":"${KY}","destination":"${KY}"}`,
    ]) {
      const r = await rawExchange(
        server.url,
        `POST ${y}/tasks HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
        body,
      );
      replies.push(r.headers, r.body);
      const s = await rawExchange(
        server.url,
        `POST ${y}/tasks/${yTask}/completion-subscriptions HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
        body,
      );
      replies.push(s.headers, s.body);
    }
    // A subscription on a dead destination, then the database away and back.
    const sub = await rawExchange(
      server.url,
      `POST ${y}/tasks/${yTask}/completion-subscriptions HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
      '{"subscription_key":"s","destination":"dead"}',
    );
    expect(sub.status).toBe(201);
    await rawExchange(
      server.url,
      `POST ${y}/tasks/${yTask}/cancel HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
    );
    const before = server.stdout().length;
    proxy.refuse(true);
    for (const head of [
      `GET ${y}/tasks HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
      `GET ${y}/tasks/${yTask}/result?wait_ms=500 HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
      'GET /readyz HTTP/1.1',
      'GET /metrics HTTP/1.1',
    ]) {
      const r = await rawExchange(server.url, head);
      replies.push(r.headers, r.body);
    }
    await until(
      () => /"level":(40|50)/.test(server.stdout().slice(before)),
      15_000,
      'a failure logged',
    );
    proxy.refuse(false);
    await until(
      async () => (await fetch(`${server.url}/readyz`)).status === 200,
      30_000,
      'ready again',
    );
    const list = await rawExchange(
      server.url,
      `GET ${y}/tasks/${yTask}/completion-subscriptions HTTP/1.1\r\nAuthorization: Bearer ${KY}`,
    );
    replies.push(list.body);
    for (const path of ['/metrics', '/openapi.json', '/healthz', '/readyz']) {
      replies.push((await rawExchange(server.url, `GET ${path} HTTP/1.1`)).body);
    }
    server.child.kill('SIGTERM');
    await server.exited;
    const output = server.stdout() + server.stderr();
    const found = forms().filter((s) => output.includes(s));
    const inReplies = forms().filter((s) => replies.join('\n').includes(s));
    expect({ found, inReplies }).toEqual({ found: [], inReplies: [] });
    expect({
      hookTokenInLogs: output.includes('tmHOOKTOKEN'),
      hookTokenInReplies: replies.join('\n').includes('tmHOOKTOKEN'),
      ydataInLogs: output.includes('YDATA'),
    }).toEqual({ hookTokenInLogs: false, hookTokenInReplies: false, ydataInLogs: false });
  }, 120_000);
});
