/**
 * Completion routes and deliveries against a real server process (dev mode) and a
 * real node:http receiver.
 */
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, TENANT, until } from './test/harness.js';

interface Post {
  id: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
  url: string;
}

const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
const stack = new Stack('callbacks_hostile');
const posts: Post[] = [];
const answer: (post: Post) => number = () => 204;
let receiver: Server;
let origin: string;
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const post = {
        id: String(req.headers['webhook-id']),
        headers: req.headers,
        body: Buffer.concat(chunks),
        url: req.url ?? '',
      };
      posts.push(post);
      res.writeHead(answer(post)).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: `${origin}/hooks`, secret: SECRET, timeout_ms: 1_000 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '20',
  });
});

afterAll(async () => {
  receiver.closeAllConnections();
  await new Promise<void>((resolve) => receiver.close(() => resolve()));
  await stack.close();
});

function scopePath(tenant = TENANT, namespace = NAMESPACE): string {
  return `/v1/tenants/${encodeURIComponent(tenant)}/namespaces/${encodeURIComponent(namespace)}`;
}

async function raw(
  method: string,
  path: string,
  body?: string,
): Promise<{ status: number; json: unknown }> {
  const res = await fetch(new URL(path, server.url), {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body }),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: res.status, json };
}

async function terminalTask(namespace = NAMESPACE, queue = 'cb-hostile'): Promise<string> {
  const submitted = await raw(
    'POST',
    `${scopePath(TENANT, namespace)}/tasks`,
    JSON.stringify({
      idempotency_key: `k-${Math.random()}`,
      input: {
        tenant_id: TENANT,
        namespace,
        queue,
        program: { name: 'never-run' },
        data: {},
      },
    }),
  );
  expect(submitted.status).toBe(201);
  const taskId = (submitted.json as { task_id: string }).task_id;
  const cancelled = await raw('POST', `${scopePath(TENANT, namespace)}/tasks/${taskId}/cancel`);
  expect(cancelled.status).toBe(200);
  return taskId;
}

describe('hostile input on the completion routes never answers 5xx', () => {
  it('odd path segments and bodies are 4xx', async () => {
    const taskId = await terminalTask();
    const sub = await raw(
      'POST',
      `${scopePath()}/tasks/${taskId}/completion-subscriptions`,
      JSON.stringify({ subscription_key: 'hostile-1', destination: 'billing' }),
    );
    expect(sub.status).toBe(201);
    const subId = (sub.json as { id: string }).id;
    const weird = ['%00', '%FF', 'a%2Fb', '..', `${'x'.repeat(300)}`, '%EF%BF%BE', '%20a', 'a%20'];
    const statuses: Record<string, number> = {};
    for (const w of weird) {
      statuses[`sub ${w}`] = (
        await raw(
          'POST',
          `${scopePath()}/tasks/${w}/completion-subscriptions`,
          JSON.stringify({ subscription_key: 'k', destination: 'billing' }),
        )
      ).status;
      statuses[`list ${w}`] = (
        await raw('GET', `${scopePath()}/tasks/${w}/completion-subscriptions`)
      ).status;
      statuses[`redeliver ${w}`] = (
        await raw(
          'POST',
          `${scopePath()}/completion-subscriptions/${w}/redeliver`,
          JSON.stringify({ generation: 1 }),
        )
      ).status;
    }
    const bodies = [
      '{"generation":1.5}',
      '{"generation":-1}',
      '{"generation":0}',
      '{"generation":9007199254740993}',
      '{"generation":"1"}',
      '{"generation":1e400}',
      '[]',
      'null',
      '{"generation":1,"generation":1}',
      '{"generation":1,"extra":true}',
      '',
      '{"generation":17}',
    ];
    for (const b of bodies) {
      statuses[`redeliver body ${b}`] = (
        await raw('POST', `${scopePath()}/completion-subscriptions/${subId}/redeliver`, b)
      ).status;
    }
    const subBodies = [
      '{"subscription_key":"\\ud800","destination":"billing"}',
      '{"subscription_key":"k\\uFFFE","destination":"billing"}',
      '{"subscription_key":"k2","destination":"billing\\uFFFF"}',
      `{"subscription_key":"${'é'.repeat(128)}","destination":"billing"}`,
      `{"subscription_key":"k3","destination":"${'b'.repeat(65)}"}`,
      '{"subscription_key":"k4","destination":"http://127.0.0.1/"}',
      '{"subscription_key":" k5","destination":"billing"}',
    ];
    for (const b of subBodies) {
      statuses[`subscribe body ${b.slice(0, 60)}`] = (
        await raw('POST', `${scopePath()}/tasks/${taskId}/completion-subscriptions`, b)
      ).status;
    }
    const fivexx = Object.entries(statuses).filter(([, s]) => s >= 500);
    expect(fivexx).toEqual([]);
  });
});

describe('other namespaces', () => {
  it('a subscription of a task in namespace A is not found through namespace B', async () => {
    const taskId = await terminalTask('ns-a');
    const sub = await raw(
      'POST',
      `${scopePath(TENANT, 'ns-a')}/tasks/${taskId}/completion-subscriptions`,
      JSON.stringify({ subscription_key: 'ns-1', destination: 'billing' }),
    );
    expect(sub.status).toBe(201);
    const s = sub.json as { id: string; event_id: string };
    await until(
      async () =>
        (
          (
            await raw(
              'GET',
              `${scopePath(TENANT, 'ns-a')}/tasks/${taskId}/completion-subscriptions`,
            )
          ).json as { state: string }[]
        )[0]?.state === 'delivered',
      30_000,
      'delivered',
    );
    const viaB = await raw(
      'POST',
      `${scopePath(TENANT, 'ns-b')}/completion-subscriptions/${s.id}/redeliver`,
      JSON.stringify({ generation: 1 }),
    );
    expect(viaB.status).toBe(404);
    const listB = await raw(
      'GET',
      `${scopePath(TENANT, 'ns-b')}/tasks/${taskId}/completion-subscriptions`,
    );
    expect(listB.status).toBe(404);
    const subB = await raw(
      'POST',
      `${scopePath(TENANT, 'ns-b')}/tasks/${taskId}/completion-subscriptions`,
      JSON.stringify({ subscription_key: 'ns-1', destination: 'billing' }),
    );
    expect(subB.status).toBe(404);
    const otherTenant = await raw(
      'POST',
      `${scopePath('other', 'ns-a')}/completion-subscriptions/${s.id}/redeliver`,
      JSON.stringify({ generation: 1 }),
    );
    expect(otherTenant.status).toBe(404);
    // The event names the task's own namespace.
    const post = posts.find((p) => p.id === s.event_id);
    expect(JSON.parse(String(post?.body))).toMatchObject({
      ldgtenant: TENANT,
      ldgnamespace: 'ns-a',
      data: {
        result_ref: `/v1/tenants/${TENANT}/namespaces/ns-a/tasks/${taskId}/result`,
      },
    });
  });
});
