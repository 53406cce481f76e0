/**
 * DESIGN §8: "When a task becomes terminal, its subscriptions' deliveries become due". The other
 * end-to-end callback tests end their tasks by a worker's settlement; a task also becomes
 * terminal by a cancel while queued, and by the maintenance loop when the lease of its last
 * allowed attempt runs out. Each kind must reach the receiver, its event naming the state.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  type AcquireReply,
  type CompletionEvent,
  validateCompletionEvent,
  type WorkerSession,
} from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { client, historyOf, NAMESPACE, reasons, Stack, TENANT, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 11).toString('base64')}`;
const scope = { tenant_id: TENANT, namespace: NAMESPACE };

const stack = new Stack('cb_terminal_kinds');
const events: CompletionEvent[] = [];
let receiver: Server;
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  receiver = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      events.push(validateCompletionEvent(JSON.parse(Buffer.concat(chunks).toString('utf8'))));
      response.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const { port } = receiver.address() as AddressInfo;
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, timeout_ms: 2_000 },
    }),
  });
});

afterAll(async () => {
  await stack.close();
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
});

async function post<T>(path: string, body: unknown): Promise<T> {
  const response = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  expect(response.status).toBe(200);
  return (await response.json()) as T;
}

/** The event posted for `taskId`, once it arrives. */
async function eventOf(taskId: string): Promise<CompletionEvent> {
  await until(() => events.some((e) => e.subject === taskId), 30_000, `the event of ${taskId}`);
  return events.find((e) => e.subject === taskId) as CompletionEvent;
}

describe('a subscribed task that becomes terminal without a settlement', () => {
  it('cancelled while queued: its event is posted, saying cancelled', async () => {
    const c = client(server.url);
    const task = await c.submit({ queue: 'cb-cancel', program: 'never', data: null });
    const subscription = await c.subscribe(task.task_id, { destination: 'billing' });
    expect(await c.cancel(task.task_id)).toBe('cancelled');
    const event = await eventOf(task.task_id);
    expect(event.id).toBe(subscription.event_id);
    expect(event.data).toMatchObject({ task_id: task.task_id, state: 'cancelled' });
  });

  it('failed by the lease expiry of its last attempt: its event is posted, saying failed', async () => {
    const c = client(server.url);
    const queue = 'cb-expiry';
    const task = await c.submit({
      queue,
      program: 'abandoned',
      data: null,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    const subscription = await c.subscribe(task.task_id, { destination: 'billing' });
    // Claimed and granted dispatch (so the attempt counts), then never renewed: the 1 s lease
    // runs out and recovery ends the task, which has no attempt left.
    const session = await post<WorkerSession>('/v1/worker/sessions', {
      scope,
      queue,
      concurrency: 1,
    });
    const reply = await post<AcquireReply>('/v1/worker/acquire', {
      scope,
      queue,
      worker_session_id: session.id,
      consumer_id: 0,
      sequence: 1,
    });
    if (reply.disposition !== 'assigned')
      throw new Error(`expected an assignment: ${reply.disposition}`);
    await post('/v1/worker/renew', {
      owner: reply.assignment.lease.owner,
      sequence: 1,
      intent: 'dispatch',
    });
    const event = await eventOf(task.task_id);
    expect(event.id).toBe(subscription.event_id);
    expect(event.data).toMatchObject({ task_id: task.task_id, state: 'failed' });
    expect(reasons(await historyOf(c, task.task_id))).toContain('lease_expired');
  });
});
