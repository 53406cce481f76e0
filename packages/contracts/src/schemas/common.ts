/**
 * Shared building blocks of the wire schemas: timestamps and counters, the
 * identifier-text action, scope, trace context, program descriptor, labels,
 * application JSON, and the two helpers that give request objects their
 * "omitted or `null`" optional fields (DESIGN §3, §4.1).
 *
 * Every validation action here carries its own message, and no message
 * repeats the rejected value: decode errors name the path and the rule only.
 */
import * as v from 'valibot';
import { FORBIDDEN_JSON_KEYS } from '../json.js';
import {
  DISPATCH_MAX_BYTES,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  MAX_LABELS,
  MESSAGE_MAX_BYTES,
  NAME_MAX_BYTES,
  SCOPE_TEXT_MAX_BYTES,
} from '../limits.js';
import { isWellFormedText, textProblem, utf8ByteLength } from '../text.js';
import { keptTracestate, traceparentProblem, tracestateProblem } from '../trace.js';

// ---- Optional fields --------------------------------------------------------

/**
 * A request field that may be omitted or `null`; `null` is normalised to
 * absent (DESIGN §4.1), so a replay that spells "nothing" differently still
 * compares equal. Use inside {@link requestObject}, which removes the key.
 *
 * The pipe keeps the `nullish` schema type, so valibot still treats a missing
 * key as allowed.
 */
export function nullishOptional<
  const TSchema extends v.BaseSchema<unknown, unknown, v.BaseIssue<unknown>>,
>(schema: TSchema) {
  return v.pipe(
    v.nullish(schema),
    v.transform((value) => value ?? undefined),
  );
}

/**
 * A request field the seed serialises as present-with-`null` (an `Option`
 * without `skip_serializing_if`, e.g. `SettleCommand.processing_trace`): it
 * may be omitted or `null` on input and is normalised to `null`, so the
 * parsed command has the same shape as the one a reply echoes.
 */
export function nullishNullable<
  const TSchema extends v.BaseSchema<unknown, unknown, v.BaseIssue<unknown>>,
>(schema: TSchema) {
  return v.optional(v.nullable(schema), null);
}

/** Removes keys whose value is `undefined`: the output of a {@link nullishOptional} `null`. */
function dropUndefinedKeys<T extends object>(value: T): T {
  const record = value as Record<string, unknown>;
  for (const key of Object.keys(record)) {
    if (record[key] === undefined) delete record[key];
  }
  return value;
}

/**
 * A plain object, as json.ts defines it: its prototype is null or a realm's
 * `Object.prototype` (whose own prototype is null), so objects from another
 * realm pass and class instances do not.
 */
function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === null || Object.getPrototypeOf(proto) === null;
}

/**
 * A strict request object whose {@link nullishOptional} fields are omitted
 * from the output when they were omitted or `null` on input. Unknown fields
 * are rejected (the seed's `deny_unknown_fields`, applied to every object).
 *
 * The leading plain-object guard matters for objects whose fields are all
 * optional: valibot's object schemas accept any `typeof 'object'`, so `[]`
 * would otherwise pass as an empty object. The object's `entries` stay
 * visible on the result, as on a plain `v.strictObject`.
 */
export function requestObject<const TEntries extends v.ObjectEntries>(entries: TEntries) {
  const object = v.strictObject(entries);
  const schema = v.pipe(
    v.custom<v.InferInput<typeof object>>(isPlainObject, 'must be an object'),
    object,
    v.transform(dropUndefinedKeys),
  );
  return Object.assign(schema, { entries });
}

// ---- Numbers ------------------------------------------------------------------

/**
 * An integer in `min..max` (inclusive), both safe integers. One action, so a
 * rejection reports one message that names the whole rule.
 */
export function intRange(min: number, max: number) {
  return v.pipe(
    v.number(),
    v.check(
      (value) => Number.isSafeInteger(value) && value >= min && value <= max,
      `must be an integer from ${min} to ${max}`,
    ),
  );
}

/** UTC milliseconds since the Unix epoch, supplied by the authoritative store. */
export const TimestampSchema = v.pipe(
  v.number(),
  v.check(
    (value) => Number.isSafeInteger(value) && value >= 0,
    'must be a non-negative integer timestamp in milliseconds',
  ),
);
/** UTC milliseconds since the Unix epoch, supplied by the authoritative store. */
export type Timestamp = v.InferOutput<typeof TimestampSchema>;

/** A count, sequence or duration: an integer in `0..2^53-1` (DESIGN §4.1 "Numbers"). */
export const CounterSchema = v.pipe(
  v.number(),
  v.check(
    (value) => Number.isSafeInteger(value) && value >= 0,
    'must be a non-negative safe integer',
  ),
);
/** A count, sequence or duration: an integer in `0..2^53-1`. */
export type Counter = v.InferOutput<typeof CounterSchema>;

