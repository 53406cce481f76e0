/**
 * Completion callbacks end to end: server processes on a real PostgreSQL post
 * signed CloudEvents to a real local receiver; tasks are submitted and
 * subscribed with the SDK's `Client` and run by the SDK's `Worker`. The
 * receiver checks every signature by hand (the README's recipe) and dedupes
 * by `webhook-id`, as a receiver of an at-least-once sender must.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type CompletionEvent, validateCompletionEvent } from '@ledgence/contracts';
import { type Client, ProblemError, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  client,
  NAMESPACE,
  Stack,
  settled,
  shortWorker,
  TENANT,
  until,
  watchUnhandledRejections,
} from './test/harness.js';

const SECRET_BYTES = Buffer.alloc(32, 42);
const SECRET = `whsec_${SECRET_BYTES.toString('base64')}`;

/** One POST as the receiver saw it. */
interface Received {
  id: string;
  timestamp: string;
  body: string;
  event: CompletionEvent;
}

/** What the receiver answers one POST with: a status, or hold it open until the sender gives up. */
type Answer = number | 'hang';

/**
 * Verifies a Standard Webhooks signature by hand: HMAC-SHA256 with the
 * base64 secret after `whsec_`, over `id.timestamp.body`, compared in
 * constant time with each `v1,` entry of the header.
 */
function verifySignature(
  secret: string,
  headers: IncomingMessage['headers'],
  body: string,
): boolean {
  const id = String(headers['webhook-id']);
  const timestamp = String(headers['webhook-timestamp']);
  const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
  const expected = createHmac('sha256', key).update(`${id}.${timestamp}.${body}`).digest();
  return String(headers['webhook-signature'])
    .split(' ')
    .some((entry) => {
      const [version, signature] = entry.split(',');
      const given = Buffer.from(signature ?? '', 'base64');
      return (
        version === 'v1' && given.length === expected.length && timingSafeEqual(given, expected)
      );
    });
}

/** A local webhook receiver that records every POST and answers with `answer`. */
class Receiver {
  readonly received: Received[] = [];
  readonly badSignatures: string[] = [];
  readonly hanging = new Set<ServerResponse>();
  answer: (request: Received, seen: number) => Answer = () => 200;
  #server: Server | undefined;

  get url(): string {
    const address = this.#server?.address() as AddressInfo;
    return `http://127.0.0.1:${address.port}/hooks`;
  }

  /** Distinct webhook ids received. */
  ids(): Set<string> {
    return new Set(this.received.map((r) => r.id));
  }

  /** How many POSTs carried `id`. */
  count(id: string): number {
    return this.received.filter((r) => r.id === id).length;
  }

  async start(): Promise<this> {
    this.#server = createServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on('data', (chunk: Buffer) => chunks.push(chunk));
      request.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        if (
          request.headers['content-type'] !== 'application/cloudevents+json' ||
          !verifySignature(SECRET, request.headers, body)
        ) {
          this.badSignatures.push(String(request.headers['webhook-id']));
          response.writeHead(400).end();
          return;
        }
        const received: Received = {
          id: String(request.headers['webhook-id']),
          timestamp: String(request.headers['webhook-timestamp']),
          body,
          event: validateCompletionEvent(JSON.parse(body)),
        };
        const seen = this.count(received.id);
        this.received.push(received);
        const answer = this.answer(received, seen);
        if (answer === 'hang') {
          this.hanging.add(response);
          response.on('close', () => this.hanging.delete(response));
          return;
        }
        response.writeHead(answer).end();
      });
    });
    await new Promise<void>((resolve) => this.#server?.listen(0, '127.0.0.1', resolve));
    return this;
  }

  async close(): Promise<void> {
    for (const response of this.hanging) response.destroy();
    await new Promise<void>((resolve) => this.#server?.close(() => resolve()));
  }
}

/** The callback settings of a server that posts to `receiver`, with a short retry schedule. */
function callbackEnv(receiver: Receiver, timeoutMs = 2_000): Record<string, string> {
  return {
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: receiver.url, secret: SECRET, timeout_ms: timeoutMs },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  };
}

const unhandled = watchUnhandledRejections();
const workers: Worker[] = [];
const receivers: Receiver[] = [];
const stack = new Stack('callbacks_e2e');

beforeAll(async () => {
  await stack.open();
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
  // Every server's sender serves the whole database: a server left running would post the
  // next test's events to this test's receiver.
  await Promise.all(stack.servers.splice(0).map((s) => s.stop('SIGKILL')));
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await Promise.all(receivers.map((r) => r.close()));
  await stack.close();
});

async function receiver(): Promise<Receiver> {
  const r = await new Receiver().start();
  receivers.push(r);
  return r;
}

/** A worker on `queue` whose `echo` handler returns its data. */
function echoWorker(url: string, queue: string, concurrency = 8): Worker {
  const w = shortWorker(url, queue, { concurrency });
  w.register('echo', (data) => data);
  workers.push(w);
  void w.run();
  return w;
}

/** Runs `fn` over `items` with at most `limit` calls in flight. */
async function inParallel<T, R>(items: T[], limit: number, fn: (item: T) => Promise<R>) {
  const results: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) {
        const index = next++;
        results[index] = await fn(items[index] as T);
      }
    }),
  );
  return results;
}

async function submitEchoTasks(c: Client, queue: string, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let start = 0; start < n; start += 1_000) {
    const entries = Array.from({ length: Math.min(1_000, n - start) }, (_, i) => ({
      queue,
      program: 'echo',
      data: { n: start + i },
    }));
    for (const result of await c.submitBatch(entries)) {
      if (result instanceof Error) throw result;
      ids.push(result.task_id);
    }
  }
  return ids;
}

