/**
 * When a worker's slot polls again, against a real server process on real PostgreSQL over real
 * sockets, behind an HTTP proxy that sees every request: after the quiescence confirmation of a
 * handler deaf to the end of its budget (DESIGN §5: the server holds an `unconfirmed` attempt,
 * and so its slot, refusing its polls `409 consumer_busy`, until the confirmation; the cleanup
 * grace is 60 s here, so nothing else frees it), while a handler deaf to a cancel runs, after an
 * `empty` the server parked for less than asked, and after a session lost during an outage. The
 * confirmation tests give the worker a long backoff (a minute or two), so a slot left to wait
 * out its backoff is told apart from one that polls at once by a bound far inside it.
 */
import { describe, expect, it } from 'vitest';
import {
  client,
  historyOf,
  reasons,
  settled,
  sleep,
  startHttpProxy,
  until,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('worker_slots_e2e', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '60000',
});
const { proxies } = suite;

/** A retried poll waits 60 to 120 s (backoff.ts: jitter in [ceiling/2, ceiling]). */
const LONG_BACKOFF = { baseMs: 120_000, maxMs: 120_000 };
/** How long the next task may take to settle once the slot is free: far inside LONG_BACKOFF. */
const FREED_BOUND_MS = 30_000;

const SETTLE = '/v1/worker/settle:batch';
const ACQUIRE = '/v1/worker/acquire:batch';
const CONFIRM = '/v1/worker/quiescence';

/**
 * One slot running a `deaf` task (a budget of `timeoutMs`, 1 s by default) whose handler
 * returns only at `release()`, on a worker behind an HTTP proxy; `events` records the handlers'
 * starts, the deaf one's abort and its return. `refusedPolls()` counts the polls answered after
 * the worker's `unconfirmed` report and sent before its confirmation was answered: the server
 * holds the slot until then, so they are `consumer_busy`. With `holdFirstRefusal`, the first of
 * them is refused by the server at once but its answer is held until 200 ms after the
 * confirmation's answer.
 */
async function deafSlot(
  queue: string,
  options: { holdFirstRefusal?: boolean; timeoutMs?: number } = {},
) {
  const c = client(suite.server.url);
  const deaf = await c.submit({
    queue,
    program: 'deaf',
    data: null,
    timeout_ms: options.timeoutMs ?? 1_000,
    retry: { max_attempts: 1, delay_ms: 0 },
  });
  const events: string[] = [];
  let reported = false;
  let refusedPolls = 0;
  let heldPolls = 0;
  let confirmed = false;
  let confirmationAnswered = () => {};
  const confirmation = new Promise<void>((resolve) => {
    confirmationAnswered = resolve;
  });
  const proxy = await startHttpProxy(suite.server.url, {
    observe: ({ path }) => {
      if (path === SETTLE) {
        return () => {
          reported = true;
        };
      }
      if (path === CONFIRM) {
        return () => {
          confirmed = true;
          confirmationAnswered();
        };
      }
      if (path.startsWith(ACQUIRE) && reported && !confirmed) {
        return () => {
          refusedPolls += 1;
        };
      }
      return undefined;
    },
    hold: ({ path }) => {
      if (!options.holdFirstRefusal || !path.startsWith(ACQUIRE) || !reported) return undefined;
      if (heldPolls > 0) return undefined;
      heldPolls += 1;
      return confirmation.then(() => sleep(200));
    },
  });
  proxies.push(proxy);
  let release = () => {};
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  let started = false;
  const w = suite.worker(queue, { url: proxy.url, abortGraceMs: 50, backoff: LONG_BACKOFF });
  w.register('deaf', async (_data, ctx) => {
    started = true;
    events.push('deaf started');
    ctx.signal.addEventListener('abort', () => events.push('deaf aborted'));
    await released;
    events.push('deaf returned');
    return 'late';
  });
  w.register('next', () => {
    events.push('next started');
    return 'ran';
  });
  const running = w.run();
  await until(() => started, 30_000, 'the deaf handler running');
  return {
    c,
    deaf,
    w,
    running,
    release,
    events,
    refusedPolls: () => refusedPolls,
    heldPolls: () => heldPolls,
  };
}

describe('a slot freed by a quiescence confirmation', () => {
  it('polls at once after the confirmation, not when the backoff of its consumer_busy polls ends', async () => {
    const slot = await deafSlot('freed-by-confirmation');
    // Reported `unconfirmed`; the slot's poll is refused as consumer_busy and backs off.
    await until(() => slot.refusedPolls() >= 1, 30_000, 'a poll refused after the report');
    const next = await slot.c.submit({
      queue: 'freed-by-confirmation',
      program: 'next',
      data: null,
    });
    slot.release();
    await until(
      async () => reasons(await historyOf(slot.c, slot.deaf.task_id)).includes('cleanup_confirmed'),
      10_000,
      'cleanup_confirmed',
    );
    const [result] = await settled(slot.c, [next.task_id], FREED_BOUND_MS);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'ran' });
    await slot.w.stop({ graceMs: 0 });
    await slot.running;
  });

  it('a consumer_busy answered after the confirmation to a poll sent before it backs nothing off', async () => {
    const queue = 'busy-crossing-confirmation';
    const slot = await deafSlot(queue, { holdFirstRefusal: true });
    // The first poll after the report reaches the server, which refuses it as consumer_busy;
    // its answer is held while the handler ends and its confirmation is answered.
    await until(() => slot.heldPolls() === 1, 30_000, 'a poll sent after the report');
    const next = await slot.c.submit({ queue, program: 'next', data: null });
    slot.release();
    await until(() => slot.refusedPolls() >= 1, 10_000, 'the held refusal passed on');
    expect(reasons(await historyOf(slot.c, slot.deaf.task_id))).toContain('cleanup_confirmed');
    const [result] = await settled(slot.c, [next.task_id], FREED_BOUND_MS);
    expect(result?.outcome).toEqual({ state: 'succeeded', output: 'ran' });
    await slot.w.stop({ graceMs: 0 });
    await slot.running;
  });
});

