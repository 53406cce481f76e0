import { describe, expect, it } from 'vitest';
import { Starts } from './starts.js';

describe('Starts', () => {
  it('counts the starts and keeps the first one’s time', () => {
    let clock = 5;
    const starts = new Starts(3, () => clock);
    expect(starts.first).toBeUndefined();
    starts.record();
    clock = 9;
    starts.record();
    expect(starts.started).toBe(2);
    expect(starts.first).toBe(5);
  });

  it('ends a wait at the last start, so a drain’s end is not read up to a poll interval late', async () => {
    const starts = new Starts(2);
    starts.record();
    // Longer than the test's timeout: only the last start can end it in time.
    const waited = starts.wait(600_000);
    starts.record();
    await waited;
    expect(starts.started).toBe(2);
  }, 2_000);

  it('does not wait once every handler has started', async () => {
    const starts = new Starts(1);
    starts.record();
    await starts.wait(600_000);
    expect(starts.started).toBe(1);
  }, 2_000);
});
