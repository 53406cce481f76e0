/**
 * `/openapi.json` against replies of the real server (`startServer`, real sockets,
 * real PostgreSQL) in states the lifecycle conformance suite (openapi-conformance.int.test.ts)
 * does not reach: lease expiry (lost attempts, `lease_expired` failures), cancel of an active
 * task, non-retryable application errors and execution failures, unconfirmed quiescence,
 * failed and exhausted completion deliveries, trace state in the CloudEvent. Every reply is
 * validated with Ajv (draft 2020-12) against the schema the document gives for its status.
 */
import { createServer as createHttpServer, type Server } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { ProblemSchema, parseWith } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { Ajv2020 } from 'ajv/dist/2020.js';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

// biome-ignore lint/suspicious/noExplicitAny: replies and the document are read loosely
type Loose = any;

const KEY = 'states-acme-all-key-000000001';
const SOLE = 'states-acme-sole-key-00000001';
const KEY_CONFIG = [
  { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
  { key: SOLE, tenant: 'acme', namespaces: ['states'], roles: ['worker'] },
];
const scope = { tenant_id: 'acme', namespace: 'states' };
const SCOPE = '/v1/tenants/{tenant_id}/namespaces/{namespace}';
const scopePath = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}`;
const TASK = `${SCOPE}/tasks/{task_id}`;

interface Reply {
  status: number;
  contentType: string | null;
  text: string;
  body: Loose;
}

const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

const token = (text: string) => text.replace(/~/g, '~0').replace(/\//g, '~1');

let server: RunningServer;
let doc: Loose;
let ajv: Ajv2020;
const found: string[] = [];

function mismatches(method: string, template: string, reply: Reply): string[] {
  const label = `${method.toUpperCase()} ${template} → ${reply.status}`;
  const operation = doc.paths?.[template]?.[method];
  if (operation === undefined) return [`${label}: operation not documented`];
  const response = operation.responses?.[String(reply.status)];
  if (response === undefined) {
    return [`${label}: status not documented (${Object.keys(operation.responses)}): ${reply.text}`];
  }
  const content = response.content as Record<string, unknown> | undefined;
  if (content === undefined) return reply.text.length === 0 ? [] : [`${label}: undocumented body`];
  const mediaType = (reply.contentType ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  if (!(mediaType in content)) return [`${label}: Content-Type ${reply.contentType} undocumented`];
  const ref = `openapi.json#/paths/${token(template)}/${method}/responses/${reply.status}/content/${token(mediaType)}/schema`;
  const validate = ajv.getSchema(ref) ?? ajv.compile({ $ref: ref });
  if (validate(reply.body)) return [];
  return [`${label}: body ${reply.text.slice(0, 600)} fails: ${ajv.errorsText(validate.errors)}`];
}

async function send(
  method: string,
  path: string,
  json?: unknown,
  key: string | null = KEY,
): Promise<Reply> {
  const headers: Record<string, string> = {};
  if (key !== null) headers.authorization = `Bearer ${key}`;
  let body: string | undefined;
  if (json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const res = await fetch(`${server.url}${path}`, { method: method.toUpperCase(), headers, body });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text.length === 0 ? undefined : JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, contentType: res.headers.get('content-type'), text, body: parsed };
}

/** Sends a request and records what the document gets wrong about its reply. */
async function probe(
  method: string,
  template: string,
  path: string,
  json?: unknown,
  key: string | null = KEY,
): Promise<Reply> {
  const reply = await send(method, path, json, key);
  found.push(...mismatches(method, template, reply));
  return reply;
}

let counter = 0;
function submit(extra: Record<string, unknown> = {}, trace?: unknown) {
  counter += 1;
  return {
    idempotency_key: `states-${counter}`,
    input: { ...scope, queue: 'q', program: { name: 'p' }, data: { n: counter }, ...extra },
    ...(trace === undefined ? {} : { origin_trace: trace }),
  };
}

function completed(owner: Loose, op: string, outcome: unknown, quiescence = 'confirmed') {
  return {
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome,
        started_at: 1,
        finished_at: 2,
      },
    },
    quiescence,
    processing_trace: { traceparent: `00-${'c'.repeat(32)}-${'d'.repeat(16)}-01` },
  };
}

