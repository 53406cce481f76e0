#!/usr/bin/env node
/**
 * Packaging check for the published packages (run after `pnpm build`):
 *   1. `pnpm pack` each package (pnpm applies publishConfig, so the published
 *      `exports` carry no source condition);
 *   2. publint and @arethetypeswrong/cli on the tarball;
 *   3. `npm install` the tarball into an empty folder outside the workspace,
 *      twice, and run a plain Node ESM consumer that also checks `instanceof`
 *      across the two installed copies;
 *   4. type-check a TypeScript consumer against the installed types, including
 *      a line that must fail to type-check (so the types are not `any`).
 * Prints what it does; exits 1 on the first failure.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const bin = (name) => join(root, 'node_modules', '.bin', name);

function run(command, args, cwd = root) {
  console.log(`$ ${[command, ...args].join(' ')}${cwd === root ? '' : `   (in ${cwd})`}`);
  execFileSync(command, args, { cwd, stdio: 'inherit', env: { ...process.env, CI: 'true' } });
}

const work = mkdtempSync(join(tmpdir(), 'ledgence-packaging-'));
const tarballs = join(work, 'tarballs');
mkdirSync(tarballs);

function pack(filter) {
  const before = new Set(readdirSync(tarballs));
  run('pnpm', ['--filter', filter, 'pack', '--pack-destination', tarballs]);
  const made = readdirSync(tarballs).filter((f) => !before.has(f));
  if (made.length !== 1) throw new Error(`expected one tarball for ${filter}, got ${made}`);
  return join(tarballs, made[0]);
}

/** A fresh npm project outside the workspace with `tarballs` installed. */
function consumerProject(name, tarballPaths) {
  const dir = join(work, name);
  mkdirSync(dir);
  writeFileSync(
    join(dir, 'package.json'),
    JSON.stringify({ name, private: true, type: 'module' }, null, 2),
  );
  run('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', ...tarballPaths], dir);
  return dir;
}

const CONTRACTS_ESM = `
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import * as contracts from '@ledgence/contracts';
const { ContractError, LedgenceError, decodeSubmitCommand, canonicalJson, SUBMISSION_MAX_BYTES } = contracts;

const command = decodeSubmitCommand(JSON.stringify({
  idempotency_key: 'k-1',
  input: { tenant_id: 'acme', namespace: 'prod', queue: 'email', program: { name: 'send' }, data: { b: 1, a: [2] } },
}));
assert.equal(command.input.queue, 'email');
assert.equal(canonicalJson({ b: 1, a: [2] }), '{"a":[2],"b":1}');
assert.equal(SUBMISSION_MAX_BYTES, 2 * 1024 * 1024);
assert.throws(() => decodeSubmitCommand('{"a":1,"a":2}'), (e) => e instanceof ContractError && e.code === 'invalid_input');

// instanceof across two installed copies of the package.
const other = await import(process.argv[2]);
assert.notEqual(other.ContractError, ContractError, 'the second copy must be a distinct module');
const foreign = new other.ContractError('conflict', 'from the other copy');
assert.ok(foreign instanceof ContractError, 'a foreign ContractError is a ContractError');
assert.ok(foreign instanceof LedgenceError, 'a foreign ContractError is a LedgenceError');
assert.ok(!(new Error('x') instanceof ContractError), 'a plain Error is not a ContractError');
console.log('contracts: ESM import, decoding and cross-copy instanceof ok');
`;

const CONTRACTS_TS = `
import { ContractError, decodeSubmitCommand, type SubmitCommand, type TaskState } from '@ledgence/contracts';
const command: SubmitCommand = decodeSubmitCommand('{}');
const queue: string = command.input.queue;
const state: TaskState = 'queued';
// @ts-expect-error: 'paused' is not a TaskState, so the types are real, not any.
const wrong: TaskState = 'paused';
const error = new ContractError('not_found', 'missing');
const code: 'not_found' | string = error.code;
export { queue, state, wrong, code };
`;

const TSCONFIG = {
  compilerOptions: {
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    target: 'ES2022',
    strict: true,
    noEmit: true,
    skipLibCheck: false,
    types: [],
  },
  files: ['consumer.ts'],
};

try {
  const contracts = pack('@ledgence/contracts');
  run(bin('publint'), ['run', contracts, '--strict']);
  run(bin('attw'), [contracts, '--profile', 'esm-only']);

  const first = consumerProject('consumer-a', [contracts]);
  const second = consumerProject('consumer-b', [contracts]);
  writeFileSync(join(first, 'check.mjs'), CONTRACTS_ESM);
  const otherEntry = join(second, 'node_modules', '@ledgence', 'contracts', 'dist', 'index.js');
  run('node', ['check.mjs', `file://${otherEntry}`], first);

  writeFileSync(join(first, 'consumer.ts'), CONTRACTS_TS);
  writeFileSync(join(first, 'tsconfig.json'), JSON.stringify(TSCONFIG, null, 2));
  run('node', [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', first], first);
  console.log('packaging checks passed');
} finally {
  rmSync(work, { recursive: true, force: true });
}
