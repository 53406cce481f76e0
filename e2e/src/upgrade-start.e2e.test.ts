/**
 * The server process at start against databases of other schema versions (DESIGN
 * §6 "the server applies pending migrations at start (advisory-locked, so replicas may start
 * together)"; README "A database migrated by a newer Ledgence is refused (`upgrade this
 * server`), and `/readyz` is not 200 on it").
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MIGRATIONS_FOLDER, migrate, migrationStatus } from '@ledgence/store-postgres';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, describe, expect, it } from 'vitest';
import { type ServerProcess, ServerStartError, startServerProcess } from './server-process.js';

const databases: TestDatabase[] = [];
const servers: ServerProcess[] = [];
afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop('SIGKILL')));
  await Promise.all(databases.map((d) => d.drop()));
});

async function fresh(prefix: string): Promise<TestDatabase> {
  const db = await createTestDatabase({ prefix });
  databases.push(db);
  return db;
}

/** The committed migrations plus one a newer version adds. */
function futureFolder(): string {
  const folder = mkdtempSync(join(tmpdir(), 'ledgence-future-'));
  cpSync(MIGRATIONS_FOLDER, folder, { recursive: true });
  const journalPath = join(folder, 'meta', '_journal.json');
  const journal = JSON.parse(readFileSync(journalPath, 'utf8')) as {
    entries: { idx: number; version: string; when: number; tag: string; breakpoints: boolean }[];
  };
  const last = journal.entries.at(-1);
  if (last === undefined) throw new Error('no migrations');
  journal.entries.push({
    ...last,
    idx: last.idx + 1,
    when: last.when + 86_400_000,
    tag: '9999_future',
  });
  writeFileSync(journalPath, JSON.stringify(journal));
  writeFileSync(
    join(folder, '9999_future.sql'),
    'ALTER TABLE "tasks" ADD COLUMN "future_required" integer NOT NULL DEFAULT 0;',
  );
  return folder;
}

describe('server start across schema versions', () => {
  it('three servers started at once on an empty database migrate it once and all serve', async () => {
    const db = await fresh('upgrade_start_together');
    const started = await Promise.all(
      [0, 1, 2].map(() => startServerProcess({ DATABASE_URL: db.url })),
    );
    servers.push(...started);
    for (const s of started) {
      const ready = await fetch(`${s.url}/readyz`);
      expect(ready.status).toBe(200);
    }
    const status = await migrationStatus(db.url);
    expect(status.current).toBe(true);
    // Each recorded once: a count of the bookkeeping rows, through the status's applied list.
    const journal = JSON.parse(
      readFileSync(join(MIGRATIONS_FOLDER, 'meta', '_journal.json'), 'utf8'),
    ) as { entries: unknown[] };
    expect(status.applied).toHaveLength(journal.entries.length);
  });

  it('refuses to start on a database a newer version migrated, saying to upgrade', async () => {
    const db = await fresh('upgrade_start_newer');
    const folder = futureFolder();
    try {
      await migrate(db.url, { folder });
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
    const error = await startServerProcess({ DATABASE_URL: db.url }).then(
      (s) => {
        servers.push(s);
        return undefined;
      },
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ServerStartError);
    const failure = error as ServerStartError;
    expect(failure.code).toBe(1);
    expect(failure.output).toMatch(/migrated by a newer Ledgence/);
    expect(failure.output).toMatch(/Upgrade this server/);
  });

  it('a running server whose database a newer version migrates turns not ready', async () => {
    const db = await fresh('upgrade_start_running');
    const s = await startServerProcess({ DATABASE_URL: db.url });
    servers.push(s);
    expect((await fetch(`${s.url}/readyz`)).status).toBe(200);
    const folder = futureFolder();
    try {
      await migrate(db.url, { folder });
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
    const ready = await fetch(`${s.url}/readyz`);
    expect(ready.status).toBe(503);
    expect(await ready.text()).toMatch(/newer Ledgence/);
  });
});
