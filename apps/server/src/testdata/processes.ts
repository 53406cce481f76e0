/**
 * Whether processes the tests started (a server, the postmaster it spawned) still run, read
 * from the outside as an operator would.
 */
import { readFileSync } from 'node:fs';

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
