/**
 * The README's metrics table and the server's registry agree: every `ledgence_` metric the
 * server registers is documented with its type and labels, and every documented one exists. An
 * operator builds dashboards and alerts from that table alone.
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { createServerMetrics } from './metrics.js';

const here = dirname(fileURLToPath(import.meta.url));
const readme = readFileSync(join(here, '..', '..', '..', 'README.md'), 'utf8');

/** `name → "type: label, label"` for each row of a table whose first cell names a metric. */
function documented(): Map<string, string> {
  const rows = new Map<string, string>();
  for (const line of readme.split('\n')) {
    const [, name, type, labels] = line.split('|').map((cell) => cell.trim());
    const metric = /^`(ledgence_[a-z_]+)`$/.exec(name ?? '')?.[1];
    if (metric === undefined || type === undefined || labels === undefined) continue;
    const names = [...labels.matchAll(/`([a-z_]+)`/g)].map((m) => m[1]);
    rows.set(metric, `${type}: ${names.join(', ')}`);
  }
  return rows;
}

interface RegisteredMetric {
  name: string;
  labelNames: string[];
  get(): Promise<{ type: string }>;
}

describe('the README documents every metric', () => {
  it('with its type and labels, and documents none the server does not register', async () => {
    // Both read-on-scrape gauges registered: they exist only with their readers.
    const metrics = createServerMetrics({
      defaultMetrics: false,
      queueDepths: async () => [],
      dueBacklog: async () => 0,
    });
    const registered = new Map<string, string>();
    // prom-client's metric objects carry their label names; its MetricObject type omits them.
    for (const metric of metrics.registry.getMetricsAsArray() as unknown as RegisteredMetric[]) {
      const { type } = await metric.get();
      registered.set(metric.name, `${type}: ${metric.labelNames.join(', ')}`);
    }
    expect(registered.size).toBeGreaterThan(10);
    expect(documented()).toEqual(registered);
  });
});
