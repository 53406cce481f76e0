import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { Stack, until } from './test/harness.js';
import { rawExchange } from './test/wire.js';

const KEY = 'acme_KEY_0123456789abcdef';
const OTHER = 'globex_KEY_0123456789abcd';
const WRONG = 'wrong_KEY_0123456789abcdef';
const PAYLOAD = 'R38A_PAYLOAD_MARKER_5f1e';
const base = '/v1/tenants/acme/namespaces/logs';

interface LogLine {
  msg: string;
  level: number;
  request_id?: string;
  method?: string;
  route?: string | null;
  status?: number;
  duration_ms?: number;
  tenant?: string | null;
  remote_address?: string | null;
  [key: string]: unknown;
}

function lines(server: ServerProcess): LogLine[] {
  return server
    .stdout()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as LogLine);
}

/** The request log lines of `id`. */
function linesOf(server: ServerProcess, id: string): LogLine[] {
  return lines(server).filter((l) => l.request_id === id);
}

async function send(
  url: string,
  method: string,
  path: string,
  options: { id?: string; key?: string; body?: string } = {},
) {
  const headers: Record<string, string> = {};
  if (options.id !== undefined) headers['x-request-id'] = options.id;
  if (options.key !== undefined) headers.authorization = `Bearer ${options.key}`;
  if (options.body !== undefined) headers['content-type'] = 'application/json';
  const response = await fetch(`${url}${path}`, { method, headers, body: options.body });
  const text = await response.text();
  let body: { request_id?: string; code?: string } | undefined;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: response.status, header: response.headers.get('x-request-id'), body, text };
}

const stack = new Stack('request_log');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await startServerProcess(
    {
      DATABASE_URL: stack.databaseUrl,
      LEDGENCE_LOG_LEVEL: 'trace',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
        { key: OTHER, tenant: 'globex', namespaces: ['*'], roles: ['client'] },
      ]),
    },
    { captureStdout: true },
  );
  stack.servers.push(server);
});
afterAll(() => stack.close());

describe('request log lines as the README lists them', () => {
  it('a request has one line with the id of its header and problem document, its route pattern, status, duration, tenant and peer', async () => {
    const submit = JSON.stringify({
      idempotency_key: 'log-1',
      input: {
        tenant_id: 'acme',
        namespace: 'logs',
        queue: 'q',
        program: { name: 'p' },
        data: { secret: PAYLOAD },
      },
    });
    const created = await send(server.url, 'POST', `${base}/tasks`, {
      id: 'submit',
      key: KEY,
      body: submit,
    });
    expect(created.status).toBe(201);
    const missing = await send(server.url, 'GET', `${base}/tasks/tsk_missing_${PAYLOAD}`, {
      id: '404',
      key: KEY,
    });
    const noId = await send(server.url, 'GET', `${base}/tasks/nope`, { key: KEY });
    const badId = await send(server.url, 'GET', `${base}/tasks/nope`, {
      id: 'has space',
      key: KEY,
    });
    const wrongKey = await send(server.url, 'GET', `${base}/tasks`, { id: '401', key: WRONG });
    const foreign = await send(server.url, 'GET', `${base}/tasks`, { id: '403', key: OTHER });
    const badJson = await send(server.url, 'POST', `${base}/tasks`, {
      id: '400',
      key: KEY,
      body: `{"idempotency_key": "${PAYLOAD}", `,
    });
    await until(() => linesOf(server, '400').length > 0, 10_000, 'the last line');

    expect(created.header).toBe('submit');
    const [line] = linesOf(server, 'submit');
    expect(line).toMatchObject({
      msg: 'request',
      method: 'POST',
      route: '/v1/tenants/:tenant_id/namespaces/:namespace/tasks',
      status: 201,
      tenant: 'acme',
      remote_address: '127.0.0.1',
    });
    expect(typeof line?.duration_ms).toBe('number');

    for (const [reply, status, tenant] of [
      [missing, 404, 'acme'],
      [noId, 404, 'acme'],
      [badId, 404, 'acme'],
      [wrongKey, 401, null],
      [foreign, 403, 'globex'],
      [badJson, 400, 'acme'],
    ] as const) {
      expect(reply.status).toBe(status);
      expect(reply.body?.request_id).toBe(reply.header);
      const found = linesOf(server, reply.header ?? '');
      expect(found.map((l) => [l.msg, l.status, l.tenant])).toEqual([['request', status, tenant]]);
    }
    expect(noId.header).toMatch(/^[0-9a-f-]{36}$/);
    expect(badId.header).not.toBe('has space');
    // No line holds the payload (in a body or a path) or any key.
    const stdout = server.stdout();
    expect(stdout.includes(PAYLOAD)).toBe(false);
    for (const key of [KEY, OTHER, WRONG]) expect(stdout.includes(key)).toBe(false);
  });

  it('a request refused before the app (a backslash in its path) is logged as a request with the id its client sent, and its problem document carries that id', async () => {
    const reply = await rawExchange(
      server.url,
      `GET ${base}/tasks\\x HTTP/1.1\r\nAuthorization: Bearer ${KEY}\r\nX-Request-Id: backslash`,
    );
    expect(reply.status).toBe(400);
    await until(
      () =>
        server.stdout().includes('malformed_request') || linesOf(server, 'backslash').length > 0,
      10_000,
      'a log line for the refused request',
    );
    // The id ties the client's 400 to the operator's log, as for every other request.
    expect({
      header: /^x-request-id: (.*)$/im.exec(reply.headers)?.[1] ?? null,
      problem: (JSON.parse(reply.body) as { request_id?: string }).request_id ?? null,
      logged: linesOf(server, 'backslash').map((l) => [l.msg, l.status]),
    }).toEqual({
      header: 'backslash',
      problem: 'backslash',
      logged: [['request', 400]],
    });
  });

  it('a request refused before the app is counted in ledgence_http_request_duration_seconds (as route "unmatched")', async () => {
    const count = async () => {
      const text = await (await fetch(`${server.url}/metrics`)).text();
      return text
        .split('\n')
        .filter((l) =>
          l.startsWith(
            'ledgence_http_request_duration_seconds_count{route="unmatched",method="GET",status_class="4xx"}',
          ),
        )
        .reduce((a, l) => a + Number(l.split(' ').at(-1)), 0);
    };
    const before = await count();
    for (let i = 0; i < 3; i += 1) {
      expect((await rawExchange(server.url, `GET /x\\${i} HTTP/1.1`)).status).toBe(400);
    }
    expect(await count()).toBe(before + 3);
  });
});