/** A counter that starts at one: acquire and renew command sequences, attempt ordinals. */
export const PositiveCounterSchema = v.pipe(
  v.number(),
  v.check((value) => Number.isSafeInteger(value) && value >= 1, 'must be a positive safe integer'),
);

/**
 * An array of `min..max` items: one action and one message for the whole
 * rule. A pipe action for `v.array(...)`.
 */
export function itemCount<TInput extends readonly unknown[]>(
  min: number,
  max: number,
): v.CheckAction<TInput, string> {
  return v.check<TInput, string>(
    (items) => items.length >= min && items.length <= max,
    `must hold ${min} to ${max} items`,
  );
}

// ---- Text -----------------------------------------------------------------------

/**
 * Identifier/reference text stored in indexed platform columns (seed:
 * `validate_text`): 1..`maxBytes` UTF-8 bytes, well-formed, no control
 * characters, no leading or trailing whitespace. A pipe action for `v.string()`.
 */
export function text(maxBytes: number) {
  const rule = v.rawCheck<string>(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const problem = textProblem(dataset.value, maxBytes);
    if (problem !== undefined) addIssue({ message: problem });
  });
  // Read by the OpenAPI document (packages/http), which cannot see into the check.
  return Object.assign(rule, { textMaxBytes: maxBytes });
}

/** A string schema with the {@link text} rule. */
export function textField(maxBytes: number) {
  return v.pipe(v.string(), text(maxBytes));
}

/**
 * Free text such as error messages: any characters, newlines included, but
 * well-formed Unicode (it must encode to UTF-8 losslessly) and at most
 * `maxBytes` UTF-8 bytes. Empty is allowed.
 */
export function messageField(maxBytes: number = MESSAGE_MAX_BYTES) {
  return v.pipe(
    v.string(),
    v.rawCheck<string>(({ dataset, addIssue }) => {
      if (!dataset.typed) return;
      if (!isWellFormedText(dataset.value)) addIssue({ message: 'must be well-formed Unicode' });
      else if (utf8ByteLength(dataset.value) > maxBytes) {
        addIssue({ message: `must be at most ${maxBytes} UTF-8 bytes` });
      }
    }),
  );
}

/** Queue, program and version names, and identifiers the server issues. */
export const NameSchema = textField(NAME_MAX_BYTES);

/**
 * A URI reference Ledgence writes: a CloudEvents `source` (the queue's path
 * `/v1/tenants/{t}/namespaces/{ns}/queues/{q}`) or a completion `result_ref`
 * (the task's `…/result` path), segments URI-encoded. Identifier-like text (no
 * whitespace or controls), bounded by the dispatch envelope limit, which is
 * about identifiers only and holds three fully percent-encoded names.
 */
export const UriReferenceSchema = textField(DISPATCH_MAX_BYTES);

// RFC 3339 `date-time` in UTC with an upper-case `T` and `Z`, as
// `Date.prototype.toISOString` writes it for years 0000..9999; fractions of up
// to nine digits are accepted from other writers.
const RFC3339_UTC = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.\d{1,9})?Z$/;

/**
 * Whether `value` is an RFC 3339 UTC date-time (`2024-05-01T12:00:00.000Z`)
 * naming a real calendar instant. `Date.parse` alone is not enough: it rolls
 * `02-30` over into March. Leap seconds (`:60`) are rejected, because no
 * store timestamp can name one.
 */
export function isRfc3339UtcTime(value: string): boolean {
  const match = RFC3339_UTC.exec(value);
  if (match === null) return false;
  const [year, month, day, hour, minute, second] = match.slice(1, 7).map(Number) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  if (month < 1 || month > 12 || hour > 23 || minute > 59 || second > 59) return false;
  // setUTCFullYear takes the year literally (Date.UTC would map 0..99 to 19xx)
  // and rolls an impossible day over, which the comparison below detects.
  const date = new Date(0);
  date.setUTCFullYear(year, month - 1, day);
  return date.getUTCMonth() === month - 1 && date.getUTCDate() === day;
}

/** A CloudEvents `time`: an RFC 3339 UTC date-time string (see {@link isRfc3339UtcTime}). */
export const Rfc3339TimeSchema = v.pipe(
  v.string(),
  v.check(isRfc3339UtcTime, 'must be an RFC 3339 UTC date-time such as 2024-05-01T12:00:00.000Z'),
);

// ---- Scope, trace, program ----------------------------------------------------

