/**
 * The OpenAPI 3.1 document of `/openapi.json`, generated from the routes the
 * app registers (hono-openapi's `describeRoute` + `generateSpecs`) and the
 * contracts' valibot schemas (converted by `@valibot/to-json-schema` into
 * `components.schemas`). No hono-openapi validator is used: decoding is the
 * contracts' job, and its default 400 hook would echo the input.
 */
import {
  AcquireBatchReplySchema,
  AcquireBatchRequestSchema,
  AcquireCommandSchema,
  AcquireReplySchema,
  AssignmentSchema,
  AttemptSnapshotSchema,
  AuthoritySchema,
  BATCH_MAX_BYTES,
  CloudEventSchema,
  CompletionRetryCommandSchema,
  CompletionSubscribeCommandSchema,
  CompletionSubscriptionListSchema,
  CompletionSubscriptionSchema,
  DEFAULT_TIMEOUT_MS,
  ERROR_STATUS,
  type ErrorCode,
  FORBIDDEN_JSON_KEYS,
  JSON_MAX_DEPTH,
  JsonValueSchema,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  LabelsSchema,
  LEASE_SAFETY_MARGIN_MS,
  LeaseOwnerSchema,
  LeaseSchema,
  MAX_COMPLETION_SUBSCRIPTIONS,
  MAX_LABELS,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
  MAX_SUBMIT_DELAY_MS,
  MIN_RETENTION_MS,
  NAME_MAX_BYTES,
  OpenSessionCommandSchema,
  ProblemSchema,
  ProgramDescriptorSchema,
  RecordedHistoryEventSchema,
  RenewBatchReplySchema,
  RenewBatchRequestSchema,
  RenewCommandSchema,
  RetentionPolicySchema,
  RetentionPreviewSchema,
  RetryPolicySchema,
  SCOPE_TEXT_MAX_BYTES,
  ScopeSchema,
  SetRetentionPolicyCommandSchema,
  SettleBatchReplySchema,
  SettleBatchRequestSchema,
  SettleCommandSchema,
  SettleReplySchema,
  SUBMISSION_DATA_MAX_BYTES,
  SubmitBatchReplySchema,
  SubmitBatchRequestSchema,
  SubmitCommandSchema,
  SubmitRequestBodySchema,
  SubmitTaskSchema,
  TASK_LIST_DEFAULT_LIMIT,
  TASK_LIST_MAX_LIMIT,
  TASK_PAGE_MAX_BYTES,
  TASK_STATUS_MAX_BYTES,
  TaskHistorySchema,
  TaskPageSchema,
  TaskResultSchema,
  TaskSnapshotSchema,
  TaskStateReplySchema,
  TaskStatusSchema,
  TRACEPARENT_PATTERN,
  TRACESTATE_MAX_BYTES,
  TraceContextSchema,
  TraceparentSchema,
  TracestateSchema,
  WorkerSessionSchema,
} from '@ledgence/contracts';
import { MIN_DISPATCH_WINDOW_MS } from '@ledgence/core';
import { type ConversionConfig, toJsonSchemaDefs } from '@valibot/to-json-schema';
import type { Env, Hono, MiddlewareHandler } from 'hono';
import { type DescribeRouteOptions, describeRoute, generateSpecs } from 'hono-openapi';
import type * as v from 'valibot';
import { CancelBodySchema, ExtendSessionBodySchema } from './bodies.js';
import { type PolicyEnv, type RouteAccess, withPolicy } from './policy.js';
import { PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE } from './problem.js';
import { REQUEST_ID_PATTERN } from './request-id.js';

/** A JSON Schema object as the document holds it. */
type JsonSchema = Record<string, unknown>;

/** The schemas published under `components.schemas`, by name. */
const COMPONENT_SCHEMAS = {
  Scope: ScopeSchema,
  ProgramDescriptor: ProgramDescriptorSchema,
  TraceContext: TraceContextSchema,
  Labels: LabelsSchema,
  SubmitTask: SubmitTaskSchema,
  SubmitCommand: SubmitCommandSchema,
  SubmitRequestBody: SubmitRequestBodySchema,
  TaskSnapshot: TaskSnapshotSchema,
  TaskStatus: TaskStatusSchema,
  TaskPage: TaskPageSchema,
  TaskResult: TaskResultSchema,
  TaskHistory: TaskHistorySchema,
  RecordedHistoryEvent: RecordedHistoryEventSchema,
  AttemptSnapshot: AttemptSnapshotSchema,
  TaskStateReply: TaskStateReplySchema,
  CancelBody: CancelBodySchema,
  OpenSessionCommand: OpenSessionCommandSchema,
  ExtendSessionBody: ExtendSessionBodySchema,
  WorkerSession: WorkerSessionSchema,
  AcquireCommand: AcquireCommandSchema,
  AcquireReply: AcquireReplySchema,
  Assignment: AssignmentSchema,
  CloudEvent: CloudEventSchema,
  Lease: LeaseSchema,
  LeaseOwner: LeaseOwnerSchema,
  Authority: AuthoritySchema,
  RenewCommand: RenewCommandSchema,
  SettleCommand: SettleCommandSchema,
  SettleReply: SettleReplySchema,
  SubmitBatchRequest: SubmitBatchRequestSchema,
  SubmitBatchReply: SubmitBatchReplySchema,
  AcquireBatchRequest: AcquireBatchRequestSchema,
  AcquireBatchReply: AcquireBatchReplySchema,
  RenewBatchRequest: RenewBatchRequestSchema,
  RenewBatchReply: RenewBatchReplySchema,
  SettleBatchRequest: SettleBatchRequestSchema,
  SettleBatchReply: SettleBatchReplySchema,
  CompletionSubscribeCommand: CompletionSubscribeCommandSchema,
  CompletionRetryCommand: CompletionRetryCommandSchema,
  CompletionSubscription: CompletionSubscriptionSchema,
  CompletionSubscriptionList: CompletionSubscriptionListSchema,
  SetRetentionPolicyCommand: SetRetentionPolicyCommandSchema,
  RetentionPolicy: RetentionPolicySchema,
  RetentionPreview: RetentionPreviewSchema,
  Problem: ProblemSchema,
} as const;

