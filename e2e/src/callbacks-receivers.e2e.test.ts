/**
 * Completion callbacks against real server processes and real receivers.
 * - the README's receiver-side verifier, taken literally from packages/callbacks/README.md and the
 *   root README's destinations example, inside a node:http receiver;
 * - an alias whose URL and secret change across a restart;
 * - a 429 with Retry-After;
 * - redeliver raced by parallel requests through two replicas, of delivered and exhausted
 *   generations, repeated with the same generation.
 */

import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import {
  createServer,
  type IncomingHttpHeaders,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ProblemError } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { client, Stack, until } from './test/harness.js';

interface Post {
  id: string;
  ts: string;
  sig: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
  at: number;
  status: number;
}

async function startReceiver(
  answer: (post: Post, index: number, res: ServerResponse) => number | 'hang',
) {
  const posts: Post[] = [];
  const hanging: ServerResponse[] = [];
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (c: Buffer) => chunks.push(c));
    request.on('end', () => {
      const post: Post = {
        id: String(request.headers['webhook-id']),
        ts: String(request.headers['webhook-timestamp']),
        sig: String(request.headers['webhook-signature']),
        headers: request.headers,
        body: Buffer.concat(chunks),
        at: Date.now(),
        status: 0,
      };
      posts.push(post);
      const status = answer(post, posts.length - 1, response);
      if (status === 'hang') {
        hanging.push(response);
        return;
      }
      post.status = status;
      if (!response.headersSent) response.writeHead(status);
      response.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const r = {
    origin: `http://127.0.0.1:${port}`,
    posts,
    close: () =>
      new Promise<void>((resolve) => {
        for (const h of hanging) h.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  open.push(r);
  return r;
}

const stack = new Stack('cb_cb');
const open: { close(): Promise<void> }[] = [];
beforeAll(async () => {
  await stack.open();
});
afterEach(async () => {
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
  await Promise.all(open.splice(0).map((r) => r.close()));
});
afterAll(async () => {
  await stack.close();
});

const root = join(__dirname, '..', '..');
const pkgReadme = readFileSync(join(root, 'packages', 'callbacks', 'README.md'), 'utf8');
const rootReadme = readFileSync(join(root, 'README.md'), 'utf8');

/** The README's destinations, as its `export LEDGENCE_CALLBACK_DESTINATIONS='…'` line writes them. */
function readmeDestinations(): Record<string, { url: string; secret: string; timeout_ms: number }> {
  const m = /export LEDGENCE_CALLBACK_DESTINATIONS='([^']*)'/.exec(rootReadme);
  if (m?.[1] === undefined) throw new Error('README has no destinations line');
  return JSON.parse(m[1]);
}

async function readmeVerify(): Promise<
  (secret: string, headers: unknown, body: Buffer | string) => boolean
> {
  const m = /### Verifying the signature[\s\S]*?```js\n([\s\S]*?)```/.exec(pkgReadme);
  if (m?.[1] === undefined) throw new Error('README has no verifier');
  const dir = mkdtempSync(join(tmpdir(), 'cb-'));
  const file = join(dir, 'verify.mjs');
  writeFileSync(file, m[1]);
  return (await import(pathToFileURL(file).href)).verify;
}

async function terminalTask(c: ReturnType<typeof client>, queue: string): Promise<string> {
  const task = await c.submit({ queue, program: 'never-run', data: {} });
  await c.cancel(task.task_id);
  return task.task_id;
}

async function problemOf(call: Promise<unknown>) {
  const error = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ProblemError);
  return (error as ProblemError).problem;
}

describe("the README's receiver recipe, literally", () => {
  it('accepts genuine deliveries from the server, refuses tampered, stale and foreign-key ones', async () => {
    const verify = await readmeVerify();
    const config = readmeDestinations();
    const billing = config.billing;
    if (billing === undefined) throw new Error('README configures billing');
    const verdicts: boolean[] = [];
    const r = await startReceiver((post) => {
      const ok = verify(billing.secret, post.headers, post.body);
      verdicts.push(ok);
      return ok ? 204 : 401;
    });
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { ...billing, url: `${r.origin}/hooks` },
      }),
    });
    const c = client(server.url);
    const taskId = await terminalTask(c, 'cb-readme');
    const sub = await c.subscribe(taskId, { destination: 'billing' });
    await until(
      async () => (await c.subscriptions(taskId))[0]?.state === 'delivered',
      30_000,
      'delivered',
    );
    // Redelivered: a second genuine request with the same id and bytes.
    await c.redeliver(sub.id, 1);
    await until(
      async () => (await c.subscriptions(taskId))[0]?.state === 'delivered',
      30_000,
      'generation 2 delivered',
    );
    expect(verdicts).toEqual([true, true]);
    const [first, second] = r.posts;
    if (first === undefined || second === undefined) throw new Error('two posts');
    expect(second.id).toBe(first.id);
    expect(second.body.equals(first.body)).toBe(true);
    // Tampered body, stale timestamp (replay of a 6-minute-old request), another key.
    const tampered = Buffer.from(first.body.toString().replace('"cancelled"', '"succeeded"'));
    expect(verify(billing.secret, first.headers, tampered)).toBe(false);
    expect(
      verify(
        billing.secret,
        { ...first.headers, 'webhook-timestamp': String(Number(first.ts) - 360) },
        first.body,
      ),
    ).toBe(false);
    const other = `whsec_${Buffer.alloc(24, 9).toString('base64')}`;
    expect(verify(other, first.headers, first.body)).toBe(false);
    // The body as a string (what many frameworks hand over) is verified the same way.
    expect(verify(billing.secret, first.headers, first.body.toString('utf8'))).toBe(true);
    // The tenant check of the README reads the event.
    const event = JSON.parse(first.body.toString());
    expect(event).toMatchObject({ ldgtenant: 'acme', ldgnamespace: 'e2e', id: sub.event_id });
  });
});

