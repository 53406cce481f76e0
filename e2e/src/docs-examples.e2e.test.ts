/**
 * Documentation examples no other test runs, executed as written (the URL swapped for the test
 * server's, the package names resolved to the workspace sources) in a Node process of their own,
 * as a user pastes them into a file and runs it.
 */
import { execFile, spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Client, silentLogger } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sourceArgs } from './server-process.js';
import { Stack, settled, sleep } from './test/harness.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const dir = mkdtempSync(join(tmpdir(), 'ledgence-docs-'));
// As root, the embedded PostgreSQL runs as `postgres`, which must enter the folders (0700 here).
chmodSync(dir, 0o755);
const PACKAGES: Record<string, string> = {
  '@ledgence/worker': 'packages/worker/src/index.ts',
  '@ledgence/contracts': 'packages/contracts/src/index.ts',
  '@ledgence/server': 'apps/server/src/index.ts',
  '@ledgence/store-postgres': 'packages/store-postgres/src/index.ts',
};

/** The first fenced block of `lang` after `marker` in `text`, as written. */
function blockAfter(text: string, marker: string, lang: string): string {
  const at = text.indexOf(marker);
  if (at < 0) throw new Error(`marker not found: ${marker}`);
  const open = text.indexOf(`\`\`\`${lang}\n`, at);
  const close = text.indexOf('\n```', open + 4);
  return text.slice(open + lang.length + 4, close + 1);
}

/** The `@example` of a module header, its ` * ` prefixes removed. */
function moduleExample(file: string): string {
  const source = readFileSync(join(root, file), 'utf8');
  const header = source.slice(0, source.indexOf('*/'));
  const block = header.slice(header.indexOf('```ts\n') + 6, header.lastIndexOf('```'));
  return block
    .split('\n')
    .map((line) => line.replace(/^ \* ?/, ''))
    .join('\n')
    .replace(/\n \*\s*$/, '\n');
}

/** Writes `code` as a file whose package imports point at the workspace sources. */
function script(name: string, code: string): string {
  let text = code;
  for (const [pkg, path] of Object.entries(PACKAGES)) {
    text = text.replaceAll(`'${pkg}'`, `'${pathToFileURL(join(root, path)).href}'`);
  }
  const file = join(dir, `${name}.mts`);
  writeFileSync(file, text);
  return file;
}

function runNode(
  file: string,
  options: { cwd?: string; timeoutMs: number },
): Promise<{ code: number | string; out: string; err: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      sourceArgs(file),
      { cwd: options.cwd ?? dir, timeout: options.timeoutMs, env: process.env },
      (error, out, err) => {
        const code = error === null ? 0 : (error.code ?? error.signal ?? -1);
        resolve({ code: code as number | string, out, err });
      },
    );
  });
}

