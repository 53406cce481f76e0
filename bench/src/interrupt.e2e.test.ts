/**
 * An interrupted benchmark leaves nothing running: the real `run.ts` with its own embedded
 * PostgreSQL and a real server process, sent SIGTERM in the middle of a shape.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterEach, expect, it } from 'vitest';

const benchDir = join(dirname(fileURLToPath(import.meta.url)), '..');
const root = join(benchDir, '..');
const results = join(benchDir, 'results', 'latest.json');

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

const leftovers: number[] = [];
const folders: string[] = [];
afterEach(async () => {
  // Only if the test failed: nothing it started may outlive it.
  for (const pid of leftovers.splice(0)) if (alive(pid)) process.kill(pid, 'SIGKILL');
  for (const folder of folders.splice(0)) await rm(folder, { recursive: true, force: true });
});

/** Resolves with the first match of `pattern` in what the child has printed so far or prints. */
function waitFor(child: ChildProcess, output: () => string, pattern: RegExp): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const check = () => {
      const match = pattern.exec(output());
      if (match === null) return;
      child.stdout?.off('data', check);
      child.off('exit', early);
      resolve([...match]);
    };
    const early = () => reject(new Error(`the benchmark exited before ${pattern}:\n${output()}`));
    child.stdout?.on('data', check);
    child.once('exit', early);
    check();
  });
}

it('on SIGTERM mid-shape stops its server and embedded PostgreSQL, writes no results and exits 143', async () => {
  const dataDir = await mkdtemp(join(tmpdir(), 'ledgence-bench-signal-'));
  folders.push(dataDir);
  // As root the embedded server runs as the `postgres` user, which must enter this folder.
  await chmod(dataDir, 0o755);
  const resultsBefore = await readFile(results, 'utf8').catch(() => undefined);

  const loader = pathToFileURL(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    LEDGENCE_BENCH_DATA_DIR: dataDir,
    // From sources (tests need no build); the server inherits the loader through NODE_OPTIONS.
    LEDGENCE_BENCH_SERVER_ENTRY: join(root, 'apps', 'server', 'src', 'main.ts'),
    NODE_OPTIONS: `--import=${loader} --conditions=@ledgence/source`,
  };
  // Always the embedded server: this test checks that its postmaster stops, and the benchmark
  // must not drop and create its databases on a server the user named for the tests.
  delete env.DATABASE_URL;
  // Full sizes: the pickup shape alone takes over a minute, so the signal lands inside it.
  const bench = spawn(
    process.execPath,
    [join(benchDir, 'src', 'run.ts'), '--only', 'pickup', '--systems', 'ledgence', '--reps', '1'],
    { cwd: benchDir, env, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  bench.stdout.setEncoding('utf8').on('data', (chunk: string) => {
    output += chunk;
  });
  bench.stderr.setEncoding('utf8').on('data', (chunk: string) => {
    output += chunk;
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    bench.once('exit', (code, signal) => resolve({ code, signal })),
  );
  leftovers.push(bench.pid ?? -1);

  const [, serverPid] = await waitFor(bench, () => output, /Ledgence server pid (\d+)/);
  leftovers.push(Number(serverPid));
  const pidFile = join(dataDir, 'pg', 'postmaster.pid');
  const postmasterPid = Number((await readFile(pidFile, 'utf8')).split('\n')[0]);
  leftovers.push(postmasterPid);
  await waitFor(bench, () => output, /rep 1\/1 · pickup latency/);
  expect(alive(Number(serverPid))).toBe(true);
  expect(alive(postmasterPid)).toBe(true);

  bench.kill('SIGTERM');
  const deadline = setTimeout(() => bench.kill('SIGKILL'), 60_000);
  const exit = await exited;
  clearTimeout(deadline);

  // Exited by itself with the shell's code for SIGTERM, not killed by it (nor by the deadline).
  expect(exit, output).toEqual({ code: 143, signal: null });
  expect(output).toContain(
    'SIGTERM: stopping the Ledgence server and the embedded PostgreSQL (SIGTERM again exits at once)',
  );
  expect(alive(Number(serverPid))).toBe(false);
  expect(alive(postmasterPid)).toBe(false);
  // A clean shutdown removes the pid file; a killed postmaster would leave it.
  expect(existsSync(pidFile)).toBe(false);
  expect(await readFile(results, 'utf8').catch(() => undefined)).toBe(resultsBefore);
});
