/**
 * DESIGN §12 / §4.1 limits at their exact edges over the REAL server (startServer,
 * real sockets, real PostgreSQL), where app.request() tests cannot reach: the Content-Length and
 * chunked body paths at exactly the route limit with UTF-8 split across chunks, the longest legal
 * request target under REQUEST_HEADER_MAX_BYTES, JSON depth inside the deepest batch envelopes,
 * idempotent replays of over-limit requests, and the history page limit.
 */
import type { Assignment } from '@ledgence/contracts';
import {
  HISTORY_PAGE_LIMIT,
  JSON_MAX_DEPTH,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  MAX_COMPLETION_SUBSCRIPTIONS,
  MAX_LABELS,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
  MIN_RETENTION_MS,
  NAME_MAX_BYTES,
  OUTPUT_MAX_BYTES,
  REQUEST_TARGET_MAX_BYTES,
  SCOPE_TEXT_MAX_BYTES,
  SUBMISSION_DATA_MAX_BYTES,
  SUBMISSION_MAX_BYTES,
  TASK_CURSOR_MAX_BYTES,
  TASK_PAGE_MAX_BYTES,
  TASK_STATUS_MAX_BYTES,
} from '@ledgence/contracts';
import {
  renewCommand,
  settleApplicationError,
  settleSuccess,
  submitCommandWithStatusBytes,
} from '@ledgence/core/testing';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

/** Text of exactly `bytes` UTF-8 bytes whose every byte is percent-escaped in a URL. */
const escText = (bytes: number) => 'é'.repeat(Math.floor(bytes / 2)) + '%'.repeat(bytes % 2);

const KEY = 'limits-acme-key-0123456789abcdef';
const LONG_KEY = 'limits-long-key-0123456789abcdef';
const LONG_TENANT = escText(SCOPE_TEXT_MAX_BYTES);

const server = keyedServer('limits_socket', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
    { key: LONG_KEY, tenant: LONG_TENANT, namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    billing: {
      url: 'http://127.0.0.1:9/hooks',
      secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
      timeout_ms: 1000,
    },
  }),
});
const api = server.as(KEY);

const scopePath = (tenant: string, ns: string) =>
  `/v1/tenants/${encodeURIComponent(tenant)}/namespaces/${encodeURIComponent(ns)}`;

function command(ns: string, key: string, extra: Record<string, unknown> = {}) {
  return {
    idempotency_key: key,
    input: {
      tenant_id: 'acme',
      namespace: ns,
      queue: 'q',
      program: { name: 'p' },
      data: 1,
      ...extra,
    },
  };
}

/** Everything a namespace holds (page, snapshots, histories): a refusal must leave it unchanged. */
async function dump(ns: string): Promise<string> {
  const page = await api.get(`${scopePath('acme', ns)}/tasks?limit=500`);
  const out: unknown[] = [page.status, page.body];
  for (const t of page.body.tasks) {
    out.push((await api.get(`${scopePath('acme', ns)}/tasks/${t.task_id}/snapshot`)).body);
    out.push((await api.get(`${scopePath('acme', ns)}/tasks/${t.task_id}/history`)).body);
  }
  return JSON.stringify(out);
}

/** POSTs `body` as chunked transfer encoding, written in `chunkBytes`-byte pieces. */
const postChunked = (path: string, body: Buffer, chunkBytes: number) =>
  server.send({
    method: 'POST',
    path,
    key: KEY,
    headers: { 'content-type': 'application/json' },
    body,
    chunkBytes,
  });

/** A GET over node:http with ordinary client headers, for a request target of any length. */
const rawGet = (path: string, key: string) =>
  server.send({
    method: 'GET',
    path,
    key,
    headers: { accept: 'application/json', 'user-agent': 'ledgence-test/1.0 (node)' },
  });

