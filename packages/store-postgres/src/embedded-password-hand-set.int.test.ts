/**
 * Review of the per-folder password (cdc4f03): a password changed by hand is one the folder's
 * `ledgence-password` may hold (the start's own remedy says so), printable ASCII as the kept
 * format's comment promises, a space inside it included; and a file that is present is never
 * reported missing.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import postgres from 'postgres';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { type EmbeddedPostgres, startEmbeddedPostgres } from './embedded.js';

const PASSWORD_FILE = 'ledgence-password';

let base: string;
let folder: string;
const running: EmbeddedPostgres[] = [];

async function start(): Promise<EmbeddedPostgres> {
  const server = await startEmbeddedPostgres({ dataDir: folder, durability: 'fast' });
  running.push(server);
  return server;
}

async function admin(url: string, statement: string): Promise<void> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    await sql.unsafe(statement);
  } finally {
    await sql.end();
  }
}

beforeAll(async () => {
  base = await mkdtemp(join(tmpdir(), 'ledgence-embedded-password-hand-set-'));
  // As root the server runs as the OS user `postgres`, which must be able to enter it.
  await chmod(base, 0o755);
  folder = join(base, 'pg');
});

afterEach(async () => {
  await Promise.all(running.splice(0).map((server) => server.stop()));
});

afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

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
