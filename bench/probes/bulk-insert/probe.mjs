/**
 * The bulk-submit insert probe (bench/README.md, "The CPU budget of each target"): PostgreSQL's
 * own time for the statement a bulk submit runs — `insertSubmitted` of
 * `packages/store-postgres/src/hot-sql.ts` (copied below as of 2026-12-02; the server sends it
 * in chunks of ~200 rows, here 1 000 rows at a time) — as it is and with one part of its write
 * set taken away at a time, to price each part. Run on the schema of the committed migrations.
 *
 * Usage: DATABASE_URL=postgres://user:password@host:port/postgres node bench/probes/bulk-insert/probe.mjs [ROUNDS]
 * Creates (and drops first) the database probe_bulk_insert on that server. Each configuration
 * starts from empty tables after a CHECKPOINT, runs 15 statements of 1 000 new tasks and reports
 * the median of EXPLAIN ANALYZE's execution time (the executor's, without the commit's WAL
 * flush) and the WAL bytes per task; the configurations alternate within each round.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

const ROWS = 1_000;
const STATEMENTS = 15;
const rounds = Number(process.argv[2] ?? 5);
const admin = process.env.DATABASE_URL;
if (admin === undefined) throw new Error('set DATABASE_URL to a PostgreSQL server (any database)');
const database = 'probe_bulk_insert';

const AS_IS = `with clock as (
      select case when $1::bigint is null then 0::bigint
        else (extract(epoch from now()) * 1000)::bigint + $2::bigint end as base
    ), ins as (
      insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
        input, origin_trace, queue, program, retry, timeout_ms, priority, concurrency_key,
        concurrency_limit, labels, state, submitted_at, available_at, terminal_at, attempt_count,
        dispatch_count, current_attempt_id, cancel_requested_at, outcome, history_sequence)
      select v.tenant_id, v.namespace, v.task_id, v.run_id, v.idempotency_key, v.command_digest,
        v.input::jsonb, v.origin_trace::jsonb, v.queue, v.program::jsonb, v.retry::jsonb,
        v.timeout_ms, v.priority, v.concurrency_key, v.concurrency_limit, v.labels::jsonb,
        v.state, clock.base + v.submitted_at, clock.base + v.available_at, v.terminal_at,
        v.attempt_count, v.dispatch_count, v.current_attempt_id, v.cancel_requested_at,
        v.outcome::json, v.history_sequence
      from clock, unnest(
        $3::text[], $4::text[],
        $5::text[], $6::text[],
        $7::text[],
        $8::text[],
        $9::text[],
        $10::text[],
        $11::text[],
        $12::text[],
        $13::text[],
        $14::bigint[], $15::int[],
        $16::text[],
        $17::int[],
        $18::text[],
        $19::text[],
        $20::bigint[],
        $21::bigint[],
        $22::bigint[],
        $23::int[],
        $24::int[],
        $25::text[],
        $26::bigint[],
        $27::text[],
        $28::int[]
      ) as v(tenant_id, namespace, task_id, run_id, idempotency_key, command_digest, input,
        origin_trace, queue, program, retry, timeout_ms, priority, concurrency_key,
        concurrency_limit, labels, state, submitted_at, available_at, terminal_at, attempt_count,
        dispatch_count, current_attempt_id, cancel_requested_at, outcome, history_sequence)
      on conflict (tenant_id, namespace, idempotency_key) do nothing
      returning tenant_id, namespace, task_id, idempotency_key
    ), payloads as (
      insert into task_payloads (tenant_id, namespace, task_id, data)
      select ins.tenant_id, ins.namespace, ins.task_id, p.data::json
      from unnest($29::text[],
                  $30::text[]) as p(task_id, data)
      join ins on ins.task_id = p.task_id
    ), hist as (
      insert into task_history (tenant_id, namespace, task_id, sequence, attempt_id, at, reason)
      select ins.tenant_id, ins.namespace, ins.task_id, h.sequence, h.attempt_id,
        clock.base + h.at, h.reason
      from clock, unnest(
        $31::text[], $32::int[],
        $33::text[], $34::bigint[],
        $35::text[]) as h(task_id, sequence, attempt_id, at, reason)
      join ins on ins.task_id = h.task_id
    ), wake as (
      select count(pg_notify($36, w)) as sent
      from (select $37::text as w from ins limit 1) as one
      where w is not null
    )
    select ins.tenant_id, ins.namespace, ins.idempotency_key, clock.base from ins, wake, clock`;

// Each part of the write set, taken away by rewriting the statement (its parameters stay, so
// every configuration binds the same values).
const without = {
  jsonb: (sql) =>
    ['input', 'program', 'retry', 'labels'].reduce(
      (text, column) => text.replace(`v.${column}::jsonb`, `'{}'::jsonb`),
      sql,
    ),
  payload: (sql) =>
    sql.replace(
      /insert into task_payloads[\s\S]*?join ins on ins.task_id = p.task_id/,
      'select 1 from unnest($29::text[], $30::text[]) as p(task_id, data)',
    ),
  history: (sql) =>
    sql.replace(
      /insert into task_history[\s\S]*?join ins on ins.task_id = h.task_id/,
      'select 1 from unnest($31::text[], $32::int[], $33::text[], $34::bigint[], $35::text[]) as h(task_id, sequence, attempt_id, at, reason)',
    ),
  conflict: (sql) =>
    sql.replace('on conflict (tenant_id, namespace, idempotency_key) do nothing', ''),
};
const CONFIGS = {
  'as is': { sql: AS_IS },
  'jsonb columns as constants': { sql: without.jsonb(AS_IS) },
  '`input` alone as a constant': { sql: AS_IS.replace('v.input::jsonb', `'{}'::jsonb`) },
  'no payload row': { sql: without.payload(AS_IS) },
  'no history row': { sql: without.history(AS_IS) },
  'no tasks_listing': { sql: AS_IS, drop: ['tasks_listing'] },
  'no tasks_acquire': { sql: AS_IS, drop: ['tasks_acquire'] },
  'no ON CONFLICT, no tasks_idempotency_key': {
    sql: without.conflict(AS_IS),
    drop: ['tasks_idempotency_key'],
  },
  'bare: the tasks row and its primary key': {
    sql: without.conflict(without.history(without.payload(without.jsonb(AS_IS)))),
    drop: ['tasks_listing', 'tasks_acquire', 'tasks_idempotency_key'],
  },
};

// Task and run ids sort by time as the server's do (a new id lands at the right end of its
// index); idempotency keys are random UUIDs, as the benchmark's client makes them.
let counter = 0;
const sortableId = () =>
  Date.now().toString(16).padStart(12, '0') +
  (++counter).toString(16).padStart(8, '0') +
  randomBytes(6).toString('hex');

/** The statement's 37 parameters for ROWS new tasks of `queue`, as the server binds them. */
function parameters(queue) {
  const each = (value) => Array.from({ length: ROWS }, (_, i) => value(i));
  const ids = each(() => `tsk_${sortableId()}`);
  const now = Date.now();
  const input = JSON.stringify({
    queue,
    program: { name: 'noop' },
    namespace: 'bench',
    tenant_id: 'bench',
  });
  const retry = '{"backoff":"exponential","delay_ms":1000,"max_attempts":3,"max_delay_ms":60000}';
  return [
    null, // the store-time offset: null, the rows carry store time already
    null, // the same offset, bound again for the statement's other branch
    each(() => 'bench'), // tenant_id
    each(() => 'bench'), // namespace
    ids, // task_id
    each(() => `run_${sortableId()}`), // run_id
    each(() => randomUUID()), // idempotency_key
    each(() => null), // command_digest
    each(() => input), // input
    each(() => null), // origin_trace
    each(() => queue), // queue
    each(() => '{"name":"noop"}'), // program
    each(() => retry), // retry
    each(() => 300_000), // timeout_ms
    each(() => 0), // priority
    each(() => null), // concurrency_key
    each(() => null), // concurrency_limit
    each(() => '{}'), // labels
    each(() => 'queued'), // state
    each((i) => now + i), // submitted_at
    each((i) => now + i), // available_at
    each(() => null), // terminal_at
    each(() => 0), // attempt_count
    each(() => 0), // dispatch_count
    each(() => null), // current_attempt_id
    each(() => null), // cancel_requested_at
    each(() => null), // outcome
    each(() => 1), // history_sequence
    ids, // payload: task_id
    each((i) => `{"i":${i}}`), // payload: data
    ids, // history: task_id
    each(() => 1), // history: sequence
    each(() => null), // history: attempt_id
    each((i) => now + i), // history: at
    each(() => 'submitted'), // history: reason
    'ledgence_probe', // wake channel
    null, // wake payload: none, no NOTIFY
  ];
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

const server = new pg.Client({ connectionString: admin });
await server.connect();
await server.query(`drop database if exists ${database} with (force)`);
await server.query(`create database ${database}`);
await server.end();
const url = new URL(admin);
url.pathname = `/${database}`;
const db = new pg.Client({ connectionString: url.toString() });
await db.connect();
const migrations = join(
  dirname(fileURLToPath(import.meta.url)),
  '..',
  '..',
  '..',
  'packages',
  'store-postgres',
  'drizzle',
);
for (const file of (await readdir(migrations)).filter((f) => f.endsWith('.sql')).sort()) {
  await db.query(await readFile(join(migrations, file), 'utf8'));
}
const indexDefinitions = new Map();
for (const index of ['tasks_listing', 'tasks_acquire', 'tasks_idempotency_key']) {
  const { rows } = await db.query('select pg_get_indexdef($1::regclass) as def', [index]);
  indexDefinitions.set(index, rows[0].def);
}

const results = new Map(Object.keys(CONFIGS).map((name) => [name, []]));
for (let round = 1; round <= rounds; round += 1) {
  for (const [name, config] of Object.entries(CONFIGS)) {
    await db.query('truncate tasks, task_payloads, task_history');
    for (const index of config.drop ?? []) await db.query(`drop index ${index}`);
    await db.query('checkpoint');
    const { rows: before } = await db.query('select pg_current_wal_lsn() as lsn');
    const times = [];
    for (let i = 0; i < STATEMENTS; i += 1) {
      const { rows } = await db.query({
        text: `explain (analyze, timing off, format json) ${config.sql}`,
        values: parameters(`q${round}_${i}`),
      });
      times.push(rows[0]['QUERY PLAN'][0]['Execution Time']);
    }
    const { rows: wal } = await db.query(
      'select pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::float8 as bytes',
      [before[0].lsn],
    );
    results.get(name).push({ ms: median(times), walPerTask: wal[0].bytes / (STATEMENTS * ROWS) });
    for (const index of config.drop ?? []) await db.query(indexDefinitions.get(index));
  }
  process.stdout.write(`round ${round}/${rounds} done\n`);
}
await db.end();

console.log(
  `\nPostgreSQL execution per ${ROWS} rows (median of ${STATEMENTS} statements; each round) and WAL per task`,
);
for (const [name, values] of results) {
  const ms = values.map((v) => v.ms.toFixed(1)).join(' / ');
  const wal = values.map((v) => v.walPerTask.toFixed(0)).join(' / ');
  console.log(`${name.padEnd(42)} ${ms.padEnd(36)} ms   WAL ${wal} B/task`);
}
