/**
 * The completion sender against real receivers on 127.0.0.1 and the
 * in-memory store (no network mocks): tasks are driven terminal through the
 * TaskStore API, subscribed, and the sender leases, posts and reports.
 */
import type { ServerResponse } from 'node:http';
import {
  COMPLETION_LEASE_MS,
  COMPLETION_MAX_ATTEMPTS,
  COMPLETION_MAX_RETRY_DELAY_MS,
  COMPLETION_RESPONSE_MAX_BYTES,
  CompletionSubscriptionSchema,
  parseWith,
  type Scope,
} from '@ledgence/contracts';
import type { DeliveryReport } from '@ledgence/core';
import { createMemoryTaskStore, freshScope, type MemoryTaskStore } from '@ledgence/core/testing';
import { Webhook } from 'standardwebhooks';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { CLOUDEVENTS_CONTENT_TYPE } from './deliver.js';
import { createDestination, type Destinations } from './destinations.js';
import {
  type CompletionSender,
  type CompletionSenderOptions,
  createCompletionSender,
  type DeliveryRecord,
  type LogFields,
  REPORT_MARGIN_MS,
  type SenderLogger,
  UNCONFIGURED_GRACE_LEASES,
} from './sender.js';
import {
  type Answer,
  type ReceivedRequest,
  type Receiver,
  startRawReceiver,
  startReceiver,
} from './testdata/receiver.js';
import { finishTask, subscribe, subscriptionOf } from './testdata/tasks.js';

const KEY = Buffer.alloc(32, 0x5a);
const SECRET_TEXT = `whsec_${KEY.toString('base64')}`;
/** Conditions are polled, not timed: generous for a loaded CI machine, quick when all is well. */
const WAIT = { timeout: 5_000, interval: 10 };
/**
 * Store time stands still unless a test advances it, so due times are exact. It stands at this
 * run's start: the sender signs with store time, and `verified` checks the timestamp against
 * this process's clock, as a receiver does.
 */
const T0 = Math.floor(Date.now() / 1000) * 1000;

let store: MemoryTaskStore;
let scope: Scope;
const open: { close(): Promise<void> }[] = [];
const senders: CompletionSender[] = [];

beforeEach(() => {
  store = createMemoryTaskStore({ now: () => T0 });
  scope = freshScope();
});

afterEach(async () => {
  // Senders first: stopping one waits for its tries, which the receivers' close ends.
  const stopping = senders.splice(0).map((sender) => sender.stop());
  await Promise.all(open.splice(0).map((server) => server.close()));
  await Promise.all(stopping);
});

/**
 * The test's store, whose reports go through `reportDelivery` one by one (a fault made around
 * each); a call of the sender's fails as a whole when one of its reports does, as a transaction.
 */
function reportingWith(
  reportDelivery: (report: DeliveryReport) => Promise<boolean>,
): CompletionSenderOptions['store'] {
  return {
    leaseDeliveries: (limit, leaseMs) => store.leaseDeliveries(limit, leaseMs),
    reportDeliveries: (reports) => Promise.all(reports.map(reportDelivery)),
  };
}

async function receiver(answer: Answer): Promise<Receiver> {
  const started = await startReceiver(answer);
  open.push(started);
  return started;
}

/** A receiver that holds every request until the test answers it. */
async function gatedReceiver(): Promise<Receiver & { held: ServerResponse[] }> {
  const held: ServerResponse[] = [];
  const started = await receiver((res) => held.push(res));
  return Object.assign(started, { held });
}

function destinations(
  aliases: Record<string, { origin: string; timeoutMs?: number }>,
): Destinations {
  return new Map(
    Object.entries(aliases).map(([alias, { origin, timeoutMs }]) => [
      alias,
      createDestination({ alias, url: `${origin}/hooks/${alias}`, secret: KEY, timeoutMs }),
    ]),
  );
}

interface LogLine {
  level: keyof SenderLogger;
  message: string;
  fields: LogFields;
}

