/**
 * HTTP requests a Ledgence server has answered, read from its `/metrics`: how many tasks each
 * lifecycle request carried in a drain (a wave of 32 slots in one request, or fewer).
 */

/** The histogram whose `_count` series counts every answered request (server metrics.ts). */
const COUNT_SERIES = 'ledgence_http_request_duration_seconds_count';
/** The scrape's own route, left out: reading the counts must not change them. */
const METRICS_ROUTE = '/metrics';

/**
 * Requests answered so far per `METHOD route` in a Prometheus text exposition, summed over
 * status classes; the scrapes of `/metrics` left out.
 */
export function requestCounts(text: string): Map<string, number> {
  const counts = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${COUNT_SERIES}{`)) continue;
    const labels = line.slice(COUNT_SERIES.length + 1, line.lastIndexOf('}'));
    const route = /(?:^|,)route="([^"]*)"/.exec(labels)?.[1];
    const method = /(?:^|,)method="([^"]*)"/.exec(labels)?.[1];
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (route === undefined || method === undefined || route === METRICS_ROUTE) continue;
    const key = `${method} ${route}`;
    counts.set(key, (counts.get(key) ?? 0) + value);
  }
  return counts;
}

/** The requests answered between two {@link requestCounts} readings, per route with any. */
export function requestsBetween(
  before: ReadonlyMap<string, number>,
  after: ReadonlyMap<string, number>,
): Map<string, number> {
  const between = new Map<string, number>();
  for (const [key, count] of after) {
    const added = count - (before.get(key) ?? 0);
    if (added > 0) between.set(key, added);
  }
  return between;
}

/** Requests answered so far by the server at `baseUrl`, per route (see {@link requestCounts}). */
export async function serverRequestCounts(baseUrl: string): Promise<Map<string, number>> {
  const reply = await fetch(new URL('/metrics', baseUrl));
  if (!reply.ok) throw new Error(`GET /metrics answered ${reply.status}`);
  return requestCounts(await reply.text());
}
