/**
 * What the maintenance passes read when there is nothing to do, over
 * 100 000 young terminal tasks in 2 000 namespaces, each with a finished attempt, two history
 * rows and a delivered callback, plus 20 000 live worker sessions and 1 000 policies: lease recovery, the callback
 * sender's lease and retention's walk over the namespaces with something due. Each statement the
 * store really sends (captured through postgres.js `debug`) is run again under
 * EXPLAIN (ANALYZE, BUFFERS) inside a rolled-back transaction: no sequential scan of the
 * history-holding tables, and a buffer count that does not grow with the terminal rows.
 */
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore, type PostgresTaskStore } from './store.js';
import { CONFIG } from './testdata/fixtures.js';
import type { TestDatabase } from './testing/database.js';
import { createMigratedTestDatabase } from './testing/migrated.js';

const TASKS = 100_000;
const NAMESPACES = 2_000;
/** Live worker sessions, ten per namespace. */
const SESSIONS = 20_000;
const HISTORY_TABLES =
  /Seq Scan on (tasks|attempts|task_history|task_payloads|completion_deliveries|completion_subscriptions|worker_sessions)\b/;

let db: TestDatabase;
let sql: postgres.Sql;
let store: PostgresTaskStore;
let capturing = false;
let captured: { query: string; params: unknown[] }[] = [];

beforeAll(async () => {
  db = await createMigratedTestDatabase('idle_reads');
  sql = postgres(db.url, { max: 1, onnotice: () => {} });
  // Store time, so the terminal tasks are a minute old: within every retention.
  const [clock] = await sql`select (extract(epoch from clock_timestamp()) * 1000)::bigint as now`;
  const now = Number(clock?.now);
  await sql`
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
      input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
      available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
    select 'acme', 'ns_' || lpad((g % ${NAMESPACES})::text, 5, '0'),
      'tsk_done_' || lpad(g::text, 8, '0'), 'run_' || g, 'done-' || g, 'x',
      '{}', 'q', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000, 0, '{}',
      'succeeded', ${now}::bigint - 120000, ${now}::bigint - 120000, ${now}::bigint - 60000 + g,
      1, 1, '{"state":"succeeded"}', 5
    from generate_series(1, ${TASKS}) as g`;
  await sql`
    insert into attempts (tenant_id, namespace, task_id, attempt_id, ordinal, lease_id,
      generation, worker_session_id, consumer_id, state, claimed_at, deadline,
      authority_deadline, lease_expires_at, renew_sequence, dispatch_allowed, quiescence,
      finished_at)
    select tenant_id, namespace, task_id, 'att_' || task_id, 1, 'lse_' || task_id, 1,
      'ses_x', 0, 'succeeded', terminal_at - 1000, terminal_at + 1000, terminal_at + 2000,
      terminal_at + 1000, 1, true, 'confirmed', terminal_at
    from tasks`;
  await sql`
    insert into task_payloads (tenant_id, namespace, task_id, data)
    select tenant_id, namespace, task_id, '{"n":1}' from tasks`;
  await sql`
    insert into task_history (tenant_id, namespace, task_id, sequence, at, reason)
    select tenant_id, namespace, task_id, s, terminal_at, 'submitted'
    from tasks, generate_series(1, 2) as s`;
  await sql`
    insert into completion_subscriptions (tenant_id, namespace, subscription_id, task_id,
      subscription_key, destination, event_id, created_at)
    select tenant_id, namespace, 'sub_' || task_id, task_id, 'k', 'billing', 'evt_' || task_id,
      terminal_at
    from tasks`;
  await sql`
    insert into completion_deliveries (tenant_id, namespace, subscription_id, task_id, state,
      generation, attempts, next_attempt_at, delivered_at, finished_at)
    select tenant_id, namespace, 'sub_' || task_id, task_id, 'delivered', 1, 1, null,
      terminal_at + 5, terminal_at + 5
    from tasks`;
  await sql`
    insert into worker_sessions (tenant_id, namespace, session_id, queue, concurrency,
      created_at, expires_at)
    select 'acme', 'ns_' || lpad((g % ${NAMESPACES})::text, 5, '0'), 'ses_live_' || g, 'q', 1,
      ${now}::bigint, ${now}::bigint + 300000
    from generate_series(1, ${SESSIONS}) as g`;
  // Half the namespaces have a policy of their own (30 days, no floor to speak of).
  await sql`
    insert into retention_policies (tenant_id, namespace, retention_ms, updated_at,
      retiring_before)
    select 'acme', 'ns_' || lpad(g::text, 5, '0'), 30 * 86400000::bigint, ${now}::bigint,
      ${now}::bigint - 7 * 86400000::bigint
    from generate_series(0, ${NAMESPACES - 1}, 2) as g`;
  // As autovacuum leaves them: statistics, and visibility maps for index-only scans.
  await sql`vacuum analyze`;
  const client = postgres(db.url, {
    max: 2,
    onnotice: () => {},
    debug: (_connection, query, params) => {
      if (capturing) captured.push({ query, params: [...params] });
    },
  });
  store = createPostgresTaskStore({ sql: client, config: CONFIG });
}, 120_000);

