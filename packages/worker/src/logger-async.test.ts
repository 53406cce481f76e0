/**
 * `ctx.logger` and the worker's own log lines go through safeLogger; the
 * README promises "A throwing logger cannot break the worker". An async logger (a function
 * returning a promise is a valid `(message, fields) => void` in TypeScript) that rejects must
 * not leave an unhandled rejection, which ends a Node process by default.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { Client } from './client.js';
import { consoleLogger, type Logger, safeLogger, silentLogger } from './logger.js';
import { Worker } from './worker.js';

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

describe('a logger without the four methods (found by review r45a)', () => {
  it('is refused by Worker and Client when constructed, naming what it lacks, instead of dropping every line', () => {
    const options = { url: 'http://127.0.0.1:9', tenant: 't', namespace: 'n', queue: 'q' };
    const cases: [unknown, RegExp][] = [
      [{}, /lacks debug, info, warn, error/],
      ['console', /lacks debug, info, warn, error/],
      [{ debug() {}, info() {}, warn() {} }, /lacks error\b/],
    ];
    for (const [logger, says] of cases) {
      const given = { ...options, logger: logger as Logger };
      expect(() => new Worker({ ...given, concurrency: 1 })).toThrow(says);
      expect(() => new Client(given)).toThrow(says);
    }
    for (const logger of [console, consoleLogger, silentLogger]) {
      expect(() => new Client({ ...options, logger })).not.toThrow();
    }
  });
});
