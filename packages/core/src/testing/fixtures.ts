/**
 * Small builders for the commands a test sends to a `TaskStore`, so suites
 * (the conformance suite, the HTTP layer's tests) spell a scenario in one
 * line and a change of wire shape is fixed here once.
 */
import { randomUUID } from 'node:crypto';
import {
  type AcquireCommand,
  type ApplicationError,
  type Assignment,
  type ExecutionFailure,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  type LeaseOwner,
  MAX_LABELS,
  type OpenSessionCommand,
  type Quiescence,
  type RenewCommand,
  type RenewIntent,
  type Scope,
  type SettleCommand,
  type SubmitCommand,
  type SubmitTask,
  taskStatusMaxBytes,
  type WorkerSession,
} from '@ledgence/contracts';

/** The namespace every {@link freshScope} uses; the tenant is what keeps tests apart. */
export const TEST_NAMESPACE = 'conformance';

/** The queue the fixtures submit to and open sessions on unless told otherwise. */
export const TEST_QUEUE = 'default';

/**
 * A scope no other test uses: a random tenant id, so tests sharing one store
 * never see each other's tasks, sessions or listings.
 */
export function freshScope(namespace: string = TEST_NAMESPACE): Scope {
  return { tenant_id: `t_${randomUUID()}`, namespace };
}

/**
 * A submit command in `scope` on {@link TEST_QUEUE} with a random idempotency
 * key, program `echo` and small data; `overrides` replace any `input` field,
 * and `idempotency_key` / `origin_trace` may be given alongside them.
 *
 * @example submitCommand(scope, { priority: 10, retry: { max_attempts: 1, delay_ms: 0 } })
 */
export function submitCommand(
  scope: Scope,
  overrides: Partial<Omit<SubmitTask, 'tenant_id' | 'namespace'>> & {
    idempotency_key?: string;
    origin_trace?: SubmitCommand['origin_trace'];
  } = {},
): SubmitCommand {
  const { idempotency_key, origin_trace, ...input } = overrides;
  const command: SubmitCommand = {
    idempotency_key: idempotency_key ?? `key_${randomUUID()}`,
    input: {
      tenant_id: scope.tenant_id,
      namespace: scope.namespace,
      queue: TEST_QUEUE,
      program: { name: 'echo' },
      data: { hello: 'world' },
      ...input,
    },
  };
  if (origin_trace !== undefined) command.origin_trace = origin_trace;
  return command;
}

/**
 * A {@link submitCommand} whose task's status at its largest (`taskStatusMaxBytes`) encodes to
 * exactly `statusBytes`, for tests at TASK_STATUS_MAX_BYTES: MAX_LABELS labels with keys and
 * values of the longest length allowed, and as many of the value characters `"` (two bytes once
 * JSON-escaped, one byte more than the `v` it replaces) as reaching `statusBytes` takes.
 * `overrides` are as for {@link submitCommand}, `labels` excepted.
 *
 * @throws RangeError when `statusBytes` is out of the range those labels can reach.
 * @example submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES + 1) // one byte too many
 */
export function submitCommandWithStatusBytes(
  scope: Scope,
  statusBytes: number,
  overrides: Omit<Parameters<typeof submitCommand>[1], 'labels'> = {},
): SubmitCommand {
  const keys = Array.from(
    { length: MAX_LABELS },
    (_, i) => `${String(i).padStart(2, '0')}${'k'.repeat(LABEL_KEY_MAX_BYTES - 2)}`,
  );
  const withQuotes = (quotes: number): Record<string, string> => {
    const labels: Record<string, string> = {};
    let left = quotes;
    for (const key of keys) {
      const here = Math.min(left, LABEL_VALUE_MAX_BYTES);
      labels[key] = `${'"'.repeat(here)}${'v'.repeat(LABEL_VALUE_MAX_BYTES - here)}`;
      left -= here;
    }
    return labels;
  };
  const plain = submitCommand(scope, { ...overrides, labels: withQuotes(0) });
  const quotes = statusBytes - taskStatusMaxBytes(plain.input);
  if (quotes < 0 || quotes > MAX_LABELS * LABEL_VALUE_MAX_BYTES) {
    throw new RangeError(`no labels give a status of ${statusBytes} bytes to this command`);
  }
  return { ...plain, input: { ...plain.input, labels: withQuotes(quotes) } };
}

