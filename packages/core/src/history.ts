import type { Timestamp, TransitionReason } from '@ledgence/contracts';
import type { HistoryRow, TaskRow } from './rows.js';

/** One event to record: why, and which attempt it concerns (if any). */
export type HistoryEntry = readonly [reason: TransitionReason, attemptId: string | null];

/**
 * Numbers `entries` after the task's last history sequence and returns the
 * rows with the task advanced past them. Called only from transitions, which
 * run under the task's row lock, so sequences are gapless and ordered.
 */
export function recordHistory(
  task: TaskRow,
  now: Timestamp,
  entries: readonly HistoryEntry[],
): { task: TaskRow; history: HistoryRow[] } {
  const history = entries.map(
    ([reason, attemptId], index): HistoryRow => ({
      tenant_id: task.tenant_id,
      namespace: task.namespace,
      task_id: task.task_id,
      sequence: task.history_sequence + index + 1,
      attempt_id: attemptId,
      at: now,
      reason,
    }),
  );
  return { task: { ...task, history_sequence: task.history_sequence + entries.length }, history };
}
