import { TRACESTATE_MAX_BYTES } from './limits.js';

/**
 * The shape of a `traceparent`: version-traceid-parentid-flags, lowercase hex (W3C Trace Context
 * §3.2); a future version's further fields are printable ASCII, as any header value that reaches
 * a worker must be. {@link traceparentProblem} checks more (version ff, all-zero ids).
 */
export const TRACEPARENT_PATTERN =
  /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x20-\x7e]*)?$/;
const ALL_ZERO = /^0+$/;

/**
 * Why `value` is not a valid W3C `traceparent`, or `undefined` when it is.
 * Version `00` must be exactly 55 characters; a higher version may append
 * `-`-separated fields, as the spec asks parsers to allow; version `ff`, an
 * all-zero trace id and an all-zero parent id are invalid.
 */
export function traceparentProblem(value: unknown): string | undefined {
  if (typeof value !== 'string') return 'must be a string';
  const match = TRACEPARENT_PATTERN.exec(value);
  if (match === null) return 'must be version-traceid-parentid-flags in lowercase hex';
  const [, version, traceId, parentId, , rest] = match;
  if (version === 'ff') return 'version ff is invalid';
  if (version === '00' && rest !== undefined) return 'version 00 has exactly four fields';
  if (ALL_ZERO.test(traceId ?? '')) return 'trace id must not be all zeros';
  if (ALL_ZERO.test(parentId ?? '')) return 'parent id must not be all zeros';
  return undefined;
}

/** Whether `value` is a valid W3C `traceparent` header value. */
export function isValidTraceparent(value: unknown): value is string {
  return traceparentProblem(value) === undefined;
}

// key = simple-key / multi-tenant-key; value = printable ASCII without ',' and '='
// and without trailing space (W3C Trace Context §3.3.1).
const TRACESTATE_KEY =
  /^(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})$/;
const TRACESTATE_VALUE = /^[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$/;
// A header value: printable ASCII and the tab of OWS (W3C Trace Context §3.3: list =
// list-member 0*31( OWS "," OWS list-member ), OWS = *( SP / HTAB )).
const TRACESTATE_CHARS = /^[\t\x20-\x7e]*$/;
// The optional whitespace around a member: spaces and tabs only, not `String.prototype.trim`'s
// line terminators and Unicode spaces.
const OWS_EDGES = /^[ \t]+|[ \t]+$/g;

/** The members of a `tracestate` value, empty ones (W3C: `list-member = OWS`) left out. */
function tracestateMembers(value: string): string[] {
  return value
    .split(',')
    .map((member) => member.replace(OWS_EDGES, ''))
    .filter((member) => member.length > 0);
}

/**
 * Why `value` is not a valid W3C `tracestate`, or `undefined` when it is: at
 * most 512 characters of printable ASCII (and tab), and up to 32 `key=value` members with
 * distinct keys, separated by commas with optional spaces and tabs around them. A value with no
 * member (empty, blank, only commas) is valid: "Vendors MUST accept empty `tracestate`
 * headers" (W3C Trace Context §3.3.1).
 */
export function tracestateProblem(value: unknown): string | undefined {
  if (typeof value !== 'string') return 'must be a string';
  if (value.length > TRACESTATE_MAX_BYTES) return `must be at most ${TRACESTATE_MAX_BYTES} bytes`;
  if (!TRACESTATE_CHARS.test(value)) return 'must be printable ASCII';
  const nonEmpty = tracestateMembers(value);
  if (nonEmpty.length > 32) return 'must hold at most 32 members';
  const keys = new Set<string>();
  for (const member of nonEmpty) {
    const eq = member.indexOf('=');
    const key = member.slice(0, eq);
    if (eq <= 0 || !TRACESTATE_KEY.test(key) || !TRACESTATE_VALUE.test(member.slice(eq + 1))) {
      return 'members must be key=value as in W3C Trace Context';
    }
    if (keys.has(key)) return 'member keys must be distinct';
    keys.add(key);
  }
  return undefined;
}

/**
 * A valid `tracestate` as the system keeps it: one with no member is no tracestate (W3C: a
 * vendor "SHOULD avoid sending" an empty one), so it is left out rather than passed on.
 */
export function keptTracestate(value: string | undefined): string | undefined {
  return value === undefined || tracestateMembers(value).length === 0 ? undefined : value;
}

/** Whether `value` is a valid W3C `tracestate` header value. */
export function isValidTracestate(value: unknown): value is string {
  return tracestateProblem(value) === undefined;
}
