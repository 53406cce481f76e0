/**
 * Seed promise (seeds/001 `AcquireOptions`): "A wait preference and the enclosing local
 * exchange deadline. Neither is part of durable acquisition identity; only the nonzero wait
 * preference is sent over a transport." The SDK is driven against a real `node:http` server on
 * 127.0.0.1 that records each request's URL and answers with a valid reply.
 */
import { describe, expect, it } from 'vitest';
import { WorkerApi } from './api.js';
import { Client } from './client.js';
import { HttpTransport } from './http.js';
import { queuedStatus } from './testdata/snapshots.js';
import { stubServers } from './testdata/stub-servers.js';

const stubs = stubServers();

/** A server answering every request validly, keeping each request's URL. */
async function recorder(): Promise<{ url: string; urls: string[] }> {
  const urls: string[] = [];
  const url = await stubs.serve((req, res) => {
    urls.push(req.url ?? '');
    const body = req.url?.startsWith('/v1/worker/acquire:batch')
      ? { replies: [{ disposition: 'empty', sequence: 1 }] }
      : { status: queuedStatus, outcome: { state: 'pending' } };
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
  });
  return { url, urls };
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
