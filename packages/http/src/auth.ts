/**
 * API keys (DESIGN §6 Authentication): each key is bound to one tenant, a
 * list of namespaces (or `*`) and roles. Only a SHA-256 hash of each key is
 * kept, and a presented key is compared against every hash in constant time,
 * so neither memory nor timing gives a key away. With no keys configured the
 * app runs in development mode and every request is allowed.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import {
  API_KEY_MAX_CHARS,
  BEARER_TOKEN_PATTERN,
  ContractError,
  SCOPE_TEXT_MAX_BYTES,
  type Scope,
  textProblem,
} from '@ledgence/contracts';

/**
 * What a key may do: submit and read tasks (`client`), work tasks (`worker`),
 * or both plus the namespace's operator settings such as retention (`admin`).
 */
export type Role = 'client' | 'worker' | 'admin';

/** The roles a key may name. */
export const ROLES: readonly Role[] = ['client', 'worker', 'admin'];

/** One configured API key (`LEDGENCE_API_KEYS` holds an array of these). */
export interface ApiKeyConfig {
  /** The secret bearer token. Hashed at start; the text is not retained. */
  key: string;
  /** The one tenant the key acts for. */
  tenant: string;
  /** The namespaces of that tenant the key may use, or `['*']` for all of them. */
  namespaces: readonly string[];
  /** What the key may do; `admin` implies `client` and `worker`. */
  roles: readonly Role[];
}

/** Options of the authentication layer. */
export interface AuthOptions {
  /** The configured keys; none means development mode (every request allowed). */
  keys: readonly ApiKeyConfig[];
}

/** Who a request acts as, after authentication. */
export interface Principal {
  /** The key's tenant; `undefined` in development mode, where every tenant is allowed. */
  tenant: string | undefined;
  /** The key's namespaces; `undefined` means every namespace of the tenant. */
  namespaces: ReadonlySet<string> | undefined;
  /** The roles granted; `admin` is expanded into all roles. */
  roles: ReadonlySet<Role>;
}

/** The outcome of authenticating a request. */
export type Authentication =
  | { ok: true; principal: Principal }
  | { ok: false; reason: 'missing' | 'scheme' | 'invalid' };

const LOOPBACK_NAMES = new Set(['localhost', '::1', '[::1]']);

/**
 * Whether `host` (a name or address, IPv6 bracketed or not) is the loopback interface: the only
 * place development mode serves (DESIGN §6), whether the server listens there or a request
 * names it in its Host header.
 */
export function isLoopbackHost(host: string): boolean {
  return LOOPBACK_NAMES.has(host.toLowerCase()) || /^127(?:\.\d{1,3}){3}$/.test(host);
}

/** Verifies bearer tokens against the configured keys. */
export interface Authenticator {
  /** Whether no keys are configured, so every request is allowed. */
  readonly developmentMode: boolean;
  /** Checks an `Authorization` header value. */
  authenticate(authorization: string | undefined): Authentication;
}

interface StoredKey {
  hash: Buffer;
  principal: Principal;
}

// RFC 6750: the scheme, then a b64token (BEARER_TOKEN_PATTERN, the form a configured key has).
const BEARER = /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i;
// The scheme alone (RFC 9110 §11.4: case-insensitive), however the rest is written.
const BEARER_SCHEME = /^Bearer(?![^ \t])/i;

const DEVELOPMENT_PRINCIPAL: Principal = {
  tenant: undefined,
  namespaces: undefined,
  roles: new Set<Role>(ROLES),
};

function hashKey(key: string): Buffer {
  return createHash('sha256').update(key, 'utf8').digest();
}

/**
 * One thing wrong with a configured API key: the field (`key`, `tenant`, `namespaces[1]`, …) and
 * what is wrong with it. Never the key's text, so a problem can go to a log or a terminal.
 */
export interface ApiKeyProblem {
  /** The field, relative to the key's entry: `key`, `tenant`, `namespaces`, `roles[0]`, … */
  field: string;
  /** What is wrong and what would be right, e.g. `must not start or end with whitespace`. */
  message: string;
}

/**
 * Everything wrong with one configured key, or `[]` when {@link createAuthenticator} accepts it.
 * The one rule for a key's fields: the authenticator refuses the first problem it finds, and a
 * configuration loader (the server's `LEDGENCE_API_KEYS`) reports every problem before starting.
 * Tolerates values of the wrong type, as configuration read from JSON may hold any.
 *
 * @example
 * ```ts
 * apiKeyProblems({ key: 'k_live_1', tenant: 'acme ', namespaces: ['*'], roles: ['client'] });
 * // → [{ field: 'tenant', message: 'must not start or end with whitespace' }]
 * ```
 */
