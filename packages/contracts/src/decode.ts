/**
 * Per-command decoders: the one strict path every command body takes at the
 * edge (DESIGN §1 principle 4, §4.1). Each decoder checks the byte limit of
 * its route, decodes strict JSON (duplicate keys, unsafe numbers, lone
 * surrogates and excess depth rejected), validates the schema (unknown fields
 * rejected, text and number rules), then checks application JSON (`data`,
 * `output`, error `details`) for plain-JSON shape, depth and size.
 *
 * Every rejection is a {@link ContractError}: schema failures are
 * `invalid_input` with reason `schema` and the JSON path of the offending
 * value; messages name the path and the rule, never the rejected value.
 */
import * as v from 'valibot';
import { batchListTooLong, ItemDecodeFailure, itemsDecodedAlone } from './batch-items.js';
import { compiledOnReuse, REJECTED } from './compile.js';
import { ContractError } from './errors.js';
import { appendJsonPath, checkJsonValue, decodeStrictJson, type JsonInput } from './json.js';
import {
  BATCH_MAX_BYTES,
  COMMAND_MAX_DEPTH,
  COMPLETION_COMMAND_MAX_BYTES,
  CONTROL_REQUEST_MAX_BYTES,
  DISPATCH_MAX_BYTES,
  JSON_MAX_DEPTH,
  KEY_MAX_BYTES,
  MAX_SESSION_CONCURRENCY,
  MAX_SUBMIT_BATCH,
  MAX_WORKER_BATCH,
  OUTPUT_MAX_BYTES,
  SETTLEMENT_MAX_BYTES,
  SUBMISSION_DATA_MAX_BYTES,
  SUBMISSION_MAX_BYTES,
  TASK_STATUS_MAX_BYTES,
} from './limits.js';
import {
  type AcquireCommand,
  AcquireCommandSchema,
  type CompletionRetryCommand,
  CompletionRetryCommandSchema,
  type CompletionSubscribeCommand,
  CompletionSubscribeCommandSchema,
  itemCount,
  type LeaseOwner,
  LeaseOwnerSchema,
  type OpenSessionCommand,
  OpenSessionCommandSchema,
  type RenewCommand,
  RenewCommandSchema,
  type SetRetentionPolicyCommand,
  SetRetentionPolicyCommandSchema,
  type SettleCommand,
  SettleCommandSchema,
  type SubmitCommand,
  SubmitCommandSchema,
  SubmitRequestBodySchema,
  type SubmitTask,
  SubmitTaskSchema,
} from './schemas/index.js';
import { taskStatusMaxBytes } from './status.js';
import { textProblem } from './text.js';

// ---- Issues to errors ---------------------------------------------------------

/** How a valibot `expected` token reads in a sentence. */
const EXPECTED_PHRASES: Readonly<Record<string, string>> = {
  Object: 'an object',
  Array: 'an array',
  string: 'a string',
  number: 'a number',
  boolean: 'a boolean',
  null: 'null',
  undefined: 'absent',
};

function expectedPhrase(expected: string | null): string {
  if (expected === null || expected.length === 0) return 'of another type';
  // valibot writes alternatives as `(a | b)`.
  const inner =
    expected.startsWith('(') && expected.endsWith(')') ? expected.slice(1, -1) : expected;
  return inner
    .split(' | ')
    .map((part) => EXPECTED_PHRASES[part] ?? part)
    .join(' or ');
}

/** The JSON path of `items` below `prefix`, in the notation of json.ts. */
function pathOf(prefix: string, items: readonly v.IssuePathItem[]): string {
  let path = prefix;
  for (const item of items) {
    const key: unknown = item.key;
    if (typeof key === 'string' || typeof key === 'number') path = appendJsonPath(path, key);
  }
  return path;
}

/**
 * Where an issue is and what is wrong there, without the rejected value.
 * Validation actions and custom schemas in ./schemas all carry messages
 * written that way; valibot's own schema messages quote the received value,
 * so schema issues are described here from their structure instead.
 */
function locateIssue(prefix: string, issue: v.BaseIssue<unknown>): [path: string, problem: string] {
  const items = issue.path ?? [];
  const path = pathOf(prefix, items);
  if (issue.kind !== 'schema' || issue.type === 'custom') return [path, issue.message];
  const last = items[items.length - 1];
  if (last !== undefined && last.origin === 'key') {
    // valibot's object schemas take an array for an object and then miss its
    // keys; the real problem is the container, so report it there.
    if (Array.isArray(last.input)) return [pathOf(prefix, items.slice(0, -1)), 'must be an object'];
    return [path, issue.expected === 'never' ? 'is not an allowed field' : 'is required'];
  }
  if (issue.type === 'union') return [path, 'does not match any allowed shape'];
  return [path, `must be ${expectedPhrase(issue.expected)}`];
}

