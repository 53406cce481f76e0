/**
 * Lease recovery at scale on three in-process server replicas (DESIGN §5 Lease
 * expiry, §7, §8 terminal hook, §11). 2 000 claimed tasks whose leases all lapse together, in four
 * kinds: dispatched (fail, lease_expired), never dispatched (re-queued: the attempt does not
 * count), dispatched and cancel-requested (cancelled), and settled with `quiescence: unconfirmed`
 * (held to the authority deadline, then the held success applies). Each is recovered exactly
 * once across the replicas, in passes of at most MAX_RECOVERY_BATCH, the history records it once,
 * completion deliveries of the tasks recovery made terminal go out, and other traffic is served
 * meanwhile.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { MAX_RECOVERY_BATCH } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

// biome-ignore lint/suspicious/noExplicitAny: loose JSON replies
type Loose = any;

const SCOPE = { tenant_id: 'acme', namespace: 'rscale' };
const BASE = `/v1/tenants/${SCOPE.tenant_id}/namespaces/${SCOPE.namespace}`;

let db: TestDatabase;
let sql: postgres.Sql;
const servers: RunningServer[] = [];
const logs: Record<string, unknown>[][] = [];

// Completion receiver: acknowledges every event, keeps the webhook ids and task ids.
const received: { id: string; body: Loose }[] = [];
const receiver: Server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const id = req.headers['webhook-id'];
    let body: Loose = null;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {}
    if (typeof id === 'string') received.push({ id, body });
    res.writeHead(204).end();
  });
});

async function call<T = Loose>(
  url: string,
  path: string,
  body?: unknown,
  method = body === undefined ? 'GET' : 'POST',
): Promise<{ status: number; body: T }> {
  const response = await fetch(`${url}${path}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: (text === '' ? null : JSON.parse(text)) as T };
}

async function until(check: () => Promise<boolean>, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

beforeAll(async () => {
  const port: number = await new Promise((resolve) => {
    receiver.listen(0, '127.0.0.1', () => resolve((receiver.address() as AddressInfo).port));
  });
  db = await createTestDatabase({ prefix: 'recovery_scale' });
  sql = postgres(db.url, { max: 2, onnotice: () => {} });
  const env = {
    DATABASE_URL: db.url,
    PORT: '0',
    LEDGENCE_LEASE_DURATION_MS: '6000',
    LEDGENCE_RENEW_INTERVAL_MS: '1000',
    LEDGENCE_CLEANUP_GRACE_MS: '1000',
    LEDGENCE_LEASE_SAFETY_MARGIN_MS: '500',
    LEDGENCE_MAINTENANCE_INTERVAL_MS: '10',
    LEDGENCE_RETENTION_INTERVAL_MS: '600000',
    LEDGENCE_RESCAN_INTERVAL_MS: '100',
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      sink: {
        url: `http://127.0.0.1:${port}/hook`,
        secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
      },
    }),
  };
  // One at a time: the first migrates.
  for (let k = 0; k < 3; k += 1) {
    const lines: Record<string, unknown>[] = [];
    logs.push(lines);
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => lines.push(JSON.parse(line) as Record<string, unknown>) },
    );
    const config = loadConfig(env, (path) => {
      throw new Error(`no file ${path}`);
    });
    servers.push(await startServer(config, { logger }));
  }
}, 120_000);

afterAll(async () => {
  for (const s of servers) await s.stop();
  await sql?.end();
  await db?.drop();
  await new Promise<void>((resolve) => receiver.close(() => resolve()));
});

type Kind = 'dispatched' | 'undispatched' | 'cancel' | 'held';

it('2 000 lapsed leases on three replicas: each recovered once, in bounded passes, history once, callbacks out, traffic served', async () => {
  const [a, b, c] = servers as [RunningServer, RunningServer, RunningServer];
  const queue = 'lapse';
  const total = 2_000;
  const ids: string[] = [];
  for (let i = 0; i < total; i += 1_000) {
    const commands = Array.from({ length: 1_000 }, (_, k) => ({
      idempotency_key: `lapse-${i + k}`,
      input: {
        ...SCOPE,
        queue,
        program: { name: 'noop' },
        data: { i: i + k },
        timeout_ms: 3_000,
        retry: { max_attempts: 1, delay_ms: 60_000 },
      },
    }));
    const reply = await call(a.url, `${BASE}/tasks:batch`, { commands });
    expect(reply.status).toBe(200);
    ids.push(...reply.body.results.map((r: Loose) => r.task_id as string));
  }
  // Subscriptions on every fifth task (all four kinds).
  const subscribed = ids.filter((_, i) => i % 5 === 0);
  for (let i = 0; i < subscribed.length; i += 50) {
    const replies = await Promise.all(
      subscribed.slice(i, i + 50).map((id) =>
        call(b.url, `${BASE}/tasks/${id}/completion-subscriptions`, {
          subscription_key: 'k',
          destination: 'sink',
        }),
      ),
    );
    expect(replies.map((r) => r.status).every((s) => s === 201)).toBe(true);
  }

  // Claim all, raw; for each batch decide what each claimed task becomes.
  const kindOf = new Map<string, Kind>();
  for (let s = 0; s < 2; s += 1) {
    const session = await call(a.url, '/v1/worker/sessions', {
      scope: SCOPE,
      queue,
      concurrency: 1_000,
    });
    expect(session.status).toBe(200);
    for (let i = 0; i < 1_000; i += 100) {
      const polls = Array.from({ length: 100 }, (_, k) => ({
        scope: SCOPE,
        queue,
        worker_session_id: session.body.id,
        consumer_id: i + k,
        sequence: 1,
      }));
      const acquired = await call(a.url, '/v1/worker/acquire:batch', { commands: polls });
      expect(acquired.status).toBe(200);
      const owners = acquired.body.replies
        .filter((r: Loose) => r.disposition === 'assigned')
        .map((r: Loose) => r.assignment.lease.owner);
      const toDispatch = owners.filter((_: Loose, k: number) => k % 4 !== 1);
      for (const [k, o] of owners.entries()) if (k % 4 === 1) kindOf.set(o.task_id, 'undispatched');
      const renewed = await call(a.url, '/v1/worker/renew:batch', {
        commands: toDispatch.map((o: Loose) => ({ owner: o, sequence: 1, intent: 'dispatch' })),
      });
      expect(renewed.status).toBe(200);
      const granted = toDispatch.filter(
        (_: Loose, k: number) => renewed.body.results[k]?.dispatch_allowed === true,
      );
      for (const o of toDispatch) if (!granted.includes(o)) kindOf.set(o.task_id, 'undispatched');
      const cancels: Loose[] = [];
      const helds: Loose[] = [];
      for (const [k, o] of granted.entries()) {
        if (k % 3 === 0) kindOf.set(o.task_id, 'dispatched');
        else if (k % 3 === 1) cancels.push(o);
        else helds.push(o);
      }
      const cancelled = await Promise.all(
        cancels.map((o) => call(c.url, `${BASE}/tasks/${o.task_id}/cancel`, {})),
      );
      cancels.forEach((o, k) => {
        expect(cancelled[k]?.status).toBe(200);
        kindOf.set(o.task_id, 'cancel');
      });
      if (helds.length > 0) {
        const settled = await call(b.url, '/v1/worker/settle:batch', {
          commands: helds.map((o) => ({
            owner: o,
            operation_id: `s-${o.attempt_id}`,
            report: {
              kind: 'completed',
              report: {
                context: { identity: { task_id: o.task_id, attempt_id: o.attempt_id } },
                outcome: { kind: 'success', output: { ok: true } },
              },
            },
            quiescence: 'unconfirmed',
          })),
        });
        expect(settled.status).toBe(200);
        helds.forEach((o, k) => {
          const r = settled.body.results[k];
          kindOf.set(o.task_id, r?.receipt !== undefined ? 'held' : 'dispatched');
        });
      }
    }
  }
  expect(kindOf.size).toBe(total);

  // Other traffic while the backlog drains: whole lifecycles on another queue, each reply 2xx.
  let draining = true;
  const probeStatuses: number[] = [];
  const probe = (async () => {
    const session = await call(c.url, '/v1/worker/sessions', {
      scope: SCOPE,
      queue: 'probe',
      concurrency: 1,
    });
    let seq = 0;
    let n = 0;
    while (draining) {
      n += 1;
      const submitted = await call(a.url, `${BASE}/tasks`, {
        idempotency_key: `probe-${n}`,
        input: { ...SCOPE, queue: 'probe', program: { name: 'p' }, data: n, timeout_ms: 3_000 },
      });
      probeStatuses.push(submitted.status);
      seq += 1;
      const polled = await call(b.url, '/v1/worker/acquire', {
        scope: SCOPE,
        queue: 'probe',
        worker_session_id: session.body.id,
        consumer_id: 0,
        sequence: seq,
      });
      probeStatuses.push(polled.status);
      const owner = polled.body?.assignment?.lease?.owner;
      if (owner !== undefined) {
        const settled = await call(c.url, '/v1/worker/settle', {
          owner,
          operation_id: `p-${n}`,
          report: {
            kind: 'completed',
            report: {
              context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
              outcome: { kind: 'success', output: null },
            },
          },
          quiescence: 'confirmed',
        });
        probeStatuses.push(settled.status);
      }
    }
  })();

  // Every task of the queue leaves `active` (leases lapse ≤ 4 s after claim).
  try {
    await until(
      async () => {
        const [row] = await sql`select count(*)::int as n from tasks
          where namespace = ${SCOPE.namespace} and queue = ${queue} and state = 'active'`;
        return row?.n === 0;
      },
      90_000,
      'no active task left',
    );
  } finally {
    draining = false;
    await probe;
  }
  // Time for a double recovery to show.
  await new Promise((r) => setTimeout(r, 1_000));

  // Outcomes by kind.
  const expected: Record<Kind, { state: string; lost: number; attemptState: string }> = {
    dispatched: { state: 'failed', lost: 1, attemptState: 'lost' },
    undispatched: { state: 'queued', lost: 1, attemptState: 'lost' },
    cancel: { state: 'cancelled', lost: 1, attemptState: 'lost' },
    held: { state: 'succeeded', lost: 0, attemptState: 'succeeded' },
  };
  const rows = await sql`
    select t.task_id, t.state, t.attempt_count, t.dispatch_count, t.outcome::text as outcome,
      (select count(*)::int from task_history h where h.tenant_id = t.tenant_id
        and h.namespace = t.namespace and h.task_id = t.task_id and h.reason = 'lease_expired') as lost,
      (select count(*)::int from task_history h where h.tenant_id = t.tenant_id
        and h.namespace = t.namespace and h.task_id = t.task_id
        and h.reason in ('failed', 'cancelled', 'succeeded', 'retry_scheduled')) as outcomes,
      (select string_agg(a.state, ',') from attempts a where a.tenant_id = t.tenant_id
        and a.namespace = t.namespace and a.task_id = t.task_id) as attempt_states
    from tasks t where t.namespace = ${SCOPE.namespace} and t.queue = ${queue}`;
  expect(rows.length).toBe(total);
  const wrong: string[] = [];
  const counts: Record<string, number> = {};
  for (const row of rows) {
    const kind = kindOf.get(row.task_id) as Kind;
    counts[kind] = (counts[kind] ?? 0) + 1;
    const want = expected[kind];
    const ok =
      row.state === want.state &&
      row.lost === want.lost &&
      row.outcomes === 1 &&
      row.attempt_count === 1 &&
      row.attempt_states === want.attemptState &&
      (kind !== 'dispatched' || JSON.parse(row.outcome).failure?.kind === 'lease_expired');
    if (!ok) wrong.push(`${kind} ${row.task_id}: ${JSON.stringify(row)}`);
  }
  expect(wrong.slice(0, 5)).toEqual([]);
  for (const kind of Object.keys(expected)) expect(counts[kind] ?? 0).toBeGreaterThan(0);

  // Recovery passes: bounded, and their counts add up across replicas to one per lost lease.
  const passes = logs.flatMap((lines) =>
    lines.filter((l) => l.msg === 'recovered expired leases').map((l) => l.progress as Loose),
  );
  expect(passes.every((p) => p.scanned <= MAX_RECOVERY_BATCH)).toBe(true);
  const sum = (f: string) => passes.reduce((n, p) => n + Number(p[f]), 0);
  const lostKinds = (counts.dispatched ?? 0) + (counts.undispatched ?? 0) + (counts.cancel ?? 0);
  expect(sum('recovered')).toBe(lostKinds);
  expect(sum('failed')).toBe(counts.dispatched ?? 0);
  expect(sum('requeued')).toBe(counts.undispatched ?? 0);
  expect(sum('cancelled')).toBe(counts.cancel ?? 0);
  // Passes on more than one replica (they share the backlog).
  expect(
    logs.filter((lines) => lines.some((l) => l.msg === 'recovered expired leases')).length,
  ).toBeGreaterThan(1);

  // Other traffic was served throughout.
  expect(probeStatuses.length).toBeGreaterThan(0);
  expect(probeStatuses.filter((s) => s >= 300)).toEqual([]);

  // Completion deliveries of every subscribed task recovery made terminal go out once.
  const terminalSubscribed = subscribed.filter((id) => kindOf.get(id) !== 'undispatched');
  await until(
    async () => new Set(received.map((r) => r.id)).size >= terminalSubscribed.length,
    60_000,
    'every completion delivered',
  );
  await new Promise((r) => setTimeout(r, 500));
  expect(new Set(received.map((r) => r.id)).size).toBe(terminalSubscribed.length);
  const [pending] = await sql`select count(*)::int as n from completion_deliveries d
    join tasks t on t.tenant_id = d.tenant_id and t.namespace = d.namespace and t.task_id = d.task_id
    where t.state = 'queued' and d.state <> 'waiting'`;
  expect(pending?.n).toBe(0);
}, 300_000);

it('a replica stopped mid-drain stops within its pass; the others finish; each lease lost once', async () => {
  const [a] = servers as [RunningServer];
  // A fourth replica, stopped while the backlog drains.
  const config = loadConfig(
    {
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_LEASE_DURATION_MS: '1000',
      LEDGENCE_RENEW_INTERVAL_MS: '250',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '10',
      LEDGENCE_RETENTION_INTERVAL_MS: '600000',
    },
    (path) => {
      throw new Error(`no file ${path}`);
    },
  );
  const extra = await startServer(config, { logger: pino({ level: 'silent' }) });
  const queue = 'lapse-stop';
  const total = 1_000;
  const commands = Array.from({ length: total }, (_, k) => ({
    idempotency_key: `stop-${k}`,
    input: {
      ...SCOPE,
      queue,
      program: { name: 'noop' },
      data: k,
      retry: { max_attempts: 3, delay_ms: 60_000 },
    },
  }));
  const submitted = await call(a.url, `${BASE}/tasks:batch`, { commands });
  expect(submitted.status).toBe(200);
  expect(JSON.stringify(submitted.body.results[0]).slice(0, 300)).toContain('task_id');
  const session = await call(extra.url, '/v1/worker/sessions', {
    scope: SCOPE,
    queue,
    concurrency: 1_000,
  });
  for (let i = 0; i < total; i += 250) {
    const polls = Array.from({ length: 250 }, (_, k) => ({
      scope: SCOPE,
      queue,
      worker_session_id: session.body.id,
      consumer_id: i + k,
      sequence: 1,
    }));
    const acquired = await call(extra.url, '/v1/worker/acquire:batch', { commands: polls });
    expect(acquired.status).toBe(200);
    expect(JSON.stringify(acquired.body.replies[0]).slice(0, 300)).toContain('assigned');
  }
  const [claimed] = await sql`select count(*)::int as n from attempts a join tasks t
    using (tenant_id, namespace, task_id) where t.queue = ${queue}`;
  expect(claimed?.n).toBe(total);
  // Stop the fourth replica once recovery has begun on the queue.
  await until(
    async () => {
      const [row] = await sql`select count(*)::int as n from task_history h join tasks t
        using (tenant_id, namespace, task_id) where t.queue = ${queue} and h.reason = 'lease_expired'`;
      return (row?.n ?? 0) > 0;
    },
    60_000,
    'recovery started',
  );
  await extra.stop();
  await until(
    async () => {
      const [row] = await sql`select count(*)::int as n from tasks
        where queue = ${queue} and state = 'active'`;
      return row?.n === 0;
    },
    60_000,
    'drained by the others',
  );
  await new Promise((r) => setTimeout(r, 1_000));
  const [dup] = await sql`select count(*)::int as n from (
    select h.task_id from task_history h join tasks t using (tenant_id, namespace, task_id)
    where t.queue = ${queue} and h.reason = 'lease_expired' group by 1 having count(*) <> 1) d`;
  expect(dup?.n).toBe(0);
  const states = await sql`select state, attempt_count, dispatch_count, count(*)::int as n
    from tasks where queue = ${queue} group by 1, 2, 3`;
  expect(states.map((r) => ({ ...r }))).toEqual([
    { state: 'queued', attempt_count: 1, dispatch_count: 0, n: total },
  ]);
}, 180_000);
