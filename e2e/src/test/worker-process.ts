/**
 * Runs `testdata/worker-process.ts` (the real SDK worker) as a child process
 * from its TypeScript sources, collecting the executions it reports.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sourceArgs } from '../server-process.js';

const script = join(dirname(fileURLToPath(import.meta.url)), '..', 'testdata', 'worker-process.ts');

/** One line the worker process printed. */
export interface Execution {
  event: 'ready' | 'start' | 'done';
  worker: string;
  task_id?: string;
  attempt_id?: string;
  attempt?: number;
}

/** A worker child process. */
export interface WorkerProcess {
  readonly name: string;
  readonly child: ChildProcess;
  /** Every execution line so far, in order. */
  readonly lines: Execution[];
  readonly stderr: () => string;
  /** Resolves with the exit code (or signal name) once the process has exited. */
  readonly exited: Promise<number | string>;
  /** Sends `signal` and waits for the exit. */
  stop(signal?: NodeJS.Signals): Promise<number | string>;
}

/** Starts a worker process on `queue` against `url`; resolves once it is running. */
export async function startWorkerProcess(
  name: string,
  url: string,
  queue: string,
  env: Record<string, string> = {},
): Promise<WorkerProcess> {
  const child = spawn(process.execPath, sourceArgs(script), {
    env: { ...process.env, LEDGENCE_URL: url, WORKER_NAME: name, QUEUE: queue, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: Execution[] = [];
  let stderr = '';
  let partial = '';
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown'));
  });
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    stderr += chunk;
  });
  const ready = new Promise<void>((resolve, reject) => {
    child.stdout?.setEncoding('utf8');
    child.stdout?.on('data', (chunk: string) => {
      partial += chunk;
      const complete = partial.split('\n');
      partial = complete.pop() ?? '';
      for (const text of complete) {
        if (text.trim() === '') continue;
        const line = JSON.parse(text) as Execution;
        lines.push(line);
        if (line.event === 'ready') resolve();
      }
    });
    void exited.then((code) => reject(new Error(`${name} exited (${code}):\n${stderr}`)));
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  try {
    await ready;
  } finally {
    clearTimeout(timer);
  }
  return {
    name,
    child,
    lines,
    stderr: () => stderr,
    exited,
    stop: (signal = 'SIGTERM') => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
}
