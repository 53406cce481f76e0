/**
 * Every request gets one reply, and only one (RFC 9112 §9.3: responses are matched
 * to requests by order), at the edge of the real server process (apps/server/src/listener.ts):
 * a refusal node:http's parser makes after it handed the request to the app (a malformed chunk
 * in the body) must not be written as well as the app's answer to that same request.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { SHORT_TIMINGS, Stack } from './test/harness.js';
import { repliesIn, socketExchange, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('edge_one_reply');
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
const body = JSON.stringify(taskBody('edge-chunk', 'edge-chunk'));
const badChunked = `POST ${TASKS} HTTP/1.1\r\n${H}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n${body}\r\n0\r\n\r\n`;

describe('one reply per request (RFC 9112 §9.3)', () => {
  it('a malformed chunk in a body the app is reading: exactly one reply on the connection', async () => {
    const { text } = await socketExchange(server.url, badChunked, 3_000);
    const replies = repliesIn(text);
    expect(
      replies.map((r) => r.status),
      text,
    ).toHaveLength(1);
  });
});
