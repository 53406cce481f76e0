import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import postgres from 'postgres';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  type EmbeddedPostgres,
  type EmbeddedPostgresOptions,
  startEmbeddedPostgres,
} from './embedded.js';

// The embedded server listens on 127.0.0.1, where TCP carries no OS user: a password every
// local user can guess would hand any of them the server's superuser, and with it `COPY … FROM
// PROGRAM` as the server's OS user. Each folder keeps a random one of its own instead.
const PASSWORD_FILE = 'ledgence-password';
const PENDING_FILE = 'ledgence-password.pending';
// What every folder initialised before per-folder passwords has.
const LEGACY_PASSWORD = 'ledgence';

// One folder serves every test (initdb is the slow part); each test starts it itself, so that
// it also runs alone.
let base: string;
let folder: string;
const running: EmbeddedPostgres[] = [];
// Every line any start of this file handed to onLog, and every password the folder had.
const logged: string[] = [];
const passwords = new Set<string>();

async function start(options: Partial<EmbeddedPostgresOptions> = {}): Promise<EmbeddedPostgres> {
  const server = await startEmbeddedPostgres({
    dataDir: folder,
    durability: 'fast',
    onLog: (line) => logged.push(line),
    ...options,
  });
  running.push(server);
  passwords.add(decodeURIComponent(new URL(server.url).password));
  return server;
}

async function currentUser(url: string): Promise<string | undefined> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    const [row] = await sql<{ user: string }[]>`select current_user as user`;
    return row?.user;
  } finally {
    await sql.end();
  }
}

async function admin(url: string, statement: string): Promise<void> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    await sql.unsafe(statement);
  } finally {
    await sql.end();
  }
}

/** The SQLSTATE a connection with `password` instead of the URL's fails with. */
async function refusal(url: string, password: string): Promise<unknown> {
  const other = new URL(url);
  other.password = encodeURIComponent(password);
  return currentUser(other.toString()).then(
    () => 'accepted',
    (error: { code?: unknown }) => error.code,
  );
}

async function keptPassword(): Promise<string> {
  const password = (await readFile(join(folder, PASSWORD_FILE), 'utf8')).trim();
  passwords.add(password);
  return password;
}

/** Turns the running server's folder into one an earlier version initialised, and stops it. */
async function makeLegacy(server: EmbeddedPostgres): Promise<void> {
  await admin(server.url, `alter role postgres password '${LEGACY_PASSWORD}'`);
  await server.stop();
  await rm(join(folder, PASSWORD_FILE));
}

beforeAll(async () => {
  base = await mkdtemp(join(tmpdir(), 'ledgence-embedded-password-'));
  // As root the server runs as the OS user `postgres`, which must be able to enter it.
  await chmod(base, 0o755);
  folder = join(base, 'pg');
});

// A test that fails half-way leaves its server running; the next one needs the folder.
afterEach(async () => {
  await Promise.all(running.splice(0).map((server) => server.stop()));
});

afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

