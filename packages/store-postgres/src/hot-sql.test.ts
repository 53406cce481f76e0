import { describe, expect, it } from 'vitest';
import { pipelined } from './hot-sql.js';

describe('pipelined', () => {
  it('answers every value in order', async () => {
    await expect(pipelined([Promise.resolve(1), Promise.resolve('two')])).resolves.toEqual([
      1,
      'two',
    ]);
  });

  it('fails with the first failure only after every statement settled', async () => {
    const order: string[] = [];
    let finishLate: () => void = () => {};
    const late = new Promise<void>((resolve) => {
      finishLate = () => {
        order.push('late settled');
        resolve();
      };
    });
    const failing = pipelined([
      Promise.reject(new Error('first')),
      late,
      Promise.reject(new Error('second')),
    ]).catch((error: Error) => {
      order.push(`failed: ${error.message}`);
    });
    // Several turns: Promise.all would have failed by now.
    for (let i = 0; i < 5; i += 1) await Promise.resolve();
    expect(order).toEqual([]);
    finishLate();
    await failing;
    expect(order).toEqual(['late settled', 'failed: first']);
  });
});
