/**
 * The HTTP edge of the real server process (apps/server/src/listener.ts, node:http,
 * @hono/node-server) against hostile or odd clients, spoken over raw sockets. Covers what
 * http-edge.e2e, edge-host.e2e and error-contract.int do not: request smuggling shapes followed by
 * a pipelined request, odd-but-valid framings that must not desynchronise a kept-alive
 * connection, request ids of pipelined replies, `Connection: close` and HTTP/1.0, absolute-form
 * targets, `Upgrade`/`CONNECT`, very many header lines, and a client that never reads (README
 * 'HTTP/1.1 at the edge'). Headers trickled past node's 60 s are left out: the case takes 85 s.
 */
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { ProblemSchema, parseWith } from '@ledgence/contracts';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack } from './test/harness.js';
import { repliesIn, socketExchange, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('http_hostile');
let server: ServerProcess;
let store: ReturnType<typeof createPostgresTaskStore>;
beforeAll(async () => {
  await stack.open();
  server = await stack.start({ LEDGENCE_LOG_LEVEL: 'info' }, { captureStdout: true });
  store = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
}, 60_000);
afterAll(async () => {
  await store?.close();
  await stack.close();
});

const H = 'Host: 127.0.0.1\r\n';
const J = 'Content-Type: application/json\r\n';
const TASKS = `${TASKS_BASE}/tasks`;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function tasksWithKey(key: string): Promise<number> {
  const [row] = await store.sql<{ n: number }[]>`
    select count(*)::int as n from tasks where idempotency_key = ${key}`;
  return row?.n ?? -1;
}

/** A connection whose replies are collected as they come (latin1), written to by the test. */
async function openConnection(): Promise<{
  socket: Socket;
  text: () => string;
  closed: () => boolean;
}> {
  const { hostname, port } = new URL(server.url);
  let text = '';
  let closed = false;
  const socket = connect(Number(port), hostname);
  socket.setEncoding('latin1');
  socket.on('data', (chunk: string) => {
    text += chunk;
  });
  socket.on('error', () => {});
  socket.on('close', () => {
    closed = true;
  });
  await new Promise((resolve) => socket.once('connect', resolve));
  return { socket, text: () => text, closed: () => closed };
}

const requestIdOf = (head: string) => /x-request-id: (\S+)/.exec(head)?.[1];

// ---------------------------------------------------------------------------------------------
// Found by review r47c (each failed before its fix in listener.ts)
// ---------------------------------------------------------------------------------------------

describe('a request carrying Upgrade, which the server does not take up (RFC 9110 §7.8)', () => {
  it('the body of the request pipelined behind it is never read as a request of its own', async () => {
    // The server ignores the Upgrade and answers the request as HTTP/1.1: the connection is then
    // still HTTP/1.1, and the next request on it must be framed by its own Content-Length.
    const key = 'hx-smuggled-by-upgrade';
    const inner = JSON.stringify(taskBody(key, 'hx-upgrade'));
    const smuggled = `POST ${TASKS} HTTP/1.1\r\n${H}${J}X-Request-Id: hx-smuggled\r\nContent-Length: ${Buffer.byteLength(inner)}\r\n\r\n${inner}`;
    const c = await openConnection();
    c.socket.write(
      `GET /healthz HTTP/1.1\r\n${H}Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n` +
        `POST ${TASKS} HTTP/1.1\r\n${H}${J}X-Request-Id: hx-outer\r\nContent-Length: ${Buffer.byteLength(smuggled)}\r\n\r\n`,
    );
    await sleep(300);
    // The outer POST's body: bytes that look like a request (a submit).
    c.socket.write(smuggled);
    await sleep(1_500);
    c.socket.destroy();
    const replies = repliesIn(c.text());
    const ids = replies.map((r) => `${r.status} ${requestIdOf(r.head)}`);
    // Whatever the server answers the outer POST (400: its body is not JSON), nothing inside that
    // body is served, and no task is created from it.
    expect(
      ids.some((line) => line.endsWith('hx-smuggled')),
      ids.join(', '),
    ).toBe(false);
    expect(await tasksWithKey(key)).toBe(0);
  });
});

describe('CONNECT (README: every refusal is a problem document with a request_id, logged and counted)', () => {
  it('is answered with a 4xx problem document carrying its request id, and logged', async () => {
    const { text } = await socketExchange(
      server.url,
      `CONNECT 127.0.0.1:80 HTTP/1.1\r\n${H}X-Request-Id: hx-connect\r\n\r\n`,
      2_000,
    );
    await sleep(300);
    const logged = server
      .stdout()
      .split('\n')
      .filter((line) => line.includes('"msg":"request"') && line.includes('hx-connect'));
    const [reply] = repliesIn(text);
    expect(
      { status: reply?.status, head: reply?.head, logged: logged.length },
      JSON.stringify(text),
    ).toEqual({
      status: expect.any(Number),
      head: expect.stringContaining('content-type: application/problem+json'),
      logged: 1,
    });
    expect(reply?.status).toBeGreaterThanOrEqual(400);
    expect(reply?.status).toBeLessThan(500);
  });

  it('pipelined behind a submit, is answered after the submit’s own reply (found by review r49a)', async () => {
    // README: "Requests pipelined on one connection are served one after another, in order";
    // written at once, the CONNECT's 400 was the only answer and the created task went untold.
    const key = 'hx-submit-before-connect';
    const body = JSON.stringify(taskBody(key, 'hx-connect-q'));
    const c = await openConnection();
    c.socket.write(
      `POST ${TASKS} HTTP/1.1\r\n${H}${J}X-Request-Id: hx-submit\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}` +
        `CONNECT 127.0.0.1:80 HTTP/1.1\r\n${H}X-Request-Id: hx-connect-2\r\n\r\n`,
    );
    await sleep(1_500);
    c.socket.destroy();
    const replies = repliesIn(c.text()).map((r) => `${r.status} ${requestIdOf(r.head)}`);
    expect({ created: await tasksWithKey(key), replies }).toEqual({
      created: 1,
      replies: ['201 hx-submit', '400 hx-connect-2'],
    });
  });
});

describe('very many header lines (README: 400 for a request with two Host lines)', () => {
  // 2 100 short lines stay well inside REQUEST_HEADER_MAX_BYTES (27 KiB).
  const pad = Array.from({ length: 2_100 }, (_, i) => `x-${i}: y\r\n`).join('');

  it('a second Host line after 2 000 other lines is still refused 400, not served', async () => {
    const { text } = await socketExchange(
      server.url,
      `GET ${TASKS} HTTP/1.1\r\n${H}${pad}Host: evil.example\r\nConnection: close\r\n\r\n`,
    );
    const [reply] = repliesIn(text);
    expect({ status: reply?.status, head: reply?.head }, text.slice(0, 300)).toEqual({
      status: 400,
      head: expect.stringContaining('content-type: application/problem+json'),
    });
  });

  it('control: the same request with its one Host line is served', async () => {
    const { text } = await socketExchange(
      server.url,
      `GET ${TASKS} HTTP/1.1\r\n${H}${pad}Connection: close\r\n\r\n`,
    );
    expect(repliesIn(text).map((r) => r.status)).toEqual([200]);
  });
});

// ---------------------------------------------------------------------------------------------
// Coverage (these pass)
// ---------------------------------------------------------------------------------------------

describe('smuggling shapes with a request pipelined behind them (RFC 9112 §6.1, §6.3, §7.1)', () => {
  const body = JSON.stringify(taskBody('hx-smuggle', 'hx-smuggle'));
  const n = Buffer.byteLength(body);
  const hex = n.toString(16);
  const post = `POST ${TASKS} HTTP/1.1\r\n${H}${J}`;
  const chunked = `${hex}\r\n${body}\r\n0\r\n\r\n`;
  const cases: [string, string][] = [
    [
      'Content-Length and Transfer-Encoding: chunked',
      `${post}Content-Length: ${n + 7}\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`,
    ],
    [
      'Transfer-Encoding: chunked then Content-Length',
      `${post}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n${chunked}`,
    ],
    [
      'two equal Content-Length lines',
      `${post}Content-Length: ${n}\r\nContent-Length: ${n}\r\n\r\n${body}`,
    ],
    ['a Content-Length list', `${post}Content-Length: ${n}, ${n}\r\n\r\n${body}`],
    [
      'two Transfer-Encoding: chunked lines',
      `${post}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`,
    ],
    ['chunked not the last coding', `${post}Transfer-Encoding: chunked, gzip\r\n\r\n${chunked}`],
    ['an unknown coding alone', `${post}Transfer-Encoding: xchunked\r\n\r\n${chunked}`],
    [
      'Transfer-Encoding: identity with a length',
      `${post}Transfer-Encoding: identity\r\nContent-Length: ${n}\r\n\r\n${body}`,
    ],
    ['a space before the colon', `${post}Transfer-Encoding : chunked\r\n\r\n${chunked}`],
    [
      'an obs-fold continuing Transfer-Encoding',
      `${post}Transfer-Encoding: gzip\r\n chunked\r\n\r\n${chunked}`,
    ],
    [
      'a chunk size past 64 bits',
      `${post}Transfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\n${body}\r\n0\r\n\r\n`,
    ],
    [
      'a negative chunk size',
      `${post}Transfer-Encoding: chunked\r\n\r\n-1\r\n${body}\r\n0\r\n\r\n`,
    ],
    [
      'a 0x chunk size',
      `${post}Transfer-Encoding: chunked\r\n\r\n0x${hex}\r\n${body}\r\n0\r\n\r\n`,
    ],
    [
      'a space after the chunk size',
      `${post}Transfer-Encoding: chunked\r\n\r\n${hex} \r\n${body}\r\n0\r\n\r\n`,
    ],
    ['bare LF chunk lines', `${post}Transfer-Encoding: chunked\r\n\r\n${hex}\n${body}\n0\n\n`],
    [
      'a chunk shorter than its data',
      `${post}Transfer-Encoding: chunked\r\n\r\n${(n - 3).toString(16)}\r\n${body}\r\n0\r\n\r\n`,
    ],
    [
      'a chunk extension past 16 KiB',
      `${post}Transfer-Encoding: chunked\r\n\r\n${hex};a=${'x'.repeat(20_000)}\r\n${body}\r\n0\r\n\r\n`,
    ],
  ];
  it.each(cases)(
    '%s: one 400 problem document, the connection closed, the pipelined request not served, nothing written',
    async (_name, request) => {
      const before = await tasksWithKey('hx-smuggle');
      const { text, closed } = await socketExchange(
        server.url,
        `${request}GET /healthz HTTP/1.1\r\n${H}X-Request-Id: hx-behind\r\n\r\n`,
        3_000,
      );
      const replies = repliesIn(text);
      expect(
        replies.map((r) => r.status),
        text.slice(0, 300),
      ).toEqual([400]);
      expect(replies[0]?.head).toContain('content-type: application/problem+json');
      expect(parseWith(ProblemSchema, JSON.parse(replies[0]?.body ?? 'null')).status).toBe(400);
      expect(closed).toBe(true);
      expect(await tasksWithKey('hx-smuggle')).toBe(before);
    },
  );

  const valid: [string, string][] = [
    ['Transfer-Encoding in odd casing', `${post}Transfer-Encoding: ChUnKeD\r\n\r\n${chunked}`],
    ['Transfer-Encoding with padding', `${post}Transfer-Encoding:\t chunked  \r\n\r\n${chunked}`],
    [
      'chunk extensions',
      `${post}Transfer-Encoding: chunked\r\n\r\n${hex};a=b;c="d e"\r\n${body}\r\n0;z\r\n\r\n`,
    ],
    [
      'a chunk size with 5 000 leading zeros',
      `${post}Transfer-Encoding: chunked\r\n\r\n${'0'.repeat(5_000)}${hex}\r\n${body}\r\n0\r\n\r\n`,
    ],
  ];
  it.each(valid)(
    '%s: read as the same body (201 or a 200 replay), and the pipelined request behind it answered next',
    async (_name, request) => {
      const { text } = await socketExchange(
        server.url,
        `${request}GET /healthz HTTP/1.1\r\n${H}X-Request-Id: hx-next\r\nConnection: close\r\n\r\n`,
        3_000,
      );
      const replies = repliesIn(text);
      expect(
        replies.map((r) => r.status === 201 || r.status === 200),
        text.slice(0, 300),
      ).toEqual([true, true]);
      expect(JSON.parse(replies[0]?.body ?? '{}').idempotency_key).toBe('hx-smuggle');
      expect([replies[1]?.body, requestIdOf(replies[1]?.head ?? '')]).toEqual([
        '{"status":"ok"}',
        'hx-next',
      ]);
      expect(await tasksWithKey('hx-smuggle')).toBe(1);
    },
  );
});

describe('pipelined requests: each reply carries its own request id, in order (DESIGN §11)', () => {
  it('a mix of app answers, a submit, a 404 and a 400 answers p1..p5 in order', async () => {
    const body = JSON.stringify(taskBody('hx-pid', 'hx-pid'));
    const { text } = await socketExchange(
      server.url,
      `GET /healthz HTTP/1.1\r\n${H}X-Request-Id: p1\r\n\r\n` +
        `POST ${TASKS} HTTP/1.1\r\n${H}${J}X-Request-Id: p2\r\nContent-Length: ${body.length}\r\n\r\n${body}` +
        `GET ${TASKS}/tsk_nope HTTP/1.1\r\n${H}X-Request-Id: p3\r\n\r\n` +
        `POST ${TASKS} HTTP/1.1\r\n${H}${J}X-Request-Id: p4\r\nContent-Length: 2\r\n\r\n{}` +
        `GET /readyz HTTP/1.1\r\n${H}X-Request-Id: p5\r\nConnection: close\r\n\r\n`,
    );
    const replies = repliesIn(text).map((r) => `${r.status} ${requestIdOf(r.head)}`);
    expect(replies).toEqual(['200 p1', '201 p2', '404 p3', '400 p4', '200 p5']);
  });
});

describe('Connection: close and HTTP/1.0', () => {
  it('a submit pipelined behind a request marked Connection: close is never served', async () => {
    const key = 'hx-after-close';
    const body = JSON.stringify(taskBody(key, 'hx-close'));
    const { text, closed } = await socketExchange(
      server.url,
      `GET /healthz HTTP/1.1\r\n${H}Connection: close\r\n\r\n` +
        `POST ${TASKS} HTTP/1.1\r\n${H}${J}Content-Length: ${body.length}\r\n\r\n${body}`,
    );
    expect(repliesIn(text).map((r) => r.status)).toEqual([200]);
    expect(closed).toBe(true);
    await sleep(300);
    expect(await tasksWithKey(key)).toBe(0);
  });

  it('HTTP/1.0 without Host is served and the connection closed; with keep-alive it stays open for the next', async () => {
    const plain = await socketExchange(server.url, 'GET /healthz HTTP/1.0\r\n\r\n');
    expect([repliesIn(plain.text).map((r) => r.status), plain.closed]).toEqual([[200], true]);
    const kept = await socketExchange(
      server.url,
      `GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /readyz HTTP/1.1\r\n${H}Connection: close\r\n\r\n`,
    );
    expect(repliesIn(kept.text).map((r) => r.status)).toEqual([200, 200]);
  });

  it('an HTTP/1.0 POST without Content-Length has no body: its JSON is never read as a request or a body', async () => {
    const key = 'hx-http10';
    const body = JSON.stringify(taskBody(key, 'hx-http10'));
    const { text, closed } = await socketExchange(
      server.url,
      `POST ${TASKS} HTTP/1.0\r\n${J}\r\n${body}`,
    );
    const replies = repliesIn(text);
    expect([replies.map((r) => r.status), closed]).toEqual([[400], true]);
    expect(await tasksWithKey(key)).toBe(0);
  });
});

describe('absolute-form request targets (RFC 9112 §3.2.2)', () => {
  it('served as their path; a foreign authority is refused like a foreign Host in development mode; other forms 400', async () => {
    const statuses: number[] = [];
    for (const target of [
      'http://127.0.0.1/healthz',
      `http://evil.example${TASKS}`,
      'HTTP://127.0.0.1/healthz',
      '*',
    ]) {
      const { text } = await socketExchange(
        server.url,
        `GET ${target} HTTP/1.1\r\n${H}Connection: close\r\n\r\n`,
      );
      const [reply] = repliesIn(text);
      statuses.push(reply?.status ?? 0);
      if (reply !== undefined && reply.status >= 400) {
        expect(reply.head).toContain('content-type: application/problem+json');
      }
    }
    expect(statuses).toEqual([200, 403, 400, 400]);
  });
});

describe('a client that never reads its replies (backpressure)', () => {
  const rssMiB = () =>
    Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${server.child.pid}/status`, 'utf8'))?.[1]) /
    1024;

  it('the server stops taking pipelined requests for large replies, its memory stays bounded, and it serves others', async () => {
    const before = rssMiB();
    const { hostname, port } = new URL(server.url);
    const socket = connect(Number(port), hostname);
    socket.on('error', () => {});
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.pause();
    // ~90 KiB each: 100 000 of them would be ~9 GB of replies if the server kept reading.
    const one = `GET /openapi.json HTTP/1.1\r\n${H}\r\n`;
    let blocked = false;
    for (let round = 0; round < 100 && !blocked; round++) {
      if (!socket.write(one.repeat(1_000))) {
        blocked = await Promise.race([
          new Promise<boolean>((resolve) => socket.once('drain', () => resolve(false))),
          sleep(3_000).then(() => true),
        ]);
      }
    }
    expect(blocked, 'the server kept reading requests whose replies no one reads').toBe(true);
    expect(rssMiB() - before).toBeLessThan(256);
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
    socket.destroy();
  }, 60_000);
});
