/**
 * Submit idempotency over the real server (review r52b) (DESIGN §5 Submit, §6 POST {scope}/tasks
 * with a SubmitCommand or an `Idempotency-Key` header). Header keys the body form refuses,
 * replays after a terminal state reached through the worker routes, identical submits racing in
 * every form on one server (group commit), batch items sharing keys with a stored task.
 */
import { request as httpRequest } from 'node:http';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};

let db: TestDatabase;
let server: RunningServer;

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'idem_r52b' });
  const config = loadConfig({ DATABASE_URL: db.url, PORT: '0' }, noFiles);
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
}, 60_000);
afterAll(async () => {
  await server?.stop();
  await db?.drop();
});

// biome-ignore lint/suspicious/noExplicitAny: loose reply bodies
type Body = Record<string, any>;
interface Reply {
  status: number;
  body: Body;
}

/** A raw POST: exact body bytes; header values are sent one byte per character (latin1). */
function rawPost(path: string, body: string, headers: Record<string, string> = {}): Promise<Reply> {
  const url = new URL(path, server.url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      { method: 'POST', headers: { 'content-type': 'application/json', ...headers } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : {} });
        });
      },
    );
    req.on('error', reject);
    req.end(Buffer.from(body, 'utf8'));
  });
}
const post = (path: string, value: unknown) => rawPost(path, JSON.stringify(value));
async function get(path: string): Promise<Reply> {
  const res = await fetch(new URL(path, server.url));
  return { status: res.status, body: (await res.json()) as Body };
}

/** A header value carrying these characters' UTF-8 bytes, as curl would send them. */
const utf8Header = (s: string) => Buffer.from(s, 'utf8').toString('latin1');
const scopePath = (ns: string, t = 'acme') => `/v1/tenants/${t}/namespaces/${ns}`;
const tasksPath = (ns: string, t = 'acme') => `${scopePath(ns, t)}/tasks`;
function input(ns: string, extra = '', data = '1', t = 'acme'): string {
  return `{"tenant_id":"${t}","namespace":"${ns}","queue":"q","program":{"name":"p"},"data":${data}${extra}}`;
}
async function listCount(ns: string): Promise<number> {
  return ((await get(`${tasksPath(ns)}?limit=500`)).body.tasks as unknown[]).length;
}

let counter = 0;
const freshNs = () => `r52b-${++counter}-${Date.now()}`;

describe('Idempotency-Key header: the key text rule, as the body form applies it', () => {
  it('a header key starting with U+FEFF is refused like the same body key, not read as another key', async () => {
    const ns = freshNs();
    const plain = await rawPost(tasksPath(ns), `{"idempotency_key":"k","input":${input(ns)}}`);
    expect(plain.status).toBe(201);
    // The body form: a leading U+FEFF is edge whitespace, 400.
    const inBody = await rawPost(
      tasksPath(ns),
      `{"idempotency_key":"\\ufeffk","input":${input(ns)}}`,
    );
    expect([inBody.status, inBody.body.code]).toEqual([400, 'invalid_input']);
    // The header form must follow the same text rule; the header "\uFEFFk" is not the key "k".
    const inHeader = await rawPost(tasksPath(ns), `{"input":${input(ns)}}`, {
      'idempotency-key': utf8Header('\ufeffk'),
    });
    expect([inHeader.status, inHeader.body.code, inHeader.body.task_id]).toEqual([
      400,
      'invalid_input',
      undefined,
    ]);
  });

  it('a header key of more than 255 UTF-8 bytes is 400, however it begins', async () => {
    const ns = freshNs();
    const k255 = `${'é'.repeat(127)}x`; // 255 UTF-8 bytes
    expect(Buffer.byteLength(k255)).toBe(255);
    const created = await rawPost(tasksPath(ns), `{"input":${input(ns)}}`, {
      'idempotency-key': utf8Header(k255),
    });
    expect(created.status).toBe(201);
    const viaBody = await rawPost(
      tasksPath(ns),
      `{"idempotency_key":${JSON.stringify(k255)},"input":${input(ns)}}`,
    );
    expect([viaBody.status, viaBody.body.task_id]).toEqual([200, created.body.task_id]);
    const over = await rawPost(tasksPath(ns), `{"input":${input(ns)}}`, {
      'idempotency-key': utf8Header(`${k255}y`),
    });
    expect([over.status, over.body.code]).toEqual([400, 'invalid_input']);
    // 258 bytes on the wire (EF BB BF + 255): over the limit too, not a replay of the 255-byte key.
    const bomOver = await rawPost(tasksPath(ns), `{"input":${input(ns)}}`, {
      'idempotency-key': utf8Header(`\ufeff${k255}`),
    });
    expect([bomOver.status, bomOver.body.code]).toEqual([400, 'invalid_input']);
    expect(await listCount(ns)).toBe(1);
  });
});

