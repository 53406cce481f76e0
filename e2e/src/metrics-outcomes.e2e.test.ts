/**
 * `ledgence_settle_outcomes_total` and `ledgence_acquire_outcomes_total` against real traffic on a
 * real server process: each settlement is `accepted` once, however it reaches the store (twice in
 * one batch, sent again), every answered batch item is counted once under its own outcome, and a
 * poll whose client left is answered to no one, so not counted (review r53c).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, until } from './test/harness.js';
import {
  call,
  claimNext,
  metricSamples,
  openSession,
  pollBody,
  settleBody,
  submitTask,
  taskBody,
} from './test/wire.js';

const stack = new Stack('metrics_outcomes');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
}, 60_000);
afterAll(() => stack.close());

/** Samples keyed by `name{labels}` exactly as exposed. */
async function scrape(url: string): Promise<Map<string, number>> {
  return metricSamples(await (await fetch(`${url}/metrics`)).text());
}

/** What moved between two scrapes among the series of `family`. */
function moved(before: Map<string, number>, after: Map<string, number>, family: string) {
  const out: Record<string, number> = {};
  for (const [key, value] of after) {
    if (!key.startsWith(`${family}{`)) continue;
    const delta = value - (before.get(key) ?? 0);
    if (delta !== 0) out[key] = delta;
  }
  return out;
}

const SUCCESS = { kind: 'success', output: null };

describe('settle and acquire counters count each answered item once', () => {
  it('a settle:batch holding the same settlement twice counts one accepted and one replayed', async () => {
    await submitTask(server.url, taskBody('dup-1', 'dup'));
    const assignment = await claimNext(server.url, 'dup');
    const before = await scrape(server.url);
    const body = settleBody(assignment, SUCCESS);
    const reply = await call<{ results: { already_accepted?: boolean; task_state?: string }[] }>(
      server.url,
      '/v1/worker/settle:batch',
      { commands: [body, body] },
    );
    expect(reply.status).toBe(200);
    const accepted = reply.body.results.map((r) => r.already_accepted);
    const after = await scrape(server.url);
    const delta = moved(before, after, 'ledgence_settle_outcomes_total');
    // One settlement: one `accepted`, whatever the other item's reply says.
    expect({ accepted, delta }).toEqual({
      accepted: [false, true],
      delta: {
        'ledgence_settle_outcomes_total{outcome="accepted",code="none",task_state="succeeded"}': 1,
        'ledgence_settle_outcomes_total{outcome="replayed",code="none",task_state="succeeded"}': 1,
      },
    });
  });

  it('a settle sent again after its reply counts replayed, not accepted', async () => {
    await submitTask(server.url, taskBody('again-1', 'again'));
    const assignment = await claimNext(server.url, 'again');
    const body = settleBody(assignment, SUCCESS);
    const before = await scrape(server.url);
    const first = await call<{ already_accepted: boolean }>(server.url, '/v1/worker/settle', body);
    const second = await call<{ already_accepted: boolean }>(server.url, '/v1/worker/settle', body);
    const after = await scrape(server.url);
    expect([first.body.already_accepted, second.body.already_accepted]).toEqual([false, true]);
    expect(moved(before, after, 'ledgence_settle_outcomes_total')).toEqual({
      'ledgence_settle_outcomes_total{outcome="accepted",code="none",task_state="succeeded"}': 1,
      'ledgence_settle_outcomes_total{outcome="replayed",code="none",task_state="succeeded"}': 1,
    });
  });

  it('an acquire:batch counts each slot once under its own disposition', async () => {
    await submitTask(server.url, taskBody('slots-1', 'slots'));
    const session = await openSession(server.url, 'slots', 3);
    const before = await scrape(server.url);
    const reply = await call<{ replies: { disposition?: string; code?: string }[] }>(
      server.url,
      '/v1/worker/acquire:batch',
      {
        commands: [
          pollBody(session, 'slots', 0, 1),
          pollBody(session, 'slots', 1, 1),
          pollBody(session, 'slots', 2, 1),
        ],
      },
    );
    expect(reply.status).toBe(200);
    const after = await scrape(server.url);
    const dispositions = reply.body.replies.map((r) => r.disposition ?? r.code).sort();
    const delta = moved(before, after, 'ledgence_acquire_outcomes_total');
    const counted: string[] = [];
    for (const [key, n] of Object.entries(delta)) {
      const d = /disposition="([^"]+)"/.exec(key)?.[1] as string;
      for (let i = 0; i < n; i += 1) counted.push(d);
    }
    expect(counted.sort()).toEqual(dispositions);
  });
});

describe('acquire counters and polls whose client left', () => {
  /** Sends a parked acquire (or batch) and aborts it after `abortMs`. */
  async function abandoned(path: string, body: unknown, abortMs: number): Promise<void> {
    await fetch(`${server.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(abortMs),
    }).then(
      (r) => r.text(),
      () => undefined,
    );
  }

  it('a parked acquire:batch (a slot polled twice) whose client disconnects counts no outcome, not empty, not unavailable', async () => {
    const session = await openSession(server.url, 'left-batch', 1);
    const before = await scrape(server.url);
    await abandoned(
      '/v1/worker/acquire:batch?wait_ms=5000',
      { commands: [pollBody(session, 'left-batch', 0, 1), pollBody(session, 'left-batch', 0, 2)] },
      400,
    );
    // The server sees the disconnect and ends the park: its wait is timed as `left`.
    const LEFT = 'ledgence_acquire_wait_seconds_count{long_poll="true",outcome="left"}';
    await until(
      async () => ((await scrape(server.url)).get(LEFT) ?? 0) > (before.get(LEFT) ?? 0),
      10_000,
      'the left poll timed',
    );
    const after = await scrape(server.url);
    // None of its polls was answered: neither the first poll's `empty` nor the `unavailable` of
    // the slot's second poll (never run) is counted (README: "polls answered").
    expect(moved(before, after, 'ledgence_acquire_outcomes_total')).toEqual({});
  });
});
