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

/** The plan PostgreSQL would cache for `query` whatever its parameters (PostgreSQL 16+). */
async function genericPlan(query: string): Promise<string> {
  const rows = await sql.unsafe(`explain (generic_plan) ${query}`);
  return rows.map((row) => String(row['QUERY PLAN'])).join('\n');
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
});