/**
 * Parses `value` with `schema`, returning its (normalised) output or throwing
 * an `invalid_input` {@link ContractError} with reason `schema` for the first
 * problem found, at its JSON path below `pathPrefix` (e.g. `$.commands[2]`
 * gives `$.commands[2].owner.lease_id`). For other packages too, e.g. the
 * HTTP layer validating a query object.
 *
 * @example
 * parseWith(TaskListQuerySchema, { filters: {}, limit: 0 }, '$');
 * // throws: "$.limit must be an integer from 1 to 500"
 */
export function parseWith<const TSchema extends v.GenericSchema>(
  schema: TSchema,
  value: unknown,
  pathPrefix = '$',
): v.InferOutput<TSchema> {
  // The compiled schema accepts exactly what valibot accepts, with valibot's output; only a
  // rejection needs valibot itself, to say what is wrong and where (compile.ts). A schema's
  // first use, and every use without code generation (a runtime that forbids it), is valibot's.
  const compiled = compiledOnReuse(schema);
  const accepted = compiled === undefined ? REJECTED : compiled(value);
  if (accepted !== REJECTED) return accepted as v.InferOutput<TSchema>;
  // abortEarly: only the first issue is reported, so stop looking after it.
  const result = v.safeParse(schema, value, { abortEarly: true });
  if (result.success) return result.output;
  const [path, problem] = locateIssue(pathPrefix, result.issues[0]);
  throw new ContractError('invalid_input', `${path} ${problem}`, {
    reason: 'schema',
    path,
  });
}

// ---- Application JSON ---------------------------------------------------------

/**
 * The size rules of a submitted task: `data` as plain JSON within SUBMISSION_DATA_MAX_BYTES and
 * depth 64, and the task's status within TASK_STATUS_MAX_BYTES at its largest (status.ts). Each
 * is a computed size, not a byte count of the body, so both are `payload_too_large` as the
 * completion event's limit is (cloudevent.ts).
 */
function checkSubmitSizes(task: SubmitTask, path: string): void {
  checkJsonValue(task.data, {
    maxBytes: SUBMISSION_DATA_MAX_BYTES,
    maxDepth: JSON_MAX_DEPTH,
    path: `${path}.data`,
  });
  const statusBytes = taskStatusMaxBytes(task);
  if (statusBytes > TASK_STATUS_MAX_BYTES) {
    throw new ContractError(
      'payload_too_large',
      `${path} would give the task a status of up to ${statusBytes} bytes, more than ` +
        `${TASK_STATUS_MAX_BYTES}: its labels, queue and program (JSON-encoded) must be smaller`,
      { reason: 'status_too_large', path },
    );
  }
}

function checkSettlePayloads(command: SettleCommand, path: string): void {
  if (command.report.kind !== 'completed') return;
  const outcome = command.report.report.outcome;
  const at = `${path}.report.report.outcome`;
  if (outcome.kind === 'success') {
    checkJsonValue(outcome.output, {
      maxBytes: OUTPUT_MAX_BYTES,
      maxDepth: JSON_MAX_DEPTH,
      path: `${at}.output`,
    });
  } else if (outcome.error.details !== undefined) {
    checkJsonValue(outcome.error.details, {
      maxBytes: OUTPUT_MAX_BYTES,
      maxDepth: JSON_MAX_DEPTH,
      path: `${at}.error.details`,
    });
  }
}

/**
 * Validates a SubmitTask built in memory or decoded from JSON: the schema,
 * then `data` as plain JSON of at most SUBMISSION_DATA_MAX_BYTES compact
 * bytes and depth 64, and the task's largest status within
 * TASK_STATUS_MAX_BYTES (`payload_too_large` when larger). Returns the
 * normalised task. The submit decoders run the same checks.
 *
 * @param path - the task's JSON path in its command, for error paths.
 */
export function validateSubmitTask(task: unknown, path = '$.input'): SubmitTask {
  const parsed = parseWith(SubmitTaskSchema, task, path);
  checkSubmitSizes(parsed, path);
  return parsed;
}

/**
 * Validates a SubmitCommand built in memory or decoded from JSON; see
 * {@link validateSubmitTask}. Returns the normalised command.
 */
export function validateSubmitCommand(command: unknown, path = '$'): SubmitCommand {
  const parsed = parseWith(SubmitCommandSchema, command, path);
  checkSubmitSizes(parsed.input, `${path}.input`);
  return parsed;
}

/**
 * Validates a SettleCommand built in memory or decoded from JSON: the schema,
 * then a success `output` or an application error's `details` as plain JSON
 * of at most OUTPUT_MAX_BYTES and depth 64. Returns the normalised command.
 */
