/**
 * Development mode (no API keys, DESIGN §6) serves every request, which is safe only on loopback.
 * A web page whose host name re-resolves to 127.0.0.1 (DNS rebinding) reaches a loopback server
 * same-origin, with JSON bodies and readable replies, unless the Host it names is checked.
 */
import type { Problem } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { PROBLEM_CONTENT_TYPE } from './problem.js';
import { ACME_PROD, createHarness, KEYS, scopePath, submitBody } from './testdata/harness.js';

const tasks = `${scopePath(ACME_PROD)}/tasks`;

describe('development mode serves loopback host names only', () => {
  it.each([
    ['no Host header (app.request names localhost in the URL)', undefined],
    ['localhost', 'localhost'],
    ['localhost with a port', 'localhost:8080'],
    ['LOCALHOST (host names are case-insensitive)', 'LOCALHOST:8080'],
    ['127.0.0.1 with a port', '127.0.0.1:8080'],
    ['any 127.x address', '127.1.2.3'],
    ['[::1] with a port', '[::1]:8080'],
  ])('serves %s', async (_, host) => {
    const h = createHarness({ auth: { keys: [] } });
    const headers: Record<string, string> = host === undefined ? {} : { host };
    const res = await h.call(tasks, { json: submitBody(ACME_PROD, 'local'), headers });
    expect(res.status).toBe(201);
  });

  it.each([
    ['a rebound name', 'rebind.attacker.example:8080'],
    ['a name starting with localhost', 'localhost.attacker.example'],
    ['a name starting with a loopback address', '127.0.0.1.nip.io:8080'],
    ['a private address', '10.0.0.1:8080'],
    ['another IPv6 address', '[::2]:8080'],
  ])('refuses %s with 403 host_not_loopback, before any service call', async (_, host) => {
    const h = createHarness({ auth: { keys: [] } });
    const res = await h.call(tasks, { json: submitBody(ACME_PROD, 'rebound'), headers: { host } });
    expect(res.status).toBe(403);
    expect(res.headers.get('content-type')).toBe(PROBLEM_CONTENT_TYPE);
    const problem = (await res.json()) as Problem;
    expect(problem).toMatchObject({ code: 'forbidden', reason: 'host_not_loopback' });
    expect(problem.detail).toMatch(/configure API keys to serve other hosts/);
    expect(h.calls).toEqual({});
  });

  it('refuses a non-loopback host in an absolute URL, and on the public routes too', async () => {
    const h = createHarness({ auth: { keys: [] } });
    const absolute = await h.app.request(`http://rebind.attacker.example${tasks}`);
    expect(absolute.status).toBe(403);
    for (const path of ['/healthz', '/metrics', '/openapi.json']) {
      const res = await h.call(path, { headers: { host: 'rebind.attacker.example' } });
      expect(res.status, path).toBe(403);
    }
  });

  it('does not check the Host with API keys configured: the key is the guard', async () => {
    const h = createHarness();
    const res = await h.call(tasks, {
      key: KEYS.client,
      json: submitBody(ACME_PROD, 'keyed'),
      headers: { host: 'ledgence.example.com' },
    });
    expect(res.status).toBe(201);
  });
});
