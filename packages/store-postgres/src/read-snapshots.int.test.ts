/**
 * Reads of several statements under a write that commits between them (DESIGN §4: a read answers
 * one coherent observation). A store on a connection of its own stops a read after one statement,
 * lets another store commit a transition, a retention pass or a delivery report, and only then
 * sends the read's next statement: what a busy server can do at any time, made deterministic.
 * Each read must answer as of one moment — never a task without history, an attempt from after
 * its task's snapshot, or a subscription view that a write committed before it contradicts.
 */
import {
  type Assignment,
  COMPLETION_MAX_ATTEMPTS,
  type CompletionSubscription,
  TERMINAL_RETENTION_MS,
} from '@ledgence/contracts';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore } from './store.js';
import {
  acquireCommand,
  CONFIG,
  type Harness,
  harness,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('read_snapshots');
});
afterAll(() => h.close());

/**
 * The harness's clock offset as this file moves it: every store here, the intercepting ones too,
 * reads the same store time.
 */
let offset = 0;
function advance(ms: number): void {
  offset += ms;
  h.advance(ms);
}

/** The text of a tagged-template statement, its parameters as `$`. */
function statementText(args: unknown[]): string {
  return Array.isArray(args[0]) ? args[0].join('$') : '';
}

/**
 * A store on a client of its own, on the harness's clock, whose next read is stopped between two
 * of its statements: once a statement containing `first` was issued and a later one containing
 * `second` is, the first is awaited (its snapshot taken and answered), then `between` runs, and
 * only then is the second sent. `fired()` tells whether the read had such two statements at all
 * (a read of one statement has no moment between them, which is what a fix may make it).
 */
function storeBetween(first: string, second: string, between: () => Promise<void>) {
  let earlier: PromiseLike<unknown> | undefined;
  let fired = false;
  const client = postgres(h.db.url, { max: 1, onnotice: () => {} });
  const trap: ProxyHandler<postgres.Sql> = {
    apply(query, self, args) {
      const text = statementText(args);
      if (!fired && earlier === undefined && text.includes(first)) {
        earlier = Reflect.apply(query, self, args) as PromiseLike<unknown>;
        return earlier;
      }
      if (fired || earlier === undefined || !text.includes(second)) {
        return Reflect.apply(query, self, args);
      }
      fired = true;
      const settled = Promise.resolve(earlier).then(
        () => {},
        () => {},
      );
      return settled.then(between).then(() => Reflect.apply(query, self, args));
    },
  };
  const intercepting = new Proxy(client, {
    ...trap,
    get(target, property, receiver) {
      if (property !== 'reserve') return Reflect.get(target, property, receiver);
      return async () => new Proxy(await target.reserve(), trap);
    },
  });
  const store = createPostgresTaskStore({
    sql: intercepting,
    config: CONFIG,
    clockOffsetMs: () => offset,
  });
  return { store, fired: () => fired, close: () => client.end() };
}

