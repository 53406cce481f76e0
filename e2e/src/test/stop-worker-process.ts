/**
 * Worker processes for the shutdown tests: `testdata/stop-worker.ts` runs the real `Worker` and
 * never calls `process.exit`, so a test sees whether one ends on its own once `run()` has
 * resolved. It prints one JSON line per event on stdout.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sourceArgs } from '../server-process.js';
import { until } from './harness.js';

const script = join(dirname(fileURLToPath(import.meta.url)), '..', 'testdata', 'stop-worker.ts');

/** One event line the worker process printed. */
export interface StopWorkerLine {
  event: string;
  [key: string]: unknown;
}

/** A running worker process. */
export interface StopWorkerChild {
  readonly child: ChildProcess;
  readonly lines: StopWorkerLine[];
  readonly exited: Promise<number | string>;
  readonly stderr: () => string;
  /** Resolves with the first line `match` accepts (already printed or to come). */
  line(
    match: (line: StopWorkerLine) => boolean,
    ms?: number,
    what?: string,
  ): Promise<StopWorkerLine>;
}

const children: StopWorkerChild[] = [];

/** Starts `testdata/stop-worker.ts` with `env`; resolves once it called run(). */
export async function startStopWorker(env: Record<string, string>): Promise<StopWorkerChild> {
  const child = spawn(process.execPath, sourceArgs(script), {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: StopWorkerLine[] = [];
  let stderr = '';
  let partial = '';
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown'));
  });
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    stderr += chunk;
  });
  child.stdout?.setEncoding('utf8');
  child.stdout?.on('data', (chunk: string) => {
    partial += chunk;
    const complete = partial.split('\n');
    partial = complete.pop() ?? '';
    for (const text of complete) {
      if (text.trim() !== '') lines.push(JSON.parse(text) as StopWorkerLine);
    }
  });
  const handle: StopWorkerChild = {
    child,
    lines,
    exited,
    stderr: () => stderr,
    async line(match, ms = 30_000, what = 'a line') {
      let found: StopWorkerLine | undefined;
      await until(
        () => {
          found = lines.find(match);
          if (found === undefined && child.exitCode !== null) {
            throw new Error(`the worker process exited before ${what}:\n${stderr}`);
          }
          return found !== undefined;
        },
        ms,
        what,
      );
      return found as StopWorkerLine;
    },
  };
  children.push(handle);
  await handle.line((l) => l.event === 'ready', 60_000, 'ready');
  return handle;
}

/** SIGKILLs the worker processes still running and waits for every one to exit. */
export async function killStopWorkers(): Promise<void> {
  for (const c of children.splice(0)) {
    if (c.child.exitCode === null && c.child.signalCode === null) c.child.kill('SIGKILL');
    await c.exited;
  }
}
