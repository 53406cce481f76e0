/**
 * Full valid examples of every exported wire schema, shared by the schema,
 * decode and CloudEvent tests. "Full" means every optional field is present,
 * except those listed in `omitted` (mutually exclusive fields); a second
 * example then covers them. Types are annotated so an example that drifts
 * from its schema fails the type-check too.
 */
import type * as v from 'valibot';
import * as s from '../index.js';

/** One row of the valid-example table. */
export interface SchemaExample {
  /** The export name in schemas/index.ts. */
  name: string;
  schema: v.GenericSchema;
  example: unknown;
  /** A label distinguishing several examples of one schema (union variants, alternatives). */
  variant?: string;
  /** Optional keys deliberately absent from this example. */
  omitted?: readonly string[];
  /**
   * Optional keys that are only valid together (or whose removal breaks a
   * cross-field rule): the optional-removal test deletes each group at once.
   */
  coupled?: readonly (readonly string[])[];
  /** For non-object schemas: values that must be rejected. */
  invalid?: readonly unknown[];
}

export const T0 = 1_714_564_800_000; // 2024-05-01T12:00:00.000Z
export const T1 = T0 + 1_000;
export const T2 = T0 + 30_000;

export const scope: s.Scope = { tenant_id: 'acme', namespace: 'prod' };
export const trace: s.TraceContext = {
  traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
  tracestate: 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7',
};
export const program: s.ProgramDescriptor = { name: 'send-email', version: 'v2' };
export const labels: s.Labels = { team: 'growth', tier: 'gold' };

export const retryExponential: s.RetryPolicy = {
  max_attempts: 5,
  delay_ms: 500,
  backoff: 'exponential',
  max_delay_ms: 30_000,
};

export const submitTask: s.SubmitTask = {
  tenant_id: 'acme',
  namespace: 'prod',
  queue: 'email',
  program,
  data: { to: 'a@example.com', tags: ['x', 1, null, { deep: true }] },
  retry: retryExponential,
  timeout_ms: 60_000,
  available_at: T1,
  priority: 10,
  concurrency_key: 'customer-42',
  concurrency_limit: 2,
  labels,
};
export const submitTaskDelayed: s.SubmitTask = {
  tenant_id: 'acme',
  namespace: 'prod',
  queue: 'email',
  program: { name: 'send-email' },
  data: null,
  retry: { max_attempts: 1, delay_ms: 0 }, // a fixed policy, canonical (a3s encoding)
  delay_ms: 5_000,
};

export const submitCommand: s.SubmitCommand = {
  idempotency_key: 'order-123',
  input: submitTask,
  origin_trace: trace,
};

export const taskSnapshot: s.TaskSnapshot = {
  parent_workflow_id: 'wf_parent',
  root_workflow_id: 'wf_root',
  workflow_id: 'wf_1',
  workflow_activation_id: 'act_1',
  task_id: 'tsk_01',
  run_id: 'run_01',
  idempotency_key: 'order-123',
  input: submitTask,
  descriptor: program,
  origin_trace: trace,
  state: 'active',
  submitted_at: T0,
  available_at: T1,
  terminal_at: null,
  current_attempt_id: 'att_01',
  attempt_count: 1,
  cancel_requested_at: null,
};

export const taskStatus: s.TaskStatus = {
  task_id: 'tsk_01',
  run_id: 'run_01',
  queue: 'email',
  program,
  state: 'succeeded',
  submitted_at: T0,
  available_at: T1,
  terminal_at: T2,
  attempt_count: 1,
  max_attempts: 5,
  cancel_requested_at: null,
  labels,
  workflow_id: 'wf_1',
};

export const applicationError: s.ApplicationError = {
  code: 'EMAIL_BOUNCED',
  message: 'mailbox full\nretry later',
  details: { smtp: 552, lines: ['a', 'b'] },
  retryable: false,
};
export const executionFailure: s.ExecutionFailure = {
  kind: 'crashed',
  message: 'worker exited with code 137',
  retryable: true,
};

export const cloudEvent: s.CloudEvent = {
  specversion: '1.0',
  id: 'att_01',
  source: '/v1/tenants/acme/namespaces/prod/queues/email',
  type: 'dev.ledgence.task.attempt',
  time: '2024-05-01T12:00:01.000Z',
  datacontenttype: 'application/json',
  data: submitTask.data,
  ldgtenant: 'acme',
  ldgnamespace: 'prod',
  ldgqueue: 'email',
  ldgtaskid: 'tsk_01',
  ldgrunid: 'run_01',
  ldgattemptid: 'att_01',
  ldgattempt: 1,
  ldgactivationid: 'tsk_01',
  traceparent: trace.traceparent,
  tracestate: 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7',
};

