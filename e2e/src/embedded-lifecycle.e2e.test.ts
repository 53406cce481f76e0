/**
 * The server's embedded PostgreSQL as an operator meets it (README "After a crash",
 * "Start failures", "Errors say what to do"), with real `main.ts` processes. Each test uses its
 * own data folder under /tmp (a copy of one initialised template where the test does not need a
 * fresh one) and stops every process it started.
 */
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { waitUntil } from './processes.js';
import {
  type ServerProcessOptions,
  type SpawnedServer,
  spawnServerProcess,
} from './server-process.js';

/** Whether this process may chown folders and run processes as other users. */
const AS_ROOT = process.getuid?.() === 0;

const runs: SpawnedServer[] = [];
const dirs: string[] = [];

/** The server on embedded PostgreSQL with `env`; stopped after the test. */
function spawnMain(env: Record<string, string>, options: ServerProcessOptions = {}): SpawnedServer {
  const run = spawnServerProcess({ DATABASE_URL: '', ...env }, options);
  runs.push(run);
  return run;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Live (non-zombie) processes whose working directory is `dataDir`: its postmaster and children. */
function postgresIn(dataDir: string): number[] {
  let real: string;
  try {
    real = realpathSync(dataDir);
  } catch {
    return [];
  }
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readlinkSync(`/proc/${entry}/cwd`) !== real) continue;
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')) continue;
      pids.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

/** Processes whose command line mentions `text` (initdb of a staging folder). */
function processesMentioning(text: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')) continue;
      if (cmd.includes(text)) pids.push(Number(entry));
    } catch {
      // gone
    }
  }
  return pids;
}

function folder(): string {
  const dir = mkdtempSync(join(tmpdir(), 'ledgence-embedded-'));
  chmodSync(dir, 0o755); // root runs PostgreSQL as `postgres`, which must enter it
  dirs.push(dir);
  return join(dir, 'pg');
}

let template: string;

beforeAll(async () => {
  template = folder();
  const run = spawnMain({ LEDGENCE_DATA_DIR: template });
  expect(await run.listening, run.stderr()).toBe(true);
  run.child.kill('SIGTERM');
  expect(await run.exited).toBe(0);
}, 120_000);

/** A copy of the initialised, cleanly stopped template cluster (owner and modes kept). */
function initialisedFolder(): string {
  const dataDir = folder();
  execFileSync('cp', ['-a', template, dataDir]);
  return dataDir;
}

afterEach(async () => {
  for (const run of runs.splice(0)) {
    if (run.child.exitCode === null && run.child.signalCode === null) {
      run.child.kill('SIGTERM');
      const timer = setTimeout(() => run.child.kill('SIGKILL'), 20_000);
      await run.exited;
      clearTimeout(timer);
    }
  }
});

