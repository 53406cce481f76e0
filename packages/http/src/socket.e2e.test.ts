/**
 * The app behind @hono/node-server on a real loopback socket: a client that
 * disconnects ends its long poll without consuming a task, and an oversized
 * streamed body is refused without being read to its end.
 */
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type ServerType, serve } from '@hono/node-server';
import { CONTROL_REQUEST_MAX_BYTES } from '@ledgence/contracts';
import type { WaitOptions } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHttpApp } from './index.js';
import {
  ACME_PROD,
  acquireBody,
  createHarness,
  type Harness,
  KEY_CONFIG,
  KEYS,
  openSession,
  scopePath,
  submitBody,
} from './testdata/harness.js';

let h: Harness;
let server: ServerType;
let base: string;
/** Resolves with how each parked acquire's wait ended. */
const waits: Promise<'aborted' | 'done'>[] = [];

beforeAll(async () => {
  h = createHarness();
  // Watch the signal the app hands to the service for long polls.
  const acquire = h.service.acquire.bind(h.service);
  const service = {
    ...h.service,
    acquire: (command: Parameters<typeof acquire>[0], options?: WaitOptions) => {
      const call = acquire(command, options);
      const signal = options?.signal;
      if (signal !== undefined && (options?.waitMs ?? 0) > 0) {
        waits.push(
          new Promise((resolve) => {
            signal.addEventListener('abort', () => resolve('aborted'), { once: true });
            call.finally(() => resolve(signal.aborted ? 'aborted' : 'done'));
          }),
        );
      }
      return call;
    },
  };
  const app = createHttpApp({ service, auth: { keys: KEY_CONFIG }, longPollMaxMs: 10_000 });
  await new Promise<void>((resolve) => {
    server = serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }, () => resolve());
  });
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

const headers = (key: string) => ({
  authorization: `Bearer ${key}`,
  'content-type': 'application/json',
});

describe('over a real socket', () => {
  it('a client disconnect ends the long poll and consumes nothing', async () => {
    const session = await openSession(h);
    const controller = new AbortController();
    const parked = fetch(`${base}/v1/worker/acquire?wait_ms=10000`, {
      method: 'POST',
      headers: headers(KEYS.worker),
      body: JSON.stringify(acquireBody(session, 0, 1)),
      signal: controller.signal,
    }).catch((error: unknown) => error);
    while (waits.length === 0) await new Promise((resolve) => setTimeout(resolve, 5));
    controller.abort();
    expect(await parked).toBeInstanceOf(Error);
    // The server saw the disconnect: the wait ended by abort, not by its 10 s budget.
    expect(await waits[0]).toBe('aborted');
    const submitted = await fetch(`${base}${scopePath(ACME_PROD)}/tasks`, {
      method: 'POST',
      headers: headers(KEYS.client),
      body: JSON.stringify(submitBody(ACME_PROD, 'socket-1')),
    });
    expect(submitted.status).toBe(201);
    const next = await fetch(`${base}/v1/worker/acquire`, {
      method: 'POST',
      headers: headers(KEYS.worker),
      body: JSON.stringify(acquireBody(session, 0, 1)),
    });
    expect(((await next.json()) as { disposition: string }).disposition).toBe('assigned');
  });

  it('answers 413 to an oversized chunked body without reading it to the end', async () => {
    let written = 0;
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(`${base}/v1/worker/acquire`, {
        method: 'POST',
        headers: { ...headers(KEYS.worker), 'transfer-encoding': 'chunked' },
      });
      req.on('response', (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
        req.destroy();
      });
      req.on('error', (error) => {
        if (written > 0) return;
        reject(error);
      });
      const chunk = Buffer.alloc(4096, 0x20);
      const pump = () => {
        // Write up to 64 MiB, stopping as soon as the server has answered.
        while (written < 64 * 1024 * 1024 && !req.destroyed) {
          written += chunk.length;
          if (!req.write(chunk)) {
            req.once('drain', pump);
            return;
          }
        }
      };
      pump();
    });
    expect(status).toBe(413);
    expect(written).toBeLessThan(64 * 1024 * 1024);
    expect(written).toBeGreaterThan(CONTROL_REQUEST_MAX_BYTES);
  });

  it('refuses a declared Content-Length above the limit at once', async () => {
    const res = await fetch(`${base}/v1/worker/acquire`, {
      method: 'POST',
      headers: headers(KEYS.worker),
      body: 'x'.repeat(CONTROL_REQUEST_MAX_BYTES + 1),
    });
    expect(res.status).toBe(413);
    expect(res.headers.get('content-type')).toBe('application/problem+json');
  });

  it('reads an Idempotency-Key header as UTF-8, so it names the task its body form names', async () => {
    const key = 'café-☕-1';
    const input = submitBody(ACME_PROD, key).input;
    const byHeader = await rawPost(
      `${scopePath(ACME_PROD)}/tasks`,
      {
        ...headers(KEYS.client),
        // What curl sends: the key's UTF-8 bytes, which node:http writes one per character.
        'idempotency-key': Buffer.from(key, 'utf8').toString('latin1'),
      },
      JSON.stringify({ input }),
    );
    expect(byHeader.status).toBe(201);
    const byBody = await fetch(`${base}${scopePath(ACME_PROD)}/tasks`, {
      method: 'POST',
      headers: headers(KEYS.client),
      body: JSON.stringify({ idempotency_key: key, input }),
    });
    expect(byBody.status).toBe(200);
    const created = JSON.parse(byHeader.body) as { task_id: string };
    expect(((await byBody.json()) as { task_id: string }).task_id).toBe(created.task_id);
  });

  it('refuses an Idempotency-Key header whose bytes are not UTF-8, and creates nothing', async () => {
    const input = submitBody(ACME_PROD, 'unused').input;
    const before = await listed();
    const res = await rawPost(
      `${scopePath(ACME_PROD)}/tasks`,
      {
        ...headers(KEYS.client),
        'idempotency-key': 'caf\u00e9', // one byte 0xE9: latin1, not UTF-8
      },
      JSON.stringify({ input }),
    );
    expect(res.status).toBe(400);
    expect(JSON.parse(res.body)).toMatchObject({ code: 'invalid_input' });
    expect(await listed()).toBe(before);
  });
});

/** A POST over node:http, whose header values go out as the latin1 bytes of their characters. */
function rawPost(
  path: string,
  requestHeaders: Record<string, string>,
  body: string,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${base}${path}`, { method: 'POST', headers: requestHeaders });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }),
      );
    });
    req.on('error', reject);
    // A Buffer body: with a string one, node:http would write the head as UTF-8 along with it.
    req.end(Buffer.from(body, 'utf8'));
  });
}

/** How many tasks ACME_PROD holds. */
async function listed(): Promise<number> {
  const res = await fetch(`${base}${scopePath(ACME_PROD)}/tasks?limit=500`, {
    headers: headers(KEYS.client),
  });
  return ((await res.json()) as { tasks: unknown[] }).tasks.length;
}
