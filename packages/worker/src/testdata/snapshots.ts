/** Replies of a stand-in server for the Client's wire tests. */

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

/** The status of the queued task `tsk_1` (program `p` on queue `q`), as a status read answers it. */
export const queuedStatus = {
  task_id: 'tsk_1',
  run_id: 'run_1',
  queue: 'q',
  program: { name: 'p' },
  state: 'queued',
  submitted_at: 1,
  available_at: 1,
  terminal_at: null,
  attempt_count: 0,
  max_attempts: 3,
  cancel_requested_at: null,
};

/** The body of the server's `unavailable` problem (503), as it words it. */
export const unavailableProblem = JSON.stringify({
  type: 'https://ledgence.dev/problems/unavailable',
  title: 'Service unavailable',
  status: 503,
  code: 'unavailable',
  detail: 'The service is temporarily unavailable; retry later.',
});