describe('completion callbacks against real server processes', () => {
  it('1 000 subscribed tasks complete → 1 000 signed deliveries, none lost, none duplicated', async () => {
    const r = await receiver();
    const server = await stack.start(callbackEnv(r));
    const c = client(server.url);
    const queue = 'cb-many';
    const ids = await submitEchoTasks(c, queue, 1_000);
    // Half subscribe while their task waits, half once it is terminal (due at once).
    const early = ids.slice(0, 500);
    const late = ids.slice(500);
    await inParallel(early, 16, (id) => c.subscribe(id, { destination: 'billing' }));
    echoWorker(server.url, queue, 16);
    await settled(c, ids, 120_000);
    await inParallel(late, 16, (id) => c.subscribe(id, { destination: 'billing' }));

    await until(() => r.ids().size >= 1_000, 90_000, '1 000 deliveries');
    const byTask = new Map(r.received.map((x) => [x.event.data.task_id, x]));
    expect([...byTask.keys()].sort()).toEqual([...ids].sort());
    expect(r.badSignatures).toEqual([]);
    // No crash happened, so at-least-once had no reason to post anything twice.
    expect(r.received).toHaveLength(1_000);
    for (const { id, event } of r.received) {
      expect(event.id).toBe(id);
      expect(event.subject).toBe(event.data.task_id);
      expect(event.data.state).toBe('succeeded');
      expect(event.data.result_ref).toBe(
        `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}/tasks/${event.data.task_id}/result`,
      );
    }
    const [sample] = await c.subscriptions(ids[0] as string);
    await until(async () => (await c.subscriptions(ids[0] as string))[0]?.state === 'delivered');
    expect(sample?.event_id).toBe(byTask.get(ids[0] as string)?.id);
  }, 240_000);

  it('SIGKILL of the server mid-delivery: a restarted server delivers the same event', async () => {
    const r = await receiver();
    // The first POST hangs; the server is killed while it is in flight.
    r.answer = (_, seen) => (seen === 0 ? 'hang' : 200);
    const env = { ...callbackEnv(r, 1_000), LEDGENCE_COMPLETION_LEASE_MS: '1500' };
    const first = await stack.start(env);
    const c = client(first.url);
    const [taskId] = await submitEchoTasks(c, 'cb-kill', 1);
    const subscription = await c.subscribe(taskId as string, { destination: 'billing' });
    const w = echoWorker(first.url, 'cb-kill', 1);
    await settled(c, [taskId as string]);
    await w.stop({ graceMs: 0 });
    await until(() => r.received.length === 1, 30_000, 'the first (hanging) delivery');

    expect(await first.stop('SIGKILL')).toBe('SIGKILL');
    const second = await stack.start(env);
    const c2 = client(second.url);
    await until(() => r.received.length >= 2, 30_000, 'the redelivery after the crash');
    const [a, b] = r.received;
    expect(b?.id).toBe(a?.id);
    expect(b?.id).toBe(subscription.event_id);
    expect(b?.body).toBe(a?.body);
    await until(
      async () => (await c2.subscriptions(taskId as string))[0]?.state === 'delivered',
      30_000,
      'delivered state',
    );
    const [after] = await c2.subscriptions(taskId as string);
    expect(after).toMatchObject({ state: 'delivered', generation: 1, attempts: 2 });
  }, 120_000);

  it('the SDK subscribes, lists and redelivers under the generation rule', async () => {
    const r = await receiver();
    let failing = true;
    r.answer = () => (failing ? 410 : 200);
    const server = await stack.start(callbackEnv(r));
    const c = client(server.url);
    const [taskId] = await submitEchoTasks(c, 'cb-sdk', 1);
    const id = taskId as string;

    const created = await c.subscribe(id, { destination: 'billing', subscriptionKey: 'k1' });
    expect(created).toMatchObject({ task_id: id, state: 'waiting', generation: 1, attempts: 0 });
    const again = await c.subscribe(id, { destination: 'billing', subscriptionKey: 'k1' });
    expect(again.id).toBe(created.id);
    const unknown = await c
      .subscribe(id, { destination: 'nowhere', subscriptionKey: 'k2' })
      .catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(ProblemError);
    expect((unknown as ProblemError).problem).toMatchObject({ status: 400, code: 'invalid_input' });
    const early = await c.redeliver(created.id, 1).catch((e: unknown) => e);
    expect((early as ProblemError).problem).toMatchObject({ status: 409, code: 'conflict' });

    echoWorker(server.url, 'cb-sdk', 1);
    await settled(c, [id]);
    // 410 Gone ends the generation at once.
    await until(async () => (await c.subscriptions(id))[0]?.state === 'exhausted');
    const [exhausted] = await c.subscriptions(id);
    expect(exhausted).toMatchObject({ generation: 1, attempts: 1, last_status_code: 410 });

    failing = false;
    const next = await c.redeliver(created.id, 1);
    expect(next).toMatchObject({ id: created.id, generation: 2, attempts: 0 });
    const repeated = await c.redeliver(created.id, 1);
    expect(repeated.generation).toBe(2);
    await until(async () => (await c.subscriptions(id))[0]?.state === 'delivered');
    const [delivered] = await c.subscriptions(id);
    expect(delivered).toMatchObject({ generation: 2, attempts: 1, event_id: created.event_id });
    expect(r.count(created.event_id)).toBe(2);
    const [one, two] = r.received;
    expect(two?.body).toBe(one?.body);

    const stale = await c.redeliver(created.id, 5).catch((e: unknown) => e);
    expect((stale as ProblemError).problem).toMatchObject({ status: 409, code: 'conflict' });
    const missing = await c.subscriptions('tsk_missing').catch((e: unknown) => e);
    expect((missing as ProblemError).problem).toMatchObject({ status: 404, code: 'not_found' });
  }, 120_000);
});
