import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { wakeListenLog } from './wake-log.js';

function capture() {
  const lines: Record<string, unknown>[] = [];
  const logger = pino(
    { level: 'debug' },
    { write: (line: string) => lines.push(JSON.parse(line)) },
  );
  return { lines, logger };
}

describe('wakeListenLog', () => {
  it('logs the first loss with its cause and what it costs, a count a minute, then the return', () => {
    const { lines, logger } = capture();
    let now = 0;
    const onState = wakeListenLog({
      logger,
      rescanIntervalMs: 1_000,
      failureLog: { now: () => now },
    });
    onState({ listening: false, cause: 'closed' });
    for (let i = 0; i < 30; i += 1) {
      now += 2_000;
      onState({ listening: false, cause: 'listen_failed', error: new Error('ECONNREFUSED') });
    }
    onState({ listening: true });
    expect(lines.map((l) => [l.level, l.msg])).toEqual([
      [
        40,
        'wake LISTEN lost (its connection closed); reconnecting — until it is back, parked polls on this replica find new work only by their rescan, every 1000 ms',
      ],
      [
        40,
        'wake LISTEN still not in place (31 failures in a row, last: LISTEN failed); reconnecting',
      ],
      [30, 'wake LISTEN works again after 31 failures: parked polls are woken by hints again'],
    ]);
    expect(lines[1]).toMatchObject({
      cause: 'listen_failed',
      failures: 31,
      err: { message: 'ECONNREFUSED' },
    });
  });

  it('says nothing of a LISTEN in place that was never lost', () => {
    const { lines, logger } = capture();
    const onState = wakeListenLog({ logger, rescanIntervalMs: 1_000 });
    onState({ listening: true });
    expect(lines).toEqual([]);
  });
});
