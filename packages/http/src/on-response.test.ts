import pino from 'pino';
import { describe, expect, it } from 'vitest';
import type { HttpResponseInfo } from './app.js';
import { ACME_PROD, createHarness, KEYS, scopePath, submitBody } from './testdata/harness.js';

describe('the onResponse hook', () => {
  it('reports the route pattern (never the raw path), method, status and duration', async () => {
    const seen: HttpResponseInfo[] = [];
    const h = createHarness({ onResponse: (info) => seen.push(info) });
    const tasks = `${scopePath(ACME_PROD)}/tasks`;
    await h.call(tasks, { key: KEYS.client, json: submitBody(ACME_PROD, 'hook-1') });
    await h.call(`${tasks}/tsk_missing`, { key: KEYS.client });
    await h.call('/no/such/route');
    await h.call(tasks, { json: submitBody(ACME_PROD, 'hook-2') });

    expect(seen.map(({ route, method, status }) => ({ route, method, status }))).toEqual([
      { route: '/v1/tenants/:tenant_id/namespaces/:namespace/tasks', method: 'POST', status: 201 },
      {
        route: '/v1/tenants/:tenant_id/namespaces/:namespace/tasks/:task_id',
        method: 'GET',
        status: 404,
      },
      // Unmatched paths are not echoed: they would make an unbounded label.
      { route: null, method: 'GET', status: 404 },
      // Rejected before the route ran (401), yet the pattern it matched is known.
      { route: '/v1/tenants/:tenant_id/namespaces/:namespace/tasks', method: 'POST', status: 401 },
    ]);
    for (const info of seen) {
      expect(info.durationMs).toBeGreaterThanOrEqual(0);
      expect(info.durationMs).toBeLessThan(10_000);
    }
  });

  it('a throwing hook is logged and does not change the reply', async () => {
    const lines: string[] = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(line) });
    const h = createHarness({
      logger,
      onResponse: () => {
        throw new Error('observer broke');
      },
    });
    const res = await h.call('/healthz');
    expect(res.status).toBe(200);
    expect(lines.some((line) => line.includes('onResponse hook failed'))).toBe(true);
  });
});