function captureLogger(): SenderLogger & { lines: LogLine[] } {
  const lines: LogLine[] = [];
  const at =
    (level: keyof SenderLogger) =>
    (fields: LogFields, message: string): void => {
      lines.push({ level, message, fields });
    };
  return { lines, info: at('info'), warn: at('warn'), error: at('error') };
}

function sender(
  options: Partial<CompletionSenderOptions> & Pick<CompletionSenderOptions, 'destinations'>,
) {
  const created = createCompletionSender({ store, idleIntervalMs: 10, ...options });
  senders.push(created);
  return created;
}

/** Verifies a request as a receiver would, with the `standardwebhooks` library. */
function verified(request: ReceivedRequest): unknown {
  return new Webhook(SECRET_TEXT).verify(
    request.body.toString('utf8'),
    request.headers as Record<string, string>,
  );
}

/** A finished task subscribed to `alias`. */
async function dueDelivery(alias: string) {
  const taskId = await finishTask(store, scope);
  return subscribe(store, scope, taskId, alias);
}

describe('a receiver answering 2xx', () => {
  it('gets a signed CloudEvent and the delivery is recorded delivered', async () => {
    const r = await receiver((res) => res.writeHead(200).end('ok'));
    const logger = captureLogger();
    const seen: DeliveryRecord[] = [];
    const s = sender({
      destinations: destinations({ billing: r }),
      logger,
      onDelivery: (record) => seen.push(record),
    });
    const subscription = await dueDelivery('billing');

    const pass = await s.runOnce();

    expect(pass.leased).toBe(1);
    expect(pass.records).toEqual([
      {
        outcome: 'delivered',
        destination: 'billing',
        tenantId: scope.tenant_id,
        namespace: scope.namespace,
        taskId: subscription.task_id,
        subscriptionId: subscription.id,
        eventId: subscription.event_id,
        generation: 1,
        attempt: 1,
        durationMs: expect.any(Number),
        posted: true,
        status: 200,
      },
    ]);
    expect(seen).toEqual(pass.records);
    const [got] = r.requests;
    if (got === undefined) throw new Error('no request');
    expect(r.requests).toHaveLength(1);
    expect(got.method).toBe('POST');
    expect(got.path).toBe('/hooks/billing');
    expect(got.headers['content-type']).toBe(CLOUDEVENTS_CONTENT_TYPE);
    expect(got.headers['webhook-id']).toBe(subscription.event_id);
    expect(verified(got)).toMatchObject({
      id: subscription.event_id,
      type: 'dev.ledgence.task.completed',
      subject: subscription.task_id,
      ldgtenant: scope.tenant_id,
      data: { task_id: subscription.task_id, state: 'succeeded' },
    });
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'delivered',
      attempts: 1,
      generation: 1,
      last_status_code: 200,
      delivered_at: expect.any(Number),
    });
    expect(await store.dueBacklog(10)).toBe(0);
    expect((await s.runOnce()).leased).toBe(0);

    // One line per try with the ids, the alias and the status — never the URL or the key.
    expect(logger.lines).toContainEqual({
      level: 'info',
      message: 'completion delivered',
      fields: expect.objectContaining({
        event_id: subscription.event_id,
        subscription_id: subscription.id,
        destination: 'billing',
        status: 200,
      }),
    });
    const logged = JSON.stringify(logger.lines);
    expect(logged).not.toContain(r.origin);
    expect(logged).not.toContain(KEY.toString('base64'));
  });

  it('is delivered after one post when its body is longer than the read limit', async () => {
    // DESIGN §8: 2xx = delivered. Failing it would post the event again, up to exhaustion, to a
    // receiver that accepted it every time.
    const r = await receiver((res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end(Buffer.alloc(COMPLETION_RESPONSE_MAX_BYTES + 1024, 0x61));
    });
    const s = sender({ destinations: destinations({ billing: r }), retryBaseMs: 1 });
    const subscription = await dueDelivery('billing');

    expect((await s.runOnce()).records).toMatchObject([
      { outcome: 'delivered', status: 200, posted: true },
    ]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'delivered',
      attempts: 1,
      last_status_code: 200,
    });
    store.advance(COMPLETION_MAX_RETRY_DELAY_MS);
    expect((await s.runOnce()).leased).toBe(0);
    expect(r.requests).toHaveLength(1);
  });
});

