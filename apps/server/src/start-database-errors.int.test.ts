/**
 * What `startServer` says when DATABASE_URL reaches a PostgreSQL that will not do: a missing
 * database, a read-only server (a hot standby, or a multi-host URL whose first host is one), a
 * port that accepts connections and never answers. README "Start failures exit 1 with one line
 * on stderr" naming what to change; DESIGN §11 "clear message on error"; never the password
 * (server.ts databaseUrlError). A wrong password is not among them: with `DATABASE_URL` set, the
 * tests may run on a server that trusts every local connection.
 */
import { createServer, type Socket } from 'node:net';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { startServer } from './server.js';

const noFiles = (path: string): string => {
  throw new Error(`no file ${path} in this test`);
};
const silent = pino({ level: 'silent' });

let db: TestDatabase;
beforeAll(async () => {
  db = await createMigratedTestDatabase('start_db_errors');
});
afterAll(async () => {
  await db?.drop();
});

/** The start's failure on `url` (which must fail). */
async function startFailure(url: string): Promise<Error> {
  const config = loadConfig({ DATABASE_URL: url, PORT: '0' }, noFiles);
  const outcome = await startServer(config, { logger: silent }).then(
    async (server) => {
      await server.stop();
      return undefined;
    },
    (error: unknown) => error,
  );
  expect(outcome, 'the start failed').toBeInstanceOf(Error);
  return outcome as Error;
}

it('a missing database: names DATABASE_URL and the database, never the password', async () => {
  const url = new URL(db.url);
  url.pathname = '/start_db_errors_no_such_db';
  const error = await startFailure(url.toString());
  expect(error.message).toContain('DATABASE_URL');
  expect(error.message).toMatch(/"start_db_errors_no_such_db" does not exist/);
  if (url.password !== '') expect(error.message).not.toContain(decodeURIComponent(url.password));
});

it('a read-only server (a standby): names DATABASE_URL and says to point it at the primary', async () => {
  // A standby holds the primary's current schema and refuses every write: modelled by a
  // database whose sessions are read-only by default.
  const standby = await createMigratedTestDatabase('start_db_errors_standby');
  try {
    const admin = postgres(standby.url, { max: 1, onnotice: () => {} });
    try {
      await admin.unsafe(`alter database "${standby.name}" set default_transaction_read_only = on`);
    } finally {
      await admin.end();
    }
    const error = await startFailure(standby.url);
    expect(error.message).toContain('the database of DATABASE_URL is read-only');
    expect(error.message).toContain('point DATABASE_URL at the primary server'); // README's words
  } finally {
    await standby.drop();
  }
});

it('a port that accepts connections and never answers: the start fails in time, naming DATABASE_URL', async () => {
  const sockets: Socket[] = [];
  const silentServer = createServer((socket) => {
    sockets.push(socket);
  });
  await new Promise<void>((done) => silentServer.listen(0, '127.0.0.1', done));
  const { port } = silentServer.address() as { port: number };
  try {
    const error = await startFailure(`postgres://ledgence:hush-pw-5613@127.0.0.1:${port}/ledgence`);
    expect(error.message).toContain('DATABASE_URL');
    expect(error.message).toMatch(/within 10000 ms|CONNECT_TIMEOUT/);
    expect(error.message).not.toContain('hush-pw-5613');
  } finally {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((done) => silentServer.close(() => done()));
  }
}, 45_000);