export const executionIdentity: s.ExecutionIdentity = {
  task_id: 'tsk_01',
  attempt_id: 'att_01',
  activation_id: 'tsk_01',
};
export const executionReport: s.ExecutionReport = {
  context: { identity: executionIdentity },
  outcome: { kind: 'success', output: { sent: true, id: 'msg-9' } },
  started_at: T1,
  finished_at: T2,
};

export const leaseOwner: s.LeaseOwner = {
  scope,
  task_id: 'tsk_01',
  attempt_id: 'att_01',
  lease_id: 'lse_01',
  generation: 1,
  worker_session_id: 'ses_01',
  consumer_id: 3,
};
export const lease: s.Lease = { owner: leaseOwner, expires_at: T2 };
export const authority: s.Authority = {
  owner: leaseOwner,
  expires_at: T2,
  remaining_ms: 29_000,
  execution_remaining_ms: 59_000,
  renew_sequence: 0,
  cancel_requested: false,
  dispatch_allowed: false,
};
export const assignment: s.Assignment = {
  workflow_activation_id: 'tsk_01',
  descriptor: program,
  event: cloudEvent,
  lease,
  authority,
  attempt_deadline: T0 + 60_000,
};
export const acquireCommand: s.AcquireCommand = {
  scope,
  queue: 'email',
  worker_session_id: 'ses_01',
  consumer_id: 3,
  sequence: 7,
};
export const attemptRef: s.AttemptRef = { task_id: 'tsk_01', attempt_id: 'att_01' };
export const renewCommand: s.RenewCommand = { owner: leaseOwner, sequence: 1, intent: 'dispatch' };

export const settleCommand: s.SettleCommand = {
  owner: leaseOwner,
  operation_id: 'op_01',
  report: { kind: 'completed', report: executionReport },
  quiescence: 'confirmed',
  processing_trace: trace,
};
export const settlementReceipt: s.SettlementReceipt = {
  operation_id: 'op_01',
  task_id: 'tsk_01',
  attempt_id: 'att_01',
  accepted_at: T2,
};
export const acceptedSettlement: s.AcceptedSettlement = {
  command: settleCommand,
  receipt: settlementReceipt,
};
export const settleReply: s.SettleReply = {
  receipt: settlementReceipt,
  already_accepted: false,
  task_state: 'succeeded',
};

export const completionSubscription: s.CompletionSubscription = {
  id: 'sub_01',
  task_id: 'tsk_01',
  subscription_key: 'billing-1',
  destination: 'billing',
  event_id: 'evt_01',
  state: 'exhausted',
  attempts: 12,
  generation: 1,
  next_attempt_at: T2,
  delivered_at: T2,
  last_status_code: 503,
  last_error: 'HTTP 503 from receiver',
};
export const completionEvent: s.CompletionEvent = {
  specversion: '1.0',
  id: 'evt_01',
  source: '/v1/tenants/acme/namespaces/prod/queues/email',
  type: 'dev.ledgence.task.completed',
  subject: 'tsk_01',
  time: '2024-05-01T12:00:30.000Z',
  datacontenttype: 'application/json',
  data: {
    task_id: 'tsk_01',
    run_id: 'run_01',
    state: 'succeeded',
    result_ref: '/v1/tenants/acme/namespaces/prod/tasks/tsk_01/result',
  },
  ldgtenant: 'acme',
  ldgnamespace: 'prod',
  ldgqueue: 'email',
};

export const problem: s.Problem = {
  type: 'https://ledgence.dev/problems/invalid_input',
  title: 'Invalid input',
  status: 400,
  code: 'invalid_input',
  detail: '$.input.queue must not be empty',
  reason: 'schema',
  path: '$.input.queue',
  instance: '/v1/tenants/acme/namespaces/prod/tasks',
  request_id: 'req_01',
};

const recordedHistoryEvent: s.RecordedHistoryEvent = {
  sequence: 2,
  event: { task_id: 'tsk_01', attempt_id: 'att_01', at: T1, reason: 'claimed' },
};

