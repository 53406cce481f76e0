/**
 * `ledgence-server` (main.ts, run from sources as a real process): what it tells an operator
 * whose configuration cannot be used (DESIGN §11: "validated … at start, clear message on
 * error"), and a signal while it is still starting (DESIGN §11: `SIGTERM` stops the server;
 * embedded.ts: no postmaster outlives the process).
 */
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { alive, exitWithin, waitUntil } from './processes.js';
import { spawnServerProcess } from './server-process.js';

describe('arguments and misspelled variables (the server reads only its environment)', () => {
  const folder = mkdtempSync(join(tmpdir(), 'ledgence-args-'));
  afterAll(() => rmSync(folder, { recursive: true, force: true }));

  it('--help prints the usage with the variables and exits 0, starting nothing', async () => {
    const dataDir = join(folder, 'help-pg');
    const run = spawnServerProcess(
      { LEDGENCE_DATA_DIR: dataDir },
      { args: ['--help'], captureStdout: true },
    );
    const code = await exitWithin(run, 60_000);
    // It started a server with an embedded PostgreSQL in the current folder.
    expect({
      code,
      usage: run.stdout().startsWith('Usage: ledgence-server'),
      namesKeys: run.stdout().includes('LEDGENCE_API_KEYS_FILE'),
      dataDirMade: existsSync(dataDir),
    }).toEqual({ code: 0, usage: true, namesKeys: true, dataDirMade: false });
  }, 90_000);

  it('any other argument: exit 2 saying it takes none, with the usage, starting nothing', async () => {
    const dataDir = join(folder, 'arg-pg');
    const run = spawnServerProcess({ LEDGENCE_DATA_DIR: dataDir }, { args: ['--port=9000'] });
    const code = await exitWithin(run, 60_000);
    expect({
      code,
      says: run.stderr().includes('takes no arguments (got "--port=9000")'),
      usage: run.stderr().includes('Usage: ledgence-server'),
      dataDirMade: existsSync(dataDir),
    }).toEqual({ code: 2, says: true, usage: true, dataDirMade: false });
  }, 90_000);

  it('a misspelled LEDGENCE_ variable is named with the one it probably means', async () => {
    // A refused DATABASE_URL ends the run at configuration, after the warning.
    const run = spawnServerProcess({
      DATABASE_URL: 'postgres://ledgence@127.0.0.1:99999/ledgence',
      LEDGENCE_API_KEYS_FLE: join(folder, 'keys.json'),
    });
    const code = await exitWithin(run, 60_000);
    expect(code).toBe(2);
    expect(run.stderr()).toContain(
      'warning: LEDGENCE_API_KEYS_FLE is not a setting of the server (did you mean LEDGENCE_API_KEYS_FILE?)',
    );
  }, 90_000);
});

describe('a DATABASE_URL the server cannot use', () => {
  it('a port out of range: exit 2 with a problem naming DATABASE_URL, never the password', async () => {
    const run = spawnServerProcess({
      DATABASE_URL: 'postgres://ledgence:hunter2@127.0.0.1:99999/ledgence',
    });
    const code = await exitWithin(run, 60_000);
    // Unchecked, it exited 1 with "Ledgence failed to start: Invalid URL".
    expect(run.stderr()).not.toContain('hunter2');
    expect(run.stderr()).toContain('DATABASE_URL');
    expect(code).toBe(2);
  }, 90_000);

  it('an unencoded @ (and a comma) in the password: exit 2 saying to write %40, never any part of the password', async () => {
    // A generated password `pa@ss,w0rd`, pasted without percent-encoding: postgres.js would read
    // `ss,w0rd@127.0.0.1:5432` as a host list, and its connect error named the "host"
    // `w0rd@127.0.0.1`, the tail of the password, on stderr.
    const run = spawnServerProcess({
      DATABASE_URL: 'postgres://ledgence:pa@ss,w0rd@127.0.0.1:5432/ledgence',
      LEDGENCE_LOG_LEVEL: 'trace',
    });
    const code = await exitWithin(run, 60_000);
    expect(code).toBe(2);
    expect(run.stderr()).toContain('DATABASE_URL has more than one @');
    expect(run.stderr()).toContain('%40');
    for (const part of ['pa@ss', 'ss,w0rd', 'w0rd']) expect(run.stderr()).not.toContain(part);
  }, 90_000);

  it('two hosts, both refusing: the start fails with a message instead of hanging', async () => {
    // postgres.js swallowed every connect error when several hosts were given, and the start
    // waited forever with no output (porsager/postgres#1174; patched in patches/).
    const run = spawnServerProcess({
      DATABASE_URL: 'postgres://ledgence:hunter2@127.0.0.1:1,127.0.0.1:2/ledgence',
    });
    const code = await exitWithin(run, 45_000);
    expect(code).toBe(1);
    expect(run.stderr()).toMatch(/failed to start: .*ECONNREFUSED/);
    expect(run.stderr()).not.toContain('hunter2');
  }, 90_000);
});

describe('a signal while the server is starting', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ledgence-main-startup-'));
  // Root runs PostgreSQL as the OS user `postgres`, which must be able to enter the folder.
  chmodSync(dir, 0o755);
  const dataDir = join(dir, 'pg');
  let orphan: number | undefined;

  afterAll(async () => {
    // Should the test fail, stop the postmaster it left behind (fast shutdown).
    if (orphan !== undefined && alive(orphan)) {
      process.kill(orphan, 'SIGINT');
      for (let i = 0; i < 100 && alive(orphan); i++) await new Promise((r) => setTimeout(r, 100));
    }
    rmSync(dir, { recursive: true, force: true });
  });

  it('SIGTERM during start-up stops the embedded PostgreSQL, then the process', async () => {
    // Handlers installed only once started let the signal's default action end Node at once:
    // the postmaster, now a child of init, kept the data folder ("Another PostgreSQL server").
    const run = spawnServerProcess({ DATABASE_URL: '', LEDGENCE_DATA_DIR: dataDir });
    // The postmaster writes its pid file as it starts; the server then connects and migrates.
    const pidFile = join(dataDir, 'postmaster.pid');
    await waitUntil(() => existsSync(pidFile) || run.child.exitCode !== null, 60_000, 5);
    expect(existsSync(pidFile), `the postmaster started:\n${run.stderr()}`).toBe(true);
    const postmaster = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
    expect(run.stderr(), 'the signal arrives before the server listens').not.toContain(
      'listening on',
    );
    run.child.kill('SIGTERM');
    const code = await run.exited;
    for (let i = 0; i < 20 && alive(postmaster); i++) await new Promise((r) => setTimeout(r, 100));
    if (alive(postmaster)) orphan = postmaster;
    expect(alive(postmaster), `postmaster ${postmaster} outlived the server`).toBe(false);
    expect(code, run.stderr()).toBe(0);
    expect(run.stderr()).not.toContain('listening on');
  }, 120_000);
});
