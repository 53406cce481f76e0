/**
 * Under concurrent load with misbehaving clients, the server logs one line per
 * request with its request id (DESIGN §11), and never an API key.
 */
import { Agent, request as httpRequest } from 'node:http';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';

const KEY = 'lgk_loglines_SECRET_0123456789ab';
const WRONG = 'lgk_wrong_SECRET_fedcba9876543210';
const scope = { tenant_id: 'acme', namespace: 'logs' };
const base = '/v1/tenants/acme/namespaces/logs';
const agent = new Agent({ keepAlive: true, maxSockets: 64 });

/** The server at info level, its JSON logs (stdout) kept. */
function startLogged(env: Record<string, string>): Promise<ServerProcess> {
  return startServerProcess({ LEDGENCE_LOG_LEVEL: 'info', ...env }, { captureStdout: true });
}

function call(
  url: string,
  method: string,
  path: string,
  options: { id: string; key?: string; body?: string; abortAfterMs?: number; partial?: boolean },
): Promise<number | 'aborted'> {
  return new Promise((resolve) => {
    const headers: Record<string, string> = { 'x-request-id': options.id };
    if (options.key !== undefined) headers.authorization = `Bearer ${options.key}`;
    if (options.body !== undefined) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(
        Buffer.byteLength(options.body) + (options.partial ? 100 : 0),
      );
    }
    const req = httpRequest(new URL(path, url), { method, headers, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
      res.on('error', () => resolve('aborted'));
    });
    req.on('error', () => resolve('aborted'));
    if (options.body !== undefined) req.write(options.body);
    if (!options.partial) req.end();
    if (options.abortAfterMs !== undefined) setTimeout(() => req.destroy(), options.abortAfterMs);
  });
}

describe('request logs under load', () => {
  let database: TestDatabase;
  beforeAll(async () => {
    database = await createTestDatabase({ prefix: 'logs_under_load' });
  });
  afterAll(async () => {
    agent.destroy();
    await database.drop();
  });

  it('writes exactly one line per request, with its id, and never an API key', async () => {
    const server = await startLogged({
      DATABASE_URL: database.url,
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
      ]),
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
    });
    const session = await new Promise<{ id: string }>((resolve, reject) => {
      const req = httpRequest(
        new URL('/v1/worker/sessions', server.url),
        {
          method: 'POST',
          headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8').on('data', (c: string) => {
            text += c;
          });
          res.on('end', () => resolve(JSON.parse(text)));
        },
      );
      req.on('error', reject);
      req.end(JSON.stringify({ scope, queue: 'logs', concurrency: 50 }));
    });
    const calls: Promise<number | 'aborted'>[] = [];
    const ids: string[] = [];
    const id = (kind: string, i: number) => {
      const value = `load-${kind}-${i}`;
      ids.push(value);
      return value;
    };
    for (let i = 0; i < 40; i++) {
      const submit = JSON.stringify({
        idempotency_key: `k${i}`,
        input: { ...scope, queue: 'other', program: { name: 'p' }, data: { i } },
      });
      calls.push(
        call(server.url, 'POST', `${base}/tasks`, { id: id('submit', i), key: KEY, body: submit }),
      );
      calls.push(
        call(server.url, 'POST', `${base}/tasks`, {
          id: id('wrongkey', i),
          key: WRONG,
          body: submit,
        }),
      );
      calls.push(
        call(server.url, 'POST', `${base}/tasks`, {
          id: id('badjson', i),
          key: KEY,
          body: '{"x":',
        }),
      );
      calls.push(
        call(server.url, 'POST', '/v1/worker/acquire?wait_ms=20000', {
          id: id('parked', i),
          key: KEY,
          body: JSON.stringify({
            ...{ scope, queue: 'logs' },
            worker_session_id: session.id,
            consumer_id: i,
            sequence: 1,
          }),
          abortAfterMs: 500,
        }),
      );
      calls.push(
        call(server.url, 'POST', `${base}/tasks`, {
          id: id('midbody', i),
          key: KEY,
          body: submit,
          partial: true,
          abortAfterMs: 300,
        }),
      );
    }
    const outcomes = await Promise.all(calls);
    expect(outcomes.filter((o) => o === 'aborted').length).toBe(80);
    await new Promise((r) => setTimeout(r, 1_000));
    server.child.kill('SIGTERM');
    expect(await server.exited).toBe(0);
    const text = server.stdout();
    expect(text).not.toContain('SECRET');
    const lines = text
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l));
    const perId = new Map<string, number>();
    for (const line of lines) {
      if (line.msg === 'request') perId.set(line.request_id, (perId.get(line.request_id) ?? 0) + 1);
    }
    const missing = ids.filter((i) => perId.get(i) !== 1);
    const byKind = new Map<string, number>();
    for (const line of lines) {
      if (line.msg !== 'request') continue;
      const kind = `${String(line.request_id).split('-')[1]} ${line.status}`;
      byKind.set(kind, (byKind.get(kind) ?? 0) + 1);
    }
    console.log([...byKind]);
    console.log({
      lines: lines.length,
      missing: missing.slice(0, 10),
      count: missing.length,
      errors: lines.filter((l) => l.level >= 50).slice(0, 3),
    });
    expect(missing).toEqual([]);
  });
});
