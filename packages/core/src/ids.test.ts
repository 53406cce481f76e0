import { describe, expect, it } from 'vitest';
import { newId } from './ids.js';

describe('newId', () => {
  it('is the prefix and a UUIDv7 as 32 hex digits: time first, version 7, variant 10', () => {
    const before = Date.now();
    const id = newId('task');
    const after = Date.now();
    expect(id).toMatch(/^tsk_[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}$/);
    const ms = Number.parseInt(id.slice(4, 16), 16);
    expect(ms).toBeGreaterThanOrEqual(before);
    expect(ms).toBeLessThanOrEqual(after);
  });

  it('differs every call and sorts by creation time across milliseconds', async () => {
    const ids = new Set(Array.from({ length: 10_000 }, () => newId('run')));
    expect(ids.size).toBe(10_000);
    const first = newId('attempt');
    await new Promise((resolve) => setTimeout(resolve, 2));
    expect(newId('attempt') > first).toBe(true);
  });

  it('sorts in issue order within a process, even thousands in one millisecond', () => {
    const ids = Array.from({ length: 10_000 }, () => newId('task'));
    expect([...ids].sort()).toEqual(ids);
  });
});