function failed(owner: Loose, op: string, kind: string, retryable: boolean) {
  return {
    owner,
    operation_id: op,
    report: { kind: 'failed', report: { kind, message: 'boom', retryable } },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

/** Submits one task to `queue`, opens a session, acquires it and gets dispatch. */
async function running(queue: string, extra: Record<string, unknown> = {}, trace?: unknown) {
  const created = await probe('post', `${SCOPE}/tasks`, `${scopePath}/tasks`, {
    ...submit({ queue, ...extra }, trace),
  });
  expect(created.status).toBe(201);
  const session = await probe('post', '/v1/worker/sessions', '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 1,
  });
  const acquired = await probe('post', '/v1/worker/acquire', '/v1/worker/acquire', {
    scope,
    queue,
    worker_session_id: session.body.id,
    consumer_id: 0,
    sequence: 1,
  });
  expect(acquired.body.disposition).toBe('assigned');
  const owner = acquired.body.assignment.lease.owner;
  const renewed = await probe('post', '/v1/worker/renew', '/v1/worker/renew', {
    owner,
    sequence: 1,
    intent: 'dispatch',
  });
  expect(renewed.body.dispatch_allowed).toBe(true);
  return { owner, session: session.body, taskPath: `${scopePath}/tasks/${owner.task_id}` };
}

/** Every read of a task, probed. */
async function readAll(taskPath: string, attemptId: string) {
  await probe('get', TASK, taskPath);
  await probe('get', `${TASK}/result`, `${taskPath}/result`);
  await probe('get', `${TASK}/snapshot`, `${taskPath}/snapshot`);
  await probe('get', `${TASK}/history`, `${taskPath}/history`);
  await probe('get', `${TASK}/attempts/{attempt_id}`, `${taskPath}/attempts/${attemptId}`);
}

beforeAll(async () => {
  const db: TestDatabase = await createTestDatabase({ prefix: 'openapi_states' });
  cleanups.push(() => db.drop());
  // A destination that answers 500 and one that is not listening.
  const failing: Server = createHttpServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(500, { 'content-type': 'text/plain' }).end('nope'));
  });
  await new Promise<void>((resolve) => failing.listen(0, '127.0.0.1', resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        failing.closeAllConnections();
        failing.close(() => resolve());
      }),
  );
  const closed = createHttpServer();
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
  const closedPort = (closed.address() as AddressInfo).port;
  await new Promise<void>((resolve) => closed.close(() => resolve()));
  const secret = `whsec_${Buffer.alloc(24, 7).toString('base64')}`;
  const config = loadConfig(
    {
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_API_KEYS: JSON.stringify(KEY_CONFIG),
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        failing: { url: `http://127.0.0.1:${(failing.address() as AddressInfo).port}/h`, secret },
        closed: { url: `http://127.0.0.1:${closedPort}/h`, secret },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
      LEDGENCE_LEASE_DURATION_MS: '600',
      LEDGENCE_CLEANUP_GRACE_MS: '0',
      LEDGENCE_LEASE_SAFETY_MARGIN_MS: '2000',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '50',
      LEDGENCE_LONG_POLL_WAIT_MS: '1000',
    },
    (path) => {
      throw new Error(`no file ${path}`);
    },
  );
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
  cleanups.push(() => server.stop());
  const res = await fetch(`${server.url}/openapi.json`);
  doc = await res.json();
  ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
  ajv.addSchema({ ...doc, $id: 'openapi.json' });
}, 60_000);

