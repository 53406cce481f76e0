/**
 * The SDK over HTTPS: its default exchange (`node:https` with a keep-alive agent) against the
 * real server behind a TLS-terminating proxy, in a worker child process that trusts the test
 * certificate through `NODE_EXTRA_CA_CERTS` — and refuses the server when it does not trust it.
 * The certificate (`testdata/tls`, localhost and 127.0.0.1, self-signed) exists only for tests.
 */
import { readFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { client, idsOf, Stack, settled, until } from './test/harness.js';
import { startWorkerProcess, type WorkerProcess } from './test/worker-process.js';

const tls = join(dirname(fileURLToPath(import.meta.url)), 'testdata', 'tls');
const CERT = join(tls, 'localhost-test-only.crt');
const KEY = join(tls, 'localhost-test-only.key');

const stack = new Stack('https_e2e');
let server: ServerProcess;
let proxy: Server;
let httpsUrl: string;
/** Requests the proxy forwarded, i.e. that arrived over TLS. */
let forwarded = 0;
const processes: WorkerProcess[] = [];

/** Terminates TLS and forwards each request to the server as it is, streaming both ways. */
function startTlsProxy(target: string): Promise<Server> {
  const upstream = new URL(target);
  const tlsServer = createServer(
    { cert: readFileSync(CERT), key: readFileSync(KEY) },
    (req, res) => {
      forwarded += 1;
      const out = httpRequest(
        {
          host: upstream.hostname,
          port: upstream.port,
          method: req.method,
          path: req.url,
          headers: req.headers,
        },
        (reply) => {
          res.writeHead(reply.statusCode ?? 502, reply.headers);
          reply.pipe(res);
        },
      );
      out.on('error', () => res.destroy());
      req.pipe(out);
    },
  );
  return new Promise((resolve) => tlsServer.listen(0, '127.0.0.1', () => resolve(tlsServer)));
}

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
  proxy = await startTlsProxy(server.url);
  httpsUrl = `https://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
});
afterEach(async () => {
  await Promise.all(processes.splice(0).map((p) => p.stop('SIGKILL')));
});
afterAll(async () => {
  proxy.closeAllConnections();
  await new Promise((resolve) => proxy.close(resolve));
  await stack.close();
});

describe('the worker SDK over https', () => {
  it('runs tasks through a server it trusts, every request over TLS', async () => {
    const queue = 'https';
    const ids = idsOf(
      await client(server.url).submitBatch(
        Array.from({ length: 20 }, (_, i) => ({ queue, program: 'job', data: { i } })),
      ),
    );
    const before = forwarded;
    const worker = await startWorkerProcess('tls', httpsUrl, queue, {
      NODE_EXTRA_CA_CERTS: CERT,
    });
    processes.push(worker);
    const results = await settled(client(server.url), ids, 60_000);
    results.forEach((result, i) => {
      expect(result.outcome).toEqual({ state: 'succeeded', output: { i } });
    });
    expect(worker.lines.filter((l) => l.event === 'done')).toHaveLength(20);
    // Sessions, polls, renewals and settlements: all of them came through the TLS proxy.
    expect(forwarded - before).toBeGreaterThanOrEqual(4);
  });

  it('refuses a server whose certificate it does not trust, and runs nothing', async () => {
    const queue = 'https-untrusted';
    const ids = idsOf(
      await client(server.url).submitBatch([{ queue, program: 'job', data: { i: 0 } }]),
    );
    const before = forwarded;
    const worker = await startWorkerProcess('untrusted', httpsUrl, queue);
    processes.push(worker);
    await until(
      () => /self[- ]signed certificate/i.test(worker.stderr()),
      30_000,
      'a certificate error in the worker log',
    );
    expect(worker.lines.filter((l) => l.event === 'start')).toHaveLength(0);
    // The handshake failed, so no request reached the server through the proxy.
    expect(forwarded).toBe(before);
    const status = await client(server.url).status(ids[0] as string);
    expect(status.state).toBe('queued');
  });
});
