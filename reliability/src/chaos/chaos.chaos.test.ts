/**
 * T1 (issue #8) at CI size: 2 000 tasks across 2 tenants × 2 namespaces under a fault every
 * 2–5 s for 90 s, two server replicas, four worker processes, two immediate PostgreSQL restarts;
 * then drain and check. Each invariant is its own assertion, so a failure names it; the figures
 * and the seed are printed either way. Replay a failing seed with
 * `LEDGENCE_CHAOS_SEED=<seed> pnpm test:chaos` or `pnpm chaos --seed <seed>`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHECKS, check, type HistoryRow, replayHistory } from './checker.js';
import { FAULT_TYPES } from './model.js';
import { type ChaosReport, DEFAULT_OPTIONS, runChaos } from './scenario.js';

const seed = Number(process.env.LEDGENCE_CHAOS_SEED ?? DEFAULT_OPTIONS.seed);

describe(`chaos (T1), seed ${seed}`, () => {
  let report: ChaosReport | undefined;
  let failure: unknown;

  beforeAll(async () => {
    try {
      report = await runChaos({ seed });
    } catch (error) {
      failure = error;
    }
    if (report !== undefined)
      console.log(`${report.table}\nreplay: LEDGENCE_CHAOS_SEED=${seed} pnpm test:chaos`);
  }, 400_000);
  afterAll(() => {
    if (report !== undefined && report.figures.violations > 0) {
      console.log(`logs kept in ${report.runDir}`);
    }
  });

  it('completes the run', () => {
    expect(failure).toBeUndefined();
    expect(report).toBeDefined();
  });

  for (const name of Object.values(CHECKS)) {
    it(name, () => {
      const result = report?.checks.find((c) => c.name === name);
      expect(result, 'the run did not complete').toBeDefined();
      expect(result?.examples, name).toEqual([]);
      expect(result?.violations).toBe(0);
    });
  }

  it('injected every kind of fault, and restarted PostgreSQL twice', () => {
    const faults = report?.figures.faults;
    for (const type of FAULT_TYPES) expect(faults?.[type], type).toBeGreaterThan(0);
    expect(faults?.restart_postgres).toBe(DEFAULT_OPTIONS.postgresRestarts);
  });

  it('acknowledged every planned task and ran the mix', () => {
    expect(report?.figures.tasks).toBe(DEFAULT_OPTIONS.tasks);
    expect(report?.figures.submits.repeats).toBeGreaterThan(0);
    expect(report?.figures.subscriptions).toBeGreaterThan(0);
  });
});

// The checker must be able to fail: each check is shown a violation it has to report.
describe('the chaos checker', () => {
  const h = (...events: [reason: string, attempt: string | null][]): HistoryRow[] =>
    events.map(([reason, attempt], i) => ({
      task_id: 't',
      sequence: i + 1,
      attempt_id: attempt,
      at: i,
      reason,
    }));

  it('accepts legal histories and ends in their state', () => {
    expect(
      replayHistory(
        h(
          ['submitted', null],
          ['claimed', 'a'],
          ['lease_expired', 'a'],
          ['retry_scheduled', 'a'],
          ['claimed', 'b'],
          ['dispatch_authorized', 'b'],
          ['report_accepted', 'b'],
          ['succeeded', 'b'],
        ),
      ),
    ).toEqual({ state: 'succeeded' });
  });

  it.each([
    [
      'a second settlement',
      [
        ['report_accepted', 'a'],
        ['report_accepted', 'a'],
      ],
    ],
    [
      'a settlement from a stale lease',
      [
        ['lease_expired', 'a'],
        ['report_accepted', 'a'],
      ],
    ],
    [
      'success after lease expiry',
      [
        ['lease_expired', 'a'],
        ['succeeded', 'a'],
      ],
    ],
    ['an outcome with no report', [['succeeded', 'a']]],
    ['a record for another attempt', [['dispatch_authorized', 'z']]],
    [
      'a second dispatch',
      [
        ['dispatch_authorized', 'a'],
        ['dispatch_authorized', 'a'],
      ],
    ],
  ] as [string, [string, string][]][])('rejects %s', (_, tail) => {
    expect(replayHistory(h(['submitted', null], ['claimed', 'a'], ...tail))).toHaveProperty(
      'error',
    );
  });

  it('rejects gaps and records after a terminal state', () => {
    const gap = h(['submitted', null], ['claimed', 'a']);
    gap[1] = { ...(gap[1] as (typeof gap)[number]), sequence: 3 };
    expect(replayHistory(gap)).toHaveProperty('error');
    expect(
      replayHistory(h(['submitted', null], ['cancelled', null], ['claimed', 'a'])),
    ).toHaveProperty('error');
  });

  it('reports lost submits, split keys, stale settlements and missing deliveries', () => {
    const task = (id: string, key: string) => ({
      tenant_id: 'x',
      namespace: 'y',
      task_id: id,
      idempotency_key: key,
      state: 'succeeded',
      attempt_count: 1,
      dispatch_count: 1,
      history_sequence: 5,
      max_attempts: 3,
      failure_kind: null,
      execution_kind: null,
      data: { i: 0, ms: 5 },
      submitted_at: 0,
      terminal_at: 10,
    });
    const history = (id: string) =>
      h(
        ['submitted', null],
        ['claimed', `${id}-a`],
        ['dispatch_authorized', `${id}-a`],
        ['report_accepted', `${id}-a`],
        ['succeeded', `${id}-a`],
      ).map((e) => ({ ...e, task_id: id }));
    const attempt = (id: string, acceptedAt: number) => ({
      task_id: id,
      attempt_id: `${id}-a`,
      ordinal: 1,
      state: 'succeeded',
      claimed_at: 1,
      lease_expires_at: 100,
      dispatch_allowed: true,
      accepted_at: acceptedAt,
    });
    const ack = (key: string, id: string) =>
      ({
        event: 'ack',
        key,
        tenant: 'x',
        namespace: 'y',
        task_id: id,
        repeat: false,
        at: 0,
      }) as const;
    const results = check(
      {
        submits: [ack('k1', 't1'), ack('k1', 't2'), ack('k3', 'missing')],
        executions: [],
        deliveries: [],
        faults: [],
        unexpectedExits: [],
        unrecoveredRestarts: 0,
      },
      {
        tasks: new Map([
          ['t1', task('t1', 'k1')],
          ['t2', task('t2', 'k1')],
        ]),
        attempts: new Map([
          ['t1', [attempt('t1', 50)]],
          ['t2', [attempt('t2', 150)]],
        ]),
        history: new Map([
          ['t1', history('t1')],
          ['t2', history('t2')],
        ]),
        subscriptions: [{ subscription_id: 's', task_id: 't1', event_id: 'e', state: 'delivered' }],
      },
    );
    const failing = results.filter((r) => r.violations > 0).map((r) => r.name);
    expect(failing.sort()).toEqual(
      [CHECKS.submitsDurable, CHECKS.settlements, CHECKS.idempotency, CHECKS.deliveries].sort(),
    );
  });
});
