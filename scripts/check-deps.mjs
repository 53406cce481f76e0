#!/usr/bin/env node
/**
 * Fails (exit 1) when any workspace package breaks the dependency direction of
 * DESIGN §2, imports outside its own folder, or imports an undeclared package.
 * Run by `pnpm build` and `pnpm lint`.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { findViolations } from './dependency-rules.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const SOURCE = /\.(?:ts|mts|cts|js|mjs|cjs)$/;
const SKIP = new Set(['node_modules', 'dist', '.turbo']);

function walk(dir, base = dir) {
  const out = [];
  for (const entry of readdirSync(dir)) {
    if (SKIP.has(entry)) continue;
    const full = join(dir, entry);
    if (statSync(full).isDirectory()) out.push(...walk(full, base));
    else if (SOURCE.test(entry) && !entry.endsWith('.d.ts')) out.push(relative(base, full));
  }
  return out;
}

const workspace = [];
// Every package and app, and the private end-to-end, reliability and benchmark workspaces.
const packageDirs = ['packages', 'apps']
  .flatMap((group) => readdirSync(join(root, group)).map((name) => `${group}/${name}`))
  .concat(['e2e', 'reliability', 'bench']);
for (const dir of packageDirs) {
  let manifest;
  try {
    manifest = JSON.parse(readFileSync(join(root, dir, 'package.json'), 'utf8'));
  } catch {
    continue;
  }
  const files = walk(join(root, dir))
    .filter((path) => !path.startsWith('node_modules'))
    .map((path) => ({ path, source: readFileSync(join(root, dir, path), 'utf8') }));
  workspace.push({ name: manifest.name, dir, manifest, files });
}

const rootManifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const violations = findViolations(
  workspace,
  (dir, path, specifier) => normalize(join(dir, dirname(path), specifier)),
  rootManifest.devDependencies,
);
if (violations.length > 0) {
  console.error(`Dependency rules of DESIGN §2 are broken (${violations.length}):`);
  for (const line of violations) console.error(`  - ${line}`);
  process.exit(1);
}
console.log(`dependency rules hold across ${workspace.length} packages`);