/** Claims the only queued task of `ns`/q, is granted dispatch and settles it with `outcome`. */
async function runToEnd(ns: string, outcome: unknown): Promise<string> {
  const scope = { tenant_id: 'acme', namespace: ns };
  const session = await post('/v1/worker/sessions', { scope, queue: 'q', concurrency: 1 });
  expect([200, 201]).toContain(session.status);
  const acquired = await post('/v1/worker/acquire', {
    scope,
    queue: 'q',
    worker_session_id: session.body.id,
    consumer_id: 0,
    sequence: 1,
  });
  expect(acquired.body.disposition).toBe('assigned');
  const owner = acquired.body.assignment.lease.owner;
  const renewed = await post('/v1/worker/renew', { owner, sequence: 1, intent: 'dispatch' });
  expect(renewed.body.dispatch_allowed).toBe(true);
  const settled = await post('/v1/worker/settle', {
    owner,
    operation_id: 'op',
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome,
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  });
  expect(settled.status).toBe(200);
  return settled.body.task_state as string;
}

describe('replays after the task ended through the worker routes', () => {
  for (const [name, outcome, state] of [
    ['succeeded', { kind: 'success', output: { ok: true } }, 'succeeded'],
    [
      'failed',
      { kind: 'application_error', error: { code: 'x', message: 'm', retryable: false } },
      'failed',
    ],
  ] as const) {
    it(`a ${name} task replays as itself (200, the stored snapshot); another command is 409`, async () => {
      const ns = freshNs();
      const body = `{"idempotency_key":"end","input":${input(ns, ',"labels":{"a":"1","b":"2"}')}}`;
      const first = await rawPost(tasksPath(ns), body);
      expect(first.status).toBe(201);
      expect(await runToEnd(ns, outcome)).toBe(state);
      const stored = await get(`${tasksPath(ns)}/${first.body.task_id}/snapshot`);
      const respelled = `{ "input": ${input(ns, ',"labels":{"b":"2","\\u0061":"1"},"priority":null', '1.0')}, "idempotency_key": "\\u0065nd" }`;
      for (const replay of [
        await rawPost(tasksPath(ns), body),
        await rawPost(tasksPath(ns), respelled),
        await rawPost(tasksPath(ns), `{"input":${input(ns, ',"labels":{"a":"1","b":"2"}')}}`, {
          'idempotency-key': 'end',
        }),
      ]) {
        expect(replay.status).toBe(200);
        expect(replay.body).toEqual(stored.body);
        expect(replay.body.state).toBe(state);
      }
      const other = await rawPost(tasksPath(ns), body.replace('"data":1', '"data":2'));
      expect([other.status, other.body.code]).toEqual([409, 'conflict']);
      expect(await listCount(ns)).toBe(1);
    });
  }
});

