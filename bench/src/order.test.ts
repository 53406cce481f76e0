import { describe, expect, it } from 'vitest';
import { systemOrder } from './order.js';

const SYSTEMS = ['ledgence', 'pg-boss', 'graphile-worker'];

describe('systemOrder', () => {
  it('starts each of n repetitions with another system', () => {
    const firsts = [1, 2, 3].map((rep) => systemOrder(SYSTEMS, rep)[0]);
    expect(new Set(firsts).size).toBe(3);
  });

  it('runs every system once per repetition', () => {
    for (let rep = 1; rep <= 8; rep += 1) {
      expect([...systemOrder(SYSTEMS, rep)].sort()).toEqual([...SYSTEMS].sort());
    }
  });

  it('puts each system after each other one within six repetitions (a rotation never does)', () => {
    const orders = [1, 2, 3, 4, 5, 6].map((rep) => systemOrder(SYSTEMS, rep).join(' '));
    expect(new Set(orders).size).toBe(6);
    const after = new Map<string, Set<string>>();
    for (const order of orders) {
      const names = order.split(' ');
      names.slice(1).forEach((name, k) => {
        after.set(name, (after.get(name) ?? new Set()).add(names[k] as string));
      });
    }
    for (const name of SYSTEMS) expect(after.get(name)?.size).toBe(2);
  });

  it('varies the neighbour before a system already within three repetitions for two of three', () => {
    const before = new Map<string, Set<string>>();
    for (const rep of [1, 2, 3]) {
      const names = systemOrder(SYSTEMS, rep);
      names.slice(1).forEach((name, k) => {
        before.set(name, (before.get(name) ?? new Set()).add(names[k] as string));
      });
    }
    const varied = SYSTEMS.filter((name) => (before.get(name)?.size ?? 0) > 1);
    expect(varied.length).toBe(2);
  });

  it('alternates which of two systems goes first (--systems ledgence,graphile-worker)', () => {
    const two = ['ledgence', 'graphile-worker'];
    expect([1, 2, 3, 4].map((rep) => systemOrder(two, rep).join(' '))).toEqual([
      'ledgence graphile-worker',
      'graphile-worker ledgence',
      'ledgence graphile-worker',
      'graphile-worker ledgence',
    ]);
  });

  it('never starts two repetitions in a row with the same system', () => {
    const firsts = [1, 2, 3, 4, 5, 6, 7].map((rep) => systemOrder(SYSTEMS, rep)[0]);
    for (let k = 1; k < firsts.length; k += 1) {
      expect(firsts[k], firsts.join(', ')).not.toBe(firsts[k - 1]);
    }
  });
});
