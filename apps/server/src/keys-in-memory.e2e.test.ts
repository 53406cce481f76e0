/**
 * DESIGN §6 "Keys are configured by the operator … only a hash of each key
 * is held in memory"; auth.ts `ApiKeyConfig.key`: "The secret bearer token. Hashed at start; the
 * text is not retained."
 *
 * The real server process (main.ts from sources) reads its keys from LEDGENCE_API_KEYS_FILE (so
 * the key is in no environment variable), serves a request, and is asked for a V8 heap snapshot
 * (`--heapsnapshot-signal`, which collects garbage first). The key's text must not be in it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, expect, it } from 'vitest';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const main = join(root, 'apps', 'server', 'src', 'main.ts');
const loader = pathToFileURL(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;

let db: TestDatabase;
let dir: string;
let child: ChildProcess | undefined;
beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'keys_memory' });
  dir = mkdtempSync(join(tmpdir(), 'ledgence-keys-memory-'));
});
afterAll(async () => {
  if (child !== undefined && child.exitCode === null) {
    const exited = new Promise((done) => child?.once('exit', done));
    child.kill('SIGTERM');
    await exited;
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
  const proc = spawn(
    process.execPath,
    ['--heapsnapshot-signal=SIGUSR2', '--import', loader, '--conditions=@ledgence/source', main],
    {
      cwd: dir,
      env: {
        ...process.env,
        DATABASE_URL: db.url,
        PORT: '0',
        LEDGENCE_LOG_LEVEL: 'warn',
        LEDGENCE_API_KEYS_FILE: keysFile,
        LEDGENCE_API_KEYS: '',
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  child = proc;
  let stderr = '';
  proc.stderr?.setEncoding('utf8');
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no start:\n${stderr}`)), 60_000);
    proc.stderr?.on('data', (chunk: string) => {
      stderr += chunk;
      const match = /listening on (http:\/\/\S+)/.exec(stderr);
      if (match?.[1] !== undefined) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    proc.once('exit', (code) => reject(new Error(`exited ${code}:\n${stderr}`)));
  });
  const reply = await fetch(`${url}/v1/tenants/acme/namespaces/dev/tasks`, {
    headers: { authorization: `Bearer ${key}` },
  });
  expect(reply.status).toBe(200);
  await reply.arrayBuffer();

  proc.kill('SIGUSR2');
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