/** The name of a schema under `components.schemas`. */
export type ComponentName = keyof typeof COMPONENT_SCHEMAS;

/**
 * Identifier text as the contracts' text rule takes it (contracts text.ts `textProblem`).
 * Characters never outnumber UTF-8 bytes, so the byte bound is a character bound too.
 */
function identifierText(maxBytes: number): JsonSchema {
  return {
    type: 'string',
    minLength: 1,
    maxLength: maxBytes,
    description: `1..${maxBytes} UTF-8 bytes: well-formed, no control characters, no leading or trailing whitespace.`,
  };
}

/**
 * The bound of each path parameter's text: app.ts checks a parameter by it, and the document
 * states it (the generator types path parameters as bare strings).
 */
export const PATH_PARAMETER_MAX_BYTES = {
  tenant_id: SCOPE_TEXT_MAX_BYTES,
  namespace: SCOPE_TEXT_MAX_BYTES,
  task_id: NAME_MAX_BYTES,
  attempt_id: NAME_MAX_BYTES,
  subscription_id: NAME_MAX_BYTES,
  session_id: NAME_MAX_BYTES,
} as const;

/** A path parameter of some route. */
export type PathParameter = keyof typeof PATH_PARAMETER_MAX_BYTES;

/** `name` is present and not `null` (optional request fields may be either when not given). */
function given(name: string): JsonSchema {
  return { required: [name], properties: { [name]: { not: { type: 'null' } } } };
}

/**
 * The cross-field rules of request objects (their `rawCheck`s, which the converter cannot read),
 * stated in JSON Schema where it can and in their description where it cannot, by the entries
 * of the object (the one value the converter's object and the contracts' schema share).
 */
const OBJECT_RULES = new Map<unknown, JsonSchema>([
  [
    SubmitTaskSchema.pipe[0].entries,
    {
      description:
        '`available_at` and `delay_ms` are exclusive; `concurrency_limit` needs ' +
        '`concurrency_key`. `available_at` is at most ' +
        `${MAX_SUBMIT_DELAY_MS} ms (365 days) after store time, as \`delay_ms\` is.`,
      allOf: [
        { not: { allOf: [given('available_at'), given('delay_ms')] } },
        // biome-ignore lint/suspicious/noThenProperty: JSON Schema's if/then, never awaited
        { if: given('concurrency_limit'), then: given('concurrency_key') },
      ],
    },
  ],
  [
    RetryPolicySchema.pipe[0].entries,
    {
      description:
        'A fixed policy (`backoff` absent or `fixed`) takes no `max_delay_ms` but 0; an ' +
        'exponential one needs `1 ≤ delay_ms ≤ max_delay_ms`.',
      if: { required: ['backoff'], properties: { backoff: { const: 'exponential' } } },
      // biome-ignore lint/suspicious/noThenProperty: JSON Schema's if/then, never awaited
      then: {
        required: ['max_delay_ms'],
        properties: { delay_ms: { minimum: 1 }, max_delay_ms: { type: 'integer' } },
      },
      else: { properties: { max_delay_ms: { enum: [0, null] } } },
    },
  ],
]);

const OBJECT_TYPES = new Set(['object', 'strict_object', 'loose_object', 'object_with_rest']);
const OPTIONAL_TYPES = new Set(['optional', 'exact_optional', 'nullish', 'undefinedable']);

/**
 * Overrides of the converter: labels and application JSON are `custom`
 * schemas it cannot read, and an object's `required` list is recomputed from
 * its entries so that optional fields of every kind (`exactOptional` in
 * replies, omitted-or-null in requests) are never listed as required.
 */
