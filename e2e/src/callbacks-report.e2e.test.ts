/**
 * A delivery the receiver acknowledged (2xx) is posted once per generation while nothing
 * crashes (DESIGN §8): a real server process whose database connection goes through a TCP
 * proxy, a real receiver, and the database down for a moment exactly when the sender records
 * the receiver's 2xx. The sender must record it once the database is back, not leave the row
 * to its lease running out and post the acknowledged event again.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type PgProxy, startPgProxy } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { client, Stack, sleep, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 5).toString('base64')}`;

const stack = new Stack('cb_report');
let proxy: PgProxy;

beforeAll(async () => {
  await stack.open();
  proxy = await startPgProxy(stack.databaseUrl);
});
afterAll(async () => {
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
  await proxy?.close();
  await stack.close();
});

it('a 2xx whose report meets a database blip is recorded once the database is back, never posted again', async () => {
  const posts: string[] = [];
  let held: ServerResponse | undefined;
  const receiver: Server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      posts.push(String(request.headers['webhook-id']));
      if (held === undefined && posts.length === 1) held = response;
      else response.writeHead(200).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  try {
    const { port } = receiver.address() as AddressInfo;
    const server = await stack.start({
      DATABASE_URL: proxy.url,
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, timeout_ms: 2_000 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      // The sender's lease is raised to the destination timeout plus its report margin (7 s).
      LEDGENCE_COMPLETION_LEASE_MS: '1000',
    });
    const c = client(server.url);
    const task = await c.submit({ queue: 'cb-report', program: 'never-run', data: {} });
    const subscription = await c.subscribe(task.task_id, { destination: 'billing' });
    await c.cancel(task.task_id);
    await until(() => held !== undefined, 30_000, 'the first POST');

    // The database goes away while the receiver is deciding; the receiver then acknowledges.
    proxy.refuse(true);
    (held as ServerResponse).writeHead(200).end();
    // Down long enough for the sender's report to fail at least once, well within its lease.
    await sleep(1_500);
    proxy.refuse(false);

    await until(
      async () => (await c.subscriptions(task.task_id))[0]?.state === 'delivered',
      30_000,
      'the delivery recorded',
    );
    const [view] = await c.subscriptions(task.task_id);
    expect(view).toMatchObject({ state: 'delivered', generation: 1, attempts: 1 });
    expect(posts.filter((id) => id === subscription.event_id)).toHaveLength(1);
  } finally {
    receiver.closeAllConnections();
    await new Promise<void>((resolve) => receiver.close(() => resolve()));
  }
});