/** The tenant and namespace every task, session and subscription belongs to. */
export const ScopeSchema = v.strictObject({
  tenant_id: textField(SCOPE_TEXT_MAX_BYTES),
  namespace: textField(SCOPE_TEXT_MAX_BYTES),
});
/** The tenant and namespace every task, session and subscription belongs to. */
export type Scope = v.InferOutput<typeof ScopeSchema>;

/** A W3C `traceparent` value (version-traceid-parentid-flags, lowercase hex). */
export const TraceparentSchema = v.pipe(
  v.string(),
  v.rawCheck<string>(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const problem = traceparentProblem(dataset.value);
    if (problem !== undefined) addIssue({ message: problem });
  }),
);

/** A W3C `tracestate` value: at most 512 characters and 32 distinct `key=value` members. */
export const TracestateSchema = v.pipe(
  v.string(),
  v.rawCheck<string>(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const problem = tracestateProblem(dataset.value);
    if (problem !== undefined) addIssue({ message: problem });
  }),
);

/**
 * Origin and processing contexts have the same wire format but different
 * lifetimes. Used in requests and replies alike, so `tracestate` follows the
 * request rule (omitted or `null`, normalised to omitted); one with no member
 * (W3C: accepted, not to be sent) is normalised to omitted too.
 */
export const TraceContextSchema = requestObject({
  traceparent: TraceparentSchema,
  tracestate: v.pipe(nullishOptional(TracestateSchema), v.transform(keptTracestate)),
});
/** Origin and processing contexts have the same wire format but different lifetimes. */
export type TraceContext = v.InferOutput<typeof TraceContextSchema>;

/**
 * Which handler runs the task: always the object `{name, version?}` on the
 * wire (DESIGN §4.1). Used in requests and replies alike (request rule for
 * `version`).
 */
export const ProgramDescriptorSchema = requestObject({
  name: NameSchema,
  version: nullishOptional(NameSchema),
});
/** Which handler runs the task. */
export type ProgramDescriptor = v.InferOutput<typeof ProgramDescriptorSchema>;

// ---- Labels --------------------------------------------------------------------

/**
 * Keys the strict JSON decoder rejects anywhere (json.ts), rejected here too so
 * a value checked in memory (by the SDK) meets the same rule as one decoded
 * from bytes (by the server).
 */
const RESERVED_KEYS: ReadonlySet<string> = new Set(FORBIDDEN_JSON_KEYS);

/**
 * Task labels: at most {@link MAX_LABELS} pairs of identifier text (keys
 * ≤ {@link LABEL_KEY_MAX_BYTES}, values ≤ {@link LABEL_VALUE_MAX_BYTES} UTF-8
 * bytes), exact-match filters for listing.
 *
 * Written by hand rather than with `v.record`, which silently drops the keys
 * `__proto__`, `constructor` and `prototype`: a label must never vanish, so
 * those are rejected instead. The output is a fresh object built with
 * `Object.fromEntries`, which defines every key as data. A bad key is
 * reported at the labels path without repeating the key.
 */
export const LabelsSchema = v.pipe(
  v.custom<Record<string, string>>(isPlainObject, 'must be an object of string labels'),
  v.rawCheck<Record<string, string>>(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const labels = dataset.value;
    const keys = Object.keys(labels);
    if (keys.length > MAX_LABELS) {
      addIssue({ message: `must hold at most ${MAX_LABELS} labels` });
      return;
    }
    for (const key of keys) {
      const keyProblem = RESERVED_KEYS.has(key)
        ? 'is a reserved name'
        : textProblem(key, LABEL_KEY_MAX_BYTES);
      if (keyProblem !== undefined) {
        addIssue({ message: `has a label key that ${keyProblem}` });
        continue;
      }
      const value: unknown = labels[key];
      const valueProblem = textProblem(value, LABEL_VALUE_MAX_BYTES);
      if (valueProblem !== undefined) {
        addIssue({
          message: valueProblem,
          path: [{ type: 'object', origin: 'value', input: labels, key, value }],
        });
      }
    }
  }),
  v.transform((labels): Record<string, string> => Object.fromEntries(Object.entries(labels))),
);
/** Task labels: at most 16 exact-match key/value pairs. */
export type Labels = v.InferOutput<typeof LabelsSchema>;

// ---- Application JSON ---------------------------------------------------------

/**
 * Application JSON (`data`, `output`, error `details`): any JSON value,
 * `null` included. The schema only requires the value to be present; its
 * plain-JSON shape, depth (≤ 64) and compact size are checked by the decode
 * functions with `checkJsonValue`, because those rejections carry their own
 * error codes (`payload_too_large`) that a schema issue cannot.
 */
export const JsonValueSchema = v.pipe(
  v.unknown(),
  v.check((value) => value !== undefined, 'must be a JSON value'),
);
/** Application JSON: any JSON value. */
export type JsonValue = v.InferOutput<typeof JsonValueSchema>;