/** A submit body of exactly SUBMISSION_MAX_BYTES (+ `extra`) with data of exactly 1 MiB of 'é'. */
function submitBodyAtLimit(ns: string, key: string, extra = 0): Buffer {
  // "é…é" compact is 2 + 2n bytes.
  const data = 'é'.repeat((SUBMISSION_DATA_MAX_BYTES - 2) / 2);
  const text = JSON.stringify(command(ns, key, { data }));
  const pad = SUBMISSION_MAX_BYTES + extra - Buffer.byteLength(text);
  expect(pad).toBeGreaterThan(0);
  const body = Buffer.from(text + ' '.repeat(pad), 'utf8');
  expect(body.length).toBe(SUBMISSION_MAX_BYTES + extra);
  return body;
}

describe('SUBMISSION_MAX_BYTES over a real socket (DESIGN §6: the body limit is enforced while reading)', () => {
  const ns = 'body-edge';
  const path = `${scopePath('acme', ns)}/tasks`;

  it('a body of exactly the limit with Content-Length is 201, and its multi-byte data is stored unchanged', async () => {
    const body = submitBodyAtLimit(ns, 'cl-at');
    const reply = await server.send({
      method: 'POST',
      path,
      key: KEY,
      headers: { 'content-type': 'application/json' },
      body,
    });
    expect(reply.status).toBe(201);
    expect(reply.body.input.data).toBe('é'.repeat((SUBMISSION_DATA_MAX_BYTES - 2) / 2));
  });

  it('a body of exactly the limit sent chunked, chunks splitting UTF-8 characters, is 201', async () => {
    const reply = await postChunked(path, submitBodyAtLimit(ns, 'chunked-at'), 65_537);
    expect(reply.status).toBe(201);
    expect(reply.body.input.data).toBe('é'.repeat((SUBMISSION_DATA_MAX_BYTES - 2) / 2));
  });

  it('one byte past the limit, chunked or with Content-Length, is 413 payload_too_large and writes nothing', async () => {
    const before = await dump(ns);
    const chunked = await postChunked(path, submitBodyAtLimit(ns, 'chunked-over', 1), 65_537);
    expect([chunked.status, chunked.body?.code]).toEqual([413, 'payload_too_large']);
    const declared = await server.send({
      method: 'POST',
      path,
      key: KEY,
      headers: { 'content-type': 'application/json' },
      body: submitBodyAtLimit(ns, 'cl-over', 1),
    });
    expect([declared.status, declared.body?.code]).toEqual([413, 'payload_too_large']);
    expect(await dump(ns)).toBe(before);
    // The refused keys were reserved by nothing: a valid submit under each creates (201).
    for (const key of ['chunked-over', 'cl-over']) {
      expect((await api.post(path, command(ns, key))).status).toBe(201);
    }
  });
});

describe('idempotent replays of over-limit requests', () => {
  it('a replay of an accepted submit whose data is now one byte over is 413 and changes nothing', async () => {
    const ns = 'replay-over';
    const path = `${scopePath('acme', ns)}/tasks`;
    const first = await api.post(path, command(ns, 'k1'));
    expect(first.status).toBe(201);
    const before = await dump(ns);
    for (const [name, extra, status] of [
      ['data', { data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 1) }, 413],
      [
        'labels',
        {
          labels: Object.fromEntries(
            Array.from({ length: MAX_LABELS + 1 }, (_, i) => [`k${i}`, 'v']),
          ),
        },
        400,
      ],
      ['queue', { queue: 'q'.repeat(NAME_MAX_BYTES + 1) }, 400],
    ] as const) {
      const replay = await api.post(path, command(ns, 'k1', extra));
      expect([name, replay.status, replay.body?.code]).toEqual([
        name,
        status,
        status === 413 ? 'payload_too_large' : 'invalid_input',
      ]);
    }
    // Also with the Idempotency-Key header form.
    const header = await server.send({
      method: 'POST',
      path,
      key: KEY,
      headers: { 'content-type': 'application/json', 'idempotency-key': 'k1' },
      body: JSON.stringify({
        input: command(ns, 'k1', { data: 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 1) }).input,
      }),
    });
    expect([header.status, header.body?.code]).toEqual([413, 'payload_too_large']);
    expect(await dump(ns)).toBe(before);
    // The original replays as it was.
    const again = await api.post(path, command(ns, 'k1'));
    expect([again.status, again.body.task_id]).toEqual([200, first.body.task_id]);
  });
});

