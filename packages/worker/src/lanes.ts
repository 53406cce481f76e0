/**
 * How a worker of many slots splits its requests. Its slots tend to move together (a poll
 * answers many, their dispatch renewals and settlements follow together), and one batch in
 * flight keeps one process busy at a time (the worker, the server or PostgreSQL) while the
 * others wait for it. A few batches in flight at once overlap them; many small ones pay the
 * per-request cost more often. Measured in the benchmark's batched drain (256 slots,
 * bench/README.md "Request lanes"): one lane 1 942 tasks/s, 2 lanes of 128 2 694, 4 of 64
 * 2 792, 8 of 32 2 146; and the strict drain's 32 slots were slower split at all.
 */

/** Slots a lane serves at least before a worker splits its requests into another lane. */
export const LANE_SLOTS = 64;

/** The most lanes a worker splits its requests into. */
export const MAX_LANES = 4;

/**
 * How many polls and settlement batches a worker of `concurrency` slots keeps in flight at
 * most: 1 up to 127 slots, then one more per 64 slots, at most {@link MAX_LANES}.
 */
export function requestLanes(concurrency: number): number {
  return Math.min(MAX_LANES, Math.max(1, Math.floor(concurrency / LANE_SLOTS)));
}

/** The most polls one acquire request carries for a worker of `concurrency` slots. */
export function laneSlots(concurrency: number): number {
  return Math.ceil(concurrency / requestLanes(concurrency));
}
