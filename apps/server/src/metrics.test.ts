import { ContractError, type RecoveryProgress, type RetentionProgress } from '@ledgence/contracts';
import { createTaskService } from '@ledgence/core';
import {
  acquireCommand,
  createMemoryTaskStore,
  freshScope,
  openSessionCommand,
  settleSuccess,
  submitCommand,
} from '@ledgence/core/testing';
import type { QueueDepth } from '@ledgence/store-postgres';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import {
  createServerMetrics,
  DUE_BACKLOG_CAP,
  foldQueueDepths,
  LEFT,
  OTHER_QUEUE,
  type ServerMetrics,
  statusClass,
} from './metrics.js';

/** One sample of the Prometheus text format (0.0.4). */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*';
const LABEL = `([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\\\\n]|\\\\[\\\\"n])*)"`;
const SAMPLE = new RegExp(`^(${NAME})(?:\\{((?:${LABEL},?)*)\\})? (\\S+)$`);
// Prometheus reads values with Go's ParseFloat, which takes `NaN`/`Inf` in any case: prom-client
// writes `Nan` for an event loop histogram that has no sample yet.
const VALUE = /^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?|[+-]?inf|nan)$/i;

/**
 * A strict reader of the Prometheus text format: every line is a `# HELP`, a `# TYPE` (once
 * per family, before its samples) or a sample of a declared family with a valid value.
 */
function parsePrometheus(text: string): Sample[] {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '') continue;
    const meta = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
    if (meta !== null) {
      const [, kind, name, rest] = meta as unknown as [string, string, string, string];
      expect(name).toMatch(new RegExp(`^${NAME}$`));
      if (kind === 'TYPE') {
        expect(types.has(name), `TYPE of ${name} twice`).toBe(false);
        expect(['counter', 'gauge', 'histogram', 'summary', 'untyped']).toContain(rest);
        types.set(name, rest);
      }
      continue;
    }
    const match = SAMPLE.exec(line);
    expect(match, `not a sample line: ${line}`).not.toBeNull();
    const [, name, labelText = '', , , value] = match as unknown as string[];
    expect(value, line).toMatch(VALUE);
    const family = (name as string).replace(/_(bucket|sum|count|total|created)$/, '');
    expect(types.has(name as string) || types.has(family), `undeclared ${name}`).toBe(true);
    const labels: Record<string, string> = {};
    for (const [, key, raw] of labelText.matchAll(new RegExp(LABEL, 'g'))) {
      labels[key as string] = (raw as string).replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    samples.push({ name: name as string, labels, value: Number(value) });
  }
  return samples;
}

async function samplesOf(metrics: ServerMetrics, name: string): Promise<Sample[]> {
  return parsePrometheus(await metrics.render()).filter((s) => s.name === name);
}

async function sampleValue(
  metrics: ServerMetrics,
  name: string,
  labels: Record<string, string> = {},
): Promise<number | undefined> {
  const found = (await samplesOf(metrics, name)).find((s) =>
    Object.entries(labels).every(([key, value]) => s.labels[key] === value),
  );
  return found?.value;
}

describe('HTTP durations', () => {
  it('observe by route pattern, bounded method and status class', async () => {
    const metrics = createServerMetrics({ defaultMetrics: false });
    const route = '/v1/tenants/:tenant_id/namespaces/:namespace/tasks';
    metrics.observeHttp({ route, method: 'POST', status: 201, durationMs: 12 });
    metrics.observeHttp({ route, method: 'POST', status: 409, durationMs: 3 });
    metrics.observeHttp({ route: null, method: 'PROPFIND', status: 404, durationMs: 1 });
    const name = 'ledgence_http_request_duration_seconds_count';
    expect(await sampleValue(metrics, name, { route, method: 'POST', status_class: '2xx' })).toBe(
      1,
    );
    expect(await sampleValue(metrics, name, { route, method: 'POST', status_class: '4xx' })).toBe(
      1,
    );
    expect(
      await sampleValue(metrics, name, {
        route: 'unmatched',
        method: 'other',
        status_class: '4xx',
      }),
    ).toBe(1);
    const sum = await sampleValue(metrics, 'ledgence_http_request_duration_seconds_sum', {
      status_class: '2xx',
    });
    expect(sum).toBeCloseTo(0.012, 6);
    // A 12 ms request lands in the 25 ms bucket, not the 10 ms one.
    const bucket = (le: string) =>
      sampleValue(metrics, 'ledgence_http_request_duration_seconds_bucket', {
        status_class: '2xx',
        le,
      });
    expect(await bucket('0.01')).toBe(0);
    expect(await bucket('0.025')).toBe(1);
  });

  it('status classes', () => {
    expect([200, 204, 301, 404, 413, 503, 42].map(statusClass)).toEqual([
      '2xx',
      '2xx',
      '3xx',
      '4xx',
      '4xx',
      '5xx',
      'other',
    ]);
  });
});