/** A value nested `depth` arrays deep (depth 1 = `[0]`). */
function nested(depth: number): unknown[] {
  let v: unknown[] = [0];
  for (let i = 1; i < depth; i++) v = [v];
  return v;
}

async function assignedOwner(ns: string, key: string) {
  const scope = { tenant_id: 'acme', namespace: ns };
  const created = await api.post(`${scopePath('acme', ns)}/tasks`, command(ns, key));
  expect(created.status).toBe(201);
  const session = await api.post('/v1/worker/sessions', { scope, queue: 'q', concurrency: 1 });
  expect(session.status).toBe(200);
  const reply = await api.post('/v1/worker/acquire', {
    scope,
    queue: 'q',
    worker_session_id: session.body.id,
    consumer_id: 0,
    sequence: 1,
  });
  expect(reply.body.disposition).toBe('assigned');
  const assignment: Assignment = reply.body.assignment;
  const renew = await api.post('/v1/worker/renew', renewCommand(assignment, 1, 'dispatch'));
  expect(renew.status).toBe(200);
  return { assignment, taskId: created.body.task_id as string };
}

describe(`JSON_MAX_DEPTH (${JSON_MAX_DEPTH}) inside the deepest envelopes (COMMAND_MAX_DEPTH), over a real socket`, () => {
  it('settle:batch: output of depth 64 is settled; depth 65 is its item’s 400 and leaves the attempt open', async () => {
    const ns = 'depth-output';
    const a = await assignedOwner(ns, 'a');
    const before = await dump(ns);
    const over = await api.post('/v1/worker/settle:batch', {
      commands: [
        settleSuccess(a.assignment, nested(JSON_MAX_DEPTH + 1), { operation_id: 'op-over' }),
      ],
    });
    expect(over.status).toBe(200);
    expect([over.body.results[0].status, over.body.results[0].code]).toEqual([
      400,
      'invalid_input',
    ]);
    expect(await dump(ns)).toBe(before);
    const at = await api.post('/v1/worker/settle:batch', {
      commands: [settleSuccess(a.assignment, nested(JSON_MAX_DEPTH), { operation_id: 'op-at' })],
    });
    expect(at.status).toBe(200);
    expect(at.body.results[0].task_state).toBe('succeeded');
    const result = await api.get(`${scopePath('acme', ns)}/tasks/${a.taskId}/result`);
    expect(result.body.outcome).toEqual({ state: 'succeeded', output: nested(JSON_MAX_DEPTH) });
  });

  it('settle:batch: error details of depth 64 are settled (the deepest envelope: 71 levels)', async () => {
    const ns = 'depth-details';
    const a = await assignedOwner(ns, 'a');
    const error = { code: 'E', message: 'm', details: nested(JSON_MAX_DEPTH), retryable: false };
    const at = await api.post('/v1/worker/settle:batch', {
      commands: [settleApplicationError(a.assignment, error, { operation_id: 'op' })],
    });
    expect(at.status).toBe(200);
    expect(at.body.results[0].task_state).toBe('failed');
    const result = await api.get(`${scopePath('acme', ns)}/tasks/${a.taskId}/result`);
    expect(result.body.outcome.failure.error.details).toEqual(nested(JSON_MAX_DEPTH));
  });

  it('tasks:batch: data of depth 64 is queued, depth 65 is its item’s 400 alone', async () => {
    const ns = 'depth-data';
    const reply = await api.post(`${scopePath('acme', ns)}/tasks:batch`, {
      commands: [
        command(ns, 'at', { data: nested(JSON_MAX_DEPTH) }),
        command(ns, 'over', { data: nested(JSON_MAX_DEPTH + 1) }),
      ],
    });
    expect(reply.status).toBe(200);
    expect(reply.body.results[0].state).toBe('queued');
    expect([reply.body.results[1].status, reply.body.results[1].code]).toEqual([
      400,
      'invalid_input',
    ]);
    const page = await api.get(`${scopePath('acme', ns)}/tasks`);
    expect(page.body.tasks).toHaveLength(1);
  });

  it('settle (single) replay of an accepted operation with an over-limit output is 413, and the result is unchanged', async () => {
    const ns = 'settle-replay-over';
    const a = await assignedOwner(ns, 'a');
    const ok = await api.post(
      '/v1/worker/settle',
      settleSuccess(a.assignment, 1, { operation_id: 'op' }),
    );
    expect(ok.status).toBe(200);
    const before = await dump(ns);
    const over = await api.post(
      '/v1/worker/settle',
      settleSuccess(a.assignment, 'd'.repeat(OUTPUT_MAX_BYTES - 1), { operation_id: 'op' }),
    );
    expect([over.status, over.body.code]).toEqual([413, 'payload_too_large']);
    expect(await dump(ns)).toBe(before);
  });
});

