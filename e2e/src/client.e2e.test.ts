/**
 * The SDK's `Client` against the real server process over real sockets:
 * submission (single, batch, idempotency), status, results with a wait,
 * listing and history iterators over pages, cancellation, and errors.
 */
import { ContractError } from '@ledgence/contracts';
import {
  Client,
  type FetchLike,
  ProblemError,
  silentLogger,
  TransportError,
  Worker,
} from '@ledgence/worker';
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

/** The options of a client of the test scope on the real server. */
function scopeOf() {
  return { url: server.url, tenant: TENANT, namespace: NAMESPACE, logger: silentLogger };
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

  it('answers a batch entry the local validation refuses in its slot and sends its neighbours', async () => {
    // DESIGN §6: an item's error does not fail its neighbours, whether the server or the client
    // refuses it.
    const { c, requests } = recordingClient();
    const results = await c.submitBatch([
      { queue: 'q-batch-bad', program: 'p', data: 1, idempotencyKey: 'batch-good-1' },
      { queue: 'q-batch-bad', program: 'p', data: 2, priority: 1_000 },
      { queue: 'q-batch-bad', program: 'p', data: 3, idempotencyKey: 'batch-good-3' },
    ]);
    expect(results[0]).toMatchObject({ idempotency_key: 'batch-good-1', state: 'queued' });
    expect(results[1]).toBeInstanceOf(ProblemError);
    expect(results[1]).toMatchObject({
      code: 'invalid_input',
      status: 400,
      path: '$.commands[1].input.priority',
    });
    expect(results[2]).toMatchObject({ idempotency_key: 'batch-good-3', state: 'queued' });
    expect(requests.map((r) => (r.body as { commands: unknown[] }).commands.length)).toEqual([2]);
    const queued = [];
    for await (const page of c.list({ queue: 'q-batch-bad' })) queued.push(...page.tasks);
    expect(queued).toHaveLength(2);
    // With no valid entry, nothing is sent.
    const sent = requests.length;
    const none = await c.submitBatch([{ queue: '', program: 'p' }]);
    expect(none[0]).toBeInstanceOf(ProblemError);
    expect(none[0]).toMatchObject({ code: 'invalid_input', path: '$.commands[0].input.queue' });
    expect(requests).toHaveLength(sent);
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

  it('lists with a workflow_id filter (a TaskFilters field)', async () => {
    const { c, requests } = recordingClient();
    await c.submit({ queue: 'q-wf', program: 'p', data: null });
    const pages = [];
    for await (const page of c.list({ workflow_id: 'wf_does_not_exist' })) pages.push(page);
    // A task submitted outside a workflow has no workflow_id, so none matches.
    expect(pages).toEqual([{ tasks: [] }]);
    expect(requests.at(-1)?.url).toContain('workflow_id=wf_does_not_exist');
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

  it('result() with a very long waitMs waits the server-clamped time and returns pending', async () => {
    // A wait beyond what a Node timer holds must not turn the request's timeout into 1 ms.
    const c = new Client({ ...scopeOf(), retries: 0 });
    const task = await c.submit({ queue: 'q-nobody', program: 'p', data: null });
    for (const waitMs of [Number.MAX_SAFE_INTEGER, Number.POSITIVE_INFINITY]) {
      const started = Date.now();
      const result = await c.result(task.task_id, { waitMs }).catch((e: unknown) => e);
      const elapsed = Date.now() - started;
      if (result instanceof TransportError) {
        throw new Error(`waitMs=${waitMs} failed after ${elapsed} ms: ${result.message}`);
      }
      expect(result).toMatchObject({ outcome: { state: 'pending' } });
      // This server's long-poll maximum is 1 s (SHORT_TIMINGS).
      expect(elapsed).toBeGreaterThanOrEqual(900);
    }
  });

  it('result() rounds a fractional waitMs up and refuses a negative one', async () => {
    const { c, requests } = recordingClient();
    const task = await c.submit({ queue: 'q-nobody', program: 'p', data: null });
    const result = await c.result(task.task_id, { waitMs: 100.5 });
    expect(result.outcome).toEqual({ state: 'pending' });
    expect(requests.at(-1)?.url).toMatch(/[?&]wait_ms=101$/);
    for (const waitMs of [-1, Number.NaN]) {
      await expect(c.result(task.task_id, { waitMs })).rejects.toThrow(
        /^waitMs must be a number ≥ 0$/,
      );
    }
  });

  it('a large requestTimeoutMs does not make every request time out at once', async () => {
    // A caller who wants no client-side timeout passes Infinity, or e.g. 30 days.
    for (const requestTimeoutMs of [30 * 24 * 3600 * 1000, Number.POSITIVE_INFINITY]) {
      for (const transport of [{}, { fetch: ((input, init) => fetch(input, init)) as FetchLike }]) {
        const c = new Client({ ...scopeOf(), ...transport, retries: 0, requestTimeoutMs });
        const outcome = await c.submit({ queue: 'q-timeout', program: 'p', data: null }).then(
          (task) => task.state,
          (e: unknown) => `${(e as Error).name}: ${(e as Error).message}`,
        );
        const over = transport.fetch === undefined ? 'node:http' : 'fetch';
        expect(outcome, `requestTimeoutMs=${requestTimeoutMs} over ${over}`).toBe('queued');
      }
    }
  });

  it('reports a missing task as not_found', async () => {
    const error = await client(server.url)
      .status('task_does_not_exist')
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toMatchObject({ code: 'not_found', status: 404 });
  });
});
