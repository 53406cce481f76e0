import { randomBytes } from 'node:crypto';
import postgres from 'postgres';
import { inject } from 'vitest';
import { ADMIN_URL_KEY, TEST_DATABASE_PREFIX } from './context.js';

/** A database of its own for one test file (DESIGN §13: tests never share state). */
export interface TestDatabase {
  /** postgres:// URL of this database. */
  readonly url: string;
  /** Its name: `ledgence_test_<prefix>_<random>`. */
  readonly name: string;
  /** Terminates its connections and drops it; idempotent. */
  drop(): Promise<void>;
}

/** Options of {@link createTestDatabase}. */
export interface CreateTestDatabaseOptions {
  /** Names the database after its user, for reading server logs: `[a-z0-9_]{1,24}`, default `db`. */
  prefix?: string;
  /**
   * Database to copy instead of the server's default `template1`, e.g. one that already holds
   * the migrated schema; nobody may be connected to it while copies are made.
   */
  template?: string;
  /**
   * A login role of the database's own, with this password, owning it: `url` connects as that
   * role, so a test knows the password its DATABASE_URL carries whatever the server's
   * authentication (trust, or the embedded server's fixed password). `drop()` drops the role too.
   * Letters, digits and `_` only.
   */
  password?: string;
}

const PREFIX = /^[a-z0-9_]{1,24}$/;
// Plain lower-case identifiers only: they need no quoting rules beyond the double quotes below.
const IDENTIFIER = /^[a-z_][a-z0-9_]{0,62}$/;
// A password quoted as a literal with no escaping needed.
const PASSWORD = /^[A-Za-z0-9_]{1,64}$/;

/**
 * Creates a uniquely named, empty database on the test server that the int/e2e global setup
 * started (or `DATABASE_URL`), typically in a test file's `beforeAll`, with `drop()` in its
 * `afterAll`.
 *
 * @example
 * ```ts
 * let db: TestDatabase;
 * beforeAll(async () => {
 *   db = await createTestDatabase({ prefix: 'claims' });
 * });
 * afterAll(() => db.drop());
 * ```
 *
 * @param options a readable prefix for the name, the template to copy, and a password of its own.
 * @returns the database's URL and name, and a way to drop it.
 */
export async function createTestDatabase(
  options: CreateTestDatabaseOptions = {},
): Promise<TestDatabase> {
  const prefix = options.prefix ?? 'db';
  if (!PREFIX.test(prefix)) {
    throw new TypeError(`test database prefix must match ${PREFIX}, got ${JSON.stringify(prefix)}`);
  }
  const { template } = options;
  if (template !== undefined && !IDENTIFIER.test(template)) {
    throw new TypeError(`template must match ${IDENTIFIER}, got ${JSON.stringify(template)}`);
  }
  const { password } = options;
  if (password !== undefined && !PASSWORD.test(password)) {
    throw new TypeError(`password must match ${PASSWORD}`);
  }
  const adminUrl = adminDatabaseUrl();
  const name = `${TEST_DATABASE_PREFIX}${prefix}_${randomBytes(6).toString('hex')}`;
  const from = template === undefined ? '' : ` template ${quote(template)}`;
  const owner = password === undefined ? '' : ` owner ${quote(name)}`;
  await withAdmin(adminUrl, async (sql) => {
    if (password !== undefined) {
      await sql.unsafe(`create role ${quote(name)} login password '${password}'`);
    }
    await sql.unsafe(`create database ${quote(name)}${from}${owner}`);
  });
  const url = databaseUrl(
    adminUrl,
    name,
    password === undefined ? undefined : { user: name, password },
  );

  let dropping: Promise<void> | undefined;
  const drop = (): Promise<void> => {
    dropping ??= withAdmin(adminUrl, async (sql) => {
      // FORCE terminates the database's sessions first (PostgreSQL 13+).
      await sql.unsafe(`drop database if exists ${quote(name)} with (force)`);
      if (password !== undefined) await sql.unsafe(`drop role if exists ${quote(name)}`);
    }).catch((error: unknown) => {
      dropping = undefined; // let a later call try again
      throw error;
    });
    return dropping;
  };
  return Object.freeze({ url, name, drop });
}

function adminDatabaseUrl(): string {
  const url: string | undefined = inject(ADMIN_URL_KEY);
  if (typeof url !== 'string' || url === '') {
    throw new Error(
      'createTestDatabase() found no test PostgreSQL server. Add ' +
        "'packages/store-postgres/src/testing/global-setup.ts' to this vitest project's " +
        '`globalSetup` (the int and e2e projects have it), and name the file *.int.test.ts.',
    );
  }
  return url;
}

async function withAdmin<T>(adminUrl: string, use: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(adminUrl, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    return await use(sql);
  } finally {
    await sql.end();
  }
}

/** The admin URL with its database swapped; credentials and query parameters are kept. */
function databaseUrl(
  adminUrl: string,
  database: string,
  login?: { user: string; password: string },
): string {
  const url = new URL(adminUrl);
  url.pathname = `/${database}`;
  if (login !== undefined) {
    url.username = login.user;
    url.password = login.password;
  }
  return url.toString();
}

function quote(identifier: string): string {
  return `"${identifier}"`;
}
