/**
 * Plans on a database nobody has analyzed yet: every fresh install starts so, and postgres.js
 * prepares each statement, so PostgreSQL may settle on a generic plan made while the tables
 * looked tiny and keep it as they grow (until autovacuum first updates the statistics). A
 * statement whose generic plan does not probe a whole key then reads more rows per call as the
 * table grows: the benchmark's first drain on a new cluster decayed to ~80 tasks/s on the poll's
 * slot read (bench/README.md).
 */
import postgres from 'postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { STORE_TABLES } from './statistics.js';
import { createPostgresTaskStore, type PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';
import type { TestDatabase } from './testing/database.js';
import { createMigratedTestDatabase } from './testing/migrated.js';

let db: TestDatabase;
let sql: postgres.Sql;
let store: PostgresTaskStore;
const captured: string[] = [];

beforeAll(async () => {
  db = await createMigratedTestDatabase('freshplans');
  sql = postgres(db.url, { max: 1, onnotice: () => {} });
  // This file is about tables nobody analyzed: autovacuum must not analyze them behind its back
  // (2 000 inserted tasks pass its threshold, and its visit could land between two assertions).
  for (const table of STORE_TABLES) {
    await sql.unsafe(`alter table "${table}" set (autovacuum_enabled = off)`);
  }
  const client = postgres(db.url, {
    max: 1,
    onnotice: () => {},
    debug: (_connection, query) => {
      captured.push(query);
    },
  });
  store = createPostgresTaskStore({ sql: client, config: CONFIG });
});

afterAll(async () => {
  await store.sql.end();
  await sql.end();
  await db.drop();
});

/**
 * The plan PostgreSQL would cache for `query` whatever its parameters: the statement prepared in
 * a session that forces generic plans, explained with NULL for every parameter (the values do not
 * enter a generic plan). `explain (generic_plan)` would say the same from PostgreSQL 16 on; this
 * way also holds for a DATABASE_URL on 15.
 */
async function genericPlan(query: string): Promise<string> {
  const parameters = new Set(query.match(/\$\d+/g) ?? []).size;
  const session = await sql.reserve();
  try {
    await session.unsafe('set plan_cache_mode = force_generic_plan');
    await session.unsafe(`prepare generic_plan_probe as ${query}`);
    const nulls = Array.from({ length: parameters }, () => 'null').join(', ');
    const rows = await session.unsafe(
      `explain execute generic_plan_probe${parameters > 0 ? `(${nulls})` : ''}`,
    );
    return rows.map((row) => String(row['QUERY PLAN'])).join('\n');
  } finally {
    await session.unsafe('deallocate generic_plan_probe');
    await session.unsafe('reset plan_cache_mode');
    session.release();
  }
}

it('the tables were never analyzed (the state this file is about)', async () => {
  const rows = await sql<{ relname: string; reltuples: number }[]>`
    select relname, reltuples from pg_class
    where relname in ('tasks', 'attempts', 'consumer_cursors', 'worker_sessions')`;
  expect(rows).toHaveLength(4);
  for (const row of rows) expect(row.reltuples).toBe(-1);
});

it("a poll's slot read probes the whole attempts key in its generic plan", async () => {
  await store.submit(submitCommand('fresh-1'));
  await store.submit(submitCommand('fresh-2'));
  const session = await store.openSession({ scope: SCOPE, queue: 'q', concurrency: 1 });
  const { reply } = await store.acquire(acquireCommand(session.id, 0, 1), { recordEmpty: true });
  if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
  await store.renew(renewCommand(reply.assignment.lease.owner, 1, 'dispatch'));
  await store.settle(successCommand(reply.assignment, 'op-fresh'));
  // The second poll reads the attempt its cursor points at.
  await store.acquire(acquireCommand(session.id, 0, 2), { recordEmpty: true });

  const slotRead = captured.find((query) => /row_to_json\(c\) as cursor/.test(query));
  if (slotRead === undefined) throw new Error('the slot read was not captured');
  const plan = await genericPlan(slotRead);
  const probe = plan
    .split('\n')
    .map((line, i, lines) => ({ line, next: lines[i + 1] ?? '' }))
    .find(({ line }) => /Index Scan using attempts_\w+_pk on attempts/.test(line));
  expect(probe, plan).toBeDefined();
  // Every key column in the index condition, none left to a filter over the namespace's attempts.
  expect(probe?.next).toMatch(/Index Cond: .*task_id = .*attempt_id = /);
  expect(plan).not.toMatch(/Seq Scan on attempts|Join Filter: .*attempt_id/);

  // The claim select, sent with that read, counts the new polls from their cursors: a probe of
  // the whole cursor key too.
  const claim = captured.find(
    (query) => /skip locked/i.test(query) && /consumer_cursors/.test(query),
  );
  if (claim === undefined) throw new Error('the first-round claim select was not captured');
  const claimPlan = await genericPlan(claim);
  const cursorProbe = claimPlan
    .split('\n')
    .map((line, i, lines) => ({ line, next: lines[i + 1] ?? '' }))
    .find(({ line }) => /Index Scan using consumer_cursors_\w+ on consumer_cursors/.test(line));
  expect(cursorProbe, claimPlan).toBeDefined();
  expect(cursorProbe?.next).toMatch(/Index Cond: .*worker_session_id = .*consumer_id = /);
  expect(claimPlan).not.toMatch(/Seq Scan on consumer_cursors/);
  expect(claimPlan).toMatch(/Index Scan using tasks_acquire on tasks/);
});

/** Tables' `reltuples`: -1 until a table is first analyzed or vacuumed. */
async function reltuples(): Promise<Map<string, number>> {
  const rows = await sql<{ relname: string; reltuples: number }[]>`
    select relname, reltuples from pg_class
    where relnamespace = current_schema()::regnamespace and relname = any(${[...STORE_TABLES]})`;
  return new Map(rows.map((row) => [row.relname, row.reltuples]));
}

/** One lifecycle per slot: claim, dispatch, settle; the next poll reads the settled attempt. */
async function lifecycles(prefix: string, slots: number): Promise<void> {
  const session = await store.openSession({ scope: SCOPE, queue: 'q', concurrency: slots });
  const slotIds = Array.from({ length: slots }, (_, i) => i);
  const polls = await store.acquireBatch(
    slotIds.map((i) => acquireCommand(session.id, i, 1)),
    { recordEmpty: true },
  );
  const assignments = polls.flatMap((poll) =>
    poll.ok && poll.value.reply.disposition === 'assigned' ? [poll.value.reply.assignment] : [],
  );
  expect(assignments).toHaveLength(slots);
  await store.renewBatch(assignments.map((a) => renewCommand(a.lease.owner, 1, 'dispatch')));
  await store.settleBatch(assignments.map((a, i) => successCommand(a, `${prefix}-${i}`)));
  await store.acquireBatch(
    slotIds.map((i) => acquireCommand(session.id, i, 2)),
    { recordEmpty: true },
  );
}

it('the statistics pass analyzes each never-analyzed table holding rows, and not again before it grows', async () => {
  for (let batch = 0; batch < 2; batch += 1) {
    await store.submitBatch(
      Array.from({ length: 1_000 }, (_, i) => submitCommand(`bulk-${batch}-${i}`)),
    );
  }
  const before = await reltuples();
  const holdingRows: string[] = [];
  for (const table of STORE_TABLES) {
    const [row] = await sql.unsafe(`select exists (select 1 from "${table}") as any`);
    if (row?.any === true) holdingRows.push(table);
  }
  expect(holdingRows).toEqual(expect.arrayContaining(['attempts', 'task_payloads', 'tasks']));
  for (const table of holdingRows) expect(before.get(table), table).toBe(-1);

  expect(await store.analyzeGrowingTables()).toEqual(holdingRows);
  const after = await reltuples();
  for (const table of STORE_TABLES) {
    if (holdingRows.includes(table)) expect(after.get(table), table).toBeGreaterThan(0);
    else expect(after.get(table), table).toBe(-1);
  }
  expect(await store.analyzeGrowingTables()).toEqual([]);
});

it('after it, every statement of a lifecycle reaches tasks by its primary key (claims by tasks_acquire)', async () => {
  captured.length = 0;
  await lifecycles('after', 50);
  const statements = [...new Set(captured)].filter((query) =>
    /^\s*(select|insert|update|delete|with)\b/i.test(query),
  );
  const touchingTasks = statements.filter((query) => /\btasks\b/.test(query));
  // The claim's select, the lock, the scheduling update, the key reads: all of them, not a few.
  expect(touchingTasks.length).toBeGreaterThanOrEqual(3);
  for (const query of touchingTasks) {
    const plan = await genericPlan(query);
    const scans = plan.split('\n').filter((line) => /Scan .*\bon tasks\b/.test(line));
    expect(scans.length, plan).toBeGreaterThan(0);
    // Never tasks_listing or tasks_idempotency_key with the task id left to a filter (the tie
    // on a never-analyzed table), never a sequential scan.
    for (const scan of scans) {
      expect(scan, plan).toMatch(
        /using (tasks_tenant_id_namespace_task_id_pk|tasks_acquire) on tasks/,
      );
    }
  }
});

it('every statement that reads task_payloads probes its primary key, never a sequential scan', async () => {
  captured.length = 0;
  await lifecycles('payloads', 5);
  await store.status(SCOPE, (await store.submit(submitCommand('payload-read'))).snapshot.task_id);
  // Reads: plain selects, and the claim's select after the walk of its queue's priorities.
  const reads = [...new Set(captured)].filter((query) =>
    /^\s*(with recursive priorities\b|select\b)[\s\S]*\btask_payloads\b/i.test(query),
  );
  // The claim's select (its data joined in), the status read (joined too): `tasks.task_id` is
  // `C`, the payload key's is not, and a join compared in `C` cannot use that key.
  expect(reads.filter((query) => /skip locked/i.test(query)).length).toBeGreaterThan(0);
  expect(reads.filter((query) => /payload_output/.test(query)).length).toBeGreaterThan(0);
  for (const query of reads) {
    const plan = await genericPlan(query);
    expect(plan).toMatch(/Index Scan using task_payloads_tenant_id_namespace_task_id_pk/);
    expect(plan).not.toMatch(/Seq Scan on task_payloads/);
  }
});

it('a plan cached while attempts was small is replaced once the pass finds the table doubled', async () => {
  captured.length = 0;
  await lifecycles('grow', 5);
  // Renew's and settle's lease read: a batch lookup by the attempts primary key.
  const leaseRead = [...new Set(captured)].find((query) => /as store_now, a\.\*/.test(query));
  if (leaseRead === undefined) throw new Error('the lease read was not captured');
  // Statistics for the table as it is now (a few pages); a second pass finds nothing to do.
  await store.analyzeGrowingTables();
  expect(await store.analyzeGrowingTables()).toEqual([]);
  // One session, one prepared statement whose generic plan is cached at its first execution —
  // what postgres.js's prepared statements get after five.
  const session = await sql.reserve();
  try {
    await session.unsafe('set plan_cache_mode = force_generic_plan');
    await session.unsafe(`prepare lease_read (text[], text[], text[], text[]) as ${leaseRead}`);
    const cachedPlan = async () => {
      const rows = await session.unsafe(`explain execute lease_read('{}', '{}', '{}', '{}')`);
      return rows.map((row) => String(row['QUERY PLAN'])).join('\n');
    };
    // A few pages of attempts: reading all of them beats probing the key once per row.
    expect(await cachedPlan()).toMatch(/Seq Scan on attempts/);

    // The table grows far past the statistics (copies of its rows in another namespace); the
    // cached plan does not notice.
    // (No temporary table: the first one changes the session's search path, and with it every
    // cached plan.)
    await session.unsafe(`
      insert into attempts
      select grown.* from attempts a, generate_series(1, 60) as copy,
        jsonb_populate_record(null::attempts, to_jsonb(a)
          || jsonb_build_object('namespace', 'grown', 'task_id', a.task_id || '.' || copy)) as grown`);
    expect(await cachedPlan()).toMatch(/Seq Scan on attempts/);

    expect(await store.analyzeGrowingTables()).toContain('attempts');
    const plan = await cachedPlan();
    expect(plan).toMatch(/Index Scan using attempts_\w+_pk on attempts/);
    expect(plan).not.toMatch(/Seq Scan on attempts/);
    // Nothing has grown since: the next pass is a catalog read.
    expect(await store.analyzeGrowingTables()).toEqual([]);
  } finally {
    session.release();
  }
});

it('a table analyzed at 256 pages or more is left to autovacuum, however it grows', async () => {
  const pages = async () => {
    const [row] = await sql<{ relpages: number }[]>`
      select relpages from pg_class
      where relname = 'task_history' and relnamespace = current_schema()::regnamespace`;
    return row?.relpages ?? 0;
  };
  const grow = (rows: number, prefix: string) => sql`
    insert into task_history (tenant_id, namespace, task_id, sequence, attempt_id, at, reason)
    select 'acme', 'history', ${prefix} || n, 1, null, 0, 'submitted'
    from generate_series(1, ${rows}::int) as n`;
  expect(await pages()).toBeLessThan(256);
  // Young: past twice its pages, so the pass analyzes it (and records its new size).
  await grow(40_000, 'young-');
  expect(await store.analyzeGrowingTables()).toContain('task_history');
  expect(await pages()).toBeGreaterThanOrEqual(256);
  // Grown up: more than doubled again, but its statistics are autovacuum's now.
  await grow(100_000, 'grown-');
  expect(await store.analyzeGrowingTables()).not.toContain('task_history');
});