describe('the OpenAPI document against replies in states the lifecycle suite does not reach', () => {
  it('documents the replies of a lease that expired (lost attempt, lease_expired failure)', async () => {
    found.length = 0;
    const { owner, taskPath, session } = await running('expiry', {
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    await vi.waitFor(
      async () => {
        const status = await send('get', taskPath);
        expect(status.body.state).toBe('failed');
      },
      { timeout: 10_000, interval: 50 },
    );
    await readAll(taskPath, owner.attempt_id);
    const result = await send('get', `${taskPath}/result`);
    expect(result.body.outcome.failure.kind).toBe('lease_expired');
    await probe('post', '/v1/worker/renew', '/v1/worker/renew', {
      owner,
      sequence: 2,
      intent: 'keep_alive',
    });
    await probe(
      'post',
      '/v1/worker/settle',
      '/v1/worker/settle',
      completed(owner, 'x', {
        kind: 'success',
        output: 1,
      }),
    );
    await probe('post', '/v1/worker/quiescence', '/v1/worker/quiescence', owner);
    // A replayed poll of the lost assignment: ownership_lost.
    await probe('post', '/v1/worker/acquire', '/v1/worker/acquire', {
      scope,
      queue: 'expiry',
      worker_session_id: session.id,
      consumer_id: 0,
      sequence: 1,
    });
    await probe('post', '/v1/worker/acquire', '/v1/worker/acquire?wait_ms=10', {
      scope,
      queue: 'expiry',
      worker_session_id: session.id,
      consumer_id: 0,
      sequence: 2,
    });
    expect(found).toEqual([]);
  }, 30_000);

  it('documents the replies of cancelling an active task and of its cancelled settlement', async () => {
    found.length = 0;
    const { owner, taskPath } = await running(
      'cancel',
      { labels: { team: 'x' }, priority: -5, concurrency_key: 'k', concurrency_limit: 1 },
      { traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`, tracestate: 'v=1' },
    );
    const cancel = await probe('post', `${TASK}/cancel`, `${taskPath}/cancel`);
    expect(cancel.body.task_state).toBe('active');
    await readAll(taskPath, owner.attempt_id);
    const renewed = await probe('post', '/v1/worker/renew', '/v1/worker/renew', {
      owner,
      sequence: 2,
      intent: 'keep_alive',
    });
    expect(renewed.body.cancel_requested).toBe(true);
    await probe(
      'post',
      '/v1/worker/settle',
      '/v1/worker/settle',
      failed(owner, 'c-1', 'cancelled', false),
    );
    await probe('post', `${TASK}/cancel`, `${taskPath}/cancel`, {});
    await readAll(taskPath, owner.attempt_id);
    expect((await send('get', taskPath)).body.state).toBe('cancelled');
    expect(found).toEqual([]);
  }, 30_000);

  it('documents the replies of failures: application error, execution failure with retry, unconfirmed quiescence', async () => {
    found.length = 0;
    const app = await running('app-error');
    await probe(
      'post',
      '/v1/worker/settle',
      '/v1/worker/settle',
      completed(
        app.owner,
        'a-1',
        {
          kind: 'application_error',
          error: { code: 'E_BAD', message: 'bad', details: { why: [1, 'x'] }, retryable: false },
        },
        'unconfirmed',
      ),
    );
    await readAll(app.taskPath, app.owner.attempt_id);
    await probe('post', '/v1/worker/quiescence', '/v1/worker/quiescence', app.owner);
    await probe('post', '/v1/worker/quiescence', '/v1/worker/quiescence', app.owner);
    await readAll(app.taskPath, app.owner.attempt_id);
    expect((await send('get', `${app.taskPath}/result`)).body.outcome.failure.kind).toBe(
      'application',
    );

    const crash = await running('crash', { retry: { max_attempts: 2, delay_ms: 60_000 } });
    await probe(
      'post',
      '/v1/worker/settle',
      '/v1/worker/settle',
      failed(crash.owner, 'x-1', 'crashed', true),
    );
    await readAll(crash.taskPath, crash.owner.attempt_id);
    expect((await send('get', crash.taskPath)).body.state).toBe('queued');
    const exec = await running('exec', { retry: { max_attempts: 1, delay_ms: 0 } });
    await probe('post', '/v1/worker/settle:batch', '/v1/worker/settle:batch', {
      commands: [failed(exec.owner, 'e-1', 'internal', true)],
    });
    await readAll(exec.taskPath, exec.owner.attempt_id);
    expect((await send('get', `${exec.taskPath}/result`)).body.outcome.failure.kind).toBe(
      'execution',
    );
    // The session extended by a key bound to one namespace, with no body.
    await probe(
      'post',
      '/v1/worker/sessions/{session_id}/extend',
      `/v1/worker/sessions/${exec.session.id}/extend`,
      undefined,
      SOLE,
    );
    expect(found).toEqual([]);
  }, 30_000);

  it('documents the subscriptions of failed and refused completion deliveries', async () => {
    found.length = 0;
    const done = await running('deliveries');
    await send(
      'post',
      '/v1/worker/settle',
      completed(done.owner, 'd-1', { kind: 'success', output: null }),
    );
    const subsT = `${TASK}/completion-subscriptions`;
    const subs = `${done.taskPath}/completion-subscriptions`;
    await probe('post', subsT, subs, { subscription_key: 'f', destination: 'failing' });
    await probe('post', subsT, subs, { subscription_key: 'c', destination: 'closed' });
    await vi.waitFor(
      async () => {
        const list = await send('get', subs);
        expect(list.body.map((s: Loose) => s.attempts > 0)).toEqual([true, true]);
      },
      { timeout: 10_000, interval: 50 },
    );
    await probe('get', subsT, subs);
    // Let them run out of attempts (base delay 1 ms), then read and redeliver.
    await vi.waitFor(
      async () => {
        const list = await send('get', subs);
        expect(list.body.map((s: Loose) => s.state)).toEqual(['exhausted', 'exhausted']);
      },
      { timeout: 20_000, interval: 100 },
    );
    const list = await probe('get', subsT, subs);
    const redeliverT = `${SCOPE}/completion-subscriptions/{subscription_id}/redeliver`;
    for (const sub of list.body as Loose[]) {
      const path = `${scopePath}/completion-subscriptions/${sub.id}/redeliver`;
      const next = await probe('post', redeliverT, path, { generation: 1 });
      expect([next.status, next.body.generation, next.body.event_id]).toEqual([
        200,
        2,
        sub.event_id,
      ]);
      // The previous generation again: the subscription, no new generation.
      const again = await probe('post', redeliverT, path, { generation: 1 });
      expect([again.status, again.body.generation]).toEqual([200, 2]);
      const ahead = await probe('post', redeliverT, path, { generation: 3 });
      expect([ahead.status, ahead.body.code]).toEqual([409, 'conflict']);
    }
    expect(found).toEqual([]);
  }, 40_000);
});

describe('the prose promises of the document against the server', () => {
  const tasksT = `${SCOPE}/tasks`;
  const tasks = `${scopePath}/tasks`;

  it('submitTask: an Idempotency-Key of 256 bytes is 400, one that is not UTF-8 is 400 invalid_text', async () => {
    const header = async (value: string) => {
      const res = await fetch(`${server.url}${tasks}`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${KEY}`,
          'content-type': 'application/json',
          'idempotency-key': value,
        },
        body: JSON.stringify({ input: submit().input }),
      });
      return { status: res.status, body: (await res.json()) as Loose };
    };
    expect((await header('k'.repeat(255))).status).toBe(201);
    expect((await header('k'.repeat(256))).status).toBe(400);
    const latin1 = await header('caf\xe9');
    expect([latin1.status, latin1.body.reason]).toEqual([400, 'invalid_text']);
  });

  it('submitTask: data over SUBMISSION_DATA_MAX_BYTES is 413 too_large, an oversized status 413 status_too_large', async () => {
    found.length = 0;
    const big = await probe('post', tasksT, tasks, submit({ data: 'x'.repeat(1024 * 1024 + 16) }));
    expect([big.status, big.body.reason]).toEqual([413, 'too_large']);
    const labels: Record<string, string> = {};
    for (let i = 0; i < 16; i += 1) labels[`k${i}${'"'.repeat(60)}`] = '"'.repeat(255);
    const wide = await probe('post', tasksT, tasks, submit({ labels }));
    expect([wide.status, wide.body.reason]).toEqual([413, 'status_too_large']);
    expect(found).toEqual([]);
  });

  it('submitTask: a timeout_ms within the lease safety margin + 500 ms is 400 at $.input.timeout_ms', async () => {
    found.length = 0;
    const short = await probe('post', tasksT, tasks, submit({ timeout_ms: 2_400 }));
    expect([short.status, short.body.code, short.body.path]).toEqual([
      400,
      'invalid_input',
      '$.input.timeout_ms',
    ]);
    expect((await probe('post', tasksT, tasks, submit({ timeout_ms: 2_501 }))).status).toBe(201);
    expect(found).toEqual([]);
  });

  it('cancelTask: a body other than {} is 400', async () => {
    found.length = 0;
    const created = await probe('post', tasksT, tasks, submit({ queue: 'cancel-body' }));
    const cancel = `${tasks}/${created.body.task_id}/cancel`;
    for (const body of [[], { a: 1 }, 'x', null]) {
      const reply = await probe('post', `${TASK}/cancel`, cancel, body);
      expect(reply.status, JSON.stringify(body)).toBe(400);
    }
    expect(found).toEqual([]);
  });

  it('previewRetention: limit is 1..1000 as documented', async () => {
    found.length = 0;
    const preview = `${scopePath}/retention-policy/preview`;
    const T = `${SCOPE}/retention-policy/preview`;
    expect((await probe('get', T, `${preview}?limit=1000`)).status).toBe(200);
    expect((await probe('get', T, `${preview}?limit=1001`)).status).toBe(400);
    expect((await probe('get', T, `${preview}?limit=1`)).status).toBe(200);
    expect(found).toEqual([]);
  });
});

