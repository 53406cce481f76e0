/**
 * Seconds before a connection reconnects after `retries` failed attempts in a row: 50 ms
 * doubling to 2 s, with jitter. postgres.js's default grows to 20 s, which after a failover
 * or a burst of terminated backends kept a store unavailable for that long once PostgreSQL was
 * back (the recovery lag the chaos suite measured), and a replica's LISTEN connection deaf to
 * every wake hint as long.
 */
export function reconnectBackoffSeconds(retries: number): number {
  return (0.5 + Math.random() / 2) * Math.min(0.05 * 2 ** retries, 2);
}
