/**
 * `/openapi.json` against what the real server does (DESIGN §6). The real server (`startServer`,
 * real sockets) over a real PostgreSQL is driven through every route's lifecycle and its error
 * cases, and every reply's status, content type and body is checked against the document that
 * server serves, with a real JSON Schema validator (Ajv, draft 2020-12). Users generate clients
 * from the document: a status, header or body it does not describe is one their client cannot
 * read, and a documented operation that is not routed is one their client cannot call.
 */
import { createServer as createHttpServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { Ajv2020 } from 'ajv/dist/2020.js';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

// biome-ignore lint/suspicious/noExplicitAny: replies and the document are read loosely
type Loose = any;

const KEYS = {
  all: 'oa-acme-all-key-0000000001',
  client: 'oa-acme-client-key-00000001',
  worker: 'oa-acme-worker-key-00000001',
  other: 'oa-acme-other-ns-key-000001',
} as const;
const KEY_CONFIG = [
  { key: KEYS.all, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
  { key: KEYS.client, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
  { key: KEYS.worker, tenant: 'acme', namespaces: ['*'], roles: ['worker'] },
  { key: KEYS.other, tenant: 'acme', namespaces: ['elsewhere'], roles: ['client', 'worker'] },
];

const scope = { tenant_id: 'acme', namespace: 'docs' };
const SCOPE = '/v1/tenants/{tenant_id}/namespaces/{namespace}';
const scopePath = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}`;
/** The detail of the app's own 404 for a method and path no route matches. */
const NO_ROUTE = 'no route matches this method and path';

/** One reply as received. */
interface Reply {
  status: number;
  contentType: string | null;
  text: string;
  body: Loose;
  headers: Headers;
}

/** A server of this file over a database of its own, stopped after the file. */
interface Started {
  server: RunningServer;
  /** The route pattern of every request the server logged, as its log line names it. */
  routes: Set<string>;
}

const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

async function start(env: Record<string, string>): Promise<Started> {
  const db: TestDatabase = await createTestDatabase({ prefix: 'openapi' });
  cleanups.push(() => db.drop());
  const routes = new Set<string>();
  const lines = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.length === 0) continue;
        const entry = JSON.parse(line) as { msg?: string; route?: string | null };
        if (entry.msg === 'request' && typeof entry.route === 'string') routes.add(entry.route);
      }
      done();
    },
  });
  const config = loadConfig({ ...env, DATABASE_URL: db.url, PORT: '0' }, (path) => {
    throw new Error(`no file ${path}`);
  });
  const server = await startServer(config, { logger: pino({ level: 'info' }, lines) });
  cleanups.push(() => server.stop());
  return { server, routes };
}

/** The document `server` serves, and a validator of values against its parts. */
async function documentOf(server: RunningServer): Promise<{ doc: Loose; ajv: Ajv2020 }> {
  const res = await fetch(`${server.url}/openapi.json`);
  expect(res.status).toBe(200);
  const doc = (await res.json()) as Loose;
  const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
  ajv.addSchema({ ...doc, $id: 'openapi.json' });
  return { doc, ajv };
}

/** JSON pointer escaping of one token. */
const token = (text: string) => text.replace(/~/g, '~0').replace(/\//g, '~1');

function validatorAt(ajv: Ajv2020, pointer: string) {
  const ref = `openapi.json#${pointer}`;
  return ajv.getSchema(ref) ?? ajv.compile({ $ref: ref });
}

/**
 * What is wrong about `reply` to `method template` by the document: nothing when the operation
 * documents the reply's status, a media type matching its Content-Type, a schema its body
 * validates against, and every header the test expects the reply to carry.
 */
function replyMismatches(
  doc: Loose,
  ajv: Ajv2020,
  method: string,
  template: string,
  reply: Reply,
): string[] {
  const label = `${method.toUpperCase()} ${template} → ${reply.status}`;
  const operation = doc.paths?.[template]?.[method];
  if (operation === undefined) return [`${label}: the operation is not in the document`];
  const response = operation.responses?.[String(reply.status)];
  if (response === undefined) {
    const documented = Object.keys(operation.responses).join(', ');
    return [`${label}: status not documented (only ${documented}); body ${reply.text}`];
  }
  const content = response.content as Record<string, unknown> | undefined;
  if (content === undefined) {
    return reply.text.length === 0 ? [] : [`${label}: a body the document says nothing of`];
  }
  const mediaType = (reply.contentType ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  const match = Object.keys(content).find((type) => type.toLowerCase() === mediaType);
  if (match === undefined) {
    return [`${label}: Content-Type ${reply.contentType} is not one of ${Object.keys(content)}`];
  }
  const validate = validatorAt(
    ajv,
    `/paths/${token(template)}/${method}/responses/${reply.status}/content/${token(match)}/schema`,
  );
  if (validate(reply.body)) return [];
  return [`${label}: body ${reply.text.slice(0, 400)} fails: ${ajv.errorsText(validate.errors)}`];
}

/** What is wrong about a request body the server took, by the document's request body schema. */
function requestMismatches(
  doc: Loose,
  ajv: Ajv2020,
  method: string,
  template: string,
  body: unknown,
): string[] {
  const label = `${method.toUpperCase()} ${template} request body`;
  if (doc.paths?.[template]?.[method]?.requestBody === undefined) {
    return [`${label}: no request body is documented`];
  }
  const validate = validatorAt(
    ajv,
    `/paths/${token(template)}/${method}/requestBody/content/application~1json/schema`,
  );
  if (validate(body)) return [];
  return [
    `${label}: ${JSON.stringify(body).slice(0, 300)} fails: ${ajv.errorsText(validate.errors)}`,
  ];
}

/**
 * What is wrong about the query parameters of `path` by the document: a parameter the server
 * took that is not documented, a documented-valid value the server refused as a bad parameter,
 * or a value the server took that the documented schema refuses.
 */
function queryMismatches(
  doc: Loose,
  ajv: Ajv2020,
  method: string,
  template: string,
  path: string,
  reply: Reply,
): string[] {
  const operation = doc.paths?.[template]?.[method];
  if (operation === undefined) return [];
  const out: string[] = [];
  const query = new URL(path, 'http://x').searchParams;
  query.forEach((value, name) => {
    const label = `${method.toUpperCase()} ${template}?${name}=${value} → ${reply.status}`;
    const parameter = (operation.parameters ?? []).find(
      (p: Loose) => p.in === 'query' && p.name === name,
    );
    if (parameter === undefined) {
      // Label filters are `label.<key>`, described in prose (OpenAPI has no parameter patterns).
      const described = name.startsWith('label.') && /label\.<key>/.test(operation.description);
      if (reply.status < 300 && !described) out.push(`${label}: an undocumented parameter taken`);
      return;
    }
    const typed =
      parameter.schema?.type === 'integer' && /^-?\d+$/.test(value) ? Number(value) : value;
    const accepts = ajv.validate(parameter.schema, typed);
    // A cursor the server cannot read, or bound to other filters, is refused for what it says,
    // not for its form.
    const refused =
      reply.status === 400 &&
      reply.body?.reason !== 'invalid_cursor' &&
      typeof reply.body?.path === 'string' &&
      reply.body.path.startsWith('query.') &&
      reply.body.path.endsWith(name);
    if (refused && accepts) out.push(`${label}: a value the document allows is refused`);
    if (reply.status < 300 && !accepts) out.push(`${label}: a value the document refuses is taken`);
  });
  return out;
}

interface SendOptions {
  /** The API key; `null` sends none. Default: the key with every role. */
  key?: string | null;
  json?: unknown;
  body?: string;
  headers?: Record<string, string>;
  /** Whether a 2xx means the document must accept the request body (not for bad batch items). */
  bodyIsValid?: boolean;
}

async function send(url: string, method: string, path: string, options: SendOptions = {}) {
  const headers: Record<string, string> = { ...options.headers };
  const key = options.key === undefined ? KEYS.all : options.key;
  if (key !== null) headers.authorization = `Bearer ${key}`;
  let body = options.body;
  if (options.json !== undefined) {
    headers['content-type'] ??= 'application/json';
    body = JSON.stringify(options.json);
  }
  const res = await fetch(`${url}${path}`, { method: method.toUpperCase(), headers, body });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text.length === 0 ? undefined : JSON.parse(text);
  } catch {
    // Not JSON (metrics): kept as text.
  }
  const reply: Reply = {
    status: res.status,
    contentType: res.headers.get('content-type'),
    text,
    body: parsed,
    headers: res.headers,
  };
  return reply;
}

/** A prober of one server: sends a request and records what the document gets wrong about it. */
function prober(url: string, doc: Loose, ajv: Ajv2020) {
  const found: string[] = [];
  const probe = async (
    method: string,
    template: string,
    path: string,
    options: SendOptions = {},
  ): Promise<Reply> => {
    const reply = await send(url, method, path, options);
    found.push(...replyMismatches(doc, ajv, method, template, reply));
    found.push(...queryMismatches(doc, ajv, method, template, path, reply));
    if (options.json !== undefined && reply.status < 300 && options.bodyIsValid !== false) {
      found.push(...requestMismatches(doc, ajv, method, template, options.json));
    }
    return reply;
  };
  return { probe, found };
}

let counter = 0;
function submitCommand(extra: Record<string, unknown> = {}) {
  counter += 1;
  return {
    idempotency_key: `oa-${counter}`,
    input: { ...scope, queue: 'q', program: { name: 'p' }, data: { n: counter }, ...extra },
  };
}

function settleCommand(owner: Loose, op: string, quiescence = 'confirmed') {
  return {
    owner,
    operation_id: op,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: { ok: true } },
      },
    },
    quiescence,
    processing_trace: null,
  };
}

