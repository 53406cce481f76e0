/**
 * The SDK's `Client` against the real server process over real sockets:
 * submission (single, batch, idempotency), status, results with a wait,
 * listing and history iterators over pages, cancellation, and errors.
 */
import { ContractError } from '@ledgence/contracts';
import { Client, type FetchLike, ProblemError, silentLogger, Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  historyOf,
  NAMESPACE,
  RENEW_MS,
  reasons,
  Stack,
  settled,
  sleep,
  startProxy,
  TENANT,
  watchUnhandledRejections,
} from './test/harness.js';

const stack = new Stack('client_e2e');
let server: ServerProcess;
const unhandled = watchUnhandledRejections();

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterEach(() => {
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

/** A client whose requests are recorded on their way to the real server. */
function recordingClient(url = server.url) {
  const requests: { method: string; url: string; body: unknown }[] = [];
  const recording: FetchLike = (input, init) => {
    requests.push({
      method: init.method ?? 'GET',
      url: input,
      body: typeof init.body === 'string' ? JSON.parse(init.body) : undefined,
    });
    return fetch(input, init);
  };
  const c = new Client({
    url,
    tenant: TENANT,
    namespace: NAMESPACE,
    fetch: recording,
    logger: silentLogger,
    backoff: { baseMs: 10, maxMs: 50 },
  });
  return { c, requests };
}

async function countTasks(c: Client, labels: Record<string, string>): Promise<number> {
  let count = 0;
  for await (const page of c.list({ labels, limit: 500 })) count += page.tasks.length;
  return count;
}

describe('Client against the real server', () => {
  it('expands the program shorthand, fills the scope and generates an idempotency key', async () => {
    const { c, requests } = recordingClient();
    const task = await c.submit({ queue: 'q', program: 'send', data: { to: 'a' }, priority: 5 });
    expect(task.input).toMatchObject({
      tenant_id: TENANT,
      namespace: NAMESPACE,
      queue: 'q',
      program: { name: 'send' },
      data: { to: 'a' },
      priority: 5,
    });
    expect(task.state).toBe('queued');
    const body = requests[0]?.body as { idempotency_key: string };
    expect(body.idempotency_key).toMatch(/^[0-9a-f-]{36}$/);
    expect(task.idempotency_key).toBe(body.idempotency_key);
    expect(requests[0]?.url).toBe(
      `${server.url}/v1/tenants/${TENANT}/namespaces/${NAMESPACE}/tasks`,
    );
  });

  it('keeps the generated idempotency key across retries, so a lost reply creates one task', async () => {
    const proxy = await startProxy(server.url);
    try {
      const { c, requests } = recordingClient(proxy.url);
      // The server commits the first submission; its reply is lost on the way back.
      proxy.dropReplies(1);
      const task = await c.submit({
        queue: 'q',
        program: 'p',
        data: null,
        labels: { case: 'lost-reply' },
      });
      expect(requests).toHaveLength(2);
      const keys = requests.map((r) => (r.body as { idempotency_key: string }).idempotency_key);
      expect(new Set(keys).size).toBe(1);
      expect(task.idempotency_key).toBe(keys[0]);
      expect(await countTasks(c, { case: 'lost-reply' })).toBe(1);
    } finally {
      await proxy.close();
    }
  });

  it('uses a given idempotency key: the same submission returns the same task', async () => {
    const c = client(server.url);
    const a = await c.submit({ queue: 'q', program: 'p', data: 1 }, { idempotencyKey: 'k' });
    const b = await c.submit({ queue: 'q', program: 'p', data: 1 }, { idempotencyKey: 'k' });
    expect(b.task_id).toBe(a.task_id);
    const error = await c
      .submit({ queue: 'q', program: 'p', data: 2 }, { idempotencyKey: 'k' })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toMatchObject({ code: 'conflict', status: 409 });
  });

  it('validates locally before sending', async () => {
    const { c, requests } = recordingClient();
    const error = await c
      .submit({ queue: 'q', program: 'p', data: null, priority: 1_000 })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractError);
    expect(error).toMatchObject({ code: 'invalid_input', path: '$.input.priority' });
    expect(requests).toHaveLength(0);
  });

  it('submits batches and answers each item on its own', async () => {
    const c = client(server.url);
    await c.submit({ queue: 'q', program: 'p', data: 1 }, { idempotencyKey: 'dup' });
    const results = await c.submitBatch([
      { queue: 'q', program: 'p', data: 1 },
      { queue: 'q', program: 'p', data: 2, idempotencyKey: 'dup' },
      { queue: 'q', program: 'p', data: 3, idempotencyKey: 'batch-new' },
    ]);
    expect(results[0]).not.toBeInstanceOf(Error);
    expect(results[1]).toBeInstanceOf(ProblemError);
    expect(results[1]).toMatchObject({ code: 'conflict' });
    expect(results[2]).toMatchObject({ idempotency_key: 'batch-new', state: 'queued' });
  });

  it('reads status, result with a wait, and cancels', async () => {
    const c = client(server.url);
    const task = await c.submit({ queue: 'q-cancel', program: 'p', data: null });
    expect((await c.status(task.task_id)).state).toBe('queued');
    const pending = await c.result(task.task_id);
    expect(pending.outcome).toEqual({ state: 'pending' });
    // A result wait parked on the server is answered when the task ends.
    const waiting = c.result(task.task_id, { waitMs: 10_000 });
    await sleep(200);
    expect(await c.cancel(task.task_id)).toBe('cancelled');
    const done = await waiting;
    expect(done.outcome).toEqual({ state: 'cancelled' });
    expect(done.status.terminal_at).not.toBeNull();
    // Cancelling a terminal task changes nothing.
    expect(await c.cancel(task.task_id)).toBe('cancelled');
    const snapshot = await c.snapshot(task.task_id);
    expect(snapshot.state).toBe('cancelled');
    expect(snapshot.input.data).toBeNull();
  });

  it('lists pages following next_cursor, with state and label filters', async () => {
    const { c, requests } = recordingClient();
    for (let i = 0; i < 5; i++) {
      await c.submit({ queue: 'q-list', program: 'p', data: i, labels: { team: 'a' } });
    }
    await c.submit({ queue: 'q-list', program: 'p', data: 9, labels: { team: 'b' } });
    const pages: number[] = [];
    const data: unknown[] = [];
    for await (const page of c.list({ state: 'queued', limit: 2, labels: { team: 'a' } })) {
      pages.push(page.tasks.length);
      data.push(...page.tasks.map((t) => t.labels));
    }
    expect(pages).toEqual([2, 2, 1]);
    expect(data.every((labels) => (labels as { team: string }).team === 'a')).toBe(true);
    const listUrls = requests.filter((r) => r.method === 'GET').map((r) => r.url);
    expect(listUrls[0]).toContain('state=queued');
    expect(listUrls[0]).toContain('label.team=a');
    expect(listUrls[1]).toContain('cursor=');
  });

  it('iterates history in pages', async () => {
    const c = client(server.url);
    const task = await c.submit({ queue: 'q-history', program: 'p', data: null });
    await c.cancel(task.task_id);
    const pages = [];
    for await (const page of c.history(task.task_id)) pages.push(page);
    expect(pages.flat().map((e) => e.event.reason)).toEqual(['submitted', 'cancelled']);
  });

  it('iterates a history longer than one page', async () => {
    const c = client(server.url);
    const queue = 'q-long-history';
    // 30 crashed attempts: 4 records each (claimed, dispatch_authorized,
    // report_accepted, retry_scheduled), well over one page of 100.
    const task = await c.submit({
      queue,
      program: 'crash',
      data: null,
      retry: { max_attempts: 30, delay_ms: 0 },
    });
    const w = new Worker({
      url: server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue,
      concurrency: 1,
      logger: silentLogger,
      renewIntervalMs: RENEW_MS,
      pollWaitMs: 500,
    });
    w.register('crash', () => {
      throw new Error('again');
    });
    const running = w.run();
    const [result] = await settled(c, [task.task_id]);
    await w.stop();
    await running;
    expect(result?.status.attempt_count).toBe(30);
    const pages: number[] = [];
    for await (const page of c.history(task.task_id)) pages.push(page.length);
    expect(pages.length).toBeGreaterThan(1);
    expect(pages[0]).toBe(100);
    const events = await historyOf(c, task.task_id);
    expect(events.map((e) => e.sequence)).toEqual(events.map((_, i) => i + 1));
    expect(reasons(events).at(-1)).toBe('failed');
    // History again from a later sequence, as the iterator's afterSequence allows.
    const rest = [];
    for await (const page of c.history(task.task_id, { afterSequence: 100 })) rest.push(...page);
    expect(rest).toEqual(events.slice(100));
  });

  it('reports a missing task as not_found', async () => {
    const error = await client(server.url)
      .status('task_does_not_exist')
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toMatchObject({ code: 'not_found', status: 404 });
  });
});
