/**
 * The server's edge, over the real server (real sockets, real PostgreSQL).
 *
 * - DESIGN §6: the operations routes need no key, so a wrong or malformed credential sent to them
 *   changes nothing; every /v1 route, whatever the method (HEAD, OPTIONS), needs one.
 * - API keys are compared exactly: a key differing in case, or by a trailing `=`, is refused.
 * - DESIGN §11 / README: `/metrics` label values come from bounded sets and the exposition is
 *   Prometheus text: a callback destination alias holding `"` and `\` (a valid alias) is escaped
 *   in `ledgence_callback_deliveries_total{destination}` and unescapes to the alias.
 */
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'edge-acme-client-key-0000001';
const WORKER = 'edge-acme-worker-key-0000001';
const ALIAS = 'bill"ing\\east é';

const server = keyedServer('edge_auth_metrics', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['a'], roles: ['client'] },
    { key: WORKER, tenant: 'acme', namespaces: ['a'], roles: ['worker'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    [ALIAS]: {
      // Port 9 (discard): nothing listens, each try is a refused connection, counted `retry`.
      url: 'http://127.0.0.1:9/hook',
      secret: `whsec_${Buffer.alloc(24, 9).toString('base64')}`,
      timeout_ms: 1000,
    },
  }),
  LEDGENCE_COMPLETION_RETRY_BASE_MS: '100',
});

const SCOPE = '/v1/tenants/acme/namespaces/a';

describe('credentials at the edge', () => {
  it('the operations routes answer the same with a wrong, malformed or foreign-scheme credential', async () => {
    for (const path of ['/healthz', '/readyz', '/metrics', '/openapi.json']) {
      const statuses: number[] = [];
      for (const authorization of [
        undefined,
        'Bearer wrong-key-wrong-key-wrong',
        'Basic dXNlcjpwYXNz',
        'Bearer',
      ]) {
        const res = await fetch(`${server.url}${path}`, {
          headers: authorization === undefined ? {} : { authorization },
        });
        await res.arrayBuffer();
        statuses.push(res.status);
      }
      expect({ path, statuses }).toEqual({ path, statuses: [200, 200, 200, 200] });
    }
  });

  it('HEAD and OPTIONS of a /v1 route without a key are 401, never served', async () => {
    const head = await fetch(`${server.url}${SCOPE}/tasks`, { method: 'HEAD' });
    expect(head.status).toBe(401);
    const options = await fetch(`${server.url}${SCOPE}/tasks`, { method: 'OPTIONS' });
    await options.arrayBuffer();
    expect(options.status).toBe(401);
    // With the key, HEAD of a GET route is served (no body), OPTIONS has no route.
    const keyedHead = await fetch(`${server.url}${SCOPE}/tasks`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${KEY}` },
    });
    expect(keyedHead.status).toBe(200);
  });

  it('a key differing in case or by padding is refused; the scheme is case-insensitive', async () => {
    const list = (authorization: string) =>
      fetch(`${server.url}${SCOPE}/tasks`, { headers: { authorization } }).then(async (res) => {
        await res.arrayBuffer();
        return res.status;
      });
    expect(await list(`Bearer ${KEY}`)).toBe(200);
    expect(await list(`bEARER ${KEY}`)).toBe(200);
    expect(await list(`Bearer ${KEY.toUpperCase()}`)).toBe(401);
    expect(await list(`Bearer ${KEY}=`)).toBe(401);
    expect(await list(`Bearer ${KEY.slice(0, -1)}`)).toBe(401);
    expect(await list(`Bearer ${KEY}${KEY}`)).toBe(401);
  });
});

/** Prometheus text 0.0.4 label value unescaping (\\, \", \n). */
function unescapeLabel(value: string): string {
  return value.replace(/\\(["\\n])/g, (_, c: string) => (c === 'n' ? '\n' : c));
}

describe('/metrics with a destination alias holding quotes and backslashes', () => {
  it('escapes the destination label value so it unescapes to the alias', async () => {
    const submitted = await server.call(KEY, 'POST', `${SCOPE}/tasks`, {
      idempotency_key: 'metrics-alias-1',
      input: { tenant_id: 'acme', namespace: 'a', queue: 'q', program: { name: 'p' }, data: 1 },
    });
    expect(submitted.status).toBe(201);
    const taskId = submitted.body.task_id as string;
    const subscribed = await server.call(
      KEY,
      'POST',
      `${SCOPE}/tasks/${taskId}/completion-subscriptions`,
      { subscription_key: 's1', destination: ALIAS },
    );
    expect(subscribed.status).toBe(201);
    const cancelled = await server.call(KEY, 'POST', `${SCOPE}/tasks/${taskId}/cancel`);
    expect(cancelled.status).toBe(200);

    let lines: string[] = [];
    for (let i = 0; i < 100 && lines.length === 0; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const text = await (await fetch(`${server.url}/metrics`)).text();
      lines = text
        .split('\n')
        .filter((line) => line.startsWith('ledgence_callback_deliveries_total{'));
    }
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) {
      // name{label="value",...} number — values with every " and \ escaped.
      const match = /^ledgence_callback_deliveries_total\{(.*)\} (\S+)$/.exec(line);
      expect(match, line).not.toBeNull();
      const labels = new Map<string, string>();
      const body = match?.[1] ?? '';
      const pair = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"(?:,|$)/g;
      let consumed = 0;
      for (let m = pair.exec(body); m !== null; m = pair.exec(body)) {
        labels.set(m[1] as string, unescapeLabel(m[2] as string));
        consumed = pair.lastIndex;
      }
      expect(consumed, line).toBe(body.length);
      expect(labels.get('destination')).toBe(ALIAS);
    }
  }, 30_000);
});
