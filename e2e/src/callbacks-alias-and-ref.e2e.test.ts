/**
 * DESIGN §8 promises about what a client names and what the event points at, checked through a
 * real server process on real PostgreSQL with a real receiver:
 * - a task is subscribed to a destination alias, never to a URL (no SSRF through the API): a URL
 *   given as `destination` is refused and subscribes nothing;
 * - the webhook id, the CloudEvent id and the subscription's `event_id` are one string;
 * - `result_ref` is the path of the task's `…/result`: requested from the server, it answers
 *   that task's result, also in a tenant and namespace whose names must be percent-encoded.
 */
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  type CompletionEvent,
  type TaskResult,
  validateCompletionEvent,
} from '@ledgence/contracts';
import { Client, Worker } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, settled, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 9).toString('base64')}`;

/** One POST the receiver got. */
interface Post {
  headers: IncomingHttpHeaders;
  body: string;
  event: CompletionEvent;
}

const stack = new Stack('cb_alias_ref');
const posts: Post[] = [];
let receiver: Server;
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  receiver = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      posts.push({
        headers: request.headers,
        body,
        event: validateCompletionEvent(JSON.parse(body)),
      });
      response.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const { port } = receiver.address() as AddressInfo;
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, timeout_ms: 2_000 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  });
});

afterAll(async () => {
  await stack.close();
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
});

/** A development-mode client of the server in `tenant`/`namespace`. */
function clientIn(tenant: string, namespace: string): Client {
  return new Client({ url: server.url, tenant, namespace, backoff: { baseMs: 50, maxMs: 500 } });
}

/** Runs the one `echo` task of `queue` in `tenant`/`namespace` to success, then stops. */
async function runEcho(tenant: string, namespace: string, queue: string, taskId: string) {
  const worker = new Worker({
    url: server.url,
    tenant,
    namespace,
    queue,
    concurrency: 1,
    pollWaitMs: 500,
    backoff: { baseMs: 10, maxMs: 200 },
  });
  worker.register('echo', (data) => data);
  const running = worker.run();
  try {
    await settled(clientIn(tenant, namespace), [taskId]);
  } finally {
    await worker.stop({ graceMs: 0 });
    await running;
  }
}

describe('subscribing names an alias, never a URL', () => {
  it('a destination given as a URL (even the configured one) is 400 and subscribes nothing', async () => {
    const c = clientIn('acme', 'e2e');
    const task = await c.submit({ queue: 'cb-url', program: 'echo', data: null });
    const path = `/v1/tenants/acme/namespaces/e2e/tasks/${task.task_id}/completion-subscriptions`;
    const { port } = receiver.address() as AddressInfo;
    for (const destination of [
      `http://127.0.0.1:${port}/hooks`,
      'http://169.254.169.254/latest/meta-data/',
    ]) {
      const response = await fetch(`${server.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ subscription_key: 'by-url', destination }),
      });
      expect(response.status).toBe(400);
      expect(response.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    }
    expect(await c.subscriptions(task.task_id)).toEqual([]);
    // The alias is what subscribes.
    const subscribed = await c.subscribe(task.task_id, {
      destination: 'billing',
      subscriptionKey: 'by-alias',
    });
    expect(subscribed).toMatchObject({ destination: 'billing', state: 'waiting' });
  });
});

describe('the delivered event', () => {
  it.each([
    ['plain names', 'acme', 'e2e'],
    ['names that must be percent-encoded', 'a b%/?#', 'ns/ç ü&=+'],
  ])(
    '%s: webhook-id = CloudEvent id = event_id, and result_ref fetched from the server answers the task result',
    async (_label, tenant, namespace) => {
      const c = clientIn(tenant, namespace);
      const queue = 'cb-ref';
      const task = await c.submit({ queue, program: 'echo', data: { echoed: namespace } });
      const subscription = await c.subscribe(task.task_id, { destination: 'billing' });
      await runEcho(tenant, namespace, queue, task.task_id);
      await until(
        () => posts.some((p) => p.event.data.task_id === task.task_id),
        30_000,
        'the delivery',
      );
      const post = posts.find((p) => p.event.data.task_id === task.task_id) as Post;
      expect(post.headers['webhook-id']).toBe(post.event.id);
      expect(post.event.id).toBe(subscription.event_id);
      expect(post.event.subject).toBe(task.task_id);
      expect(post.event.data.state).toBe('succeeded');
      // A reference, not a copy of the result.
      expect(post.body).not.toContain('echoed');

      const ref = post.event.data.result_ref;
      expect(ref.startsWith('/')).toBe(true);
      const response = await fetch(new URL(ref, server.url));
      expect(response.status).toBe(200);
      const result = (await response.json()) as TaskResult;
      expect(result.outcome).toEqual({ state: 'succeeded', output: { echoed: namespace } });
      expect(result.status.task_id).toBe(task.task_id);
      expect(result).toEqual(await c.result(task.task_id));
    },
    60_000,
  );
});
