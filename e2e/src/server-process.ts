/**
 * Runs the real server (`src/main.ts`) as a child process from its TypeScript
 * sources, as an operator would run the built one, for tests over real sockets.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const main = join(root, 'apps', 'server', 'src', 'main.ts');

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

/** How {@link startServerProcess} runs the server. */
export interface ServerProcessOptions {
  /**
   * Keep stdout for {@link ServerProcess.stdout}: the tests that read the server's logs. Off by
   * default, so a long test at a verbose level does not hold every line in memory.
   */
  captureStdout?: boolean;
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
export function startServerProcess(
  env: Record<string, string>,
  options: ServerProcessOptions = {},
): Promise<ServerProcess> {
  const child = spawn(process.execPath, sourceArgs(main), {
    env: { ...process.env, PORT: '0', LEDGENCE_LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', options.captureStdout ? 'pipe' : 'ignore', 'pipe'],
  });
  let stderr = '';
  let stdout = '';
  child.stdout?.setEncoding('utf8');
  child.stdout?.on('data', (chunk: string) => {
    stdout += chunk;
  });
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown'));
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`server did not start within 60 s:\n${stderr}`));
    }, 60_000);
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      stderr += chunk;
      const match = /listening on (http:\/\/\S+)/.exec(stderr);
      if (match?.[1] !== undefined && timer.hasRef()) {
        clearTimeout(timer);
        timer.unref();
        resolve({
          url: match[1],
          child,
          stderr: () => stderr,
          stdout: () => stdout,
          exited,
          stop: (signal = 'SIGTERM') => {
            child.kill(signal);
            return exited;
          },
        });
      }
    });
    // 'close', not 'exit': only then has everything the process wrote been read.
    child.once('close', (code, signal) => {
      if (timer.hasRef()) {
        clearTimeout(timer);
        reject(new ServerStartError(code ?? signal ?? 'unknown', stdout + stderr));
      }
    });
  });
}
