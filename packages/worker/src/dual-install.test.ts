/**
 * `instanceof` across two real installed copies of the BUILT package (README:
 * typed errors survive duplicate installs). Each copy is `dist/` of @ledgence/worker and of
 * @ledgence/contracts under its own `node_modules`, imported by Node itself (not transformed),
 * so the two are distinct module instances with distinct classes.
 */
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const packages = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const root = mkdtempSync(join(tmpdir(), 'ledgence-dual-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

type Worker = typeof import('./index.js');
type Contracts = typeof import('@ledgence/contracts');

/** One install: node_modules/@ledgence/{worker,contracts} from dist, valibot linked. */
async function install(name: string): Promise<{ worker: Worker; contracts: Contracts }> {
  const modules = join(root, name, 'node_modules');
  for (const pkg of ['worker', 'contracts']) {
    const to = join(modules, '@ledgence', pkg);
    mkdirSync(to, { recursive: true });
    cpSync(join(packages, pkg, 'dist'), join(to, 'dist'), { recursive: true });
    // As published: `publishConfig.exports` replaces the workspace's source condition.
    const manifest = JSON.parse(readFileSync(join(packages, pkg, 'package.json'), 'utf8'));
    manifest.exports = manifest.publishConfig?.exports ?? manifest.exports;
    writeFileSync(join(to, 'package.json'), JSON.stringify(manifest));
  }
  symlinkSync(join(packages, 'contracts', 'node_modules', 'valibot'), join(modules, 'valibot'));
  const url = (pkg: string) =>
    pathToFileURL(join(modules, '@ledgence', pkg, 'dist', 'index.js')).href;
  return {
    worker: (await import(/* @vite-ignore */ url('worker'))) as Worker,
    contracts: (await import(/* @vite-ignore */ url('contracts'))) as Contracts,
  };
}

describe('typed errors across two installed copies of the built package', () => {
  it('instanceof holds for errors made by the other copy, and only for their own classes', async () => {
    const a = await install('a');
    const b = await install('b');
    expect(a.worker.ProblemError).not.toBe(b.worker.ProblemError);
    expect(a.contracts.ContractError).not.toBe(b.contracts.ContractError);
    const problem = {
      type: 'https://ledgence.dev/problems/not_found',
      title: 'Not found',
      status: 404,
      code: 'not_found' as const,
      detail: 'd',
    };
    const fromB = {
      problem: new b.worker.ProblemError(problem),
      transport: new b.worker.TransportError('x', { reason: 'network' }),
      protocol: new b.worker.ProtocolError('x'),
      application: new b.worker.ApplicationError('c', 'm'),
      aborted: new b.worker.TaskAbortedError('cancelled'),
      contract: new b.contracts.ContractError('invalid_input', 'x'),
    };
    expect(fromB.problem).toBeInstanceOf(a.worker.ProblemError);
    expect(fromB.problem).toBeInstanceOf(a.contracts.ContractError);
    expect(fromB.problem).toBeInstanceOf(a.contracts.LedgenceError);
    expect(fromB.transport).toBeInstanceOf(a.worker.TransportError);
    expect(fromB.protocol).toBeInstanceOf(a.worker.ProtocolError);
    expect(fromB.application).toBeInstanceOf(a.worker.ApplicationError);
    // A handler may rethrow its signal's reason made by another copy (a shared helper library).
    expect(fromB.aborted).toBeInstanceOf(a.worker.TaskAbortedError);
    expect(fromB.aborted).not.toBeInstanceOf(a.worker.ApplicationError);
    expect(fromB.contract).toBeInstanceOf(a.contracts.ContractError);
    expect(fromB.transport).not.toBeInstanceOf(a.worker.ProblemError);
    expect(fromB.contract).not.toBeInstanceOf(a.worker.ProblemError);
    expect(fromB.problem).not.toBeInstanceOf(a.worker.TransportError);
    expect(new Error('x')).not.toBeInstanceOf(a.worker.ProblemError);
    expect(a.worker.isRetryable(fromB.transport)).toBe(true);
    expect(a.worker.isRetryable(fromB.problem)).toBe(false);

    // A real failure of copy B's client, recognised by copy A.
    const client = new b.worker.Client({
      url: 'http://127.0.0.1:9',
      tenant: 't',
      namespace: 'n',
      retries: 0,
      logger: b.worker.silentLogger,
    });
    const error = await client.status('tsk_x').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(a.worker.TransportError);
    expect(error).toMatchObject({ code: 'transport_error', reason: 'network', retryable: true });
  });
});
