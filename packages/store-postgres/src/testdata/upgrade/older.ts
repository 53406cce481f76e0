/**
 * A database as an older release left it, for the upgrade tests: migrated with the first
 * migrations only, holding rows that release's store wrote (README.md in this folder).
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type postgres from 'postgres';
import { MIGRATIONS_FOLDER, migrate } from '../../migrate.js';

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
