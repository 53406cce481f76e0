/**
 * Fixtures of the SDK's unit tests: the lease owner of one attempt, what a handler's report of
 * that attempt is built from, and the problems the server answers.
 */
import { ContractError, type ErrorCode, type LeaseOwner, type Problem } from '@ledgence/contracts';
import { ProblemError } from '../errors.js';

/** The lease owner of attempt `att_1` of task `t1`, in namespace `prod` of tenant `acme`. */
export const owner: LeaseOwner = {
  scope: { tenant_id: 'acme', namespace: 'prod' },
  task_id: 't1',
  attempt_id: 'att_1',
  lease_id: 'l1',
  generation: 1,
  worker_session_id: 's1',
  consumer_id: 0,
};

/** The ids of {@link owner}'s attempt, as `reportFor` takes them. */
export const identity = { taskId: owner.task_id, attemptId: owner.attempt_id };

/** When a handler of that attempt started and finished. */
export const times = { startedAt: 1, finishedAt: 2 };

/** A problem document of `code`, at its status, with placeholder type, title and detail. */
export function problemOf(code: ErrorCode): Problem {
  return {
    type: 'about:blank',
    title: code,
    status: new ContractError(code, 'x').status,
    code,
    detail: 'x',
  };
}

/** {@link problemOf} `code`, as the SDK raises it. */
export function problemErrorOf(code: ErrorCode): ProblemError {
  return new ProblemError(problemOf(code));
}