describe('a handler deaf to a cancel', () => {
  it('keeps its slot while it runs within its budget: the next task starts only once it returns', async () => {
    const queue = 'deaf-to-cancel';
    // A budget far longer than the test: only the handler's return can end the attempt.
    const slot = await deafSlot(queue, { timeoutMs: 600_000 });
    const next = await slot.c.submit({ queue, program: 'next', data: null });
    expect(await slot.c.cancel(slot.deaf.task_id)).toBe('active');
    await until(() => slot.events.includes('deaf aborted'), 10_000, 'the cancel seen');
    // The handler runs on: were its slot freed at the cancel, the worker's one slot would take
    // the next task at once (a poll's round trip) and run a second handler beside it.
    await sleep(1_000);
    slot.release();
    const [cancelled, ran] = await settled(slot.c, [slot.deaf.task_id, next.task_id], 30_000);
    expect(cancelled?.outcome).toEqual({ state: 'cancelled' });
    expect(ran?.outcome).toEqual({ state: 'succeeded', output: 'ran' });
    expect(slot.events).toEqual(['deaf started', 'deaf aborted', 'deaf returned', 'next started']);
    await slot.w.stop({ graceMs: 0 });
    await slot.running;
  });
});

describe('an idle worker against a server that parks polls for less than asked', () => {
  it('has its next poll parked as soon as the last one ends: a 1 s park is not paced like an empty answered at once', async () => {
    // The server parks at most 1 s (SHORT_TIMINGS, as a balancer's short idle timeout would
    // make an operator set it), the worker asks for its default 20 s: each `empty` comes back
    // after 1 s, well before the wait asked for. Pacing exists for empties answered at once
    // (a server that parks 0 ms); a poll that already took a second needs no pause after it,
    // and a pause is time in which no poll is parked to take a task.
    const polls: { sent: number; answered: number }[] = [];
    const proxy = await startHttpProxy(suite.server.url, {
      observe: ({ path }) => {
        if (!path.startsWith(ACQUIRE)) return undefined;
        const poll = { sent: Date.now(), answered: Number.NaN };
        polls.push(poll);
        return () => {
          poll.answered = Date.now();
        };
      },
    });
    proxies.push(proxy);
    const w = suite.worker('idle-short-parks', { url: proxy.url, pollWaitMs: 20_000 });
    w.register('p', () => null);
    const running = w.run();
    // From the third early batch in a row the pause is 100 ms, doubling: after the sixth it is
    // jittered in [400, 800] ms, from the seventh in [500, 1000] ms. The pauses after the sixth,
    // seventh and eighth polls are measured.
    await until(() => polls.length >= 9, 60_000, 'nine polls');
    const gaps = polls.slice(5, 9).map((poll, i, all) => {
      const next = all[i + 1];
      return next === undefined ? Number.NaN : next.sent - poll.answered;
    });
    await w.stop({ graceMs: 0 });
    await running;
    const measured = gaps.filter((gap) => !Number.isNaN(gap));
    expect(measured).toHaveLength(3);
    // Paced, every one of these gaps is at least 400 ms; unpaced, a turn-around of the loop.
    expect(Math.min(...measured)).toBeLessThan(250);
  });
});

describe('a slot whose session expired during an outage', () => {
  it('moves to the new session at once: the failed polls of the outage are not session losses', async () => {
    // Sessions of 1 s, and polls refused (503 unavailable, as by an overloaded balancer) for
    // longer than that: the slot's polls fail and back off; its session expires meanwhile. Its
    // first poll after the outage is answered session_expired — the slot's first session loss,
    // which moves over at once; only session after session lost without a completed poll (a
    // balancer misrouting between deployments) backs off before each move.
    const expiring = await suite.stack.start({ LEDGENCE_SESSION_VALIDITY_MS: '1000' });
    let refusals = 0;
    const polls: { session: string; sent: number; answered: number }[] = [];
    const proxy = await startHttpProxy(expiring.url, {
      refuse: ({ path }) => {
        if (!path.startsWith(ACQUIRE) || refusals >= 2) return false;
        refusals += 1;
        return true;
      },
      observe: ({ path, body }) => {
        if (!path.startsWith(ACQUIRE)) return undefined;
        const { commands } = JSON.parse(body.toString()) as {
          commands: { worker_session_id: string }[];
        };
        const poll = {
          session: commands[0]?.worker_session_id ?? '',
          sent: Date.now(),
          answered: Number.NaN,
        };
        polls.push(poll);
        return () => {
          poll.answered = Date.now();
        };
      },
    });
    proxies.push(proxy);
    // Retries of 1 to 2 s, then 2 to 4 s: the outage outlasts the session.
    const w = suite.worker('session-lost-in-outage', {
      url: proxy.url,
      backoff: { baseMs: 2_000, maxMs: 60_000 },
    });
    w.register('p', () => null);
    const running = w.run();
    await until(() => polls.length >= 2, 30_000, 'a poll on a second session');
    await w.stop({ graceMs: 0 });
    await running;
    const [expired, moved] = polls;
    expect(refusals).toBe(2);
    expect(moved?.session).not.toBe(expired?.session);
    // Backing off, the move would wait 2 to 4 s (the third failure's delay); at once, it waits
    // for a session open.
    expect((moved?.sent ?? 0) - (expired?.answered ?? 0)).toBeLessThan(1_000);
  });
});