export function apiKeyProblems(config: ApiKeyConfig): ApiKeyProblem[] {
  const problems: ApiKeyProblem[] = [];
  const problem = (field: string, message: string) => problems.push({ field, message });
  const { key, tenant, namespaces, roles } = config as Partial<Record<keyof ApiKeyConfig, unknown>>;
  if (typeof key !== 'string' || key.length === 0) {
    problem('key', 'must be a non-empty string');
  } else if (key.length > API_KEY_MAX_CHARS || !BEARER_TOKEN_PATTERN.test(key)) {
    // A key that cannot be sent as `Authorization: Bearer <key>` could never authenticate.
    problem(
      'key',
      `must be a bearer token: letters, digits and - . _ ~ + / (optionally ending in =), no spaces or line breaks, at most ${API_KEY_MAX_CHARS} characters`,
    );
  }
  const tenantProblem = scopeNameProblem(tenant);
  if (tenantProblem !== undefined) problem('tenant', tenantProblem);
  if (!Array.isArray(namespaces) || namespaces.length === 0) {
    problem('namespaces', 'must be a non-empty array of names, or ["*"] for every namespace');
  } else if (namespaces.includes('*')) {
    if (namespaces.length !== 1) problem('namespaces', 'must be ["*"] alone when it names "*"');
  } else {
    namespaces.forEach((namespace: unknown, at) => {
      const namespaceProblem = scopeNameProblem(namespace);
      if (namespaceProblem !== undefined) problem(`namespaces[${at}]`, namespaceProblem);
    });
  }
  if (!Array.isArray(roles) || roles.length === 0) {
    problem('roles', `must be a non-empty array of ${ROLES.join(', ')}`);
  } else {
    roles.forEach((role: unknown, at) => {
      if (!ROLES.includes(role as Role))
        problem(`roles[${at}]`, `must be one of ${ROLES.join(', ')}`);
    });
  }
  return problems;
}

/**
 * Why a tenant or namespace text cannot be bound to a key, or `undefined`: the contracts' text
 * rule, and not a dot segment (`.`, `..`), which URL normalisation removes from every
 * `{scope}` path (`%2E%2E` included), so no client route could ever name it.
 */
function scopeNameProblem(value: unknown): string | undefined {
  if (value === '.' || value === '..') {
    return 'must not be "." or "..": URL normalisation removes it from every {scope} path';
  }
  return textProblem(value, SCOPE_TEXT_MAX_BYTES);
}

/** Configuration errors name the key's index and the field, never the key. */
function configError(index: number, message: string): TypeError {
  return new TypeError(`auth.keys[${index}]${message}`);
}

function storedKey(config: ApiKeyConfig, index: number): StoredKey {
  const [first] = apiKeyProblems(config);
  if (first !== undefined) throw configError(index, `.${first.field} ${first.message}`);
  const wildcard = config.namespaces.includes('*');
  const roles = new Set<Role>(config.roles);
  // admin implies every role: an operator's key can both submit and work.
  if (roles.has('admin')) for (const role of ROLES) roles.add(role);
  return {
    hash: hashKey(config.key),
    principal: {
      tenant: config.tenant,
      namespaces: wildcard ? undefined : new Set(config.namespaces),
      roles,
    },
  };
}

/**
 * Builds the authenticator of `options`. Throws a `TypeError` naming the
 * offending entry (never the key) when the configuration is invalid, or when
 * two entries hold the same key.
 */
export function createAuthenticator(options: AuthOptions): Authenticator {
  const stored = options.keys.map(storedKey);
  for (let i = 0; i < stored.length; i++) {
    for (let j = 0; j < i; j++) {
      if ((stored[i] as StoredKey).hash.equals((stored[j] as StoredKey).hash)) {
        throw configError(i, `.key repeats auth.keys[${j}].key`);
      }
    }
  }
  const developmentMode = stored.length === 0;
  return {
    developmentMode,
    authenticate(authorization) {
      if (developmentMode) return { ok: true, principal: DEVELOPMENT_PRINCIPAL };
      if (authorization === undefined || authorization.length === 0) {
        return { ok: false, reason: 'missing' };
      }
      // RFC 6750 §3.1: credentials of another scheme (Basic, Digest…) are no bearer token at all,
      // so not an invalid one: the answer is the challenge alone, as for none.
      if (!BEARER_SCHEME.test(authorization)) return { ok: false, reason: 'scheme' };
      const match =
        authorization.length <= API_KEY_MAX_CHARS + 16 ? BEARER.exec(authorization) : null;
      if (match === null) return { ok: false, reason: 'invalid' };
      const presented = hashKey(match[1] as string);
      // Compare against every key, without stopping at a match, so the time
      // taken says nothing about which key (or whether any) matched.
      let found: StoredKey | undefined;
      for (const key of stored) {
        if (timingSafeEqual(key.hash, presented) && found === undefined) found = key;
      }
      return found === undefined
        ? { ok: false, reason: 'invalid' }
        : { ok: true, principal: found.principal };
    },
  };
}

/** Whether `principal` may act in `scope`. */
export function allowsScope(principal: Principal, scope: Scope): boolean {
  if (principal.tenant === undefined) return true;
  if (principal.tenant !== scope.tenant_id) return false;
  return principal.namespaces === undefined || principal.namespaces.has(scope.namespace);
}

/** Throws `forbidden` unless `principal` holds `role` (an `admin` key holds every role). */
export function requireRole(principal: Principal, role: Role): void {
  if (!principal.roles.has(role)) {
    throw new ContractError('forbidden', `the API key does not hold the ${role} role`, {
      reason: 'role',
    });
  }
}

/** Throws `forbidden` unless `principal` may act in `scope`; `path` names where the scope came from. */
export function requireScope(principal: Principal, scope: Scope, path?: string): void {
  if (allowsScope(principal, scope)) return;
  throw new ContractError(
    'forbidden',
    `${path === undefined ? 'the scope' : path} is outside the API key's binding`,
    path === undefined ? { reason: 'scope' } : { reason: 'scope', path },
  );
}

/**
 * The one scope a principal's binding names, when it names exactly one
 * (a key with one concrete namespace); otherwise `undefined`.
 */
export function soleScope(principal: Principal): Scope | undefined {
  if (principal.tenant === undefined || principal.namespaces?.size !== 1) return undefined;
  const [namespace] = principal.namespaces;
  return namespace === undefined ? undefined : { tenant_id: principal.tenant, namespace };
}