afterAll(async () => {
  for (const dir of dirs) {
    for (const pid of postgresIn(join(dir, 'pg'))) {
      try {
        process.kill(pid, 'SIGQUIT');
      } catch {}
    }
  }
  await sleep(500);
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe('after a crash that took the embedded PostgreSQL down too', () => {
  it('SIGKILL of the server and of the postmaster process group at once (a cgroup kill): the next start serves', async () => {
    const dataDir = initialisedFolder();
    const run = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await run.listening, run.stderr()).toBe(true);
    const postmaster = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    run.child.kill('SIGKILL');
    process.kill(-postmaster, 'SIGKILL'); // the postmaster runs in a group of its own
    await run.exited;
    expect(await waitUntil(() => postgresIn(dataDir).length === 0, 10_000)).toBe(true);
    expect(existsSync(join(dataDir, 'postmaster.pid')), 'a stale pid file is left').toBe(true);

    const again = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await again.listening, again.stderr()).toBe(true);
    expect((await fetch(`${again.url()}/readyz`)).status).toBe(200);
    again.child.kill('SIGTERM');
    expect(await again.exited).toBe(0);
    expect(await waitUntil(() => postgresIn(dataDir).length === 0, 10_000)).toBe(true);
  }, 60_000);

  it('SIGKILL of the server and of the postmaster alone (its children left to notice): the next start serves', async () => {
    const dataDir = initialisedFolder();
    const run = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await run.listening, run.stderr()).toBe(true);
    const postmaster = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    run.child.kill('SIGKILL');
    process.kill(postmaster, 'SIGKILL');
    await run.exited;

    const again = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await again.listening, again.stderr()).toBe(true);
    expect((await fetch(`${again.url()}/readyz`)).status).toBe(200);
  }, 60_000);

  it('SIGKILL of the server process group during the first initdb: the next start initialises and serves, no initdb left', async () => {
    const dataDir = folder();
    const parent = dirname(dataDir);
    const run = spawnMain({ LEDGENCE_DATA_DIR: dataDir }, { detached: true });
    const staging = () =>
      readdirSync(parent).find(
        (name) => name.startsWith(`${basename(dataDir)}.initdb-`) && !name.endsWith('.pwfile'),
      );
    // Killed once initdb has begun writing its staging folder.
    expect(
      await waitUntil(
        () => {
          const name = staging();
          return name !== undefined && existsSync(join(parent, name, 'PG_VERSION'));
        },
        60_000,
        50,
      ),
      run.stderr(),
    ).toBe(true);
    const pid = run.child.pid ?? 0;
    process.kill(-pid, 'SIGKILL');
    await run.exited;
    expect(existsSync(join(dataDir, 'PG_VERSION')), 'no half cluster at the data folder').toBe(
      false,
    );
    expect(await waitUntil(() => processesMentioning(parent).length === 0, 10_000)).toBe(true);

    const again = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await again.listening, again.stderr()).toBe(true);
    expect((await fetch(`${again.url()}/readyz`)).status).toBe(200);
  }, 90_000);
});

describe('two servers started at once on one data folder', () => {
  async function race(dataDir: string): Promise<void> {
    const a = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    const b = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    const [upA, upB] = await Promise.all([a.listening, b.listening]);
    expect([upA, upB].filter(Boolean), `${a.stderr()}\n---\n${b.stderr()}`).toHaveLength(1);
    const [winner, loser] = upA ? [a, b] : [b, a];
    expect(await loser.exited, loser.stderr()).toBe(1);
    expect(loser.stderr()).toMatch(
      /Another PostgreSQL server \(pid \d+\) is running in .*Stop it, or use another data folder/,
    );
    expect((await fetch(`${winner.url()}/readyz`)).status).toBe(200);
    // One postmaster, the winner's; the loser's postmaster (if it spawned one) is gone.
    const postmaster = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    const owner = readFileSync(join(dataDir, 'ledgence-owner.pid'), 'utf8')
      .trim()
      .split(/\s+/)
      .map(Number);
    expect(owner, 'the owner file names the live server and its postmaster').toEqual([
      winner.child.pid,
      postmaster,
    ]);
    // The winner crashes: the next start still recovers the folder (README "After a crash").
    winner.child.kill('SIGKILL');
    await winner.exited;
    const again = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await again.listening, again.stderr()).toBe(true);
    again.child.kill('SIGTERM');
    expect(await again.exited).toBe(0);
    expect(await waitUntil(() => postgresIn(dataDir).length === 0, 10_000)).toBe(true);
  }

  it('on a fresh folder: one serves, the other exits 1 saying what to do, and a crash of the one is recovered', async () => {
    await race(folder());
  }, 90_000);

  it('on an initialised folder: one serves, the other exits 1 saying what to do, and a crash of the one is recovered', async () => {
    await race(initialisedFolder());
  }, 90_000);
});

