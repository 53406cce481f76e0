/**
 * What the fuzz (T5) and tenant-matrix (T6) suites share: a real server
 * process with API keys on a test database, the routes its OpenAPI document
 * lists, a digest of every table to prove "nothing changed", raw HTTP/1.1
 * exchanges over node:net for bytes fetch will not send, the server's
 * resident memory, and status histograms.
 */
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { Stack } from '@ledgence/e2e/harness';
import type { ServerProcess } from '@ledgence/e2e/server-process';
import postgres from 'postgres';

/** One API key as `LEDGENCE_API_KEYS` takes it. */
export interface KeySetting {
  key: string;
  tenant: string;
  namespaces: string[];
  roles: ('client' | 'worker' | 'admin')[];
}

/** A callback destination alias every suite server knows (nothing listens there). */
export const DESTINATION = 'billing';

const DESTINATIONS = JSON.stringify({
  [DESTINATION]: {
    // Port 9 (discard) on loopback: deliveries never become due in these suites anyway.
    url: 'http://127.0.0.1:9/hook',
    secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
  },
});

/** A started suite server, its stack, and how to end both. */
export interface KeyedServer {
  readonly stack: Stack;
  readonly server: ServerProcess;
  readonly url: string;
  /** Kills the server and drops the database; safe to call more than once. */
  close(): Promise<void>;
}

/**
 * Opens a test database and starts one server process on it with `keys` and
 * the {@link DESTINATION} alias. Everything is torn down if the start fails.
 */
export async function startKeyedServer(
  prefix: string,
  keys: readonly KeySetting[],
): Promise<KeyedServer> {
  const stack = new Stack(prefix);
  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= stack.close();
    return closed;
  };
  try {
    await stack.open();
    const server = await stack.start({
      LEDGENCE_API_KEYS: JSON.stringify(keys),
      LEDGENCE_CALLBACK_DESTINATIONS: DESTINATIONS,
      // Long enough that a lease taken for a fixture outlives the suite, so the
      // recovery loop never changes the record while a suite compares snapshots.
      LEDGENCE_LEASE_DURATION_MS: '600000',
      LEDGENCE_CLEANUP_GRACE_MS: '600000',
    });
    return { stack, server, url: server.url, close };
  } catch (error) {
    await close();
    throw error;
  }
}

/** One operation of the server's OpenAPI document. */
export interface Operation {
  operationId: string;
  /** Upper case, as sent. */
  method: string;
  /** The OpenAPI template, e.g. `/v1/tenants/{tenant_id}/namespaces/{namespace}/tasks`. */
  path: string;
  /** `client`, `worker`, `admin` or `public` (the `x-ledgence-access` extension). */
  access: string;
  /** The request body's JSON Schema, when the operation takes one. */
  body?: { schema: JsonSchema; required: boolean };
}

/** A JSON Schema as the document holds it. */
export type JsonSchema = Record<string, unknown>;

/** The server's OpenAPI document, reduced to what the suites read. */
export interface ApiDocument {
  operations: Operation[];
  /** `components.schemas`, to resolve `$ref`s. */
  schemas: Record<string, JsonSchema>;
}

/** Reads `GET /openapi.json`: every mounted route, so a new route is covered by itself. */
export async function readApiDocument(url: string): Promise<ApiDocument> {
  const res = await fetch(`${url}/openapi.json`);
  if (res.status !== 200) throw new Error(`/openapi.json answered ${res.status}`);
  const doc = (await res.json()) as {
    paths: Record<string, Record<string, Record<string, unknown>>>;
    components: { schemas: Record<string, JsonSchema> };
  };
  const operations: Operation[] = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, raw] of Object.entries(item)) {
      const request = raw.requestBody as
        | { required?: boolean; content: Record<string, { schema: JsonSchema }> }
        | undefined;
      const schema = request?.content['application/json']?.schema;
      const operation: Operation = {
        operationId: String(raw.operationId),
        method: method.toUpperCase(),
        path,
        access: String(raw['x-ledgence-access']),
      };
      if (schema !== undefined) operation.body = { schema, required: request?.required === true };
      operations.push(operation);
    }
  }
  return { operations, schemas: doc.components.schemas };
}

/** `template` with each `{name}` replaced by `values[name]` (URL-encoded). */
export function fillPath(template: string, values: Readonly<Record<string, string>>): string {
  return template.replace(/\{([a-z_]+)\}/g, (_, name: string) => {
    const value = values[name];
    if (value === undefined) throw new Error(`no value for the path parameter {${name}}`);
    return encodeURIComponent(value);
  });
}

/** Rows and a content hash of one table. */
export interface TableDigest {
  rows: number;
  md5: string;
}

/**
 * A digest of every base table of the database's current schema (found in
 * the catalog, so a table added later is covered without naming it here):
 * row count and an order-independent hash of the rows' text.
 */
