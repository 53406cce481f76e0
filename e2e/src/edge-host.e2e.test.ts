/**
 * The Host header at the edge of the real server process
 * (apps/server/src/listener.ts; @hono/node-server builds the request URL from it). DESIGN §6:
 * errors are problem+json; README 'HTTP/1.1 at the edge': 400 for bytes that are not HTTP/1.1,
 * a request without Host among them. RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1
 * request without Host, with more than one Host line, or with an invalid Host value (an "http"
 * URI's host is never empty, RFC 9110 §4.2.1).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack } from './test/harness.js';
import { repliesIn, socketExchange } from './test/wire.js';

const stack = new Stack('edge_host');
let server: ServerProcess;
beforeAll(async () => {
  await stack.open();
  // With API keys: the development mode's loopback-host check (a 403) is not in the way.
  server = await stack.start({
    HOST: '127.0.0.1',
    LEDGENCE_API_KEYS: JSON.stringify([
      {
        key: 'edge-host-key-0123456789abcdef',
        tenant: 'acme',
        namespaces: ['e2e'],
        roles: ['client'],
      },
    ]),
  });
}, 60_000);
afterAll(async () => {
  await stack.close();
});

describe('an odd Host header (RFC 9112 §3.2, DESIGN §6)', () => {
  it.each([
    ['an empty Host', 'Host: \r\n'],
    ['two Host lines', 'Host: 127.0.0.1\r\nHost: example.com\r\n'],
    ['a Host with a port out of range', 'Host: 127.0.0.1:99999\r\n'],
    ['a Host with a path', 'Host: 127.0.0.1/x\r\n'],
    ['a Host with user info', 'Host: user@127.0.0.1\r\n'],
  ])('%s: a 400 problem document, not served', async (_name, host) => {
    const { text } = await socketExchange(
      server.url,
      `GET /healthz HTTP/1.1\r\n${host}Connection: close\r\n\r\n`,
    );
    const [reply] = repliesIn(text);
    expect({ status: reply?.status, head: reply?.head }, text.slice(0, 300)).toEqual({
      status: 400,
      head: expect.stringContaining('content-type: application/problem+json'),
    });
  });
});
