/**
 * Query strings, decoded as strictly as bodies: every route names the
 * parameters it takes, an unknown or repeated parameter is `invalid_input`,
 * numbers are plain decimal digits, and no message repeats a value.
 */
import {
  ContractError,
  parseWith,
  readTaskCursor,
  type TaskListQuery,
  TaskListQuerySchema,
} from '@ledgence/contracts';

/** The query parameters of the task list route; `label.<key>` may repeat with different keys. */
export const LIST_QUERY_PARAMETERS = [
  'state',
  'queue',
  'program',
  'submitted_from',
  'submitted_until',
  'workflow_id',
  'limit',
  'cursor',
] as const;

/** The prefix of a label filter parameter: `label.team=red`. */
export const LABEL_PREFIX = 'label.';

const DIGITS = /^\d+$/;
const LEADING_ZEROS = /^0+(?=\d)/;

/**
 * The value of a string of decimal digits, leading zeros and all (`005` is 5, however many
 * zeros): `Infinity` past 16 significant digits, which is past 2^53−1 either way, so a long
 * string is not parsed.
 */
function digitsValue(digits: string): number {
  const significant = digits.replace(LEADING_ZEROS, '');
  return significant.length > 16 ? Number.POSITIVE_INFINITY : Number(significant);
}

function queryError(message: string, parameter?: string): ContractError {
  return new ContractError(
    'invalid_input',
    message,
    parameter === undefined ? { reason: 'query' } : { reason: 'query', path: `query.${parameter}` },
  );
}

/** A parameter as a message may name it: only names the route defines are repeated. */
function describe(name: string, allowed: readonly string[]): string {
  return allowed.includes(name) ? `the query parameter ${name}` : 'a query parameter';
}

// A `%` not followed by two hex digits stands for itself (WHATWG `application/x-www-form-urlencoded`).
const LONE_PERCENT = /%(?![0-9A-Fa-f]{2})/g;

/**
 * One name or value of a query, decoded as `URLSearchParams` decodes it (`+` is a space, a lone
 * `%` stands for itself) except that escaped bytes must be UTF-8: `URLSearchParams` turns
 * `%FF`, a Latin-1 `%E9` or an escaped surrogate into U+FFFD, so distinct malformed filters
 * would silently match a task labelled U+FFFD. A body with such bytes is refused; so is this.
 */
function decodeComponent(raw: string): string {
  try {
    return decodeURIComponent(raw.replaceAll('+', ' ').replace(LONE_PERCENT, '%25'));
  } catch {
    throw queryError('a query parameter is not percent-encoded UTF-8 text');
  }
}

/** The query's (name, value) pairs in order, as `URLSearchParams` splits them, strictly decoded. */
function queryPairs(url: URL): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  for (const part of url.search.slice(1).split('&')) {
    if (part.length === 0) continue;
    const equals = part.indexOf('=');
    const name = equals < 0 ? part : part.slice(0, equals);
    const value = equals < 0 ? '' : part.slice(equals + 1);
    pairs.push([decodeComponent(name), decodeComponent(value)]);
  }
  return pairs;
}

/**
 * The query of `url` as a map of single values. Throws `invalid_input` for a
 * parameter not in `allowed` (unless `allowPrefix` matches it), for a
 * parameter given twice, and for escaped bytes that are not UTF-8.
 */
export function singleValues(
  url: URL,
  allowed: readonly string[],
  allowPrefix?: string,
): Map<string, string> {
  const values = new Map<string, string>();
  for (const [name, value] of queryPairs(url)) {
    const known =
      allowed.includes(name) || (allowPrefix !== undefined && name.startsWith(allowPrefix));
    if (!known) throw queryError('a query parameter this route does not accept was given');
    if (values.has(name)) {
      throw queryError(`${describe(name, allowed)} must be given at most once`);
    }
    values.set(name, value);
  }
  return values;
}

/**
 * A non-negative integer query value: decimal digits only. Values beyond
 * 2^53−1 become `Infinity`, which callers clamp or reject.
 */
