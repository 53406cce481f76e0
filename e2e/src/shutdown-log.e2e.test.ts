/**
 * When a graceful shutdown's budget (`LEDGENCE_SHUTDOWN_TIMEOUT_MS`) is used
 * up by an HTTP request that does not finish (a slow client still sending its body), the
 * server closes that connection. The operator reading the log must learn that requests were
 * cut, not be pointed at the database, which answered throughout.
 */
import { connect } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { NAMESPACE, SHORT_TIMINGS, Stack, sleep, TENANT } from './test/harness.js';

const stack = new Stack('shutdown_log');
let server: ServerProcess | undefined;

beforeAll(async () => {
  await stack.open();
});
afterAll(async () => {
  await server?.stop('SIGKILL');
  await stack.close();
});

it('a shutdown whose budget an unfinished request used up says so, without blaming the database', async () => {
  server = await startServerProcess(
    {
      DATABASE_URL: stack.databaseUrl,
      ...SHORT_TIMINGS,
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '1000',
      LEDGENCE_LOG_LEVEL: 'info',
    },
    { captureStdout: true },
  );
  const { port } = new URL(server.url);
  const body = JSON.stringify({
    input: { tenant_id: TENANT, namespace: NAMESPACE, queue: 'q', program: { name: 'p' } },
  });
  // A client that sends its headers and the first bytes of the body, then stalls.
  const socket = connect(Number(port), '127.0.0.1');
  socket.on('error', () => {});
  socket.write(
    `POST /v1/tenants/${TENANT}/namespaces/${NAMESPACE}/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 5)}`,
  );
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  await sleep(300);

  const child = server.child;
  const drained = new Promise<void>((resolve) => {
    if (child.stdout?.readableEnded) resolve();
    else child.once('close', () => resolve());
  });
  child.kill('SIGTERM');
  await closed; // cut at the budget
  await drained;

  const warnings = server
    .stdout()
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as { level: number; msg: string })
    .filter((line) => line.level >= 40)
    .map((line) => line.msg);
  // The database was reachable the whole time: it must not be named as what held the stop.
  expect(warnings.filter((msg) => /database/i.test(msg))).toEqual([]);
  // What did hold it — open HTTP requests/connections, closed at the budget — is logged.
  expect(warnings.some((msg) => /request|connection/i.test(msg))).toBe(true);
  // A log pipeline sees the start and both ends of the stop, not only stderr's lines.
  const lifecycle = server
    .stdout()
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => (JSON.parse(line) as { msg: string }).msg)
    .filter((msg) => ['listening', 'shutting down', 'stopped'].includes(msg));
  expect(lifecycle).toEqual(['listening', 'shutting down', 'stopped']);
});
