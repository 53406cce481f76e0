/**
 * The order the systems are measured in, repetition by repetition. Shapes share one PostgreSQL
 * and one machine, and what a system leaves behind right after its window (autovacuum of the rows
 * it just updated or deleted, a checkpoint's page images) lands in the next system's cluster-wide
 * WAL, write-transaction and machine-CPU readings. A plain rotation keeps the cyclic order, so the
 * same neighbour would always go before a system; here odd repetitions rotate the list and even
 * ones rotate it reversed: every system still goes first once in each `n` repetitions, and for
 * three systems six repetitions run all six orders, each system after each other one.
 *
 * @param rep - the repetition, from 1.
 */
export function systemOrder<T>(systems: readonly T[], rep: number): T[] {
  const n = systems.length;
  const base = rep % 2 === 1 ? systems : [...systems].reverse();
  const shift = (rep - 1) % Math.max(1, n);
  return base.map((_, k) => base[(k + shift) % n] as T);
}
