import type { AcquireCommand, TaskStatus, WorkerSession } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NAMESPACE, postJson, Stack, TENANT } from './test/harness.js';
import { postAndLeave } from './test/wire.js';

const scope = { tenant_id: TENANT, namespace: NAMESPACE };
const base = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;

describe('a replayed poll whose client left', () => {
  const stack = new Stack('replayleft');
  beforeAll(async () => {
    await stack.open();
  });
  afterAll(async () => {
    await stack.close();
  });

  for (const path of ['/v1/worker/acquire', '/v1/worker/acquire?wait_ms=1000']) {
    it(`${path}: leaves the running attempt to its worker, whose settlement is accepted`, async () => {
      const server = await stack.start({ LEDGENCE_LEASE_DURATION_MS: '60000' });
      const queue = `replay-left-${path.length}`;
      const session = (
        await postJson(server.url, '/v1/worker/sessions', { scope, queue, concurrency: 1 })
      ).body as WorkerSession;
      const submitted = await postJson(server.url, `${base}/tasks`, {
        idempotency_key: queue,
        input: {
          ...scope,
          queue,
          program: { name: 'noop' },
          data: {},
          retry: { max_attempts: 1, delay_ms: 1000 },
        },
      });
      expect(submitted.status).toBe(201);
      const poll: AcquireCommand = {
        scope,
        queue,
        worker_session_id: session.id,
        consumer_id: 0,
        sequence: 1,
      };
      const assigned = await postJson(server.url, '/v1/worker/acquire', poll);
      expect(assigned.body.disposition).toBe('assigned');
      const owner = assigned.body.assignment.lease.owner;
      // The worker is granted dispatch: its user code runs from here on.
      const dispatch = await postJson(server.url, '/v1/worker/renew', {
        owner,
        sequence: 1,
        intent: 'dispatch',
      });
      expect(dispatch.body.dispatch_allowed).toBe(true);

      // A late copy of the answered poll, its client gone before the server looked at it.
      await postAndLeave(server.url, path, poll);
      // A replay is one read and, before the fix, one settlement: answered well within this.
      // Nothing observable tells when a replay that changes nothing has been served; a server
      // slower than this could only let the test pass without having checked, never fail it.
      await new Promise((r) => setTimeout(r, 300));

      const settle = await postJson(server.url, '/v1/worker/settle', {
        owner,
        operation_id: 'done',
        report: {
          kind: 'completed',
          report: {
            context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
            outcome: { kind: 'success', output: { ok: true } },
          },
        },
        quiescence: 'confirmed',
        processing_trace: null,
      });
      expect(settle.status).toBe(200);
      const status = (await (
        await fetch(new URL(`${base}/tasks/${owner.task_id}`, server.url))
      ).json()) as TaskStatus;
      expect(status.state).toBe('succeeded');
    });
  }
});
