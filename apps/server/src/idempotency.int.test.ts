/**
 * Submission idempotency over real sockets against two servers sharing one PostgreSQL database:
 * replays spelled differently, defaults, header and body keys, concurrent first submits, batch
 * duplicates, replays after a terminal state, rows recorded before migration 0002, and the
 * Location and body of a 201 against its replays (DESIGN §1.3, §5, §6).
 */
import { request as httpRequest } from 'node:http';
import { commandDigest } from '@ledgence/core';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};

let db: TestDatabase;
let a: RunningServer;
let b: RunningServer;
let sql: postgres.Sql;

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'idempotency' });
  const config = loadConfig({ DATABASE_URL: db.url, PORT: '0' }, noFiles);
  a = await startServer(config, { logger: pino({ level: 'silent' }) });
  b = await startServer(config, { logger: pino({ level: 'silent' }) });
  sql = postgres(db.url, { max: 2, onnotice: () => {} });
}, 60_000);
afterAll(async () => {
  await sql?.end();
  await a?.stop();
  await b?.stop();
  await db?.drop();
});

let counter = 0;
function freshNamespace(): string {
  counter += 1;
  return `ns-${counter}-${Date.now()}`;
}
const tasksPath = (ns: string) => `/v1/tenants/acme/namespaces/${ns}/tasks`;

/** What these tests read of a reply body: a snapshot, a problem, or a batch's items. */
interface ReplyBody {
  task_id?: string;
  status?: number;
  code?: string;
  state?: string;
  results: ReplyBody[];
}

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: ReplyBody;
}

/** A raw POST over a socket: exact body bytes and header bytes (latin1 per character). */
function rawPost(
  base: string,
  path: string,
  body: string,
  headers: Record<string, string | string[]> = {},
): Promise<Reply> {
  const url = new URL(path, base);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: text.length > 0 ? JSON.parse(text) : undefined,
          });
        });
      },
    );
    req.on('error', reject);
    req.end(Buffer.from(body, 'utf8'));
  });
}

async function listCount(ns: string): Promise<number> {
  const res = await fetch(`${a.url}${tasksPath(ns)}?limit=500`);
  const page = (await res.json()) as { tasks: unknown[] };
  return page.tasks.length;
}

function command(ns: string, key: string, data: string, extra = ''): string {
  return `{"idempotency_key":${JSON.stringify(key)},"input":{"tenant_id":"acme","namespace":${JSON.stringify(ns)},"queue":"q","program":{"name":"p"},"data":${data}${extra}}}`;
}

describe('replays spelled differently (DESIGN §1.3, §5: same canonical command → 200)', () => {
  it('key order, whitespace, number spellings and string escapes replay the same task', async () => {
    const ns = freshNamespace();
    const key = 'k-spell';
    const first = await rawPost(
      a.url,
      tasksPath(ns),
      command(ns, key, '{"n":1,"m":-0,"s":"é😀","x":[1.5]}'),
    );
    expect(first.status).toBe(201);
    const variants = [
      // whitespace and key order
      `{ "input" : { "data" : { "x":[ 1.5 ], "s":"é😀", "m":-0, "n":1 }, "program":{"name":"p"}, "queue":"q", "namespace":${JSON.stringify(ns)}, "tenant_id":"acme" }, "idempotency_key" : "${key}" }`,
      command(ns, key, '{"n":1.0,"m":0,"s":"\\u00e9\\ud83d\\ude00","x":[15e-1]}'),
      command(ns, key, '{"n":1e0,"m":-0.0,"s":"é😀","x":[0.15E1]}'),
    ];
    for (const body of variants) {
      const again = await rawPost(b.url, tasksPath(ns), body);
      expect([again.status, again.body.task_id]).toEqual([200, first.body.task_id]);
      expect(again.headers.location).toBeUndefined();
    }
    expect(await listCount(ns)).toBe(1);
  });

  it('NFC vs NFD data is another command: 409 conflict, nothing written', async () => {
    const ns = freshNamespace();
    const first = await rawPost(a.url, tasksPath(ns), command(ns, 'k-nf', '"\u00e9"'));
    expect(first.status).toBe(201);
    const nfd = await rawPost(a.url, tasksPath(ns), command(ns, 'k-nf', '"e\u0301"'));
    expect([nfd.status, nfd.body.code]).toEqual([409, 'conflict']);
    expect(await listCount(ns)).toBe(1);
  });

  it('a number beyond 2^53−1 is 400 both on first submit and as a replay', async () => {
    const ns = freshNamespace();
    const first = await rawPost(a.url, tasksPath(ns), command(ns, 'k-big', '9007199254740991'));
    expect(first.status).toBe(201);
    const big = await rawPost(a.url, tasksPath(ns), command(ns, 'k-big', '9007199254740992'));
    expect([big.status, big.body.code]).toEqual([400, 'invalid_input']);
    const frac = await rawPost(a.url, tasksPath(ns), command(ns, 'k-big', '9007199254740991.4'));
    expect([frac.status, frac.body.code]).toEqual([400, 'invalid_input']);
  });
});

