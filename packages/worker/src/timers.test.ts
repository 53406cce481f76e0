import { describe, expect, it } from 'vitest';
import { MAX_TIMER_MS, perTurn, timerDelay } from './timers.js';

const nextTurn = () => new Promise((resolve) => setImmediate(resolve));

describe('timerDelay', () => {
  it('holds a delay within what a Node timer keeps', () => {
    expect([timerDelay(5), timerDelay(Infinity), timerDelay(-1), timerDelay(Number.NaN)]).toEqual([
      5,
      MAX_TIMER_MS,
      0,
      0,
    ]);
  });
});

describe('perTurn', () => {
  it('hands over what one turn gathered in one call, each item once, and the next turn apart', async () => {
    const flushed: string[][] = [];
    const add = perTurn<string>((items) => flushed.push(items));
    add('a');
    add('b');
    add('a');
    expect(flushed).toEqual([]);
    await nextTurn();
    add('c');
    await nextTurn();
    expect(flushed).toEqual([['a', 'b'], ['c']]);
  });
});