describe('REQUEST_HEADER_MAX_BYTES admits the longest legal request target (limits.ts JSDoc)', () => {
  it('the second page of a listing by a task’s own labels at their largest, every filter at its limit, is served', async () => {
    const ns = escText(SCOPE_TEXT_MAX_BYTES);
    const scope = { tenant_id: LONG_TENANT, namespace: ns };
    const base = scopePath(LONG_TENANT, ns);
    const labels: Record<string, string> = {};
    for (let i = 0; i < MAX_LABELS; i++) {
      labels[`${String(i).padStart(2, '0')}${escText(LABEL_KEY_MAX_BYTES - 2)}`] =
        escText(LABEL_VALUE_MAX_BYTES);
    }
    const queue = escText(NAME_MAX_BYTES);
    const program = escText(NAME_MAX_BYTES);
    const long = server.as(LONG_KEY);
    for (const k of ['a', 'b', 'c']) {
      const created = await long.post(`${base}/tasks`, {
        idempotency_key: k,
        input: { ...scope, queue, program: { name: program }, data: 1, labels },
      });
      expect(created.status).toBe(201);
    }
    const filters =
      Object.entries(labels)
        .map(([k, v]) => `label.${encodeURIComponent(k)}=${encodeURIComponent(v)}`)
        .join('&') +
      `&queue=${encodeURIComponent(queue)}&program=${encodeURIComponent(program)}` +
      `&state=queued&submitted_from=0000000000000000&submitted_until=8999999999999999`;
    const first = await rawGet(`${base}/tasks?${filters}&limit=1`, LONG_KEY);
    expect(first.status).toBe(200);
    expect(first.body.tasks).toHaveLength(1);
    const cursor: string = first.body.next_cursor;
    expect(typeof cursor).toBe('string');
    // Pad the issued cursor with JSON whitespace to exactly TASK_CURSOR_MAX_BYTES.
    const payload = Buffer.from(cursor, 'base64url').toString('utf8');
    const width = (TASK_CURSOR_MAX_BYTES / 4) * 3;
    const padded = Buffer.from(
      `${payload.slice(0, -1)}${' '.repeat(width - payload.length)}${payload.slice(-1)}`,
      'utf8',
    ).toString('base64url');
    expect(padded).toHaveLength(TASK_CURSOR_MAX_BYTES);
    const target = `${base}/tasks?${filters}&limit=500&cursor=${padded}`;
    expect(target.length).toBeLessThanOrEqual(REQUEST_TARGET_MAX_BYTES);
    const second = await rawGet(target, LONG_KEY);
    expect([second.status, second.body?.code]).toEqual([200, undefined]);
    expect(second.body.tasks).toHaveLength(2);
    // With workflow_id at its limit too (matches nothing, the cursor then names other filters):
    // the app answers it (not the parser's 413 header_too_large).
    const widest = `${base}/tasks?${filters}&workflow_id=${encodeURIComponent(escText(NAME_MAX_BYTES))}&limit=500&cursor=${padded}`;
    expect(widest.length).toBeLessThanOrEqual(REQUEST_TARGET_MAX_BYTES);
    const reply = await rawGet(widest, LONG_KEY);
    expect(reply.status).not.toBe(413);
    expect(reply.body?.reason).not.toBe('header_too_large');
  });
});

