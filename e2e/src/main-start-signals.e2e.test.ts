/**
 * Signals while `ledgence-server` starts its embedded PostgreSQL.
 *
 * main.ts: "a second signal exits at once … process.exit still sends the embedded database a fast
 * shutdown (embedded.ts)"; README "Running the server": "a second signal exits at once" and "The
 * embedded PostgreSQL runs in a process group of its own, so Ctrl-C reaches only the server, which
 * stops the database". A user pressing Ctrl-C twice while the server starts must not be left with
 * a detached PostgreSQL running in the background after the server process is gone.
 */
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { alive, exitWithin, gone, waitUntil } from './processes.js';
import { spawnServerProcess } from './server-process.js';

const dirs: string[] = [];
const postmasters = new Set<number>();

afterAll(async () => {
  for (const pid of postmasters) {
    if (alive(pid)) process.kill(pid, 'SIGINT');
    await waitUntil(() => gone(pid), 20_000);
  }
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe('two signals while the embedded PostgreSQL is starting', () => {
  it('Ctrl-C twice during start-up exits at once and leaves no PostgreSQL running behind it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ledgence-start-signals-'));
    chmodSync(dir, 0o755);
    dirs.push(dir);
    const dataDir = join(dir, 'pg');
    const run = spawnServerProcess({ DATABASE_URL: '', LEDGENCE_DATA_DIR: dataDir });
    // The postmaster writes its pid file as it starts, before it is ready: the signals land then.
    const pidFile = join(dataDir, 'postmaster.pid');
    await waitUntil(() => existsSync(pidFile) || run.child.exitCode !== null, 60_000, 2);
    expect(existsSync(pidFile), `the postmaster started:\n${run.stderr()}`).toBe(true);
    const postmaster = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
    expect(postmaster).toBeGreaterThan(0);
    postmasters.add(postmaster);
    run.child.kill('SIGINT');
    await new Promise((r) => setTimeout(r, 20));
    run.child.kill('SIGINT');
    const code = await exitWithin(run, 60_000);
    const stderr = run.stderr();
    expect(stderr, 'the signals arrived before the server listened').not.toContain('listening on');
    expect(stderr).toContain('again: exiting now');
    expect(code).toBe(1);
    // A fast shutdown takes well under a second on an idle folder; give it 10 s.
    await waitUntil(() => gone(postmaster), 10_000);
    expect(
      gone(postmaster),
      `postmaster ${postmaster} is still running after the server exited:\n${stderr}`,
    ).toBe(true);
  }, 120_000);
});
