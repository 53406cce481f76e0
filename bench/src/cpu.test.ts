import { describe, expect, it } from 'vitest';
import { busyMsOfProcStat, machineBusyMs } from './cpu.js';

describe('busyMsOfProcStat', () => {
  it('adds user, nice, system, irq, softirq and steal of the all-CPU line, not idle or iowait', () => {
    // user nice system idle iowait irq softirq steal guest guest_nice (ticks of 10 ms)
    const text = 'cpu  100 20 30 5000 700 4 5 6 50 0\ncpu0 50 10 15 2500 350 2 3 3 25 0\n';
    expect(busyMsOfProcStat(text)).toBe((100 + 20 + 30 + 4 + 5 + 6) * 10);
  });

  it('is NaN for text without a whole all-CPU line', () => {
    expect(busyMsOfProcStat('')).toBeNaN();
    expect(busyMsOfProcStat('cpu0 1 2 3 4 5 6 7 8\n')).toBeNaN();
    expect(busyMsOfProcStat('cpu 1 2 3\n')).toBeNaN();
    expect(busyMsOfProcStat('cpu 1 2 x 4 5 6 7 8\n')).toBeNaN();
  });
});

describe('machineBusyMs', () => {
  // The benchmark runs on Linux (it reads /proc for every CPU figure); elsewhere it is NaN.
  it.runIf(process.platform === 'linux')('counts the CPU this process burns', async () => {
    const before = await machineBusyMs();
    const used = process.cpuUsage();
    let spins = 0;
    while (process.cpuUsage(used).user < 300_000) spins += 1;
    const after = await machineBusyMs();
    expect(spins).toBeGreaterThan(0);
    // 300 ms of this process's user time, in ticks of 10 ms: the machine was busy at least that
    // long, less a tick at each end.
    expect(after - before).toBeGreaterThanOrEqual(280);
  });
});
