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

/** Fields of a /proc/stat `cpu` line, in its order (guest and guest_nice are inside user and nice). */
const USER = 0;
const NICE = 1;
const SYSTEM = 2;
const IDLE = 3;
const IOWAIT = 4;
const IRQ = 5;
const SOFTIRQ = 6;
const STEAL = 7;

/** The machine's CPU time so far, summed over all its CPUs, in ms. */
export interface MachineCpu {
  /** user, nice, system, irq and softirq: what this machine's processes and kernel ran. */
  busyMs: number;
  /**
   * steal: time the hypervisor gave this VM's CPUs to another guest while this one wanted them.
   * Kept apart from `busyMs`: it is neither this machine's work nor idle time it could use.
   */
  stealMs: number;
  /** Every field, idle and iowait included: the CPUs' whole time (wall time × CPUs). */
  totalMs: number;
}

const NO_READING: MachineCpu = { busyMs: Number.NaN, stealMs: Number.NaN, totalMs: Number.NaN };

/**
 * The machine's CPU time in the text of /proc/stat, from its first (`cpu`, all CPUs) line; NaN
 * fields when the text has no such line.
 */
export function machineCpuOfProcStat(text: string): MachineCpu {
  const [label, ...fields] = (text.split('\n')[0] ?? '').trim().split(/\s+/);
  const ticks = fields.map(Number);
  if (label !== 'cpu' || ticks.length < 8 || ticks.some((t) => !Number.isFinite(t))) {
    return NO_READING;
  }
  const ms = (...indexes: number[]): number =>
    (indexes.reduce((sum, index) => sum + (ticks[index] as number), 0) * 1000) / TICKS_PER_SECOND;
  return {
    busyMs: ms(USER, NICE, SYSTEM, IRQ, SOFTIRQ),
    stealMs: ms(STEAL),
    totalMs: ms(USER, NICE, SYSTEM, IDLE, IOWAIT, IRQ, SOFTIRQ, STEAL),
  };
}

/**
 * The whole machine's CPU time so far (see {@link machineCpuOfProcStat}); NaN fields where /proc
 * is missing. Every process a shape runs (the server, PostgreSQL unless `DATABASE_URL` points
 * elsewhere, the benchmark's workers) is in it, and nothing else should run on a benchmark
 * machine, so a window's difference is what that window cost the machine.
 */
export async function machineCpu(): Promise<MachineCpu> {
  try {
    return machineCpuOfProcStat(await readFile('/proc/stat', 'utf8'));
  } catch {
    return NO_READING;
  }
}

/** What the machine did between two readings. */
export interface MachineWindow {
  /** CPU ms its processes and kernel ran, steal left out. */
  busyMs: number;
  /** The share of the CPUs' time in the window that the hypervisor gave to another guest. */
  stolenShare: number;
}

/** The machine's work between two {@link machineCpu} readings. */
export function machineWindow(before: MachineCpu, after: MachineCpu): MachineWindow {
  return {
    busyMs: after.busyMs - before.busyMs,
    stolenShare: (after.stealMs - before.stealMs) / (after.totalMs - before.totalMs),
  };
}

/** Where the readings at each end of a drain's CPU window come from (a test passes its own). */
export interface CpuSources {
  /** The system's server process so far, ms (NaN without one); one /proc file. */
  server(): Promise<number>;
  /**
   * PostgreSQL's process tree so far, ms ({@link treeCpuMs}): it reads every /proc entry, which
   * costs this process tens of ms of CPU (34 ms with 164 processes).
   */
  postgres(): Promise<number>;
  /** This process's CPU so far (`process.cpuUsage()`): the workers of the system under test. */
  bench(): NodeJS.CpuUsage;
  machine(): Promise<MachineCpu>;
  /** `performance.now()`. */
  now(): number;
}

/** One end of a drain's CPU window. */
export interface CpuReading {
  serverMs: number;
  postgresMs: number;
  /** This process's user and system CPU so far, ms. */
  benchMs: number;
  machine: MachineCpu;
  at: number;
}

const benchMsOf = (usage: NodeJS.CpuUsage): number => (usage.user + usage.system) / 1000;

/**
 * The readings that open a drain's CPU window: PostgreSQL's tree first, so that what its /proc
 * walk costs this process falls before the window rather than in the workers' and the machine's
 * figures.
 */
export async function openCpuWindow(sources: CpuSources): Promise<CpuReading> {
  const postgresMs = await sources.postgres();
  const serverMs = await sources.server();
  const machine = await sources.machine();
  const benchMs = benchMsOf(sources.bench());
  return { serverMs, postgresMs, benchMs, machine, at: sources.now() };
}

/**
 * The readings that close a drain's CPU window: PostgreSQL's tree last, after the window is
 * closed. Read inside it, the walk added ~35 ms to every system's drain, a bias against the
 * cheapest one (7 % of pg-boss's workers' CPU in a batched drain of 20 000 tasks).
 */
export async function closeCpuWindow(sources: CpuSources): Promise<CpuReading> {
  const benchMs = benchMsOf(sources.bench());
  const machine = await sources.machine();
  const at = sources.now();
  const serverMs = await sources.server();
  const postgresMs = await sources.postgres();
  return { serverMs, postgresMs, benchMs, machine, at };
}