describe('the instrumented service', () => {
  function setup() {
    const metrics = createServerMetrics({ defaultMetrics: false });
    const store = createMemoryTaskStore();
    const service = metrics.instrumentService(createTaskService({ store, rescanIntervalMs: 5 }));
    return { metrics, service, scope: freshScope() };
  }

  it('counts acquire dispositions and times the waits, long polls apart', async () => {
    const { metrics, service, scope } = setup();
    const session = await service.openSession(openSessionCommand(scope, { concurrency: 2 }));
    expect((await service.acquire(acquireCommand(session, 0, 1))).disposition).toBe('empty');
    await service.submit(submitCommand(scope));
    const assigned = await service.acquire(acquireCommand(session, 0, 2), { waitMs: 1_000 });
    expect(assigned.disposition).toBe('assigned');
    const parked = performance.now();
    const batch = await service.acquireBatch([acquireCommand(session, 1, 1)], { waitMs: 60 });
    expect(batch.map((r) => r.ok && r.value.disposition)).toEqual(['empty']);
    expect(performance.now() - parked).toBeGreaterThanOrEqual(50);
    await expect(
      service.acquire({ ...acquireCommand(session, 0, 3), worker_session_id: 'ses_nope' }),
    ).rejects.toThrow(ContractError);

    const outcomes = 'ledgence_acquire_outcomes_total';
    expect(await sampleValue(metrics, outcomes, { disposition: 'empty', code: 'none' })).toBe(2);
    expect(await sampleValue(metrics, outcomes, { disposition: 'assigned', code: 'none' })).toBe(1);
    const rejected = (await samplesOf(metrics, outcomes)).filter(
      (s) => s.labels.disposition === 'rejected',
    );
    expect(rejected).toHaveLength(1);
    expect(rejected[0]?.labels.code).toMatch(/^session_/);

    const waits = 'ledgence_acquire_wait_seconds_count';
    expect(await sampleValue(metrics, waits, { outcome: 'empty', long_poll: 'false' })).toBe(1);
    expect(await sampleValue(metrics, waits, { outcome: 'assigned', long_poll: 'true' })).toBe(1);
    expect(await sampleValue(metrics, waits, { outcome: 'empty', long_poll: 'true' })).toBe(1);
    expect(await sampleValue(metrics, waits, { outcome: 'rejected', long_poll: 'false' })).toBe(1);
    const parkedSum = await sampleValue(metrics, 'ledgence_acquire_wait_seconds_sum', {
      outcome: 'empty',
      long_poll: 'true',
    });
    expect(parkedSum).toBeGreaterThanOrEqual(0.05);
  });

  it('a parked poll or poll batch whose client leaves is answered to no one: no outcome counted (not empty, not the unavailable of its unrun polls), its wait timed as left', async () => {
    const { metrics, service, scope } = setup();
    const session = await service.openSession(openSessionCommand(scope, { concurrency: 2 }));
    const leaving = async <T>(call: (signal: AbortSignal) => Promise<T>): Promise<T> => {
      const client = new AbortController();
      setTimeout(() => client.abort(), 30);
      return call(client.signal);
    };
    const single = await leaving((signal) =>
      service.acquire(acquireCommand(session, 0, 1), { waitMs: 5_000, signal }),
    );
    // A slot polled twice: its second poll is never run, and carries `unavailable`.
    const batch = await leaving((signal) =>
      service.acquireBatch([acquireCommand(session, 1, 1), acquireCommand(session, 1, 2)], {
        waitMs: 5_000,
        signal,
      }),
    );
    expect({
      single: single.disposition,
      batch: batch.map((r) => (r.ok ? r.value.disposition : r.error.code)),
      outcomes: await samplesOf(metrics, 'ledgence_acquire_outcomes_total'),
      left: await sampleValue(metrics, 'ledgence_acquire_wait_seconds_count', {
        outcome: LEFT,
        long_poll: 'true',
      }),
    }).toEqual({ single: 'empty', batch: ['empty', 'unavailable'], outcomes: [], left: 2 });
  });

  it('counts settlements: accepted, replayed and rejected by code, with the task state', async () => {
    const { metrics, service, scope } = setup();
    await service.submit(submitCommand(scope));
    await service.submit(submitCommand(scope));
    const session = await service.openSession(openSessionCommand(scope));
    const first = await service.acquire(acquireCommand(session, 0, 1));
    const second = await service.acquire(acquireCommand(session, 1, 1));
    if (first.disposition !== 'assigned' || second.disposition !== 'assigned') {
      throw new Error('expected two assignments');
    }
    const settle = settleSuccess(first.assignment, { n: 1 }, { operation_id: 'op-1' });
    await service.settle(settle);
    await service.settle(settle); // replay
    // The same operation with another report: a conflict.
    await expect(
      service.settle(settleSuccess(first.assignment, { n: 2 }, { operation_id: 'op-1' })),
    ).rejects.toThrow(ContractError);
    const results = await service.settleBatch([
      settleSuccess(second.assignment, { n: 3 }),
      { ...settleSuccess(second.assignment), owner: { ...settle.owner, attempt_id: 'att_x' } },
    ]);
    expect(results.map((r) => r.ok)).toEqual([true, false]);

    const name = 'ledgence_settle_outcomes_total';
    const labels = (outcome: string, code: string, task_state: string) => ({
      outcome,
      code,
      task_state,
    });
    expect(await sampleValue(metrics, name, labels('accepted', 'none', 'succeeded'))).toBe(2);
    expect(await sampleValue(metrics, name, labels('replayed', 'none', 'succeeded'))).toBe(1);
    const rejected = (await samplesOf(metrics, name)).filter(
      (s) => s.labels.outcome === 'rejected',
    );
    expect(rejected.reduce((n, s) => n + s.value, 0)).toBe(2);
    expect(rejected.every((s) => s.labels.task_state === 'none')).toBe(true);
    expect(await sampleValue(metrics, name, labels('rejected', 'conflict', 'none'))).toBe(1);
  });

  it('counts a batch refused as a whole once per item, and delegates the rest', async () => {
    const metrics = createServerMetrics({ defaultMetrics: false });
    const { service } = (() => {
      const store = createMemoryTaskStore();
      return { service: createTaskService({ store }) };
    })();
    const failing = metrics.instrumentService({
      ...service,
      settleBatch: async () => {
        throw new Error('backend down');
      },
    });
    const scope = freshScope();
    // Methods that are not wrapped still reach the service.
    const submitted = await failing.submit(submitCommand(scope));
    expect(submitted.created).toBe(true);
    const session = await failing.openSession(openSessionCommand(scope));
    const reply = await failing.acquire(acquireCommand(session, 0, 1));
    if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
    const command = settleSuccess(reply.assignment);
    await expect(failing.settleBatch([command, command])).rejects.toThrow('backend down');
    expect(
      await sampleValue(metrics, 'ledgence_settle_outcomes_total', { code: 'unavailable' }),
    ).toBe(2);
  });
});

