/**
 * Tenancy: a key bound to a tenant or namespace that no `{scope}` route can ever name.
 * URL normalisation (WHATWG, which the Node adapter and every fetch client apply) removes the
 * dot segments `.` and `..` from a path, `%2E%2E` included, so
 * `/v1/tenants/acme/namespaces/../tasks` is `/v1/tenants/acme/tasks`: no client route can address
 * namespace `..`, and the worker SDK refuses such ids ("URL normalisation removes it from a
 * path"). The configuration of such a key is refused at start, like every other key that could
 * never work (apiKeyProblems), instead of serving a key whose binding is unusable.
 */
import { describe, expect, it } from 'vitest';
import { apiKeyProblems, createHttpApp } from './index.js';
import { createHarness, submitBody } from './testdata/harness.js';

const KEY = 'key-dots-0123456789';

describe('API keys bound to a dot-segment tenant or namespace', () => {
  it('no client route reaches namespace ".." (the path loses it), so the key is useless for it', async () => {
    const h = createHarness({
      auth: { keys: [{ key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client'] }] },
    });
    const scope = { tenant_id: 'acme', namespace: '..' };
    for (const spelled of ['..', '%2E%2E', '%2e.']) {
      const res = await h.call(`/v1/tenants/acme/namespaces/${spelled}/tasks`, {
        key: KEY,
        json: submitBody(scope, 'k-dots'),
      });
      const body = (await res.json()) as { status: number; detail: string };
      expect([spelled, body.status, body.detail]).toEqual([
        spelled,
        404,
        'no route matches this method and path',
      ]);
    }
  });

  for (const [field, config] of [
    ['tenant', { tenant: '..', namespaces: ['*'] }],
    ['tenant', { tenant: '.', namespaces: ['*'] }],
    ['namespaces[0]', { tenant: 'acme', namespaces: ['..'] }],
    ['namespaces[1]', { tenant: 'acme', namespaces: ['prod', '.'] }],
  ] as const) {
    it(`refuses ${JSON.stringify(config)} naming ${field}`, () => {
      const entry = { key: KEY, roles: ['client' as const], ...config };
      expect(apiKeyProblems(entry).map((p) => p.field)).toEqual([field]);
      expect(() =>
        createHttpApp({ service: createHarness().service, auth: { keys: [entry] } }),
      ).toThrow(TypeError);
    });
  }
});
