/**
 * The SDK's Client in an application process of its own: calls to a server that never answers,
 * or that stalls mid-body, reject with a timeout TransportError in time, and the process then
 * exits on its own — no socket or timer left keeping it alive — through node:http and through a
 * custom fetch.
 */
import { spawn } from 'node:child_process';
import { createServer as createHttpServer, type Server } from 'node:http';
import { createServer as createTcpServer, type Socket, type Server as TcpServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, sourceArgs } from './server-process.js';
import { NAMESPACE, Stack, TENANT } from './test/harness.js';

const stack = new Stack('client_process');
let server: ServerProcess;
const closers: (() => Promise<void>)[] = [];

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterAll(async () => {
  for (const close of closers) await close();
  await stack.close();
});

function listen(s: Server | TcpServer, sockets: Set<Socket>): Promise<string> {
  s.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
  });
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        s.close(() => resolve());
      }),
  );
  return new Promise((resolve) => {
    s.listen(0, '127.0.0.1', () => {
      const address = s.address();
      if (address === null || typeof address === 'string') throw new Error('no port');
      resolve(`http://127.0.0.1:${address.port}`);
    });
  });
}

/** Accepts connections, reads everything, never answers. */
async function silentServer(): Promise<string> {
  return listen(
    createTcpServer((socket) => socket.resume()),
    new Set(),
  );
}

/** Sends 200 headers and the first byte of a JSON body, then stalls forever. */
async function stallingServer(): Promise<string> {
  return listen(
    createHttpServer((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{');
    }),
    new Set(),
  );
}

/** Runs `code` (an ES module body importing @ledgence/worker) in a child; its stdout JSON and exit. */
function runChild(code: string, env: Record<string, string>, killAfterMs: number) {
  const args = sourceArgs('').slice(0, -1);
  const child = spawn(process.execPath, [...args, '--input-type=module', '-e', code], {
    env: { ...process.env, ...env },
    // Resolve @ledgence/worker as the e2e package does.
    cwd: fileURLToPath(new URL('../', import.meta.url)),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  let killed = false;
  const killer = setTimeout(() => {
    killed = true;
    child.kill('SIGKILL');
  }, killAfterMs);
  return new Promise<{ code: number | null; killed: boolean; stdout: string; stderr: string }>(
    (resolve) => {
      child.once('exit', (exitCode) => {
        clearTimeout(killer);
        resolve({ code: exitCode, killed, stdout, stderr });
      });
    },
  );
}

const childCode = (withFetch: boolean) => `
import { Client, TransportError, silentLogger } from '@ledgence/worker';
const out = {};
const started = performance.now();
const opts = (url) => ({ url, tenant: '${TENANT}', namespace: '${NAMESPACE}', logger: silentLogger,
  requestTimeoutMs: 300, retries: 1, backoff: { baseMs: 10, maxMs: 20 }${withFetch ? ', fetch: globalThis.fetch' : ''} });
for (const name of ['SILENT', 'STALL']) {
  const t0 = performance.now();
  const error = await new Client(opts(process.env[name])).status('tsk_1').catch((e) => e);
  out[name] = { transport: error instanceof TransportError, reason: error?.reason, ms: Math.round(performance.now() - t0) };
}
const real = new Client(opts(process.env.REAL));
const task = await real.submit({ queue: 'client-exit', program: 'p' });
out.status = (await real.status(task.task_id)).task_id === task.task_id;
out.doneAt = Math.round(performance.now() - started);
process.stdout.write(JSON.stringify(out) + '\\n');
`;

describe('a Client in an application process', () => {
  it.each([
    ['node:http exchange', false],
    ['a custom fetch (globalThis.fetch)', true],
  ])(
    'with %s: calls to a silent and a stalling server reject with a timeout TransportError in time, and the process exits on its own',
    async (_name, withFetch) => {
      const env = { SILENT: await silentServer(), STALL: await stallingServer(), REAL: server.url };
      const run = await runChild(childCode(withFetch), env, 20_000);
      expect(run.stderr).toBe('');
      const out = JSON.parse(run.stdout);
      for (const name of ['SILENT', 'STALL']) {
        expect(out[name]).toMatchObject({ transport: true, reason: 'timeout' });
        // Two sends of 300 ms each, one backoff ≤ 20 ms, plus a margin.
        expect(out[name].ms).toBeLessThan(2 * 300 + 20 + 500);
      }
      expect(out.status).toBe(true);
      expect(run.killed).toBe(false);
      expect(run.code).toBe(0);
    },
    30_000,
  );
});