describe(`HISTORY_PAGE_LIMIT (${HISTORY_PAGE_LIMIT}) over HTTP`, () => {
  it('a history of more than the limit is served in pages of at most the limit, contiguous by sequence', async () => {
    const ns = 'history-page';
    const scope = { tenant_id: 'acme', namespace: ns };
    const created = await api.post(
      `${scopePath('acme', ns)}/tasks`,
      command(ns, 'h', { retry: { max_attempts: 100, delay_ms: 0 } }),
    );
    expect(created.status).toBe(201);
    const taskId = created.body.task_id as string;
    const historyPath = `${scopePath('acme', ns)}/tasks/${taskId}/history`;
    const session = await api.post('/v1/worker/sessions', { scope, queue: 'q', concurrency: 1 });
    let sequence = 0;
    let events = 0;
    while (events <= HISTORY_PAGE_LIMIT) {
      sequence++;
      const reply = await api.post('/v1/worker/acquire', {
        scope,
        queue: 'q',
        worker_session_id: session.body.id,
        consumer_id: 0,
        sequence,
      });
      expect(reply.body.disposition).toBe('assigned');
      const assignment: Assignment = reply.body.assignment;
      expect(
        (await api.post('/v1/worker/renew', renewCommand(assignment, 1, 'dispatch'))).status,
      ).toBe(200);
      const settled = await api.post(
        '/v1/worker/settle',
        settleApplicationError(
          assignment,
          { code: 'E', message: 'm', retryable: true },
          { operation_id: `op-${sequence}` },
        ),
      );
      expect(settled.status).toBe(200);
      const snap = await api.get(`${scopePath('acme', ns)}/tasks/${taskId}/snapshot`);
      expect(snap.body.state).toBe('queued');
      // Count all events by paging.
      events = 0;
      let after = 0;
      for (;;) {
        const page = await api.get(`${historyPath}?after_sequence=${after}`);
        expect(page.status).toBe(200);
        expect(page.body.length).toBeLessThanOrEqual(HISTORY_PAGE_LIMIT);
        if (page.body.length === 0) break;
        events += page.body.length;
        after = page.body[page.body.length - 1].sequence;
      }
    }
    const first = await api.get(historyPath);
    expect(first.body).toHaveLength(HISTORY_PAGE_LIMIT);
    const seqs = first.body.map((e: { sequence: number }) => e.sequence);
    expect(seqs).toEqual(Array.from({ length: HISTORY_PAGE_LIMIT }, (_, i) => seqs[0] + i));
    const rest = await api.get(`${historyPath}?after_sequence=${seqs[seqs.length - 1]}`);
    expect(rest.body.length).toBe(events - HISTORY_PAGE_LIMIT);
    expect(rest.body[0].sequence).toBe(seqs[seqs.length - 1] + 1);
  });
});

describe('retention policy limits over the real server (DESIGN §12 MIN_RETENTION_MS; MAX_RETENTION_MS, MAX_RETENTION_BATCH)', () => {
  it('MIN and MAX are stored in PostgreSQL and read back; one past either is 400 and changes nothing; preview limit edges', async () => {
    const policy = `${scopePath('acme', 'retention-edges')}/retention-policy`;
    const put = (retention_ms: number) =>
      server.send({
        method: 'PUT',
        path: policy,
        key: KEY,
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ retention_ms }),
      });
    for (const ms of [MAX_RETENTION_MS, MIN_RETENTION_MS]) {
      const ok = await put(ms);
      expect([ms, ok.status, ok.body?.retention_ms]).toEqual([ms, 200, ms]);
      expect((await api.get(policy)).body.retention_ms).toBe(ms);
    }
    const before = (await api.get(policy)).body;
    for (const ms of [MIN_RETENTION_MS - 1, MAX_RETENTION_MS + 1]) {
      const refused = await put(ms);
      expect([ms, refused.status, refused.body?.code]).toEqual([ms, 400, 'invalid_input']);
    }
    expect((await api.get(policy)).body).toEqual(before);
    const at = await api.get(`${policy}/preview?limit=${MAX_RETENTION_BATCH}`);
    expect(at.status).toBe(200);
    for (const limit of [0, MAX_RETENTION_BATCH + 1]) {
      const over = await api.get(`${policy}/preview?limit=${limit}`);
      expect([limit, over.status, over.body?.code]).toEqual([limit, 400, 'invalid_input']);
    }
  });
});

