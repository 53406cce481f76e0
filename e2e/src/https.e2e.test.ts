/**
 * The SDK over HTTPS: its default exchange (`node:https` with a keep-alive agent) against the
 * real server behind a TLS-terminating proxy, in a worker child process that trusts the test
 * certificate through `NODE_EXTRA_CA_CERTS` — and refuses the server when it does not trust it.
 * The certificate (`testdata/tls`, localhost and 127.0.0.1, self-signed) exists only for tests.
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  type HttpProxy,
  idsOf,
  Stack,
  settled,
  startHttpProxy,
  until,
} from './test/harness.js';
import { startWorkerProcess, type WorkerProcess } from './test/worker-process.js';

const tls = join(dirname(fileURLToPath(import.meta.url)), 'testdata', 'tls');
const CERT = join(tls, 'localhost-test-only.crt');
const KEY = join(tls, 'localhost-test-only.key');

const stack = new Stack('https_e2e');
let server: ServerProcess;
/** Terminates TLS in front of the server: every request it forwards arrived over TLS. */
let proxy: HttpProxy;
const processes: WorkerProcess[] = [];

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
  proxy = await startHttpProxy(server.url, {
    tls: { cert: readFileSync(CERT), key: readFileSync(KEY) },
  });
});
afterEach(async () => {
  await Promise.all(processes.splice(0).map((p) => p.stop('SIGKILL')));
});
afterAll(async () => {
  await proxy.close();
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
    const before = proxy.forwarded();
    const worker = await startWorkerProcess('tls', proxy.url, queue, {
      NODE_EXTRA_CA_CERTS: CERT,
    });
    processes.push(worker);
    const results = await settled(client(server.url), ids, 60_000);
    results.forEach((result, i) => {
      expect(result.outcome).toEqual({ state: 'succeeded', output: { i } });
    });
    expect(worker.lines.filter((l) => l.event === 'done')).toHaveLength(20);
    // Sessions, polls, renewals and settlements: all of them came through the TLS proxy.
    expect(proxy.forwarded() - before).toBeGreaterThanOrEqual(4);
  });

  it('refuses a server whose certificate it does not trust, and runs nothing', async () => {
    const queue = 'https-untrusted';
    const ids = idsOf(
      await client(server.url).submitBatch([{ queue, program: 'job', data: { i: 0 } }]),
    );
    const before = proxy.forwarded();
    const worker = await startWorkerProcess('untrusted', proxy.url, queue);
    processes.push(worker);
    await until(
      () => /self[- ]signed certificate/i.test(worker.stderr()),
      30_000,
      'a certificate error in the worker log',
    );
    expect(worker.lines.filter((l) => l.event === 'start')).toHaveLength(0);
    // The handshake failed, so no request reached the server through the proxy.
    expect(proxy.forwarded()).toBe(before);
    const status = await client(server.url).status(ids[0] as string);
    expect(status.state).toBe('queued');
  });
});
