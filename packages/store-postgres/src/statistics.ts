/**
 * Planner statistics for the store's tables while they are young (issue #7, bench/README.md "A
 * first-run trap").
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
 * Statistics taken while a table is small go stale the same way. postgres.js prepares every
 * statement, and PostgreSQL keeps a prepared statement's generic plan until the table's
 * statistics change: a batch lookup planned while `attempts` held a few hundred rows hash-joins a
 * sequential scan of it, and keeps doing so as it grows. Measured in a 20 000-task strict drain
 * (`pg_stat_statements`): the lease read of renew and settle (`loadAttemptsAt`) 2.6 ms per call,
 * 164 µs of PostgreSQL time per task, until autovacuum's analyze 22 s later; 0.17 ms per call
 * with the primary-key plan.
 *
 * So the server analyzes, every maintenance pass, each of the store's tables that holds rows and
 * either was never analyzed nor vacuumed (`reltuples < 0`, PostgreSQL 14+) or, while young (under
 * 256 pages at its last analysis), has at least doubled in pages since it last was analyzed or
 * vacuumed (`relpages`, which both record). The new statistics invalidate the cached plans, and
 * the next execution plans for the table's size. A table growing from nothing is analyzed about
 * seven times, each on a small table; from then on it is autovacuum's.
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
 * Pages a table must have grown past (twice this many, at least) before its statistics count as
 * stale: below ~8 pages (a few hundred narrow rows) every plan is cheap anyway.
 */
const STALE_FLOOR_PAGES = 4;

/**
 * Statistics taken at this many pages or more are left to autovacuum: every key lookup plans as
 * a key probe long before (`attempts` flips at a few thousand rows, ~100 pages), and an ANALYZE
 * of a large table in the middle of a busy drain would cost CPU and every backend's cached
 * plans for nothing (no harm was measured without the ceiling; bench/README.md).
 */
const YOUNG_CEILING_PAGES = 256;

/**
 * Tables of `tables` (in the current schema) holding data whose statistics are missing (never
 * analyzed nor vacuumed) or, while young, stale by size (at least twice the pages they had when
 * last analyzed or vacuumed, those being fewer than {@link YOUNG_CEILING_PAGES}). Lock: none
 * (catalog reads). No index: one pg_class row per table, by name.
 */
export async function tablesNeedingStatistics(
  sql: postgres.Sql,
  tables: readonly string[],
): Promise<string[]> {
  const rows = await sql<{ relname: string }[]>`
    select c.relname from pg_class c
    where c.relnamespace = current_schema()::regnamespace and c.relkind = 'r'
      and c.relname = any(${tables as string[]}::text[])
      and pg_relation_size(c.oid) > 0
      and (c.reltuples < 0
        or (c.relpages < ${YOUNG_CEILING_PAGES}
          and pg_relation_size(c.oid) >= 2 * greatest(c.relpages, ${STALE_FLOOR_PAGES})
            * current_setting('block_size')::bigint))
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