/** Every exported schema with at least one full valid example. */
export const EXAMPLES: readonly SchemaExample[] = [
  // ---- common
  { name: 'CounterSchema', schema: s.CounterSchema, example: 0, invalid: [-1, 1.5, 2 ** 53, '1'] },
  {
    name: 'TimestampSchema',
    schema: s.TimestampSchema,
    example: T0,
    invalid: [-1, 0.5, Number.MAX_SAFE_INTEGER + 1, '1', null],
  },
  { name: 'PositiveCounterSchema', schema: s.PositiveCounterSchema, example: 1, invalid: [0, -1] },
  {
    name: 'NameSchema',
    schema: s.NameSchema,
    example: 'email',
    invalid: ['', ' email', 'email ', 'a\nb', 'x'.repeat(129), 1],
  },
  {
    name: 'UriReferenceSchema',
    schema: s.UriReferenceSchema,
    example: '/v1/tenants/acme/namespaces/prod/queues/email',
    invalid: ['', ' /v1', '/v1\n'],
  },
  {
    name: 'Rfc3339TimeSchema',
    schema: s.Rfc3339TimeSchema,
    example: '2024-02-29T23:59:59.999Z',
    invalid: [
      '2023-02-29T00:00:00Z',
      '2024-02-30T00:00:00Z',
      '2024-05-01 12:00:00Z',
      '2024-05-01T12:00:00+01:00',
      '2024-05-01T24:00:00Z',
      '2024-05-01T12:00:60Z',
      '+010000-01-01T00:00:00.000Z',
    ],
  },
  { name: 'ScopeSchema', schema: s.ScopeSchema, example: scope },
  {
    name: 'TraceparentSchema',
    schema: s.TraceparentSchema,
    example: trace.traceparent,
    invalid: ['00-00000000000000000000000000000000-00f067aa0ba902b7-01', 'nope'],
  },
  {
    name: 'TracestateSchema',
    schema: s.TracestateSchema,
    example: 'congo=t61rcWkgMzE',
    invalid: ['a=1,,rojo', 'a=1,a=2', 'Upper=1'],
  },
  { name: 'TraceContextSchema', schema: s.TraceContextSchema, example: trace },
  { name: 'ProgramDescriptorSchema', schema: s.ProgramDescriptorSchema, example: program },
  {
    name: 'LabelsSchema',
    schema: s.LabelsSchema,
    example: labels,
    invalid: [[], null, { a: 1 }, { '': 'x' }, { a: '' }, { constructor: 'x' }],
  },
  {
    name: 'JsonValueSchema',
    schema: s.JsonValueSchema,
    example: { a: [1, 'x', null, true] },
    invalid: [undefined],
  },

  // ---- task
  {
    name: 'RetryBackoffSchema',
    schema: s.RetryBackoffSchema,
    example: 'fixed',
    invalid: ['linear'],
  },
  {
    name: 'RetryPolicySchema',
    schema: s.RetryPolicySchema,
    example: retryExponential,
    coupled: [['backoff', 'max_delay_ms']],
  },
  {
    name: 'SubmitTaskSchema',
    schema: s.SubmitTaskSchema,
    example: submitTask,
    omitted: ['delay_ms'],
    coupled: [['concurrency_key', 'concurrency_limit']],
  },
  {
    name: 'SubmitTaskSchema',
    variant: 'delayed',
    schema: s.SubmitTaskSchema,
    example: submitTaskDelayed,
    omitted: [
      'available_at',
      'timeout_ms',
      'priority',
      'concurrency_key',
      'concurrency_limit',
      'labels',
    ],
  },
  { name: 'SubmitCommandSchema', schema: s.SubmitCommandSchema, example: submitCommand },
  {
    name: 'SubmitRequestBodySchema',
    schema: s.SubmitRequestBodySchema,
    example: { input: submitTask, origin_trace: trace },
  },
  { name: 'TaskStateSchema', schema: s.TaskStateSchema, example: 'queued', invalid: ['pending'] },
  {
    name: 'TerminalTaskStateSchema',
    schema: s.TerminalTaskStateSchema,
    example: 'cancelled',
    invalid: ['active'],
  },
  {
    name: 'AttemptStateSchema',
    schema: s.AttemptStateSchema,
    example: 'lost',
    invalid: ['queued'],
  },
  {
    name: 'TaskSnapshotSchema',
    schema: s.TaskSnapshotSchema,
    example: taskSnapshot,
    coupled: [['parent_workflow_id', 'root_workflow_id']],
  },
  { name: 'TaskStatusSchema', schema: s.TaskStatusSchema, example: taskStatus },
  {
    name: 'TaskFailureSchema',
    variant: 'application',
    schema: s.TaskFailureSchema,
    example: { kind: 'application', error: applicationError },
  },
  {
    name: 'TaskFailureSchema',
    variant: 'execution',
    schema: s.TaskFailureSchema,
    example: { kind: 'execution', error: executionFailure },
  },
  {
    name: 'TaskFailureSchema',
    variant: 'lease_expired',
    schema: s.TaskFailureSchema,
    example: { kind: 'lease_expired', attempts: 3 },
  },
  {
    name: 'TaskOutcomeSchema',
    variant: 'succeeded',
    schema: s.TaskOutcomeSchema,
    example: { state: 'succeeded', output: null },
  },
  {
    name: 'TaskOutcomeSchema',
    variant: 'failed',
    schema: s.TaskOutcomeSchema,
    example: { state: 'failed', failure: { kind: 'lease_expired', attempts: 3 } },
  },
  {
    name: 'TaskOutcomeSchema',
    variant: 'cancelled',
    schema: s.TaskOutcomeSchema,
    example: { state: 'cancelled' },
  },
  {
    name: 'TaskResultOutcomeSchema',
    variant: 'succeeded',
    schema: s.TaskResultOutcomeSchema,
    example: { state: 'succeeded', output: { n: 1 } },
  },
  {
    name: 'TaskResultOutcomeSchema',
    variant: 'failed',
    schema: s.TaskResultOutcomeSchema,
    example: { state: 'failed', failure: { kind: 'execution', error: executionFailure } },
  },
  {
    name: 'TaskResultOutcomeSchema',
    variant: 'cancelled',
    schema: s.TaskResultOutcomeSchema,
    example: { state: 'cancelled' },
  },
  {
    name: 'TaskResultOutcomeSchema',
    variant: 'pending',
    schema: s.TaskResultOutcomeSchema,
    example: { state: 'pending' },
  },
  {
    name: 'TaskResultSchema',
    schema: s.TaskResultSchema,
    example: { status: taskStatus, outcome: { state: 'succeeded', output: { sent: true } } },
  },
  {
    name: 'TaskCursorSchema',
    schema: s.TaskCursorSchema,
    example: 'WzEsImFiYyJd_-',
    invalid: ['', 'a+b', 'a=', 'x'.repeat(1025)],
  },
  {
    name: 'TaskFiltersSchema',
    schema: s.TaskFiltersSchema,
    example: {
      state: 'queued',
      queue: 'email',
      program: 'send-email',
      labels: { team: 'growth' },
      submitted_from: T0,
      submitted_until: T2,
      workflow_id: 'wf_1',
    },
  },
  {
    name: 'TaskListQuerySchema',
    schema: s.TaskListQuerySchema,
    example: { filters: { queue: 'email' }, limit: 100, cursor: 'WzEsImFiYyJd' },
  },
  {
    name: 'TaskPageSchema',
    schema: s.TaskPageSchema,
    example: { tasks: [taskStatus], next_cursor: 'WzEsImFiYyJd' },
  },
  {
    name: 'TaskPositionSchema',
    schema: s.TaskPositionSchema,
    example: { submitted_at: T0, task_id: 'tsk_01' },
  },
  {
    name: 'TransitionReasonSchema',
    schema: s.TransitionReasonSchema,
    example: 'dispatch_authorized',
    invalid: ['renewed'],
  },
  { name: 'HistoryEventSchema', schema: s.HistoryEventSchema, example: recordedHistoryEvent.event },
  {
    name: 'RecordedHistoryEventSchema',
    schema: s.RecordedHistoryEventSchema,
    example: recordedHistoryEvent,
  },
  {
    name: 'TaskHistorySchema',
    schema: s.TaskHistorySchema,
    example: [recordedHistoryEvent],
    invalid: [{}, [{}], Array.from({ length: 101 }, () => recordedHistoryEvent)],
  },

  // ---- execution
  { name: 'CloudEventSchema', schema: s.CloudEventSchema, example: cloudEvent },
  { name: 'ApplicationErrorSchema', schema: s.ApplicationErrorSchema, example: applicationError },
  {
    name: 'ProgramOutcomeSchema',
    variant: 'success',
    schema: s.ProgramOutcomeSchema,
    example: { kind: 'success', output: [1, 2, 3] },
  },
  {
    name: 'ProgramOutcomeSchema',
    variant: 'application_error',
    schema: s.ProgramOutcomeSchema,
    example: { kind: 'application_error', error: applicationError },
  },
  {
    name: 'ExecutionIdentitySchema',
    schema: s.ExecutionIdentitySchema,
    example: executionIdentity,
  },
  {
    name: 'ExecutionContextSchema',
    schema: s.ExecutionContextSchema,
    example: { identity: executionIdentity },
  },
  { name: 'ExecutionReportSchema', schema: s.ExecutionReportSchema, example: executionReport },
  {
    name: 'ExecutionFailureKindSchema',
    schema: s.ExecutionFailureKindSchema,
    example: 'timed_out',
    invalid: ['exploded'],
  },
  { name: 'ExecutionFailureSchema', schema: s.ExecutionFailureSchema, example: executionFailure },

  // ---- worker
  {
    name: 'OpenSessionCommandSchema',
    schema: s.OpenSessionCommandSchema,
    example: { scope, queue: 'email', concurrency: 8 },
  },
  {
    name: 'WorkerSessionSchema',
    schema: s.WorkerSessionSchema,
    example: { id: 'ses_01', scope, queue: 'email', concurrency: 8, expires_at: T2 },
  },
  { name: 'AcquireCommandSchema', schema: s.AcquireCommandSchema, example: acquireCommand },
  { name: 'AttemptRefSchema', schema: s.AttemptRefSchema, example: attemptRef },
  {
    name: 'ConsumerCursorSchema',
    schema: s.ConsumerCursorSchema,
    example: { command: acquireCommand, assignment: attemptRef },
  },
  { name: 'LeaseOwnerSchema', schema: s.LeaseOwnerSchema, example: leaseOwner },
  { name: 'LeaseSchema', schema: s.LeaseSchema, example: lease },
  { name: 'AuthoritySchema', schema: s.AuthoritySchema, example: authority },
  { name: 'AssignmentSchema', schema: s.AssignmentSchema, example: assignment },
  {
    name: 'AcquireReplySchema',
    variant: 'empty',
    schema: s.AcquireReplySchema,
    example: { disposition: 'empty', sequence: 7 },
  },
  {
    name: 'AcquireReplySchema',
    variant: 'assigned',
    schema: s.AcquireReplySchema,
    example: { disposition: 'assigned', sequence: 7, assignment },
  },
  {
    name: 'AcquireReplySchema',
    variant: 'ownership_lost',
    schema: s.AcquireReplySchema,
    example: { disposition: 'ownership_lost', sequence: 7, assignment: attemptRef },
  },
  {
    name: 'RenewIntentSchema',
    schema: s.RenewIntentSchema,
    example: 'keep_alive',
    invalid: ['keepalive'],
  },
  { name: 'RenewCommandSchema', schema: s.RenewCommandSchema, example: renewCommand },
  {
    name: 'QuiescenceSchema',
    schema: s.QuiescenceSchema,
    example: 'unconfirmed',
    invalid: ['maybe'],
  },
  {
    name: 'AttemptReportSchema',
    variant: 'completed',
    schema: s.AttemptReportSchema,
    example: { kind: 'completed', report: executionReport },
  },
  {
    name: 'AttemptReportSchema',
    variant: 'failed',
    schema: s.AttemptReportSchema,
    example: { kind: 'failed', report: executionFailure },
  },
  { name: 'SettleCommandSchema', schema: s.SettleCommandSchema, example: settleCommand },
  {
    name: 'SettlementReceiptSchema',
    schema: s.SettlementReceiptSchema,
    example: settlementReceipt,
  },
  {
    name: 'AcceptedSettlementSchema',
    schema: s.AcceptedSettlementSchema,
    example: acceptedSettlement,
  },
  { name: 'SettleReplySchema', schema: s.SettleReplySchema, example: settleReply },
  {
    name: 'AttemptSnapshotSchema',
    schema: s.AttemptSnapshotSchema,
    example: {
      event: cloudEvent,
      descriptor: program,
      lease,
      deadline: T0 + 60_000,
      authority_deadline: T0 + 90_000,
      state: 'succeeded',
      execution_may_have_started: true,
      last_renewal: renewCommand,
      quiescence: 'confirmed',
      settlement: acceptedSettlement,
      finished_at: T2,
    },
  },
  {
    name: 'RecoveryProgressSchema',
    schema: s.RecoveryProgressSchema,
    example: {
      scanned: 10,
      recovered: 6,
      requeued: 3,
      failed: 2,
      cancelled: 1,
      finalized: 2,
      has_more: true,
    },
  },

  // ---- completion
  {
    name: 'CompletionSubscribeCommandSchema',
    schema: s.CompletionSubscribeCommandSchema,
    example: { subscription_key: 'billing-1', destination: 'billing' },
  },
  {
    name: 'CompletionRetryCommandSchema',
    schema: s.CompletionRetryCommandSchema,
    example: { generation: 1 },
  },
  {
    name: 'CompletionStateSchema',
    schema: s.CompletionStateSchema,
    example: 'delivering',
    invalid: ['sent'],
  },
  {
    name: 'CompletionSubscriptionSchema',
    schema: s.CompletionSubscriptionSchema,
    example: completionSubscription,
  },
  {
    name: 'CompletionSubscriptionListSchema',
    schema: s.CompletionSubscriptionListSchema,
    example: [completionSubscription],
    invalid: [completionSubscription, Array.from({ length: 17 }, () => completionSubscription)],
  },
  {
    name: 'CompletionEventDataSchema',
    schema: s.CompletionEventDataSchema,
    example: completionEvent.data,
  },
  { name: 'CompletionEventSchema', schema: s.CompletionEventSchema, example: completionEvent },

  // ---- retention
  {
    name: 'SetRetentionPolicyCommandSchema',
    schema: s.SetRetentionPolicyCommandSchema,
    example: { retention_ms: 86_400_000 },
    invalid: [{ retention_ms: 3_599_999 }, { retention_ms: 315_360_000_001 }, {}],
  },
  {
    name: 'RetentionPolicySourceSchema',
    schema: s.RetentionPolicySourceSchema,
    example: 'namespace',
    invalid: ['tenant'],
  },
  {
    name: 'RetentionPolicySchema',
    schema: s.RetentionPolicySchema,
    example: { retention_ms: 86_400_000, source: 'namespace', updated_at: T0 },
    invalid: [{ retention_ms: 60_000, source: 'namespace', updated_at: T0 }],
  },
  {
    name: 'RetentionPreviewSchema',
    schema: s.RetentionPreviewSchema,
    example: {
      retention_ms: 3_600_000,
      as_of: T2,
      cutoff: T2 - 3_600_000,
      candidates: 2,
      truncated: false,
      oldest_terminal_at: T0 - 7_200_000,
    },
    invalid: [
      { retention_ms: 3_600_000, as_of: T2, cutoff: T0, candidates: 1_001, truncated: true },
    ],
  },
  {
    name: 'RetentionProgressSchema',
    schema: s.RetentionProgressSchema,
    example: {
      cutoff: T0,
      tasks_removed: 2,
      attempts_removed: 3,
      history_removed: 9,
      subscriptions_removed: 1,
      sessions_removed: 0,
      has_more: false,
    },
  },

  // ---- batch
  { name: 'ProblemSchema', schema: s.ProblemSchema, example: problem },
  {
    name: 'TaskStateReplySchema',
    schema: s.TaskStateReplySchema,
    example: { task_state: 'cancelled' },
  },
  {
    name: 'SubmitBatchRequestSchema',
    schema: s.SubmitBatchRequestSchema,
    example: { commands: [submitCommand] },
  },
  {
    name: 'SubmitBatchReplySchema',
    schema: s.SubmitBatchReplySchema,
    example: { results: [taskSnapshot, problem] },
  },
  {
    name: 'AcquireBatchRequestSchema',
    schema: s.AcquireBatchRequestSchema,
    example: { commands: [acquireCommand] },
  },
  {
    name: 'AcquireBatchReplySchema',
    schema: s.AcquireBatchReplySchema,
    example: {
      replies: [
        { disposition: 'assigned', sequence: 7, assignment },
        { disposition: 'empty', sequence: 3 },
        { ...problem, code: 'sequence_conflict', status: 409, title: 'Sequence conflict' },
      ],
    },
  },
  {
    name: 'RenewBatchRequestSchema',
    schema: s.RenewBatchRequestSchema,
    example: { commands: [renewCommand] },
  },
  {
    name: 'RenewBatchReplySchema',
    schema: s.RenewBatchReplySchema,
    example: { results: [authority, problem] },
  },
  {
    name: 'SettleBatchRequestSchema',
    schema: s.SettleBatchRequestSchema,
    example: { commands: [settleCommand] },
  },
  {
    name: 'SettleBatchReplySchema',
    schema: s.SettleBatchReplySchema,
    example: { results: [settleReply, problem] },
  },
];
