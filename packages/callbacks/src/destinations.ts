/**
 * Callback destinations: operator configuration (DESIGN §8) mapping an alias
 * to a URL, a Standard Webhooks signing secret and a total timeout. Clients
 * subscribe to an alias and never name a URL, so there is no SSRF through the
 * API; for the same reason loopback and private addresses are allowed here.
 *
 * Every problem names the alias and the field and all are reported at once,
 * so one restart fixes them all; no message ever echoes a secret.
 */
import {
  ContractError,
  DESTINATION_ALIAS_MAX_BYTES,
  decodeStrictJson,
  LedgenceError,
  type LedgenceErrorOptions,
  textProblem,
} from '@ledgence/contracts';

/** The prefix of a Standard Webhooks signing secret. */
export const WEBHOOK_SECRET_PREFIX = 'whsec_';
/** The shortest signing key accepted, in bytes (Standard Webhooks: 24..64 bytes). */
export const WEBHOOK_SECRET_MIN_BYTES = 24;
/** The shortest total delivery timeout a destination may set. */
export const DESTINATION_MIN_TIMEOUT_MS = 100;
/** The longest total delivery timeout a destination may set. */
export const DESTINATION_MAX_TIMEOUT_MS = 60_000;
/** The total delivery timeout of a destination that sets none. */
export const DESTINATION_DEFAULT_TIMEOUT_MS = 5_000;
/** The longest destination URL, in UTF-8 bytes (the de facto limit of browsers and proxies). */
export const DESTINATION_URL_MAX_BYTES = 2048;

/**
 * The largest destinations document. Far above any sensible configuration;
 * it only keeps a mistaken file (a log, a dump) from being parsed whole.
 */
const DESTINATIONS_MAX_BYTES = 1024 * 1024;

const FIELDS: ReadonlySet<string> = new Set(['url', 'secret', 'timeout_ms']);
// Text of the document that may be a signing secret out of place (its `"secret":` label
// forgotten, a secret pasted as a name): `whsec_…`, or a run of base64 as long as a key's with
// the digits and both cases random bytes have (a long snake_case alias has not).
const SECRET_LIKE = /^whsec_|^(?=.*\d)(?=.*[a-z])(?=.*[A-Z])[A-Za-z0-9+/=_-]{32,}$/;
// A path segment as `appendJsonPath` writes one: `.name` or `["…"]` (escaped, maybe cut).
const PATH_NAME = /\.([A-Za-z_][A-Za-z0-9_]*)|\["((?:[^"\\]|\\.)*)"\]/g;
// Standard base64 with padding, as the Standard Webhooks libraries decode it.
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/**
 * One configured destination. `secret` is the decoded signing key; it is a
 * non-enumerable property, so `JSON.stringify`, `console.log` and structured
 * loggers leave it out — and so does object spread: pass the object itself.
 */
export interface Destination {
  /** The alias clients subscribe to. */
  readonly alias: string;
  /** The absolute `http:` or `https:` URL the event is POSTed to. */
  readonly url: string;
  /** The HMAC-SHA256 key: the bytes of the base64 after `whsec_`. */
  readonly secret: Buffer;
  /** The total deadline of one delivery try, connect to last response byte. */
  readonly timeoutMs: number;
}

/** The configured destinations by alias. */
export type Destinations = ReadonlyMap<string, Destination>;

/** What is wrong with one destination field (`alias` and `field` absent for the whole document). */
export interface DestinationProblem {
  /** The alias concerned, if the problem is about one destination. */
  readonly alias?: string;
  /** The field concerned: `url`, `secret`, `timeout_ms`, an unknown field, or absent. */
  readonly field?: string;
  /** A sentence naming the source, alias and field; never the secret. */
  readonly message: string;
}

/** Options of a {@link DestinationsError}. */
export interface DestinationsErrorOptions extends LedgenceErrorOptions {
  /** Every problem found. */
  problems: readonly DestinationProblem[];
}

/**
 * The destinations configuration cannot be used. `problems` lists every
 * problem found, each naming its alias and field, so the server can report
 * them with its other configuration problems.
 */
export class DestinationsError extends LedgenceError {
  static override readonly brand: string = '@ledgence/callbacks/DestinationsError';

  /** Every problem found, in document order. */
  readonly problems: readonly DestinationProblem[];

