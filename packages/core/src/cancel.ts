import type { TaskState, Timestamp } from '@ledgence/contracts';
import { recordHistory } from './history.js';
import type { HistoryRow, TaskRow } from './rows.js';

/** What a cancel wrote (nothing for a terminal or already-cancelling task) and its reply. */
export interface CancelResult {
  /** Whether anything is to be written; false for a terminal or already-cancelling task. */
  changed: boolean;
  /** The task after the cancel. */
  task: TaskRow;
  /** The `cancelled` or `cancel_requested` record, if any. */
  history: HistoryRow[];
  /** The task's state afterwards (`{task_state}`). */
  reply: TaskState;
}

/**
 * Cancels a task (DESIGN §5 Cancel): a queued task is cancelled at once; an
 * active one gets `cancel_requested_at`, which its worker sees on the next
 * renew (it aborts and settles, or lease expiry finishes it as cancelled,
 * never retried); a terminal task answers its state and changes nothing.
 * Cancellation never attributes an earlier attempt's outcome.
 */
export function cancelTask(task: TaskRow, now: Timestamp): CancelResult {
  if (task.state === 'queued') {
    const cancelled: TaskRow = {
      ...task,
      state: 'cancelled',
      outcome: { state: 'cancelled' },
      terminal_at: now,
      cancel_requested_at: now,
    };
    const { task: next, history } = recordHistory(cancelled, now, [['cancelled', null]]);
    return { changed: true, task: next, history, reply: next.state };
  }
  if (task.state === 'active' && task.cancel_requested_at === null) {
    const requested: TaskRow = { ...task, cancel_requested_at: now };
    const { task: next, history } = recordHistory(requested, now, [
      ['cancel_requested', task.current_attempt_id],
    ]);
    return { changed: true, task: next, history, reply: next.state };
  }
  return { changed: false, task, history: [], reply: task.state };
}
