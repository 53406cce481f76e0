/**
 * Task submission over the real server and PostgreSQL (DESIGN §3, §4.1, §5 Submit, §6, §12): a
 * batch mixing new, replayed and conflicting items with duplicates inside it, items the store
 * refuses, and items breaking strict-JSON value rules; and requests refused as a whole.
 */
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

let db: TestDatabase;
let server: RunningServer;

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'submit_batch_mixed' });
  const config = loadConfig({ DATABASE_URL: db.url, PORT: '0' }, (path) => {
    throw new Error(`no file ${path} in this test`);
  });
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
}, 60_000);
afterAll(async () => {
  await server?.stop();
  await db?.drop();
});

let counter = 0;
const freshNamespace = () => `mixed-${++counter}-${Date.now()}`;
const tasksPath = (ns: string) => `/v1/tenants/acme/namespaces/${ns}/tasks`;

interface Item {
  task_id?: string;
  status?: number;
  code?: string;
  path?: string;
  input?: { data?: unknown };
}

async function post(
  path: string,
  body: string,
): Promise<{ status: number; body: Item & { results: Item[] } }> {
  const res = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
  });
  return { status: res.status, body: (await res.json()) as Item & { results: Item[] } };
}

/** Everything the namespace's tasks hold: a page, and each task's snapshot and history. */
async function dump(ns: string): Promise<string> {
  const page = (await (await fetch(`${server.url}${tasksPath(ns)}?limit=500`)).json()) as {
    tasks: { task_id: string }[];
  };
  const out: unknown[] = [page];
  for (const task of page.tasks) {
    for (const suffix of ['snapshot', 'history']) {
      out.push(
        await (await fetch(`${server.url}${tasksPath(ns)}/${task.task_id}/${suffix}`)).json(),
      );
    }
  }
  return JSON.stringify(out);
}

function command(ns: string, key: string, data = '1', extra = ''): string {
  return `{"idempotency_key":${JSON.stringify(key)},"input":{"tenant_id":"acme","namespace":${JSON.stringify(ns)},"queue":"q","program":{"name":"p"},"data":${data}${extra}}}`;
}

const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth);

describe('tasks:batch mixing new, replayed, conflicting, duplicated and refused items', () => {
  it('answers each item as if sent alone, in request order, and a replay of the whole batch changes nothing', async () => {
    const ns = freshNamespace();
    const stored = await post(tasksPath(ns), command(ns, 'stored'));
    const other = await post(tasksPath(ns), command(ns, 'other'));
    expect([stored.status, other.status]).toEqual([201, 201]);

    const items = [
      command(ns, 'new'), // 0: new
      command(ns, 'stored'), // 1: replay of a stored task
      command(ns, 'other', '2'), // 2: conflict with a stored task
      command(ns, 'new', '1.0'), // 3: duplicate of item 0, spelled differently: its replay
      command(ns, 'new', '3'), // 4: duplicate of item 0 with other data: 409
      command(ns, 'short', '1', ',"timeout_ms":1000'), // 5: refused by the store (below the margin)
      command(ns, 'short', '1', ',"timeout_ms":6000'), // 6: same key, valid: created
      command(ns, 'other', '2'), // 7: the conflicting command again: 409 too
      command(ns, 'other'), // 8: after a conflicting item, the stored command still replays
      command(ns, 'due', '1', ',"available_at":0'), // 9: absolute time (transaction path)
      command(ns, 'keyed', '1', ',"concurrency_key":"c","concurrency_limit":2'), // 10
      command(ns, 'big', '9007199254740992'), // 11: number beyond 2^53−1: its own 400
      command(ns, 'nul', '{"\\u0000k":"a\\u0000b"}'), // 12: NUL in a key and a string
      command(ns, 'deep64', nested(64)), // 13: data at depth 64
      command(ns, 'deep65', nested(65)), // 14: depth 65: its own 400
      command(ns, 'dupkey', '{"a":1,"a":1}'), // 15: duplicate key: its own 400
      command(ns, 'max', '-9007199254740991.0'), // 16: −(2^53−1) exactly, spelled as a fraction
    ];
    const body = `{"commands":[${items.join(',')}]}`;
    const first = await post(`${tasksPath(ns)}:batch`, body);
    expect(first.status).toBe(200);
    const r = first.body.results;
    expect(r).toHaveLength(items.length);
    const outcome = (item: Item | undefined) =>
      item?.task_id !== undefined ? 'task' : `${item?.status} ${item?.code}`;
    expect(r.map(outcome)).toEqual([
      'task',
      'task',
      '409 conflict',
      'task',
      '409 conflict',
      '400 invalid_input',
      'task',
      '409 conflict',
      'task',
      'task',
      'task',
      '400 invalid_input',
      'task',
      'task',
      '400 invalid_input',
      '400 invalid_input',
      'task',
    ]);
    expect(r[1]?.task_id).toBe(stored.body.task_id);
    expect(r[3]?.task_id).toBe(r[0]?.task_id);
    expect(r[8]?.task_id).toBe(other.body.task_id);
    expect(r[5]?.path).toBe('$.commands[5].input.timeout_ms');
    expect(r[11]?.path).toBe('$.commands[11].input.data');
    expect(r[14]?.path?.startsWith('$.commands[14].input.data')).toBe(true);
    expect(r[15]?.path).toBe('$.commands[15].input.data.a');
    expect(r[12]?.input?.data).toEqual({ '\u0000k': 'a\u0000b' });
    expect(r[16]?.input?.data).toBe(-9007199254740991);

    const page = (await (await fetch(`${server.url}${tasksPath(ns)}?limit=500`)).json()) as {
      tasks: unknown[];
    };
    // stored, other + new, short, due, keyed, nul, deep64, max
    expect(page.tasks).toHaveLength(9);

    const before = await dump(ns);
    const again = await post(`${tasksPath(ns)}:batch`, body);
    expect(again.body.results.map(outcome)).toEqual(
      // item 5 now meets the task item 6 created: a different command under its key
      r.map((item, i) => (i === 5 ? '409 conflict' : outcome(item))),
    );
    expect(again.body.results.map((item) => item.task_id)).toEqual(r.map((item) => item.task_id));
    expect(await dump(ns)).toBe(before);
  });

  it('a request refused as a whole writes nothing: 1 001 items, an envelope key twice, an unknown envelope field, a query string', async () => {
    const ns = freshNamespace();
    const one = command(ns, 'k');
    const refused = [
      await post(`${tasksPath(ns)}:batch`, `{"commands":[${Array(1001).fill(one).join(',')}]}`),
      await post(`${tasksPath(ns)}:batch`, `{"commands":[${one}],"commands":[${one}]}`),
      await post(`${tasksPath(ns)}:batch`, `{"commands":[${one}],"extra":1}`),
      await post(`${tasksPath(ns)}:batch?x=1`, `{"commands":[${one}]}`),
      await post(
        `${tasksPath(ns)}:batch`,
        `{"commands":[${one}, ${one.replace('"data":1', '"data":1,"data":2')}],"x":1}`,
      ),
    ];
    expect(refused.map((r) => [r.status, r.body.code])).toEqual(
      Array(refused.length).fill([400, 'invalid_input']),
    );
    expect(await dump(ns)).toBe(JSON.stringify([{ tasks: [] }]));
  });
});
