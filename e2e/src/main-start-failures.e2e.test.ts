/**
 * What `ledgence-server` tells an operator whose start fails for a reason
 * found only at start (README "Start failures exit 1 with one line on stderr, e.g.
 * `127.0.0.1:8080 is taken: stop what listens there or set PORT`"; the project rule "Errors say
 * what to do"; DESIGN §11 "clear message on error"). Each message must name the variable to fix.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exitWithin } from './processes.js';
import { spawnServerProcess } from './server-process.js';

/**
 * The server process with `env`: its stderr, and its exit code or signal. One SIGTERM is sent as
 * soon as `sigtermWhen` holds (polled every 10 ms); the process is SIGKILLed after `limitMs` (a
 * hang).
 */
async function runMain(
  env: Record<string, string>,
  { sigtermWhen, limitMs = 60_000 }: { sigtermWhen?: () => boolean; limitMs?: number } = {},
): Promise<{ code: number | string; stderr: string }> {
  const run = spawnServerProcess(env);
  const term =
    sigtermWhen === undefined
      ? undefined
      : setInterval(() => {
          if (!sigtermWhen()) return;
          clearInterval(term);
          run.child.kill('SIGTERM');
        }, 10);
  const code = await exitWithin(run, limitMs);
  clearInterval(term);
  return { code, stderr: run.stderr() };
}

/** A plain HTTP server: what a DATABASE_URL with a wrong port often reaches. */
async function httpServer(): Promise<{
  url: string;
  connections: () => number;
  close: () => void;
}> {
  let connections = 0;
  const server = createServer((_req, res) => res.end('not PostgreSQL'));
  server.on('connection', () => {
    connections += 1;
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `postgres://ledgence:hunter2@127.0.0.1:${port}/ledgence`,
    connections: () => connections,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

const dir = mkdtempSync(join(tmpdir(), 'ledgence-start-failures-'));
let database: TestDatabase;

beforeAll(async () => {
  database = await createMigratedTestDatabase('start_failures');
});

afterAll(async () => {
  await database?.drop();
  rmSync(dir, { recursive: true, force: true });
});

describe('start failures name the variable to fix', () => {
  it('a DATABASE_URL where nothing listens: exit 1 naming DATABASE_URL, never the password', async () => {
    const { code, stderr } = await runMain({
      DATABASE_URL: 'postgres://ledgence:hunter2@127.0.0.1:1/ledgence',
    });
    expect(code, stderr).toBe(1);
    expect(stderr).not.toContain('hunter2');
    expect(stderr).toContain('DATABASE_URL');
  }, 90_000);

  it('a LEDGENCE_DATA_DIR inside a regular file: exit 1 naming LEDGENCE_DATA_DIR', async () => {
    const file = join(dir, 'not-a-folder');
    writeFileSync(file, 'x');
    const { code, stderr } = await runMain({
      DATABASE_URL: '',
      LEDGENCE_DATA_DIR: join(file, 'pg'),
    });
    expect(code, stderr).toBe(1);
    expect(stderr).toContain('LEDGENCE_DATA_DIR');
  }, 90_000);

  it('a HOST that does not resolve: exit 1 naming HOST, as an address not of this machine does', async () => {
    const { code, stderr } = await runMain({
      DATABASE_URL: database.url,
      HOST: '999.1.1.1',
      LEDGENCE_API_KEYS: JSON.stringify([
        { key: 'k_start_failures_0123456', tenant: 'acme', namespaces: ['*'], roles: ['client'] },
      ]),
    });
    expect(code, stderr).toBe(1);
    // As HOST=10.9.9.9 gets "HOST 10.9.9.9 is not an address of this machine: set HOST …".
    expect(stderr).toMatch(/\bHOST\b/);
  }, 90_000);
});

describe('a DATABASE_URL that reaches something other than PostgreSQL (an HTTP server)', () => {
  it('the start fails, exit 1 naming DATABASE_URL, instead of reconnecting forever', async () => {
    const http = await httpServer();
    try {
      const { code, stderr } = await runMain({ DATABASE_URL: http.url }, { limitMs: 60_000 });
      // Not a hang reconnecting in a loop: a few tries with backoff (postgres.js alone retried at
      // once and forever, tens of thousands of connections a minute to that server).
      expect({ code, connections: http.connections() }, stderr).toMatchObject({ code: 1 });
      expect(http.connections()).toBeLessThanOrEqual(10);
      expect(stderr).toContain('DATABASE_URL');
      expect(stderr).not.toContain('hunter2');
    } finally {
      http.close();
    }
  }, 90_000);

  it('one SIGTERM during that start abandons it and exits 0 (README "While starting")', async () => {
    const http = await httpServer();
    try {
      // Sent once the start met the server: its retries then have at least ~1.9 s of backoff
      // left before they give up (first-connection.ts), so the signal lands during the start. A
      // fixed delay raced them (once the start failed first, exit 1). The budget: the connect
      // timeout (10 s) plus the shutdown timeout (10 s), with room.
      const { code, stderr } = await runMain(
        { DATABASE_URL: http.url },
        { sigtermWhen: () => http.connections() >= 1, limitMs: 40_000 },
      );
      expect(code, stderr).toBe(0);
    } finally {
      http.close();
    }
  }, 90_000);
});