const overrideSchema: ConversionConfig['overrideSchema'] = ({ valibotSchema, jsonSchema }) => {
  // The converter flattens pipes and offers each schema inside them, so a
  // piped schema is recognised by the first schema of its pipe.
  if (valibotSchema === LabelsSchema.pipe[0]) {
    return {
      type: 'object',
      propertyNames: {
        ...identifierText(LABEL_KEY_MAX_BYTES),
        not: { enum: [...FORBIDDEN_JSON_KEYS] },
      },
      additionalProperties: identifierText(LABEL_VALUE_MAX_BYTES),
      maxProperties: MAX_LABELS,
      description: `At most ${MAX_LABELS} exact-match labels.`,
    };
  }
  if (valibotSchema === JsonValueSchema.pipe[0]) {
    return {
      description:
        `Any JSON value nested at most ${JSON_MAX_DEPTH} levels deep, whose numbers are within ` +
        `±(2^53−1) and whose objects have no key ${FORBIDDEN_JSON_KEYS.join(', ')}.`,
    };
  }
  if (valibotSchema === TraceparentSchema.pipe[0]) {
    return {
      type: 'string',
      pattern: TRACEPARENT_PATTERN.source,
      description:
        'version-traceid-parentid-flags in lowercase hex; not version ff, not all-zero ids.',
    };
  }
  if (valibotSchema === TracestateSchema.pipe[0]) {
    return {
      type: 'string',
      maxLength: TRACESTATE_MAX_BYTES,
      description: 'Up to 32 `key=value` members with distinct keys, in printable ASCII.',
    };
  }
  const entries = (valibotSchema as { entries?: Record<string, { type: string }> }).entries;
  if (OBJECT_TYPES.has(valibotSchema.type) && entries !== undefined) {
    const required = Object.entries(entries)
      .filter(([, entry]) => !OPTIONAL_TYPES.has(entry.type))
      .map(([key]) => key);
    const schema: Record<string, unknown> = { ...jsonSchema, ...OBJECT_RULES.get(entries) };
    if (required.length > 0) schema.required = required;
    else delete schema.required;
    return schema as ReturnType<NonNullable<ConversionConfig['overrideSchema']>>;
  }
  return undefined;
};

// The contracts state integer rules as `check` actions whose messages name
// the rule (common.ts); JSON Schema can say the same with `integer` bounds.
const INTEGER_RANGE = /^must be an integer from (-?\d+) to (-?\d+)$/;
const NON_NEGATIVE_INTEGER = /^must be a non-negative (?:safe )?integer/;
const POSITIVE_INTEGER = /^must be a positive safe integer$/;
// The array bound of `itemCount` (common.ts): batch bodies and pages.
const ITEM_COUNT = /^must hold (\d+) to (\d+) items$/;

