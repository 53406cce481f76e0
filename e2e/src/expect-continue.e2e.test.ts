/**
 * `Expect: 100-continue` at the edge of the real server process
 * (apps/server/src/listener.ts answers 100 when the app starts reading the body). RFC 9110
 * §10.1.1: a server that reads the body sends 100 first; a client waiting for it must not be
 * left waiting. Cases the change had no test for: a chunked body (read as a stream, not by its
 * declared length), and a request pipelined behind another on a keep-alive connection.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { SHORT_TIMINGS, Stack } from './test/harness.js';
import { repliesIn, socketExchange, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('expect_continue');
let server: ServerProcess;
beforeAll(async () => {
  await stack.open();
  server = await startServerProcess({ DATABASE_URL: stack.databaseUrl, ...SHORT_TIMINGS });
  stack.servers.push(server);
}, 60_000);
afterAll(async () => {
  await stack.close();
});

const H = 'Host: 127.0.0.1\r\n';
const TASKS = `${TASKS_BASE}/tasks`;
const CONTINUE = 'HTTP/1.1 100 Continue\r\n\r\n';

/** The statuses of the final replies in `text`, the interim 100s taken out. */
const finals = (text: string) => repliesIn(text.split(CONTINUE).join('')).map((r) => r.status);

describe('Expect: 100-continue (RFC 9110 §10.1.1)', () => {
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