describe('lease expiries', () => {
  it('count each recovery outcome; finalized cleanups apart', async () => {
    const metrics = createServerMetrics({ defaultMetrics: false });
    const pass = (p: Partial<RecoveryProgress>): RecoveryProgress => ({
      scanned: 0,
      recovered: 0,
      requeued: 0,
      failed: 0,
      cancelled: 0,
      finalized: 0,
      has_more: false,
      ...p,
    });
    expect(
      await sampleValue(metrics, 'ledgence_lease_expiries_total', { outcome: 'requeued' }),
    ).toBe(0);
    metrics.recordRecovery(
      pass({ scanned: 5, recovered: 4, requeued: 2, failed: 1, cancelled: 1 }),
    );
    metrics.recordRecovery(pass({ scanned: 3, recovered: 1, requeued: 1, finalized: 2 }));
    const name = 'ledgence_lease_expiries_total';
    expect(await sampleValue(metrics, name, { outcome: 'requeued' })).toBe(3);
    expect(await sampleValue(metrics, name, { outcome: 'failed' })).toBe(1);
    expect(await sampleValue(metrics, name, { outcome: 'cancelled' })).toBe(1);
    expect(await sampleValue(metrics, 'ledgence_lease_cleanup_finalized_total')).toBe(2);
  });
});