describe('defaults', () => {
  it('omitted vs explicit null replay; explicit default values are another command', async () => {
    const ns = freshNamespace();
    const first = await rawPost(a.url, tasksPath(ns), command(ns, 'k-def', 'null'));
    expect(first.status).toBe(201);
    const nulls = await rawPost(
      a.url,
      tasksPath(ns),
      command(ns, 'k-def', 'null', ',"retry":null,"priority":null,"labels":null,"timeout_ms":null'),
    );
    expect(nulls.status).toBe(200);
    const explicit = await rawPost(
      a.url,
      tasksPath(ns),
      command(ns, 'k-def', 'null', ',"priority":0'),
    );
    // record what happens
    expect([explicit.status, explicit.body.code]).toEqual([409, 'conflict']);
  });
});

describe('header key vs body key (DESIGN §6)', () => {
  it('a header key and the same body key name one task', async () => {
    const ns = freshNamespace();
    const body = command(ns, 'k-hdr', '1');
    const noKey = body.replace('"idempotency_key":"k-hdr",', '');
    const viaHeader = await rawPost(a.url, tasksPath(ns), noKey, { 'idempotency-key': 'k-hdr' });
    expect(viaHeader.status).toBe(201);
    const viaBody = await rawPost(b.url, tasksPath(ns), body);
    expect([viaBody.status, viaBody.body.task_id]).toEqual([200, viaHeader.body.task_id]);
    const both = await rawPost(a.url, tasksPath(ns), body, { 'idempotency-key': 'k-hdr' });
    expect([both.status, both.body.code]).toEqual([400, 'invalid_input']);
  });

  it('two Idempotency-Key header lines are refused, not joined into one key', async () => {
    const ns = freshNamespace();
    const noKey = command(ns, 'x', '1').replace('"idempotency_key":"x",', '');
    const two = await rawPost(a.url, tasksPath(ns), noKey, { 'idempotency-key': ['one', 'two'] });
    expect(two.status).toBe(400);
    expect(await listCount(ns)).toBe(0);
  });
});

describe('concurrent first submits on two servers', () => {
  it('exactly one task per key; exactly one 201 with Location, the rest 200 naming it', async () => {
    const ns = freshNamespace();
    const keys = Array.from({ length: 40 }, (_, i) => `race-${i}`);
    const replies = await Promise.all(
      keys.flatMap((key) => [
        rawPost(a.url, tasksPath(ns), command(ns, key, '{"a":1}')),
        rawPost(b.url, tasksPath(ns), command(ns, key, '{ "a" : 1.0 }')),
        rawPost(a.url, tasksPath(ns), command(ns, key, '{"a":1}')),
      ]),
    );
    for (let i = 0; i < keys.length; i++) {
      const group = replies.slice(i * 3, i * 3 + 3);
      const statuses = group.map((r) => r.status).sort();
      expect(statuses).toEqual([200, 200, 201]);
      const ids = new Set(group.map((r) => r.body.task_id));
      expect(ids.size).toBe(1);
      const created = group.find((r) => r.status === 201);
      expect(created?.headers.location).toBe(`${tasksPath(ns)}/${created?.body.task_id}`);
    }
    expect(await listCount(ns)).toBe(keys.length);
  });

  it('concurrent different commands for one key: one wins, the other 409', async () => {
    const ns = freshNamespace();
    const keys = Array.from({ length: 20 }, (_, i) => `race-d-${i}`);
    const replies = await Promise.all(
      keys.flatMap((key) => [
        rawPost(a.url, tasksPath(ns), command(ns, key, '{"a":1}')),
        rawPost(b.url, tasksPath(ns), command(ns, key, '{"a":2}')),
      ]),
    );
    for (let i = 0; i < keys.length; i++) {
      const statuses = replies
        .slice(i * 2, i * 2 + 2)
        .map((r) => r.status)
        .sort();
      expect(statuses).toEqual([201, 409]);
    }
    expect(await listCount(ns)).toBe(keys.length);
  });
});