function failCommand(owner: Loose, op: string) {
  return {
    owner,
    operation_id: op,
    report: {
      kind: 'failed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        failure: {
          kind: 'application_error',
          error: { code: 'e', message: 'no', retryable: true, details: { n: 1 } },
        },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

// ---- The keyed server: every route, every role ----------------------------------------------

describe('a server with API keys, completions and retention', () => {
  let receiver: Server;
  let started: Started;
  let url: string;
  let doc: Loose;
  let ajv: Ajv2020;

  beforeAll(async () => {
    receiver = createHttpServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(204).end());
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    cleanups.push(
      () =>
        new Promise<void>((resolve) => {
          receiver.closeAllConnections();
          receiver.close(() => resolve());
        }),
    );
    const { port } = receiver.address() as AddressInfo;
    started = await start({
      LEDGENCE_API_KEYS: JSON.stringify(KEY_CONFIG),
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: {
          url: `http://127.0.0.1:${port}/hooks`,
          secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
        },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '1',
      LEDGENCE_LONG_POLL_WAIT_MS: '2000',
    });
    url = started.server.url;
    ({ doc, ajv } = await documentOf(started.server));
  }, 60_000);

  it('routes every documented operation (no route-not-found 404 for any path and method)', async () => {
    const unrouted: string[] = [];
    for (const [template, item] of Object.entries(doc.paths as Record<string, object>)) {
      for (const method of Object.keys(item)) {
        const path = template.replace(/\{[a-z_]+\}/g, 'x');
        const reply = await send(url, method, path, method === 'get' ? {} : { json: {} });
        if (reply.status === 404 && reply.body?.detail === NO_ROUTE) {
          unrouted.push(`${method} ${template}`);
        }
      }
    }
    expect(unrouted).toEqual([]);
    // DESIGN §6's tables, the retention admin routes and the document itself, all documented.
    const operations = Object.entries(doc.paths as Record<string, object>).flatMap(
      ([template, item]) => Object.keys(item).map((method) => `${method} ${template}`),
    );
    expect(operations).toHaveLength(28);
  });

  it('documents every reply of a whole lifecycle over every route, errors included', async () => {
    const { probe, found } = prober(url, doc, ajv);

    // ---- Operations
    await probe('get', '/healthz', '/healthz', { key: null });
    await probe('get', '/readyz', '/readyz', { key: null });
    await probe('get', '/metrics', '/metrics', { key: null });
    await probe('get', '/openapi.json', '/openapi.json', { key: null });

    // ---- Submit: created, replayed, conflicting, by header; every common error
    const tasksT = `${SCOPE}/tasks`;
    const tasks = `${scopePath}/tasks`;
    const first = submitCommand({
      labels: { team: 'a' },
      priority: 3,
      timeout_ms: 60_000,
      retry: { max_attempts: 3, delay_ms: 1, backoff: 'exponential', max_delay_ms: 10 },
    });
    const created = await probe('post', tasksT, tasks, {
      json: {
        ...first,
        origin_trace: { traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01` },
      },
    });
    expect(created.status).toBe(201);
    await probe('post', tasksT, tasks, {
      json: {
        ...first,
        origin_trace: { traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01` },
      },
    });
    const conflict = await probe('post', tasksT, tasks, {
      json: { ...first, input: { ...first.input, data: { other: true } } },
    });
    expect(conflict.status).toBe(409);
    expect(
      (
        await probe('post', tasksT, tasks, {
          json: { input: submitCommand().input },
          headers: { 'idempotency-key': 'oa-header' },
        })
      ).status,
    ).toBe(201);
    // Optional request fields may be sent as null (omitted-or-null, DESIGN §3).
    const nulls = submitCommand({
      retry: { max_attempts: 2, delay_ms: 0, backoff: null, max_delay_ms: null },
      timeout_ms: null,
      available_at: null,
      delay_ms: null,
      priority: null,
      concurrency_key: null,
      concurrency_limit: null,
      labels: null,
    });
    expect(
      (await probe('post', tasksT, tasks, { json: { ...nulls, origin_trace: null } })).status,
    ).toBe(201);
    await probe('post', tasksT, tasks, { json: { nope: 1 } });
    await probe('post', tasksT, tasks, {
      body: '',
      headers: { 'content-type': 'application/json' },
    });
    await probe('post', tasksT, tasks, { key: null, json: first });
    await probe('post', tasksT, tasks, { key: 'oa-wrong-key-00000000001', json: first });
    await probe('post', tasksT, tasks, { key: KEYS.worker, json: first });
    await probe('post', tasksT, tasks, { key: KEYS.other, json: first });
    await probe('post', tasksT, tasks, {
      body: JSON.stringify(first),
      headers: { 'content-type': 'text/plain' },
    });
    await probe('post', tasksT, tasks, {
      body: JSON.stringify(first),
      headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
    });
    await probe('post', tasksT, tasks, {
      json: submitCommand({ data: 'x'.repeat(2 * 1024 * 1024) }),
    });
    await probe('post', tasksT, tasks, { json: submitCommand({ timeout_ms: 1 }) });
    await probe('post', tasksT, `${tasks}?x=1`, { json: submitCommand() });

    // ---- Submit batch
    const batchT = `${SCOPE}/tasks:batch`;
    await probe('post', batchT, `${tasks}:batch`, {
      json: { commands: [submitCommand(), { bad: true }, first] },
      bodyIsValid: false,
    });
    await probe('post', batchT, `${tasks}:batch`, { json: { commands: [] } });
    await probe('post', batchT, `${tasks}:batch`, {
      key: KEYS.worker,
      json: { commands: [first] },
    });

    // ---- Reads of a queued task, lists, filters, cursors
    const taskId = created.body.task_id as string;
    const taskT = `${SCOPE}/tasks/{task_id}`;
    const task = `${tasks}/${taskId}`;
    await probe('get', taskT, task);
    await probe('get', taskT, `${tasks}/missing`);
    await probe('get', taskT, `${task}?x=1`);
    await probe('get', `${taskT}/snapshot`, `${task}/snapshot`);
    await probe('get', `${taskT}/history`, `${task}/history`);
    await probe('get', `${taskT}/history`, `${task}/history?after_sequence=1`);
    await probe('get', `${taskT}/history`, `${task}/history?after_sequence=-1`);
    await probe('get', `${taskT}/result`, `${task}/result`);
    await probe('get', `${taskT}/result`, `${task}/result?wait_ms=10`);
    await probe('get', `${taskT}/result`, `${task}/result?wait_ms=abc`);
    await probe('get', `${taskT}/result`, `${task}/result?wait_ms=${'9'.repeat(20)}`);
    await probe('get', `${taskT}/attempts/{attempt_id}`, `${task}/attempts/nope`);
    await probe('get', tasksT, `${tasks}?limit=1&label.team=a`);
    const page = await probe('get', tasksT, `${tasks}?limit=1&state=queued&queue=q`);
    expect(page.body.next_cursor).toEqual(expect.any(String));
    const cursor = encodeURIComponent(page.body.next_cursor);
    await probe('get', tasksT, `${tasks}?limit=1&state=queued&queue=q&cursor=${cursor}`);
    await probe('get', tasksT, `${tasks}?limit=1&cursor=${cursor}`);
    await probe('get', tasksT, `${tasks}?cursor=garbage`);
    await probe('get', tasksT, `${tasks}?state=bogus`);
    await probe('get', tasksT, `${tasks}?limit=0`);
    await probe('get', tasksT, `${tasks}?limit=501`);
    await probe('get', tasksT, `${tasks}?program=p&submitted_from=0&submitted_until=${2 ** 50}`);
    await probe('get', tasksT, `${tasks}?workflow_id=w`);
    await probe('get', tasksT, tasks, { key: KEYS.worker });

    // ---- Worker: sessions, acquire (single and batch), renew, settle, quiescence
    const sessionsT = '/v1/worker/sessions';
    const session = await probe('post', sessionsT, sessionsT, {
      json: { scope, queue: 'q', concurrency: 4 },
    });
    const sid = session.body.id as string;
    await probe('post', sessionsT, sessionsT, {
      key: KEYS.client,
      json: { scope, queue: 'q', concurrency: 4 },
    });
    await probe('post', sessionsT, sessionsT, { json: { scope, queue: 'q', concurrency: 0 } });
    const extendT = '/v1/worker/sessions/{session_id}/extend';
    await probe('post', extendT, `/v1/worker/sessions/${sid}/extend`, { json: { scope } });
    await probe('post', extendT, `/v1/worker/sessions/${sid}/extend`);
    await probe('post', extendT, '/v1/worker/sessions/nope/extend', { json: { scope } });
    await probe('post', extendT, `/v1/worker/sessions/${sid}/extend`, {
      json: { scope: { ...scope, namespace: 'elsewhere' } },
      key: KEYS.worker,
    });

    const acquireT = '/v1/worker/acquire';
    const poll = { scope, queue: 'q', worker_session_id: sid, consumer_id: 0, sequence: 1 };
    const acquired = await probe('post', acquireT, acquireT, { json: poll });
    expect(acquired.body.disposition).toBe('assigned');
    await probe('post', acquireT, acquireT, { json: poll });
    await probe('post', acquireT, acquireT, { json: { ...poll, sequence: 2 } });
    await probe('post', acquireT, acquireT, { json: { ...poll, sequence: 7 } });
    await probe('post', acquireT, acquireT, { json: { ...poll, worker_session_id: 'nope' } });
    await probe('post', acquireT, acquireT, { json: { ...poll, queue: 'other' } });
    await probe('post', acquireT, `${acquireT}?wait_ms=x`, { json: poll });
    const acquireBatchT = '/v1/worker/acquire:batch';
    const batch = await probe('post', acquireBatchT, acquireBatchT, {
      json: {
        commands: [
          { ...poll, consumer_id: 1 },
          { ...poll, consumer_id: 2 },
          { ...poll, consumer_id: 3, sequence: 9 },
        ],
      },
    });
    // Polls of a queue holding nothing: empty, single and batch.
    const idle = await send(url, 'post', sessionsT, {
      json: { scope, queue: 'idle', concurrency: 2 },
    });
    const idlePoll = { ...poll, queue: 'idle', worker_session_id: idle.body.id };
    const empty = await probe('post', acquireBatchT, `${acquireBatchT}?wait_ms=10`, {
      json: { commands: [idlePoll] },
    });
    expect(empty.body.replies[0].disposition).toBe('empty');
    const emptyOne = await probe('post', acquireT, `${acquireT}?wait_ms=10`, {
      json: { ...idlePoll, consumer_id: 1 },
    });
    expect(emptyOne.body.disposition).toBe('empty');
    const owner = acquired.body.assignment.lease.owner;
    const renewT = '/v1/worker/renew';
    await probe('post', renewT, renewT, { json: { owner, sequence: 1, intent: 'dispatch' } });
    await probe('post', renewT, renewT, { json: { owner, sequence: 1, intent: 'dispatch' } });
    await probe('post', renewT, renewT, { json: { owner, sequence: 5, intent: 'keep_alive' } });
    await probe('post', renewT, renewT, {
      json: { owner: { ...owner, attempt_id: 'nope' }, sequence: 2, intent: 'keep_alive' },
    });
    await probe('post', renewT, renewT, {
      json: {
        owner: { ...owner, generation: owner.generation + 1 },
        sequence: 2,
        intent: 'keep_alive',
      },
    });
    await probe('post', '/v1/worker/renew:batch', '/v1/worker/renew:batch', {
      json: { commands: [{ owner, sequence: 2, intent: 'keep_alive' }, { owner }] },
      bodyIsValid: false,
    });

    const settleT = '/v1/worker/settle';
    await probe('post', settleT, settleT, { json: settleCommand(owner, 'op-1', 'unconfirmed') });
    await probe('post', settleT, settleT, { json: settleCommand(owner, 'op-1', 'unconfirmed') });
    await probe('post', settleT, settleT, { json: failCommand(owner, 'op-1') });
    await probe('post', renewT, renewT, { json: { owner, sequence: 3, intent: 'keep_alive' } });
    const quiescenceT = '/v1/worker/quiescence';
    await probe('post', quiescenceT, quiescenceT, { json: owner });
    await probe('post', quiescenceT, quiescenceT, { json: { ...owner, attempt_id: 'nope' } });
    await probe('post', settleT, settleT, { json: settleCommand(owner, 'op-2') });
    // A replayed poll of a settled assignment: ownership_lost.
    await probe('post', acquireT, acquireT, { json: poll });

    const owners = (batch.body.replies as Loose[])
      .filter((reply) => reply.disposition === 'assigned')
      .map((reply) => reply.assignment.lease.owner);
    expect(owners).toHaveLength(2);
    await probe('post', '/v1/worker/settle:batch', '/v1/worker/settle:batch', {
      json: { commands: [failCommand(owners[0], 'b-0'), settleCommand(owners[1], 'b-1'), {}] },
      bodyIsValid: false,
    });

    // ---- Reads of settled tasks: results, attempts, history with a retry
    await probe('get', `${taskT}/result`, `${task}/result`);
    const snapshot = await probe('get', `${taskT}/snapshot`, `${task}/snapshot`);
    await probe('get', `${taskT}/attempts/{attempt_id}`, `${task}/attempts/${owner.attempt_id}`);
    await probe('get', `${taskT}/history`, `${task}/history`);
    const failed = `${tasks}/${owners[0].task_id}`;
    await probe(
      'get',
      `${taskT}/attempts/{attempt_id}`,
      `${failed}/attempts/${owners[0].attempt_id}`,
    );
    await probe('get', `${taskT}/history`, `${failed}/history`);
    await probe('get', `${taskT}/snapshot`, `${failed}/snapshot`);
    expect(snapshot.body.state).toBe('succeeded');

    // ---- Cancel
    const cancelT = `${taskT}/cancel`;
    const queued = await probe('post', tasksT, tasks, { json: submitCommand({ queue: 'other' }) });
    const cancel = `${tasks}/${queued.body.task_id}/cancel`;
    await probe('post', cancelT, cancel);
    await probe('post', cancelT, cancel, { json: {} });
    await probe('post', cancelT, `${tasks}/missing/cancel`, { json: {} });
    await probe('post', cancelT, cancel, { json: { a: 1 } });
    await probe('post', cancelT, cancel, {
      body: '{',
      headers: { 'content-type': 'application/json' },
    });
    await probe('get', `${taskT}/result`, `${tasks}/${queued.body.task_id}/result?wait_ms=100`);
    await probe('get', `${taskT}/history`, `${tasks}/${queued.body.task_id}/history`);

    // ---- Completion subscriptions and redelivery
    const subsT = `${taskT}/completion-subscriptions`;
    const subs = `${task}/completion-subscriptions`;
    const subscribe = (key: string, destination = 'billing') => ({
      json: { subscription_key: key, destination },
    });
    const sub = await probe('post', subsT, subs, subscribe('k'));
    await probe('post', subsT, subs, subscribe('k'));
    await probe('post', subsT, subs, subscribe('k', 'nowhere'));
    await probe('post', subsT, `${tasks}/missing/completion-subscriptions`, subscribe('k'));
    await probe('get', subsT, subs);
    for (let i = 1; i < 16; i += 1) await probe('post', subsT, subs, subscribe(`k-${i}`));
    await probe('post', subsT, subs, subscribe('k-16'));
    await vi.waitFor(
      async () => {
        const list = await send(url, 'get', subs);
        expect(list.body[0].state).toBe('delivered');
      },
      { timeout: 10_000, interval: 50 },
    );
    await probe('get', subsT, subs);
    const redeliverT = `${SCOPE}/completion-subscriptions/{subscription_id}/redeliver`;
    const redeliver = `${scopePath}/completion-subscriptions/${sub.body.id}/redeliver`;
    await probe('post', redeliverT, redeliver, { json: { generation: 1 } });
    await probe('post', redeliverT, redeliver, { json: { generation: 1 } });
    await probe('post', redeliverT, redeliver, { json: { generation: 5 } });
    await probe('post', redeliverT, `${scopePath}/completion-subscriptions/nope/redeliver`, {
      json: { generation: 1 },
    });

    // ---- Retention (admin)
    const policyT = `${SCOPE}/retention-policy`;
    const policy = `${scopePath}/retention-policy`;
    await probe('get', policyT, policy);
    await probe('get', policyT, policy, { key: KEYS.client });
    await probe('put', policyT, policy, { json: { retention_ms: 86_400_000 } });
    await probe('put', policyT, policy, { json: { retention_ms: 1 } });
    await probe('get', policyT, policy);
    await probe('get', `${policyT}/preview`, `${policy}/preview?limit=5`);
    await probe('get', `${policyT}/preview`, `${policy}/preview`);
    await probe('get', `${policyT}/preview`, `${policy}/preview?limit=0`);

    expect(found).toEqual([]);

    // Every route pattern the server answered with is a path of the document, and the
    // lifecycle above went through every documented path.
    const answered = [...started.routes].map((route) => route.replace(/\/:([A-Za-z_]+)/g, '/{$1}'));
    expect(new Set(answered)).toEqual(new Set(Object.keys(doc.paths)));
  }, 60_000);

  it('documents the 409 conflict of a renew repeating its sequence with another intent', async () => {
    const { probe, found } = prober(url, doc, ajv);
    const queue = 'renew-conflict';
    await probe('post', `${SCOPE}/tasks`, `${scopePath}/tasks`, { json: submitCommand({ queue }) });
    const session = await send(url, 'post', '/v1/worker/sessions', {
      json: { scope, queue, concurrency: 1 },
    });
    const acquired = await send(url, 'post', '/v1/worker/acquire', {
      json: { scope, queue, worker_session_id: session.body.id, consumer_id: 0, sequence: 1 },
    });
    const owner = acquired.body.assignment.lease.owner;
    const renewT = '/v1/worker/renew';
    expect(
      (await probe('post', renewT, renewT, { json: { owner, sequence: 1, intent: 'dispatch' } }))
        .status,
    ).toBe(200);
    // The same sequence with the other intent (core renew.ts: 409 `conflict`).
    const reply = await probe('post', renewT, renewT, {
      json: { owner, sequence: 1, intent: 'keep_alive' },
    });
    expect([reply.status, reply.body.code]).toEqual([409, 'conflict']);
    expect(found).toEqual([]);
  });

  it('documents the 2^53−1 bound of after_sequence, submitted_from and submitted_until', async () => {
    const { probe, found } = prober(url, doc, ajv);
    const tasks = `${scopePath}/tasks`;
    const created = await probe('post', `${SCOPE}/tasks`, tasks, { json: submitCommand() });
    const history = `${tasks}/${created.body.task_id}/history`;
    const max = Number.MAX_SAFE_INTEGER;
    for (const [template, path] of [
      [`${SCOPE}/tasks/{task_id}/history`, `${history}?after_sequence=${max}`],
      [`${SCOPE}/tasks`, `${tasks}?submitted_from=${max}&submitted_until=${max}`],
    ]) {
      expect((await probe('get', template as string, path as string)).status).toBe(200);
    }
    // One past the bound: refused by the server (query.ts), and so by the document.
    for (const [template, path] of [
      [`${SCOPE}/tasks/{task_id}/history`, `${history}?after_sequence=${2 ** 53}`],
      [`${SCOPE}/tasks`, `${tasks}?submitted_from=${2 ** 53}`],
      [`${SCOPE}/tasks`, `${tasks}?submitted_until=${2 ** 53}`],
    ]) {
      expect((await probe('get', template as string, path as string)).status).toBe(400);
    }
    expect(found).toEqual([]);
  });

  it('documents the Location header of a created task', async () => {
    const reply = await send(url, 'post', `${scopePath}/tasks`, { json: submitCommand() });
    expect(reply.status).toBe(201);
    expect(reply.headers.get('location')).toBe(`${scopePath}/tasks/${reply.body.task_id}`);
    const created = doc.paths[`${SCOPE}/tasks`].post.responses['201'];
    expect(created.headers?.Location?.schema).toEqual({ type: 'string' });
    // A replay is 200 and carries none.
    expect(doc.paths[`${SCOPE}/tasks`].post.responses['200'].headers?.Location).toBeUndefined();
  });
});

// ---- Expired sessions: 410 ---------------------------------------------------------------------

describe('a server of 1 s sessions', () => {
  it('documents the 410 session_expired of extend, acquire and the lease operations after it', async () => {
    const { server } = await start({
      LEDGENCE_SESSION_VALIDITY_MS: '1000',
      LEDGENCE_LEASE_DURATION_MS: '60000',
    });
    const { doc, ajv } = await documentOf(server);
    const { probe, found } = prober(server.url, doc, ajv);
    await probe('post', `${SCOPE}/tasks`, `${scopePath}/tasks`, { json: submitCommand() });
    const session = await probe('post', '/v1/worker/sessions', '/v1/worker/sessions', {
      json: { scope, queue: 'q', concurrency: 2 },
    });
    const poll = {
      scope,
      queue: 'q',
      worker_session_id: session.body.id,
      consumer_id: 0,
      sequence: 1,
    };
    const acquired = await probe('post', '/v1/worker/acquire', '/v1/worker/acquire', {
      json: poll,
    });
    const owner = acquired.body.assignment.lease.owner;
    // Let the session pass its validity (store time; the set-up waits, nothing is timed).
    await new Promise((resolve) => setTimeout(resolve, 1_200));
    const extend = await probe(
      'post',
      '/v1/worker/sessions/{session_id}/extend',
      `/v1/worker/sessions/${session.body.id}/extend`,
      { json: { scope } },
    );
    expect(extend.status).toBe(410);
    const acquire = await probe('post', '/v1/worker/acquire', '/v1/worker/acquire', {
      json: { ...poll, consumer_id: 1 },
    });
    expect(acquire.status).toBe(410);
    await probe('post', '/v1/worker/acquire:batch', '/v1/worker/acquire:batch', {
      json: { commands: [{ ...poll, consumer_id: 1 }] },
    });
    // The lease outlives the session: renew, settle and quiescence answer as their routes say.
    await probe('post', '/v1/worker/renew', '/v1/worker/renew', {
      json: { owner, sequence: 1, intent: 'dispatch' },
    });
    await probe('post', '/v1/worker/settle', '/v1/worker/settle', {
      json: settleCommand(owner, 'op-1', 'unconfirmed'),
    });
    await probe('post', '/v1/worker/quiescence', '/v1/worker/quiescence', { json: owner });
    expect(found).toEqual([]);
  }, 30_000);
});

// ---- Development mode: loopback host names only -------------------------------------------------

describe('a server in development mode', () => {
  /** A GET naming `host` in its Host header (fetch cannot set Host). */
  function getNaming(base: string, path: string, host: string): Promise<Reply> {
    const target = new URL(path, base);
    return new Promise((resolve, reject) => {
      const req = httpRequest(
        { hostname: target.hostname, port: target.port, path, method: 'GET', headers: { host } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            resolve({
              status: res.statusCode ?? 0,
              contentType: res.headers['content-type'] ?? null,
              text,
              body: JSON.parse(text),
              headers: new Headers(),
            });
          });
        },
      );
      req.on('error', reject);
      req.end();
    });
  }

  it('documents the 403 host_not_loopback of every route, the public ones included', async () => {
    const { server } = await start({});
    expect(server.developmentMode).toBe(true);
    const { doc, ajv } = await documentOf(server);
    const found: string[] = [];
    for (const [template, path] of [
      ['/healthz', '/healthz'],
      ['/readyz', '/readyz'],
      ['/metrics', '/metrics'],
      ['/openapi.json', '/openapi.json'],
      [`${SCOPE}/tasks`, `${scopePath}/tasks`],
    ] as const) {
      const reply = await getNaming(server.url, path, 'rebound.example:8080');
      expect([reply.status, reply.body.reason]).toEqual([403, 'host_not_loopback']);
      found.push(...replyMismatches(doc, ajv, 'get', template, reply));
    }
    expect(found).toEqual([]);
  }, 30_000);
});
