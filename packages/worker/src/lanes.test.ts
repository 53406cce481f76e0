import { describe, expect, it } from 'vitest';
import { LANE_SLOTS, laneSlots, MAX_LANES, requestLanes } from './lanes.js';

describe('requestLanes', () => {
  it('keeps a worker below two lanes of slots in one lane', () => {
    for (const concurrency of [1, 8, 32, LANE_SLOTS, 2 * LANE_SLOTS - 1]) {
      expect(requestLanes(concurrency)).toBe(1);
      expect(laneSlots(concurrency)).toBe(concurrency);
    }
  });

  it('adds a lane per LANE_SLOTS slots, up to MAX_LANES', () => {
    expect(requestLanes(2 * LANE_SLOTS)).toBe(2);
    expect(requestLanes(3 * LANE_SLOTS)).toBe(3);
    expect(requestLanes(4 * LANE_SLOTS)).toBe(4);
    expect(requestLanes(1_000)).toBe(MAX_LANES);
  });

  it('splits the slots evenly, so every slot belongs to some lane', () => {
    expect(laneSlots(256)).toBe(64);
    expect(laneSlots(200)).toBe(67);
    expect(laneSlots(1_000)).toBe(250);
    for (let concurrency = 1; concurrency <= 1_000; concurrency += 1) {
      expect(laneSlots(concurrency) * requestLanes(concurrency)).toBeGreaterThanOrEqual(
        concurrency,
      );
    }
  });
});
