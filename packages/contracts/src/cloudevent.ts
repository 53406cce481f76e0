/**
 * CloudEvents 1.0 helpers: the invocation event inside an assignment
 * (DESIGN §4), the compact completion event a callback destination receives
 * (DESIGN §8), their validation, and the assignment identity check of the
 * seed (`Assignment::validate_workflow_identity`).
 */
import { canonicalJson } from './canonical.js';
import { parseWith } from './decode.js';
import { ContractError } from './errors.js';
import { appendJsonPath } from './json.js';
import { COMPLETION_EVENT_MAX_BYTES } from './limits.js';
import {
  type Assignment,
  type CloudEvent,
  CloudEventSchema,
  type CompletionEvent,
  CompletionEventSchema,
  type ProgramDescriptor,
  type Scope,
  TASK_ATTEMPT_EVENT_TYPE,
  TASK_COMPLETED_EVENT_TYPE,
  type TerminalTaskState,
  type Timestamp,
  type TraceContext,
} from './schemas/index.js';
import { utf8ByteLength } from './text.js';

/** The largest time value an ECMAScript `Date` can hold (±8.64e15 ms, ECMA-262 §21.4.1.1). */
const MAX_DATE_MS = 8.64e15;

// CloudEvents 1.0 §3.1.1: lower-case ASCII letters and digits; the spec asks
// for at most 20 characters, which Ledgence enforces.
const EXTENSION_NAME = /^[a-z0-9]{1,20}$/;

/** The CloudEvents required context attributes (besides `specversion`, checked on its own). */
const REQUIRED_ATTRIBUTES = ['id', 'source', 'type'] as const;

/** Event members that are not context attributes and so are not bound by the naming rule. */
const DATA_MEMBERS: ReadonlySet<string> = new Set(['data', 'data_base64']);

/**
 * Whether `name` is a valid CloudEvents attribute name: 1..20 lower-case
 * ASCII letters or digits (CloudEvents 1.0 §3.1.1).
 */
export function isValidExtensionName(name: string): boolean {
  return EXTENSION_NAME.test(name);
}

/**
 * The CloudEvents `time` of a store timestamp: its RFC 3339 UTC string
 * (`Date.prototype.toISOString`, millisecond precision).
 */
export function cloudEventTime(time: Timestamp): string {
  if (!Number.isSafeInteger(time) || time < 0 || time > MAX_DATE_MS) {
    throw new ContractError('invalid_input', 'time must be a store timestamp in milliseconds', {
      reason: 'schema',
      path: '$.time',
    });
  }
  return new Date(time).toISOString();
}

/**
 * The `source` of every event about a queue's tasks:
 * `/v1/tenants/{tenant}/namespaces/{namespace}/queues/{queue}`, each segment
 * URI-encoded.
 */
export function queueSource(scope: Scope, queue: string): string {
  return `/v1/tenants/${encodeURIComponent(scope.tenant_id)}/namespaces/${encodeURIComponent(
    scope.namespace,
  )}/queues/${encodeURIComponent(queue)}`;
}

/**
 * The path of a task's result (`GET …/result`), referenced by a completion
 * event instead of a copy of the result:
 * `/v1/tenants/{tenant}/namespaces/{namespace}/tasks/{task_id}/result`, each
 * segment URI-encoded.
 */
export function completionResultRef(scope: Scope, taskId: string): string {
  return `/v1/tenants/${encodeURIComponent(scope.tenant_id)}/namespaces/${encodeURIComponent(
    scope.namespace,
  )}/tasks/${encodeURIComponent(taskId)}/result`;
}

/** What {@link buildTaskEvent} needs to know about one attempt. */
export interface TaskEventInput {
  /** The task's tenant and namespace (`ldgtenant`, `ldgnamespace`; part of `source`). */
  scope: Scope;
  /** The task's queue (`ldgqueue`; the end of `source`). */
  queue: string;
  /** The task id (`ldgtaskid`). */
  task_id: string;
  /** The task's run id (`ldgrunid`). */
  run_id: string;
  /** The attempt id: the event's `id` and `ldgattemptid`. */
  attempt_id: string;
  /** The attempt's 1-based ordinal (`ldgattempt`). */
  attempt: number;
  /**
   * The program the attempt runs. Not an event attribute: DESIGN §4 lists
   * none for it, and the assignment carries it as `descriptor`.
   */
  program: ProgramDescriptor;
  /** The task's `data`, already checked at submission. */
  data: unknown;
  /** Store time at which the attempt was created. */
  time: Timestamp;
  /** The task's origin trace, propagated as the `traceparent`/`tracestate` attributes. */
  trace?: TraceContext | null;
  /** Only for a workflow controller activation (`ldgactivationid`). */
  activation_id?: string;
}

/**
 * The immutable invocation event of an attempt: `id` is the attempt id,
 * `source` the queue's path ({@link queueSource}), `type`
 * `dev.ledgence.task.attempt`, `time` the store timestamp as RFC 3339, `data`
 * the task's data, and the `ldg*` extensions naming tenant, namespace, queue,
 * task, run, attempt and ordinal. Throws `invalid_input` if any attribute
 * breaks its rule.
 */
export function buildTaskEvent(input: TaskEventInput): CloudEvent {
  const event: Record<string, unknown> = {
    specversion: '1.0',
    id: input.attempt_id,
    source: queueSource(input.scope, input.queue),
    type: TASK_ATTEMPT_EVENT_TYPE,
    time: cloudEventTime(input.time),
    datacontenttype: 'application/json',
    data: input.data,
    ldgtenant: input.scope.tenant_id,
    ldgnamespace: input.scope.namespace,
    ldgqueue: input.queue,
    ldgtaskid: input.task_id,
    ldgrunid: input.run_id,
    ldgattemptid: input.attempt_id,
    ldgattempt: input.attempt,
  };
  if (input.activation_id !== undefined) event.ldgactivationid = input.activation_id;
  if (input.trace !== undefined && input.trace !== null) {
    event.traceparent = input.trace.traceparent;
    if (input.trace.tracestate !== undefined) event.tracestate = input.trace.tracestate;
  }
  return parseWith(CloudEventSchema, event);
}

