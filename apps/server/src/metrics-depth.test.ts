import type { QueueDepth } from '@ledgence/store-postgres';
import { describe, expect, it } from 'vitest';
import { createServerMetrics, foldQueueDepths, sharedRead } from './metrics.js';

/** The `ledgence_queue_depth` samples of a rendered scrape. */
function depthSamples(text: string): { queue: string; state: string; value: number }[] {
  const out: { queue: string; state: string; value: number }[] = [];
  for (const line of text.split('\n')) {
    const m = /^ledgence_queue_depth\{queue="((?:[^"\\]|\\.)*)",state="(\w+)"\} (\S+)$/.exec(line);
    if (m) out.push({ queue: m[1] as string, state: m[2] as string, value: Number(m[3]) });
  }
  return out;
}

describe('the queue depth gauge', () => {
  it('a queue that is itself named _other neither collides with nor hides the folded sum', async () => {
    // Three queues, two labels allowed: one queue is folded. The deepest queue happens to be
    // named `_other` (any tenant may name a queue so: it is a valid name).
    const rows: QueueDepth[] = [
      { queue: '_other', state: 'queued', count: 10 },
      { queue: 'email', state: 'queued', count: 5 },
      { queue: null, state: 'queued', count: 1 },
    ];
    const folded = foldQueueDepths(rows, 2);
    const keys = folded.map((r) => `${r.queue}/${r.state}`);
    // Each (queue, state) series appears once…
    expect(new Set(keys).size).toBe(keys.length);
    // …and the gauge's series together count every non-terminal task exactly once.
    const metrics = createServerMetrics({
      queueDepths: async () => rows,
      maxQueues: 2,
      defaultMetrics: false,
    });
    const samples = depthSamples(await metrics.render());
    const queued = samples.filter((s) => s.state === 'queued').reduce((a, s) => a + s.value, 0);
    expect(queued).toBe(16);
  });
});

describe('concurrent scrapes', () => {
  it('share one read in flight, each showing exactly what it read; a later scrape reads again', async () => {
    const pending: ((rows: QueueDepth[]) => void)[] = [];
    const metrics = createServerMetrics({
      queueDepths: () => new Promise<QueueDepth[]>((resolve) => pending.push(resolve)),
      defaultMetrics: false,
      readReuseMs: 0,
    });
    // Two scrapers (e.g. an HA pair of Prometheus servers) hit /metrics at the same moment.
    const first = metrics.render();
    const second = metrics.render();
    await new Promise((r) => setTimeout(r, 10));
    expect(pending).toHaveLength(1);
    pending[0]?.([
      { queue: 'email', state: 'queued', count: 5 },
      { queue: 'email', state: 'active', count: 1 },
    ]);
    const email = [
      { queue: 'email', state: 'queued', value: 5 },
      { queue: 'email', state: 'active', value: 1 },
    ];
    expect(depthSamples(await first)).toEqual(email);
    expect(depthSamples(await second)).toEqual(email);
    // Read done: the next scrape reads afresh, and shows only what it read (the queue drained).
    const third = metrics.render();
    await new Promise((r) => setTimeout(r, 10));
    expect(pending).toHaveLength(2);
    pending[1]?.([]);
    expect(depthSamples(await third)).toEqual([]);
  });

  it('a storm of scrapes reads the depths once per reuse period', async () => {
    let reads = 0;
    let now = 0;
    const read = sharedRead(
      async () => {
        reads += 1;
        return reads;
      },
      1_000,
      () => now,
    );
    expect(await Promise.all([read(), read(), read()])).toEqual([1, 1, 1]);
    now = 999;
    expect(await read()).toBe(1);
    now = 1_000;
    expect(await read()).toBe(2);
    expect(reads).toBe(2);
  });

  it('a failed read is shared by the scrapes waiting on it, and not reused', async () => {
    let calls = 0;
    const read = sharedRead(async () => {
      calls += 1;
      if (calls === 1) throw new Error('database down');
      return 'ok';
    }, 60_000);
    const outcomes = await Promise.allSettled([read(), read()]);
    expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected']);
    expect(await read()).toBe('ok');
    expect(calls).toBe(2);
  });

  it('a read with no answer (a pool connection gone silent) does not hold the scrape: it renders after readTimeoutMs without the depth, counting the failure, and a later scrape waits on the same read', async () => {
    let reads = 0;
    const metrics = createServerMetrics({
      // Never answers, as a read on a silent connection within the store's 60 s wire timeout.
      queueDepths: () => {
        reads += 1;
        return new Promise<QueueDepth[]>(() => {});
      },
      dueBacklog: () => new Promise<number>(() => {}),
      defaultMetrics: false,
      readTimeoutMs: 50,
    });
    // Renders at all: without a bound, a read that never answers would hold it forever.
    const text = await metrics.render();
    const value = (name: string) =>
      text
        .split('\n')
        .find((line) => line.startsWith(`${name} `))
        ?.split(' ')[1];
    expect({
      depth: depthSamples(text),
      depthErrors: value('ledgence_queue_depth_errors_total'),
      backlog: value('ledgence_callback_due_backlog'),
      backlogErrors: value('ledgence_callback_backlog_errors_total'),
      // prom-client writes NaN as `Nan` (Prometheus reads it in any case).
    }).toEqual({ depth: [], depthErrors: '1', backlog: 'Nan', backlogErrors: '1' });
    const again = await metrics.render();
    expect(again).toContain('ledgence_queue_depth_errors_total 2');
    // The read in flight is waited on again, not started again: a silent database is asked once.
    expect(reads).toBe(1);
  });
});