/** An open-session command on {@link TEST_QUEUE} with `concurrency` slots (default 4). */
export function openSessionCommand(
  scope: Scope,
  overrides: Partial<Omit<OpenSessionCommand, 'scope'>> = {},
): OpenSessionCommand {
  return { scope, queue: TEST_QUEUE, concurrency: 4, ...overrides };
}

/** A poll of `consumerId` in `session` with `sequence` (on the session's own scope and queue). */
export function acquireCommand(
  session: WorkerSession,
  consumerId: number,
  sequence: number,
): AcquireCommand {
  return {
    scope: session.scope,
    queue: session.queue,
    worker_session_id: session.id,
    consumer_id: consumerId,
    sequence,
  };
}

/** The lease owner an assignment names: what every renew and settle must quote back. */
export function ownerOf(assignment: Assignment): LeaseOwner {
  return assignment.lease.owner;
}

/** A renewal of `assignment`'s lease with `sequence` and `intent` (default `keep_alive`). */
export function renewCommand(
  assignment: Assignment,
  sequence: number,
  intent: RenewIntent = 'keep_alive',
): RenewCommand {
  return { owner: ownerOf(assignment), sequence, intent };
}

/** Options shared by the settle builders. */
export interface SettleOptions {
  /** Defaults to a random id, so two builders never collide by accident. */
  operation_id?: string;
  /** Defaults to `confirmed`. */
  quiescence?: Quiescence;
}

function settle(
  assignment: Assignment,
  report: SettleCommand['report'],
  options: SettleOptions,
): SettleCommand {
  return {
    owner: ownerOf(assignment),
    operation_id: options.operation_id ?? `op_${randomUUID()}`,
    report,
    quiescence: options.quiescence ?? 'confirmed',
    processing_trace: null,
  };
}

function identityOf(assignment: Assignment): { task_id: string; attempt_id: string } {
  const owner = ownerOf(assignment);
  return { task_id: owner.task_id, attempt_id: owner.attempt_id };
}

/** A settlement reporting that the program succeeded with `output`. */
export function settleSuccess(
  assignment: Assignment,
  output: unknown = { ok: true },
  options: SettleOptions = {},
): SettleCommand {
  return settle(
    assignment,
    {
      kind: 'completed',
      report: {
        context: { identity: identityOf(assignment) },
        outcome: { kind: 'success', output },
      },
    },
    options,
  );
}

/** A settlement reporting that the program returned an application error. */
export function settleApplicationError(
  assignment: Assignment,
  error: Partial<ApplicationError> = {},
  options: SettleOptions = {},
): SettleCommand {
  return settle(
    assignment,
    {
      kind: 'completed',
      report: {
        context: { identity: identityOf(assignment) },
        outcome: {
          kind: 'application_error',
          error: { code: 'app_failed', message: 'the program failed', ...error },
        },
      },
    },
    options,
  );
}

/** A settlement reporting that the worker could not produce an outcome. */
export function settleExecutionFailure(
  assignment: Assignment,
  failure: Partial<ExecutionFailure> = {},
  options: SettleOptions = {},
): SettleCommand {
  return settle(
    assignment,
    {
      kind: 'failed',
      report: { kind: 'crashed', message: 'the worker crashed', retryable: true, ...failure },
    },
    options,
  );
}

/**
 * `value` through a JSON round trip with every object's keys in reverse order: the same
 * canonical value spelled otherwise, as a JSON column returns it or a client re-encodes it.
 * Replays compare commands canonically, so a test of that sends this.
 *
 * @example withKeysReversed({ a: 1, b: { c: 2, d: 3 } }); // { b: { d: 3, c: 2 }, a: 1 }
 */
export function withKeysReversed<T>(value: T): T {
  return JSON.parse(
    JSON.stringify(value, (_key, inner: unknown) =>
      inner !== null && typeof inner === 'object' && !Array.isArray(inner)
        ? Object.fromEntries(Object.entries(inner).reverse())
        : inner,
    ),
  ) as T;
}