describe('tasks:batch duplicates', () => {
  it('a key twice in one batch: one task; a differing duplicate is 409', async () => {
    const ns = freshNamespace();
    const c1 = command(ns, 'dup', '{"a":1}');
    const c2 = command(ns, 'dup', '{"a":1.0}');
    const c3 = command(ns, 'dup', '{"a":2}');
    const res = await rawPost(a.url, `${tasksPath(ns)}:batch`, `{"commands":[${c1},${c2},${c3}]}`);
    expect(res.status).toBe(200);
    const [r1, r2, r3] = res.body.results;
    expect(r1?.task_id).toMatch(/^tsk_/);
    expect(r2?.task_id).toBe(r1?.task_id);
    expect([r3?.status, r3?.code]).toEqual([409, 'conflict']);
    expect(await listCount(ns)).toBe(1);
  });

  it('a batch replayed whole answers the same tasks', async () => {
    const ns = freshNamespace();
    const body = `{"commands":[${command(ns, 'b1', '1')},${command(ns, 'b2', '2')}]}`;
    const first = await rawPost(a.url, `${tasksPath(ns)}:batch`, body);
    const again = await rawPost(b.url, `${tasksPath(ns)}:batch`, body);
    expect(again.body.results.map((r) => r.task_id)).toEqual(
      first.body.results.map((r) => r.task_id),
    );
  });
});

describe('replay after terminal', () => {
  it('a cancelled task replays as itself (200, cancelled)', async () => {
    const ns = freshNamespace();
    const first = await rawPost(a.url, tasksPath(ns), command(ns, 'term', '1'));
    const cancel = await rawPost(a.url, `${tasksPath(ns)}/${first.body.task_id}/cancel`, '');
    expect(cancel.status).toBe(200);
    const again = await rawPost(b.url, tasksPath(ns), command(ns, 'term', '1'));
    expect([again.status, again.body.task_id, again.body.state]).toEqual([
      200,
      first.body.task_id,
      'cancelled',
    ]);
    const other = await rawPost(b.url, tasksPath(ns), command(ns, 'term', '2'));
    expect(other.status).toBe(409);
  });
});

describe('rows recorded with a digest (before migration 0002)', () => {
  it('a digest row replays the same command (200) and conflicts on another (409)', async () => {
    const ns = freshNamespace();
    const body = command(ns, 'old', '{"a":[1,2]}', ',"labels":{"t":"x"}');
    const first = await rawPost(a.url, tasksPath(ns), body);
    expect(first.status).toBe(201);
    const parsed = JSON.parse(body);
    await sql`update tasks set command_digest = ${commandDigest(parsed)} where task_id = ${first.body.task_id ?? ''}`;
    const again = await rawPost(
      b.url,
      tasksPath(ns),
      command(ns, 'old', '{ "a":[1.0,2] }', ',"labels":{"t":"x"}'),
    );
    expect([again.status, again.body.task_id]).toEqual([200, first.body.task_id]);
    const other = await rawPost(
      b.url,
      tasksPath(ns),
      command(ns, 'old', '{"a":[1,3]}', ',"labels":{"t":"x"}'),
    );
    expect([other.status, other.body.code]).toEqual([409, 'conflict']);
    // header form of the same command against a digest row
    const noKey = body.replace('"idempotency_key":"old",', '');
    const hdr = await rawPost(a.url, tasksPath(ns), noKey, { 'idempotency-key': 'old' });
    expect([hdr.status, hdr.body.task_id]).toEqual([200, first.body.task_id]);
  });
});