export function validateSettleCommand(command: unknown, path = '$'): SettleCommand {
  const parsed = parseWith(SettleCommandSchema, command, path);
  checkSettlePayloads(parsed, path);
  return parsed;
}

// ---- Single commands ------------------------------------------------------------

function decodeJson(bytes: JsonInput, maxBytes: number): unknown {
  return decodeStrictJson(bytes, { maxBytes, maxDepth: COMMAND_MAX_DEPTH });
}

/** `POST {scope}/tasks` with the key in the body: a full SubmitCommand (≤ SUBMISSION_MAX_BYTES). */
export function decodeSubmitCommand(bytes: JsonInput): SubmitCommand {
  return validateSubmitCommand(decodeJson(bytes, SUBMISSION_MAX_BYTES));
}

/**
 * The body of `POST {scope}/tasks` as HTTP receives it (DESIGN §6). Without
 * an `Idempotency-Key` header the body is a full SubmitCommand. With one, the
 * body is `{input, origin_trace?}` and the header supplies the key; a body
 * that also names `idempotency_key` is rejected, so a key is never silently
 * chosen between two sources. The header follows the key's text rule.
 */
export function decodeSubmitRequest(
  bytes: JsonInput,
  idempotencyKeyHeader?: string,
): SubmitCommand {
  if (idempotencyKeyHeader === undefined) return decodeSubmitCommand(bytes);
  const problem = textProblem(idempotencyKeyHeader, KEY_MAX_BYTES);
  if (problem !== undefined) {
    throw new ContractError('invalid_input', `the Idempotency-Key header ${problem}`, {
      reason: 'invalid_text',
    });
  }
  const value = decodeJson(bytes, SUBMISSION_MAX_BYTES);
  if (typeof value === 'object' && value !== null && Object.hasOwn(value, 'idempotency_key')) {
    throw new ContractError(
      'invalid_input',
      '$.idempotency_key must not be given together with the Idempotency-Key header',
      { reason: 'idempotency_key_conflict', path: '$.idempotency_key' },
    );
  }
  const body = parseWith(SubmitRequestBodySchema, value);
  checkSubmitSizes(body.input, '$.input');
  const command: SubmitCommand = { idempotency_key: idempotencyKeyHeader, input: body.input };
  if (body.origin_trace !== undefined) command.origin_trace = body.origin_trace;
  return command;
}

/** `POST /v1/worker/sessions` (≤ CONTROL_REQUEST_MAX_BYTES). */
export function decodeOpenSessionCommand(bytes: JsonInput): OpenSessionCommand {
  return parseWith(OpenSessionCommandSchema, decodeJson(bytes, CONTROL_REQUEST_MAX_BYTES));
}

/**
 * `POST /v1/worker/acquire` (≤ DISPATCH_MAX_BYTES, the seed's claim-command limit: its four
 * names of at most 128 bytes fit however a client escapes them).
 */
export function decodeAcquireCommand(bytes: JsonInput): AcquireCommand {
  return parseWith(AcquireCommandSchema, decodeJson(bytes, DISPATCH_MAX_BYTES));
}

/** `POST /v1/worker/renew` (≤ CONTROL_REQUEST_MAX_BYTES). */
export function decodeRenewCommand(bytes: JsonInput): RenewCommand {
  return parseWith(RenewCommandSchema, decodeJson(bytes, CONTROL_REQUEST_MAX_BYTES));
}

/** `POST /v1/worker/quiescence`: the lease owner confirming cleanup (≤ CONTROL_REQUEST_MAX_BYTES). */
export function decodeLeaseOwner(bytes: JsonInput): LeaseOwner {
  return parseWith(LeaseOwnerSchema, decodeJson(bytes, CONTROL_REQUEST_MAX_BYTES));
}

/**
 * `POST /v1/worker/settle` (≤ SETTLEMENT_MAX_BYTES). Preserves JSON numbers
 * and rejects duplicate keys before constructing a report; the lifecycle core
 * also checks its identity against the attempt.
 */
export function decodeSettleCommand(bytes: JsonInput): SettleCommand {
  return validateSettleCommand(decodeJson(bytes, SETTLEMENT_MAX_BYTES));
}

/** `POST {scope}/tasks/{task_id}/completion-subscriptions` (≤ COMPLETION_COMMAND_MAX_BYTES). */
export function decodeCompletionSubscribeCommand(bytes: JsonInput): CompletionSubscribeCommand {
  return parseWith(
    CompletionSubscribeCommandSchema,
    decodeJson(bytes, COMPLETION_COMMAND_MAX_BYTES),
  );
}

