/**
 * A backend failure in the middle of an operation: the store's connection is terminated while
 * its transaction waits on a row lock. Nothing partial may remain, the caller sees
 * `unavailable` (never ownership_lost or an empty poll), and retrying the same command gives
 * the answer it would have given.
 */
import { ContractError } from '@ledgence/contracts';
import type postgres from 'postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { PostgresTaskStore } from './index.js';
import {
  acquireCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('failure');
});
afterAll(() => h.close());

/** A task of its own queue, claimed by slot 0 of a new session; `dispatched` also grants dispatch. */
async function claimed(store: PostgresTaskStore, name: string, dispatched: boolean) {
  const { snapshot } = await store.submit(submitCommand(name, { queue: name }));
  const session = await store.openSession({ scope: SCOPE, queue: name, concurrency: 1 });
  const { reply } = await store.acquire(acquireCommand(session.id, 0, 1, name), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error('expected an assignment');
  if (dispatched) await store.renew(renewCommand(reply.assignment.lease.owner, 1, 'dispatch'));
  return { snapshot, assignment: reply.assignment };
}

async function waitForLockWaiter(): Promise<number> {
  for (let i = 0; i < 500; i += 1) {
    const [row] = await h.sql<{ pid: number }[]>`
      select pid from pg_stat_activity
      where datname = current_database() and application_name = 'ledgence-store'
        and wait_event_type = 'Lock'`;
    if (row) return row.pid;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error('the store never waited on the lock');
}

/**
 * Holds a lock (`lock` runs on a blocker's open transaction), starts `operation`, waits until
 * the store's backend queues behind the lock, terminates that backend, and expects the
 * operation to fail as `unavailable`.
 */
async function expectUnavailableWhenTerminated(
  lock: (blocker: postgres.ReservedSql) => Promise<unknown>,
  operation: () => Promise<unknown>,
): Promise<void> {
  const blocker = await h.sql.reserve();
  try {
    await blocker`begin`;
    await lock(blocker);
    const pending = operation().then(
      () => 'answered',
      (error: unknown) => error,
    );
    const pid = await waitForLockWaiter();
    await h.sql`select pg_terminate_backend(${pid})`;
    const failure = await pending;
    expect(failure).toBeInstanceOf(ContractError);
    expect((failure as ContractError).code).toBe('unavailable');
    await blocker`rollback`;
  } finally {
    blocker.release();
  }
}

it('pg_terminate_backend mid-settle leaves no partial state; the retry gets the real answer', async () => {
  const store = h.makeStore(1);
  const { snapshot, assignment } = await claimed(store, 'victim', true);
  const command = successCommand(assignment, 'op-victim', { done: true });

  await expectUnavailableWhenTerminated(
    (blocker) => blocker`
      select 1 from tasks where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and task_id = ${snapshot.task_id} for update`,
    () => store.settle(command),
  );

  // Nothing of the settle was written.
  const attempt = await h.store.inspectAttempt(
    SCOPE,
    snapshot.task_id,
    assignment.lease.owner.attempt_id,
  );
  expect(attempt.settlement).toBeNull();
  expect(attempt.state).toBe('active');
  expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('active');
  const history = await h.store.history(SCOPE, snapshot.task_id, 0);
  expect(history.map((e) => e.event.reason)).toEqual([
    'submitted',
    'claimed',
    'dispatch_authorized',
  ]);

  // The same command again, on the same store (its pool reconnects): the answer it would have got.
  const retried = await store.settle(command);
  expect(retried.already_accepted).toBe(false);
  expect(retried.task_state).toBe('succeeded');
  expect((await store.settle(command)).already_accepted).toBe(true);
});

it('a terminated acquire is unavailable, not empty, and its retry claims the task', async () => {
  const store = h.makeStore(1);
  const { snapshot } = await store.submit(submitCommand('victim2', { queue: 'victim2' }));
  const session = await store.openSession({ scope: SCOPE, queue: 'victim2', concurrency: 1 });
  const blocker = await h.sql.reserve();
  try {
    await blocker`begin`;
    // Hold the slot's advisory lock, as a concurrent poll of the same slot would.
    await blocker`
      select pg_advisory_xact_lock(hashtextextended(${JSON.stringify([
        SCOPE.tenant_id,
        SCOPE.namespace,
        session.id,
        0,
      ])}, 0))`;
    const pending = store
      .acquire(acquireCommand(session.id, 0, 1, 'victim2'), { recordEmpty: true })
      .then(
        (value) => value,
        (error: unknown) => error,
      );
    const [row] = await (async () => {
      for (let i = 0; i < 500; i += 1) {
        const rows = await h.sql<{ pid: number }[]>`
          select pid from pg_stat_activity
          where datname = current_database() and application_name = 'ledgence-store'
            and wait_event_type = 'Lock'`;
        if (rows.length > 0) return rows;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      throw new Error('no waiter');
    })();
    await h.sql`select pg_terminate_backend(${row?.pid ?? 0})`;
    const failure = await pending;
    expect(failure).toBeInstanceOf(ContractError);
    expect((failure as ContractError).code).toBe('unavailable');
    await blocker`rollback`;
  } finally {
    blocker.release();
  }
  const [cursor] =
    await h.sql`select 1 from consumer_cursors where worker_session_id = ${session.id}`;
  expect(cursor).toBeUndefined();
  expect((await store.status(SCOPE, snapshot.task_id)).state).toBe('queued');
  const retried = await store.acquire(acquireCommand(session.id, 0, 1, 'victim2'), {
    recordEmpty: true,
  });
  expect(retried.reply.disposition).toBe('assigned');
});

it('a settle that waited on the task lock past its lease decides at the time it acts', async () => {
  // The River #1302 shape made deterministic: the completer is delayed (here by a held row
  // lock) until after the lease ended. It must not accept with the time it started at, and
  // recovery then owns the outcome: exactly one outcome, consistent history.
  const store = h.makeStore(1);
  const { snapshot, assignment } = await claimed(store, 'delayed', false);
  const blocker = await h.sql.reserve();
  let settled: unknown;
  try {
    await blocker`begin`;
    await blocker`
      select 1 from tasks where tenant_id = ${SCOPE.tenant_id} and namespace = ${SCOPE.namespace}
        and task_id = ${snapshot.task_id} for update`;
    const pending = store.settle(successCommand(assignment, 'too-late')).then(
      (value) => value,
      (error: unknown) => error,
    );
    await waitForLockWaiter();
    h.advance(5_000); // the lease ends while the settle waits
    await blocker`rollback`;
    settled = await pending;
  } finally {
    blocker.release();
  }
  expect(settled).toBeInstanceOf(ContractError);
  expect((settled as ContractError).code).toBe('ownership_lost');
  expect((await h.store.recoverExpiredLeases()).recovered).toBeGreaterThanOrEqual(1);
  expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('queued');
  const history = await h.store.history(SCOPE, snapshot.task_id, 0);
  expect(history.map((e) => e.event.reason)).toEqual([
    'submitted',
    'claimed',
    'lease_expired',
    'retry_scheduled',
  ]);
});

it('a readiness read killed mid-query leaves a pool that still serves', async () => {
  // Readiness probes keep coming while PostgreSQL restarts. postgres.js 3.4.9 left a connection
  // killed mid-query poisoned (#1208) and its FATAL error pending for the next startup; the
  // patched driver reconnects it cleanly (patches/postgres@3.4.9.patch).
  const store = h.makeStore(1);
  expect(await store.migrationStatus()).toMatchObject({ current: true, pending: [] });
  await expectUnavailableWhenTerminated(
    (blocker) => blocker`lock table drizzle.__drizzle_migrations in access exclusive mode`,
    () => store.migrationStatus(),
  );
  // The pool's only connection was the killed one: these run on its next life.
  expect(await store.migrationStatus()).toMatchObject({ current: true });
  expect(Number.isSafeInteger(await store.now())).toBe(true);
});

it('a pipelined write that fails undoes the writes sent before it; the retry gets the real answer', async () => {
  // The flush of a settle sends its writes together (attempt, task, output, history, NOTIFY):
  // a history insert failing in the middle must take the attempt and task updates sent before
  // it down with it, and the statements after it must not apply.
  const store = h.makeStore(1);
  const { snapshot, assignment } = await claimed(store, 'pipelined', true);
  const command = successCommand(assignment, 'op-pipelined', { done: true });

  await h.sql.unsafe(`
    create function refuse_report() returns trigger language plpgsql as $$
    begin
      if new.task_id = '${snapshot.task_id}' and new.reason = 'report_accepted' then
        raise exception 'history refused by the test';
      end if;
      return new;
    end $$;
    create trigger refuse_report before insert on task_history
      for each row execute function refuse_report();`);
  try {
    const failure = await store.settle(command).then(
      () => 'answered',
      (error: unknown) => error,
    );
    expect(failure).toBeInstanceOf(ContractError);
    expect((failure as ContractError).code).toBe('unavailable');
  } finally {
    await h.sql.unsafe(
      'drop trigger refuse_report on task_history; drop function refuse_report();',
    );
  }

  const attempt = await h.store.inspectAttempt(
    SCOPE,
    snapshot.task_id,
    assignment.lease.owner.attempt_id,
  );
  expect(attempt.settlement).toBeNull();
  expect(attempt.state).toBe('active');
  expect((await h.store.status(SCOPE, snapshot.task_id)).state).toBe('active');
  expect((await h.store.result(SCOPE, snapshot.task_id)).outcome.state).toBe('pending');
  expect((await h.store.history(SCOPE, snapshot.task_id, 0)).map((e) => e.event.reason)).toEqual([
    'submitted',
    'claimed',
    'dispatch_authorized',
  ]);

  // The same store (the failed transaction was rolled back, its connection reused) settles it.
  const retried = await store.settle(command);
  expect(retried.already_accepted).toBe(false);
  expect(retried.task_state).toBe('succeeded');
  expect((await h.store.result(SCOPE, snapshot.task_id)).outcome.state).toBe('succeeded');
});
