/**
 * Runs the built Ledgence server (`apps/server/dist/main.js`) as its own process, the way an
 * operator runs it, and reads its resident memory.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

/** A running server process. */
export interface ServerProcess {
  readonly url: string;
  readonly pid: number;
  /** Resident set size in bytes (from /proc; NaN where there is none). */
  rss(): Promise<number>;
  /** Everything it wrote to stderr. */
  stderr(): string;
  stop(): Promise<void>;
}

/**
 * The server's entry point, or an error that says to build it. `LEDGENCE_BENCH_SERVER_ENTRY`
 * names another (a test runs `apps/server/src/main.ts` with tsx's loader in `NODE_OPTIONS`, so
 * that tests need no build).
 */
export function serverEntry(root: string): string {
  const main =
    process.env.LEDGENCE_BENCH_SERVER_ENTRY ?? join(root, 'apps', 'server', 'dist', 'main.js');
  if (!existsSync(main)) {
    throw new Error(`${main} is missing: run \`pnpm build\` first`);
  }
  return main;
}

/** Starts the server on a free port with `env` added; resolves once it is listening. */
export function startServer(main: string, env: Record<string, string>): Promise<ServerProcess> {
  // LEDGENCE_BENCH_SERVER_NODE_OPTIONS: node flags for the server process only (for example
  // `--cpu-prof --cpu-prof-dir=/tmp/prof`; the profile is written when the server exits on SIGTERM).
  const nodeFlags = (process.env.LEDGENCE_BENCH_SERVER_NODE_OPTIONS ?? '')
    .split(' ')
    .filter((flag) => flag.length > 0);
  const child: ChildProcess = spawn(process.execPath, [...nodeFlags, main], {
    env: { ...process.env, PORT: '0', LEDGENCE_LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  // However the benchmark ends (a thrown error, a second Ctrl-C's immediate exit), the server
  // must not outlive it. Only synchronous work is possible in 'exit': the server shuts down alone.
  const stopOnExit = (): void => {
    child.kill('SIGTERM');
  };
  process.once('exit', stopOnExit);
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => {
      process.off('exit', stopOnExit);
      resolve(code ?? signal ?? 'unknown');
    });
  });
  return new Promise((resolve, reject) => {
    let started = false;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`server did not start within 60 s:\n${stderr}`));
    }, 60_000);
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      stderr += chunk;
      if (started) {
        // Warnings while the benchmark runs are worth seeing.
        process.stderr.write(`[server] ${chunk}`);
        return;
      }
      const match = /listening on (http:\/\/\S+)/.exec(stderr);
      if (match?.[1] !== undefined) {
        started = true;
        clearTimeout(timer);
        const pid = child.pid ?? -1;
        resolve({
          url: match[1],
          pid,
          async rss() {
            try {
              const status = await readFile(`/proc/${pid}/status`, 'utf8');
              const kb = /VmRSS:\s+(\d+)\s+kB/.exec(status)?.[1];
              return kb === undefined ? Number.NaN : Number(kb) * 1024;
            } catch {
              return Number.NaN;
            }
          },
          stderr: () => stderr,
          async stop() {
            child.kill('SIGTERM');
            const timeout = setTimeout(() => child.kill('SIGKILL'), 15_000);
            await exited;
            clearTimeout(timeout);
          },
        });
      }
    });
    void exited.then((code) => {
      if (!started) {
        clearTimeout(timer);
        reject(new Error(`server exited (${code}) before listening:\n${stderr}`));
      }
    });
  });
}