describe('completion deliveries', () => {
  it('count tries by bounded outcome and time the POSTs', async () => {
    const metrics = createServerMetrics({ defaultMetrics: false });
    const name = 'ledgence_callback_deliveries_total';
    const destination = 'billing';
    metrics.recordDelivery({ outcome: 'delivered', destination, durationMs: 12 });
    metrics.recordDelivery({ outcome: 'retry', destination, durationMs: 2_000 });
    metrics.recordDelivery({ outcome: 'retry', destination, durationMs: 30 });
    metrics.recordDelivery({ outcome: 'retry', destination: 'audit', durationMs: 1 });
    metrics.recordDelivery({ outcome: 'https://evil.example/', destination, durationMs: 1 });
    // A try that failed before any POST (an unconfigured alias) is counted, and not timed.
    metrics.recordDelivery({ outcome: 'retry', destination, durationMs: 500, posted: false });
    expect(await sampleValue(metrics, name, { destination, outcome: 'delivered' })).toBe(1);
    expect(await sampleValue(metrics, name, { destination, outcome: 'retry' })).toBe(3);
    expect(await sampleValue(metrics, name, { destination: 'audit', outcome: 'retry' })).toBe(1);
    expect(await sampleValue(metrics, name, { destination, outcome: 'other' })).toBe(1);
    expect(
      await sampleValue(metrics, 'ledgence_callback_delivery_duration_seconds_count', {
        outcome: 'retry',
      }),
    ).toBe(3);
    expect(
      await sampleValue(metrics, 'ledgence_callback_delivery_duration_seconds_sum', {
        outcome: 'retry',
      }),
    ).toBeCloseTo(2.031);
  });

  it('reads the due backlog on scrape, capped, and survives a failed read', async () => {
    const asked: number[] = [];
    let fail = false;
    const metrics = createServerMetrics({
      defaultMetrics: false,
      logger: pino({ level: 'silent' }),
      readReuseMs: 0, // every scrape reads
      dueBacklog: async (limit) => {
        asked.push(limit);
        if (fail) throw new Error('database down');
        return 42;
      },
    });
    expect(await sampleValue(metrics, 'ledgence_callback_due_backlog')).toBe(42);
    expect(asked).toEqual([DUE_BACKLOG_CAP]);
    fail = true;
    // One scrape shows both the unknown backlog and the failed read it counts.
    const samples = parsePrometheus(await metrics.render());
    expect(samples.find((s) => s.name === 'ledgence_callback_due_backlog')?.value).toBeNaN();
    expect(samples.find((s) => s.name === 'ledgence_callback_backlog_errors_total')?.value).toBe(1);
  });
});

describe('retention', () => {
  it('counts removals by kind and transactions', async () => {
    const metrics = createServerMetrics({ defaultMetrics: false });
    const progress: RetentionProgress = {
      cutoff: 1,
      tasks_removed: 3,
      attempts_removed: 4,
      history_removed: 12,
      subscriptions_removed: 1,
      sessions_removed: 0,
      has_more: false,
    };
    metrics.recordRetention(progress);
    metrics.recordRetention({ ...progress, tasks_removed: 2, sessions_removed: 5 });
    const name = 'ledgence_retention_removed_total';
    expect(await sampleValue(metrics, name, { kind: 'tasks' })).toBe(5);
    expect(await sampleValue(metrics, name, { kind: 'history' })).toBe(24);
    expect(await sampleValue(metrics, name, { kind: 'sessions' })).toBe(5);
    expect(await sampleValue(metrics, 'ledgence_retention_transactions_total')).toBe(2);
  });
});

