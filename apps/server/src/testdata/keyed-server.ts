/**
 * The real server (`startServer`, real sockets) over a test database of its own, configured by
 * environment variables as `main.ts` would be, for test files that send requests as several API
 * keys. The database and the server are made before the file's tests and stopped after them.
 */
import { once } from 'node:events';
import { request as httpRequest } from 'node:http';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll } from 'vitest';
import { loadConfig } from '../config.js';
import { type RunningServer, startServer } from '../server.js';

// biome-ignore lint/suspicious/noExplicitAny: replies are read loosely, problem or value
type Loose = any;

/** A reply: its status, its body's byte length, and its body parsed (undefined when empty). */
export interface KeyedReply<T = Loose> {
  status: number;
  bytes: number;
  body: T;
}

/** A request sent byte for byte: only the headers given (no client-added Content-Type). */
export interface RawRequest {
  method: string;
  path: string;
  /** Sent as `Authorization: Bearer <key>`; none when absent. */
  key?: string;
  headers?: Record<string, string>;
  /** Sent with a `Content-Length`; no body at all when absent. */
  body?: string | Buffer;
  /**
   * Sends `body` with `Transfer-Encoding: chunked` instead, written `chunkBytes` at a time
   * (pieces that may split a UTF-8 character, as a stream's do).
   */
  chunkBytes?: number;
}

/** The file's server: its URL, and one request sent as `key` (a POST of `json` when given). */
export interface KeyedServer {
  readonly url: string;
  call<T = Loose>(
    key: string,
    method: string,
    path: string,
    json?: unknown,
  ): Promise<KeyedReply<T>>;
  /**
   * One request over `node:http`, which adds no Content-Type of its own (fetch sends a string
   * body as `text/plain`), for the wire rules about content types and empty bodies.
   */
  send<T = Loose>(request: RawRequest): Promise<KeyedReply<T>>;
  /** {@link call} as `key`, by method: for files that send every request as one key. */
  as(key: string): KeyedCalls;
}

/** Requests sent as one key (see {@link KeyedServer.as}). */
export interface KeyedCalls {
  /** A POST of `json` (no body when absent). */
  post<T = Loose>(path: string, json?: unknown): Promise<KeyedReply<T>>;
  /** A GET. */
  get<T = Loose>(path: string): Promise<KeyedReply<T>>;
}

/**
 * Registers the file's database and server (`beforeAll`/`afterAll`). `prefix` names the test
 * database; `env` is the server's environment beside `DATABASE_URL` and `PORT`.
 */
export function keyedServer(prefix: string, env: Record<string, string>): KeyedServer {
  let db: TestDatabase | undefined;
  let server: RunningServer | undefined;
  beforeAll(async () => {
    db = await createTestDatabase({ prefix });
    const config = loadConfig({ ...env, DATABASE_URL: db.url, PORT: '0' }, (path) => {
      throw new Error(`no file ${path}`);
    });
    server = await startServer(config, { logger: pino({ level: 'silent' }) });
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
    await db?.drop();
  });
  const started = (): RunningServer => {
    if (server === undefined) throw new Error('the server starts in beforeAll');
    return server;
  };
  const keyed: KeyedServer = {
    get url() {
      return started().url;
    },
    as: (key) => ({
      post: (path, json) => keyed.call(key, 'POST', path, json),
      get: (path) => keyed.call(key, 'GET', path),
    }),
    async call(key, method, path, json) {
      const headers: Record<string, string> = { authorization: `Bearer ${key}` };
      let body: string | undefined;
      if (json !== undefined) {
        headers['content-type'] = 'application/json';
        body = JSON.stringify(json);
      }
      const res = await fetch(`${started().url}${path}`, { method, headers, body });
      const text = await res.text();
      return {
        status: res.status,
        bytes: Buffer.byteLength(text),
        body: text.length === 0 ? undefined : JSON.parse(text),
      };
    },
    send(request) {
      const url = new URL(started().url);
      const headers: Record<string, string> = { ...request.headers };
      if (request.key !== undefined) headers.authorization = `Bearer ${request.key}`;
      const chunked = request.chunkBytes !== undefined;
      // Bytes, not a string: node:http writes a string body in one go with the header block,
      // encoded as UTF-8 — header values meant as latin1 bytes would then be encoded twice.
      const body = request.body === undefined ? undefined : Buffer.from(request.body);
      if (chunked) headers['transfer-encoding'] = 'chunked';
      else if (body !== undefined) headers['content-length'] = String(body.length);
      return new Promise((resolve, reject) => {
        const req = httpRequest(
          {
            host: url.hostname,
            port: url.port,
            path: request.path,
            method: request.method,
            headers,
          },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (chunk: Buffer) => chunks.push(chunk));
            res.on('end', () => {
              const text = Buffer.concat(chunks).toString('utf8');
              resolve({
                status: res.statusCode ?? 0,
                bytes: Buffer.byteLength(text),
                body: text.length === 0 ? undefined : JSON.parse(text),
              });
            });
            res.on('error', reject);
          },
        );
        req.on('error', reject);
        if (!chunked || body === undefined) {
          req.end(body);
          return;
        }
        const step = request.chunkBytes ?? body.length;
        (async () => {
          for (let at = 0; at < body.length; at += step) {
            if (!req.write(body.subarray(at, at + step))) await once(req, 'drain');
          }
          req.end();
        })().catch(reject);
      });
    },
  };
  return keyed;
}
