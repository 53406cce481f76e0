import { randomBytes } from 'node:crypto';

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
  const bytes = randomBytes(16);
  const ms = Date.now();
  bytes.writeUIntBE(ms, 0, 6);
  bytes[6] = 0x70 | ((bytes[6] ?? 0) & 0x0f);
  bytes[8] = 0x80 | ((bytes[8] ?? 0) & 0x3f);
  return `${PREFIX[kind]}_${bytes.toString('hex')}`;
}