afterAll(async () => {
  await store?.sql.end();
  await sql?.end();
  await db?.drop();
});

/** The statements `body` sent, bar BEGIN/COMMIT, the store-time read and the driver's own. */
async function statementsOf(body: () => Promise<unknown>) {
  captured = [];
  capturing = true;
  try {
    await body();
  } finally {
    capturing = false;
  }
  return captured.filter(
    (c) =>
      !/^\s*(begin|commit|rollback)\b/i.test(c.query) &&
      // postgres.js reads array types once per new connection.
      !/from pg_catalog\.pg_type/.test(c.query) &&
      !/^\s*select \(extract\(epoch from clock_timestamp\(\)\) \* 1000\)::bigint(\s*\+[^,]*)? as now\s*$/i.test(
        c.query,
      ),
  );
}

/** The plan of one statement as it ran, with its buffer counts, in a rolled-back transaction. */
async function analyzed(statement: { query: string; params: unknown[] }) {
  let plan = '';
  await sql
    .begin(async (tx) => {
      const rows = await tx.unsafe(
        `explain (analyze, buffers, costs off, timing off) ${statement.query}`,
        statement.params as postgres.ParameterOrJSON<never>[],
      );
      plan = rows.map((row) => String(row['QUERY PLAN'])).join('\n');
      throw new Error('rollback');
    })
    .catch((error: unknown) => {
      if (!(error instanceof Error) || error.message !== 'rollback') throw error;
    });
  // The top node's buffers: everything the statement touched.
  const top = /Buffers: shared (?:hit=(\d+))?\s*(?:read=(\d+))?/.exec(plan);
  const buffers = Number(top?.[1] ?? 0) + Number(top?.[2] ?? 0);
  return { plan, buffers };
}

describe('maintenance passes with nothing to do, beside 100 000 terminal tasks', () => {
  it('lease recovery finds nothing through the active-attempts index', async () => {
    const statements = await statementsOf(async () => {
      expect((await store.recoverExpiredLeases()).scanned).toBe(0);
    });
    expect(statements).toHaveLength(1);
    for (const statement of statements) {
      const { plan, buffers } = await analyzed(statement);
      expect(plan).not.toMatch(HISTORY_TABLES);
      expect(buffers, plan).toBeLessThan(20);
    }
  });

  it("the callback sender's lease finds nothing through the lease index", async () => {
    const statements = await statementsOf(async () => {
      expect(await store.leaseDeliveries(100, 30_000)).toEqual([]);
    });
    expect(statements.length).toBeGreaterThan(0);
    for (const statement of statements) {
      const { plan, buffers } = await analyzed(statement);
      expect(plan).not.toMatch(HISTORY_TABLES);
      expect(buffers, plan).toBeLessThan(20);
    }
  });

  it('retention finds no namespace due in one read of a few descents per namespace', async () => {
    const statements = await statementsOf(async () => {
      expect(await store.dueRetentionScopes(undefined, 100)).toEqual([]);
    });
    expect(statements).toHaveLength(1);
    const [walk] = statements;
    if (walk === undefined) throw new Error('unreachable');
    const { plan, buffers } = await analyzed(walk);
    expect(plan).not.toMatch(HISTORY_TABLES);
    expect(plan).not.toMatch(/Seq Scan on retention_policies/);
    console.log(`[idle] due retention walk over ${NAMESPACES} namespaces: ${buffers} buffers`);
    // About a dozen index pages per namespace walked (two descents of each retention index,
    // the policy probe); reading on through later namespaces' live sessions is far more
    // (58 000 buffers and 30 s before).
    expect(buffers, plan).toBeLessThan(NAMESPACES * 16);
  });

  it("the walk over namespaces does not read on through later namespaces' live sessions", async () => {
    const statements = await statementsOf(async () => {
      const scopes = await store.retentionScopes(undefined, 100);
      // Every namespace holds terminal tasks; none of them is due.
      expect(scopes).toHaveLength(100);
    });
    const [walk] = statements;
    if (walk === undefined) throw new Error('unreachable');
    const { plan, buffers } = await analyzed(walk);
    expect(plan).not.toMatch(HISTORY_TABLES);
    console.log(`[idle] retention walk of 100 namespaces: ${buffers} buffers`);
    // 100 steps of a few descents each. Before: each step's session descent, bounded by
    // expires_at (not part of the descent), read every later live session.
    expect(buffers, plan).toBeLessThan(100 * 12);
  });
});