describe('a failed try', () => {
  it('is retried after the backoff with the same webhook id and identical bytes', async () => {
    const r = await receiver((res, _request, index) =>
      res.writeHead(index === 0 ? 500 : 200).end(),
    );
    const s = sender({ destinations: destinations({ billing: r }), retryBaseMs: 1_000 });
    const subscription = await dueDelivery('billing');

    expect((await s.runOnce()).records).toMatchObject([
      { outcome: 'retry', reason: 'status', status: 500, attempt: 1 },
    ]);
    const failed = await subscriptionOf(store, scope, subscription);
    expect(failed).toMatchObject({
      state: 'due',
      attempts: 1,
      last_status_code: 500,
      last_error: 'status 500',
    });
    // The first backoff is a full-jitter delay in 1..retryBaseMs, in store time.
    expect(failed.next_attempt_at).toBeGreaterThan(T0);
    expect(failed.next_attempt_at).toBeLessThanOrEqual(T0 + 1_000);
    expect((await s.runOnce()).leased).toBe(0);

    store.advance(1_000);
    expect((await s.runOnce()).records).toMatchObject([
      { outcome: 'delivered', status: 200, attempt: 2 },
    ]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'delivered',
      attempts: 2,
      last_status_code: 200,
    });
    const [first, second] = r.requests;
    if (first === undefined || second === undefined) throw new Error('expected two requests');
    expect(second.headers['webhook-id']).toBe(first.headers['webhook-id']);
    expect(second.body.equals(first.body)).toBe(true);
    expect(verified(first)).toEqual(verified(second));
  });

  it('on 410 Gone exhausts the delivery at once', async () => {
    const r = await receiver((res) => res.writeHead(410).end());
    const s = sender({ destinations: destinations({ billing: r }) });
    const subscription = await dueDelivery('billing');

    expect((await s.runOnce()).records).toMatchObject([{ outcome: 'gone', status: 410 }]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'exhausted',
      attempts: 1,
      last_status_code: 410,
      last_error: 'the receiver answered 410 Gone',
    });
    store.advance(COMPLETION_MAX_RETRY_DELAY_MS);
    expect((await s.runOnce()).leased).toBe(0);
    expect(r.requests).toHaveLength(1);
  });

  it(`exhausts the delivery after ${COMPLETION_MAX_ATTEMPTS} failed tries`, async () => {
    const r = await receiver((res) => res.writeHead(503).end());
    const s = sender({ destinations: destinations({ billing: r }), retryBaseMs: 1 });
    const subscription = await dueDelivery('billing');

    const outcomes: string[] = [];
    for (let pass = 0; pass < COMPLETION_MAX_ATTEMPTS + 2; pass += 1) {
      for (const record of (await s.runOnce()).records) outcomes.push(record.outcome);
      // With a 1 ms base the cap of try n is 2^(n−1) ms: 2 048 ms at most.
      store.advance(2_048);
    }

    expect(outcomes).toEqual([
      ...Array.from({ length: COMPLETION_MAX_ATTEMPTS - 1 }, () => 'retry'),
      'exhausted',
    ]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'exhausted',
      attempts: COMPLETION_MAX_ATTEMPTS,
      last_status_code: 503,
      last_error: 'status 503',
    });
    expect(r.requests).toHaveLength(COMPLETION_MAX_ATTEMPTS);
    const first = r.requests[0];
    for (const request of r.requests) {
      expect(request.headers['webhook-id']).toBe(subscription.event_id);
      expect(first !== undefined && request.body.equals(first.body)).toBe(true);
    }
  });

  it('on a status line outside 100..999 records no status, and the subscription keeps to the wire schema', async () => {
    // Node's parser takes "099" as 99. `last_status_code` is 100..999 in the published
    // CompletionSubscriptionSchema, which the SDK's client checks every reply against.
    const r = await startRawReceiver((socket) => {
      socket.once('data', () =>
        socket.end('HTTP/1.1 099 Odd\r\ncontent-length: 0\r\nconnection: close\r\n\r\n'),
      );
    });
    open.push(r);
    const s = sender({ destinations: destinations({ billing: r }) });
    const subscription = await dueDelivery('billing');

    const [record] = (await s.runOnce()).records;
    expect(record).toMatchObject({ outcome: 'retry', reason: 'network' });
    expect(record).not.toHaveProperty('status');
    const row = await subscriptionOf(store, scope, subscription);
    expect(row).toMatchObject({
      state: 'due',
      attempts: 1,
      last_error: 'invalid status line (status 99)',
    });
    expect(() => parseWith(CompletionSubscriptionSchema, row)).not.toThrow();
  });

  it('honours Retry-After as the next due time', async () => {
    const r = await receiver((res, _request, index) =>
      res.writeHead(index === 0 ? 503 : 200, index === 0 ? { 'retry-after': '120' } : {}).end(),
    );
    const s = sender({ destinations: destinations({ billing: r }), retryBaseMs: 1_000 });
    const subscription = await dueDelivery('billing');

    await s.runOnce();
    // Retry-After (120 s) is above any jitter of a 1 s base: it is the delay.
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'due',
      last_status_code: 503,
      next_attempt_at: T0 + 120_000,
    });

    store.advance(119_999);
    expect((await s.runOnce()).leased).toBe(0);
    store.advance(1);
    expect((await s.runOnce()).records).toMatchObject([{ outcome: 'delivered', attempt: 2 }]);
  });
});

