/**
 * A real server process whose PostgreSQL goes away (a TCP proxy that resets every
 * connection and refuses new ones) and comes back, mid-run. DESIGN §1.1 (a backend error is a 503),
 * §6 (no 5xx by content alone; problem+json with a `code`), §11; README "PostgreSQL goes away".
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { AcquireReply } from '@ledgence/contracts';
import { type PgProxy, startPgProxy } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  historyOf,
  perAttempt,
  Stack,
  shortWorker,
  sleep,
  until,
  watchUnhandledRejections,
} from './test/harness.js';
import {
  call,
  claimNext,
  openSession,
  pollBody,
  SCOPE,
  settleBody,
  submitTask,
  TASKS_BASE,
  taskBody,
} from './test/wire.js';

const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
const stack = new Stack('db_outage_recovery');
let proxy: PgProxy;
let server: ServerProcess;
let receiver: Server;
const received: string[] = [];

beforeAll(async () => {
  receiver = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => {
      body += c;
    });
    req.on('end', () => {
      received.push(body);
      res.writeHead(200).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const { port } = receiver.address() as AddressInfo;
  await stack.open();
  proxy = await startPgProxy(stack.databaseUrl);
  server = await stack.start({
    DATABASE_URL: proxy.url,
    LEDGENCE_LONG_POLL_WAIT_MS: '10000',
    LEDGENCE_MAINTENANCE_INTERVAL_MS: '200',
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, timeout_ms: 2_000 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  });
}, 120_000);

afterAll(async () => {
  await stack.close();
  await proxy?.close();
  await new Promise<void>((resolve) => receiver.close(() => resolve()));
});

async function ready(): Promise<void> {
  await until(
    async () => (await call(server.url, '/readyz').catch(() => ({ status: 0 }))).status === 200,
    60_000,
    'ready again',
  );
}

interface Answer {
  route: string;
  status: number;
  type: string | null;
  code: unknown;
  ms: number;
  items?: { status: unknown; code: unknown }[];
}

async function answer(
  route: string,
  path: string,
  init: { method?: string; body?: unknown } = {},
): Promise<Answer> {
  const started = performance.now();
  const response = await fetch(`${server.url}${path}`, {
    method: init.method ?? (init.body === undefined ? 'GET' : 'POST'),
    headers: init.body === undefined ? {} : { 'content-type': 'application/json' },
    body: init.body === undefined ? undefined : JSON.stringify(init.body),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await response.text();
  let code: unknown;
  let items: { status: unknown; code: unknown }[] | undefined;
  try {
    const parsed = JSON.parse(text) as {
      code?: unknown;
      results?: { status?: unknown; code?: unknown }[];
      replies?: { status?: unknown; code?: unknown }[];
    };
    code = parsed.code;
    items = (parsed.results ?? parsed.replies)?.map((i) => ({ status: i.status, code: i.code }));
  } catch {
    code = undefined;
  }
  return {
    route,
    status: response.status,
    type: response.headers.get('content-type'),
    code,
    items,
    ms: Math.round(performance.now() - started),
  };
}

describe('every route while PostgreSQL is down', () => {
  it('answers each store-backed route 503 problem+json `unavailable` promptly, health routes as README says', async () => {
    await ready();
    const taskId = await submitTask(server.url, taskBody('routes-t', 'routes'));
    const sessionId = await openSession(server.url, 'routes-claim');
    await submitTask(server.url, taskBody('routes-c', 'routes-claim'));
    const assignment = await claimNext(server.url, 'routes-claim');
    const owner = assignment.lease.owner;
    const sub = await call<{ id: string }>(
      server.url,
      `${TASKS_BASE}/tasks/${taskId}/completion-subscriptions`,
      { subscription_key: 'routes-sub', destination: 'billing' },
    );
    expect(sub.status).toBe(201);

    proxy.refuse(true);
    try {
      const answers = await Promise.all([
        answer('submit', `${TASKS_BASE}/tasks`, { body: taskBody('routes-new', 'routes') }),
        answer('submit batch', `${TASKS_BASE}/tasks:batch`, {
          body: { commands: [taskBody('routes-b1', 'routes')] },
        }),
        answer('list', `${TASKS_BASE}/tasks?queue=routes`),
        answer('status', `${TASKS_BASE}/tasks/${taskId}`),
        answer('result', `${TASKS_BASE}/tasks/${taskId}/result`),
        answer('snapshot', `${TASKS_BASE}/tasks/${taskId}/snapshot`),
        answer('attempt', `${TASKS_BASE}/tasks/${owner.task_id}/attempts/${owner.attempt_id}`),
        answer('history', `${TASKS_BASE}/tasks/${taskId}/history`),
        answer('cancel', `${TASKS_BASE}/tasks/${taskId}/cancel`, { body: {} }),
        answer('subscribe', `${TASKS_BASE}/tasks/${taskId}/completion-subscriptions`, {
          body: { subscription_key: 'routes-sub-2', destination: 'billing' },
        }),
        answer('subscriptions', `${TASKS_BASE}/tasks/${taskId}/completion-subscriptions`),
        answer('redeliver', `${TASKS_BASE}/completion-subscriptions/${sub.body.id}/redeliver`, {
          body: { generation: 1 },
        }),
        answer('retention get', `${TASKS_BASE}/retention-policy`),
        answer('retention preview', `${TASKS_BASE}/retention-policy/preview`),
        answer('open session', '/v1/worker/sessions', {
          body: { scope: SCOPE, queue: 'routes', concurrency: 1 },
        }),
        answer('extend session', `/v1/worker/sessions/${sessionId}/extend`, {
          body: { scope: SCOPE },
        }),
        answer('acquire', '/v1/worker/acquire', {
          body: pollBody(sessionId, 'routes-claim', 0, 1),
        }),
        answer('acquire batch', '/v1/worker/acquire:batch', {
          body: { commands: [pollBody(sessionId, 'routes-claim', 0, 1)] },
        }),
        answer('renew', '/v1/worker/renew', { body: { owner, sequence: 2, intent: 'keep_alive' } }),
        answer('renew batch', '/v1/worker/renew:batch', {
          body: { commands: [{ owner, sequence: 2, intent: 'keep_alive' }] },
        }),
        answer('settle', '/v1/worker/settle', {
          body: settleBody(assignment, { kind: 'success', output: null }),
        }),
        answer('settle batch', '/v1/worker/settle:batch', {
          body: { commands: [settleBody(assignment, { kind: 'success', output: null })] },
        }),
        answer('quiescence', '/v1/worker/quiescence', { body: owner }),
        answer('readyz', '/readyz'),
        answer('healthz', '/healthz'),
        answer('openapi', '/openapi.json'),
      ]);
      const summary = Object.fromEntries(
        answers.map((a) => [a.route, `${a.status} ${a.code ?? ''}`.trim()]),
      );
      const expected = Object.fromEntries(
        answers.map((a) => [
          a.route,
          a.route === 'healthz' || a.route === 'openapi' || a.route.endsWith(' batch')
            ? '200'
            : '503 unavailable',
        ]),
      );
      expect(summary).toEqual(expected);
      // Batch routes answer each item on its own (DESIGN §6): every item a 503 `unavailable`.
      for (const a of answers.filter((x) => x.route.endsWith(' batch'))) {
        expect(a.items, a.route).toEqual([{ status: 503, code: 'unavailable' }]);
      }
      for (const a of answers) {
        if (a.status === 503 && a.route !== 'readyz') {
          expect(a.type, a.route).toMatch(/^application\/problem\+json/);
        }
        // README: at once, or after at most 5 s waiting for a connection.
        expect(a.ms, a.route).toBeLessThan(7_000);
      }
    } finally {
      proxy.refuse(false);
    }
    await ready();
  }, 120_000);
});

describe('after PostgreSQL comes back', () => {
  it('recovers an expired lease and sends a due completion callback without a restart', async () => {
    await ready();
    // A claimed task whose worker never comes back: its 1 s lease runs out during the outage.
    const lostId = await submitTask(server.url, taskBody('lost-lease', 'lost'));
    const held = await claimNext(server.url, 'lost');
    expect(held.lease.owner.task_id).toBe(lostId);
    proxy.refuse(true);
    await sleep(3_000);
    proxy.refuse(false);
    await ready();
    // Recovery resumes: the lost attempt is ended (lease_expired) and the task re-queued.
    await until(
      async () => {
        const events = await historyOf(client(server.url), lostId);
        return events.some((e) => e.event.reason === 'lease_expired');
      },
      15_000,
      'lease recovery after the outage',
    );
    // The callback sender resumes: a task completed now gets its callback.
    const cbId = await submitTask(server.url, taskBody('cb-after', 'cb'));
    const sub = await call(server.url, `${TASKS_BASE}/tasks/${cbId}/completion-subscriptions`, {
      subscription_key: 'cb-after',
      destination: 'billing',
    });
    expect(sub.status).toBe(201);
    const assignment = await claimNext(server.url, 'cb');
    const settled = await call(
      server.url,
      '/v1/worker/settle',
      settleBody(assignment, { kind: 'success', output: null }),
    );
    expect(settled.status).toBe(200);
    await until(() => received.some((b) => b.includes(cbId)), 15_000, 'the callback');
  }, 120_000);
});

describe('parked waits when PostgreSQL goes away', () => {
  it('a parked poll, a parked batch poll and a parked result wait end promptly as `unavailable` and consume nothing', async () => {
    await ready();
    const queue = 'parked-outage';
    const single = await openSession(server.url, queue);
    const batch = await openSession(server.url, queue);
    const pendingId = await submitTask(server.url, taskBody('parked-pending', 'elsewhere'));
    const waits = [
      answer('acquire', '/v1/worker/acquire?wait_ms=10000', {
        body: pollBody(single, queue, 0, 1),
      }),
      answer('acquire batch', '/v1/worker/acquire:batch?wait_ms=10000', {
        body: { commands: [pollBody(batch, queue, 0, 1)] },
      }),
      answer('result', `${TASKS_BASE}/tasks/${pendingId}/result?wait_ms=10000`),
    ];
    await sleep(500);
    proxy.refuse(true);
    let answers: Answer[];
    try {
      answers = await Promise.all(waits);
    } finally {
      proxy.refuse(false);
    }
    await ready();
    // Nothing consumed: the same sequence is still a new poll and claims what is there now.
    const taskId = await submitTask(server.url, taskBody('parked-after', queue));
    const again = await call<AcquireReply>(
      server.url,
      '/v1/worker/acquire',
      pollBody(single, queue, 0, 1),
    );
    expect(again.status).toBe(200);
    expect(again.body.disposition).toBe('assigned');
    const againBatch = await call<{ replies: AcquireReply[] }>(
      server.url,
      '/v1/worker/acquire:batch',
      { commands: [pollBody(batch, queue, 0, 1)] },
    );
    expect(againBatch.status).toBe(200);
    expect(againBatch.body.replies[0]?.disposition).toBe('empty'); // the one task went to `single`
    expect(taskId).toBeDefined();
    expect(answers.map((a) => `${a.route} ${a.status} ${a.code ?? ''}`.trim())).toEqual([
      'acquire 503 unavailable',
      'acquire batch 200',
      'result 503 unavailable',
    ]);
    expect(answers[1]?.items).toEqual([{ status: 503, code: 'unavailable' }]);
    // Ended by the failed rescan, not held to the 10 s wait.
    for (const a of answers) expect(a.ms, a.route).toBeLessThan(8_000);
  }, 120_000);
});

describe('an SDK worker through the outage', () => {
  it('settles each held task exactly once per attempt after the database is back; run() resolves', async () => {
    await ready();
    const unhandled = watchUnhandledRejections();
    const queue = 'sdk-outage';
    const c = client(server.url);
    const started: string[] = [];
    const worker = shortWorker(server.url, queue, { concurrency: 3 });
    worker.register('slow', async (data: unknown) => {
      started.push(String((data as { n: number }).n));
      await sleep(1_500);
      return data;
    });
    const ids: string[] = [];
    for (let n = 0; n < 3; n += 1) {
      ids.push((await c.submit({ queue, program: 'slow', data: { n } })).task_id);
    }
    const running = worker.run();
    let runError: unknown;
    running.catch((e: unknown) => {
      runError = e;
    });
    await until(() => started.length === 3, 20_000, 'three handlers running');
    proxy.refuse(true);
    await sleep(3_000);
    proxy.refuse(false);
    await ready();
    const end = Date.now() + 60_000;
    for (const id of ids) {
      for (;;) {
        const r = await c.result(id, { waitMs: 1_000 });
        if (r.outcome.state !== 'pending') break;
        if (Date.now() > end) throw new Error(`task ${id} not terminal`);
      }
    }
    await worker.stop({ graceMs: 1_000 });
    await running;
    expect(runError).toBeUndefined();
    for (const id of ids) {
      const events = await historyOf(c, id);
      for (const [, n] of perAttempt(events, 'report_accepted')) expect(n).toBe(1);
      const status = await call<{ state: string }>(server.url, `${TASKS_BASE}/tasks/${id}`);
      expect(status.body.state).toBe('succeeded');
    }
    unhandled.dispose();
    expect(unhandled.seen).toEqual([]);
  }, 120_000);
});