  constructor(options: DestinationsErrorOptions) {
    const { problems } = options;
    super(
      `Invalid callback destinations (${problems.length} problem${problems.length === 1 ? '' : 's'}):\n` +
        problems.map((p) => `  - ${p.message}`).join('\n'),
      options,
    );
    this.problems = Object.freeze([...problems]);
  }
}

/** Options of {@link parseDestinations}. */
export interface ParseDestinationsOptions {
  /** Where the text came from, for messages (default `LEDGENCE_CALLBACK_DESTINATIONS`). */
  source?: string;
}

/**
 * Makes one destination from checked values, `secret` non-enumerable.
 * Exported for tests and embedders that configure destinations in code.
 *
 * @example
 * const billing = createDestination({ alias: 'billing', url: 'http://127.0.0.1:9000/hook',
 *   secret: randomBytes(32) });
 */
export function createDestination(options: DestinationOptions): Destination {
  const destination = {
    alias: options.alias,
    url: options.url,
    timeoutMs: options.timeoutMs ?? DESTINATION_DEFAULT_TIMEOUT_MS,
  };
  Object.defineProperty(destination, 'secret', {
    value: Buffer.from(options.secret),
    enumerable: false,
  });
  return Object.freeze(destination) as Destination;
}

/** Options of {@link createDestination}: the fields of a {@link Destination}, already checked. */
export interface DestinationOptions {
  /** The alias clients subscribe to. */
  alias: string;
  /** The absolute `http:` or `https:` URL. */
  url: string;
  /** The signing key bytes (copied). */
  secret: Uint8Array;
  /** The total deadline of one try; DESTINATION_DEFAULT_TIMEOUT_MS by default. */
  timeoutMs?: number;
}

/**
 * Parses and validates the destinations document (DESIGN §8):
 * `{"billing": {"url": "https://…", "secret": "whsec_<base64>", "timeout_ms": 5000}}`.
 * Aliases follow the identifier text rule (1..DESTINATION_ALIAS_MAX_BYTES
 * bytes); `url` is an absolute http(s) URL without credentials; `secret` is
 * `whsec_` plus standard base64 of at least 24 bytes; `timeout_ms` is an
 * integer in 100..60 000 (default 5 000); other fields are refused, so a typo
 * is not silently ignored. Throws a {@link DestinationsError} listing every
 * problem.
 *
 * @example
 * const destinations = parseDestinations(process.env.LEDGENCE_CALLBACK_DESTINATIONS ?? '{}');
 * destinations.get('billing')?.url; // → 'https://billing.internal/hooks/ledgence'
 */
export function parseDestinations(
  text: string,
  options: ParseDestinationsOptions = {},
): Destinations {
  const source = options.source ?? 'LEDGENCE_CALLBACK_DESTINATIONS';
  let document: unknown;
  try {
    document = decodeStrictJson(text, { maxBytes: DESTINATIONS_MAX_BYTES });
  } catch (error) {
    // Only the reason and path: a syntax error's message could quote a secret, and so could the
    // path, made of the names read so far (a secret whose label was forgotten is read as a name).
    const detail =
      error instanceof ContractError
        ? ` (${error.reason ?? 'syntax'} at ${withoutSecrets(error.path ?? '$')})`
        : '';
    throw new DestinationsError({
      problems: [{ message: `${source} must be a JSON object of destinations${detail}` }],
    });
  }
  if (typeof document !== 'object' || document === null || Array.isArray(document)) {
    throw new DestinationsError({
      problems: [
        {
          message: `${source} must be a JSON object like {"billing":{"url":"https://…","secret":"whsec_…"}}`,
        },
      ],
    });
  }
  const problems: DestinationProblem[] = [];
  const destinations = new Map<string, Destination>();
  for (const [alias, entry] of Object.entries(document)) {
    const destination = parseEntry(source, alias, entry, problems);
    if (destination !== undefined) destinations.set(alias, destination);
  }
  if (problems.length > 0) throw new DestinationsError({ problems });
  return destinations;
}

/**
 * A name read from the document as a message shows it: quoted (an alias may hold control
 * characters we must not print raw), or described when it looks like a secret out of place.
 */
function shownName(name: string): string {
  return SECRET_LIKE.test(name) ? '(not shown: it looks like a secret)' : JSON.stringify(name);
}

