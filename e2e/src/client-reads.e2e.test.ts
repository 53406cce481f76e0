/**
 * The Client's read and control methods against the real server —
 * listing under churn, history pages of a growing task, cursor abuse, AbortSignal on
 * every method (handles and retries after the abort), result waits at edge values,
 * cancel in each state, and the fields of each error kind.
 */
import { type AddressInfo, createServer as createTcpServer, type Socket } from 'node:net';
import { taskCursorBinding } from '@ledgence/contracts';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
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
  NAMESPACE,
  RENEW_MS,
  Stack,
  sleep,
  startHttpProxy,
  TENANT,
  until,
  watchUnhandledRejections,
} from './test/harness.js';

const stack = new Stack('cr_client_reads');
let server: ServerProcess;
const unhandled = watchUnhandledRejections();

beforeAll(async () => {
  await stack.open();
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: {
        url: 'http://127.0.0.1:9/hook',
        secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
        timeout_ms: 500,
      },
    }),
  });
});
afterEach(() => {
  expect(unhandled.seen).toEqual([]);
});
afterAll(async () => {
  unhandled.dispose();
  await stack.close();
});

function clientOf(options: Partial<ConstructorParameters<typeof Client>[0]> = {}): Client {
  return new Client({
    url: server.url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    backoff: { baseMs: 10, maxMs: 50 },
    ...options,
  });
}

