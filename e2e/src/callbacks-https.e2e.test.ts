/**
 * An https destination whose certificate a private CA issued (here self-signed, as
 * testdata/tls). Without NODE_EXTRA_CA_CERTS in the server's environment every try fails on the
 * certificate until the delivery exhausts; with it, the event is delivered — as README's
 * "Running the server" (TLS) says.
 */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { client, Stack, until } from './test/harness.js';

const tls = join(dirname(fileURLToPath(import.meta.url)), 'testdata', 'tls');
const CERT = join(tls, 'localhost-test-only.crt');
const SECRET = `whsec_${Buffer.alloc(32, 12).toString('base64')}`;
const stack = new Stack('cb_cb_https');
const posts: string[] = [];
const receiver = createServer(
  { cert: readFileSync(CERT), key: readFileSync(join(tls, 'localhost-test-only.key')) },
  (req, res) => {
    req.resume();
    req.on('end', () => {
      posts.push(String(req.headers['webhook-id']));
      res.writeHead(204).end();
    });
  },
);
let origin = '';
beforeAll(async () => {
  await stack.open();
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  origin = `https://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await Promise.all(stack.servers.map((s) => s.stop('SIGKILL')));
  receiver.closeAllConnections();
  await new Promise<void>((r) => receiver.close(() => r()));
  await stack.close();
});

it('fails every try on the certificate without NODE_EXTRA_CA_CERTS, delivers with it', async () => {
  const env = {
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: `${origin}/h`, secret: SECRET },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '5',
  };
  const a = await stack.start(env);
  const c = client(a.url);
  const t = await c.submit({ queue: 'cb-https', program: 'never-run', data: {} });
  await c.cancel(t.task_id);
  await c.subscribe(t.task_id, { destination: 'billing' });
  await until(async () => (await c.subscriptions(t.task_id))[0]?.state === 'exhausted', 90_000);
  const [s] = await c.subscriptions(t.task_id);
  expect(s?.last_error).toMatch(/SELF_SIGNED|CERT/);
  expect(posts).toEqual([]);
  await a.stop('SIGKILL');
  stack.servers.splice(0);

  const b = await stack.start({ ...env, NODE_EXTRA_CA_CERTS: CERT });
  const cb = client(b.url);
  await cb.redeliver(s?.id ?? '', 1);
  await until(async () => (await cb.subscriptions(t.task_id))[0]?.state === 'delivered', 30_000);
  expect(posts).toHaveLength(1);
}, 180_000);