export async function databaseDigest(databaseUrl: string): Promise<Record<string, TableDigest>> {
  const sql = postgres(databaseUrl, { max: 1, onnotice: () => {} });
  try {
    const tables = await sql<{ name: string }[]>`
      select table_name as name from information_schema.tables
      where table_schema = current_schema() and table_type = 'BASE TABLE'
      order by table_name`;
    const digest: Record<string, TableDigest> = {};
    for (const { name } of tables) {
      const [row] = await sql<{ rows: number; md5: string }[]>`
        select count(*)::int as rows,
               md5(coalesce(string_agg(t::text, '|' order by t::text), '')) as md5
        from ${sql(name)} t`;
      digest[name] = row ?? { rows: 0, md5: '' };
    }
    return digest;
  } finally {
    await sql.end({ timeout: 5 });
  }
}

/** The resident set size of process `pid` in bytes (Linux `/proc/<pid>/status`, VmRSS). */
export function residentBytes(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const match = /^VmRSS:\s+(\d+)\s+kB$/m.exec(status);
  if (match?.[1] === undefined) throw new Error(`no VmRSS for process ${pid}`);
  return Number(match[1]) * 1024;
}

/** What a raw exchange saw: the reply's status and body, or that none came. */
export type RawOutcome = { status: number; body: string } | { status: undefined; reason: string };

/**
 * Sends `head` and then each chunk of `body` over a fresh TCP connection and
 * reads the reply. For requests fetch will not make: chunked bodies with
 * chosen framing, lying `Content-Length`s, raw header bytes. Writing stops as
 * soon as a reply starts (a server may answer 413 mid-stream); the connection
 * is ended after the last chunk. `timeoutMs` only bounds a server that never
 * answers (reported, not assumed).
 */
export function rawExchange(
  url: string,
  head: string,
  body: readonly Uint8Array[] = [],
  timeoutMs = 15_000,
): Promise<RawOutcome> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const socket = connect({ host: hostname, port: Number(port) });
    let received = '';
    let status: number | undefined;
    let sending = true;
    let done = false;
    const finish = (outcome: RawOutcome) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(outcome);
    };
    const replyBody = () => {
      const end = received.indexOf('\r\n\r\n');
      return end === -1 ? '' : received.slice(end + 4);
    };
    const timer = setTimeout(() => finish({ status: undefined, reason: 'timeout' }), timeoutMs);
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      received += chunk;
      status ??= Number(/^HTTP\/1\.[01] (\d{3}) /.exec(received)?.[1] ?? Number.NaN) || undefined;
      const end = received.indexOf('\r\n\r\n');
      if (status === undefined || end === -1) return;
      const length = /\r\ncontent-length: *(\d+)/i.exec(received.slice(0, end))?.[1];
      if (length !== undefined && replyBody().length >= Number(length)) {
        finish({ status, body: replyBody() });
      }
    });
    // A server that answers early (413, 400) may reset the connection while the
    // rest of the body is still being written, and the reset can overtake its
    // reply; callers decide whether `reset while sending` is a refusal.
    socket.on('error', () => {
      if (status !== undefined) finish({ status, body: replyBody() });
      else finish({ status: undefined, reason: sending ? 'reset while sending' : 'reset' });
    });
    socket.on('close', () => {
      if (status !== undefined) finish({ status, body: replyBody() });
      else finish({ status: undefined, reason: 'closed without a reply' });
    });
    socket.on('connect', async () => {
      const write = (data: string | Uint8Array) =>
        new Promise<void>((resolve) => {
          if (done || status !== undefined || socket.destroyed) resolve();
          else socket.write(data, () => resolve());
        });
      await write(head);
      for (const chunk of body) {
        if (done || status !== undefined) break;
        await write(chunk);
      }
      sending = false;
      if (!done) socket.end();
    });
  });
}

/** Counts of statuses (or of outcomes without one), by label. */
export class Histogram {
  readonly counts = new Map<string, number>();

  add(label: string | number): void {
    const key = String(label);
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
  }

  get total(): number {
    let sum = 0;
    for (const count of this.counts.values()) sum += count;
    return sum;
  }

  /** Labels that are 5xx statuses, with their counts. */
  serverErrors(): Record<string, number> {
    return Object.fromEntries([...this.counts].filter(([label]) => /^5\d\d$/.test(label)));
  }

  /** `label×count` pairs, sorted by label, for printing. */
  toString(): string {
    return [...this.counts]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([label, count]) => `${label}×${count}`)
      .join(' ');
  }
}

/** Runs `work` over `items` with at most `limit` in flight, in order of start. */
export async function inParallel<T>(
  items: readonly T[],
  limit: number,
  work: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  const lanes = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) {
      const index = next++;
      await work(items[index] as T, index);
    }
  });
  await Promise.all(lanes);
}
