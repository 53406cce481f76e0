/**
 * HTTP semantics at the edge of the real server process (node:http, @hono/node-server, the app;
 * apps/server/src/listener.ts), spoken over raw sockets. DESIGN §6: "Errors are RFC 9457 application/problem+json";
 * §11: one structured log line per request; RFC 9112 §9.3.2 (pipelining); RFC 9110 §10.1.1
 * (Expect: 100-continue).
 */
import { connect } from 'node:net';
import { ProblemSchema, parseWith, REQUEST_HEADER_MAX_BYTES } from '@ledgence/contracts';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack } from './test/harness.js';
import {
  claimNext,
  repliesIn,
  socketExchange,
  submitTask,
  TASKS_BASE,
  taskBody,
} from './test/wire.js';

const stack = new Stack('http_edge');
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
const TASKS = `${TASKS_BASE}/tasks`;

const exchange = (bytes: string, waitMs?: number, onData?: Parameters<typeof socketExchange>[3]) =>
  socketExchange(server.url, bytes, waitMs, onData);

async function taskCount(): Promise<number> {
  const [row] = await store.sql<{ n: number }[]>`select count(*)::int as n from tasks`;
  return row?.n ?? -1;
}

describe('requests node:http refuses before the app are answered problem+json (DESIGN §6)', () => {
  const body = JSON.stringify(taskBody('parser-refused', 'parser'));
  const cases: { name: string; request: string; status: number }[] = [
    {
      name: 'a header block past REQUEST_HEADER_MAX_BYTES',
      request: `GET ${TASKS} HTTP/1.1\r\n${H}X-Pad: ${'a'.repeat(REQUEST_HEADER_MAX_BYTES)}\r\n\r\n`,
      status: 413,
    },
    {
      name: 'a malformed chunk size',
      request: `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n${body}\r\n0\r\n\r\n`,
      status: 400,
    },
    {
      name: 'two different Content-Length values',
      request: `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nContent-Length: ${body.length}\r\nContent-Length: 3\r\n\r\n${body}`,
      status: 400,
    },
    {
      name: 'an HTTP/1.1 request without Host',
      request: `GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n`,
      status: 400,
    },
    {
      name: 'a lower-case method',
      request: `get ${TASKS} HTTP/1.1\r\n${H}Connection: close\r\n\r\n`,
      status: 400,
    },
    {
      name: 'an Expect other than 100-continue',
      request: `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nExpect: x-unknown\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      status: 400,
    },
  ];
  it.each(cases)(
    '$name: a $status problem document, and nothing written',
    async ({ request, status }) => {
      const before = await taskCount();
      const { text } = await exchange(request);
      const [reply] = repliesIn(text);
      expect(reply?.status).toBe(status);
      expect({ status, head: reply?.head }).toEqual({
        status,
        head: expect.stringContaining('content-type: application/problem+json'),
      });
      // A problem document the contract (and so the SDK) accepts: its status is its code's.
      const problem = parseWith(ProblemSchema, JSON.parse(reply?.body || 'null'));
      expect(problem.status).toBe(status);
      expect(await taskCount()).toBe(before);
    },
  );

  it('logs the refused header block as a request line, as it logs the app-level refusals (DESIGN §11)', async () => {
    const id = 'header-overflow';
    await exchange(
      `GET /healthz HTTP/1.1\r\n${H}X-Request-Id: ${id}\r\nX-Pad: ${'a'.repeat(20_000)}\r\n\r\n`,
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    const lines = server
      .stdout()
      .split('\n')
      .filter(
        (line) =>
          line.includes('"msg":"request"') &&
          line.includes('"status":413') &&
          line.includes('header_too_large'),
      );
    expect(lines, 'no request log line for the refused request').not.toEqual([]);
  });
});

/** Rounds of each pipelining race: the server runs pipelined requests at once, so order is luck. */
const TRIALS = 10;

describe('pipelined requests on one keep-alive connection (RFC 9112 §9.3.2)', () => {
  it('answers safe requests in order, a 404 in the middle included, none lost', async () => {
    const { text } = await exchange(
      `GET /healthz HTTP/1.1\r\n${H}\r\nGET ${TASKS}/tsk_absent HTTP/1.1\r\n${H}\r\nGET ${TASKS}?limit=1&limit=2 HTTP/1.1\r\n${H}\r\nGET /readyz HTTP/1.1\r\n${H}Connection: close\r\n\r\n`,
    );
    expect(repliesIn(text).map((r) => r.status)).toEqual([200, 404, 400, 200]);
  });

  it('a request the parser refuses behind a parked one is answered after it, in order: 200 pending, then the 400 problem', async () => {
    const taskId = await submitTask(server.url, taskBody('behind-parked', 'behind-parked'));
    const { text } = await exchange(
      `GET ${TASKS}/${taskId}/result?wait_ms=500 HTTP/1.1\r\n${H}\r\nget /healthz HTTP/1.1\r\n${H}\r\n`,
    );
    const [first, second] = repliesIn(text);
    expect([first?.status, JSON.parse(first?.body ?? 'null')?.outcome]).toEqual([
      200,
      { state: 'pending' },
    ]);
    expect([second?.status, second?.head]).toEqual([
      400,
      expect.stringContaining('content-type: application/problem+json'),
    ]);
  });

  it('processes pipelined submits of one idempotency key in order: the first creates (201), the second replays (200)', async () => {
    const statuses: number[][] = [];
    for (let trial = 0; trial < TRIALS; trial++) {
      const body = JSON.stringify(taskBody(`pipelined-${trial}`, 'pipelined'));
      const one = `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`;
      const { text } = await exchange(`${one}\r\n${body}${one}Connection: close\r\n\r\n${body}`);
      statuses.push(repliesIn(text).map((r) => r.status));
    }
    expect(statuses).toEqual(Array.from({ length: TRIALS }, () => [201, 200]));
  });

  it('processes pipelined renewals in order: sequence 1 then 2 are both accepted', async () => {
    const results: string[][] = [];
    for (let trial = 0; trial < TRIALS; trial++) {
      const queue = `pipelined-renew-${trial}`;
      const submitted = await fetch(`${server.url}${TASKS}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(taskBody(`renew-${trial}`, queue)),
      });
      expect(submitted.status).toBe(201);
      const assignment = await claimNext(server.url, queue, false);
      const owner = assignment.lease.owner;
      const renew = (sequence: number, intent: string, last: boolean) => {
        const body = JSON.stringify({ owner, sequence, intent });
        return `POST /v1/worker/renew HTTP/1.1\r\n${H}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n${last ? 'Connection: close\r\n' : ''}\r\n${body}`;
      };
      const { text } = await exchange(renew(1, 'dispatch', false) + renew(2, 'keep_alive', true));
      results.push(
        repliesIn(text).map(
          (r) => `${r.status} ${(JSON.parse(r.body) as { code?: string }).code ?? 'ok'}`,
        ),
      );
    }
    expect(results).toEqual(Array.from({ length: TRIALS }, () => ['200 ok', '200 ok']));
  });
});

