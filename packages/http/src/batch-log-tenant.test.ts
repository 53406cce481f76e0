/**
 * Tenancy: the log line's tenant of the worker batch routes. DESIGN §11: one line per
 * request with request id, tenant, route, status, duration; a development-mode request names
 * the tenant it was authorized for (its principal is bound to none), as the single routes do.
 */
import type { AcquireReply } from '@ledgence/contracts';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import {
  ACME_PROD,
  acquireBody,
  createHarness,
  openSession,
  settleBody,
  submitTask,
} from './testdata/harness.js';

describe('development mode: the tenant of a worker batch request', () => {
  it('names the tenant of acquire:batch, renew:batch and settle:batch in their log lines', async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const h = createHarness({ auth: { keys: [] }, logger });
    await submitTask(h, ACME_PROD, undefined);
    const session = await openSession(h, ACME_PROD, undefined);
    const acquired = await h.call('/v1/worker/acquire:batch', {
      json: { commands: [acquireBody(session, 0, 1)] },
    });
    expect(acquired.status).toBe(200);
    const reply = ((await acquired.json()) as { replies: AcquireReply[] }).replies[0];
    if (reply?.disposition !== 'assigned') throw new Error('nothing assigned');
    const owner = reply.assignment.lease.owner;
    const renewed = await h.call('/v1/worker/renew:batch', {
      json: { commands: [{ owner, sequence: 1, intent: 'dispatch' }] },
    });
    expect(renewed.status).toBe(200);
    const settled = await h.call('/v1/worker/settle:batch', {
      json: { commands: [settleBody(reply.assignment)] },
    });
    expect(settled.status).toBe(200);
    const batchLines = lines.filter(
      (l) => l.msg === 'request' && typeof l.route === 'string' && l.route.endsWith(':batch'),
    );
    expect(batchLines.map((l) => [l.route, l.tenant])).toEqual([
      ['/v1/worker/acquire:batch', ACME_PROD.tenant_id],
      ['/v1/worker/renew:batch', ACME_PROD.tenant_id],
      ['/v1/worker/settle:batch', ACME_PROD.tenant_id],
    ]);
  });
});
