/**
 * First planner statistics for the store's tables (issue #7, bench/README.md "A first-run trap").
 *
 * Until a table is first analyzed, PostgreSQL has no column statistics for it and estimates every
 * equality on `tenant_id` and `namespace` at its default selectivity. A key lookup by
 * (tenant, namespace, task id) then costs the same — one estimated row — through the primary key
 * and through any other index that starts with tenant and namespace, and PostgreSQL 18 picks
 * `tasks_listing` (tenant, namespace, submitted_at, task_id): a walk over every task of the
 * namespace per looked-up task, which grows with the table. Measured on a fresh database with
 * 4 000–20 000 tasks: `lockTasks` 83–268 µs of PostgreSQL time per drained task against 29–34
 * after one ANALYZE, `updateTasks` 106–404 against 70–82. Analyzing the empty tables at
 * migration does not help (still no column statistics, still a tie), and autovacuum takes up to
 * `autovacuum_naptime` (a minute by default) — the first minute of every install, every minute
 * when an operator has turned autovacuum off.
 *
 * So the server analyzes each table once, at its first maintenance pass after the table holds
 * rows; from then on autovacuum keeps the statistics current. `reltuples < 0` is PostgreSQL's
 * (14+) mark of a table neither vacuumed nor analyzed; on older versions it never matches and
 * this is a no-op.
 */
import { getTableName, is } from 'drizzle-orm';
import { PgTable } from 'drizzle-orm/pg-core';
import type postgres from 'postgres';
import * as schema from './schema.js';

/** Every table of the store's schema, by name. */
export const STORE_TABLES: readonly string[] = Object.values(schema as Record<string, unknown>)
  .flatMap((value) => (is(value, PgTable) ? [getTableName(value)] : []))
  .sort();

/**
 * Tables of `tables` (in the current schema) that hold data but were never analyzed nor vacuumed.
 * Lock: none (catalog reads). No index: one pg_class row per table, by name.
 */
export async function tablesWithoutStatistics(
  sql: postgres.Sql,
  tables: readonly string[],
): Promise<string[]> {
  const rows = await sql<{ relname: string }[]>`
    select c.relname from pg_class c
    where c.relnamespace = current_schema()::regnamespace and c.relkind = 'r'
      and c.relname = any(${tables as string[]}::text[])
      and c.reltuples < 0 and pg_relation_size(c.oid) > 0
    order by c.relname`;
  return rows.map((row) => row.relname);
}

/**
 * ANALYZE of the given tables, in one statement. Takes each table's SHARE UPDATE EXCLUSIVE lock
 * (readers and writers go on; only schema changes, VACUUM and another ANALYZE wait), and reads a
 * sample of at most 300 × `default_statistics_target` rows per table.
 */
export async function analyzeTables(sql: postgres.Sql, tables: readonly string[]): Promise<void> {
  if (tables.length === 0) return;
  const quoted = tables.map((name) => `"${name.replaceAll('"', '""')}"`);
  await sql.unsafe(`analyze ${quoted.join(', ')}`);
}
