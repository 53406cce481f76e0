import { describe, expect, it } from 'vitest';
import {
  type CpuSources,
  closeCpuWindow,
  machineCpu,
  machineCpuOfProcStat,
  machineWindow,
  openCpuWindow,
} from './cpu.js';

describe('machineCpuOfProcStat', () => {
  // user nice system idle iowait irq softirq steal guest guest_nice (ticks of 10 ms)
  const text = 'cpu  100 20 30 5000 700 4 5 6 50 0\ncpu0 50 10 15 2500 350 2 3 3 25 0\n';

  it('counts user, nice, system, irq and softirq of the all-CPU line as busy, not steal', () => {
    expect(machineCpuOfProcStat(text).busyMs).toBe((100 + 20 + 30 + 4 + 5) * 10);
  });

  it('keeps steal apart, and counts every field but guest in the whole time', () => {
    const reading = machineCpuOfProcStat(text);
    expect(reading.stealMs).toBe(6 * 10);
    expect(reading.totalMs).toBe((100 + 20 + 30 + 5000 + 700 + 4 + 5 + 6) * 10);
  });

  it('is NaN for text without a whole all-CPU line', () => {
    for (const bad of ['', 'cpu0 1 2 3 4 5 6 7 8\n', 'cpu 1 2 3\n', 'cpu 1 2 x 4 5 6 7 8\n']) {
      const reading = machineCpuOfProcStat(bad);
      expect(reading.busyMs).toBeNaN();
      expect(reading.stealMs).toBeNaN();
      expect(reading.totalMs).toBeNaN();
    }
  });
});

describe('machineWindow', () => {
  it('gives the busy ms between two readings and the share of the CPUs’ time stolen', () => {
    const before = machineCpuOfProcStat('cpu 100 0 50 800 0 0 0 50 0 0');
    // 100 ticks later on the busy fields, 200 on idle, 100 of steal: 400 ticks in all.
    const after = machineCpuOfProcStat('cpu 180 0 70 1000 0 0 0 150 0 0');
    expect(machineWindow(before, after)).toEqual({ busyMs: 1000, stolenShare: 0.25 });
  });
});

describe('machineCpu', () => {
  // The benchmark runs on Linux (it reads /proc for every CPU figure); elsewhere it is NaN.
  it.runIf(process.platform === 'linux')('counts the CPU this process burns', async () => {
    const before = await machineCpu();
    const used = process.cpuUsage();
    let spins = 0;
    while (process.cpuUsage(used).user < 300_000) spins += 1;
    const window = machineWindow(before, await machineCpu());
    expect(spins).toBeGreaterThan(0);
    // 300 ms of this process's user time, in ticks of 10 ms: the machine was busy at least that
    // long, less a tick at each end.
    expect(window.busyMs).toBeGreaterThanOrEqual(280);
    expect(window.stolenShare).toBeGreaterThanOrEqual(0);
    expect(window.stolenShare).toBeLessThanOrEqual(1);
  });
});

describe('openCpuWindow and closeCpuWindow', () => {
  /**
   * Readers over counters a test moves: reading PostgreSQL's tree costs this process and the
   * machine `treeCost` ms, as the /proc walk of `treeCpuMs` does.
   */
  function fakeSources(treeCost: number) {
    const clock = { benchMs: 0, busyMs: 0, now: 0 };
    const sources: CpuSources = {
      server: async () => 0,
      postgres: async () => {
        clock.benchMs += treeCost;
        clock.busyMs += treeCost;
        clock.now += treeCost;
        return 0;
      },
      bench: () => ({ user: clock.benchMs * 1000, system: 0 }),
      machine: async () => ({ busyMs: clock.busyMs, stealMs: 0, totalMs: 2 * clock.now }),
      now: () => clock.now,
    };
    /** `ms` of the workers' CPU inside the window. */
    const work = (ms: number): void => {
      clock.benchMs += ms;
      clock.busyMs += ms;
      clock.now += ms;
    };
    return { sources, work };
  }

  it('keep the CPU of reading PostgreSQL’s process tree out of the workers’ and the machine’s window', async () => {
    const { sources, work } = fakeSources(35);
    const from = await openCpuWindow(sources);
    work(10);
    const to = await closeCpuWindow(sources);
    expect(to.benchMs - from.benchMs).toBe(10);
    expect(machineWindow(from.machine, to.machine).busyMs).toBe(10);
    expect(to.at - from.at).toBe(10);
  });
});
