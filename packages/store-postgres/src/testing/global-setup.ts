/**
 * Vitest global setup of the int and e2e projects: one PostgreSQL server for the whole run.
 *
 * With `DATABASE_URL` set, tests use that server. Otherwise this starts embedded PostgreSQL with
 * fast durability in `<root>/.ledgence/test-pg` (kept between runs, so initdb runs once) on a
 * free port, and stops it when the run ends. Test files reach it through `createTestDatabase()`.
 */
import { randomBytes } from 'node:crypto';
import { readFile, readlink, realpath, rm } from 'node:fs/promises';
import { join, relative } from 'node:path';
import postgres from 'postgres';
import type { TestProject } from 'vitest/node';
import {
  type EmbeddedPostgres,
  EmbeddedPostgresError,
  startEmbeddedPostgres,
} from '../embedded.js';
import { migrate } from '../migrate.js';
import { ADMIN_URL_KEY, TEST_DATABASE_PREFIX } from './context.js';
import { TEMPLATE_KEY } from './template-key.js';

interface TestServer {
  readonly url: string;
  stop(): Promise<void>;
}

interface Shared {
  refs: number;
  readonly server: Promise<TestServer>;
  /** The migrated template database, built once per run on first use. */
  template?: Promise<string>;
}

// Each vitest project runs its own global setup, in the same process: the int and e2e projects
// share one server through this process-wide slot instead of starting two.
const SLOT = Symbol.for('@ledgence/store-postgres/testing/server');
type WithSlot = typeof globalThis & { [SLOT]?: Shared };

// Concurrent test runs (two terminals, or turbo running package test scripts side by side)
// cannot share a data folder, so a busy folder passes the run on to the next one.
const FOLDERS = ['test-pg', 'test-pg-2', 'test-pg-3', 'test-pg-4'];

/**
 * Starts (or joins) the run's PostgreSQL server and provides its admin URL to test files.
 *
 * @param project the vitest project being set up.
 * @returns the teardown, which stops an embedded server once no project needs it.
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const global = globalThis as WithSlot;
  let shared = global[SLOT];
  if (shared === undefined) {
    shared = { refs: 0, server: startTestServer(project.config.root) };
    global[SLOT] = shared;
  }
  const mine = shared;
  mine.refs += 1;
  let server: TestServer;
  try {
    server = await mine.server;
  } catch (error) {
    release(global, mine);
    throw error;
  }
  // A migrated template database, built once per run: test files copy it (a file-level copy,
  // much faster than migrating every database) through createMigratedTestDatabase().
  mine.template ??= buildTemplate(server.url);
  let template: string;
  try {
    template = await mine.template;
  } catch (error) {
    release(global, mine);
    throw error;
  }
  project.provide(ADMIN_URL_KEY, server.url);
  project.provide(TEMPLATE_KEY, template);
  let released = false;
  return async () => {
    if (released) return;
    released = true;
    if (!release(global, mine)) return;
    // With DATABASE_URL the server outlives the run: drop the template rather than leave it.
    await dropDatabase(server.url, template).catch(() => {});
    await server.stop();
  };
}

/**
 * Creates and migrates the run's template database. Its name carries the test prefix, so a
 * crashed run's template is dropped with the other leftovers; the server's stop (or the next
 * run's cleanup) removes it.
 */
