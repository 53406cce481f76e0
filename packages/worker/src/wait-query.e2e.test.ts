/**
 * Seed promise (seeds/001 `AcquireOptions`): "A wait preference and the enclosing local
 * exchange deadline. Neither is part of durable acquisition identity; only the nonzero wait
 * preference is sent over a transport." The SDK is driven against a real `node:http` server on
 * 127.0.0.1 that records each request's URL and answers with a valid reply.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { WorkerApi } from './api.js';
import { Client } from './client.js';
import { HttpTransport } from './http.js';

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(
    servers.splice(0).map(
      (server) =>
        new Promise<void>((resolve) => {
          server.closeAllConnections();
          server.close(() => resolve());
        }),
    ),
  );
});

const STATUS = {
  task_id: 'tsk_1',
  run_id: 'run_1',
  queue: 'q',
  program: { name: 'p' },
  state: 'queued',
  submitted_at: 1,
  available_at: 1,
  terminal_at: null,
  attempt_count: 0,
  max_attempts: 3,
  cancel_requested_at: null,
};

async function recorder(): Promise<{ url: string; urls: string[] }> {
  const urls: string[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      urls.push(req.url ?? '');
      const body = req.url?.startsWith('/v1/worker/acquire:batch')
        ? { replies: [{ disposition: 'empty', sequence: 1 }] }
        : { status: STATUS, outcome: { state: 'pending' } };
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, urls };
}

describe('only a nonzero wait preference is sent over the transport', () => {
  it('acquire:batch with no wait sends no wait_ms; a wait is sent', async () => {
    const r = await recorder();
    const api = new WorkerApi(new HttpTransport({ url: r.url }));
    const command = {
      scope: { tenant_id: 'acme', namespace: 'prod' },
      queue: 'q',
      worker_session_id: 'ses_1',
      consumer_id: 0,
      sequence: 1,
    };
    await api.acquireBatch([command], 250);
    await api.acquireBatch([command], 0);
    expect(r.urls[0]).toBe('/v1/worker/acquire:batch?wait_ms=250');
    expect(r.urls[1]).toBe('/v1/worker/acquire:batch');
  });

  it('a result read with waitMs 0 sends no wait_ms', async () => {
    const r = await recorder();
    const client = new Client({ url: r.url, tenant: 'acme', namespace: 'prod' });
    await client.result('tsk_1', { waitMs: 0 });
    await client.result('tsk_1');
    expect(r.urls).toEqual([
      '/v1/tenants/acme/namespaces/prod/tasks/tsk_1/result',
      '/v1/tenants/acme/namespaces/prod/tasks/tsk_1/result',
    ]);
  });
});
