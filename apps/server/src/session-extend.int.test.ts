/**
 * `POST /v1/worker/sessions/{id}/extend` without a body, over the real server: DESIGN §4.1 "A
 * POST without a body (cancel, session extend) needs no content type", §6 lists extend with no
 * request body, and the seed's `extend_session(worker_session_id)` takes the id alone. A key
 * bound to every namespace (DESIGN §6's own example binding) extends its session by id; a key
 * of another tenant, or one that may not use the session's namespace, finds no such session.
 */
import type { Scope, WorkerSession } from '@ledgence/contracts';
import { expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEYS = {
  star: 'extend-acme-star-key-00000001',
  onlyB: 'extend-acme-b-key-00000000001',
  globex: 'extend-globex-star-key-000001',
} as const;
const A: Scope = { tenant_id: 'acme', namespace: 'a' };

const server = keyedServer('session_extend', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEYS.star, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
    { key: KEYS.onlyB, tenant: 'acme', namespaces: ['b', 'c'], roles: ['worker'] },
    { key: KEYS.globex, tenant: 'globex', namespaces: ['*'], roles: ['worker'] },
  ]),
});

it('extends a session named by id alone for a key bound to every namespace; other keys find none', async () => {
  const opened = await server.call<WorkerSession>(KEYS.star, 'POST', '/v1/worker/sessions', {
    scope: A,
    queue: 'extend',
    concurrency: 1,
  });
  expect(opened.status, JSON.stringify(opened.body)).toBe(200);
  const session = opened.body;
  const extend = (key: string) =>
    server.send<WorkerSession & { code?: string }>({
      method: 'POST',
      path: `/v1/worker/sessions/${session.id}/extend`,
      key,
    });
  const extended = await extend(KEYS.star);
  expect([extended.status, extended.body.id]).toEqual([200, session.id]);
  expect(extended.body.expires_at).toBeGreaterThanOrEqual(session.expires_at);
  // Another tenant's key, and a key of the tenant bound to other namespaces: as if missing.
  for (const key of [KEYS.globex, KEYS.onlyB]) {
    const refused = await extend(key);
    expect([refused.status, refused.body.code]).toEqual([404, 'session_not_found']);
  }
});