/**
 * A JSON path with every name that looks like a secret out of place replaced by `[…]`; a name
 * past 64 characters is cut there and ended with `…` (contracts `appendJsonPath`), and judged
 * by what is left of it.
 */
function withoutSecrets(path: string): string {
  return path.replace(PATH_NAME, (segment, name: string | undefined, quoted: string | undefined) =>
    SECRET_LIKE.test((name ?? quoted ?? '').replace(/…$/, '')) ? '[…]' : segment,
  );
}

/** One destination, or `undefined` after pushing its problems. */
function parseEntry(
  source: string,
  alias: string,
  entry: unknown,
  problems: DestinationProblem[],
): Destination | undefined {
  const where = `${source}: destination ${shownName(alias)}`;
  const named = SECRET_LIKE.test(alias) ? {} : { alias };
  const before = problems.length;
  const aliasProblem = textProblem(alias, DESTINATION_ALIAS_MAX_BYTES);
  if (aliasProblem !== undefined) {
    problems.push({ ...named, message: `${where}: the alias ${aliasProblem}` });
  }
  if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) {
    problems.push({ ...named, message: `${where} must be an object with url and secret` });
    return undefined;
  }
  const fields = entry as Record<string, unknown>;
  for (const field of Object.keys(fields)) {
    if (!FIELDS.has(field)) {
      const hidden = SECRET_LIKE.test(field);
      problems.push({
        ...named,
        ...(hidden ? {} : { field }),
        message: `${where}: unknown field ${shownName(field)} (expected url, secret, timeout_ms)`,
      });
    }
  }
  const url = parseUrl(fields.url, (message) =>
    problems.push({ ...named, field: 'url', message: `${where}: url ${message}` }),
  );
  const secret = parseSecret(fields.secret, (message) =>
    problems.push({ ...named, field: 'secret', message: `${where}: secret ${message}` }),
  );
  const timeoutMs = parseTimeout(fields.timeout_ms, (message) =>
    problems.push({ ...named, field: 'timeout_ms', message: `${where}: timeout_ms ${message}` }),
  );
  if (problems.length > before || url === undefined || secret === undefined) return undefined;
  return createDestination({ alias, url, secret, timeoutMs });
}

function parseUrl(value: unknown, problem: (message: string) => void): string | undefined {
  if (value === undefined) return void problem('is required');
  const text = textProblem(value, DESTINATION_URL_MAX_BYTES);
  if (text !== undefined) return void problem(text);
  let url: URL;
  try {
    url = new URL(value as string);
  } catch {
    return void problem('must be an absolute URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    return void problem('must use http or https');
  }
  // Credentials in a URL end up in logs and error messages; the signature authenticates.
  if (url.username !== '' || url.password !== '') {
    return void problem('must not contain credentials (user:password@)');
  }
  return url.href;
}

function parseSecret(value: unknown, problem: (message: string) => void): Buffer | undefined {
  const expected = `must be "${WEBHOOK_SECRET_PREFIX}" followed by standard base64 of at least ${WEBHOOK_SECRET_MIN_BYTES} bytes`;
  if (value === undefined) return void problem('is required');
  if (typeof value !== 'string' || !value.startsWith(WEBHOOK_SECRET_PREFIX)) {
    return void problem(expected);
  }
  const encoded = value.slice(WEBHOOK_SECRET_PREFIX.length);
  if (!BASE64.test(encoded)) return void problem(expected);
  const key = Buffer.from(encoded, 'base64');
  if (key.length < WEBHOOK_SECRET_MIN_BYTES) {
    return void problem(`${expected} (it holds ${key.length})`);
  }
  return key;
}

function parseTimeout(value: unknown, problem: (message: string) => void): number | undefined {
  if (value === undefined) return DESTINATION_DEFAULT_TIMEOUT_MS;
  if (
    typeof value !== 'number' ||
    !Number.isInteger(value) ||
    value < DESTINATION_MIN_TIMEOUT_MS ||
    value > DESTINATION_MAX_TIMEOUT_MS
  ) {
    return void problem(
      `must be an integer from ${DESTINATION_MIN_TIMEOUT_MS} to ${DESTINATION_MAX_TIMEOUT_MS} (milliseconds)`,
    );
  }
  return value;
}