describe('concurrency', () => {
  it('a hanging receiver does not hold up the other deliveries of its batch', async () => {
    const slow = await gatedReceiver();
    const fast = await receiver((res) => res.end());
    const s = sender({ destinations: destinations({ slow, fast }) });
    const stuck = await dueDelivery('slow');
    const quick = await dueDelivery('fast');

    const pass = s.runOnce();
    await vi.waitFor(async () => {
      expect((await subscriptionOf(store, scope, quick)).state).toBe('delivered');
    }, WAIT);
    expect(slow.requests).toHaveLength(1);
    expect((await subscriptionOf(store, scope, stuck)).state).toBe('delivering');

    await slow.close(); // the hanging try ends as a network failure
    const { leased, records } = await pass;
    expect(leased).toBe(2);
    expect(records.map((record) => [record.destination, record.outcome])).toEqual(
      expect.arrayContaining([
        ['slow', 'retry'],
        ['fast', 'delivered'],
      ]),
    );
    expect((await subscriptionOf(store, scope, stuck)).state).toBe('due');
  });

  it('the loop keeps delivering while a hanging try holds one slot', async () => {
    const slow = await gatedReceiver();
    const fast = await receiver((res) => res.end());
    const s = sender({ destinations: destinations({ slow, fast }), batchSize: 2 });
    const stuck = await dueDelivery('slow');
    s.start();
    await vi.waitFor(() => expect(slow.requests).toHaveLength(1), WAIT);

    // Due after the hanging try started: leased by the next passes of the loop.
    const later = [await dueDelivery('fast'), await dueDelivery('fast')];
    await vi.waitFor(async () => {
      for (const subscription of later) {
        expect((await subscriptionOf(store, scope, subscription)).state).toBe('delivered');
      }
    }, WAIT);
    expect((await subscriptionOf(store, scope, stuck)).state).toBe('delivering');
    for (const res of slow.held) res.end();
    await vi.waitFor(async () => {
      expect((await subscriptionOf(store, scope, stuck)).state).toBe('delivered');
    }, WAIT);
  });
});

