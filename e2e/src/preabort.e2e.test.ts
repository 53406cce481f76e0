/**
 * A long poll whose client is already gone when the server gets to it must
 * consume nothing (DESIGN §5: "A client disconnect ends the wait without consuming a task").
 */
import { connect } from 'node:net';
import type { WorkerSession } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NAMESPACE, postJson, Stack, TENANT } from './test/harness.js';

const scope = { tenant_id: TENANT, namespace: NAMESPACE };
const base = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;

describe('a poll whose client left before the server looked', () => {
  const stack = new Stack('preabort');
  beforeAll(async () => {
    await stack.open();
  });
  afterAll(async () => {
    await stack.close();
  });

  // The server may learn of the disconnect only while the poll's claim runs: the claim is then
  // given back (a settlement before any user code ran, not counted), and the task is claimable
  // again after its retry delay instead of staying leased to nobody until its lease expires.
  it('consumes no task: the next poll of another slot gets it, not after the lease', async () => {
    const server = await stack.start({ LEDGENCE_LEASE_DURATION_MS: '60000' });
    const { port } = new URL(server.url);
    let stolen = 0;
    const trials = 10;
    for (let i = 0; i < trials; i++) {
      const queue = `pre${i}`;
      const session = (
        await postJson(server.url, '/v1/worker/sessions', { scope, queue, concurrency: 2 })
      ).body as WorkerSession;
      const submitted = await postJson(server.url, `${base}/tasks`, {
        idempotency_key: `pre-${i}`,
        input: { ...scope, queue, program: { name: 'noop' }, data: {} },
      });
      expect(submitted.status).toBe(201);
      const body = JSON.stringify({
        scope,
        queue,
        worker_session_id: session.id,
        consumer_id: 0,
        sequence: 1,
      });
      // The whole request, then the connection reset at once: the client is gone before any reply.
      await new Promise<void>((resolve) => {
        const socket = connect(Number(port), '127.0.0.1', () => {
          socket.write(
            `POST /v1/worker/acquire?wait_ms=5000 HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
          );
          socket.resetAndDestroy();
        });
        socket.on('error', () => undefined);
        socket.on('close', () => resolve());
      });
      await new Promise((r) => setTimeout(r, 100));
      const next = await postJson(server.url, '/v1/worker/acquire?wait_ms=5000', {
        scope,
        queue,
        worker_session_id: session.id,
        consumer_id: 1,
        sequence: 1,
      });
      // Not given back, it stays active, leased to a slot that will never hear of it, and this
      // poll parks its whole wait.
      if (next.body.disposition !== 'assigned') stolen += 1;
    }
    expect(stolen).toBe(0);
  });
});