/** Raw GET of the list route, to see statuses the SDK would turn into errors. */
async function rawList(
  query: string,
  tenant = TENANT,
  namespace = NAMESPACE,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(
    `${server.url}/v1/tenants/${tenant}/namespaces/${namespace}/tasks?${query}`,
  );
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

function cursorOf(payload: unknown[]): string {
  return Buffer.from(JSON.stringify(payload), 'utf8').toString('base64url');
}

function handles(kind: string): number {
  return process.getActiveResourcesInfo().filter((r) => r === kind).length;
}

describe('pagination under churn', () => {
  it('lists every task that existed before the listing began exactly once, while tasks are submitted and cancelled', async () => {
    const c = clientOf();
    const labels = { run: 'churn' };
    // A batch (one submitted_at, ties broken by task id) and singles (distinct times).
    const batch = await c.submitBatch(
      Array.from({ length: 40 }, (_, i) => ({ queue: 'q-churn', program: 'p', data: i, labels })),
    );
    const before = new Set(
      batch.map((t) => {
        if (t instanceof Error) throw t;
        return t.task_id;
      }),
    );
    for (let i = 0; i < 20; i++) {
      before.add((await c.submit({ queue: 'q-churn', program: 'p', data: i, labels })).task_id);
    }
    const preexisting = [...before];
    let stop = false;
    const churn = (async () => {
      let n = 0;
      while (!stop) {
        const created = await c.submit({ queue: 'q-churn', program: 'p', data: n, labels });
        await c.cancel(created.task_id);
        const victim = preexisting[n % preexisting.length] as string;
        await c.cancel(victim);
        n += 1;
      }
      return n;
    })();
    const seen: string[] = [];
    let pages = 0;
    // A new page size on the cursor of the previous page is allowed.
    let cursor: string | undefined;
    for (;;) {
      const limit = 1 + (pages % 4);
      const iterator = c.list({ labels, limit, cursor });
      const { value: page } = await iterator.next();
      await iterator.return(undefined);
      if (page === undefined) break;
      pages += 1;
      seen.push(...page.tasks.map((t) => t.task_id));
      await sleep(5);
      if (page.next_cursor === undefined) break;
      cursor = page.next_cursor;
    }
    stop = true;
    const churned = await churn;
    expect(churned).toBeGreaterThan(3);
    expect(seen.length).toBe(new Set(seen).size);
    const missing = preexisting.filter((id) => !seen.includes(id));
    expect(missing).toEqual([]);
  });

  it('pages a history that keeps growing without a gap or a repeat', async () => {
    const c = clientOf();
    const queue = 'q-grow';
    const task = await c.submit({
      queue,
      program: 'crash',
      data: null,
      retry: { max_attempts: 40, delay_ms: 0 },
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
    w.register('crash', async () => {
      await sleep(5);
      throw new Error('again');
    });
    const running = w.run();
    const sequences: number[] = [];
    let after = 0;
    try {
      // Page by hand from the last sequence seen, while the worker keeps adding records.
      for (let round = 0; round < 400; round++) {
        for await (const page of c.history(task.task_id, { afterSequence: after })) {
          for (const e of page) sequences.push(e.sequence);
          after = page.at(-1)?.sequence ?? after;
          await sleep(3);
        }
        const { state } = await c.status(task.task_id);
        if (state === 'failed') {
          for await (const page of c.history(task.task_id, { afterSequence: after })) {
            for (const e of page) sequences.push(e.sequence);
          }
          break;
        }
        await sleep(10);
      }
    } finally {
      await w.stop({ graceMs: 0 });
      await running;
    }
    expect(sequences.length).toBeGreaterThan(100);
    expect(sequences).toEqual(sequences.map((_, i) => i + 1));
  });
});

describe('cursor abuse', () => {
  it('answers 400 invalid_cursor for another scope, other filters or a tampered cursor; never 5xx; never other data', async () => {
    const c = clientOf();
    const other = clientOf({ namespace: 'cr-other' });
    const otherTenant = clientOf({ tenant: 'cr-tenant' });
    for (const x of [c, other, otherTenant]) {
      for (let i = 0; i < 3; i++) {
        await x.submit({ queue: 'q-cur', program: 'p', data: i, labels: { a: '1', b: '2' } });
      }
    }
    const first = await rawList('queue=q-cur&limit=1');
    expect(first.status).toBe(200);
    const cursor = first.body.next_cursor as string;
    expect(typeof cursor).toBe('string');
    // The same cursor in another namespace, another tenant, with other filters.
    const refused = [
      await rawList(`queue=q-cur&limit=1&cursor=${cursor}`, TENANT, 'cr-other'),
      await rawList(`queue=q-cur&limit=1&cursor=${cursor}`, 'cr-tenant', NAMESPACE),
      await rawList(`queue=q-cur&state=queued&limit=1&cursor=${cursor}`),
      await rawList(`limit=1&cursor=${cursor}`),
      await rawList(`queue=q-cur&label.a=1&limit=1&cursor=${cursor}`),
    ];
    for (const r of refused) {
      expect([r.status, r.body.code, r.body.reason]).toEqual([
        400,
        'invalid_input',
        'invalid_cursor',
      ]);
    }
    // Label filters in another order are the same filters.
    const byLabels = await rawList('label.a=1&label.b=2&limit=1');
    const swapped = await rawList(
      `label.b=2&label.a=1&limit=1&cursor=${byLabels.body.next_cursor}`,
    );
    expect(swapped.status).toBe(200);
    // Through the SDK: a ProblemError with the reason and path.
    const error = await other
      .list({ queue: 'q-cur', cursor })
      .next()
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toMatchObject({
      code: 'invalid_input',
      reason: 'invalid_cursor',
      path: 'query.cursor',
      retryable: false,
      status: 400,
    });
    // Tampered cursors.
    const scope = { tenant_id: TENANT, namespace: NAMESPACE };
    const binding = taskCursorBinding(scope, { queue: 'q-cur' });
    const tampered = [
      cursor.slice(0, -2),
      `${cursor}=`,
      cursor.replace(/^./, (ch) => (ch === 'W' ? 'X' : 'W')),
      'x'.repeat(1025),
      cursorOf([2, binding, 1, 'tsk']),
      cursorOf([1, binding, 2 ** 53, 'tsk']),
      cursorOf([1, binding, -1, 'tsk']),
      cursorOf([1, binding, 1.5, 'tsk']),
      cursorOf([1, binding, '1', 'tsk']),
      cursorOf([1, binding, 1, '']),
      cursorOf([1, binding, 1, 'a\u0000b']),
      cursorOf([1, binding, 1, 'x'.repeat(129)]),
      cursorOf([1, binding, 1]),
      cursorOf({ 0: 1 } as unknown as unknown[]),
      '%FF',
    ];
    for (const bad of tampered) {
      const r = await rawList(`queue=q-cur&limit=1&cursor=${bad}`);
      expect([bad, r.status, r.body.code]).toEqual([bad, 400, 'invalid_input']);
    }
    // A forged cursor with this scope's binding seeks only within this scope.
    const seekable = [
      // The last code point identifier text allows (U+10FFFE and U+10FFFF are noncharacters).
      cursorOf([1, binding, Number.MAX_SAFE_INTEGER, '\u{10FFFD}'.repeat(32)]),
      cursorOf([1, binding, 0, 'tsk']),
      cursorOf([1, binding, Date.now() + 1e9, 'é']),
    ];
    for (const forged of seekable) {
      const r = await rawList(`queue=q-cur&limit=500&cursor=${forged}`);
      expect([forged, r.status]).toEqual([forged, 200]);
      for (const t of r.body.tasks as { tenant_id?: string; namespace?: string; queue: string }[]) {
        expect(t.queue).toBe('q-cur');
      }
    }
    const everything = await rawList(
      `queue=q-cur&limit=500&cursor=${cursorOf([1, binding, Number.MAX_SAFE_INTEGER, 'z'])}`,
    );
    expect((everything.body.tasks as unknown[]).length).toBe(3);
  });

  it('an old cursor whose anchor task is gone (retention removed it) continues from its position', async () => {
    const c = clientOf();
    const labels = { run: 'anchor' };
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) {
      ids.push((await c.submit({ queue: 'q-anchor', program: 'p', data: i, labels })).task_id);
    }
    const it1 = c.list({ labels, limit: 2 });
    const page = (await it1.next()).value;
    await it1.return(undefined);
    if (page === undefined || page.next_cursor === undefined) throw new Error('no page');
    const anchor = page.tasks.at(-1)?.task_id as string;
    // What retention does to a task row: delete it (and what hangs off it).
    const admin = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
    const { sql } = admin;
    try {
      for (const table of ['task_history', 'attempts', 'tasks']) {
        await sql
          .unsafe(`delete from ${table} where task_id = $1`, [anchor])
          .catch((e: unknown) => {
            if (table === 'tasks') throw e;
          });
      }
    } finally {
      await admin.close();
    }
    const rest: string[] = [];
    for await (const p of c.list({ labels, limit: 2, cursor: page.next_cursor })) {
      rest.push(...p.tasks.map((t) => t.task_id));
    }
    expect([...page.tasks.map((t) => t.task_id), ...rest]).toEqual([...ids].reverse());
  });
});

describe('AbortSignal on every Client method', () => {
  const methods = (c: Client, id: string, signal: AbortSignal) =>
    ({
      submit: () => c.submit({ queue: 'q-abort', program: 'p' }, { signal }),
      submitBatch: () => c.submitBatch([{ queue: 'q-abort', program: 'p' }], { signal }),
      status: () => c.status(id, { signal }),
      result: () => c.result(id, { signal }),
      resultWait: () => c.result(id, { waitMs: 60_000, signal }),
      snapshot: () => c.snapshot(id, { signal }),
      attempt: () => c.attempt(id, 'att_x', { signal }),
      list: () => c.list({ signal }).next(),
      history: () => c.history(id, { signal }).next(),
      cancel: () => c.cancel(id, { signal }),
      subscribe: () => c.subscribe(id, { destination: 'billing', signal }),
      subscriptions: () => c.subscriptions(id, { signal }),
      redeliver: () => c.redeliver('sub_x', 1, { signal }),
    }) as Record<string, () => Promise<unknown>>;

  it('before send: rejects with the reason, sends nothing', async () => {
    let seen = 0;
    const proxy = await startHttpProxy(server.url, {
      observe: () => {
        seen += 1;
        return undefined;
      },
    });
    try {
      const c = clientOf({ url: proxy.url });
      const task = await c.submit({ queue: 'q-abort', program: 'p' });
      seen = 0;
      const controller = new AbortController();
      const reason = new Error('stop');
      controller.abort(reason);
      for (const [name, call] of Object.entries(methods(c, task.task_id, controller.signal))) {
        const outcome = await call().then(
          (v) => ({ resolved: v }),
          (e: unknown) => e,
        );
        expect([name, outcome]).toEqual([name, reason]);
      }
      expect(seen).toBe(0);
    } finally {
      await proxy.close();
    }
  });

  it('during the request: each rejects promptly with the reason, closing its connection, leaving no timer', async () => {
    // A server that accepts and never answers, in this process: its side of each connection
    // closes only when the client destroys its socket.
    const open = new Set<Socket>();
    let accepted = 0;
    const silent = createTcpServer((socket) => {
      accepted += 1;
      open.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => open.delete(socket));
      socket.resume();
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    try {
      const viaFetch: FetchLike = (input, init) => fetch(input, init);
      const transports = [
        clientOf({ url, requestTimeoutMs: 60_000 }),
        clientOf({ url, requestTimeoutMs: 60_000, fetch: viaFetch }),
      ];
      await sleep(50);
      const sockets = handles('TCPSocketWrap');
      const timers = handles('Timeout');
      for (const [c, name] of transports.flatMap((t) =>
        Object.keys(methods(t, 'tsk_x', new AbortController().signal)).map((n) => [t, n] as const),
      )) {
        const controller = new AbortController();
        const before = accepted;
        const pending = methods(c, 'tsk_x', controller.signal)
          [name]?.()
          .then(
            (v) => ({ resolved: v }),
            (e: unknown) => e,
          );
        await until(() => accepted > before, 5_000, `${name} connecting`);
        await sleep(20);
        const reason = new Error(`abort ${name}`);
        const started = Date.now();
        controller.abort(reason);
        const outcome = await pending;
        expect([name, outcome]).toEqual([name, reason]);
        // Not the request timeout (10 s): the abort ended it. A bound, not a speed.
        expect([name, Date.now() - started < 3_000]).toEqual([name, true]);
        // Node's global fetch (undici) keeps an aborted request's connection (unreferenced) in
        // its pool; that is the caller's fetch, not the SDK's, so only node:http is held to it.
        if (c === transports[0]) {
          await until(() => open.size === 0, 2_000, `${name}'s connection closed`);
          await sleep(20);
          expect([name, handles('TCPSocketWrap') <= sockets]).toEqual([name, true]);
        }
        expect([name, handles('Timeout') <= timers]).toEqual([name, true]);
      }
    } finally {
      for (const socket of open) socket.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  });

  it('during a retry backoff: rejects with the reason at once, and no retry is sent afterwards', async () => {
    let refused = 0;
    const proxy = await startHttpProxy(server.url, {
      refuse: () => {
        refused += 1;
        return true;
      },
    });
    try {
      const c = clientOf({
        url: proxy.url,
        retries: 5,
        backoff: { baseMs: 400, maxMs: 400 },
      });
      const timers = handles('Timeout');
      for (const [name, call] of Object.entries(
        methods(c, 'tsk_x', new AbortController().signal),
      )) {
        void call;
        const controller = new AbortController();
        const before = refused;
        const pending = methods(c, 'tsk_x', controller.signal)
          [name]?.()
          .then(
            (v) => ({ resolved: v }),
            (e: unknown) => e,
          );
        await until(() => refused > before, 5_000, `${name} refused once`);
        await sleep(50);
        const reason = new Error(`abort ${name}`);
        const started = Date.now();
        controller.abort(reason);
        const outcome = await pending;
        const elapsed = Date.now() - started;
        const at = refused;
        await sleep(600);
        // submitBatch answers what it has (the unavailable items) rather than rejecting: that
        // is its documented behaviour for a batch, so only its promptness is checked.
        if (name !== 'submitBatch') expect([name, outcome]).toEqual([name, reason]);
        // Not after the backoff's wait: the abort ended it (no retry after it, below).
        expect([name, elapsed < 500]).toEqual([name, true]);
        expect([name, refused - at]).toEqual([name, 0]);
        expect([name, handles('Timeout') <= timers]).toEqual([name, true]);
      }
    } finally {
      await proxy.close();
    }
  });
});

describe('result waits and cancel', () => {
  it('waitMs edge values: 0, 1, the maximum, above it, Infinity, -0; NaN and negatives refused locally', async () => {
    const requests: string[] = [];
    const recording: FetchLike = (input, init) => {
      requests.push(input);
      return fetch(input, init);
    };
    const c = clientOf({ fetch: recording, retries: 0 });
    const task = await c.submit({ queue: 'q-nobody', program: 'p' });
    // SHORT_TIMINGS: the server's long-poll maximum is 1 000 ms. What is sent is what is left of
    // the wait when the request goes out (client.ts result), so a loaded machine may send a few
    // ms less; a wait the server caps ends after its maximum, never after what was asked.
    const cases: [number, number | null, boolean][] = [
      [0, null, false],
      [-0, null, false],
      [1, 1, false],
      [0.0001, 1, false],
      [1_000, 1_000, true],
      [1_001, 1_001, true],
      [300_000, 300_000, true],
      [300_001, 300_000, true],
      [Number.POSITIVE_INFINITY, 300_000, true],
    ];
    for (const [waitMs, wire, capped] of cases) {
      requests.length = 0;
      const started = Date.now();
      const r = await c.result(task.task_id, { waitMs });
      const elapsed = Date.now() - started;
      expect([waitMs, r.outcome.state]).toEqual([waitMs, 'pending']);
      const sent = new URL(requests[0] as string).searchParams.get('wait_ms');
      if (wire === null) expect([waitMs, sent]).toEqual([waitMs, null]);
      else {
        // A wait of 1 ms may be spent before the request goes out (a CI run sent none): 0 left.
        const sentMs = sent === null ? 0 : Number(sent);
        expect([waitMs, sentMs <= wire && sentMs >= Math.max(0, wire - 100)]).toEqual([
          waitMs,
          true,
        ]);
      }
      // Served to the server's maximum (not the 300 s asked): a termination bound, not a speed.
      if (capped) expect([waitMs, elapsed >= 900 && elapsed < 30_000]).toEqual([waitMs, true]);
    }
    for (const waitMs of [Number.NaN, -1, -Number.MIN_VALUE, Number.NEGATIVE_INFINITY]) {
      requests.length = 0;
      const error = await c.result(task.task_id, { waitMs }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(TypeError);
      expect(requests).toEqual([]);
    }
  });

  it('a task that becomes terminal during the wait is answered promptly, at any moment of the wait', async () => {
    const c = clientOf();
    for (const delay of [0, 1, 5, 50, 400, 950]) {
      const task = await c.submit({ queue: 'q-term', program: 'p' });
      const started = Date.now();
      const waiting = c.result(task.task_id, { waitMs: 1_000 });
      await sleep(delay);
      await c.cancel(task.task_id);
      const r = await waiting;
      const elapsed = Date.now() - started;
      // Either the wait saw the cancel, or (at the very end of the wait) it answered pending;
      // a pending answer must then come at the wait's end, not early.
      if (r.outcome.state === 'pending') expect([delay, elapsed >= 900]).toEqual([delay, true]);
      else expect([delay, r.outcome.state]).toEqual([delay, 'cancelled']);
      // An early cancel is answered before the wait's end (900 ms of its 1 000 left to spare).
      if (delay <= 50) expect([delay, elapsed < 900]).toEqual([delay, true]);
    }
  });

  it('cancel in each state answers the state afterwards', async () => {
    const c = clientOf();
    const queue = 'q-cancel-states';
    const queued = await c.submit({ queue, program: 'hang', delay_ms: 60_000 });
    expect(await c.cancel(queued.task_id)).toBe('cancelled');
    expect(await c.cancel(queued.task_id)).toBe('cancelled');

    const w = new Worker({
      url: server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      queue,
      concurrency: 2,
      logger: silentLogger,
      renewIntervalMs: RENEW_MS,
      pollWaitMs: 300,
    });
    let started = 0;
    w.register('hang', async (_data, ctx) => {
      started += 1;
      await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
      await sleep(300);
      return 'late';
    });
    w.register('ok', () => 'done');
    w.register('bad', () => {
      throw new Error('x');
    });
    const running = w.run();
    try {
      const active = await c.submit({ queue, program: 'hang' });
      await until(() => started > 0, 10_000, 'handler started');
      expect((await c.status(active.task_id)).state).toBe('active');
      const during = await c.cancel(active.task_id);
      // The worker settles a cancelled run once its handler returns.
      expect(['active', 'cancelled']).toContain(during);
      const end = await c.result(active.task_id, { waitMs: 1_000 });
      let final = end;
      while (final.outcome.state === 'pending')
        final = await c.result(active.task_id, { waitMs: 1_000 });
      expect(final.outcome.state).toBe('cancelled');
      expect(await c.cancel(active.task_id)).toBe('cancelled');

      const ok = await c.submit({ queue, program: 'ok' });
      let r = await c.result(ok.task_id, { waitMs: 1_000 });
      while (r.outcome.state === 'pending') r = await c.result(ok.task_id, { waitMs: 1_000 });
      expect(await c.cancel(ok.task_id)).toBe('succeeded');

      const bad = await c.submit({
        queue,
        program: 'bad',
        retry: { max_attempts: 1, delay_ms: 0 },
      });
      r = await c.result(bad.task_id, { waitMs: 1_000 });
      while (r.outcome.state === 'pending') r = await c.result(bad.task_id, { waitMs: 1_000 });
      expect(await c.cancel(bad.task_id)).toBe('failed');
    } finally {
      await w.stop({ graceMs: 0 });
      await running;
    }
    const missing = await c.cancel('tsk_missing').catch((e: unknown) => e);
    expect(missing).toMatchObject({ code: 'not_found', status: 404, retryable: false });
  });
});

describe('error objects', () => {
  it('carry code, message, retryable, status and cause for each failure kind', async () => {
    const c = clientOf({ retries: 0 });
    const notFound = (await c.status('tsk_nope').catch((e: unknown) => e)) as ProblemError;
    expect(notFound).toBeInstanceOf(ProblemError);
    expect(notFound.toJSON()).toMatchObject({ code: 'not_found', status: 404, retryable: false });
    expect(notFound.message.length).toBeGreaterThan(0);
    expect(notFound.problem.status).toBe(404);
    expect(typeof notFound.requestId).toBe('string');

    const invalid = (await c
      .list({ limit: 501 })
      .next()
      .catch((e: unknown) => e)) as ProblemError;
    expect(invalid).toMatchObject({ code: 'invalid_input', status: 400, retryable: false });
    expect(invalid.path).toBeDefined();

    const badHistory = (await c
      .history('tsk_nope', { afterSequence: -1 })
      .next()
      .catch((e: unknown) => e)) as ProblemError;
    expect(badHistory).toMatchObject({ code: 'invalid_input', status: 400 });

    const refused = new Client({
      url: 'http://127.0.0.1:9',
      tenant: TENANT,
      namespace: NAMESPACE,
      retries: 0,
      logger: silentLogger,
    });
    const network = (await refused.status('tsk_x').catch((e: unknown) => e)) as TransportError;
    expect(network).toBeInstanceOf(TransportError);
    expect(network).toMatchObject({
      code: 'transport_error',
      reason: 'network',
      retryable: true,
      status: undefined,
    });
    expect(network.cause).toBeInstanceOf(Error);

    const proxy = await startHttpProxy(server.url, { refuse: () => true });
    try {
      const busy = clientOf({ url: proxy.url, retries: 1 });
      const unavailable = (await busy.status('tsk_x').catch((e: unknown) => e)) as ProblemError;
      expect(unavailable).toBeInstanceOf(ProblemError);
      expect(unavailable).toMatchObject({ code: 'unavailable', status: 503, retryable: true });
    } finally {
      await proxy.close();
    }

    const hold = await startHttpProxy(server.url, { hold: () => new Promise(() => {}) });
    try {
      const slow = clientOf({ url: hold.url, retries: 0, requestTimeoutMs: 200 });
      const timeout = (await slow.status('tsk_x').catch((e: unknown) => e)) as TransportError;
      expect(timeout).toMatchObject({
        code: 'transport_error',
        reason: 'timeout',
        retryable: true,
      });
    } finally {
      await hold.close();
    }
  });
});

describe('read routes: query edges never 5xx', () => {
  it('list, history, result and attempt answer 200 or 4xx for edge values', async () => {
    const c = clientOf();
    const a = await c.submit({ queue: 'q-edge', program: 'p', labels: { k: 'v' } });
    const b = await c.submit({ queue: 'q-edge', program: 'p' });
    const base = `${server.url}/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;
    const labels17 = Array.from({ length: 17 }, (_, i) => `label.k${i}=v`).join('&');
    const paths = [
      `/tasks?submitted_from=9007199254740991`,
      `/tasks?submitted_from=9007199254740992`,
      `/tasks?submitted_until=0`,
      `/tasks?submitted_from=5&submitted_until=1`,
      `/tasks?submitted_from=-1`,
      `/tasks?submitted_from=1e3`,
      `/tasks?${labels17}`,
      `/tasks?label.k=${'v'.repeat(256)}`,
      `/tasks?label.${'k'.repeat(65)}=v`,
      `/tasks?state=bogus`,
      `/tasks?queue=${'q'.repeat(129)}`,
      `/tasks?limit=0`,
      `/tasks?limit=00001`,
      `/tasks?limit=99999999999999999999`,
      `/tasks?cursor=`,
      `/tasks?workflow_id=%20x`,
      `/tasks?program=%E2%80%8B`,
      `/tasks/${a.task_id}/history?after_sequence=9007199254740991`,
      `/tasks/${a.task_id}/history?after_sequence=9007199254740992`,
      `/tasks/${a.task_id}/history?after_sequence=2147483648`,
      `/tasks/${a.task_id}/result?wait_ms=99999999999999999999999`,
      `/tasks/${a.task_id}/result?wait_ms=-1`,
      `/tasks/${a.task_id}/attempts/${'x'.repeat(129)}`,
      `/tasks/${a.task_id}/attempts/att_x`,
      `/tasks/${b.task_id}/attempts/att_x`,
      `/tasks/${'t'.repeat(300)}`,
      `/tasks/%00`,
      `/tasks/%FF/result`,
    ];
    const seen: [string, number, string | undefined][] = [];
    for (const path of paths) {
      const res = await fetch(`${base}${path}`);
      const body = (await res.json()) as { code?: string };
      seen.push([path.slice(0, 60), res.status, body.code]);
    }
    for (const [path, status] of seen) expect([path, status < 500]).toEqual([path, true]);
  });
});
