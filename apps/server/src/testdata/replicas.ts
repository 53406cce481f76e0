/**
 * Two replicas of the real server (`startServer`, real sockets) on one test database of their
 * own, configured by environment variables as `main.ts` would be, with a local receiver that
 * answers their completion callbacks 204: for the files that compare what one replica answers
 * with what the other does, also across a restart. Made before the file's tests, stopped after.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll } from 'vitest';
import { loadConfig } from '../config.js';
import { type RunningServer, startServer } from '../server.js';

/** A reply as sent: its status and text, and the text parsed (undefined when empty). */
export interface TextReply {
  status: number;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: replies are read loosely, problem or value
  body: any;
}

/** The file's replicas (see {@link serverReplicas}). */
export interface Replicas {
  /** The first replica; {@link Replicas.restartA} replaces it. */
  readonly a: RunningServer;
  /** The second replica. */
  readonly b: RunningServer;
  /** A client of the replicas' database, to age records as time would. */
  readonly sql: postgres.Sql;
  /** Stops the first replica and starts a new one on the same database in its place. */
  restartA(): Promise<void>;
  /** One request to `server` with the file's key: a JSON body when `json` is given. */
  call(server: RunningServer, method: string, path: string, json?: unknown): Promise<TextReply>;
}

/** How {@link serverReplicas} configures the replicas. */
export interface ReplicasOptions {
  /** Names the test database. */
  prefix: string;
  /** The API key every call is sent with; the replicas give it every role in tenant `acme`. */
  key: string;
  /**
   * The replicas' environment beside `DATABASE_URL`, `PORT` and the key, from the receiver's
   * URL (for `LEDGENCE_CALLBACK_DESTINATIONS`).
   */
  env: (receiverUrl: string) => Record<string, string>;
}

/** Registers the file's replicas (`beforeAll`/`afterAll`); their fields are read in tests. */
export function serverReplicas(options: ReplicasOptions): Replicas {
  const receiver = createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(204).end());
  });
  let db: TestDatabase | undefined;
  let env: Record<string, string> = {};
  const running: { a?: RunningServer; b?: RunningServer; sql?: postgres.Sql } = {};
  const start = () =>
    startServer(
      loadConfig(env, (path) => {
        throw new Error(`no file ${path}`);
      }),
      { logger: pino({ level: 'silent' }) },
    );
  beforeAll(async () => {
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    const { port } = receiver.address() as AddressInfo;
    db = await createTestDatabase({ prefix: options.prefix });
    env = {
      ...options.env(`http://127.0.0.1:${port}`),
      DATABASE_URL: db.url,
      PORT: '0',
      LEDGENCE_API_KEYS: JSON.stringify([
        {
          key: options.key,
          tenant: 'acme',
          namespaces: ['*'],
          roles: ['client', 'worker', 'admin'],
        },
      ]),
    };
    running.a = await start();
    running.b = await start();
    running.sql = postgres(db.url, { max: 2, onnotice: () => {} });
  }, 60_000);
  afterAll(async () => {
    await running.sql?.end();
    await running.a?.stop();
    await running.b?.stop();
    await db?.drop();
    await new Promise<void>((resolve) => receiver.close(() => resolve()));
  });
  const started = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error('the replicas start in beforeAll');
    return value;
  };
  return {
    get a() {
      return started(running.a);
    },
    get b() {
      return started(running.b);
    },
    get sql() {
      return started(running.sql);
    },
    async restartA() {
      await started(running.a).stop();
      running.a = await start();
    },
    async call(server, method, path, json) {
      const headers: Record<string, string> = { authorization: `Bearer ${options.key}` };
      let body: string | undefined;
      if (json !== undefined) {
        headers['content-type'] = 'application/json';
        body = JSON.stringify(json);
      }
      const res = await fetch(`${server.url}${path}`, { method, headers, body });
      const text = await res.text();
      return { status: res.status, text, body: text.length === 0 ? undefined : JSON.parse(text) };
    },
  };
}

/** `read` again every 50 ms until `done` holds of its value or 20 s passed; the last value. */
export async function until<T>(read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const value = await read();
    if (done(value) || Date.now() > deadline) return value;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