async function buildTemplate(adminUrl: string): Promise<string> {
  const name = `${TEST_DATABASE_PREFIX}template_${randomBytes(6).toString('hex')}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    await admin.unsafe(`create database "${name}"`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  await migrate(url.toString());
  return name;
}

async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    await admin.unsafe(`drop database if exists "${name}" with (force)`);
  } finally {
    await admin.end();
  }
}

/** Drops one reference; true when it was the last, so the server should stop. */
function release(global: WithSlot, shared: Shared): boolean {
  shared.refs -= 1;
  if (shared.refs > 0) return false;
  if (global[SLOT] === shared) delete global[SLOT];
  return true;
}

async function startTestServer(root: string): Promise<TestServer> {
  const fromEnv = process.env.DATABASE_URL?.trim();
  if (fromEnv) {
    const version = await serverVersion(fromEnv, 'DATABASE_URL');
    console.log(
      `[ledgence] tests use PostgreSQL ${version} from DATABASE_URL (${describeUrl(fromEnv)})`,
    );
    return { url: fromEnv, stop: async () => {} };
  }
  const { server, folder } = await startEmbedded(join(root, '.ledgence'));
  try {
    // A run owns its folder's server alone, so databases left by crashed runs can go.
    await dropLeftovers(server.url);
    const version = await serverVersion(server.url, 'embedded PostgreSQL');
    console.log(
      `[ledgence] tests use embedded PostgreSQL ${version} on 127.0.0.1:${server.port} ` +
        `(data ${relative(root, folder) || folder}; set DATABASE_URL to use another server)`,
    );
  } catch (error) {
    await server.stop();
    throw error;
  }
  return server;
}

async function startEmbedded(base: string): Promise<{ server: EmbeddedPostgres; folder: string }> {
  for (const name of FOLDERS) {
    const folder = join(base, name);
    try {
      return {
        server: await startEmbeddedPostgres({ dataDir: folder, durability: 'fast' }),
        folder,
      };
    } catch (error) {
      if (!(error instanceof EmbeddedPostgresError)) throw error;
      if (error.code === 'data_dir_busy') {
        if (!(await stopOrphan(folder))) continue;
        return {
          server: await startEmbeddedPostgres({ dataDir: folder, durability: 'fast' }),
          folder,
        };
      }
      if (!['start_failed', 'data_dir_invalid', 'init_failed'].includes(error.code)) throw error;
      // Test data is disposable, and with fsync off a machine crash can corrupt the folder:
      // start afresh once rather than fail every run until someone deletes it.
      console.log(`[ledgence] ${folder} cannot be used (${error.code}); recreating it`);
      await rm(folder, { recursive: true, force: true });
      return {
        server: await startEmbeddedPostgres({ dataDir: folder, durability: 'fast' }),
        folder,
      };
    }
  }
  throw new Error(
    `[ledgence] every test PostgreSQL folder under ${base} is in use by a running server ` +
      `(${FOLDERS.join(', ')}). Wait for the other test runs, or stop stray postgres processes.`,
  );
}

/**
 * A test run killed with SIGKILL leaves its server running, re-parented to init, holding the
 * folder until the machine restarts. Such an orphan in a test folder serves nobody: stop it
 * (fast shutdown) and take the folder back. Linux only; elsewhere the next folder is used.
 */
async function stopOrphan(folder: string): Promise<boolean> {
  const lock = await readFile(join(folder, 'postmaster.pid'), 'utf8').catch(() => '');
  const pid = Number.parseInt(lock.split('\n')[0] ?? '', 10);
  if (!(pid > 0)) return false;
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  // Fields after the parenthesised command name: state, then the parent pid.
  const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  const cwd = await readlink(`/proc/${pid}/cwd`).catch(() => '');
  if (parent !== 1 || cwd !== (await realpath(folder))) return false;
  console.log(
    `[ledgence] stopping PostgreSQL (pid ${pid}) left running in ${folder} by a killed run`,
  );
  try {
    process.kill(pid, 'SIGINT');
  } catch {
    return false; // not ours to stop
  }
  for (let waited = 0; waited < 15_000; waited += 100) {
    await new Promise((done) => setTimeout(done, 100));
    if (!existsPid(pid)) return true;
  }
  return false;
}

function existsPid(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function dropLeftovers(adminUrl: string): Promise<void> {
  const sql = postgres(adminUrl, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    const rows = await sql<{ name: string }[]>`
      select datname as name from pg_database
      where starts_with(datname, ${TEST_DATABASE_PREFIX})`;
    for (const { name } of rows) {
      await sql.unsafe(`drop database if exists "${name.replaceAll('"', '""')}" with (force)`);
    }
  } finally {
    await sql.end();
  }
}

/** Connects once, so a wrong DATABASE_URL fails the run with one clear message. */
async function serverVersion(url: string, what: string): Promise<string> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    const [row] = await sql<
      { version: string }[]
    >`select current_setting('server_version') as version`;
    return row?.version ?? 'unknown';
  } catch (error) {
    throw new Error(
      `[ledgence] cannot reach the test PostgreSQL (${what}, ${describeUrl(url)}): ` +
        `${error instanceof Error ? error.message : String(error)}`,
      { cause: error },
    );
  } finally {
    await sql.end();
  }
}

/** user@host:port/database, without the password. */
function describeUrl(url: string): string {
  try {
    const parsed = new URL(url);
    const user = parsed.username ? `${decodeURIComponent(parsed.username)}@` : '';
    return `${user}${parsed.host}${parsed.pathname}`;
  } catch {
    return 'an unparsable URL';
  }
}
