/**
 * Signals while `ledgence-server` starts its embedded PostgreSQL.
 *
 * main.ts: "a second signal exits at once … process.exit still sends the embedded database a fast
 * shutdown (embedded.ts)"; README "Running the server": "a second signal exits at once" and "The
 * embedded PostgreSQL runs in a process group of its own, so Ctrl-C reaches only the server, which
 * stops the database". A user pressing Ctrl-C twice while the server starts must not be left with
 * a detached PostgreSQL running in the background after the server process is gone.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { alive, gone } from './testdata/processes.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const main = join(root, 'apps', 'server', 'src', 'main.ts');
const loader = pathToFileURL(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;

const dirs: string[] = [];
const postmasters = new Set<number>();

afterAll(async () => {
  for (const pid of postmasters) {
    if (alive(pid)) process.kill(pid, 'SIGINT');
    for (let i = 0; i < 200 && !gone(pid); i++) await new Promise((r) => setTimeout(r, 100));
  }
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe('two signals while the embedded PostgreSQL is starting', () => {
  it('Ctrl-C twice during start-up exits at once and leaves no PostgreSQL running behind it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ledgence-start-signals-'));
    chmodSync(dir, 0o755);
    dirs.push(dir);
    const dataDir = join(dir, 'pg');
    const child: ChildProcess = spawn(
      process.execPath,
      ['--import', loader, '--conditions=@ledgence/source', main],
      {
        env: {
          ...process.env,
          PORT: '0',
          LEDGENCE_LOG_LEVEL: 'warn',
          DATABASE_URL: '',
          LEDGENCE_DATA_DIR: dataDir,
        },
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    let stderr = '';
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      stderr += chunk;
    });
    const exited = new Promise<number | string>((done) =>
      child.once('exit', (code, signal) => done(code ?? signal ?? 'unknown')),
    );
    // The postmaster writes its pid file as it starts, before it is ready: the signals land then.
    const pidFile = join(dataDir, 'postmaster.pid');
    for (let waited = 0; waited < 60_000 && !existsSync(pidFile); waited += 2) {
      if (child.exitCode !== null) break;
      await new Promise((r) => setTimeout(r, 2));
    }
    expect(existsSync(pidFile), `the postmaster started:\n${stderr}`).toBe(true);
    const postmaster = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
    expect(postmaster).toBeGreaterThan(0);
    postmasters.add(postmaster);
    child.kill('SIGINT');
    await new Promise((r) => setTimeout(r, 20));
    child.kill('SIGINT');
    const killer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    const code = await exited;
    clearTimeout(killer);
    expect(stderr, 'the signals arrived before the server listened').not.toContain('listening on');
    expect(stderr).toContain('again: exiting now');
    expect(code).toBe(1);
    // A fast shutdown takes well under a second on an idle folder; give it 10 s.
    for (let i = 0; i < 100 && !gone(postmaster); i++) await new Promise((r) => setTimeout(r, 100));
    expect(
      gone(postmaster),
      `postmaster ${postmaster} is still running after the server exited:\n${stderr}`,
    ).toBe(true);
  }, 120_000);
});
