import type { QueueDepth } from '@ledgence/store-postgres';
import { describe, expect, it } from 'vitest';
import { createServerMetrics, foldQueueDepths } from './metrics.js';

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
  it('a scrape shows only the depths it read, even while another scrape is in flight', async () => {
    const pending: ((rows: QueueDepth[]) => void)[] = [];
    const metrics = createServerMetrics({
      queueDepths: () => new Promise<QueueDepth[]>((resolve) => pending.push(resolve)),
      defaultMetrics: false,
    });
    // Two scrapers (e.g. an HA pair of Prometheus servers) hit /metrics at the same moment.
    const first = metrics.render();
    const second = metrics.render();
    await new Promise((r) => setTimeout(r, 10));
    expect(pending).toHaveLength(2);
    // The first read still sees the queue `email`; by the second read it has drained.
    pending[0]?.([
      { queue: 'email', state: 'queued', count: 5 },
      { queue: 'email', state: 'active', count: 1 },
    ]);
    const a = depthSamples(await first);
    expect(a.find((s) => s.queue === 'email' && s.state === 'queued')?.value).toBe(5);
    pending[1]?.([]);
    const b = depthSamples(await second);
    // The second scrape read an empty backlog: it must not report the first read's queue.
    expect(b).toEqual([]);
  });
});