async function claim(queue: string): Promise<Assignment> {
  const s = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(s.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error(`expected assigned: ${reply.disposition}`);
  return reply.assignment;
}

/** A task that ran and succeeded, with the attempt it ran in. */
async function succeededTask(key: string): Promise<{ taskId: string; attemptId: string }> {
  const { snapshot } = await h.store.submit(submitCommand(key, { queue: key }));
  const assignment = await claim(key);
  await h.store.settle(successCommand(assignment, `${key}-done`));
  return { taskId: snapshot.task_id, attemptId: assignment.lease.owner.attempt_id };
}

/** Retention collects every terminal task of the scope: the clock moves past the retention. */
async function retireAll(): Promise<void> {
  advance(TERMINAL_RETENTION_MS + 1);
  const progress = await h.store.collectRetired(SCOPE);
  expect(progress.tasks_removed).toBeGreaterThan(0);
}

describe('history between its statements', () => {
  it('a task retired after the existence check answers its whole history, not an empty page', async () => {
    const { taskId } = await succeededTask('hist-retired');
    const expected = await h.store.history(SCOPE, taskId, 0);
    expect(expected.map((e) => e.event.reason)).toContain('succeeded');
    const racing = storeBetween('select 1 from tasks', 'from task_history', retireAll);
    try {
      const page = await racing.store.history(SCOPE, taskId, 0);
      expect(racing.fired()).toBe(true);
      expect(page).toEqual(expected);
    } finally {
      await racing.close();
    }
    await expect(h.store.history(SCOPE, taskId, 0)).rejects.toMatchObject({ code: 'not_found' });
  });
});

describe('an attempt between its statements', () => {
  it('a settle committed after the task was read leaves the attempt as the task shows it', async () => {
    const { snapshot } = await h.store.submit(submitCommand('attempt-settled', { queue: 'as' }));
    const assignment = await claim('as');
    const attemptId = assignment.lease.owner.attempt_id;
    const racing = storeBetween('left join task_payloads', 'from attempts a', async () => {
      await h.store.settle(successCommand(assignment, 'attempt-settled-done'));
    });
    try {
      const attempt = await racing.store.inspectAttempt(SCOPE, snapshot.task_id, attemptId);
      expect(racing.fired()).toBe(true);
      // The task read first was active with this attempt current: so is the attempt.
      expect([attempt.state, attempt.settlement, attempt.finished_at]).toEqual([
        'active',
        null,
        null,
      ]);
    } finally {
      await racing.close();
    }
    const after = await h.store.inspectAttempt(SCOPE, snapshot.task_id, attemptId);
    expect(after.state).not.toBe('active');
  });

  it('a task retired after it was read still answers its attempt, not attempt-not-found', async () => {
    const { taskId, attemptId } = await succeededTask('attempt-retired');
    const expected = await h.store.inspectAttempt(SCOPE, taskId, attemptId);
    const racing = storeBetween('left join task_payloads', 'from attempts a', retireAll);
    try {
      expect(await racing.store.inspectAttempt(SCOPE, taskId, attemptId)).toEqual(expected);
      expect(racing.fired()).toBe(true);
    } finally {
      await racing.close();
    }
  });
});

describe('completion subscriptions between the rows and the clock', () => {
  /**
   * A delivery on its generation's last try, leased for `leaseMs` and not yet reported: after
   * COMPLETION_MAX_ATTEMPTS − 1 failed tries, due again at once.
   */
  async function lastTryLeased(key: string, leaseMs: number) {
    const { snapshot } = await h.store.submit(submitCommand(key, { queue: key }));
    await h.store.cancel(SCOPE, snapshot.task_id);
    const { subscription } = await h.store.subscribe(SCOPE, snapshot.task_id, {
      subscription_key: key,
      destination: 'billing',
    });
    const leaseOne = async () => {
      const leases = await h.store.leaseDeliveries(10, leaseMs);
      const mine = leases.find((l) => l.subscription_id === subscription.id);
      if (mine === undefined) throw new Error(`${subscription.id} was not leased`);
      return mine;
    };
    for (let attempt = 1; attempt < COMPLETION_MAX_ATTEMPTS; attempt += 1) {
      const lease = await leaseOne();
      const failed = await h.store.reportDelivery({
        scope: SCOPE,
        subscription_id: subscription.id,
        generation: lease.generation,
        attempt: lease.attempt,
        next: { state: 'due', delay_ms: 0 },
        status_code: 503,
        error: 'HTTP 503',
      });
      expect(failed).toBe(true);
    }
    const last = await leaseOne();
    expect(last.attempt).toBe(COMPLETION_MAX_ATTEMPTS);
    return { taskId: snapshot.task_id, subscriptionId: subscription.id, last };
  }

  it('a last try reported in its lease is never shown exhausted by a view that reads the clock after', async () => {
    const leaseMs = 60_000;
    const { taskId, subscriptionId, last } = await lastTryLeased('lost-view', leaseMs);
    // The sender's report lands within the lease; then time passes beyond the lease's end.
    const reportThenLeaseEnds = async () => {
      const reported = await h.store.reportDelivery({
        scope: SCOPE,
        subscription_id: subscriptionId,
        generation: last.generation,
        attempt: last.attempt,
        next: { state: 'delivered' },
        status_code: 204,
      });
      expect(reported).toBe(true);
      advance(leaseMs);
    };
    const racing = storeBetween(
      'completion_subscriptions s\n      join completion_deliveries d',
      'clock_timestamp()) * 1000)::bigint as now',
      reportThenLeaseEnds,
    );
    let view: CompletionSubscription[];
    try {
      view = await racing.store.listSubscriptions(SCOPE, taskId);
    } finally {
      await racing.close();
    }
    // A read of one statement has no moment between rows and clock: the report lands after it.
    if (!racing.fired()) await reportThenLeaseEnds();
    const later = await h.store.listSubscriptions(SCOPE, taskId);
    expect(later.map((s) => s.state)).toEqual(['delivered']);
    // The view came before the report (delivering) or after it (delivered). `exhausted` would be
    // a verdict the delivery's committed row contradicts from then on: a view's answer stands.
    expect(view.map((s) => s.state)).not.toEqual(['exhausted']);
  });
});