describe('the embedded PostgreSQL superuser password', () => {
  it('is random and kept in the folder (0600) from initdb on, and the same on every start', async () => {
    const first = await start();
    const password = await keptPassword();
    expect(password).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(decodeURIComponent(new URL(first.url).password)).toBe(password);
    expect((await stat(join(folder, PASSWORD_FILE))).mode & 0o777).toBe(0o600);
    expect(await currentUser(first.url)).toBe('postgres');
    expect(await currentUser(first.urlFor('template1'))).toBe('postgres');
    expect(await refusal(first.url, LEGACY_PASSWORD)).toBe('28P01');
    // initdb's password file, beside the staging folder, is gone once initdb has run.
    expect((await readdir(base)).sort()).toEqual(['pg']);
    expect(existsSync(join(folder, PENDING_FILE))).toBe(false);
    await first.stop();

    const second = await start();
    expect(second.url).toBe(`postgres://postgres:${password}@127.0.0.1:${second.port}/postgres`);
    expect(await currentUser(second.url)).toBe('postgres');
    expect(await keptPassword()).toBe(password);
    await second.stop();
  });

  it('is given to a folder of an earlier version, whose password was the fixed one', async () => {
    await makeLegacy(await start());
    // log_statement=all: the ALTER ROLE that gives the password is logged, with a verifier only.
    const migrated = await start({ settings: { log_statement: 'all' } });
    const password = await keptPassword();
    expect(password).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(decodeURIComponent(new URL(migrated.url).password)).toBe(password);
    expect(await currentUser(migrated.url)).toBe('postgres');
    expect(await refusal(migrated.url, LEGACY_PASSWORD)).toBe('28P01');
    expect((await stat(join(folder, PASSWORD_FILE))).mode & 0o777).toBe(0o600);
    expect(existsSync(join(folder, PENDING_FILE))).toBe(false);
    const alter = logged.filter((line) => /alter role postgres password/i.test(line));
    expect(alter).toEqual([expect.stringContaining("password 'SCRAM-SHA-256$4096:")]);
    expect(alter.join('\n')).not.toContain(password);
    await migrated.stop();
  });

  it('survives a migration killed before its ALTER ROLE, and one killed after it', async () => {
    // Killed before: the pending password was written, the role still has the fixed one.
    await makeLegacy(await start());
    const written = randomBytes(32).toString('base64url');
    passwords.add(written);
    await writeFile(join(folder, PENDING_FILE), `${written}\n`, { mode: 0o600 });
    const before = await start();
    expect(await currentUser(before.url)).toBe('postgres');
    expect(await refusal(before.url, LEGACY_PASSWORD)).toBe('28P01');
    expect(decodeURIComponent(new URL(before.url).password)).toBe(await keptPassword());
    expect(existsSync(join(folder, PENDING_FILE))).toBe(false);

    // Killed after: the role has the pending password, which was not yet renamed to the kept one.
    const given = await keptPassword();
    await before.stop();
    await rename(join(folder, PASSWORD_FILE), join(folder, PENDING_FILE));
    const after = await start();
    expect(decodeURIComponent(new URL(after.url).password)).toBe(given);
    expect(await currentUser(after.url)).toBe('postgres');
    expect(await keptPassword()).toBe(given);
    expect(existsSync(join(folder, PENDING_FILE))).toBe(false);
    await after.stop();
  });

  it('is given again when the role lost it, and never guessed beyond the fixed one', async () => {
    // The role is back on the fixed password, the file still there (a lost or undone ALTER).
    const server = await start();
    const kept = await keptPassword();
    await admin(server.url, `alter role postgres password '${LEGACY_PASSWORD}'`);
    await server.stop();
    const regiven = await start();
    expect(decodeURIComponent(new URL(regiven.url).password)).toBe(kept);
    expect(await refusal(regiven.url, LEGACY_PASSWORD)).toBe('28P01');

    // Changed by hand to one no file holds: the start fails, says where the password goes, and
    // leaves no server running.
    const byHand = `by-hand-${randomBytes(8).toString('hex')}`;
    passwords.add(byHand);
    await admin(regiven.url, `alter role postgres password '${byHand}'`);
    await regiven.stop();
    const failure = await start().then(
      () => undefined,
      (error: Error) => error,
    );
    expect(failure).toMatchObject({
      code: 'start_failed',
      message: expect.stringContaining(`write it into ${join(folder, PASSWORD_FILE)}`),
    });
    expect(existsSync(join(folder, 'postmaster.pid'))).toBe(false);
    for (const password of passwords) expect(failure?.message).not.toContain(password);

    // The remedy the message names works.
    await writeFile(join(folder, PASSWORD_FILE), `${byHand}\n`, { mode: 0o600 });
    const fixed = await start();
    expect(decodeURIComponent(new URL(fixed.url).password)).toBe(byHand);
    expect(await currentUser(fixed.url)).toBe('postgres');
    await fixed.stop();
  });

  it('never reaches onLog, nor the message of a failed start', async () => {
    const server = await start();
    await keptPassword();
    await server.stop();
    const blocker = createServer();
    await new Promise<void>((done) => blocker.listen({ host: '127.0.0.1', port: 0 }, done));
    const address = blocker.address();
    const port = typeof address === 'object' && address ? address.port : 0;
    let failure: Error | undefined;
    try {
      failure = await start({ port }).then(
        () => undefined,
        (error: Error) => error,
      );
    } finally {
      await new Promise((done) => blocker.close(done));
    }
    // Its message carries the server's last log lines.
    expect(failure?.message).toMatch(/port is taken/);
    for (const secret of passwords) expect(failure?.message).not.toContain(secret);
    expect(logged.length).toBeGreaterThan(0);
    for (const secret of passwords) {
      expect(logged.filter((line) => line.includes(secret))).toEqual([]);
    }
  });

  // A password changed by hand is one the folder's file may hold (the start's own remedy says
  // so): printable ASCII, a space inside it included; and a file that is present is never
  // reported missing.
  it('starts with a hand-set printable ASCII password holding a space, written into its file', async () => {
    const first = await start();
    const byHand = 'correct horse battery staple';
    await admin(first.url, `alter role postgres password '${byHand}'`);
    await first.stop();
    await writeFile(join(folder, PASSWORD_FILE), `${byHand}\n`, { mode: 0o600 });
    const failure = await start().then(
      (server) => {
        expect(decodeURIComponent(new URL(server.url).password)).toBe(byHand);
        return undefined;
      },
      (error: Error) => error,
    );
    // Before: the file was read as holding nothing, and the start failed saying it was missing.
    expect(failure?.message).toBeUndefined();
  });

  it('does not call a password file that is there, but refused, missing', async () => {
    const server = await start();
    await admin(server.url, "alter role postgres password 'another-by-hand'");
    await server.stop();
    // Not printable ASCII: a password this start does not take from the file.
    await writeFile(join(folder, PASSWORD_FILE), 'pässwort\n', { mode: 0o600 });
    const failure = await start().then(
      () => undefined,
      (error: Error) => error,
    );
    expect(failure).toMatchObject({ code: 'start_failed' });
    expect(failure?.message).not.toContain('is missing');
    expect(failure?.message).toContain(join(folder, PASSWORD_FILE));
  });
});