describe('configuration drift', () => {
  it('leaves a delivery to an alias it lacks for the grace, then retries it as unconfigured', async () => {
    const r = await receiver((res) => res.end());
    const leaseMs = 10_000;
    const s = sender({ destinations: destinations({ billing: r }), retryBaseMs: 1_000, leaseMs });
    const orphan = await dueDelivery('retired');
    const kept = await dueDelivery('billing');

    // Another replica may have `retired` (a rolling change): its tries are left to it.
    expect((await s.runOnce()).records).toEqual([
      expect.objectContaining({ destination: 'billing', outcome: 'delivered' }),
    ]);
    store.advance(UNCONFIGURED_GRACE_LEASES * leaseMs - 1);
    expect((await s.runOnce()).leased).toBe(0);
    expect(await subscriptionOf(store, scope, orphan)).toMatchObject({ state: 'due', attempts: 0 });

    // Due for the whole grace: no replica has taken it, so the alias is gone.
    store.advance(1);
    const { records } = await s.runOnce();

    expect(records).toEqual([
      expect.objectContaining({
        destination: 'retired',
        outcome: 'retry',
        reason: 'unconfigured',
        posted: false,
      }),
    ]);
    const retried = await subscriptionOf(store, scope, orphan);
    expect(retried).toMatchObject({
      state: 'due',
      attempts: 1,
      last_error: 'destination not configured',
    });
    expect(retried).not.toHaveProperty('last_status_code');
    expect((await subscriptionOf(store, scope, kept)).state).toBe('delivered');
    expect(r.requests).toHaveLength(1);
  });

  it('exhausts at once a lost last try to an alias it lacks: no POST is needed', async () => {
    const s = sender({ destinations: destinations({}), leaseMs: 10_000 });
    const lost = await dueDelivery('retired');
    // Another replica leased every try of the generation and died during the last one.
    for (let attempt = 1; attempt <= COMPLETION_MAX_ATTEMPTS; attempt += 1) {
      const [lease] = await store.leaseDeliveries(1, 1_000);
      if (lease === undefined) throw new Error(`try ${attempt} was not leased`);
      if (attempt === COMPLETION_MAX_ATTEMPTS) break;
      await store.reportDelivery({
        scope,
        subscription_id: lease.subscription_id,
        generation: lease.generation,
        attempt: lease.attempt,
        next: { state: 'due', delay_ms: 0 },
      });
    }
    store.advance(1_000);

    expect(await s.runOnce()).toEqual({ leased: 0, records: [] });
    expect(await subscriptionOf(store, scope, lost)).toMatchObject({
      state: 'exhausted',
      attempts: COMPLETION_MAX_ATTEMPTS,
    });
  });
});

describe('fencing', () => {
  it('a report after the lease ran out and another sender took the row changes nothing', async () => {
    const r = await gatedReceiver();
    const config = { destinations: destinations({ billing: r }) };
    const first = sender(config);
    const second = sender(config);
    const subscription = await dueDelivery('billing');

    const late = first.runOnce();
    await vi.waitFor(() => expect(r.held).toHaveLength(1), WAIT);
    // The lease covers the destination's 5 s timeout plus the report margin, at least.
    store.advance(Math.max(COMPLETION_LEASE_MS, 5_000 + REPORT_MARGIN_MS) + 1);
    const retaken = second.runOnce();
    await vi.waitFor(() => expect(r.held).toHaveLength(2), WAIT);
    r.held[1]?.end();
    expect((await retaken).records).toMatchObject([{ outcome: 'delivered', attempt: 2 }]);
    const settled = await subscriptionOf(store, scope, subscription);

    r.held[0]?.writeHead(500).end();
    expect((await late).records).toMatchObject([
      { outcome: 'stale', attempt: 1, status: 500, reason: 'status' },
    ]);
    expect(await subscriptionOf(store, scope, subscription)).toEqual(settled);
    expect(settled).toMatchObject({ state: 'delivered', attempts: 2, last_status_code: 200 });
  });
});

