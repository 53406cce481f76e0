/**
 * The HTTP app over the real PostgreSQL store in one test file, driven through `app.request()`
 * with one API key: what the edge tests and the limit tests share. The database, the store and
 * the app are made before the file's tests and dropped after them.
 */
import type { Scope } from '@ledgence/contracts';
import { createTaskService } from '@ledgence/core';
import { createHttpApp, type Role } from '@ledgence/http';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll } from 'vitest';

/** The tenant the key is bound to (every namespace of it). */
export const TENANT = 'acme';

/** A namespace of its own for each test, so listings see only that test's tasks. */
export const scopeFor = (namespace: string): Scope => ({ tenant_id: TENANT, namespace });

/** The tasks collection of a scope. */
export const tasksPath = (scope: Scope) =>
  `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks`;

/** A reply: its status, its body's byte length, and its body parsed as `T`. */
export interface CallReply<T> {
  status: number;
  bytes: number;
  body: T;
}

/** Sends one request as the file's key: a GET, or a POST of `json` (a string is sent as it is). */
export type Call = <T>(path: string, json?: unknown) => Promise<CallReply<T>>;

/**
 * Registers the file's database, store and app (`beforeAll`/`afterAll`) and returns the way to
 * call it. `name` names the test database; the key holds `roles` in every namespace of
 * {@link TENANT}.
 */
export function appOverPostgres(name: string, roles: Role[]): Call {
  const key = `${TENANT}-key-${name}-0123456789`;
  let db: TestDatabase | undefined;
  let store: PostgresTaskStore | undefined;
  let app: ReturnType<typeof createHttpApp> | undefined;
  beforeAll(async () => {
    db = await createMigratedTestDatabase(name);
    store = createPostgresTaskStore({ url: db.url, max: 4 });
    app = createHttpApp({
      service: createTaskService({ store }),
      auth: { keys: [{ key, tenant: TENANT, namespaces: ['*'], roles }] },
    });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });
  return async function call<T>(path: string, json?: unknown): Promise<CallReply<T>> {
    if (app === undefined) throw new Error('call() runs inside the tests, after beforeAll');
    const headers: Record<string, string> = { authorization: `Bearer ${key}` };
    let body: string | undefined;
    if (json !== undefined) {
      headers['content-type'] = 'application/json';
      body = typeof json === 'string' ? json : JSON.stringify(json);
    }
    const res = await app.request(path, {
      method: body === undefined ? 'GET' : 'POST',
      headers,
      body,
    });
    const bytes = new Uint8Array(await res.arrayBuffer());
    return {
      status: res.status,
      bytes: bytes.byteLength,
      body: JSON.parse(new TextDecoder().decode(bytes)) as T,
    };
  };
}
