/**
 * A database as an older release left it, for the upgrade tests: migrated with the first
 * migrations only, holding rows that release's store wrote (README.md in this folder).
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lifecycleConfig } from '@ledgence/core';
import postgres from 'postgres';
import { MIGRATIONS_FOLDER, migrate } from '../../migrate.js';
import { createPostgresTaskStore, type PostgresTaskStore } from '../../store.js';
import { createTestDatabase, type TestDatabase } from '../../testing/index.js';

/** A dump of this folder: each table's rows as the older store wrote them, and its store time. */
export interface OlderDump {
  now: number;
  dump: Record<string, unknown[]>;
}

/** Reads `name` of this folder. */
export function readOlderDump<T extends OlderDump>(name: string): T {
  return JSON.parse(readFileSync(new URL(name, import.meta.url), 'utf8')) as T;
}

/**
 * Migrates the database at `url` with the first `count` committed migrations only (a copy of the
 * folder with a journal cut there); returns the tags applied.
 */
export async function migrateFirst(url: string, count: number): Promise<string[]> {
  const folder = mkdtempSync(join(tmpdir(), 'ledgence-older-'));
  try {
    cpSync(MIGRATIONS_FOLDER, folder, { recursive: true });
    const journalPath = join(folder, 'meta', '_journal.json');
    const journal = JSON.parse(readFileSync(journalPath, 'utf8')) as { entries: unknown[] };
    journal.entries = journal.entries.slice(0, count);
    writeFileSync(journalPath, JSON.stringify(journal));
    return (await migrate(url, { folder })).applied;
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
}

/** Inserts every table's rows of `dump`, column by column as dumped. */
export async function loadDump(sql: postgres.Sql, dump: OlderDump['dump']): Promise<void> {
  for (const [table, rows] of Object.entries(dump)) {
    if (rows.length === 0) continue;
    await sql.unsafe(
      `insert into ${table} select * from json_populate_recordset(null::${table}, $1::text::json)`,
      [JSON.stringify(rows)],
    );
  }
}

/** A database upgraded from an older release's rows, and the current store over it. */
export interface Upgraded {
  db: TestDatabase;
  sql: postgres.Sql;
  store: PostgresTaskStore;
  /** The tags migrated at the older release, then those the upgrade applied. */
  migrated: { before: string[]; upgrade: string[] };
  close(): Promise<void>;
}

/**
 * A fresh database migrated with the first `count` migrations, `older`'s rows loaded, then
 * migrated to current; the current store reads it with its clock at the dump's store time
 * (plus the time the test has run since).
 */
export async function upgradedFrom(
  prefix: string,
  count: number,
  older: OlderDump,
): Promise<Upgraded> {
  const db = await createTestDatabase({ prefix });
  const before = await migrateFirst(db.url, count);
  const sql = postgres(db.url, { max: 1, onnotice: () => {} });
  await loadDump(sql, older.dump);
  const upgrade = (await migrate(db.url)).applied;
  const offset = older.now - Date.now();
  const store = createPostgresTaskStore({
    url: db.url,
    config: lifecycleConfig({}),
    max: 4,
    clockOffsetMs: () => offset,
  });
  return {
    db,
    sql,
    store,
    migrated: { before, upgrade },
    async close() {
      await store.close();
      await sql.end();
      await db.drop();
    },
  };
}