describe('stop()', () => {
  it('stops leasing and resolves once the in-flight tries are delivered and reported', async () => {
    const r = await gatedReceiver();
    const s = sender({ destinations: destinations({ billing: r }) });
    const subscription = await dueDelivery('billing');
    s.start();
    await vi.waitFor(() => expect(r.held).toHaveLength(1), WAIT);

    let stopped = false;
    const stopping = s.stop().then(() => {
      stopped = true;
    });
    const again = s.stop();
    // Several turns of the event loop: an idle loop would have ended by now.
    for (let turn = 0; turn < 5; turn += 1) await new Promise((resolve) => setImmediate(resolve));
    expect(stopped).toBe(false);

    r.held[0]?.end();
    await Promise.all([stopping, again]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({ state: 'delivered' });

    // Stopped means stopped: nothing more is leased.
    const waiting = await dueDelivery('billing');
    expect(await s.runOnce()).toEqual({ leased: 0, records: [] });
    s.start();
    expect((await subscriptionOf(store, scope, waiting)).state).toBe('due');
    expect(r.requests).toHaveLength(1);
  });

  it('with a signal, aborts the tries still in flight when it fires and reports each for a retry', async () => {
    const hanging = await gatedReceiver();
    const seen: DeliveryRecord[] = [];
    const s = sender({
      // A try would otherwise hold stop() for its whole destination timeout.
      destinations: destinations({ billing: { ...hanging, timeoutMs: 60_000 } }),
      retryBaseMs: 1_000,
      onDelivery: (record) => seen.push(record),
    });
    const subscription = await dueDelivery('billing');
    s.start();
    await vi.waitFor(() => expect(hanging.held).toHaveLength(1), WAIT);

    const budget = new AbortController();
    let stopped = false;
    const stopping = s.stop({ signal: budget.signal }).then(() => {
      stopped = true;
    });
    for (let turn = 0; turn < 5; turn += 1) await new Promise((resolve) => setImmediate(resolve));
    // Until the signal fires, a try in flight may still finish on its own.
    expect(stopped).toBe(false);
    budget.abort();
    await vi.waitFor(() => expect(stopped).toBe(true), WAIT);
    await stopping;

    // The POST was on the wire when the signal fired: posted, and timed.
    expect(seen).toMatchObject([{ outcome: 'retry', reason: 'aborted', attempt: 1, posted: true }]);
    expect(seen[0]).not.toHaveProperty('status');
    // Neither delivered nor exhausted: the receiver may not have it, so it is due again.
    const aborted = await subscriptionOf(store, scope, subscription);
    expect(aborted).toMatchObject({ state: 'due', attempts: 1, last_error: 'aborted' });
    expect(aborted).not.toHaveProperty('last_status_code');

    // The next sender (another replica, or this one restarted) delivers the same event.
    const r = await receiver((res) => res.end());
    const next = sender({ destinations: destinations({ billing: r }) });
    store.advance(1_000);
    expect((await next.runOnce()).records).toMatchObject([{ outcome: 'delivered', attempt: 2 }]);
    expect(r.requests[0]?.headers['webhook-id']).toBe(hanging.requests[0]?.headers['webhook-id']);
  });

  it('with a signal that fired before a leased try was sent, ends it unsent: a retry not posted', async () => {
    const r = await receiver((res) => res.writeHead(204).end());
    const seen: DeliveryRecord[] = [];
    const s = sender({
      destinations: destinations({ billing: r }),
      onDelivery: (x) => seen.push(x),
    });
    const subscription = await dueDelivery('billing');
    // The pass leases the delivery; the shutdown budget is spent before it dispatches.
    const pass = s.runOnce();
    const stopped = s.stop({ signal: AbortSignal.abort() });
    const { records } = await pass;
    await stopped;
    expect({ records, seen, requests: r.requests.length }).toMatchObject({
      records: [{ outcome: 'retry', reason: 'aborted', posted: false }],
      seen: [{ posted: false }],
      requests: 0,
    });
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'due',
      attempts: 1,
      last_error: 'aborted before sending',
    });
  });
});

