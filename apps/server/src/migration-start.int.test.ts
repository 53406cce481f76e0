/**
 * Starting against an existing database (review r51b) (DESIGN §7 "the server applies pending
 * migrations at start (advisory-locked, so replicas may start together)", §11 "Start = connect,
 * migrate, listen"; README "Configuration" DATABASE_URL, "While starting", "Start failures",
 * `/readyz` "migrations current").
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MIGRATIONS_FOLDER, migrate } from '@ledgence/store-postgres';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};
const silent = pino({ level: 'silent' });

const created: TestDatabase[] = [];
const running: RunningServer[] = [];
afterAll(async () => {
  await Promise.all(running.map((s) => s.stop().catch(() => {})));
  await Promise.all(created.map((db) => db.drop().catch(() => {})));
});

async function fresh(prefix: string): Promise<TestDatabase> {
  const db = await createTestDatabase({ prefix });
  created.push(db);
  return db;
}

function start(
  url: string,
  signal?: AbortSignal,
  logger: pino.Logger = silent,
): Promise<RunningServer> {
  const config = loadConfig(
    { DATABASE_URL: url, PORT: '0', LEDGENCE_SHUTDOWN_TIMEOUT_MS: '2000' },
    noFiles,
  );
  return startServer(config, { logger, ...(signal ? { signal } : {}) }).then((s) => {
    running.push(s);
    return s;
  });
}

async function startFailure(url: string): Promise<Error> {
  const outcome = await start(url).then(
    async (server) => {
      await server.stop();
      return undefined;
    },
    (error: unknown) => error,
  );
  expect(outcome, 'the start failed').toBeInstanceOf(Error);
  return outcome as Error;
}

function folderWith(entries: number, extra?: { tag: string; sql: string }): string {
  const folder = mkdtempSync(join(tmpdir(), 'ledgence-migration-start-'));
  cpSync(MIGRATIONS_FOLDER, folder, { recursive: true });
  const journalPath = join(folder, 'meta', '_journal.json');
  const journal = JSON.parse(readFileSync(journalPath, 'utf8')) as {
    entries: { idx: number; version: string; when: number; tag: string; breakpoints: boolean }[];
  };
  journal.entries = journal.entries.slice(0, entries);
  if (extra !== undefined) {
    const last = journal.entries[journal.entries.length - 1];
    if (last === undefined) throw new Error('no migrations');
    journal.entries.push({
      ...last,
      idx: last.idx + 1,
      when: last.when + 86_400_000,
      tag: extra.tag,
    });
    writeFileSync(join(folder, `${extra.tag}.sql`), extra.sql);
  }
  writeFileSync(journalPath, JSON.stringify(journal));
  return folder;
}

function withAdminUrl(url: string, user: string, password: string): string {
  const u = new URL(url);
  u.username = user;
  u.password = password;
  return u.toString();
}

async function dropRole(db: TestDatabase, role: string): Promise<void> {
  const admin = postgres(db.url, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(
      `select pg_terminate_backend(pid) from pg_stat_activity where usename = '${role}'`,
    );
    await admin.unsafe(`reassign owned by "${role}" to current_user`);
    await admin.unsafe(`drop owned by "${role}"`);
    await admin.unsafe(`drop role "${role}"`);
  } finally {
    await admin.end();
  }
}

describe('replicas starting together on one empty database', () => {
  it('all three serve, /readyz 200 on each, and every migration is recorded once', async () => {
    const db = await fresh('r51b_replicas');
    const servers = await Promise.all([start(db.url), start(db.url), start(db.url)]);
    for (const server of servers) {
      const res = await fetch(`${server.url}/readyz`);
      expect(res.status).toBe(200);
    }
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const rows = await sql`select hash from drizzle.__drizzle_migrations`;
      const journal = JSON.parse(
        readFileSync(join(MIGRATIONS_FOLDER, 'meta', '_journal.json'), 'utf8'),
      ) as { entries: unknown[] };
      expect(rows).toHaveLength(journal.entries.length);
      expect(new Set(rows.map((row) => row.hash)).size).toBe(journal.entries.length);
    } finally {
      await sql.end();
    }
    await Promise.all(servers.map((s) => s.stop()));
  }, 60_000);
});

describe('a database migrated by a newer release', () => {
  it('refuses the start saying to upgrade, and a running replica turns not ready', async () => {
    const db = await fresh('r51b_newer');
    const server = await start(db.url);
    expect((await fetch(`${server.url}/readyz`)).status).toBe(200);
    const folder = folderWith(99, {
      tag: '9999_future',
      sql: 'ALTER TABLE "tasks" ADD COLUMN "future_col" integer;',
    });
    try {
      expect((await migrate(db.url, { folder })).applied).toEqual(['9999_future']);
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
    const ready = await fetch(`${server.url}/readyz`);
    expect(ready.status).toBe(503);
    expect(await ready.text()).toContain('upgrade this server');
    await server.stop();
    const error = await startFailure(db.url);
    expect(error.message).toMatch(/newer Ledgence/);
    expect(error.message).toMatch(/Upgrade this server/i);
  }, 60_000);
});

describe('a public schema that already holds a table named like one of ours', () => {
  it('fails the start with a message naming the collision and what to do', async () => {
    const db = await fresh('r51b_collide');
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      await sql`create table public.tasks (id serial primary key, title text)`;
      await sql`insert into public.tasks (title) values ('mine')`;
    } finally {
      await sql.end();
    }
    const error = await startFailure(db.url);
    // Nothing of ours was left behind, the application's table is untouched.
    const check = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const tables = await check<{ name: string }[]>`
        select tablename as name from pg_tables where schemaname = 'public'`;
      expect(tables.map((t) => t.name)).toEqual(['tasks']);
      const [row] = await check`select title from public.tasks`;
      expect(row?.title).toBe('mine');
    } finally {
      await check.end();
    }
    // DESIGN §11 "clear message on error"; README: a database of Ledgence's own, "an
    // application's own tables ... there would collide".
    expect(error.message).toContain('"tasks" already exists');
    expect(error.message).toContain('DATABASE_URL');
    expect(error.message).toContain('a database of its own');
  }, 60_000);
});

describe('DATABASE_URL users and privileges', () => {
  it('a user without CREATE: the start names the missing privilege', async () => {
    const db = await fresh('r51b_nocreate');
    const admin = postgres(db.url, { max: 1, onnotice: () => {} });
    const role = `${db.name}_u`;
    try {
      await admin.unsafe(`create role "${role}" login password 'r51b_pw'`);
      await admin.unsafe(`grant connect on database "${db.name}" to "${role}"`);
    } finally {
      await admin.end();
    }
    try {
      const error = await startFailure(withAdminUrl(db.url, role, 'r51b_pw'));
      expect(error.message).toContain("lacks a privilege Ledgence's migrations need");
      expect(error.message).not.toContain('r51b_pw');
    } finally {
      await dropRole(db, role);
    }
  }, 60_000);

  it("the database's owner starts on a current schema another role migrated (README: 'as its owner')", async () => {
    // The schema was migrated once by another role (the superuser of a first start, a DBA's
    // run); the application then connects as the database's owner. Nothing is pending.
    const db = await fresh('r51b_owner');
    const role = `${db.name}_o`;
    const admin = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      await migrate(db.url);
      await admin.unsafe(`create role "${role}" login password 'r51b_pw'`);
      await admin.unsafe(`alter database "${db.name}" owner to "${role}"`);
      await admin.unsafe(`grant create on schema public to "${role}"`);
      // Owner of Ledgence's tables too (README's privilege message asks for that).
      for (const t of await admin<{ name: string }[]>`
        select tablename as name from pg_tables where schemaname = 'public'`) {
        await admin.unsafe(`alter table public."${t.name}" owner to "${role}"`);
      }
      // ...and of the bookkeeping table, which it may reach (USAGE on schema drizzle). Only
      // CREATE on schema drizzle, needed by no pending migration (none is pending), is not given.
      await admin.unsafe(`alter table drizzle.__drizzle_migrations owner to "${role}"`);
      await admin.unsafe(`grant usage on schema drizzle to "${role}"`);
    } finally {
      await admin.end();
    }
    const url = withAdminUrl(db.url, role, 'r51b_pw');
    const outcome = await start(url).then(
      async (s) => {
        const ready = (await fetch(`${s.url}/readyz`)).status;
        await s.stop();
        return ready;
      },
      (error: unknown) => (error instanceof Error ? error.message : String(error)),
    );
    await dropRole(db, role);
    expect(outcome).toBe(200);
  }, 60_000);
});

describe('a pending migration queued behind a table lock another session holds (a pg_dump)', () => {
  it('the start logs which session blocks it, and an abort (SIGTERM while starting) abandons it within seconds', async () => {
    const db = await fresh('r51b_dump');
    // The database of the previous release: migrations up to 0001 applied.
    const folder = folderWith(2);
    try {
      await migrate(db.url, { folder });
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
    // A backup holds ACCESS SHARE on tasks for its whole run; 0002's ALTER TABLE waits for it.
    const dump = postgres(db.url, { max: 1, onnotice: () => {} });
    const reserved = await dump.reserve();
    await reserved`begin isolation level repeatable read`;
    await reserved`lock table tasks in access share mode`;
    const [dumpSession] = await reserved<{ pid: number }[]>`select pg_backend_pid() as pid`;
    const lines: string[] = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => void lines.push(line) });
    try {
      const abort = new AbortController();
      const starting = start(db.url, abort.signal, logger).then(
        () => 'started',
        (error: unknown) => error,
      );
      // Let the start reach the migration and block on the table lock.
      const admin = postgres(db.url, { max: 1, onnotice: () => {} });
      try {
        let blocked = false;
        for (let i = 0; i < 100 && !blocked; i++) {
          const [row] = await admin<{ n: number }[]>`
            select count(*)::int as n from pg_locks
            where not granted and locktype = 'relation' and relation = 'tasks'::regclass`;
          blocked = (row?.n ?? 0) > 0;
          if (!blocked) await new Promise((r) => setTimeout(r, 100));
        }
        expect(blocked, 'the start waits on the table lock').toBe(true);
      } finally {
        await admin.end();
      }
      // A blocked statement is reported after 5 s, naming the session that holds the table.
      const said = `a migration waits for a table lock held by pid ${dumpSession?.pid}`;
      for (let i = 0; i < 150 && !lines.some((line) => line.includes(said)); i++) {
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(lines.join('\n')).toContain(said);
      const reason = new Error('SIGTERM while starting');
      abort.abort(reason);
      const outcome = await Promise.race([
        starting,
        new Promise((r) => setTimeout(() => r('still starting 10 s after the abort'), 10_000)),
      ]);
      expect(outcome).toBe(reason);
    } finally {
      await reserved`rollback`.catch(() => {});
      reserved.release();
      await dump.end({ timeout: 1 });
    }
  }, 60_000);
});
