/**
 * Runs the real server (`src/main.ts`) as a child process, from its TypeScript sources or as
 * built (`LEDGENCE_TEST_SERVER`), as an operator runs it, for tests over real sockets.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const main = join(root, 'apps', 'server', 'src', 'main.ts');
const built = join(root, 'apps', 'server', 'dist', 'main.js');

/**
 * Node arguments that run a TypeScript entry point from sources. tsx's loader
 * is imported into the one Node process rather than run through the `tsx`
 * CLI: the CLI is a parent process that relays SIGTERM but cannot relay
 * SIGKILL, so killing it would orphan the real process (still listening,
 * still holding leases) instead of crashing it.
 */
export function sourceArgs(entry: string): string[] {
  const loader = pathToFileURL(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  return ['--import', loader, '--conditions=@ledgence/source', entry];
}

/**
 * Node arguments that run the server: from its sources (the default: a test run needs no build),
 * or, with `LEDGENCE_TEST_SERVER=dist`, as built (`apps/server/dist/main.js`, what `pnpm start`
 * runs). CI sets it right after its build: a built server is listening in ~0.5 s where one run
 * through tsx takes ~1.2 s, and a run starts several hundred.
 */
function serverArgs(): string[] {
  const from = process.env.LEDGENCE_TEST_SERVER;
  if (from === undefined || from === '' || from === 'src') return sourceArgs(main);
  if (from !== 'dist') {
    throw new Error(`LEDGENCE_TEST_SERVER must be "src" or "dist", not ${JSON.stringify(from)}`);
  }
  if (!existsSync(built)) {
    throw new Error(`LEDGENCE_TEST_SERVER=dist, but ${built} is missing: run \`pnpm build\` first`);
  }
  return [built];
}

/** A server child process. */
export interface ServerProcess {
  readonly url: string;
  readonly child: ChildProcess;
  /** Everything the process wrote to stderr (its human-readable start and stop lines). */
  readonly stderr: () => string;
  /** Everything it wrote to stdout (its JSON log lines) with `captureStdout`; '' without. */
  readonly stdout: () => string;
  /** Resolves with the exit code (or the signal name) once the process has exited. */
  readonly exited: Promise<number | string>;
  /** Sends `signal` (default SIGTERM) and waits for the exit. */
  stop(signal?: NodeJS.Signals): Promise<number | string>;
}

/** How {@link spawnServerProcess} and {@link startServerProcess} run the server. */
export interface ServerProcessOptions {
  /**
   * Keep stdout for {@link ServerProcess.stdout}: the tests that read the server's logs. Off by
   * default, so a long test at a verbose level does not hold every line in memory.
   */
  captureStdout?: boolean;
  /** A process group of its own, as a shell job is (to signal the whole group). */
  detached?: boolean;
  /** Run as this OS user and group (the test runs as root). */
  uid?: number;
  gid?: number;
  /** Arguments after the entry point (the server takes none but `--help`). */
  args?: readonly string[];
  /** Node options before the entry point (e.g. `--heapsnapshot-signal=SIGUSR2`). */
  nodeArgs?: readonly string[];
  /** Working folder, when the test looks at what the server leaves in it. */
  cwd?: string;
}

/** A server process as {@link spawnServerProcess} started it, watched from the outside. */
export interface SpawnedServer {
  readonly child: ChildProcess;
  /** Everything it wrote to stderr so far. */
  readonly stderr: () => string;
  /** Everything it wrote to stdout so far, with `captureStdout`; '' without. */
  readonly stdout: () => string;
  /** The URL it printed as it started listening, or '' before that. */
  readonly url: () => string;
  /** Resolves with the exit code (or the signal name) once the process has exited. */
  readonly exited: Promise<number | string>;
  /** Like `exited`, once all it wrote has been read too. */
  readonly closed: Promise<number | string>;
  /** Resolves true once it printed its URL, false if it exited first. */
  readonly listening: Promise<boolean>;
}

/**
 * Starts a server process with `env` added to this process's environment (`PORT=0` and log
 * level `warn` unless given), without waiting for it: for tests that watch a start that may
 * fail, hang or be killed on the way.
 */
export function spawnServerProcess(
  env: Record<string, string>,
  options: ServerProcessOptions = {},
): SpawnedServer {
  const argv = [...(options.nodeArgs ?? []), ...serverArgs(), ...(options.args ?? [])];
  const child = spawn(process.execPath, argv, {
    env: { ...process.env, PORT: '0', LEDGENCE_LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', options.captureStdout ? 'pipe' : 'ignore', 'pipe'],
    detached: options.detached ?? false,
    ...(options.uid === undefined ? {} : { uid: options.uid }),
    ...(options.gid === undefined ? {} : { gid: options.gid }),
    ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
  });
  const output = { stdout: '', stderr: '' };
  let onListening: (ok: boolean) => void = () => {};
  const listening = new Promise<boolean>((resolve) => {
    onListening = resolve;
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
  const ended = (event: 'exit' | 'close') =>
    new Promise<number | string>((resolve) => {
      child.once(event, (code, signal) => {
        onListening(false);
        resolve(code ?? signal ?? 'unknown');
      });
    });
  return {
    child,
    stderr: () => output.stderr,
    stdout: () => output.stdout,
    url: () => /listening on (http:\/\/\S+)/.exec(output.stderr)?.[1] ?? '',
    exited: ended('exit'),
    closed: ended('close'),
    listening,
  };
}

/** The server exited before it printed its URL: its exit code and everything it wrote. */
export class ServerStartError extends Error {
  constructor(
    readonly code: number | string,
    /** stderr, after stdout when it was captured. */
    readonly output: string,
  ) {
    super(`server exited (${code}) before listening:\n${output}`);
    this.name = 'ServerStartError';
  }
}

/**
 * Starts a server process with `env` added to this process's environment
 * (`PORT=0` unless given) and resolves once it prints its URL; rejects with
 * {@link ServerStartError} if it exits first.
 */
export async function startServerProcess(
  env: Record<string, string>,
  options: ServerProcessOptions = {},
): Promise<ServerProcess> {
  const run = spawnServerProcess(env, options);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    run.child.kill('SIGKILL');
  }, 60_000);
  const up = await run.listening;
  clearTimeout(timer);
  if (timedOut) throw new Error(`server did not start within 60 s:\n${run.stderr()}`);
  if (!up) {
    // 'close', not 'exit': only then has everything the process wrote been read.
    const code = await run.closed;
    throw new ServerStartError(code, run.stdout() + run.stderr());
  }
  const { child, stderr, stdout, exited } = run;
  return {
    url: run.url(),
    child,
    stderr,
    stdout,
    exited,
    stop: (signal = 'SIGTERM') => {
      child.kill(signal);
      return exited;
    },
  };
}