describe('identical submits racing on one server, every form (group commit)', () => {
  it('single body, single header and batch items of one key: one task, exactly one 201', async () => {
    for (let round = 0; round < 3; round++) {
      const ns = freshNs();
      const key = `race-${round}`;
      const bodyForm = `{"idempotency_key":"${key}","input":${input(ns, ',"labels":{"x":"y"}', '{"a":1,"b":[1,2]}')}}`;
      const respelled = `{"input":${input(ns, ',"labels":{"x":"y"},"retry":null', '{"b":[1.0,2e0],"a":1}')},"idempotency_key":"${key}"}`;
      const headerForm = `{"input":${input(ns, ',"labels":{"x":"y"}', '{"a":1,"b":[1,2]}')}}`;
      const singles = Array.from({ length: 12 }, (_, i) =>
        i % 3 === 0
          ? rawPost(tasksPath(ns), bodyForm)
          : i % 3 === 1
            ? rawPost(tasksPath(ns), respelled)
            : rawPost(tasksPath(ns), headerForm, { 'idempotency-key': key }),
      );
      const batches = Array.from({ length: 3 }, () =>
        rawPost(`${tasksPath(ns)}:batch`, `{"commands":[${bodyForm},${respelled}]}`),
      );
      const [singleReplies, batchReplies] = await Promise.all([
        Promise.all(singles),
        Promise.all(batches),
      ]);
      const statuses = singleReplies.map((r) => r.status);
      expect(statuses.every((s) => s === 200 || s === 201)).toBe(true);
      const ids = new Set(singleReplies.map((r) => r.body.task_id));
      for (const b of batchReplies) {
        expect(b.status).toBe(200);
        for (const item of b.body.results as Body[]) ids.add(item.task_id);
      }
      expect(ids.size).toBe(1);
      expect([...ids][0]).toMatch(/^tsk_/);
      // Exactly one created: either a single got 201, or no single did (a batch created it).
      expect(statuses.filter((s) => s === 201).length).toBeLessThanOrEqual(1);
      expect(await listCount(ns)).toBe(1);
      const history = await get(`${tasksPath(ns)}/${[...ids][0]}/history`);
      expect((history.body as unknown as Body[]).map((e) => e.event.reason)).toEqual(['submitted']);
    }
  });
});

describe('tasks:batch items sharing keys with a stored task and with each other', () => {
  it('replays answer the stored snapshot, differing items 409, new keys one task each', async () => {
    const ns = freshNs();
    const stored = await rawPost(
      tasksPath(ns),
      `{"idempotency_key":"s","input":${input(ns, '', '{"k":{"z":1},"10":1,"9":2}')}}`,
    );
    expect(stored.status).toBe(201);
    const snapshot = (await get(`${tasksPath(ns)}/${stored.body.task_id}/snapshot`)).body;
    const batch = await rawPost(
      `${tasksPath(ns)}:batch`,
      `{"commands":[
        {"idempotency_key":"n","input":${input(ns)}},
        {"idempotency_key":"s","input":${input(ns, '', '{"9":2.0,"10":1,"k":{"z":1e0}}')}},
        {"idempotency_key":"s","input":${input(ns, ',"priority":1', '{"k":{"z":1},"10":1,"9":2}')}},
        {"idempotency_key":"n","input":${input(ns, ',"timeout_ms":null')}},
        {"idempotency_key":"n","input":${input(ns, '', '2')}},
        {"idempotency_key":"s","input":${input(ns, '', '{"k":{"z":2},"10":1,"9":2}')}}
      ]}`,
    );
    expect(batch.status).toBe(200);
    const [n1, s1, s2, n2, n3, s3] = batch.body.results as Body[];
    expect(s1).toEqual(snapshot);
    expect([s2?.status, s2?.code]).toEqual([409, 'conflict']);
    expect([s3?.status, s3?.code]).toEqual([409, 'conflict']);
    expect(n1?.task_id).toMatch(/^tsk_/);
    expect(n2).toEqual(n1);
    expect([n3?.status, n3?.code]).toEqual([409, 'conflict']);
    expect(await listCount(ns)).toBe(2);
    // The new task's batch answer is its stored snapshot.
    expect((await get(`${tasksPath(ns)}/${n1?.task_id}/snapshot`)).body).toEqual(n1);
  });
});
