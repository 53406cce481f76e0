/**
 * Server processes for the tests that run `ledgence-server` as an operator does (spawnMain), and
 * whether processes the tests started (a server, the postmaster it spawned) still run, read from
 * the outside as an operator would.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

/** Whether `pid` exists (signal 0; EPERM means it exists under another user, as `postgres`). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Exited, a zombie included (an orphan's new parent may be slow to reap it). */
export function gone(pid: number): boolean {
  if (!alive(pid)) return true;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return true;
  }
}

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..');
const main = join(root, 'apps', 'server', 'src', 'main.ts');
const loader = pathToFileURL(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;

/** A `ledgence-server` process started by {@link spawnMain}, watched from the outside. */
export interface MainRun {
  readonly child: ChildProcess;
  /** Everything it wrote to stderr so far (its human-readable start and stop lines). */
  readonly stderr: () => string;
  /** Everything it wrote to stdout so far (its JSON log), with `captureStdout`; '' without. */
  readonly stdout: () => string;
  /** The URL it printed as it started listening, or '' before that. */
  readonly url: () => string;
  /** Resolves with its exit code, or the signal that ended it. */
  readonly exited: Promise<number | string>;
  /** Resolves true once it printed its URL, false if it exited first. */
  readonly listening: Promise<boolean>;
}

/** How {@link spawnMain} runs the server. */
export interface SpawnMainOptions {
  /** Arguments after the entry point (the server takes none but `--help`). */
  args?: readonly string[];
  /** Node options before the loader (e.g. `--heapsnapshot-signal=SIGUSR2`). */
  nodeArgs?: readonly string[];
  /** A process group of its own, as a shell job is (to signal the whole group). */
  detached?: boolean;
  /** Working folder, when the test looks at what the server leaves in it. */
  cwd?: string;
  /** Keep stdout for {@link MainRun.stdout}; off, so a verbose log is not held in memory. */
  captureStdout?: boolean;
}

/**
 * Runs `main.ts` from sources as a real process, as an operator runs the built one: `env` over
 * this process's environment, `PORT=0` and log level `warn` unless `env` says otherwise. The
 * loader is imported into the one Node process (no `tsx` CLI parent), so a signal reaches the
 * server itself.
 */
export function spawnMain(env: Record<string, string>, options: SpawnMainOptions = {}): MainRun {
  const child = spawn(
    process.execPath,
    [
      ...(options.nodeArgs ?? []),
      '--import',
      loader,
      '--conditions=@ledgence/source',
      main,
      ...(options.args ?? []),
    ],
    {
      env: { ...process.env, PORT: '0', LEDGENCE_LOG_LEVEL: 'warn', ...env },
      stdio: ['ignore', options.captureStdout ? 'pipe' : 'ignore', 'pipe'],
      detached: options.detached ?? false,
      ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
    },
  );
  const output = { stdout: '', stderr: '' };
  let onListening: (ok: boolean) => void = () => {};
  const listening = new Promise<boolean>((done) => {
    onListening = done;
  });
  child.stdout?.setEncoding('utf8');
  child.stdout?.on('data', (chunk: string) => {
    output.stdout += chunk;
  });
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    output.stderr += chunk;
    if (/listening on http/.test(output.stderr)) onListening(true);
  });
  const exited = new Promise<number | string>((done) =>
    child.once('exit', (code, signal) => {
      onListening(false);
      done(code ?? signal ?? 'unknown');
    }),
  );
  return {
    child,
    stderr: () => output.stderr,
    stdout: () => output.stdout,
    url: () => /listening on (http:\/\/\S+)/.exec(output.stderr)?.[1] ?? '',
    exited,
    listening,
  };
}

/** `run`'s exit, SIGKILLing it first if it has not exited within `ms` (a hang). */
export async function exitWithin(run: MainRun, ms: number): Promise<number | string> {
  const timer = setTimeout(() => run.child.kill('SIGKILL'), ms);
  try {
    return await run.exited;
  } finally {
    clearTimeout(timer);
  }
}

/** Whether `check` held within `ms`, polled every `everyMs`. */
export async function waitUntil(check: () => boolean, ms: number, everyMs = 100): Promise<boolean> {
  for (let waited = 0; waited < ms; waited += everyMs) {
    if (check()) return true;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  return check();
}
