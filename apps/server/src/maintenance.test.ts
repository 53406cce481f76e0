/**
 * How a maintenance loop logs a run of failed rounds (startPeriodic): the first failure, then at
 * most one line per failure-log interval with the count so far, then one line when a round
 * succeeds again; and how a retention round logs the namespaces it failed to collect. Rounds and
 * collections are scripted here; the loops over a real PostgreSQL going away and coming back are
 * in e2e/src/server-operations.e2e.test.ts, retention over a real store in maintenance.int.
 */
import type { RetentionProgress, Scope } from '@ledgence/contracts';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { collectRetention, startPeriodic } from './maintenance.js';

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

describe('collectRetention: namespaces whose collection fails', () => {
  const scopes: Scope[] = ['a', 'b', 'c', 'd'].map((ns) => ({ tenant_id: 'acme', namespace: ns }));
  const progress: RetentionProgress = {
    cutoff: 0,
    tasks_removed: 1,
    attempts_removed: 1,
    history_removed: 2,
    subscriptions_removed: 0,
    sessions_removed: 0,
    has_more: false,
  };

  async function round(
    failing: ReadonlySet<string>,
  ): Promise<{ removed: number; lines: LogLine[] }> {
    const lines: LogLine[] = [];
    const logger = pino(
      { level: 'warn' },
      { write: (line: string) => lines.push(JSON.parse(line)) },
    );
    const removed = await collectRetention({
      logger,
      store: {
        retentionScopes: async (after) => (after === undefined ? scopes : []),
        async collectRetired(scope) {
          if (failing.has(scope.namespace)) throw new Error(`read-only (${scope.namespace})`);
          return progress;
        },
      },
    });
    return { removed, lines };
  }

  it('logs the first with its error and counts the others in one line, collecting the rest', async () => {
    // A database that reads but refuses writes: one line with a stack per namespace, every round.
    const { removed, lines } = await round(new Set(['a', 'c', 'd']));
    expect(removed).toBe(1);
    expect(lines).toEqual([
      expect.objectContaining({
        msg: 'retention of a namespace failed; retrying it next round',
        namespace: 'a',
        err: expect.objectContaining({ message: 'read-only (a)' }),
      }),
      expect.objectContaining({
        msg: 'retention of 3 namespaces failed this round; retrying them next round',
        failed_namespaces: 3,
        namespaces: ['acme/a', 'acme/c', 'acme/d'],
      }),
    ]);
  });

  it('logs one failing namespace once, and nothing when none fails', async () => {
    const one = await round(new Set(['b']));
    expect(one.lines.map((line) => line.msg)).toEqual([
      'retention of a namespace failed; retrying it next round',
    ]);
    expect((await round(new Set())).lines).toEqual([]);
  });
});