/** Turns the contracts' integer checks into `type: integer` with bounds, item counts into `minItems`/`maxItems`. */
const overrideAction: ConversionConfig['overrideAction'] = ({ valibotAction, jsonSchema }) => {
  const textMaxBytes = (valibotAction as { textMaxBytes?: unknown }).textMaxBytes;
  if (typeof textMaxBytes === 'number') {
    return { ...jsonSchema, ...identifierText(textMaxBytes) } as ReturnType<
      NonNullable<ConversionConfig['overrideAction']>
    >;
  }
  const message = (valibotAction as { message?: unknown }).message;
  if (valibotAction.type !== 'check' || typeof message !== 'string') return undefined;
  const range = INTEGER_RANGE.exec(message);
  const schema: Record<string, unknown> = { ...jsonSchema };
  if (range !== null) {
    Object.assign(schema, {
      type: 'integer',
      minimum: Number(range[1]),
      maximum: Number(range[2]),
    });
  } else if (NON_NEGATIVE_INTEGER.test(message)) {
    Object.assign(schema, { type: 'integer', minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
  } else if (POSITIVE_INTEGER.test(message)) {
    Object.assign(schema, { type: 'integer', minimum: 1, maximum: Number.MAX_SAFE_INTEGER });
  } else {
    const count = ITEM_COUNT.exec(message);
    if (count === null) return undefined;
    const [min, max] = [Number(count[1]), Number(count[2])];
    // A lower bound of 0 says nothing an array does not already say.
    if (min > 0) schema.minItems = min;
    schema.maxItems = max;
  }
  return schema as ReturnType<NonNullable<ConversionConfig['overrideAction']>>;
};

/** The JSON Schemas of {@link COMPONENT_SCHEMAS}, referencing each other by `$ref`. */
export function componentSchemas(): Record<ComponentName, JsonSchema> {
  const definitions = COMPONENT_SCHEMAS as unknown as Record<
    ComponentName,
    v.BaseSchema<unknown, unknown, v.BaseIssue<unknown>>
  >;
  const converted = toJsonSchemaDefs(definitions, {
    target: 'draft-2020-12',
    // The contracts use custom/check/rawCheck/transform for rules JSON Schema
    // cannot state; the structure converts, the rules are documented in prose.
    errorMode: 'ignore',
    overrideSchema,
    overrideAction,
    overrideRef: ({ referenceId }) => `#/components/schemas/${referenceId}`,
  }) as Record<ComponentName, JsonSchema>;
  for (const schema of Object.values(converted)) delete schema.$schema;
  return converted;
}

// ---- Route descriptions ---------------------------------------------------------

/** A reference to a component schema. */
function ref(name: ComponentName): JsonSchema {
  return { $ref: `#/components/schemas/${name}` };
}

interface QueryParameter {
  name: string;
  description: string;
  schema: JsonSchema;
}

interface RouteDoc {
  summary: string;
  description?: string;
  tags: string[];
  /**
   * The route's authorization policy: the role a key must hold, or `public`
   * (no authentication: health, metrics, the document itself). Declared here,
   * beside the route's documentation, so no route can be mounted without one.
   */
  access: RouteAccess;
  body?: { schema: JsonSchema; required: boolean; description?: string };
  query?: QueryParameter[];
  headers?: QueryParameter[];
  /** Success replies by status. */
  success: Record<
    number,
    { description: string; schema?: JsonSchema; contentType?: string; headers?: JsonSchema }
  >;
  /** Error codes the service (or the route) may answer, besides the common ones. */
  errors: ErrorCode[];
}

const WAIT_MS: QueryParameter = {
  name: 'wait_ms',
  description: 'How long to wait (ms); larger values are clamped to the server maximum.',
  schema: { type: 'integer', minimum: 0 },
};

const json = (schema: JsonSchema, description: string) => ({ description, schema });

/** The body bound of the batch routes (app.ts reads their bodies up to it). */
const BATCH_BODY =
  `A body over ${BATCH_MAX_BYTES} bytes is 413 \`payload_too_large\`; each command is held to ` +
  'the limits of its own route besides.';

/**
 * A query parameter the server reads as an integer in 0..2^53−1 (a timestamp or a sequence):
 * larger values are refused as `invalid_input` (query.ts), so the document bounds them too.
 */
const SAFE_COUNTER: JsonSchema = { type: 'integer', minimum: 0, maximum: Number.MAX_SAFE_INTEGER };

/** Every route the app registers, by operation id. */
const ROUTES = {
  submitTask: {
    summary: 'Submit a task',
    description:
      'Insert-or-return by idempotency key. The body is a SubmitCommand, or, with an ' +
      '`Idempotency-Key` header, `{input, origin_trace?}`. 201 when created, 200 when an ' +
      'identical submission already exists; the same key with other content is 409. ' +
      `Data over ${SUBMISSION_DATA_MAX_BYTES} bytes, or labels, queue and program that could ` +
      `make the task's status (at its largest) encode to more than ${TASK_STATUS_MAX_BYTES} ` +
      "bytes, is 413 (`reason` `too_large` or `status_too_large`). A new task's `timeout_ms` " +
      `(given, or the ${DEFAULT_TIMEOUT_MS} default) must also exceed the server's lease safety ` +
      `margin (\`LEDGENCE_LEASE_SAFETY_MARGIN_MS\`, ${LEASE_SAFETY_MARGIN_MS} by default) by ` +
      `${MIN_DISPATCH_WINDOW_MS} ms at least, or it is 400 \`invalid_input\` at ` +
      '`$.input.timeout_ms`: dispatch is granted only while more budget than the margin remains, ' +
      "so a shorter budget leaves a worker's dispatch request no time to arrive.",
    tags: ['tasks'],
    access: 'client',
    body: { schema: { oneOf: [ref('SubmitCommand'), ref('SubmitRequestBody')] }, required: true },
    headers: [
      {
        name: 'Idempotency-Key',
        description:
          'The idempotency key, when the body does not carry it: text of ≤ 255 bytes, read as ' +
          'UTF-8 (bytes that are not UTF-8 are 400 `invalid_text`).',
        schema: { type: 'string' },
      },
    ],
    success: {
      201: {
        ...json(ref('TaskSnapshot'), 'The task was created.'),
        headers: {
          Location: {
            description: "The new task's path (its status route).",
            schema: { type: 'string' },
          },
        },
      },
      200: json(ref('TaskSnapshot'), 'The same submission already exists.'),
    },
    errors: ['conflict'],
  },
  submitTaskBatch: {
    summary: 'Submit many tasks',
    description: `Each command is validated and answered on its own, in request order. ${BATCH_BODY}`,
    tags: ['tasks'],
    access: 'client',
    body: { schema: ref('SubmitBatchRequest'), required: true },
    success: { 200: json(ref('SubmitBatchReply'), 'One result or problem per command.') },
    errors: [],
  },
  listTasks: {
    summary: 'List tasks',
    description:
      'Newest first. Label filters are `label.<key>=<value>` parameters (repeatable with ' +
      'different keys; all must match). A cursor is bound to the scope and filters. A page ' +
      `encodes to at most ${TASK_PAGE_MAX_BYTES} bytes, so it may hold fewer than \`limit\` ` +
      'tasks even when more follow: `next_cursor` alone tells whether another page exists.',
    tags: ['tasks'],
    access: 'client',
    query: [
      {
        name: 'state',
        description: 'Exact state.',
        schema: { enum: ['queued', 'active', 'succeeded', 'failed', 'cancelled'] },
      },
      { name: 'queue', description: 'Exact queue.', schema: identifierText(NAME_MAX_BYTES) },
      {
        name: 'program',
        description: 'Exact program name.',
        schema: identifierText(NAME_MAX_BYTES),
      },
      {
        name: 'submitted_from',
        description: 'Inclusive lower bound of submitted_at (UTC ms).',
        schema: SAFE_COUNTER,
      },
      {
        name: 'submitted_until',
        description: 'Exclusive upper bound of submitted_at (UTC ms).',
        schema: SAFE_COUNTER,
      },
      {
        name: 'workflow_id',
        description: 'Exact workflow execution id (tasks outside a workflow never match).',
        schema: identifierText(NAME_MAX_BYTES),
      },
      {
        name: 'limit',
        description: `Page size (default ${TASK_LIST_DEFAULT_LIMIT}).`,
        schema: { type: 'integer', minimum: 1, maximum: TASK_LIST_MAX_LIMIT },
      },
      {
        name: 'cursor',
        description: 'The next_cursor of the previous page.',
        schema: { type: 'string' },
      },
    ],
    success: { 200: json(ref('TaskPage'), 'One page of tasks.') },
    errors: [],
  },
  getTaskStatus: {
    summary: 'Task status',
    tags: ['tasks'],
    access: 'client',
    success: { 200: json(ref('TaskStatus'), 'Scheduling metadata without payloads.') },
    errors: ['not_found'],
  },
  getTaskResult: {
    summary: 'Task result',
    description: 'With `wait_ms`, waits for a terminal state first.',
    tags: ['tasks'],
    access: 'client',
    query: [WAIT_MS],
    success: { 200: json(ref('TaskResult'), 'The status and the outcome (or pending).') },
    errors: ['not_found'],
  },
  getTaskSnapshot: {
    summary: 'Task snapshot',
    tags: ['tasks'],
    access: 'client',
    success: { 200: json(ref('TaskSnapshot'), 'The full scheduling record.') },
    errors: ['not_found'],
  },
  getAttempt: {
    summary: 'One attempt',
    tags: ['tasks'],
    access: 'client',
    success: { 200: json(ref('AttemptSnapshot'), 'The attempt as recorded.') },
    errors: ['not_found'],
  },
  getTaskHistory: {
    summary: 'Task history',
    tags: ['tasks'],
    access: 'client',
    query: [
      {
        name: 'after_sequence',
        description: 'Return records after this sequence (default 0).',
        schema: SAFE_COUNTER,
      },
    ],
    success: { 200: json(ref('TaskHistory'), 'At most 100 records, in order.') },
    errors: ['not_found'],
  },
  cancelTask: {
    summary: 'Cancel a task',
    description: 'No body is needed; a body, when sent, must be `{}`.',
    tags: ['tasks'],
    access: 'client',
    body: { schema: ref('CancelBody'), required: false },
    success: { 200: json(ref('TaskStateReply'), 'The task state afterwards.') },
    errors: ['not_found'],
  },
  subscribeCompletion: {
    summary: 'Subscribe a task to a completion callback',
    description:
      'Names an operator-configured destination alias, never a URL; an unknown alias is 400. ' +
      'Idempotent by `subscription_key`: 201 when created, 200 when the key already subscribes ' +
      'the task to the same destination, 409 `conflict` when it names another destination. ' +
      `A task has at most ${MAX_COMPLETION_SUBSCRIPTIONS} subscriptions (409 \`limit_exceeded\`). ` +
      'Subscribing to a terminal task makes its delivery due at once.',
    tags: ['completions'],
    access: 'client',
    body: { schema: ref('CompletionSubscribeCommand'), required: true },
    success: {
      201: json(ref('CompletionSubscription'), 'The subscription was created.'),
      200: json(ref('CompletionSubscription'), 'The key already names this subscription.'),
    },
    errors: ['not_found', 'conflict', 'limit_exceeded'],
  },
  listCompletionSubscriptions: {
    summary: "A task's completion subscriptions",
    tags: ['completions'],
    access: 'client',
    success: {
      200: json(ref('CompletionSubscriptionList'), 'Oldest first, with their delivery state.'),
    },
    errors: ['not_found'],
  },
  redeliverCompletion: {
    summary: 'Redeliver a completion event',
    description:
      'Names the generation being retried: the current generation, once delivered or ' +
      'exhausted, starts the next one (the same event); the previous generation answers the ' +
      'subscription unchanged, so a repeated request starts nothing twice; anything else is ' +
      '409 `conflict`. Beyond the last generation allowed is 409 `limit_exceeded`.',
    tags: ['completions'],
    access: 'client',
    body: { schema: ref('CompletionRetryCommand'), required: true },
    success: { 200: json(ref('CompletionSubscription'), 'The subscription afterwards.') },
    errors: ['not_found', 'conflict', 'limit_exceeded'],
  },
  getRetentionPolicy: {
    summary: "The namespace's retention policy (admin)",
    description: "Its own policy, or the server's default (`source`).",
    tags: ['retention'],
    access: 'admin',
    success: { 200: json(ref('RetentionPolicy'), 'The policy in force.') },
    errors: [],
  },
  setRetentionPolicy: {
    summary: "Set the namespace's retention policy (admin)",
    description:
      'A terminal task is kept `retention_ms` after it became terminal and after its latest ' +
      `callback activity, whichever is later: ${MIN_RETENTION_MS}..${MAX_RETENTION_MS} ms. ` +
      'Tasks the policy in force had already retired when this one is set stay collectable ' +
      'however long the new policy is.',
    tags: ['retention'],
    access: 'admin',
    body: { schema: ref('SetRetentionPolicyCommand'), required: true },
    success: { 200: json(ref('RetentionPolicy'), 'The policy now in force.') },
    errors: [],
  },
  previewRetention: {
    summary: 'Preview the next retention collection (admin)',
    description:
      'Counts the age candidates of the next collection, up to `limit`. Pending or recent ' +
      'callbacks can defer a candidate, so a candidate is not a promise of removal.',
    tags: ['retention'],
    access: 'admin',
    query: [
      {
        name: 'limit',
        description: `Count at most this many candidates (default ${MAX_RETENTION_BATCH}).`,
        schema: { type: 'integer', minimum: 1, maximum: MAX_RETENTION_BATCH },
      },
    ],
    success: { 200: json(ref('RetentionPreview'), 'Bounded age candidates.') },
    errors: [],
  },
  openSession: {
    summary: 'Open a worker session',
    tags: ['worker'],
    access: 'worker',
    body: { schema: ref('OpenSessionCommand'), required: true },
    success: { 200: json(ref('WorkerSession'), 'The new session.') },
    errors: [],
  },
  extendSession: {
    summary: 'Extend a worker session',
    description:
      "The body `{scope}` names the session's scope; it may be left out (DESIGN §6: no body), " +
      "and the session's own scope is used: one the API key may not use is `session_not_found`, " +
      'as a foreign session is.',
    tags: ['worker'],
    access: 'worker',
    body: { schema: ref('ExtendSessionBody'), required: false },
    success: { 200: json(ref('WorkerSession'), 'The session with its new expiry.') },
    errors: ['session_not_found', 'session_expired'],
  },
  acquire: {
    summary: 'Acquire a task (long poll)',
    tags: ['worker'],
    access: 'worker',
    query: [WAIT_MS],
    body: { schema: ref('AcquireCommand'), required: true },
    success: { 200: json(ref('AcquireReply'), 'empty, assigned or ownership_lost.') },
    errors: ['session_not_found', 'session_expired', 'sequence_conflict', 'consumer_busy'],
  },
  acquireBatch: {
    summary: 'Acquire for many slots of one session',
    description: BATCH_BODY,
    tags: ['worker'],
    access: 'worker',
    query: [WAIT_MS],
    body: { schema: ref('AcquireBatchRequest'), required: true },
    success: { 200: json(ref('AcquireBatchReply'), 'One reply or problem per command.') },
    errors: [],
  },
  renew: {
    summary: 'Renew a lease',
    description:
      'The last sequence again returns the current authority without extending twice; the last ' +
      'sequence with another `intent` is 409 `conflict`; any sequence but the last and the next ' +
      'is 409 `sequence_conflict`.',
    tags: ['worker'],
    access: 'worker',
    body: { schema: ref('RenewCommand'), required: true },
    success: { 200: json(ref('Authority'), 'The current authority.') },
    errors: ['not_found', 'conflict', 'sequence_conflict', 'ownership_lost'],
  },
  renewBatch: {
    summary: 'Renew many leases',
    description: BATCH_BODY,
    tags: ['worker'],
    access: 'worker',
    body: { schema: ref('RenewBatchRequest'), required: true },
    success: { 200: json(ref('RenewBatchReply'), 'One authority or problem per command.') },
    errors: [],
  },
  settle: {
    summary: 'Settle an attempt',
    tags: ['worker'],
    access: 'worker',
    body: { schema: ref('SettleCommand'), required: true },
    success: { 200: json(ref('SettleReply'), 'The receipt (already_accepted on replay).') },
    errors: ['not_found', 'conflict', 'ownership_lost'],
  },
  settleBatch: {
    summary: 'Settle many attempts',
    description: BATCH_BODY,
    tags: ['worker'],
    access: 'worker',
    body: { schema: ref('SettleBatchRequest'), required: true },
    success: { 200: json(ref('SettleBatchReply'), 'One reply or problem per command.') },
    errors: [],
  },
  confirmQuiescence: {
    summary: 'Confirm cleanup of a settled attempt',
    tags: ['worker'],
    access: 'worker',
    body: { schema: ref('LeaseOwner'), required: true },
    success: { 200: json(ref('TaskStateReply'), 'The task state afterwards.') },
    errors: ['not_found', 'conflict', 'ownership_lost'],
  },
  health: {
    summary: 'Liveness',
    tags: ['operations'],
    access: 'public',
    success: {
      200: json(
        { type: 'object', properties: { status: { const: 'ok' } }, required: ['status'] },
        'The process is alive.',
      ),
    },
    errors: [],
  },
  ready: {
    summary: 'Readiness (database reachable, migrations current)',
    tags: ['operations'],
    access: 'public',
    success: {
      200: json(
        { type: 'object', properties: { status: { const: 'ready' } }, required: ['status'] },
        'Ready to take traffic.',
      ),
    },
    errors: ['unavailable'],
  },
  metrics: {
    summary: 'Prometheus metrics',
    tags: ['operations'],
    access: 'public',
    success: {
      200: {
        description: 'Prometheus text exposition.',
        schema: { type: 'string' },
        contentType: 'text/plain',
      },
    },
    errors: ['not_found'],
  },
  openapi: {
    summary: 'This OpenAPI document',
    tags: ['operations'],
    access: 'public',
    success: { 200: json({ type: 'object' }, 'OpenAPI 3.1.') },
    errors: [],
  },
} satisfies Record<string, RouteDoc>;

/** The operation id of a documented route. */
export type OperationId = keyof typeof ROUTES;

/** The error codes every authenticated route may answer, whatever it does. */
const COMMON_ERRORS: readonly ErrorCode[] = [
  'invalid_input',
  'unauthorized',
  'forbidden',
  'unavailable',
];
/**
 * The error codes of a public route: in development mode (no API keys) the server answers every
 * route, these included, 403 `forbidden` (reason `host_not_loopback`) when the request names a
 * host that is not loopback (app.ts, against DNS rebinding).
 */
const PUBLIC_ERRORS: readonly ErrorCode[] = ['forbidden'];
/** The error codes of reading a body. */
const BODY_ERRORS: readonly ErrorCode[] = ['payload_too_large', 'unsupported_media_type'];
/**
 * The error codes the server's edge answers any request with, before a route is known
 * (apps/server listener.ts): 400 for bytes that are not HTTP/1.1, an `Expect` other than
 * 100-continue or a bad `Host`, 413 for a header block past REQUEST_HEADER_MAX_BYTES.
 */
const EDGE_ERRORS: readonly ErrorCode[] = ['invalid_input', 'payload_too_large'];

/** The error codes a route may answer, in status order. */
export function routeErrors(id: OperationId): ErrorCode[] {
  const doc: RouteDoc = ROUTES[id];
  const codes = new Set<ErrorCode>(doc.access === 'public' ? PUBLIC_ERRORS : COMMON_ERRORS);
  for (const code of EDGE_ERRORS) codes.add(code);
  if (doc.body !== undefined) for (const code of BODY_ERRORS) codes.add(code);
  for (const code of doc.errors) codes.add(code);
  return [...codes].sort((a, b) => ERROR_STATUS[a] - ERROR_STATUS[b] || a.localeCompare(b));
}

function errorResponses(id: OperationId): Record<string, unknown> {
  const byStatus = new Map<number, ErrorCode[]>();
  for (const code of routeErrors(id)) {
    const status = ERROR_STATUS[code];
    byStatus.set(status, [...(byStatus.get(status) ?? []), code]);
  }
  const responses: Record<string, unknown> = {};
  for (const [status, codes] of byStatus) {
    responses[String(status)] = {
      description: `Problem: ${codes.map((code) => `\`${code}\``).join(', ')}.`,
      headers: {
        ...REQUEST_ID_REPLY_HEADER,
        ...(status === 401 ? { 'WWW-Authenticate': { schema: { type: 'string' } } } : {}),
        ...(status === ERROR_STATUS.unsupported_media_type
          ? {
              'Accept-Encoding': {
                description:
                  '`identity`, when the body was refused for its `Content-Encoding` (`reason` ' +
                  '`content_encoding`): the server reads bodies as sent.',
                schema: { type: 'string' },
              },
            }
          : {}),
      },
      content: {
        [PROBLEM_CONTENT_TYPE]: {
          schema: {
            allOf: [ref('Problem'), { type: 'object', properties: { code: { enum: codes } } }],
          },
        },
      },
    };
  }
  return responses;
}

/** The request id a request may carry (app.ts keeps it, else makes one). */
const REQUEST_ID_PARAMETER: QueryParameter = {
  name: 'X-Request-Id',
  description:
    "The caller's id for this request, kept (in the log and on the reply) when it matches the " +
    'pattern; otherwise the server gives the request a UUID.',
  schema: { type: 'string', pattern: REQUEST_ID_PATTERN.source },
};

/** The request id every reply carries. */
const REQUEST_ID_REPLY_HEADER: JsonSchema = {
  'X-Request-Id': {
    description: "The request's id: the caller's `X-Request-Id` when it was kept, else a UUID.",
    schema: { type: 'string' },
  },
};

/** The hono-openapi description of one route. */
function describeOptions(id: OperationId): DescribeRouteOptions {
  const doc: RouteDoc = ROUTES[id];
  const responses: Record<string, unknown> = {};
  for (const [status, reply] of Object.entries(doc.success)) {
    responses[status] = {
      description: reply.description,
      headers: { ...REQUEST_ID_REPLY_HEADER, ...reply.headers },
      ...(reply.schema === undefined
        ? {}
        : { content: { [reply.contentType ?? 'application/json']: { schema: reply.schema } } }),
    };
  }
  Object.assign(responses, errorResponses(id));
  const parameters = [
    ...(doc.query ?? []).map((p) => ({ in: 'query', required: false, ...p })),
    ...[...(doc.headers ?? []), REQUEST_ID_PARAMETER].map((p) => ({
      in: 'header',
      required: false,
      ...p,
    })),
  ];
  const options: Record<string, unknown> = {
    operationId: id,
    summary: doc.summary,
    tags: doc.tags,
    responses,
  };
  if (doc.description !== undefined) options.description = doc.description;
  if (doc.access === 'public') options.security = [];
  // Which role a key needs, for clients (and suites) reading the document.
  options[ACCESS_EXTENSION] = doc.access;
  if (parameters.length > 0) options.parameters = parameters;
  if (doc.body !== undefined) {
    options.requestBody = {
      required: doc.body.required,
      content: { 'application/json': { schema: doc.body.schema } },
    };
  }
  return options as DescribeRouteOptions;
}

/** The operation extension naming a route's access (`client`, `worker`, `admin` or `public`). */
export const ACCESS_EXTENSION = 'x-ledgence-access';

/** The access policy the route of operation `id` declares. */
export function routeAccess(id: OperationId): RouteAccess {
  return ROUTES[id].access;
}

/**
 * The first middleware of every route: its OpenAPI description and its
 * authorization policy in one value, so documenting a route and declaring who
 * may call it cannot be separated. At request time it records the route's
 * access for `authorize` (see policy.ts); `createHttpApp` refuses to build an
 * app with a route that lacks it.
 */
export function documentRoute(id: OperationId): MiddlewareHandler<PolicyEnv> {
  return withPolicy(routeAccess(id), describeRoute(describeOptions(id)));
}

/** The part of a generated document {@link statePathParameters} reads. */
interface OpenApiPaths {
  paths?: Record<
    string,
    Record<string, { parameters?: { in: string; name: string; schema?: unknown }[] }>
  >;
}

/**
 * Gives every path parameter the text rule app.ts checks it by. A parameter without a bound in
 * {@link PATH_PARAMETER_MAX_BYTES} is a route added without one: refused here, so the document
 * (and the app, which builds it at start) cannot leave it unstated.
 */
function statePathParameters(document: OpenApiPaths): void {
  for (const [path, operations] of Object.entries(document.paths ?? {})) {
    for (const operation of Object.values(operations)) {
      for (const parameter of operation.parameters ?? []) {
        if (parameter.in !== 'path') continue;
        const maxBytes = (PATH_PARAMETER_MAX_BYTES as Record<string, number>)[parameter.name];
        if (maxBytes === undefined) {
          throw new Error(`the path parameter ${parameter.name} of ${path} has no text bound`);
        }
        parameter.schema = identifierText(maxBytes);
      }
    }
  }
}

/** The security scheme name of API keys in the document. */
export const SECURITY_SCHEME = 'bearerAuth';

/**
 * The OpenAPI 3.1 document of `app`: every described route with its request
 * body, success reply, problem+json errors and security. Only mounted routes
 * appear, so a server without completions or retention documents neither.
 */
export async function createOpenApiDocument<E extends Env>(app: Hono<E>): Promise<unknown> {
  const document = await generateSpecs(app, {
    documentation: {
      openapi: '3.1.0',
      info: {
        title: 'Ledgence API',
        version: '1',
        description:
          'Durable tasks on PostgreSQL: submit over HTTP, lease and settle exactly once. ' +
          `Errors are RFC 9457 problem documents whose \`type\` is ${PROBLEM_TYPE_BASE}<code>.`,
      },
      components: {
        schemas: componentSchemas() as never,
        securitySchemes: {
          [SECURITY_SCHEME]: {
            type: 'http',
            scheme: 'bearer',
            description: 'An API key bound to a tenant, namespaces and roles.',
          },
        },
      },
      security: [{ [SECURITY_SCHEME]: [] }],
    },
    // No validator() is used, but keep hono-openapi from adding its own 400
    // shape (which describes an input-echoing body) to any route.
    defaultValidationErrorResponse: false,
    // `/openapi.json` looks like a static file to hono-openapi; it is a route.
    excludeStaticFile: false,
  });
  statePathParameters(document as OpenApiPaths);
  return document;
}