describe('an alias whose URL and secret change across a restart', () => {
  it('the pending delivery goes to the new URL only, same id and bytes, signed with the new key', async () => {
    const oldKey = `whsec_${Buffer.alloc(32, 1).toString('base64')}`;
    const newKey = `whsec_${Buffer.alloc(32, 2).toString('base64')}`;
    const r1 = await startReceiver((_p, _i, res) => {
      res.writeHead(503, { 'retry-after': '1' });
      return 503;
    });
    const r2 = await startReceiver(() => 200);
    const env = (url: string, secret: string) => ({
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url, secret, timeout_ms: 1_000 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    });
    const a = await stack.start(env(`${r1.origin}/old`, oldKey));
    const c = client(a.url);
    const taskId = await terminalTask(c, 'cb-move');
    await c.subscribe(taskId, { destination: 'billing' });
    await until(() => r1.posts.length >= 1, 30_000, 'a try at the old URL');
    expect(await a.stop('SIGTERM')).toBe(0);
    stack.servers.splice(stack.servers.indexOf(a), 1);
    const seenOld = r1.posts.length;
    const b = await stack.start(env(`${r2.origin}/new`, newKey));
    const cb = client(b.url);
    await until(
      async () => (await cb.subscriptions(taskId))[0]?.state === 'delivered',
      30_000,
      'delivered at the new URL',
    );
    expect(r1.posts.length).toBe(seenOld);
    expect(r2.posts).toHaveLength(1);
    const [o] = r1.posts;
    const [n] = r2.posts;
    if (o === undefined || n === undefined) throw new Error('posts');
    expect(n.id).toBe(o.id);
    expect(n.body.equals(o.body)).toBe(true);
    const verify = await readmeVerify();
    expect(verify(newKey, n.headers, n.body)).toBe(true);
    expect(verify(oldKey, n.headers, n.body)).toBe(false);
    // The second try honoured the 1 s Retry-After from the old receiver (or came after restart).
    const [s] = await cb.subscriptions(taskId);
    expect(s).toMatchObject({ generation: 1, attempts: seenOld + 1, last_status_code: 200 });
  });
});

describe('429 with Retry-After', () => {
  it('the next try waits at least the asked delay; one delivered, attempts 2', async () => {
    const secret = `whsec_${Buffer.alloc(32, 4).toString('base64')}`;
    const r = await startReceiver((_p, i, res) => {
      if (i === 0) {
        res.writeHead(429, { 'retry-after': '2' });
        return 429;
      }
      return 200;
    });
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({ billing: { url: r.origin, secret } }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '10',
    });
    const c = client(server.url);
    const taskId = await terminalTask(c, 'cb-429');
    await c.subscribe(taskId, { destination: 'billing' });
    await until(async () => (await c.subscriptions(taskId))[0]?.last_status_code === 429, 30_000);
    const [after429] = await c.subscriptions(taskId);
    expect(after429).toMatchObject({ state: 'due', attempts: 1, last_status_code: 429 });
    await until(
      async () => (await c.subscriptions(taskId))[0]?.state === 'delivered',
      30_000,
      'delivered',
    );
    const [p0, p1] = r.posts;
    expect((p1?.at ?? 0) - (p0?.at ?? 0)).toBeGreaterThanOrEqual(1_900);
    expect(r.posts).toHaveLength(2);
  });
});

