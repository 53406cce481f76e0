import { randomUUID } from 'node:crypto';

/** The kinds of identifier the service issues, and their prefixes. */
export type IdKind = 'task' | 'run' | 'attempt' | 'lease' | 'session' | 'subscription' | 'event';

const PREFIX: Record<IdKind, string> = {
  task: 'tsk',
  run: 'run',
  attempt: 'att',
  lease: 'lse',
  session: 'ses',
  subscription: 'sub',
  event: 'evt',
};

/**
 * A new time-sortable identifier: the prefix, then a UUIDv7 as 32 lowercase
 * hex digits (48-bit millisecond time, version, 74 random bits). Ids sort by
 * creation time, which keeps B-tree inserts local; the process clock is fine
 * here because no lifecycle decision reads an id's time.
 *
 * @example newId('task') // → 'tsk_019ad1c2e3f47a1b8c9d0e1f2a3b4c5d'
 */
export function newId(kind: IdKind): string {
  // Random bits from `randomUUID` (v4, `xxxxxxxx-xxxx-4xxx-Vxxx-xxxxxxxxxxxx`; V holds the
  // variant 10): Node draws its entropy for it in blocks, where `randomBytes(16)` asks OpenSSL on
  // every call — 0.6 against 2.0 µs per id here, and a submit of 1 000 tasks takes 2 000 ids
  // (randomFillSync was ~9 % of the server's CPU in bulk submit). The 48-bit time and the
  // version nibble 7 replace the v4's first 13 hex digits; the variant digit and the 74 random
  // bits after the version are kept, as before.
  const uuid = randomUUID();
  const ms = Date.now().toString(16).padStart(12, '0');
  return `${PREFIX[kind]}_${ms}7${uuid.slice(15, 18)}${uuid.slice(19, 23)}${uuid.slice(24)}`;
}
