/**
 * `ctx.logger` and the worker's own log lines go through safeLogger; the
 * README promises "A throwing logger cannot break the worker". An async logger (a function
 * returning a promise is a valid `(message, fields) => void` in TypeScript) that rejects must
 * not leave an unhandled rejection, which ends a Node process by default.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { safeLogger } from './logger.js';

const seen: unknown[] = [];
const listener = (reason: unknown) => seen.push(reason);

afterEach(() => {
  process.off('unhandledRejection', listener);
  seen.length = 0;
});

describe('safeLogger', () => {
  it('swallows the rejection of an async logger, as it swallows a throw', async () => {
    process.on('unhandledRejection', listener);
    const failing = async (): Promise<void> => {
      throw new Error('log sink down');
    };
    const logger = safeLogger({ debug: failing, info: failing, warn: failing, error: failing });
    logger.error('boom', { a: 1 });
    logger.info('boom');
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(seen).toEqual([]);
  });
});