const stack = new Stack('docs_examples');
beforeAll(async () => {
  await stack.open();
});
afterAll(async () => {
  await stack.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('packages/worker/README.md, its first example', () => {
  it('runs as written: the submitted task succeeds with {sent:true}, a task without `to` fails as no_recipient once, SIGTERM ends run()', async () => {
    const server = await stack.start();
    const url = server.url.replace(/\/$/, '');
    const readme = readFileSync(join(root, 'packages/worker/README.md'), 'utf8');
    const code = blockAfter(readme, '# @ledgence/worker', 'js');
    expect(code).toContain("const url = 'http://127.0.0.1:8080';");
    const file = script(
      'worker-readme',
      `${code.replace("'http://127.0.0.1:8080'", JSON.stringify(url))}\nconsole.log('run resolved');\n`,
    );
    const child = spawn(process.execPath, sourceArgs(file), {
      cwd: dir,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (c: Buffer) => {
      out += c.toString();
    });
    child.stderr.on('data', (c: Buffer) => {
      out += c.toString();
    });
    const exited = new Promise<number | string>((resolve) =>
      child.once('exit', (c, s) => resolve(c ?? s ?? -1)),
    );
    try {
      const client = new Client({ url, tenant: 'acme', namespace: 'prod', logger: silentLogger });
      // The example's own submission: wait for it to show up, then for its result.
      let ids: string[] = [];
      const end = Date.now() + 30_000;
      while (ids.length === 0 && Date.now() < end) {
        for await (const page of client.list({ queue: 'email' }))
          ids = page.tasks.map((t) => t.task_id);
        await sleep(100);
      }
      expect(ids, out).toHaveLength(1);
      const [done] = await settled(client, ids);
      expect(done?.outcome, out).toEqual({ state: 'succeeded', output: { sent: true } });

      const bad = await client.submit({ queue: 'email', program: 'send-email', data: {} });
      const [failed] = await settled(client, [bad.task_id]);
      expect(failed?.outcome).toMatchObject({
        state: 'failed',
        failure: { kind: 'application', error: { code: 'no_recipient', retryable: false } },
      });
      expect(failed?.status.attempt_count).toBe(1);
    } finally {
      child.kill('SIGTERM');
    }
    expect(await exited, out).toBe(0);
    expect(out).toContain('run resolved');
  });
});

describe('@ledgence/worker module example (src/index.ts)', () => {
  it('runs as written: prints the succeeded result, then stop() and run() end and the process exits', async () => {
    const server = await stack.start();
    const url = server.url.replace(/\/$/, '');
    const code = moduleExample('packages/worker/src/index.ts');
    expect(code).toContain("const url = 'http://127.0.0.1:8080';");
    const file = script(
      'worker-module',
      code.replace("'http://127.0.0.1:8080'", JSON.stringify(url)),
    );
    const run = await runNode(file, { timeoutMs: 60_000 });
    expect(run.code, run.err).toBe(0);
    expect(run.out).toContain("state: 'succeeded'");
    expect(run.out).toContain('sent: true');
  });
});

describe('@ledgence/server module example (src/index.ts)', () => {
  it('runs as written in an empty folder: prints http://127.0.0.1:<port>, stops, and the process exits', async () => {
    const cwd = mkdtempSync(join(dir, 'server-'));
    chmodSync(cwd, 0o777);
    const file = script('server-module', moduleExample('apps/server/src/index.ts'));
    const run = await runNode(file, { cwd, timeoutMs: 120_000 });
    expect(run.code, `${run.out}\n${run.err}`).toBe(0);
    expect(run.out).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/?$/m);
  }, 150_000);
});

describe('@ledgence/store-postgres module example (src/index.ts)', () => {
  it('runs as written in an empty folder: prints "true queued" and the process exits', async () => {
    const cwd = mkdtempSync(join(dir, 'store-'));
    chmodSync(cwd, 0o777);
    const file = script('store-module', moduleExample('packages/store-postgres/src/index.ts'));
    const run = await runNode(file, { cwd, timeoutMs: 120_000 });
    expect(run.code, `${run.out}\n${run.err}`).toBe(0);
    expect(run.out.trim()).toBe('true queued');
  }, 150_000);
});

describe('README "Running the server": "a second signal exits at once"', () => {
  it('a second SIGTERM during a drain held by an in-flight request exits at once, and the embedded PostgreSQL does not outlive it', async () => {
    const { startServerProcess } = await import('./server-process.js');
    const { connect } = await import('node:net');
    const dataDir = join(dir, 'second-signal-pg');
    const server = await startServerProcess({
      DATABASE_URL: '',
      LEDGENCE_DATA_DIR: dataDir,
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '60000',
    });
    const postmaster = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    const alive = (pid: number) => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    };
    expect(alive(postmaster)).toBe(true);
    const { port } = new URL(server.url);
    // An in-flight request: its body is still coming, so the graceful drain waits for it.
    const socket = connect(Number(port), '127.0.0.1');
    socket.on('error', () => {});
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    socket.write(
      'POST /v1/tenants/acme/namespaces/e2e/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"idem',
    );
    await sleep(300);
    try {
      server.child.kill('SIGTERM');
      await sleep(1_000);
      expect(alive(server.child.pid as number)).toBe(true); // draining
      const second = Date.now();
      server.child.kill('SIGTERM');
      const code = await server.exited;
      expect(Date.now() - second).toBeLessThan(3_000);
      expect(server.stderr()).toContain('SIGTERM again: exiting now');
      expect(code).toBe(1);
      // No orphan PostgreSQL left behind: the exit hook sent it a fast shutdown.
      const end = Date.now() + 10_000;
      while (alive(postmaster) && Date.now() < end) await sleep(100);
      expect(alive(postmaster)).toBe(false);
    } finally {
      socket.destroy();
      if (alive(postmaster)) process.kill(postmaster, 'SIGQUIT');
    }
  }, 90_000);
});
