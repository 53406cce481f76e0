/**
 * Retention as pure rules (seed: `RetentionPolicy`): a namespace keeps a
 * terminal task for its policy's length after the task became terminal and
 * after its latest callback activity, whichever is later; a callback still
 * pending protects the task whatever its age. Stores select and delete with
 * these rules in bounded transactions.
 */
import type { RetentionPolicy, Timestamp } from '@ledgence/contracts';
import { isTerminalState } from './completion.js';
import type { RetentionPolicyRow, SubscriptionRow, TaskRow } from './rows.js';

/** The policy a namespace has: its own row, or the server default. */
export function retentionPolicyView(
  row: RetentionPolicyRow | undefined,
  defaultRetentionMs: number,
): RetentionPolicy {
  if (row === undefined) return { retention_ms: defaultRetentionMs, source: 'default' };
  return { retention_ms: row.retention_ms, source: 'namespace', updated_at: row.updated_at };
}

/**
 * Records older than the cutoff (strictly) are retired: `now − retention_ms`, or the namespace's
 * retiring floor when that is later (see {@link retiringFloor}).
 */
export function retentionCutoff(
  now: Timestamp,
  retentionMs: number,
  retiringBefore: Timestamp | null = null,
): Timestamp {
  const cutoff = now - retentionMs;
  return retiringBefore !== null && retiringBefore > cutoff ? retiringBefore : cutoff;
}

/**
 * The retiring floor a namespace keeps when its policy is set at `now` (seed `RetentionPolicy`:
 * "Existing retiring records continue physical collection under any later policy"): whatever
 * the policy in force until now had already retired — older than its cutoff, or than the floor
 * before it — stays collectable, however long the new policy is.
 */
export function retiringFloor(
  now: Timestamp,
  previousRetentionMs: number,
  previousFloor: Timestamp | null,
): Timestamp {
  return retentionCutoff(now, previousRetentionMs, previousFloor);
}

/**
 * Whether a subscription protects its task from collection at `cutoff`: its
 * delivery is not finished (waiting, due or delivering), or it finished at or
 * after the cutoff (the latest terminal callback activity is still young).
 */
export function subscriptionProtects(row: SubscriptionRow, cutoff: Timestamp): boolean {
  if (row.state !== 'delivered' && row.state !== 'exhausted') return true;
  return row.finished_at === null || row.finished_at >= cutoff;
}

/** Whether a task is an age candidate at `cutoff`: terminal before it. */
export function retentionCandidate(task: TaskRow, cutoff: Timestamp): boolean {
  return isTerminalState(task.state) && task.terminal_at !== null && task.terminal_at < cutoff;
}

/** Whether a task is collected at `cutoff`: an age candidate that no subscription protects. */
export function retired(
  task: TaskRow,
  subscriptions: readonly SubscriptionRow[],
  cutoff: Timestamp,
): boolean {
  return (
    retentionCandidate(task, cutoff) && !subscriptions.some((s) => subscriptionProtects(s, cutoff))
  );
}
