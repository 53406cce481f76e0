/**
 * An operator learns that a completion delivery was exhausted from the server's log (there is
 * no route listing exhausted deliveries across a namespace), then redelivers it with
 * `POST /v1/tenants/{tenant}/namespaces/{namespace}/completion-subscriptions/{id}/redeliver`.
 * That route needs the tenant and namespace (and, to look the subscription up with
 * `GET …/tasks/{task_id}/completion-subscriptions`, the task id): the exhausted line must
 * carry them, as the sender's lease does.
 */

import type { AddressInfo } from 'node:net';
import { createServer } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { client, NAMESPACE, SHORT_TIMINGS, Stack, TENANT, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
const stack = new Stack('callbacks_exhausted_log');
let server: ServerProcess | undefined;

/** A loopback port nothing listens on: every try is refused. */
async function closedPort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}

beforeAll(async () => {
  await stack.open();
});
afterAll(async () => {
  await server?.stop('SIGKILL');
  await stack.close();
});

it('the "completion delivery exhausted" log line names the tenant, namespace and task to redeliver', async () => {
  const port = await closedPort();
  server = await startServerProcess(
    {
      DATABASE_URL: stack.databaseUrl,
      ...SHORT_TIMINGS,
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, timeout_ms: 500 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
    },
    { captureStdout: true },
  );
  const c = client(server.url);
  const task = await c.submit({ queue: 'exhausted-log', program: 'never-run', data: {} });
  const subscription = await c.subscribe(task.task_id, { destination: 'billing' });
  await c.cancel(task.task_id); // terminal: the delivery is due now
  await until(
    async () => (await c.subscriptions(task.task_id))[0]?.state === 'exhausted',
    60_000,
    'the delivery exhausted',
  );
  const srv = server;
  await until(
    () => srv.stdout().includes('completion delivery exhausted'),
    10_000,
    'the exhausted log line',
  );
  const line = srv
    .stdout()
    .split('\n')
    .filter((l) => l.includes('completion delivery exhausted'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .find((l) => l.subscription_id === subscription.id);
  expect(line).toBeDefined();
  // What the operator needs to act on it: the redeliver route's scope, and the task.
  expect(line).toMatchObject({
    tenant_id: TENANT,
    namespace: NAMESPACE,
    task_id: task.task_id,
    subscription_id: subscription.id,
    generation: 1,
  });
});