function nonNegativeInteger(name: string, value: string): number {
  if (!DIGITS.test(value)) {
    throw queryError(`the query parameter ${name} must be a non-negative integer`, name);
  }
  const number = digitsValue(value);
  return Number.isSafeInteger(number) ? number : Number.POSITIVE_INFINITY;
}

/**
 * `wait_ms`: absent is 0 (no wait); a value above `maxMs` is clamped to it
 * (DESIGN §4.1); anything but decimal digits is `invalid_input`.
 */
export function parseWaitMs(value: string | undefined, maxMs: number): number {
  if (value === undefined) return 0;
  return Math.min(nonNegativeInteger('wait_ms', value), maxMs);
}

/** `after_sequence`: absent is 0; otherwise an integer in 0..2^53−1. */
export function parseAfterSequence(value: string | undefined): number {
  if (value === undefined) return 0;
  const sequence = nonNegativeInteger('after_sequence', value);
  if (!Number.isFinite(sequence)) {
    throw queryError(
      'the query parameter after_sequence must be at most 9007199254740991',
      'after_sequence',
    );
  }
  return sequence;
}

/**
 * A `limit` with a route-specific maximum (the retention preview's
 * MAX_RETENTION_BATCH): absent is `max`; otherwise an integer in 1..max.
 * Out-of-range values are rejected, not clamped, as the task list's `limit`
 * is (DESIGN §4.1): a caller asking for more than a bounded pass can count
 * should learn it, not silently get less.
 */
export function parseLimit(value: string | undefined, max: number): number {
  if (value === undefined) return max;
  const limit = DIGITS.test(value) ? digitsValue(value) : Number.NaN;
  if (!(limit >= 1 && limit <= max)) {
    throw queryError(`the query parameter limit must be an integer from 1 to ${max}`, 'limit');
  }
  return limit;
}

/**
 * A query number handed to the schema: digits become a number (the schema
 * then checks the range), anything else stays a string so the schema rejects
 * it as "must be a number".
 */
function numberOrText(value: string): number | string {
  return DIGITS.test(value) ? digitsValue(value) : value;
}

/**
 * The task list query of DESIGN §6: `state, queue, program, label.K=V
 * (repeatable with different keys; all must match), submitted_from,
 * submitted_until, limit (1..500), cursor`, plus `workflow_id` (a
 * `TaskFilters` field of DESIGN §4), validated with the contracts'
 * `TaskListQuerySchema`. Errors name the parameter, never its value.
 */
export function parseListQuery(url: URL): TaskListQuery {
  const values = singleValues(url, LIST_QUERY_PARAMETERS, LABEL_PREFIX);
  const filters: Record<string, unknown> = {};
  const labels: Record<string, string> = {};
  let labelCount = 0;
  for (const [name, value] of values) {
    if (name.startsWith(LABEL_PREFIX)) {
      // Object.defineProperty keeps a key like `__proto__` a plain data key,
      // so the labels schema sees (and rejects) it instead of a prototype change.
      Object.defineProperty(labels, name.slice(LABEL_PREFIX.length), {
        value,
        enumerable: true,
        configurable: true,
        writable: true,
      });
      labelCount++;
    } else if (name === 'submitted_from' || name === 'submitted_until') {
      filters[name] = numberOrText(value);
    } else if (name !== 'limit' && name !== 'cursor') {
      filters[name] = value;
    }
  }
  if (labelCount > 0) filters.labels = labels;
  const query: Record<string, unknown> = { filters };
  const limit = values.get('limit');
  if (limit !== undefined) query.limit = numberOrText(limit);
  const cursor = values.get('cursor');
  if (cursor !== undefined) query.cursor = cursor;
  const parsed = parseWith(TaskListQuerySchema, query, 'query');
  // Read here, before the route authorizes the scope (DESIGN §4.1: decoding before 403); that
  // it was issued for this scope and these filters the store checks.
  if (parsed.cursor !== undefined) readTaskCursor(parsed.cursor);
  return parsed;
}
