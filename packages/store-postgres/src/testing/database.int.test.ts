import postgres from 'postgres';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from './database.js';

const created: TestDatabase[] = [];

async function create(prefix?: string): Promise<TestDatabase> {
  const db = await createTestDatabase(prefix === undefined ? {} : { prefix });
  created.push(db);
  return db;
}

function connect(url: string): postgres.Sql {
  return postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
}

async function exists(name: string): Promise<boolean> {
  const sql = connect(inject('ledgenceAdminDatabaseUrl'));
  try {
    const rows = await sql`select 1 from pg_database where datname = ${name}`;
    return rows.length === 1;
  } finally {
    await sql.end();
  }
}

afterAll(async () => {
  await Promise.all(created.map((db) => db.drop()));
});

describe('createTestDatabase', () => {
  it('gives each call its own, uniquely named database', async () => {
    const [one, two] = await Promise.all([create('isolation'), create('isolation')]);
    if (one === undefined || two === undefined) throw new Error('unreachable');
    expect(one.name).toMatch(/^ledgence_test_isolation_[0-9a-f]{12}$/);
    expect(two.name).not.toBe(one.name);
    expect(two.url).not.toBe(one.url);

    const sqlOne = connect(one.url);
    const sqlTwo = connect(two.url);
    try {
      const [where] = await sqlOne<{ name: string }[]>`select current_database() as name`;
      expect(where?.name).toBe(one.name);
      await sqlOne`create table only_here (n int)`;
      const [inOne] = await sqlOne`select to_regclass('only_here') as found`;
      const [inTwo] = await sqlTwo`select to_regclass('only_here') as found`;
      expect(inOne?.found).toBe('only_here');
      expect(inTwo?.found).toBeNull();
    } finally {
      await Promise.all([sqlOne.end(), sqlTwo.end()]);
    }
  });

  it('uses a default prefix and rejects names that would need quoting', async () => {
    const db = await create();
    expect(db.name).toMatch(/^ledgence_test_db_[0-9a-f]{12}$/);
    await expect(createTestDatabase({ prefix: 'Bad-Name' })).rejects.toThrow(TypeError);
    await expect(createTestDatabase({ template: 'x"; drop' })).rejects.toThrow(TypeError);
  });

  it('copies a template database when asked', async () => {
    const template = await create('template');
    const setup = connect(template.url);
    try {
      await setup`create table from_template (n int)`;
    } finally {
      await setup.end();
    }
    const copy = await createTestDatabase({ prefix: 'copy', template: template.name });
    created.push(copy);
    const sql = connect(copy.url);
    try {
      const [row] = await sql`select to_regclass('from_template') as found`;
      expect(row?.found).toBe('from_template');
    } finally {
      await sql.end();
    }
  });

  it('drops the database even while a connection is open, and drops idempotently', async () => {
    const db = await create('drop');
    const sql = connect(db.url);
    await sql`select 1`;
    expect(await exists(db.name)).toBe(true);

    await db.drop();
    expect(await exists(db.name)).toBe(false);
    // The open session was terminated, not waited for.
    await expect(sql`select 1`).rejects.toThrow();
    await sql.end();
    await db.drop();
  });
});