describe('races on the transaction path (available_at / concurrency_key)', () => {
  it('concurrent first submits with available_at or a concurrency key: one task, one 201', async () => {
    const ns = freshNamespace();
    const keys = Array.from({ length: 30 }, (_, i) => `race-t-${i}`);
    const extra = (i: number) =>
      i % 2 === 0 ? ',"available_at":1' : ',"concurrency_key":"ck","concurrency_limit":2';
    const replies = await Promise.all(
      keys.flatMap((key, i) => [
        rawPost(a.url, tasksPath(ns), command(ns, key, '{"a":1}', extra(i))),
        rawPost(b.url, tasksPath(ns), command(ns, key, '{"a":1}', extra(i))),
        rawPost(b.url, tasksPath(ns), command(ns, key, '{"a":1}', extra(i))),
      ]),
    );
    for (let i = 0; i < keys.length; i++) {
      const group = replies.slice(i * 3, i * 3 + 3);
      expect(group.map((r) => r.status).sort()).toEqual([200, 200, 201]);
      expect(new Set(group.map((r) => r.body.task_id)).size).toBe(1);
    }
    expect(await listCount(ns)).toBe(keys.length);
  });

  it('two batches with overlapping keys in opposite orders: every item answered 2xx, one task per key', async () => {
    const ns = freshNamespace();
    for (let round = 0; round < 3; round++) {
      const keys = Array.from({ length: 200 }, (_, i) => `ov-${round}-${i}`);
      const forward = `{"commands":[${keys.map((k) => command(ns, k, '1')).join(',')}]}`;
      const backward = `{"commands":[${[...keys]
        .reverse()
        .map((k) => command(ns, k, '1'))
        .join(',')}]}`;
      const [x, y] = await Promise.all([
        rawPost(a.url, `${tasksPath(ns)}:batch`, forward),
        rawPost(b.url, `${tasksPath(ns)}:batch`, backward),
      ]);
      expect([x.status, y.status]).toEqual([200, 200]);
      const bad = [...x.body.results, ...y.body.results].filter((r) => r.task_id === undefined);
      expect(bad).toEqual([]);
      const ids = new Map<string, string>();
      for (const [i, k] of keys.entries()) ids.set(k, x.body.results[i]?.task_id ?? '');
      for (const [i, k] of [...keys].reverse().entries()) {
        expect(y.body.results[i]?.task_id).toBe(ids.get(k));
      }
    }
  }, 60_000);
});

describe('Location and reply equality', () => {
  it('the Location of a 201 resolves to the created task, whatever the scope text', async () => {
    for (const ns of ['a b', 'a/b', 'a%2Fb', 'q?x=1', 'é#1', 'a+b']) {
      const path = `/v1/tenants/acme/namespaces/${encodeURIComponent(ns)}/tasks`;
      const created = await rawPost(a.url, path, command(ns, `loc-${Date.now()}`, '1'));
      expect([ns, created.status]).toEqual([ns, 201]);
      const location = created.headers.location as string;
      const got = await fetch(`${a.url}${location}`);
      const body = (await got.json()) as { task_id?: string };
      expect([ns, got.status, body.task_id]).toEqual([ns, 200, created.body.task_id]);
    }
  });

  it('a replay answers the same snapshot as the 201 did (a fresh task)', async () => {
    const ns = freshNamespace();
    const body = command(
      ns,
      'eq',
      '{"z":[1e15,-0,1.5e-7,"\\u2028x"],"a":{"10":1,"9":2,"b":{"k":1}}}',
      ',"labels":{"b":"1","a":"2"},"retry":{"max_attempts":2,"delay_ms":5},"priority":3,"delay_ms":100000',
    ).replace(
      '}}',
      '},"origin_trace":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}',
    );
    const first = await rawPost(a.url, tasksPath(ns), body);
    expect(first.status).toBe(201);
    const again = await rawPost(b.url, tasksPath(ns), body);
    expect(again.status).toBe(200);
    expect(again.body).toEqual(first.body);
    const inspected = await fetch(`${a.url}${tasksPath(ns)}/${first.body.task_id}/snapshot`);
    expect(await inspected.json()).toEqual(first.body);
  });
});
