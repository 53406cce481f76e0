import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { fieldsFirst, type Logger, safeLogger } from './logger.js';

/** A real pino logger at debug level and the JSON lines it wrote. */
function pinoLines() {
  const lines: Record<string, unknown>[] = [];
  const log = pino({ level: 'debug' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  return { log, lines };
}

describe('a pino logger', () => {
  it('passed as it is, loses the fields of every SDK line (why fieldsFirst exists)', () => {
    const { log, lines } = pinoLines();
    // pino's methods type-check as a Logger: nothing warns a user who passes it directly.
    const direct: Logger = log as unknown as Logger;
    direct.warn('renewal failed; retrying', { attempt_id: 'att_1' });
    expect(lines[0]).toMatchObject({ msg: 'renewal failed; retrying' });
    expect(lines[0]).not.toHaveProperty('attempt_id');
  });

  it('through fieldsFirst, writes each level with its message and fields', () => {
    const { log, lines } = pinoLines();
    const logger = safeLogger(fieldsFirst(log));
    logger.debug('settlement sent', { task_id: 't1' });
    logger.info('worker started', { queue: 'email' });
    logger.warn('renewal failed; retrying', { attempt_id: 'att_1', error_code: 'transport_error' });
    logger.error('no handler for program', {});
    logger.info('no fields');
    expect(
      lines.map(({ level, msg, task_id, queue, attempt_id, error_code }) => ({
        level,
        msg,
        task_id,
        queue,
        attempt_id,
        error_code,
      })),
    ).toEqual([
      { level: 20, msg: 'settlement sent', task_id: 't1' },
      { level: 30, msg: 'worker started', queue: 'email' },
      {
        level: 40,
        msg: 'renewal failed; retrying',
        attempt_id: 'att_1',
        error_code: 'transport_error',
      },
      { level: 50, msg: 'no handler for program' },
      { level: 30, msg: 'no fields' },
    ]);
  });

  it('keeps a level changed after the adapter was made', () => {
    const { log, lines } = pinoLines();
    const logger = fieldsFirst(log);
    log.level = 'warn';
    logger.info('dropped', {});
    logger.warn('kept', {});
    expect(lines.map((line) => line.msg)).toEqual(['kept']);
  });
});