describe('queue depth', () => {
  const queues = (n: number): QueueDepth[] =>
    Array.from({ length: n }, (_, i) => [
      { queue: `q${String(i).padStart(3, '0')}`, state: 'queued' as const, count: 1000 - i },
      { queue: `q${String(i).padStart(3, '0')}`, state: 'active' as const, count: 1 },
    ]).flat();

  it('keeps the deepest queues and folds the rest into _other', () => {
    const folded = foldQueueDepths(
      [
        { queue: 'small', state: 'queued', count: 1 },
        { queue: 'big', state: 'queued', count: 10 },
        { queue: 'busy', state: 'active', count: 7 },
        { queue: 'tie-b', state: 'queued', count: 2 },
        { queue: 'tie-a', state: 'queued', count: 2 },
        { queue: null, state: 'active', count: 4 },
      ],
      3,
    );
    expect(folded).toEqual([
      { queue: 'big', state: 'queued', count: 10 },
      { queue: 'big', state: 'active', count: 0 },
      { queue: 'busy', state: 'queued', count: 0 },
      { queue: 'busy', state: 'active', count: 7 },
      { queue: 'tie-a', state: 'queued', count: 2 },
      { queue: 'tie-a', state: 'active', count: 0 },
      { queue: OTHER_QUEUE, state: 'queued', count: 3 },
      { queue: OTHER_QUEUE, state: 'active', count: 4 },
    ]);
    expect(foldQueueDepths([{ queue: 'a', state: 'queued', count: 1 }], 3)).toHaveLength(2);
  });

  it('is read on scrape with at most N queue label values (> N queues fold)', async () => {
    let reads = 0;
    let limitAsked = 0;
    let rows = queues(70);
    const metrics = createServerMetrics({
      defaultMetrics: false,
      maxQueues: 50,
      readReuseMs: 0, // every scrape reads
      queueDepths: async (limit) => {
        reads += 1;
        limitAsked = limit;
        return rows;
      },
    });
    const samples = await samplesOf(metrics, 'ledgence_queue_depth');
    expect(reads).toBe(1);
    expect(limitAsked).toBe(50);
    const labels = new Set(samples.map((s) => s.labels.queue));
    expect(labels.size).toBe(51);
    expect(labels.has('q049')).toBe(true);
    expect(labels.has('q050')).toBe(false);
    const other = (state: string) =>
      samples.find((s) => s.labels.queue === OTHER_QUEUE && s.labels.state === state)?.value;
    // Queues 50..69 hold 1000-50 .. 1000-69 queued tasks and one active task each.
    expect(other('queued')).toBe(
      Array.from({ length: 20 }, (_, i) => 950 - i).reduce((a, b) => a + b),
    );
    expect(other('active')).toBe(20);
    const total = samples.reduce((n, s) => n + s.value, 0);
    expect(total).toBe(rows.reduce((n, r) => n + r.count, 0));

    // A drained queue disappears at the next scrape instead of reporting a stale count.
    rows = [{ queue: 'only', state: 'queued', count: 2 }];
    const next = await samplesOf(metrics, 'ledgence_queue_depth');
    expect(next.map((s) => [s.labels.queue, s.labels.state, s.value])).toEqual([
      ['only', 'queued', 2],
      ['only', 'active', 0],
    ]);
  });

  it('a failed read is counted and logged; the other metrics still render', async () => {
    const lines: string[] = [];
    const metrics = createServerMetrics({
      defaultMetrics: false,
      logger: pino({ level: 'warn' }, { write: (line: string) => lines.push(line) }),
      queueDepths: async () => {
        throw new Error('database down');
      },
    });
    metrics.observeHttp({ route: '/healthz', method: 'GET', status: 200, durationMs: 1 });
    const text = await metrics.render();
    const samples = parsePrometheus(text);
    expect(samples.filter((s) => s.name === 'ledgence_queue_depth')).toEqual([]);
    expect(samples.some((s) => s.name === 'ledgence_http_request_duration_seconds_count')).toBe(
      true,
    );
    expect(lines.some((line) => line.includes('queue depth read failed'))).toBe(true);
    // The scrape whose read failed counts it: an alert sees the failure when it happens.
    expect(samples.find((s) => s.name === 'ledgence_queue_depth_errors_total')?.value).toBe(1);
  });
});

describe('the exposition', () => {
  it('parses as Prometheus text, default process metrics included, in a private registry', async () => {
    const metrics = createServerMetrics({
      queueDepths: async () => [{ queue: 'q "quoted"\\', state: 'queued', count: 1 }],
    });
    metrics.observeHttp({ route: '/healthz', method: 'GET', status: 200, durationMs: 2 });
    expect(metrics.contentType).toMatch(/^text\/plain; version=0\.0\.4/);
    const samples = parsePrometheus(await metrics.render());
    const names = new Set(samples.map((s) => s.name));
    for (const name of [
      'process_cpu_user_seconds_total',
      'nodejs_heap_size_used_bytes',
      'ledgence_http_request_duration_seconds_bucket',
      'ledgence_lease_expiries_total',
      'ledgence_queue_depth',
    ]) {
      expect(names, name).toContain(name);
    }
    // Label values are escaped, and read back as they were.
    expect(samples.find((s) => s.name === 'ledgence_queue_depth')?.labels.queue).toBe(
      'q "quoted"\\',
    );
    // Two instances do not share counts (nor clash on registration).
    const again = createServerMetrics();
    expect(
      await sampleValue(again, 'ledgence_http_request_duration_seconds_count'),
    ).toBeUndefined();
  });
});