describe('TASK_PAGE_MAX_BYTES over PostgreSQL and a real socket', () => {
  it('pages of the widest statuses are at most the limit as received, and together list every task once', async () => {
    const ns = 'page-bytes';
    const scope = { tenant_id: 'acme', namespace: ns };
    const count = 200;
    const commands = Array.from({ length: count }, (_, i) =>
      submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES, { idempotency_key: `w-${i}` }),
    );
    const submitted = await api.post(`${scopePath('acme', ns)}/tasks:batch`, { commands });
    expect(submitted.status).toBe(200);
    expect(submitted.body.results.every((r: { state?: string }) => r.state === 'queued')).toBe(
      true,
    );
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const reply = await api.get(
        `${scopePath('acme', ns)}/tasks?limit=500${cursor === undefined ? '' : `&cursor=${cursor}`}`,
      );
      expect(reply.status).toBe(200);
      expect(reply.bytes).toBeLessThanOrEqual(TASK_PAGE_MAX_BYTES);
      for (const t of reply.body.tasks) {
        expect(Buffer.byteLength(JSON.stringify(t))).toBeLessThanOrEqual(TASK_STATUS_MAX_BYTES);
        seen.push(t.task_id);
      }
      cursor = reply.body.next_cursor;
      pages++;
    } while (cursor !== undefined);
    expect(pages).toBeGreaterThan(1);
    expect(new Set(seen).size).toBe(count);
    expect(seen).toHaveLength(count);
  });
});

describe('MAX_COMPLETION_SUBSCRIPTIONS over PostgreSQL: replays at the limit', () => {
  it(`with ${MAX_COMPLETION_SUBSCRIPTIONS} subscriptions, a replayed key answers 200 unchanged; a new key is 409 limit_exceeded and writes nothing`, async () => {
    const ns = 'subs-limit';
    const created = await api.post(`${scopePath('acme', ns)}/tasks`, command(ns, 's'));
    expect(created.status).toBe(201);
    const subs = `${scopePath('acme', ns)}/tasks/${created.body.task_id}/completion-subscriptions`;
    const first: unknown[] = [];
    for (let i = 0; i < MAX_COMPLETION_SUBSCRIPTIONS; i++) {
      const reply = await api.post(subs, { subscription_key: `k${i}`, destination: 'billing' });
      expect(reply.status).toBe(201);
      first.push(reply.body);
    }
    const listed = (await api.get(subs)).body;
    expect(listed).toHaveLength(MAX_COMPLETION_SUBSCRIPTIONS);
    const replay = await api.post(subs, { subscription_key: 'k7', destination: 'billing' });
    expect([replay.status, replay.body]).toEqual([200, first[7]]);
    const over = await api.post(subs, { subscription_key: 'k-new', destination: 'billing' });
    expect([over.status, over.body.code]).toEqual([409, 'limit_exceeded']);
    // A known key at the limit with another destination stays a conflict, not limit_exceeded.
    const other = await api.post(subs, { subscription_key: 'k7', destination: 'other' });
    expect(other.status).toBeGreaterThanOrEqual(400);
    expect(other.status).toBeLessThan(500);
    expect((await api.get(subs)).body).toEqual(listed);
  });
});