describe('limits and statuses the document does not state', () => {
  it('states the text length rules the server enforces (DESIGN §3: 1..N bytes; Scope ≤ 128)', async () => {
    const command = (queue: string, tenant = 'acme') => ({
      scope: { tenant_id: tenant, namespace: 'states' },
      queue,
      concurrency: 1,
    });
    const T = '/v1/worker/sessions';
    const schema = `openapi.json#/paths/${token(T)}/post/requestBody/content/application~1json/schema`;
    const documentAccepts = ajv.compile({ $ref: schema });
    const refusedButDocumented: string[] = [];
    for (const [name, body] of [
      ['an empty queue', command('')],
      ['a queue of 129 ASCII characters (NAME_MAX_BYTES 128)', command('q'.repeat(129))],
      [
        'a tenant_id of 129 ASCII characters (SCOPE_TEXT_MAX_BYTES 128)',
        command('q', 't'.repeat(129)),
      ],
    ] as const) {
      const reply = await send('post', T, body);
      expect(reply.status, name).toBe(400);
      if (documentAccepts(body))
        refusedButDocumented.push(`${name}: server 400 ${reply.body.detail}`);
    }
    expect(refusedButDocumented).toEqual([]);
  });

  it('an Expect other than 100-continue on POST {scope}/tasks is answered with a documented status and a contract problem', async () => {
    const url = new URL(server.url);
    const body = JSON.stringify(submit());
    const request =
      `POST ${scopePath}/tasks HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: Bearer ${KEY}\r\n` +
      `Content-Type: application/json\r\nExpect: x-unknown\r\nContent-Length: ${body.length}\r\n` +
      `Connection: close\r\n\r\n${body}`;
    const text = await new Promise<string>((resolve, reject) => {
      const socket = connect(Number(url.port), url.hostname, () => socket.end(request));
      const chunks: Buffer[] = [];
      socket.on('data', (chunk: Buffer) => chunks.push(chunk));
      socket.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
      socket.on('error', reject);
    });
    const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
    const problem = JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4));
    const documented = Object.keys(doc.paths[`${SCOPE}/tasks`].post.responses);
    const wrong: string[] = [];
    if (!documented.includes(String(status))) {
      wrong.push(
        `${status} is not documented (only ${documented}); reply ${JSON.stringify(problem)}`,
      );
    }
    try {
      parseWith(ProblemSchema, problem);
    } catch (error) {
      wrong.push(`the reply is not a contracts Problem: ${(error as Error).message}`);
    }
    expect(wrong).toEqual([]);
  });
});
