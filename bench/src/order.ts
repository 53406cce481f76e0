/**
 * The order the systems are measured in, repetition by repetition. Shapes share one PostgreSQL
 * and one machine, and what a system leaves behind right after its window (autovacuum of the rows
 * it just updated or deleted, a checkpoint's page images) lands in the next system's cluster-wide
 * WAL, write-transaction and machine-CPU readings. Repetition `rep` starts with system
 * `(rep - 1) mod n`, so each goes first once in every `n` repetitions and never twice in a row;
 * odd repetitions continue in the listed order and even ones in the reversed order, so the same
 * neighbour does not always go before a system: two systems alternate, and for three, six
 * repetitions run all six orders, each system after each other one. (Until 2026-12-05 an even
 * repetition reversed the list and then rotated it, which for two systems gave back the listed
 * order every time, and for three started repetitions 3 and 4 with the same system.)
 *
 * @param rep - the repetition, from 1.
 */
export function systemOrder<T>(systems: readonly T[], rep: number): T[] {
  const n = systems.length;
  const first = (rep - 1) % Math.max(1, n);
  const step = rep % 2 === 1 ? 1 : n - 1;
  return systems.map((_, k) => systems[(first + k * step) % n] as T);
}