describe('a data folder the server cannot use: exit 1, a message saying what to do, no postmaster left', () => {
  it('a cluster of another PostgreSQL major version: says to keep it, names LEDGENCE_DATA_DIR', async () => {
    const dataDir = initialisedFolder();
    writeFileSync(join(dataDir, 'PG_VERSION'), '16\n');
    const run = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await run.exited, run.stderr()).toBe(1);
    expect(run.stderr()).toMatch(/holds a PostgreSQL 16 cluster/);
    expect(run.stderr()).toContain('LEDGENCE_DATA_DIR');
    expect(run.stderr()).not.toMatch(/delete/i);
    expect(postgresIn(dataDir)).toEqual([]);
  }, 60_000);

  it('a folder left world-writable (mode 0777): the server fixes the mode and serves', async () => {
    const dataDir = initialisedFolder();
    chmodSync(dataDir, 0o777);
    const run = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await run.listening, run.stderr()).toBe(true);
    expect(statSync(dataDir).mode & 0o777).toBe(0o700);
  }, 60_000);

  // Root only: it hands folders and processes to other OS users (these machines run as root).
  it.runIf(AS_ROOT)(
    'an initialised cluster under a parent folder the server OS user cannot enter: says so, and does not advise deleting the whole folder',
    async () => {
      // As root the embedded PostgreSQL runs as `postgres`; a folder under a 0700 parent (e.g.
      // /root/…) initialised elsewhere, then moved there. initdb of a fresh folder there explains
      // it (`chmod o+x`); a start of an existing one must not tell the operator to delete it.
      const dataDir = initialisedFolder();
      chmodSync(dirname(dataDir), 0o700);
      const run = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
      const code = await run.exited;
      const stderr = run.stderr();
      expect(code, stderr).toBe(1);
      expect(postgresIn(dataDir)).toEqual([]);
      expect(stderr, 'names the permission problem and its fix').toMatch(/permission|chmod|enter/i);
      expect(stderr, 'the data is whole: deleting it is not the remedy').not.toMatch(/delete it/i);
      expect(existsSync(join(dataDir, 'PG_VERSION'))).toBe(true);
    },
    60_000,
  );

  // Root only: it hands folders and processes to other OS users (these machines run as root).
  it.runIf(AS_ROOT)(
    'an initialised cluster with a file owned by another user inside: handed to the server user whole, and served',
    async () => {
      // The folder itself is the server user's, so takeOwnership does not chown it; one file in
      // it is root's (restored or edited as root).
      const dataDir = initialisedFolder();
      const control = join(dataDir, 'global', 'pg_control');
      chownSync(control, 0, 0);
      chmodSync(control, 0o600);
      const run = spawnMain({ LEDGENCE_DATA_DIR: dataDir });
      // As root the folder is handed to the server's user whole once PostgreSQL says permission
      // denied (takeOwnership's promise for a folder "from a copy, a backup"), and it serves.
      expect(await run.listening, run.stderr()).toBe(true);
      expect(statSync(control).uid).toBe(statSync(dataDir).uid);
    },
    60_000,
  );

  // Root only: it hands folders and processes to other OS users (these machines run as root).
  it.runIf(AS_ROOT)(
    'a cluster owned by another OS user, run as a non-root user: says who owns it and to chown it (never initdb over it)',
    async () => {
      // takeOwnership's JSDoc: "otherwise say plainly that another user owns it" ("belongs to uid
      // N … chown -R it to this user"). Here: a folder a root run made (owned by `postgres`) in a
      // /tmp-like parent (1777), then started as an ordinary user (nobody).
      const dataDir = initialisedFolder();
      chmodSync(dirname(dataDir), 0o1777);
      const owner = statSync(dataDir).uid;
      expect(owner).not.toBe(65534);
      const run = spawnMain(
        { LEDGENCE_DATA_DIR: dataDir, HOME: '/tmp' },
        { uid: 65534, gid: 65534 },
      );
      const code = await run.exited;
      const stderr = run.stderr();
      expect(code, stderr).toBe(1);
      expect(stderr).toContain(`belongs to uid ${owner}`);
      expect(stderr).toMatch(/chown/);
      expect(readdirSync(dirname(dataDir)), 'no initdb staging left').toEqual(['pg']);
    },
    60_000,
  );
});
