/**
 * Whether processes the tests started (a server from `server-process.ts`, the
 * postmaster it spawned) still run, read from the outside as an operator would, and how long to
 * give them.
 */
import { readFileSync } from 'node:fs';
import type { SpawnedServer } from './server-process.js';

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

/** `run`'s exit, SIGKILLing it first if it has not exited within `ms` (a hang). */
export async function exitWithin(run: SpawnedServer, ms: number): Promise<number | string> {
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
