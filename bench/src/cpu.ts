/**
 * CPU time from /proc (Linux): of the Ledgence server, of PostgreSQL (the postmaster, the
 * children it has reaped, and its live children) and of the whole machine. NaN where /proc is
 * missing.
 */
import { readdir, readFile } from 'node:fs/promises';

/** Clock ticks per second of /proc/<pid>/stat times (USER_HZ, 100 on Linux). */
const TICKS_PER_SECOND = 100;

interface ProcStat {
  ppid: number;
  /** utime + stime of the process itself, in ms. */
  ownMs: number;
  /** cutime + cstime: its reaped children's, in ms. */
  childrenMs: number;
}

async function procStat(pid: number): Promise<ProcStat | undefined> {
  try {
    const text = await readFile(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name, which is in parentheses and may hold spaces.
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    const tick = (index: number): number => (Number(fields[index]) * 1000) / TICKS_PER_SECOND;
    return { ppid: Number(fields[1]), ownMs: tick(11) + tick(12), childrenMs: tick(13) + tick(14) };
  } catch {
    return undefined;
  }
}

/** CPU ms one process has used so far. */
export async function processCpuMs(pid: number): Promise<number> {
  return (await procStat(pid))?.ownMs ?? Number.NaN;
}

/**
 * CPU ms a process tree has used so far: the process, its reaped children, and its live
 * children (one level, as PostgreSQL's backends are the postmaster's children).
 */
export async function treeCpuMs(pid: number): Promise<number> {
  const root = await procStat(pid);
  if (root === undefined) return Number.NaN;
  let total = root.ownMs + root.childrenMs;
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const child = await procStat(Number(entry));
    if (child?.ppid === pid) total += child.ownMs + child.childrenMs;
  }
  return total;
}

/** The busy fields of a /proc/stat `cpu` line: user, nice, system, irq, softirq, steal. */
const BUSY_FIELDS = [0, 1, 2, 5, 6, 7];

/**
 * Busy CPU ms in the text of /proc/stat: its first (`cpu`, all CPUs) line's user, nice, system,
 * irq, softirq and steal ticks (guest time is inside user; idle and iowait are not busy). NaN
 * when the text has no such line.
 */
export function busyMsOfProcStat(text: string): number {
  const [label, ...fields] = (text.split('\n')[0] ?? '').trim().split(/\s+/);
  const ticks = fields.map(Number);
  if (label !== 'cpu' || ticks.length < 8 || ticks.some((t) => !Number.isFinite(t))) {
    return Number.NaN;
  }
  const busy = BUSY_FIELDS.reduce((sum, field) => sum + (ticks[field] as number), 0);
  return (busy * 1000) / TICKS_PER_SECOND;
}

/**
 * CPU ms the whole machine has been busy so far, over all CPUs (see {@link busyMsOfProcStat});
 * NaN where /proc is missing. Every process a shape runs (the server, PostgreSQL unless
 * `DATABASE_URL` points elsewhere, the benchmark's workers) is in it, and nothing else should run
 * on a benchmark machine, so a window's difference is what that window cost the machine.
 */
export async function machineBusyMs(): Promise<number> {
  try {
    return busyMsOfProcStat(await readFile('/proc/stat', 'utf8'));
  } catch {
    return Number.NaN;
  }
}
