/** Replies of a stand-in server for the Client's unit tests. */

/** A submit command as the Client sends it. */
export interface SentCommand {
  idempotency_key: string;
  input: Record<string, unknown>;
}

/** The snapshot of the queued task `tsk_<n>` that `command` created, as the server answers it. */
export function queuedSnapshotOf(command: SentCommand, n: number) {
  return {
    task_id: `tsk_${n}`,
    run_id: `run_${n}`,
    idempotency_key: command.idempotency_key,
    input: command.input,
    descriptor: command.input.program,
    origin_trace: null,
    state: 'queued',
    submitted_at: 1,
    available_at: 1,
    terminal_at: null,
    current_attempt_id: null,
    attempt_count: 0,
    cancel_requested_at: null,
  };
}