/** `POST {scope}/completion-subscriptions/{id}/redeliver` (≤ COMPLETION_COMMAND_MAX_BYTES). */
export function decodeCompletionRetryCommand(bytes: JsonInput): CompletionRetryCommand {
  return parseWith(CompletionRetryCommandSchema, decodeJson(bytes, COMPLETION_COMMAND_MAX_BYTES));
}

/** `PUT {scope}/retention-policy` (≤ CONTROL_REQUEST_MAX_BYTES). */
export function decodeSetRetentionPolicyCommand(bytes: JsonInput): SetRetentionPolicyCommand {
  return parseWith(SetRetentionPolicyCommandSchema, decodeJson(bytes, CONTROL_REQUEST_MAX_BYTES));
}

// ---- Batches --------------------------------------------------------------------

/** One item of a batch: its decoded command, or why that item alone was rejected. */
export type DecodedItem<T> = { ok: true; value: T } | { ok: false; error: ContractError };

function batchEnvelope(maxItems: number) {
  return {
    maxItems,
    schema: v.strictObject({
      commands: v.pipe(v.array(v.unknown()), itemCount(1, maxItems)),
    }),
  };
}

const SUBMIT_BATCH_ENVELOPE = batchEnvelope(MAX_SUBMIT_BATCH);
const ACQUIRE_BATCH_ENVELOPE = batchEnvelope(MAX_SESSION_CONCURRENCY);
const WORKER_BATCH_ENVELOPE = batchEnvelope(MAX_WORKER_BATCH);

/**
 * The whole body must be JSON `{commands: [...]}` within BATCH_MAX_BYTES and its
 * item bound, or the request fails as a whole; then each item is validated on
 * its own (DESIGN §6), in request order — the strict-JSON value rules included:
 * an item with a duplicate key or a number beyond ±(2^53−1) is its own problem
 * (batch-items.ts).
 */
function decodeBatch<T>(
  bytes: JsonInput,
  envelope: ReturnType<typeof batchEnvelope>,
  decodeItem: (item: unknown, path: string) => T,
): DecodedItem<T>[] {
  // Before the decode, which would read every item of a body of millions (batch-items.ts).
  if (batchListTooLong(bytes, envelope.maxItems, BATCH_MAX_BYTES)) {
    throw new ContractError(
      'invalid_input',
      `$.commands must hold 1 to ${envelope.maxItems} items: this body holds a list of more`,
      { reason: 'schema', path: '$.commands' },
    );
  }
  let root: unknown;
  try {
    root = decodeJson(bytes, BATCH_MAX_BYTES);
  } catch (error) {
    const items = itemsDecodedAlone(bytes, error, {
      maxBytes: BATCH_MAX_BYTES,
      maxDepth: COMMAND_MAX_DEPTH,
    });
    if (items === undefined) throw error;
    root = { commands: items };
  }
  const body = parseWith(envelope.schema, root);
  return body.commands.map((item, index): DecodedItem<T> => {
    if (item instanceof ItemDecodeFailure) return { ok: false, error: item.error };
    try {
      return { ok: true, value: decodeItem(item, `$.commands[${index}]`) };
    } catch (error) {
      if (error instanceof ContractError) return { ok: false, error };
      throw error;
    }
  });
}

/** `POST {scope}/tasks:batch`: 1..MAX_SUBMIT_BATCH submit commands, each decoded on its own. */
export function decodeSubmitBatch(bytes: JsonInput): DecodedItem<SubmitCommand>[] {
  return decodeBatch(bytes, SUBMIT_BATCH_ENVELOPE, validateSubmitCommand);
}

/** `POST /v1/worker/acquire:batch`: 1..MAX_SESSION_CONCURRENCY acquire commands. */
export function decodeAcquireBatch(bytes: JsonInput): DecodedItem<AcquireCommand>[] {
  return decodeBatch(bytes, ACQUIRE_BATCH_ENVELOPE, (item, path) =>
    parseWith(AcquireCommandSchema, item, path),
  );
}

/** `POST /v1/worker/renew:batch`: 1..MAX_WORKER_BATCH renew commands. */
export function decodeRenewBatch(bytes: JsonInput): DecodedItem<RenewCommand>[] {
  return decodeBatch(bytes, WORKER_BATCH_ENVELOPE, (item, path) =>
    parseWith(RenewCommandSchema, item, path),
  );
}

/** `POST /v1/worker/settle:batch`: 1..MAX_WORKER_BATCH settle commands. */
export function decodeSettleBatch(bytes: JsonInput): DecodedItem<SettleCommand>[] {
  return decodeBatch(bytes, WORKER_BATCH_ENVELOPE, validateSettleCommand);
}
