/**
 * Route authorization policies (DESIGN §6's role column), declared per route
 * and checked once when the app is built.
 *
 * Every route's first middleware carries its policy (`documentRoute` in
 * openapi.ts builds it from the route's documentation). At request time that
 * middleware records the route's access, and `authorize` reads the role from
 * it rather than from a literal in the handler, so the declared policy is the
 * one enforced. At build time {@link checkRoutePolicies} walks every
 * registered route: a route added without a policy (or with one that cannot
 * hold, such as a keyed route outside the authenticated prefix) stops the app
 * from being created, instead of serving a route nobody authorizes.
 */
import type { MiddlewareHandler } from 'hono';
import type { Role } from './auth.js';

/** Who may call a route: a key holding this role, or anyone (`public`). */
export type RouteAccess = Role | 'public';

/** The context variables the policy middleware sets. */
export interface PolicyVariables {
  /** The access the matched route declared; `undefined` before its policy middleware ran. */
  access: RouteAccess | undefined;
}

/** The Hono environment of the policy middleware. */
export interface PolicyEnv {
  Variables: PolicyVariables;
}

/** The path prefix the authentication middleware guards. */
export const AUTHENTICATED_PREFIX = '/v1/';

// Keyed by the middleware function itself: `app.routes` hands back the very
// handlers that were registered, so the check needs no naming convention.
const POLICIES = new WeakMap<object, RouteAccess>();

/**
 * A middleware that records `access` for the request, carrying whatever
 * `annotated` carries (its own symbol properties, e.g. hono-openapi's route
 * description), so it can stand in for `annotated` in a route registration.
 */
export function withPolicy(
  access: RouteAccess,
  annotated?: MiddlewareHandler,
): MiddlewareHandler<PolicyEnv> {
  const middleware: MiddlewareHandler<PolicyEnv> = async (c, next) => {
    c.set('access', access);
    await next();
  };
  if (annotated !== undefined) {
    for (const symbol of Object.getOwnPropertySymbols(annotated)) {
      Object.defineProperty(middleware, symbol, {
        value: (annotated as unknown as Record<symbol, unknown>)[symbol],
        enumerable: true,
      });
    }
  }
  POLICIES.set(middleware, access);
  return middleware;
}

/** The policy a handler declares, if it is a policy middleware. */
export function policyOf(handler: unknown): RouteAccess | undefined {
  return typeof handler === 'function' ? POLICIES.get(handler) : undefined;
}

/** One registered route, as `Hono#routes` lists it. */
export interface RegisteredRoute {
  method: string;
  path: string;
  handler: unknown;
}

/**
 * Throws an `Error` naming every route (method and path) that declares no
 * authorization policy, declares two, or declares one its path cannot honour:
 * a role outside {@link AUTHENTICATED_PREFIX} would never see an authenticated
 * key, and `public` inside it would demand a key it never checks. Middleware
 * registered for every method (`app.use`) is not a route and is skipped.
 */
export function checkRoutePolicies(routes: readonly RegisteredRoute[]): void {
  const byRoute = new Map<string, RouteAccess[]>();
  for (const route of routes) {
    if (route.method === 'ALL') continue;
    const name = `${route.method} ${route.path}`;
    const declared = byRoute.get(name) ?? [];
    const access = policyOf(route.handler);
    if (access !== undefined) declared.push(access);
    byRoute.set(name, declared);
  }
  const problems: string[] = [];
  for (const [name, declared] of byRoute) {
    const path = name.slice(name.indexOf(' ') + 1);
    const keyed = path.startsWith(AUTHENTICATED_PREFIX);
    if (declared.length === 0) problems.push(`${name} declares no authorization policy`);
    else if (declared.length > 1) problems.push(`${name} declares ${declared.length} policies`);
    else if (keyed && declared[0] === 'public') {
      problems.push(`${name} is public but sits under ${AUTHENTICATED_PREFIX}, which needs a key`);
    } else if (!keyed && declared[0] !== 'public') {
      problems.push(`${name} needs the ${declared[0]} role but is outside ${AUTHENTICATED_PREFIX}`);
    }
  }
  if (problems.length > 0) {
    throw new Error(
      `every route must declare one authorization policy (documentRoute(<operation id>)):\n` +
        problems.map((problem) => `  - ${problem}`).join('\n'),
    );
  }
}