describe('redeliver raced through two replicas', () => {
  it('parallel identical requests start one generation; delivered and exhausted both redeliverable; stale names refused', async () => {
    const secret = `whsec_${Buffer.alloc(32, 5).toString('base64')}`;
    // Posts 0, 1 → 200; post 2 → 410; later → 200.
    const r = await startReceiver((_p, i) => (i === 2 ? 410 : 200));
    const env = {
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({ billing: { url: r.origin, secret } }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '20',
    };
    const [a, b] = await Promise.all([stack.start(env), stack.start(env)]);
    const ca = client(a.url);
    const cb = client(b.url);
    const taskId = await terminalTask(ca, 'cb-redeliver');
    const sub = await ca.subscribe(taskId, { destination: 'billing' });
    const state = async () => (await cb.subscriptions(taskId))[0];
    await until(async () => (await state())?.state === 'delivered', 30_000, 'g1 delivered');

    // 12 identical requests at once through both replicas.
    const answers = await Promise.all(
      Array.from({ length: 12 }, (_, i) => (i % 2 ? ca : cb).redeliver(sub.id, 1)),
    );
    for (const x of answers) expect(x.generation).toBe(2);
    await until(async () => (await state())?.state === 'delivered', 30_000, 'g2 delivered');
    await new Promise((res) => setTimeout(res, 1_000));
    expect(r.posts).toHaveLength(2);

    // g2 delivered → g3, answered 410 → exhausted.
    const g3 = await Promise.all(
      Array.from({ length: 6 }, (_, i) => (i % 2 ? ca : cb).redeliver(sub.id, 2)),
    );
    for (const x of g3) expect(x.generation).toBe(3);
    await until(async () => (await state())?.state === 'exhausted', 30_000, 'g3 exhausted');
    expect(await state()).toMatchObject({ generation: 3, attempts: 1, last_status_code: 410 });
    // Naming 2 again: unchanged (g3 exists); naming 1, a late copy of the first request, too.
    // Naming 4, not started yet: 409.
    expect((await ca.redeliver(sub.id, 2)).generation).toBe(3);
    expect((await ca.redeliver(sub.id, 1)).generation).toBe(3);
    expect(await problemOf(ca.redeliver(sub.id, 4))).toMatchObject({
      status: 409,
      reason: 'generation_mismatch',
    });
    // The exhausted generation is redeliverable.
    expect((await cb.redeliver(sub.id, 3)).generation).toBe(4);
    await until(async () => (await state())?.state === 'delivered', 30_000, 'g4 delivered');
    await new Promise((res) => setTimeout(res, 500));
    expect(r.posts).toHaveLength(4);
    expect(new Set(r.posts.map((p) => p.id))).toEqual(new Set([sub.event_id]));
    expect(new Set(r.posts.map((p) => p.body.toString()))).toHaveProperty('size', 1);
  });
});

function rssKb(pid: number | undefined): number {
  const m = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1]);
}

describe('receivers that misbehave at volume', () => {
  it('60 endless 2xx bodies: each delivered once at its status, the server does not keep them', async () => {
    const secret = `whsec_${Buffer.alloc(32, 6).toString('base64')}`;
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    let pushed = 0;
    const r = await startReceiver((_p, _i, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const pump = (): void => {
        while (!res.destroyed && pushed < 4 * 1024 ** 3) {
          pushed += chunk.length;
          if (!res.write(chunk)) {
            res.once('drain', pump);
            return;
          }
        }
      };
      pump();
      return 'hang';
    });
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url: r.origin, secret, timeout_ms: 20_000 },
      }),
    });
    const c = client(server.url);
    const before = rssKb(server.child.pid);
    const ids: string[] = [];
    for (let i = 0; i < 60; i += 1) {
      const id = await terminalTask(c, 'cb-big');
      ids.push(id);
      await c.subscribe(id, { destination: 'billing' });
    }
    await until(
      async () => {
        for (const id of ids)
          if ((await c.subscriptions(id))[0]?.state !== 'delivered') return false;
        return true;
      },
      60_000,
      'all delivered',
    );
    const after = rssKb(server.child.pid);
    expect(r.posts).toHaveLength(60);
    // Well under 60 × even 1 MiB kept.
    expect(after - before).toBeLessThan(60 * 1024);
  });

  it('a receiver that accepts and hangs: every try ends at the deadline, 12 tries, then exhausted', async () => {
    const secret = `whsec_${Buffer.alloc(32, 8).toString('base64')}`;
    const r = await startReceiver(() => 'hang');
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url: r.origin, secret, timeout_ms: 200 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '5',
    });
    const c = client(server.url);
    const id = await terminalTask(c, 'cb-hang');
    await c.subscribe(id, { destination: 'billing' });
    await until(
      async () => (await c.subscriptions(id))[0]?.state === 'exhausted',
      60_000,
      'exhausted',
    );
    const [s] = await c.subscriptions(id);
    expect(s).toMatchObject({ attempts: 12, generation: 1 });
    expect(s?.last_error).toMatch(/within 200 ms/);
    expect(r.posts).toHaveLength(12);
    // Every try at least the deadline after the one before it.
    for (let i = 1; i < r.posts.length; i += 1) {
      expect((r.posts[i]?.at ?? 0) - (r.posts[i - 1]?.at ?? 0)).toBeGreaterThanOrEqual(190);
    }
  });
});