/** What {@link buildCompletionEvent} needs to know about a terminal task. */
export interface CompletionEventInput {
  /** The task's tenant and namespace (`ldgtenant`, `ldgnamespace`; in `source`, `result_ref`). */
  scope: Scope;
  /** The task's queue (`ldgqueue`; the end of `source`). */
  queue: string;
  /** The task id: the event's `subject` and `data.task_id`. */
  task_id: string;
  /** The task's run id (`data.run_id`). */
  run_id: string;
  /** The terminal state the task reached (`data.state`). */
  state: TerminalTaskState;
  /** The subscription's `event_id`: also the webhook id, stable across retries. */
  event_id: string;
  /** Store time at which the task became terminal. */
  time: Timestamp;
}

/**
 * The compact completion CloudEvent (DESIGN §8): `type`
 * `dev.ledgence.task.completed`, `subject` the task id, `data` `{task_id,
 * run_id, state, result_ref}` with `result_ref` = {@link completionResultRef},
 * plus the `ldgtenant`, `ldgnamespace` and `ldgqueue` extensions. Built only
 * from its inputs, so the same inputs give the same bytes on every retry.
 * Throws `payload_too_large` if its compact encoding exceeds
 * COMPLETION_EVENT_MAX_BYTES (possible only with extreme, escape-heavy names).
 */
export function buildCompletionEvent(input: CompletionEventInput): CompletionEvent {
  const event = parseWith(CompletionEventSchema, {
    specversion: '1.0',
    id: input.event_id,
    source: queueSource(input.scope, input.queue),
    type: TASK_COMPLETED_EVENT_TYPE,
    subject: input.task_id,
    time: cloudEventTime(input.time),
    datacontenttype: 'application/json',
    data: {
      task_id: input.task_id,
      run_id: input.run_id,
      state: input.state,
      result_ref: completionResultRef(input.scope, input.task_id),
    },
    ldgtenant: input.scope.tenant_id,
    ldgnamespace: input.scope.namespace,
    ldgqueue: input.queue,
  });
  const bytes = utf8ByteLength(canonicalJson(event));
  if (bytes > COMPLETION_EVENT_MAX_BYTES) {
    throw new ContractError(
      'payload_too_large',
      `the completion event encodes to more than ${COMPLETION_EVENT_MAX_BYTES} bytes`,
      { reason: 'too_large', path: '$' },
    );
  }
  return event;
}

/**
 * The CloudEvents 1.0 rules every event meets, checked before the Ledgence
 * schema so a foreign or damaged event gets a CloudEvents-level message:
 * an object, `specversion` `1.0`, non-empty string `id`, `source` and `type`,
 * and attribute names of 1..20 lower-case letters and digits.
 */
function checkCloudEventRules(value: unknown): void {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new ContractError('invalid_input', '$ must be a CloudEvent object', {
      reason: 'schema',
      path: '$',
    });
  }
  const event = value as Record<string, unknown>;
  for (const name of Object.keys(event)) {
    if (!DATA_MEMBERS.has(name) && !isValidExtensionName(name)) {
      const path = appendJsonPath('$', name);
      throw new ContractError(
        'invalid_input',
        `${path} is not a valid CloudEvents attribute name (1 to 20 lower-case letters or digits)`,
        { reason: 'invalid_attribute_name', path },
      );
    }
  }
  if (event.specversion !== '1.0') {
    throw new ContractError('invalid_input', '$.specversion must be "1.0"', {
      reason: 'schema',
      path: '$.specversion',
    });
  }
  for (const name of REQUIRED_ATTRIBUTES) {
    const attribute = event[name];
    if (typeof attribute !== 'string' || attribute.length === 0) {
      throw new ContractError(
        'invalid_input',
        `$.${name} is a required CloudEvents attribute and must be a non-empty string`,
        { reason: 'schema', path: `$.${name}` },
      );
    }
  }
}

/**
 * Validates an attempt's invocation event (e.g. received by a worker):
 * the CloudEvents 1.0 rules, then the strict Ledgence schema (exactly the
 * DESIGN §4 attributes). Returns the typed event or throws `invalid_input`.
 */
export function validateCloudEvent(value: unknown): CloudEvent {
  checkCloudEventRules(value);
  return parseWith(CloudEventSchema, value);
}

/**
 * Validates a completion event (e.g. received by a callback destination
 * using this package): the CloudEvents 1.0 rules, then the strict schema.
 */
export function validateCompletionEvent(value: unknown): CompletionEvent {
  checkCloudEventRules(value);
  return parseWith(CompletionEventSchema, value);
}

/**
 * The opt-in runtime marker must agree with the immutable invocation event:
 * `workflow_activation_id` must equal the event's `ldgactivationid` (both
 * absent for an ordinary task), and an activation id must be the leased
 * task's id. Throws `invalid_input` (reason `identity_mismatch`) otherwise.
 */
export function validateAssignmentIdentity(
  assignment: Pick<Assignment, 'workflow_activation_id' | 'event' | 'lease'>,
): void {
  const activation = assignment.event.ldgactivationid;
  if (
    assignment.workflow_activation_id !== activation ||
    (activation !== undefined && activation !== assignment.lease.owner.task_id)
  ) {
    throw new ContractError('invalid_input', 'workflow assignment identity mismatch', {
      reason: 'identity_mismatch',
      path: '$.workflow_activation_id',
    });
  }
}
