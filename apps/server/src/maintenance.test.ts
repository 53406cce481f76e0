/**
 * How a maintenance loop logs a run of failed rounds (startPeriodic): the first failure, then at
 * most one line per failure-log interval with the count so far, then one line when a round
 * succeeds again. Rounds are scripted here; the loops over a real PostgreSQL going away and
 * coming back are in e2e/src/server-operations.e2e.test.ts.
 */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { startPeriodic } from './maintenance.js';

interface LogLine {
  level: number;
  msg: string;
  failures?: number;
  err?: { message: string };
}

const WARN = 40;
const INFO = 30;

/**
 * Runs a loop whose rounds fail or succeed as `outcomes` says (true: succeeds), `stepMs` of the
 * fake monotonic clock apart, and returns its log lines once every outcome was used.
 */
async function runRounds(
  outcomes: readonly boolean[],
  options: { stepMs: number; failureLogIntervalMs?: number },
): Promise<LogLine[]> {
  const lines: LogLine[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  let clock = 0;
  let round = 0;
  let done!: () => void;
  const finished = new Promise<void>((resolve) => {
    done = resolve;
  });
  const loop = startPeriodic({
    name: 'lease recovery',
    intervalMs: 1,
    logger,
    failureLog: { now: () => clock, logIntervalMs: options.failureLogIntervalMs },
    async round() {
      const succeeds = outcomes[round];
      round += 1;
      clock += options.stepMs;
      if (round >= outcomes.length) done();
      if (succeeds === false) throw new Error(`connection refused (round ${round})`);
    },
  });
  await finished;
  await loop.stop();
  return lines;
}

const fail = (n: number) => Array.from({ length: n }, () => false);

describe('startPeriodic: a run of failed rounds', () => {
  it('logs the first failure with its error, and not the next ones within the interval', async () => {
    const lines = await runRounds(fail(30), { stepMs: 1_000 });
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({
      level: WARN,
      msg: 'lease recovery failed; retrying next round',
      err: { message: 'connection refused (round 1)' },
    });
  });

  it('logs again once per interval while it keeps failing, with the count and the latest error', async () => {
    // Rounds 10 s apart on the fake clock, one line a minute at most: rounds 1, 7 and 13.
    const lines = await runRounds(fail(15), { stepMs: 10_000, failureLogIntervalMs: 60_000 });
    expect(lines.map((line) => [line.failures, line.err?.message])).toEqual([
      [undefined, 'connection refused (round 1)'],
      [7, 'connection refused (round 7)'],
      [13, 'connection refused (round 13)'],
    ]);
    expect(lines[1]?.msg).toBe(
      'lease recovery still failing (7 rounds in a row); retrying next round',
    );
    expect(lines.every((line) => line.level === WARN)).toBe(true);
  });

  it('says when a round succeeds again, how many failed before it, and starts over', async () => {
    const lines = await runRounds([...fail(4), true, true, false, true], { stepMs: 1_000 });
    expect(lines.map((line) => [line.level, line.msg])).toEqual([
      [WARN, 'lease recovery failed; retrying next round'],
      [INFO, 'lease recovery works again after 4 failed rounds'],
      [WARN, 'lease recovery failed; retrying next round'],
      [INFO, 'lease recovery works again after 1 failed round'],
    ]);
  });

  it('logs nothing while rounds succeed', async () => {
    expect(await runRounds([true, true, true], { stepMs: 1_000 })).toEqual([]);
  });
});