describe('Expect: 100-continue (RFC 9110 §10.1.1)', () => {
  it('a declared Content-Length above the route limit is refused with 413 without first inviting the body (no 100 Continue)', async () => {
    const { text } = await exchange(
      `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\nConnection: close\r\n\r\n`,
    );
    expect(text.startsWith('HTTP/1.1 413 '), text.slice(0, 40)).toBe(true);
    expect(text).not.toContain('100 Continue');
  });

  it('a body within the limit is invited (100 Continue), then read and answered 201', async () => {
    const body = JSON.stringify(taskBody('expect-continue', 'expect'));
    let sent = false;
    const { text } = await exchange(
      `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`,
      3_000,
      (so, write) => {
        if (!sent && so.startsWith('HTTP/1.1 100 ')) {
          sent = true;
          write(body);
        }
      },
    );
    expect(sent).toBe(true);
    expect(repliesIn(text.slice(text.indexOf('\r\n\r\n') + 4)).map((r) => r.status)).toEqual([201]);
  });
});

describe('a client that breaks off mid-body', () => {
  it.each([
    [
      'with a Content-Length',
      (body: string) => `Content-Length: ${body.length}\r\n\r\n${body.slice(0, 40)}`,
    ],
    [
      'chunked',
      (body: string) =>
        `Transfer-Encoding: chunked\r\n\r\n${(40).toString(16)}\r\n${body.slice(0, 40)}\r\n`,
    ],
  ])('%s: writes nothing, and the server keeps answering', async (_, framing) => {
    const before = await taskCount();
    const body = JSON.stringify(taskBody('mid-body', 'midbody'));
    const { hostname, port } = new URL(server.url);
    await new Promise<void>((resolve) => {
      const socket = connect(Number(port), hostname, () => {
        socket.write(
          `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\n${framing(body)}`,
        );
        setTimeout(() => {
          socket.destroy();
          resolve();
        }, 200);
      });
      socket.on('error', () => {});
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await taskCount()).toBe(before);
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
  });
});

const chunkBody = JSON.stringify(taskBody('edge-chunk', 'edge-chunk'));
const badChunked = `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n${chunkBody}\r\n0\r\n\r\n`;

describe('one reply per request (RFC 9112 §9.3)', () => {
  it('a malformed chunk in a body the app is reading: exactly one reply on the connection', async () => {
    const { text } = await exchange(badChunked, 3_000);
    const replies = repliesIn(text);
    expect(
      replies.map((r) => r.status),
      text,
    ).toHaveLength(1);
  });
});

const CONTINUE = 'HTTP/1.1 100 Continue\r\n\r\n';

/** The statuses of the final replies in `text`, the interim 100s taken out. */
const finals = (text: string) => repliesIn(text.split(CONTINUE).join('')).map((r) => r.status);

describe('Expect: 100-continue with a streamed body, or behind a pipelined request', () => {
  it('a chunked body is invited (100 Continue), then read and answered 201', async () => {
    const body = JSON.stringify(taskBody('edge-expect-chunked', 'edge-expect'));
    let sent = false;
    const { text } = await socketExchange(
      server.url,
      `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n`,
      3_000,
      (so, write) => {
        if (!sent && so.startsWith('HTTP/1.1 100 ')) {
          sent = true;
          write(`${Buffer.byteLength(body).toString(16)}\r\n${body}\r\n0\r\n\r\n`);
        }
      },
    );
    expect(sent, `no 100 Continue: ${text.slice(0, 60)}`).toBe(true);
    expect(finals(text)).toEqual([201]);
  });

  it('a request pipelined behind another is invited once its turn comes, then answered 201', async () => {
    const body = JSON.stringify(taskBody('edge-expect-pipelined', 'edge-expect'));
    let sent = false;
    const { text } = await socketExchange(
      server.url,
      `GET /healthz HTTP/1.1\r\n${H}\r\n` +
        `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n`,
      3_000,
      (so, write) => {
        if (!sent && so.includes(CONTINUE)) {
          sent = true;
          write(body);
        }
      },
    );
    expect(sent, `no 100 Continue: ${text.slice(0, 200)}`).toBe(true);
    // The 100 belongs to the second request: it comes after the first one's answer.
    expect(text.indexOf(CONTINUE)).toBeGreaterThan(text.indexOf('HTTP/1.1 200 '));
    expect(finals(text)).toEqual([200, 201]);
  });
});

describe('a body refused by its declared length, on a keep-alive connection', () => {
  it('the body a client sends anyway after the 413 is never read as a request of its own', async () => {
    // Above the route's limit: refused on its declared length, without a 100 Continue.
    const smuggled = `GET /healthz HTTP/1.1\r\n${H}\r\n`;
    const length = 3_000_000;
    const padded = smuggled + ' '.repeat(length - smuggled.length);
    let sent = false;
    const { text } = await socketExchange(
      server.url,
      `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: ${length}\r\n\r\n`,
      2_000,
      (so, write) => {
        if (!sent && so.startsWith('HTTP/1.1 413 ')) {
          sent = true;
          // RFC 9110 §10.1.1: a client may send the body without waiting for 100 Continue.
          write(padded);
        }
      },
    );
    expect(text.startsWith('HTTP/1.1 413 '), text.slice(0, 40)).toBe(true);
    expect(finals(text)).toEqual([413]);
  });
});