describe('a failing store', () => {
  it('is logged when leasing fails (once while it keeps failing), and the loop carries on once it recovers', async () => {
    const r = await receiver((res) => res.end());
    let down = true;
    let failedLeases = 0;
    const logger = captureLogger();
    const s = sender({
      destinations: destinations({ billing: r }),
      logger,
      store: {
        leaseDeliveries: (limit, leaseMs) => {
          if (!down) return store.leaseDeliveries(limit, leaseMs);
          failedLeases += 1;
          return Promise.reject(new Error('database down'));
        },
        reportDeliveries: (reports) => store.reportDeliveries(reports),
      },
    });
    const subscription = await dueDelivery('billing');
    s.start();

    await vi.waitFor(() => expect(failedLeases).toBeGreaterThanOrEqual(3), WAIT);
    // A stack per failed pass buried the line that says what is wrong: one a minute at most.
    const failures = logger.lines.filter(
      (line) => line.message === 'leasing completion deliveries failed; retrying',
    );
    expect(failures).toHaveLength(1);
    expect(failures[0]).toMatchObject({ level: 'error', fields: { failures: 1 } });
    expect(r.requests).toHaveLength(0);
    down = false;
    await vi.waitFor(async () => {
      expect((await subscriptionOf(store, scope, subscription)).state).toBe('delivered');
    }, WAIT);
    const recovered = logger.lines.filter((line) =>
      line.message.startsWith('leasing completion deliveries works again after'),
    );
    expect(recovered).toHaveLength(1);
    expect(recovered[0]).toMatchObject({ level: 'info' });
    expect(recovered[0]?.fields.failures as number).toBeGreaterThanOrEqual(3);
  });

  it('is tried again within its lease when a report fails: the 2xx is recorded, posted once', async () => {
    const r = await receiver((res) => res.end());
    let failures = 2;
    const logger = captureLogger();
    const s = sender({
      destinations: destinations({ billing: r }),
      logger,
      store: reportingWith((report) =>
        failures-- > 0 ? Promise.reject(new Error('database down')) : store.reportDelivery(report),
      ),
    });
    const subscription = await dueDelivery('billing');

    expect((await s.runOnce()).records).toMatchObject([{ outcome: 'delivered', status: 200 }]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'delivered',
      attempts: 1,
    });
    expect(r.requests).toHaveLength(1);
    expect(logger.lines.filter((line) => line.level === 'warn')).toHaveLength(2);
  });

  it('a report recorded whose answer was lost keeps its outcome: the copy sent again answers stale, the try is delivered', async () => {
    const r = await receiver((res) => res.end());
    let lost = 1;
    const logger = captureLogger();
    const s = sender({
      destinations: destinations({ billing: r }),
      logger,
      // Committed, and then the connection fails before the answer arrives.
      store: reportingWith(async (report) => {
        const recorded = await store.reportDelivery(report);
        if (lost-- > 0) throw new Error('connection lost before the answer');
        return recorded;
      }),
    });
    const subscription = await dueDelivery('billing');

    expect((await s.runOnce()).records).toMatchObject([{ outcome: 'delivered', status: 200 }]);
    expect(await subscriptionOf(store, scope, subscription)).toMatchObject({
      state: 'delivered',
      attempts: 1,
    });
    expect(r.requests).toHaveLength(1);
    expect(logger.lines.map((line) => line.message)).not.toContain(
      'completion report was stale: the lease had run out',
    );
  });

  it('is logged when a report fails until stop, and the try is made again when its lease runs out', async () => {
    const r = await receiver((res) => res.end());
    let down = true;
    const logger = captureLogger();
    const s = sender({
      destinations: destinations({ billing: r }),
      logger,
      store: reportingWith((report) =>
        down ? Promise.reject(new Error('database down')) : store.reportDelivery(report),
      ),
    });
    const subscription = await dueDelivery('billing');

    const pass = s.runOnce();
    // The report is retried within the lease; a stop gives it up (as a crash would).
    await vi.waitFor(() => expect(logger.lines.some((l) => l.level === 'warn')).toBe(true), WAIT);
    await s.stop();
    expect((await pass).records).toMatchObject([{ outcome: 'unreported', status: 200 }]);
    expect(logger.lines).toContainEqual(
      expect.objectContaining({
        level: 'error',
        fields: expect.objectContaining({ outcome: 'unreported' }),
      }),
    );
    expect((await subscriptionOf(store, scope, subscription)).state).toBe('delivering');

    down = false;
    store.advance(COMPLETION_LEASE_MS + 1);
    const again = sender({ destinations: destinations({ billing: r }) });
    expect((await again.runOnce()).records).toMatchObject([{ outcome: 'delivered', attempt: 2 }]);
    // At least once: the receiver saw the event twice and dedupes by webhook id.
    expect(r.requests.map((request) => request.headers['webhook-id'])).toEqual([
      subscription.event_id,
      subscription.event_id,
    ]);
  });
});
