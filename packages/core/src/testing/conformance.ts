/**
 * The `TaskStore` conformance suite: every rule of DESIGN §5 and §4.1 as a
 * vitest test, driven only through the `TaskStore` interface, so the memory
 * store and the PostgreSQL store are held to the very same behaviour.
 *
 * Time: tests never sleep; they move store time with the harness's
 * `advance`. They also never assume time stands still between calls (a
 * PostgreSQL store's clock runs), so exact checks derive store time from what
 * a reply carries (a receipt's `accepted_at`, a history event's `at`, an
 * event's `time`) and other checks use bounds read with `store.now()`.
 *
 * Isolation: every test works in its own random scope, so tests sharing one
 * store never see each other's tasks. Recovery is global, so recovery
 * assertions concern only the test's own tasks, and counts are lower bounds.
 */
import {
  type AcquireReply,
  type Assignment,
  type Authority,
  ContractError,
  type ErrorCode,
  MAX_SUBMIT_DELAY_MS,
  MIN_TIMEOUT_MS,
  queueSource,
  type RecordedHistoryEvent,
  type RecoveryProgress,
  type Scope,
  type SubmitCommand,
  TASK_ATTEMPT_EVENT_TYPE,
  TASK_CURSOR_MAX_BYTES,
  TASK_LIST_DEFAULT_LIMIT,
  TASK_LIST_MAX_LIMIT,
  TASK_PAGE_MAX_BYTES,
  TASK_STATUS_MAX_BYTES,
  type TaskFilters,
  type TaskSnapshot,
  type TaskStatus,
  type Timestamp,
  type TransitionReason,
  utf8ByteLength,
  type WorkerSession,
} from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LifecycleConfig } from '../config.js';
import type { TaskStore } from '../ports.js';
import { minSubmitTimeoutMs } from '../submit.js';
import {
  acquireCommand,
  freshScope,
  openSessionCommand,
  ownerOf,
  renewCommand,
  settleApplicationError,
  settleExecutionFailure,
  settleSuccess,
  submitCommand,
  submitCommandWithStatusBytes,
  TEST_QUEUE,
  withKeysReversed,
} from './fixtures.js';

/**
 * What {@link runTaskStoreConformance} needs from the store under test. `S`
 * is the interface the suite drives: `TaskStore` here, a wider store for
 * suites of further ports (`CompletionConformanceHarness`).
 */
export interface ConformanceHarness<S extends TaskStore = TaskStore> {
  /** The store under test. Shared by every test of one suite run. */
  store: S;
  /** The lease timings the store applies; tests derive every wait from them. */
  config: LifecycleConfig;
  /** Moves store time forward by `ms` (e.g. an offset on the store's clock). */
  advance(ms: number): Promise<void>;
  /** Releases what the harness holds (connections, databases). */
  close(): Promise<void>;
}

/**
 * Asserts that `promise` rejects with a `ContractError` whose code is `code`,
 * through vitest's `expect(...).rejects`.
 *
 * @example await expectContractError(store.status(scope, 'tsk_missing'), 'not_found');
 */
export async function expectContractError(
  promise: Promise<unknown>,
  code: ErrorCode,
): Promise<void> {
  await expect(promise).rejects.toBeInstanceOf(ContractError);
  await expect(promise).rejects.toMatchObject({ code });
}

/** The assignment of an `assigned` reply; fails the test on any other disposition. */
export function assignmentOf(reply: AcquireReply): Assignment {
  expect(reply.disposition).toBe('assigned');
  if (reply.disposition !== 'assigned')
    throw new Error(`expected assigned, got ${reply.disposition}`);
  return reply.assignment;
}

/** The store time at which an attempt was claimed: its invocation event's `time`. */
function claimedAt(assignment: Assignment): Timestamp {
  return Date.parse(assignment.event.time);
}

function compareBytes(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

/** Listing order: descending (submitted_at, task_id bytes). */
function listingOrder(a: TaskStatus, b: TaskStatus): number {
  return b.submitted_at - a.submitted_at || compareBytes(b.task_id, a.task_id);
}

/** RecoveryProgress's own invariant (recovered = requeued + failed + cancelled ≤ scanned). */
function expectCoherentProgress(progress: RecoveryProgress): void {
  for (const count of [
    progress.scanned,
    progress.recovered,
    progress.requeued,
    progress.failed,
    progress.cancelled,
    progress.finalized,
  ]) {
    expect(Number.isSafeInteger(count) && count >= 0).toBe(true);
  }
  expect(progress.recovered).toBe(progress.requeued + progress.failed + progress.cancelled);
  expect(progress.recovered + progress.finalized).toBeLessThanOrEqual(progress.scanned);
  expect(typeof progress.has_more).toBe('boolean');
}

/** A test's view of the store: its own scope, and shorthands for common steps. */
export interface World<S extends TaskStore = TaskStore> {
  store: S;
  config: LifecycleConfig;
  scope: Scope;
  advance(ms: number): Promise<void>;
  /** A wait a quarter of a lease long: well inside any lease the test holds. */
  step(): number;
  /** Advances until store time is strictly after `at` (a lease expiry, an available_at). */
  advancePast(at: Timestamp): Promise<void>;
  submit(overrides?: Parameters<typeof submitCommand>[1]): Promise<TaskSnapshot>;
  session(overrides?: Parameters<typeof openSessionCommand>[1]): Promise<WorkerSession>;
  poll(
    session: WorkerSession,
    consumer: number,
    sequence: number,
    recordEmpty?: boolean,
  ): Promise<AcquireReply>;
  /** Submits one task, opens a one-slot session and claims the task with poll 1. */
  submitAndClaim(overrides?: Parameters<typeof submitCommand>[1]): Promise<Claimed>;
  /** Renews with intent `dispatch` and expects it granted. */
  dispatch(assignment: Assignment, sequence?: number): Promise<Authority>;
  /**
   * For each cap in turn: dispatches the claimed attempt, fails it (retryable), expects the task
   * re-queued after a delay in 1..cap, and claims the retry on the slot's next sequence.
   * Returns the last claimed assignment, ready for its own settlement.
   */
  failThroughRetries(claimed: Claimed, caps: readonly number[]): Promise<Assignment>;
  /** The whole history of a task, read page by page. */
  events(taskId: string): Promise<RecordedHistoryEvent[]>;
  reasons(taskId: string): Promise<TransitionReason[]>;
  /** Runs recovery passes until none reports more work; returns their sum. */
  recoverAll(): Promise<RecoveryProgress>;
}

/** A task claimed by slot 0 of its own one-slot session (poll 1). */
export interface Claimed {
  task: TaskSnapshot;
  session: WorkerSession;
  assignment: Assignment;
}

/** Recovery passes are bounded; this bounds the loop that drains them in a test. */
const MAX_RECOVERY_PASSES = 10_000;

/** A fresh {@link World} on `harness`: a random scope no other test uses. */
export function worldOf<S extends TaskStore>(harness: ConformanceHarness<S>): World<S> {
  const { store, config } = harness;
  const scope = freshScope();
  const world: World<S> = {
    store,
    config,
    scope,
    advance: (ms) => harness.advance(ms),
    step: () => Math.max(1, Math.floor(config.leaseDurationMs / 4)),
    async advancePast(at) {
      const now = await store.now();
      if (now <= at) await harness.advance(at - now + 1);
    },
    async submit(overrides) {
      const outcome = await store.submit(submitCommand(scope, overrides));
      expect(outcome.created).toBe(true);
      return outcome.snapshot;
    },
    session: (overrides) => store.openSession(openSessionCommand(scope, overrides)),
    async poll(session, consumer, sequence, recordEmpty = true) {
      const outcome = await store.acquire(acquireCommand(session, consumer, sequence), {
        recordEmpty,
      });
      return outcome.reply;
    },
    async submitAndClaim(overrides) {
      const task = await world.submit(overrides);
      const session = await world.session({ concurrency: 1 });
      const assignment = assignmentOf(await world.poll(session, 0, 1));
      expect(assignment.event.ldgtaskid).toBe(task.task_id);
      return { task, session, assignment };
    },
    async dispatch(assignment, sequence = 1) {
      const authority = await store.renew(renewCommand(assignment, sequence, 'dispatch'));
      expect(authority.dispatch_allowed).toBe(true);
      return authority;
    },
    async failThroughRetries({ task, session, assignment }, caps) {
      let current = assignment;
      let sequence = 1;
      for (const cap of caps) {
        await world.dispatch(current);
        const reply = await store.settle(settleApplicationError(current));
        expect(reply.task_state).toBe('queued');
        const status = await store.status(scope, task.task_id);
        const delay = status.available_at - reply.receipt.accepted_at;
        expect(delay).toBeGreaterThanOrEqual(1);
        expect(delay).toBeLessThanOrEqual(cap);
        await world.advancePast(status.available_at - 1);
        sequence += 1;
        current = assignmentOf(await world.poll(session, 0, sequence));
      }
      return current;
    },
    async events(taskId) {
      const all: RecordedHistoryEvent[] = [];
      for (;;) {
        const page = await store.history(scope, taskId, all.at(-1)?.sequence ?? 0);
        if (page.length === 0) return all;
        all.push(...page);
      }
    },
    async reasons(taskId) {
      return (await world.events(taskId)).map((recorded) => recorded.event.reason);
    },
    async recoverAll() {
      const total: RecoveryProgress = {
        scanned: 0,
        recovered: 0,
        requeued: 0,
        failed: 0,
        cancelled: 0,
        finalized: 0,
        has_more: false,
      };
      for (let pass = 0; pass < MAX_RECOVERY_PASSES; pass += 1) {
        const progress = await store.recoverExpiredLeases();
        expectCoherentProgress(progress);
        total.scanned += progress.scanned;
        total.recovered += progress.recovered;
        total.requeued += progress.requeued;
        total.failed += progress.failed;
        total.cancelled += progress.cancelled;
        total.finalized += progress.finalized;
        if (!progress.has_more) return total;
      }
      throw new Error(`recovery still reports more work after ${MAX_RECOVERY_PASSES} passes`);
    },
  };
  return world;
}

/**
 * The frame every conformance suite shares: a vitest `describe(name)` whose
 * harness starts once in `beforeAll` and closes in `afterAll`; `body`
 * registers the tests, each calling `setup()` for a fresh {@link World}.
 * Tests run one after another (they move the shared store clock).
 */
export function describeConformance<S extends TaskStore>(
  name: string,
  makeHarness: () => Promise<ConformanceHarness<S>>,
  body: (setup: () => World<S>) => void,
): void {
  describe(name, () => {
    let harness: ConformanceHarness<S> | undefined;
    beforeAll(async () => {
      harness = await makeHarness();
    });
    afterAll(async () => {
      await harness?.close();
    });
    body(() => {
      if (harness === undefined) throw new Error('the conformance harness did not start');
      return worldOf(harness);
    });
  });
}

/** A valid W3C traceparent for origin-trace propagation checks. */
const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

/**
 * Registers the conformance suite for one `TaskStore` implementation: a
 * vitest `describe(name)` whose tests cover every rule of DESIGN §5 and §4.1
 * through the `TaskStore` interface only. `makeHarness` runs once, in
 * `beforeAll`; the harness is closed in `afterAll`. Tests run one after
 * another (they move the shared store clock), each in its own random scope.
 *
 * @example
 * ```ts
 * runTaskStoreConformance('memory store', async () => {
 *   const store = createMemoryTaskStore();
 *   return { store, config: store.config, advance: async (ms) => store.advance(ms),
 *            close: async () => {} };
 * });
 * ```
 */
export function runTaskStoreConformance(
  name: string,
  makeHarness: () => Promise<ConformanceHarness>,
): void {
  describeConformance(name, makeHarness, (setup) => {
    describe('submit (DESIGN §5 Submit, §4.1 Defaults)', () => {
      it('creates a queued task with history `submitted`', async () => {
        const w = setup();
        const command = submitCommand(w.scope, { labels: { team: 'a' } });
        const before = await w.store.now();
        const outcome = await w.store.submit(command);
        const after = await w.store.now();
        expect(outcome.created).toBe(true);
        const snapshot = outcome.snapshot;
        expect(snapshot.task_id.length).toBeGreaterThan(0);
        expect(snapshot.run_id.length).toBeGreaterThan(0);
        expect(snapshot.run_id).not.toBe(snapshot.task_id);
        expect(snapshot).toMatchObject({
          idempotency_key: command.idempotency_key,
          descriptor: command.input.program,
          origin_trace: null,
          state: 'queued',
          terminal_at: null,
          current_attempt_id: null,
          attempt_count: 0,
          cancel_requested_at: null,
        });
        expect(snapshot.input).toEqual(command.input);
        expect(snapshot.submitted_at).toBeGreaterThanOrEqual(before);
        expect(snapshot.submitted_at).toBeLessThanOrEqual(after);
        expect(snapshot.available_at).toBe(snapshot.submitted_at);
        expect(await w.store.inspect(w.scope, snapshot.task_id)).toEqual(snapshot);
        expect(await w.store.history(w.scope, snapshot.task_id, 0)).toEqual([
          {
            sequence: 1,
            event: {
              task_id: snapshot.task_id,
              attempt_id: null,
              at: snapshot.submitted_at,
              reason: 'submitted',
            },
          },
        ]);
        const status = await w.store.status(w.scope, snapshot.task_id);
        expect(status).toMatchObject({
          task_id: snapshot.task_id,
          run_id: snapshot.run_id,
          queue: TEST_QUEUE,
          program: command.input.program,
          state: 'queued',
          labels: { team: 'a' },
        });
      });

      it('applies the default retry policy: 3 attempts, exponential from 1 s', async () => {
        const w = setup();
        const claimed = await w.submitAndClaim();
        expect((await w.store.status(w.scope, claimed.task.task_id)).max_attempts).toBe(3);
        // Exponential caps double per dispatched failure: 1 000, then 2 000 ms.
        const current = await w.failThroughRetries(claimed, [1_000, 2_000]);
        await w.dispatch(current);
        const last = await w.store.settle(settleApplicationError(current));
        expect(last.task_state).toBe('failed');
      });

      it('applies the default timeout (300 000 ms) and priority (0)', async () => {
        const w = setup();
        const low = await w.submit({ priority: -1 });
        const middle = await w.submit();
        const high = await w.submit({ priority: 1 });
        const session = await w.session({ concurrency: 3 });
        const order: string[] = [];
        for (const consumer of [0, 1, 2]) {
          const assignment = assignmentOf(await w.poll(session, consumer, 1));
          expect(assignment.attempt_deadline).toBe(claimedAt(assignment) + 300_000);
          order.push(assignment.event.ldgtaskid);
        }
        expect(order).toEqual([high.task_id, middle.task_id, low.task_id]);
      });

      it('returns the existing task for the same key and the same command (created: false)', async () => {
        const w = setup();
        const command = submitCommand(w.scope, { data: { a: 1, b: [1, 2] } });
        const first = await w.store.submit(command);
        const again = await w.store.submit(command);
        expect(again.created).toBe(false);
        expect(again.snapshot).toEqual(first.snapshot);
        // Canonical comparison: the same command with its keys in another order.
        const reordered: SubmitCommand = {
          input: { ...command.input, data: { b: [1, 2], a: 1 } },
          idempotency_key: command.idempotency_key,
        };
        const third = await w.store.submit(reordered);
        expect(third.created).toBe(false);
        expect(third.snapshot.task_id).toBe(first.snapshot.task_id);
        expect(await w.reasons(first.snapshot.task_id)).toEqual(['submitted']);
      });

      it('a replayed submit answers the task as it is now', async () => {
        const w = setup();
        const command = submitCommand(w.scope);
        const { snapshot } = await w.store.submit(command);
        const session = await w.session({ concurrency: 1 });
        const assignment = assignmentOf(await w.poll(session, 0, 1));
        const again = await w.store.submit(command);
        expect(again.created).toBe(false);
        expect(again.snapshot).toMatchObject({
          task_id: snapshot.task_id,
          state: 'active',
          attempt_count: 1,
          current_attempt_id: assignment.event.id,
        });
      });

      it('rejects the same key with a different command as 409 conflict', async () => {
        const w = setup();
        const command = submitCommand(w.scope);
        const first = await w.store.submit(command);
        await expectContractError(
          w.store.submit({ ...command, input: { ...command.input, data: { other: true } } }),
          'conflict',
        );
        await expectContractError(
          w.store.submit({ ...command, input: { ...command.input, priority: 5 } }),
          'conflict',
        );
        // It says which task holds the key, so the caller can look at what it submitted first.
        await expect(
          w.store.submit({ ...command, input: { ...command.input, priority: 6 } }),
        ).rejects.toMatchObject({
          reason: 'idempotency_key_reused',
          message: expect.stringContaining(first.snapshot.task_id),
        });
        expect(await w.store.inspect(w.scope, first.snapshot.task_id)).toEqual(first.snapshot);
      });

      it('compares a replay with every field of the command as the task holds it, canonically', async () => {
        const w = setup();
        // Values a store's round trip could alter if it were not exact: numbers in exponent
        // form, -0, U+2028, an astral character, a NUL, nesting, keys in non-sorted order.
        const command = submitCommand(w.scope, {
          data: { z: [1e21, -0, 1.5e-7, '\u2028😀\u0000'], a: { y: [{ k: null }], b: true } },
          retry: { max_attempts: 5, delay_ms: 250, backoff: 'fixed' },
          timeout_ms: 60_000,
          delay_ms: 10,
          priority: -3,
          concurrency_key: 'user-1',
          concurrency_limit: 2,
          labels: { team: 'red', ünï: 'cödé 😀' },
          origin_trace: { traceparent: TRACEPARENT, tracestate: 'vendor=1' },
        });
        const first = await w.store.submit(command);
        const again = await w.store.submit(withKeysReversed(command));
        expect(again.created).toBe(false);
        // As the wire carries them (JSON has no -0): the same task, the same answer.
        const wire = (value: unknown) => JSON.parse(JSON.stringify(value));
        expect(wire(again.snapshot)).toEqual(wire(first.snapshot));
        const input = command.input;
        // A fixed retry in another spelling is the same policy (the a3s canonical encoding).
        for (const retry of [
          { max_attempts: 5, delay_ms: 250 },
          { max_attempts: 5, delay_ms: 250, max_delay_ms: 0 },
        ]) {
          const respelled = await w.store.submit({ ...command, input: { ...input, retry } });
          expect(respelled.created).toBe(false);
        }
        const { origin_trace: _trace, ...untraced } = command;
        for (const other of [
          {
            ...command,
            input: { ...input, data: { ...(input.data as object), a: { y: [{ k: 0 }], b: true } } },
          },
          { ...command, input: { ...input, retry: { max_attempts: 5, delay_ms: 251 } } },
          { ...command, input: { ...input, timeout_ms: 60_001 } },
          { ...command, input: { ...input, delay_ms: 11 } },
          { ...command, input: { ...input, concurrency_limit: 3 } },
          { ...command, input: { ...input, labels: { team: 'red' } } },
          { ...command, origin_trace: { traceparent: TRACEPARENT } },
          untraced,
        ]) {
          await expectContractError(w.store.submit(other), 'conflict');
        }
        expect(await w.reasons(first.snapshot.task_id)).toEqual(['submitted']);
      });

      it('refuses a timeout_ms less than MIN_DISPATCH_WINDOW_MS above the lease safety margin, alone or in a batch, creating nothing', async () => {
        const w = setup();
        // The margin plus a window for the dispatch renewal: the shortest budget a worker can be
        // granted dispatch in (DESIGN §5).
        const shortest = minSubmitTimeoutMs(w.config);
        expect((await w.submit({ timeout_ms: shortest })).state).toBe('queued');
        // A short margin leaves no valid timeout below the contract's minimum to refuse.
        if (shortest === MIN_TIMEOUT_MS) return;
        const short = submitCommand(w.scope, { timeout_ms: shortest - 1 });
        const refusal = {
          code: 'invalid_input',
          path: '$.input.timeout_ms',
          message: expect.stringContaining(`use at least ${shortest}`),
        };
        await expect(w.store.submit(short)).rejects.toMatchObject(refusal);
        const defaulted = submitCommand(w.scope);
        const [ok, refused] = await w.store.submitBatch([defaulted, short]);
        expect(ok?.ok && ok.value.created).toBe(true);
        expect(refused).toMatchObject({ ok: false, error: refusal });
        // The key was never taken: the same key with a budget the store accepts creates the task.
        const fixed = { ...short, input: { ...short.input, timeout_ms: shortest } };
        expect((await w.store.submit(fixed)).created).toBe(true);
      });

      it('scopes idempotency keys: the same key in another scope is another task', async () => {
        const w = setup();
        const other = freshScope();
        const key = 'shared-key';
        const mine = await w.store.submit(submitCommand(w.scope, { idempotency_key: key }));
        const theirs = await w.store.submit(submitCommand(other, { idempotency_key: key }));
        expect(theirs.created).toBe(true);
        expect(theirs.snapshot.task_id).not.toBe(mine.snapshot.task_id);
      });

      it('honours available_at: the task is not acquirable before it', async () => {
        const w = setup();
        // Well inside the session's validity, so only available_at decides the polls.
        const at = (await w.store.now()) + Math.min(60_000, w.config.sessionValidityMs / 2);
        const task = await w.submit({ available_at: at });
        expect(task.available_at).toBe(at);
        const session = await w.session({ concurrency: 1 });
        expect((await w.poll(session, 0, 1)).disposition).toBe('empty');
        await w.advancePast(at - 1);
        const assignment = assignmentOf(await w.poll(session, 0, 2));
        expect(assignment.event.ldgtaskid).toBe(task.task_id);
      });

      it('honours delay_ms: available_at = submitted_at + delay_ms', async () => {
        const w = setup();
        const delay = Math.min(45_000, Math.floor(w.config.sessionValidityMs / 2));
        const task = await w.submit({ delay_ms: delay });
        expect(task.available_at).toBe(task.submitted_at + delay);
        const session = await w.session({ concurrency: 1 });
        expect((await w.poll(session, 0, 1)).disposition).toBe('empty');
        await w.advancePast(task.available_at - 1);
        expect(assignmentOf(await w.poll(session, 0, 2)).event.ldgtaskid).toBe(task.task_id);
      });

      it('rejects an available_at further ahead than MAX_SUBMIT_DELAY_MS (400)', async () => {
        const w = setup();
        const at = (await w.store.now()) + MAX_SUBMIT_DELAY_MS + 60_000;
        await expectContractError(
          w.store.submit(submitCommand(w.scope, { available_at: at })),
          'invalid_input',
        );
      });

      it('keeps the origin trace and propagates it into the invocation event', async () => {
        const w = setup();
        const origin_trace = { traceparent: TRACEPARENT, tracestate: 'vendor=1' };
        const { task, assignment } = await w.submitAndClaim({ origin_trace });
        expect(task.origin_trace).toEqual(origin_trace);
        expect(assignment.event.traceparent).toBe(TRACEPARENT);
        expect(assignment.event.tracestate).toBe('vendor=1');
      });
    });

    describe('sessions (DESIGN §5 Sessions, §4.1 Sessions)', () => {
      it('opens a session valid for SESSION_VALIDITY_MS', async () => {
        const w = setup();
        const before = await w.store.now();
        const session = await w.session({ concurrency: 3 });
        const after = await w.store.now();
        expect(session.id.length).toBeGreaterThan(0);
        expect(session).toMatchObject({ scope: w.scope, queue: TEST_QUEUE, concurrency: 3 });
        expect(session.expires_at).toBeGreaterThanOrEqual(before + w.config.sessionValidityMs);
        expect(session.expires_at).toBeLessThanOrEqual(after + w.config.sessionValidityMs);
      });

      it('extend pushes the expiry to now + validity and keeps the session usable', async () => {
        const w = setup();
        const session = await w.session();
        const half = Math.floor(w.config.sessionValidityMs / 2);
        await w.advance(half);
        const before = await w.store.now();
        const extended = await w.store.extendSession(w.scope, session.id);
        const after = await w.store.now();
        expect(extended.id).toBe(session.id);
        expect(extended.expires_at).toBeGreaterThanOrEqual(before + w.config.sessionValidityMs);
        expect(extended.expires_at).toBeLessThanOrEqual(after + w.config.sessionValidityMs);
        expect(extended.expires_at).toBeGreaterThan(session.expires_at);
        // Past the original expiry, before the extended one.
        await w.advancePast(session.expires_at);
        expect((await w.poll(session, 0, 1)).disposition).toBe('empty');
      });

      it('rejects an unknown session with 404 session_not_found', async () => {
        const w = setup();
        const session = await w.session();
        const unknown = { ...session, id: `${session.id}x` };
        await expectContractError(w.poll(unknown, 0, 1), 'session_not_found');
        await expectContractError(w.store.extendSession(w.scope, unknown.id), 'session_not_found');
      });

      it("treats another scope's session as unknown (404 session_not_found)", async () => {
        const w = setup();
        const session = await w.session();
        // Another tenant, and the same tenant's other namespace.
        for (const scope of [freshScope(), { ...w.scope, namespace: `${w.scope.namespace}x` }]) {
          const foreign = { ...session, scope };
          await expectContractError(w.poll(foreign, 0, 1), 'session_not_found');
          await expectContractError(w.store.extendSession(scope, session.id), 'session_not_found');
        }
      });

      it('finds a session by id alone, within a tenant when given, expired or not', async () => {
        const w = setup();
        const session = await w.session();
        expect(await w.store.sessionScope(session.id, undefined)).toEqual(w.scope);
        expect(await w.store.sessionScope(session.id, w.scope.tenant_id)).toEqual(w.scope);
        expect(await w.store.sessionScope(session.id, freshScope().tenant_id)).toBeNull();
        expect(await w.store.sessionScope(`${session.id}x`, undefined)).toBeNull();
        await w.advancePast(session.expires_at);
        expect(await w.store.sessionScope(session.id, w.scope.tenant_id)).toEqual(w.scope);
      });

      it('rejects an expired session with 410 session_expired', async () => {
        const w = setup();
        const session = await w.session();
        await w.advancePast(session.expires_at);
        await expectContractError(w.poll(session, 0, 1), 'session_expired');
        await expectContractError(w.store.extendSession(w.scope, session.id), 'session_expired');
      });

      it("rejects a poll on another queue than the session's (400)", async () => {
        const w = setup();
        const session = await w.session();
        await expectContractError(
          w.store.acquire(
            { ...acquireCommand(session, 0, 1), queue: 'another-queue' },
            { recordEmpty: true },
          ),
          'invalid_input',
        );
      });

      it("rejects a consumer_id outside the session's concurrency (400)", async () => {
        const w = setup();
        const session = await w.session({ concurrency: 2 });
        await expectContractError(w.poll(session, 2, 1), 'invalid_input');
        await expectContractError(w.poll(session, 7, 1), 'invalid_input');
        expect((await w.poll(session, 1, 1)).disposition).toBe('empty');
      });
    });

    describe('acquire (DESIGN §5 Acquire, Authority; §4.1 Fresh authority)', () => {
      it('requires the first poll of a slot to be sequence 1', async () => {
        const w = setup();
        const session = await w.session();
        await expectContractError(w.poll(session, 0, 2), 'sequence_conflict');
        expect((await w.poll(session, 0, 1)).disposition).toBe('empty');
      });

      it('a probe that finds nothing names its queue’s next due time; a recorded empty or a claim names none', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 1 });
        const probe = (sequence: number) =>
          w.store.acquire(acquireCommand(session, 0, sequence), { recordEmpty: false });
        expect((await probe(1)).nextDue).toBeUndefined();
        const now = await w.store.now();
        await w.submit({ priority: 5, available_at: now + 60_000 });
        const soon = await w.submit({ priority: -5, available_at: now + 20_000 });
        // Earlier, but in another queue, another scope: no matter to this poll.
        await w.submit({ queue: 'elsewhere', available_at: now + 5_000 });
        await w.store.submit(submitCommand(freshScope(), { available_at: now + 5_000 }));
        const before = await w.store.now();
        const parked = await probe(1);
        const after = await w.store.now();
        expect(parked.reply.disposition).toBe('empty');
        expect(parked.recorded).toBe(false);
        // The earliest across priorities, with the store time it was read at.
        expect(parked.nextDue?.at).toBe(soon.available_at);
        expect(parked.nextDue?.observedAt).toBeGreaterThanOrEqual(before);
        expect(parked.nextDue?.observedAt).toBeLessThanOrEqual(after);
        const recorded = await w.store.acquire(acquireCommand(session, 0, 1), {
          recordEmpty: true,
        });
        expect(recorded.reply.disposition).toBe('empty');
        expect(recorded.nextDue).toBeUndefined();
        await w.advancePast(soon.available_at);
        const claim = await probe(2);
        expect(assignmentOf(claim.reply).event.ldgtaskid).toBe(soon.task_id);
        expect(claim.nextDue).toBeUndefined();
      });

      it('assigns with a fresh authority, the lease and deadlines of DESIGN §5', async () => {
        const w = setup();
        const timeout = 120_000;
        const task = await w.submit({ timeout_ms: timeout, data: { n: 42 } });
        const session = await w.session({ concurrency: 2 });
        const before = await w.store.now();
        const reply = await w.poll(session, 1, 1);
        const after = await w.store.now();
        expect(reply.sequence).toBe(1);
        const assignment = assignmentOf(reply);
        const claimed = claimedAt(assignment);
        expect(claimed).toBeGreaterThanOrEqual(before);
        expect(claimed).toBeLessThanOrEqual(after);
        const attemptId = assignment.event.id;
        const deadline = claimed + timeout;
        const authorityDeadline = deadline + w.config.cleanupGraceMs;
        const expiresAt = Math.min(claimed + w.config.leaseDurationMs, authorityDeadline);
        expect(assignment.descriptor).toEqual(task.descriptor);
        expect(assignment.attempt_deadline).toBe(deadline);
        expect(assignment.lease.expires_at).toBe(expiresAt);
        const owner = assignment.lease.owner;
        expect(owner).toMatchObject({
          scope: w.scope,
          task_id: task.task_id,
          attempt_id: attemptId,
          worker_session_id: session.id,
          consumer_id: 1,
        });
        expect(owner.lease_id.length).toBeGreaterThan(0);
        expect(Number.isSafeInteger(owner.generation) && owner.generation >= 0).toBe(true);
        expect(assignment.authority).toEqual({
          owner,
          expires_at: expiresAt,
          remaining_ms: expiresAt - claimed,
          execution_remaining_ms: timeout,
          renew_sequence: 0,
          cancel_requested: false,
          dispatch_allowed: false,
        });
        const event = assignment.event;
        expect(event).toMatchObject({
          specversion: '1.0',
          id: attemptId,
          source: queueSource(w.scope, TEST_QUEUE),
          type: TASK_ATTEMPT_EVENT_TYPE,
          time: new Date(claimed).toISOString(),
          datacontenttype: 'application/json',
          data: { n: 42 },
          ldgtenant: w.scope.tenant_id,
          ldgnamespace: w.scope.namespace,
          ldgqueue: TEST_QUEUE,
          ldgtaskid: task.task_id,
          ldgrunid: task.run_id,
          ldgattemptid: attemptId,
          ldgattempt: 1,
        });
        expect(event.ldgactivationid).toBeUndefined();
        expect(event.traceparent).toBeUndefined();

        const snapshot = await w.store.inspect(w.scope, task.task_id);
        expect(snapshot).toMatchObject({
          state: 'active',
          attempt_count: 1,
          current_attempt_id: attemptId,
        });
        const events = await w.events(task.task_id);
        expect(events.map((e) => e.event.reason)).toEqual(['submitted', 'claimed']);
        expect(events[1]?.event).toEqual({
          task_id: task.task_id,
          attempt_id: attemptId,
          at: claimed,
          reason: 'claimed',
        });
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, attemptId);
        expect(attempt).toMatchObject({
          descriptor: task.descriptor,
          lease: assignment.lease,
          deadline,
          authority_deadline: authorityDeadline,
          state: 'active',
          execution_may_have_started: false,
          last_renewal: null,
          settlement: null,
          finished_at: null,
        });
        expect(attempt.event).toEqual(event);
      });

      it('replays the same sequence: the same assignment with freshly sampled authority', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim();
        const step = w.step();
        await w.advance(step);
        const replay = assignmentOf(await w.poll(session, 0, 1));
        expect(replay.event).toEqual(assignment.event);
        expect(replay.lease).toEqual(assignment.lease);
        expect(replay.descriptor).toEqual(assignment.descriptor);
        expect(replay.attempt_deadline).toBe(assignment.attempt_deadline);
        expect(replay.authority.owner).toEqual(assignment.authority.owner);
        expect(replay.authority.expires_at).toBe(assignment.authority.expires_at);
        expect(replay.authority.remaining_ms).toBeLessThanOrEqual(
          assignment.authority.remaining_ms - step,
        );
        expect(replay.authority.execution_remaining_ms).toBeLessThanOrEqual(
          assignment.authority.execution_remaining_ms - step,
        );
        // Replay claims nothing new.
        expect((await w.store.status(w.scope, task.task_id)).attempt_count).toBe(1);
        expect(await w.reasons(task.task_id)).toEqual(['submitted', 'claimed']);
      });

      it('replay reflects renewals made since the poll (authority is sampled, not cached)', async () => {
        const w = setup();
        const { session, assignment } = await w.submitAndClaim();
        const renewed = await w.dispatch(assignment);
        const replay = assignmentOf(await w.poll(session, 0, 1));
        expect(replay.authority.renew_sequence).toBe(1);
        expect(replay.authority.dispatch_allowed).toBe(true);
        expect(replay.authority.expires_at).toBe(renewed.expires_at);
      });

      it('replay after the attempt was settled answers ownership_lost', async () => {
        const w = setup();
        const { session, assignment } = await w.submitAndClaim();
        await w.store.settle(settleSuccess(assignment));
        expect(await w.poll(session, 0, 1)).toEqual({
          disposition: 'ownership_lost',
          sequence: 1,
          assignment: {
            task_id: assignment.event.ldgtaskid,
            attempt_id: assignment.event.ldgattemptid,
          },
        });
      });

      it('replay after an unconfirmed settlement answers ownership_lost', async () => {
        const w = setup();
        const { session, assignment } = await w.submitAndClaim();
        await w.store.settle(settleSuccess(assignment, 1, { quiescence: 'unconfirmed' }));
        expect((await w.poll(session, 0, 1)).disposition).toBe('ownership_lost');
      });

      it('replay after the lease expired answers ownership_lost, before and after recovery', async () => {
        const w = setup();
        const { session, assignment } = await w.submitAndClaim();
        await w.store.extendSession(w.scope, session.id);
        await w.advancePast(assignment.lease.expires_at);
        const ref = { task_id: assignment.event.ldgtaskid, attempt_id: assignment.event.id };
        expect(await w.poll(session, 0, 1)).toEqual({
          disposition: 'ownership_lost',
          sequence: 1,
          assignment: ref,
        });
        await w.recoverAll();
        expect(await w.poll(session, 0, 1)).toEqual({
          disposition: 'ownership_lost',
          sequence: 1,
          assignment: ref,
        });
      });

      it('an empty poll replays as empty, even once work has arrived', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 1 });
        expect(await w.poll(session, 0, 1)).toEqual({ disposition: 'empty', sequence: 1 });
        const task = await w.submit();
        expect(await w.poll(session, 0, 1)).toEqual({ disposition: 'empty', sequence: 1 });
        expect(assignmentOf(await w.poll(session, 0, 2)).event.ldgtaskid).toBe(task.task_id);
      });

      it('rejects a sequence gap and a stale sequence with 409 sequence_conflict', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 1 });
        await w.poll(session, 0, 1);
        await w.poll(session, 0, 2);
        await expectContractError(w.poll(session, 0, 4), 'sequence_conflict');
        await expectContractError(w.poll(session, 0, 1), 'sequence_conflict');
        // Neither rejection moved the cursor.
        expect(await w.poll(session, 0, 2)).toEqual({ disposition: 'empty', sequence: 2 });
        expect(await w.poll(session, 0, 3)).toEqual({ disposition: 'empty', sequence: 3 });
      });

      it('answers sequence 0 with 409 sequence_conflict, before and after the first poll', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 1 });
        // DESIGN §4.1: 0 is a well-formed sequence, but never `last` nor `last + 1` of a slot.
        await expectContractError(w.poll(session, 0, 0), 'sequence_conflict');
        expect(await w.poll(session, 0, 1)).toEqual({ disposition: 'empty', sequence: 1 });
        await expectContractError(w.poll(session, 0, 0), 'sequence_conflict');
        expect(await w.poll(session, 0, 2)).toEqual({ disposition: 'empty', sequence: 2 });
      });

      it('keeps slots apart: each consumer of a session has its own sequence', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 2 });
        await w.poll(session, 0, 1);
        await w.poll(session, 0, 2);
        expect((await w.poll(session, 1, 1)).disposition).toBe('empty');
        await expectContractError(w.poll(session, 1, 3), 'sequence_conflict');
      });

      it('rejects a new poll while the slot holds a live attempt (409 consumer_busy)', async () => {
        const w = setup();
        const { session, assignment } = await w.submitAndClaim();
        const waiting = await w.submit();
        await expectContractError(w.poll(session, 0, 2), 'consumer_busy');
        // The rejection did not consume the sequence: after settling, 2 is the new poll.
        await w.store.settle(settleSuccess(assignment));
        expect(assignmentOf(await w.poll(session, 0, 2)).event.ldgtaskid).toBe(waiting.task_id);
      });

      it('frees a slot whose attempt lost its lease, even before recovery runs', async () => {
        const w = setup();
        const { session, assignment } = await w.submitAndClaim();
        await w.advancePast(assignment.lease.expires_at);
        await w.store.extendSession(w.scope, session.id);
        expect((await w.poll(session, 0, 2)).disposition).toBe('empty');
      });

      it('recordEmpty: false does not consume the sequence', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 1 });
        const probe = await w.store.acquire(acquireCommand(session, 0, 1), {
          recordEmpty: false,
        });
        expect(probe).toEqual({ reply: { disposition: 'empty', sequence: 1 }, recorded: false });
        // Sequence 1 is still the new poll: 2 would be a gap.
        await expectContractError(w.poll(session, 0, 2, false), 'sequence_conflict');
        const again = await w.store.acquire(acquireCommand(session, 0, 1), {
          recordEmpty: false,
        });
        expect(again.recorded).toBe(false);
        const task = await w.submit();
        const found = await w.store.acquire(acquireCommand(session, 0, 1), {
          recordEmpty: false,
        });
        expect(found.recorded).toBe(true);
        const assignment = assignmentOf(found.reply);
        expect(assignment.event.ldgtaskid).toBe(task.task_id);
        // Now recorded: 1 replays the assignment.
        expect(assignmentOf(await w.poll(session, 0, 1)).event.id).toBe(assignment.event.id);
      });

      it('recordEmpty: true records the empty answer', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 1 });
        const outcome = await w.store.acquire(acquireCommand(session, 0, 1), {
          recordEmpty: true,
        });
        expect(outcome).toEqual({ reply: { disposition: 'empty', sequence: 1 }, recorded: true });
        expect((await w.poll(session, 0, 2)).disposition).toBe('empty');
      });

      it('claim: false answers new polls empty (recorded as asked) beside a ready task, and replays as usual', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 2 });
        await w.submit();
        const claimed = assignmentOf(await w.poll(session, 0, 1));
        const task = await w.submit();
        const single = await w.store.acquire(acquireCommand(session, 1, 1), {
          recordEmpty: true,
          claim: false,
        });
        expect(single).toEqual({ reply: { disposition: 'empty', sequence: 1 }, recorded: true });
        const batch = await w.store.acquireBatch(
          [acquireCommand(session, 0, 1), acquireCommand(session, 1, 2)],
          { recordEmpty: false, claim: false },
        );
        expect(batch.map((r) => (r.ok ? r.value.reply.disposition : r.error.code))).toEqual([
          'assigned',
          'empty',
        ]);
        const replayed = batch[0];
        expect(replayed?.ok && assignmentOf(replayed.value.reply).event.id).toBe(claimed.event.id);
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('queued');
        // Slot 1's sequence 1 was recorded empty; 2 was not: a claiming poll of 2 takes the task.
        expect(assignmentOf(await w.poll(session, 1, 2)).event.ldgtaskid).toBe(task.task_id);
      });

      it('orders by priority desc, then available_at, then task_id', async () => {
        const w = setup();
        const now = await w.store.now();
        const a = await w.submit({ available_at: now - 3_000 });
        const b = await w.submit({ priority: 5, available_at: now - 1_000 });
        const c = await w.submit({ available_at: now - 5_000 });
        const d = await w.submit({ available_at: now - 3_000 });
        const e = await w.submit({ available_at: now - 3_000 });
        const future = await w.submit({ priority: 100, available_at: now + 600_000 });
        const ties = [a, d, e].map((t) => t.task_id).sort(compareBytes);
        const expected = [b.task_id, c.task_id, ...ties];
        const session = await w.session({ concurrency: 6 });
        const order: string[] = [];
        for (let consumer = 0; consumer < 5; consumer += 1) {
          order.push(assignmentOf(await w.poll(session, consumer, 1)).event.ldgtaskid);
        }
        expect(order).toEqual(expected);
        expect((await w.poll(session, 5, 1)).disposition).toBe('empty');
        expect((await w.store.status(w.scope, future.task_id)).state).toBe('queued');
      });

      it('assigns only tasks of the poll’s scope and queue', async () => {
        const w = setup();
        await w.submit({ queue: 'elsewhere' });
        await w.store.submit(submitCommand(freshScope()));
        const session = await w.session({ concurrency: 1 });
        expect((await w.poll(session, 0, 1)).disposition).toBe('empty');
      });

      it('respects a concurrency key (limit 1 when no limit is given)', async () => {
        const w = setup();
        const now = await w.store.now();
        const k1 = await w.submit({ concurrency_key: 'k', available_at: now - 2_000 });
        await w.submit({ concurrency_key: 'k', available_at: now - 1_000 });
        const free = await w.submit({ priority: -10 });
        const session = await w.session({ concurrency: 3 });
        const first = assignmentOf(await w.poll(session, 0, 1));
        expect(first.event.ldgtaskid).toBe(k1.task_id);
        // k2 ranks above `free`, but its key is at its limit.
        expect(assignmentOf(await w.poll(session, 1, 1)).event.ldgtaskid).toBe(free.task_id);
        expect((await w.poll(session, 2, 1)).disposition).toBe('empty');
        await w.store.settle(settleSuccess(first));
        const k2 = assignmentOf(await w.poll(session, 2, 2));
        expect(k2.event.ldgtaskid).not.toBe(k1.task_id);
        expect(k2.event.ldgtaskid).not.toBe(free.task_id);
      });

      it('respects a concurrency limit above 1', async () => {
        const w = setup();
        const ids = new Set<string>();
        for (let i = 0; i < 3; i += 1) {
          ids.add((await w.submit({ concurrency_key: 'm', concurrency_limit: 2 })).task_id);
        }
        const session = await w.session({ concurrency: 3 });
        const first = assignmentOf(await w.poll(session, 0, 1));
        const second = assignmentOf(await w.poll(session, 1, 1));
        expect(ids.has(first.event.ldgtaskid) && ids.has(second.event.ldgtaskid)).toBe(true);
        expect((await w.poll(session, 2, 1)).disposition).toBe('empty');
        await w.store.settle(settleApplicationError(second, { retryable: false }));
        expect(assignmentOf(await w.poll(session, 2, 2)).event.ldgtaskid).not.toBe(
          first.event.ldgtaskid,
        );
      });

      it('holds each task of a key to its own limit when the key’s tasks declare different ones', async () => {
        // DESIGN §4 is silent on a key whose tasks disagree; the rule both stores keep: a task
        // is claimed only while the key's active count is below that task's own limit.
        const w = setup();
        const now = await w.store.now();
        const mutex = await w.submit({ concurrency_key: 'd', available_at: now - 3_000 });
        const wide = await w.submit({
          concurrency_key: 'd',
          concurrency_limit: 2,
          available_at: now - 2_000,
        });
        const lateMutex = await w.submit({ concurrency_key: 'd', available_at: now - 1_000 });
        const session = await w.session({ concurrency: 3 });
        const first = assignmentOf(await w.poll(session, 0, 1));
        const second = assignmentOf(await w.poll(session, 1, 1));
        // The wider task runs beside the mutex: one active is below its limit of 2.
        expect([first.event.ldgtaskid, second.event.ldgtaskid]).toEqual([
          mutex.task_id,
          wide.task_id,
        ]);
        expect((await w.poll(session, 2, 1)).disposition).toBe('empty');
        await w.store.settle(settleSuccess(first));
        // One task of the key still active: the later mutex waits for the key to be empty.
        expect((await w.poll(session, 2, 2)).disposition).toBe('empty');
        await w.store.settle(settleSuccess(second));
        expect(assignmentOf(await w.poll(session, 2, 3)).event.ldgtaskid).toBe(lateMutex.task_id);
      });
    });

    describe('renew (DESIGN §5 Renew, §4.1 sequences)', () => {
      it('sequence last + 1 extends the lease to now + lease duration', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim({ timeout_ms: 3_600_000 });
        const step = w.step();
        await w.advance(step);
        const authority = await w.store.renew(renewCommand(assignment, 1));
        expect(authority.owner).toEqual(assignment.lease.owner);
        expect(authority.renew_sequence).toBe(1);
        expect(authority.dispatch_allowed).toBe(false);
        expect(authority.cancel_requested).toBe(false);
        expect(authority.expires_at).toBeGreaterThan(assignment.lease.expires_at);
        // remaining_ms is sampled at the renewal's own store time.
        expect(authority.remaining_ms).toBe(w.config.leaseDurationMs);
        expect(authority.execution_remaining_ms).toBeLessThanOrEqual(3_600_000 - step);
        const attempt = await w.store.inspectAttempt(
          w.scope,
          assignment.event.ldgtaskid,
          assignment.event.id,
        );
        expect(attempt.lease.expires_at).toBe(authority.expires_at);
        expect(attempt.last_renewal).toEqual(renewCommand(assignment, 1));
      });

      it('reports execution_remaining_ms = max(0, deadline − now) during the cleanup grace', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          timeout_ms: minSubmitTimeoutMs(w.config),
        });
        const step = Math.max(
          1,
          Math.floor(Math.min(w.config.leaseDurationMs, w.config.cleanupGraceMs) / 4),
        );
        let authority = assignment.authority;
        let sequence = 0;
        // Heartbeat in steps the lease survives until the execution budget is spent.
        while (authority.execution_remaining_ms > 0) {
          await w.advance(step);
          sequence += 1;
          authority = await w.store.renew(renewCommand(assignment, sequence));
        }
        expect(authority.execution_remaining_ms).toBe(0);
        expect(authority.remaining_ms).toBeGreaterThan(0);
        expect(authority.expires_at).toBeLessThanOrEqual(
          assignment.attempt_deadline + w.config.cleanupGraceMs,
        );
        // The worker may still report during the grace, but may not start user code.
        const late = await w.store.renew(renewCommand(assignment, sequence + 1, 'dispatch'));
        expect(late.dispatch_allowed).toBe(false);
        expect((await w.store.settle(settleSuccess(assignment))).task_state).toBe('succeeded');
        expect(await w.reasons(task.task_id)).not.toContain('dispatch_authorized');
      });

      it('never extends a lease past the authority deadline', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim({ timeout_ms: minSubmitTimeoutMs(w.config) });
        const authorityDeadline = assignment.attempt_deadline + w.config.cleanupGraceMs;
        expect(assignment.lease.expires_at).toBeLessThanOrEqual(authorityDeadline);
        // Renew late enough that now + lease passes the authority deadline,
        // while the claim's lease is still live.
        const wait = Math.max(
          0,
          authorityDeadline - w.config.leaseDurationMs - claimedAt(assignment) + 1,
        );
        const reachable = claimedAt(assignment) + wait < assignment.lease.expires_at;
        if (reachable) await w.advance(wait);
        const authority = await w.store.renew(renewCommand(assignment, 1));
        const renewedAt = authority.expires_at - authority.remaining_ms;
        expect(authority.expires_at).toBe(
          Math.min(renewedAt + w.config.leaseDurationMs, authorityDeadline),
        );
        if (reachable) expect(authority.expires_at).toBe(authorityDeadline);
      });

      it('sequence == last replays the authority without extending twice', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim({ timeout_ms: 3_600_000 });
        const first = await w.store.renew(renewCommand(assignment, 1));
        const step = w.step();
        await w.advance(step);
        const replay = await w.store.renew(renewCommand(assignment, 1));
        expect(replay.expires_at).toBe(first.expires_at);
        expect(replay.renew_sequence).toBe(1);
        expect(replay.remaining_ms).toBeLessThanOrEqual(first.remaining_ms - step);
        const attempt = await w.store.inspectAttempt(
          w.scope,
          assignment.event.ldgtaskid,
          assignment.event.id,
        );
        expect(attempt.lease.expires_at).toBe(first.expires_at);
        const next = await w.store.renew(renewCommand(assignment, 2));
        expect(next.renew_sequence).toBe(2);
        expect(next.expires_at).toBeGreaterThan(first.expires_at);
      });

      it('rejects any other sequence with 409 sequence_conflict', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim();
        await expectContractError(w.store.renew(renewCommand(assignment, 2)), 'sequence_conflict');
        await w.store.renew(renewCommand(assignment, 1));
        await w.store.renew(renewCommand(assignment, 2));
        await expectContractError(w.store.renew(renewCommand(assignment, 4)), 'sequence_conflict');
        await expectContractError(w.store.renew(renewCommand(assignment, 1)), 'sequence_conflict');
        expect((await w.store.renew(renewCommand(assignment, 3))).renew_sequence).toBe(3);
      });

      it('answers renew sequence 0 with 409 sequence_conflict: an assignment starts at 0, but nothing was renewed to replay', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim();
        expect(assignment.authority.renew_sequence).toBe(0);
        await expectContractError(w.store.renew(renewCommand(assignment, 0)), 'sequence_conflict');
        // The rejection neither extended the lease nor moved the sequence: 1 is the first renew.
        expect((await w.store.renew(renewCommand(assignment, 1))).renew_sequence).toBe(1);
        await expectContractError(w.store.renew(renewCommand(assignment, 0)), 'sequence_conflict');
      });

      it('rejects the same sequence with a different intent as 409 conflict', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim();
        await w.store.renew(renewCommand(assignment, 1, 'keep_alive'));
        await expectContractError(
          w.store.renew(renewCommand(assignment, 1, 'dispatch')),
          'conflict',
        );
        const attempt = await w.store.inspectAttempt(
          w.scope,
          assignment.event.ldgtaskid,
          assignment.event.id,
        );
        expect(attempt.execution_may_have_started).toBe(false);
      });

      it('grants dispatch once and records dispatch_authorized exactly once', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        const granted = await w.dispatch(assignment, 1);
        expect(granted.renew_sequence).toBe(1);
        expect(
          (await w.store.renew(renewCommand(assignment, 1, 'dispatch'))).dispatch_allowed,
        ).toBe(true);
        expect(
          (await w.store.renew(renewCommand(assignment, 2, 'dispatch'))).dispatch_allowed,
        ).toBe(true);
        expect(
          (await w.store.renew(renewCommand(assignment, 3, 'keep_alive'))).dispatch_allowed,
        ).toBe(true);
        const events = await w.events(task.task_id);
        const authorized = events.filter((e) => e.event.reason === 'dispatch_authorized');
        expect(authorized).toHaveLength(1);
        expect(authorized[0]?.event.attempt_id).toBe(assignment.event.id);
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(attempt.execution_may_have_started).toBe(true);
      });

      it('keep_alive never grants dispatch', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        for (const sequence of [1, 2, 3]) {
          const authority = await w.store.renew(renewCommand(assignment, sequence, 'keep_alive'));
          expect(authority.dispatch_allowed).toBe(false);
        }
        expect(await w.reasons(task.task_id)).not.toContain('dispatch_authorized');
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(attempt.execution_may_have_started).toBe(false);
      });

      it('refuses dispatch once cancel was requested (and reports cancel_requested)', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
        const authority = await w.store.renew(renewCommand(assignment, 1, 'dispatch'));
        expect(authority.dispatch_allowed).toBe(false);
        expect(authority.cancel_requested).toBe(true);
        expect(authority.renew_sequence).toBe(1);
        expect(await w.reasons(task.task_id)).not.toContain('dispatch_authorized');
      });

      it('refuses dispatch when no more execution budget than the safety margin remains', async () => {
        const w = setup();
        const margin = w.config.leaseSafetyMarginMs;
        const { task, assignment } = await w.submitAndClaim({
          timeout_ms: minSubmitTimeoutMs(w.config),
        });
        let remaining = assignment.authority.execution_remaining_ms;
        let sequence = 0;
        // Spend the budget down to the margin in steps the lease survives.
        while (remaining > margin) {
          await w.advance(Math.min(remaining - margin, Math.floor(w.config.leaseDurationMs / 2)));
          sequence += 1;
          remaining = (await w.store.renew(renewCommand(assignment, sequence)))
            .execution_remaining_ms;
        }
        const authority = await w.store.renew(renewCommand(assignment, sequence + 1, 'dispatch'));
        expect(authority.execution_remaining_ms).toBeLessThanOrEqual(margin);
        expect(authority.dispatch_allowed).toBe(false);
        expect(await w.reasons(task.task_id)).not.toContain('dispatch_authorized');
      });

      it('rejects a stale owner (any fencing field differing) with 409 ownership_lost', async () => {
        const w = setup();
        const { session, assignment } = await w.submitAndClaim();
        const other = await w.session({ concurrency: 2 });
        const owner = ownerOf(assignment);
        const stale = [
          { ...owner, lease_id: `${owner.lease_id}x` },
          { ...owner, generation: owner.generation + 1 },
          { ...owner, worker_session_id: other.id },
          { ...owner, consumer_id: owner.consumer_id + 1 },
        ];
        for (const staleOwner of stale) {
          await expectContractError(
            w.store.renew({ owner: staleOwner, sequence: 1, intent: 'dispatch' }),
            'ownership_lost',
          );
          await expectContractError(
            w.store.settle({ ...settleSuccess(assignment), owner: staleOwner }),
            'ownership_lost',
          );
          await expectContractError(w.store.confirmQuiescence(staleOwner), 'ownership_lost');
        }
        // Nothing a stale owner sent changed the attempt.
        const authority = await w.dispatch(assignment, 1);
        expect(authority.owner.worker_session_id).toBe(session.id);
      });

      it('answers not_found for an unknown attempt or task and for another scope', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim();
        const owner = ownerOf(assignment);
        for (const missing of [
          { ...owner, attempt_id: `${owner.attempt_id}x` },
          { ...owner, task_id: `${owner.task_id}x` },
          { ...owner, scope: freshScope() },
        ]) {
          await expectContractError(
            w.store.renew({ owner: missing, sequence: 1, intent: 'keep_alive' }),
            'not_found',
          );
          await expectContractError(
            w.store.settle({ ...settleSuccess(assignment), owner: missing }),
            'not_found',
          );
          await expectContractError(w.store.confirmQuiescence(missing), 'not_found');
        }
      });

      it('rejects a renewal after the lease expired with ownership_lost', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim();
        await w.advancePast(assignment.lease.expires_at);
        await expectContractError(w.store.renew(renewCommand(assignment, 1)), 'ownership_lost');
        await w.recoverAll();
        await expectContractError(w.store.renew(renewCommand(assignment, 1)), 'ownership_lost');
      });

      it('heartbeats keep a lease alive past its first expiry', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({ timeout_ms: 3_600_000 });
        const step = Math.floor(w.config.leaseDurationMs / 2);
        for (let sequence = 1; sequence <= 4; sequence += 1) {
          await w.advance(step);
          await w.store.renew(renewCommand(assignment, sequence));
        }
        expect(await w.store.now()).toBeGreaterThan(assignment.lease.expires_at);
        await w.recoverAll();
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('active');
        expect((await w.store.settle(settleSuccess(assignment))).task_state).toBe('succeeded');
      });
    });

    describe('settle (DESIGN §5 Settle, §4.1 Conflict codes)', () => {
      it('success → succeeded, with the output in the result', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.dispatch(assignment);
        const command = settleSuccess(assignment, { n: 1 });
        const before = await w.store.now();
        const reply = await w.store.settle(command);
        const after = await w.store.now();
        expect(reply.already_accepted).toBe(false);
        expect(reply.task_state).toBe('succeeded');
        expect(reply.receipt).toMatchObject({
          operation_id: command.operation_id,
          task_id: task.task_id,
          attempt_id: assignment.event.id,
        });
        const at = reply.receipt.accepted_at;
        expect(at).toBeGreaterThanOrEqual(before);
        expect(at).toBeLessThanOrEqual(after);
        const result = await w.store.result(w.scope, task.task_id);
        expect(result.outcome).toEqual({ state: 'succeeded', output: { n: 1 } });
        expect(result.status).toMatchObject({ state: 'succeeded', terminal_at: at });
        expect((await w.store.inspect(w.scope, task.task_id)).current_attempt_id).toBeNull();
        const events = await w.events(task.task_id);
        expect(events.slice(-2).map((e) => e.event)).toEqual([
          { task_id: task.task_id, attempt_id: assignment.event.id, at, reason: 'report_accepted' },
          { task_id: task.task_id, attempt_id: assignment.event.id, at, reason: 'succeeded' },
        ]);
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(attempt).toMatchObject({
          state: 'succeeded',
          quiescence: 'confirmed',
          finished_at: at,
          settlement: { command, receipt: reply.receipt },
        });
      });

      it('a successful JSON null output is distinct from pending', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({ state: 'pending' });
        await w.store.settle(settleSuccess(assignment, null));
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'succeeded',
          output: null,
        });
      });

      it('a retryable application error with attempts left → queued after the fixed delay', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 7_000 },
        });
        await w.dispatch(assignment);
        const reply = await w.store.settle(settleApplicationError(assignment));
        expect(reply.task_state).toBe('queued');
        const status = await w.store.status(w.scope, task.task_id);
        expect(status.state).toBe('queued');
        expect(status.available_at).toBe(reply.receipt.accepted_at + 7_000);
        expect(status.terminal_at).toBeNull();
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({ state: 'pending' });
        expect((await w.store.inspect(w.scope, task.task_id)).current_attempt_id).toBeNull();
        const events = await w.events(task.task_id);
        expect(events.slice(-2).map((e) => e.event.reason)).toEqual([
          'report_accepted',
          'retry_scheduled',
        ]);
        expect(events.at(-1)?.event.attempt_id).toBe(assignment.event.id);
        expect(
          (await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id)).state,
        ).toBe('failed');
        // Not acquirable before available_at; acquirable after.
        expect((await w.poll(session, 0, 2)).disposition).toBe('empty');
        await w.advancePast(status.available_at - 1);
        const second = assignmentOf(await w.poll(session, 0, 3));
        expect(second.event.ldgtaskid).toBe(task.task_id);
        expect(second.event.ldgattempt).toBe(2);
        expect(second.event.id).not.toBe(assignment.event.id);
        expect(second.lease.owner.generation).toBeGreaterThan(assignment.lease.owner.generation);
        expect((await w.store.status(w.scope, task.task_id)).attempt_count).toBe(2);
      });

      it('exponential backoff waits 1..cap, the cap doubling up to max_delay_ms', async () => {
        const w = setup();
        const claimed = await w.submitAndClaim({
          retry: { max_attempts: 4, delay_ms: 1_000, backoff: 'exponential', max_delay_ms: 3_000 },
        });
        const current = await w.failThroughRetries(claimed, [1_000, 2_000, 3_000]);
        await w.dispatch(current);
        expect((await w.store.settle(settleApplicationError(current))).task_state).toBe('failed');
      });

      it('retryable: false fails the task at once, with the application error', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.dispatch(assignment);
        const error = {
          code: 'bad_input',
          message: 'no',
          details: { field: 'x' },
          retryable: false,
        };
        const reply = await w.store.settle(settleApplicationError(assignment, error));
        expect(reply.task_state).toBe('failed');
        const result = await w.store.result(w.scope, task.task_id);
        expect(result.outcome).toEqual({
          state: 'failed',
          failure: { kind: 'application', error },
        });
        expect(result.status.terminal_at).toBe(reply.receipt.accepted_at);
        expect((await w.reasons(task.task_id)).slice(-2)).toEqual(['report_accepted', 'failed']);
      });

      it('a retryable execution failure is retried; a non-retryable one fails', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 0 },
        });
        await w.dispatch(assignment);
        const first = await w.store.settle(
          settleExecutionFailure(assignment, { kind: 'timed_out', retryable: true }),
        );
        expect(first.task_state).toBe('queued');
        const second = assignmentOf(await w.poll(session, 0, 2));
        await w.dispatch(second);
        const failure = { kind: 'internal' as const, message: 'broken', retryable: false };
        const last = await w.store.settle(settleExecutionFailure(second, failure));
        expect(last.task_state).toBe('failed');
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'failed',
          failure: { kind: 'execution', error: failure },
        });
      });

      it('exhaustion counts only attempts granted dispatch', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 1, delay_ms: 0 },
        });
        // The worker gave up before dispatch: that attempt does not count.
        const rejected = await w.store.settle(
          settleExecutionFailure(assignment, { kind: 'rejected', retryable: true }),
        );
        expect(rejected.task_state).toBe('queued');
        const second = assignmentOf(await w.poll(session, 0, 2));
        expect(second.event.ldgattempt).toBe(2);
        await w.dispatch(second);
        // The only dispatched attempt fails: max_attempts 1 is now exhausted.
        const failed = await w.store.settle(settleApplicationError(second));
        expect(failed.task_state).toBe('failed');
        const status = await w.store.status(w.scope, task.task_id);
        expect(status).toMatchObject({ state: 'failed', attempt_count: 2, max_attempts: 1 });
      });

      it('the same operation id and body replays the receipt (already_accepted: true)', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        const command = settleSuccess(assignment, { v: 1 });
        const first = await w.store.settle(command);
        const historyAfterFirst = await w.events(task.task_id);
        const replay = await w.store.settle(command);
        expect(replay).toEqual({ ...first, already_accepted: true });
        expect(await w.events(task.task_id)).toEqual(historyAfterFirst);
        // Also once the lease is long gone and recovery has run.
        await w.advancePast(assignment.lease.expires_at);
        await w.recoverAll();
        const late = await w.store.settle(command);
        expect(late).toEqual({
          receipt: first.receipt,
          already_accepted: true,
          task_state: 'succeeded',
        });
      });

      it('the same operation id with a different body is 409 conflict', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        const command = settleSuccess(assignment, { v: 1 });
        await w.store.settle(command);
        await expectContractError(
          w.store.settle(
            settleSuccess(assignment, { v: 2 }, { operation_id: command.operation_id }),
          ),
          'conflict',
        );
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'succeeded',
          output: { v: 1 },
        });
      });

      it('a second, different settlement of the same attempt is 409 conflict', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 0 },
        });
        await w.dispatch(assignment);
        await w.store.settle(settleApplicationError(assignment));
        // Same report, new operation id; and a different report.
        await expectContractError(w.store.settle(settleApplicationError(assignment)), 'conflict');
        await expectContractError(w.store.settle(settleSuccess(assignment)), 'conflict');
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('queued');
      });

      it('rejects a settlement after the lease expired with ownership_lost', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.advancePast(assignment.lease.expires_at);
        await expectContractError(w.store.settle(settleSuccess(assignment)), 'ownership_lost');
        expect(await w.reasons(task.task_id)).not.toContain('report_accepted');
        await w.recoverAll();
        await expectContractError(w.store.settle(settleSuccess(assignment)), 'ownership_lost');
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('queued');
      });

      it("rejects a report naming another task or attempt than the owner's (400)", async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        const good = settleSuccess(assignment);
        if (good.report.kind !== 'completed') throw new Error('unreachable');
        const identity = good.report.report.context.identity;
        for (const wrong of [
          { ...identity, attempt_id: `${identity.attempt_id}x` },
          { ...identity, task_id: `${identity.task_id}x` },
        ]) {
          const bad = structuredClone(good);
          if (bad.report.kind !== 'completed') throw new Error('unreachable');
          bad.report.report.context.identity = wrong;
          await expectContractError(w.store.settle(bad), 'invalid_input');
        }
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('active');
        expect((await w.store.settle(good)).task_state).toBe('succeeded');
      });

      it('a settlement while cancel is requested cancels the task, whatever it reports', async () => {
        const w = setup();
        const success = await w.submitAndClaim();
        await w.dispatch(success.assignment);
        await w.store.cancel(w.scope, success.task.task_id);
        expect((await w.store.settle(settleSuccess(success.assignment))).task_state).toBe(
          'cancelled',
        );
        expect((await w.store.result(w.scope, success.task.task_id)).outcome).toEqual({
          state: 'cancelled',
        });
        expect((await w.reasons(success.task.task_id)).slice(-3)).toEqual([
          'cancel_requested',
          'report_accepted',
          'cancelled',
        ]);

        const retryable = await w.submitAndClaim({ retry: { max_attempts: 5, delay_ms: 0 } });
        await w.dispatch(retryable.assignment);
        await w.store.cancel(w.scope, retryable.task.task_id);
        const reply = await w.store.settle(settleApplicationError(retryable.assignment));
        expect(reply.task_state).toBe('cancelled');
        expect(await w.reasons(retryable.task.task_id)).not.toContain('retry_scheduled');
      });
    });

    describe('quiescence (DESIGN §5 Settle: unconfirmed cleanup)', () => {
      it('unconfirmed keeps the task active with only report_accepted', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.dispatch(assignment);
        const command = settleSuccess(assignment, 'out', { quiescence: 'unconfirmed' });
        const reply = await w.store.settle(command);
        expect(reply.task_state).toBe('active');
        expect(reply.already_accepted).toBe(false);
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('active');
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({ state: 'pending' });
        expect((await w.reasons(task.task_id)).slice(-2)).toEqual([
          'dispatch_authorized',
          'report_accepted',
        ]);
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(attempt).toMatchObject({
          state: 'active',
          quiescence: 'unconfirmed',
          settlement: { command, receipt: reply.receipt },
          finished_at: null,
        });
        expect(await w.store.settle(command)).toEqual({ ...reply, already_accepted: true });
      });

      it('confirm applies the outcome with cleanup_confirmed; confirming again changes nothing', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.dispatch(assignment);
        await w.store.settle(settleSuccess(assignment, 'out', { quiescence: 'unconfirmed' }));
        expect(await w.store.confirmQuiescence(ownerOf(assignment))).toBe('succeeded');
        const events = await w.events(task.task_id);
        expect(events.slice(-3).map((e) => e.event.reason)).toEqual([
          'report_accepted',
          'cleanup_confirmed',
          'succeeded',
        ]);
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'succeeded',
          output: 'out',
        });
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(attempt.state).toBe('succeeded');
        expect(attempt.quiescence).toBe('confirmed');
        expect(await w.store.confirmQuiescence(ownerOf(assignment))).toBe('succeeded');
        expect(await w.events(task.task_id)).toEqual(events);
      });

      it('confirm applies a retry decision too', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 0 },
        });
        await w.dispatch(assignment);
        await w.store.settle(settleApplicationError(assignment, {}, { quiescence: 'unconfirmed' }));
        expect(await w.store.confirmQuiescence(ownerOf(assignment))).toBe('queued');
        expect((await w.reasons(task.task_id)).slice(-2)).toEqual([
          'cleanup_confirmed',
          'retry_scheduled',
        ]);
      });

      it('confirm before any settlement is 409 conflict', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await expectContractError(w.store.confirmQuiescence(ownerOf(assignment)), 'conflict');
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('active');
      });

      it('the worker may renew during cleanup, but is never granted dispatch after settling', async () => {
        const w = setup();
        const { assignment } = await w.submitAndClaim();
        await w.store.settle(settleSuccess(assignment, 'out', { quiescence: 'unconfirmed' }));
        const authority = await w.store.renew(renewCommand(assignment, 1, 'dispatch'));
        expect(authority.dispatch_allowed).toBe(false);
      });

      it('unconfirmed, then the lease ends: recovery applies the recorded outcome', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.dispatch(assignment);
        const reply = await w.store.settle(
          settleSuccess(assignment, 'kept', { quiescence: 'unconfirmed' }),
        );
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        await w.advancePast(attempt.lease.expires_at);
        // Recovery is store-wide: other tests' leases may be counted too, hence a lower bound.
        const progress = await w.recoverAll();
        expect(progress.finalized).toBeGreaterThanOrEqual(1);
        const result = await w.store.result(w.scope, task.task_id);
        expect(result.outcome).toEqual({ state: 'succeeded', output: 'kept' });
        expect(await w.reasons(task.task_id)).not.toContain('lease_expired');
        const finished = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(finished.state).toBe('succeeded');
        expect(finished.settlement?.receipt).toEqual(reply.receipt);
      });

      it('unconfirmed: the task is held until the authority deadline, not the lease it had', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 0 },
        });
        await w.dispatch(assignment);
        const before = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(before.lease.expires_at).toBeLessThan(before.authority_deadline);
        await w.store.settle(settleApplicationError(assignment, {}, { quiescence: 'unconfirmed' }));
        const settled = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(settled.lease.expires_at).toBe(before.authority_deadline);
        // The worker that reported stops renewing; its old lease running out frees nothing.
        await w.advancePast(before.lease.expires_at);
        await w.recoverAll();
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('active');
        // A keep-alive during cleanup does not shorten the hold either.
        const kept = await w.store.renew(renewCommand(assignment, 2));
        expect(kept.expires_at).toBe(before.authority_deadline);
        await w.advancePast(before.authority_deadline);
        await w.recoverAll();
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('queued');
        const reasons = await w.reasons(task.task_id);
        expect(reasons.at(-1)).toBe('retry_scheduled');
        expect(reasons).not.toContain('lease_expired');
      });

      it('cancel requested during cleanup of a retryable failure: the task is cancelled, never retried', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 0 },
        });
        await w.dispatch(assignment);
        await w.store.settle(settleApplicationError(assignment, {}, { quiescence: 'unconfirmed' }));
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
        expect(await w.store.confirmQuiescence(ownerOf(assignment))).toBe('cancelled');
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'cancelled',
        });
        expect(await w.reasons(task.task_id)).not.toContain('retry_scheduled');
      });

      it('cancel requested during cleanup of a retryable failure, then the lease ends: cancelled, never retried', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 0 },
        });
        await w.dispatch(assignment);
        await w.store.settle(settleApplicationError(assignment, {}, { quiescence: 'unconfirmed' }));
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        await w.advancePast(attempt.lease.expires_at);
        await w.recoverAll();
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'cancelled',
        });
        expect(await w.reasons(task.task_id)).not.toContain('retry_scheduled');
      });
    });

    describe('cancel (DESIGN §5 Cancel)', () => {
      it('cancels a queued task at once', async () => {
        const w = setup();
        const task = await w.submit();
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('cancelled');
        const result = await w.store.result(w.scope, task.task_id);
        expect(result.outcome).toEqual({ state: 'cancelled' });
        expect(result.status.state).toBe('cancelled');
        expect(result.status.terminal_at).not.toBeNull();
        expect(await w.reasons(task.task_id)).toEqual(['submitted', 'cancelled']);
        const session = await w.session({ concurrency: 1 });
        expect((await w.poll(session, 0, 1)).disposition).toBe('empty');
      });

      it('requests cancellation of an active task; the worker sees it and settles → cancelled', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.dispatch(assignment);
        const before = await w.store.now();
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
        const status = await w.store.status(w.scope, task.task_id);
        expect(status.state).toBe('active');
        expect(status.cancel_requested_at).toBeGreaterThanOrEqual(before);
        expect(status.terminal_at).toBeNull();
        const events = await w.events(task.task_id);
        expect(events.at(-1)?.event).toMatchObject({
          reason: 'cancel_requested',
          attempt_id: assignment.event.id,
        });
        const authority = await w.store.renew(renewCommand(assignment, 2));
        expect(authority.cancel_requested).toBe(true);
        const reply = await w.store.settle(
          settleExecutionFailure(assignment, { kind: 'cancelled', retryable: true }),
        );
        expect(reply.task_state).toBe('cancelled');
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'cancelled',
        });
      });

      it('requesting cancellation twice records it once', async () => {
        const w = setup();
        const { task } = await w.submitAndClaim();
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('active');
        const reasons = await w.reasons(task.task_id);
        expect(reasons.filter((r) => r === 'cancel_requested')).toHaveLength(1);
      });

      it('an active task whose worker never settles is cancelled by lease expiry, never retried', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 5, delay_ms: 0 },
        });
        await w.dispatch(assignment);
        await w.store.cancel(w.scope, task.task_id);
        await w.advancePast(
          (await w.store.renew(renewCommand(assignment, 1, 'dispatch'))).expires_at,
        );
        const progress = await w.recoverAll();
        expect(progress.cancelled).toBeGreaterThanOrEqual(1);
        const result = await w.store.result(w.scope, task.task_id);
        expect(result.outcome).toEqual({ state: 'cancelled' });
        expect(result.status.attempt_count).toBe(1);
        const reasons = await w.reasons(task.task_id);
        expect(reasons.slice(-2)).toEqual(['lease_expired', 'cancelled']);
        expect(reasons).not.toContain('retry_scheduled');
        expect(
          (await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id)).state,
        ).toBe('lost');
        await w.store.extendSession(w.scope, session.id);
        expect((await w.poll(session, 0, 2)).disposition).toBe('empty');
      });

      it('cancelling a task re-queued after a failure never attributes that failure', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 60_000 },
        });
        await w.dispatch(assignment);
        await w.store.settle(settleApplicationError(assignment));
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('cancelled');
        expect((await w.store.result(w.scope, task.task_id)).outcome).toEqual({
          state: 'cancelled',
        });
      });

      it('a terminal task answers its state and changes nothing', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.store.settle(settleSuccess(assignment));
        const events = await w.events(task.task_id);
        const status = await w.store.status(w.scope, task.task_id);
        expect(await w.store.cancel(w.scope, task.task_id)).toBe('succeeded');
        expect(await w.store.status(w.scope, task.task_id)).toEqual(status);
        expect(await w.events(task.task_id)).toEqual(events);

        const cancelled = await w.submit();
        await w.store.cancel(w.scope, cancelled.task_id);
        const cancelledEvents = await w.events(cancelled.task_id);
        expect(await w.store.cancel(w.scope, cancelled.task_id)).toBe('cancelled');
        expect(await w.events(cancelled.task_id)).toEqual(cancelledEvents);
      });

      it('answers not_found for an unknown task or another scope', async () => {
        const w = setup();
        const task = await w.submit();
        await expectContractError(w.store.cancel(w.scope, `${task.task_id}x`), 'not_found');
        await expectContractError(w.store.cancel(freshScope(), task.task_id), 'not_found');
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('queued');
      });
    });

    describe('lease expiry and recovery (DESIGN §5 Lease expiry)', () => {
      it('a dispatched attempt with attempts left is lost and the task re-queued after the delay', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 2_000 },
        });
        await w.dispatch(assignment);
        const attempt = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        await w.advancePast(attempt.lease.expires_at);
        const progress = await w.recoverAll();
        expect(progress.requeued).toBeGreaterThanOrEqual(1);
        const events = await w.events(task.task_id);
        const tail = events.slice(-2).map((e) => e.event);
        expect(tail.map((e) => e.reason)).toEqual(['lease_expired', 'retry_scheduled']);
        expect(tail.every((e) => e.attempt_id === assignment.event.id)).toBe(true);
        const recoveredAt = tail[1]?.at ?? Number.NaN;
        const status = await w.store.status(w.scope, task.task_id);
        expect(status.state).toBe('queued');
        expect(status.available_at).toBe(recoveredAt + 2_000);
        const lost = await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id);
        expect(lost.state).toBe('lost');
        expect(lost.finished_at).toBe(recoveredAt);
        await w.store.extendSession(w.scope, session.id);
        expect((await w.poll(session, 0, 2)).disposition).toBe('empty');
        await w.advancePast(status.available_at - 1);
        expect(assignmentOf(await w.poll(session, 0, 3)).event.ldgattempt).toBe(2);
      });

      it('an attempt never granted dispatch does not count against max_attempts', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 1, delay_ms: 0 },
        });
        await w.advancePast(assignment.lease.expires_at);
        await w.recoverAll();
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('queued');
        expect((await w.reasons(task.task_id)).slice(-2)).toEqual([
          'lease_expired',
          'retry_scheduled',
        ]);
        // It runs once more, and this time the (only) dispatched attempt counts.
        await w.store.extendSession(w.scope, session.id);
        const second = assignmentOf(await w.poll(session, 0, 2));
        expect(second.event.ldgattempt).toBe(2);
        await w.dispatch(second);
        await w.advancePast((await w.store.renew(renewCommand(second, 1, 'dispatch'))).expires_at);
        await w.recoverAll();
        const result = await w.store.result(w.scope, task.task_id);
        expect(result.outcome).toEqual({
          state: 'failed',
          failure: { kind: 'lease_expired', attempts: 2 },
        });
      });

      it('dispatched attempts exhausted → failed with lease_expired reporting attempt_count', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 1, delay_ms: 0 },
        });
        const authority = await w.dispatch(assignment);
        await w.advancePast(authority.expires_at);
        const progress = await w.recoverAll();
        expect(progress.failed).toBeGreaterThanOrEqual(1);
        const result = await w.store.result(w.scope, task.task_id);
        expect(result.outcome).toEqual({
          state: 'failed',
          failure: { kind: 'lease_expired', attempts: 1 },
        });
        expect(result.status.terminal_at).not.toBeNull();
        expect((await w.reasons(task.task_id)).slice(-2)).toEqual(['lease_expired', 'failed']);
      });

      it('reports RecoveryProgress and honours its limit', async () => {
        const w = setup();
        const requeue = await w.submitAndClaim({ retry: { max_attempts: 3, delay_ms: 0 } });
        await w.dispatch(requeue.assignment);
        const fail = await w.submitAndClaim({ retry: { max_attempts: 1, delay_ms: 0 } });
        await w.dispatch(fail.assignment);
        const cancel = await w.submitAndClaim();
        await w.store.cancel(w.scope, cancel.task.task_id);
        // Whatever other tests left expired goes first, so what follows is ours.
        await w.recoverAll();
        // The latest expiry among our three leases (dispatch renewed two of them).
        const attempts = await Promise.all(
          [requeue, fail, cancel].map((c) =>
            w.store.inspectAttempt(w.scope, c.task.task_id, c.assignment.event.id),
          ),
        );
        const latest = Math.max(...attempts.map((a) => a.lease.expires_at));
        await w.advancePast(latest);
        const one = await w.store.recoverExpiredLeases(1);
        expectCoherentProgress(one);
        expect(one.scanned).toBe(1);
        expect(one.has_more).toBe(true);
        const rest = await w.recoverAll();
        expect(one.recovered + rest.recovered).toBeGreaterThanOrEqual(3);
        expect(one.requeued + rest.requeued).toBeGreaterThanOrEqual(1);
        expect(one.failed + rest.failed).toBeGreaterThanOrEqual(1);
        expect(one.cancelled + rest.cancelled).toBeGreaterThanOrEqual(1);
        expect((await w.store.status(w.scope, requeue.task.task_id)).state).toBe('queued');
        expect((await w.store.status(w.scope, fail.task.task_id)).state).toBe('failed');
        expect((await w.store.status(w.scope, cancel.task.task_id)).state).toBe('cancelled');
        const idle = await w.store.recoverExpiredLeases();
        expectCoherentProgress(idle);
      });

      it('leaves live leases alone', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        await w.recoverAll();
        expect((await w.store.status(w.scope, task.task_id)).state).toBe('active');
        expect(
          (await w.store.inspectAttempt(w.scope, task.task_id, assignment.event.id)).state,
        ).toBe('active');
      });

      it('a recovered task is acquired again under a new owner; the old owner is fenced out', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 3, delay_ms: 0 },
        });
        const authority = await w.dispatch(assignment);
        await w.advancePast(authority.expires_at);
        await w.recoverAll();
        await w.store.extendSession(w.scope, session.id);
        const again = assignmentOf(await w.poll(session, 0, 2));
        expect(again.event.ldgtaskid).toBe(task.task_id);
        expect(again.event.ldgattempt).toBe(2);
        expect(again.lease.owner.attempt_id).not.toBe(assignment.lease.owner.attempt_id);
        expect(again.lease.owner.lease_id).not.toBe(assignment.lease.owner.lease_id);
        expect(again.lease.owner.generation).toBeGreaterThan(assignment.lease.owner.generation);
        await expectContractError(w.store.renew(renewCommand(assignment, 2)), 'ownership_lost');
        await expectContractError(w.store.settle(settleSuccess(assignment)), 'ownership_lost');
        await expectContractError(w.store.confirmQuiescence(ownerOf(assignment)), 'ownership_lost');
        const snapshot = await w.store.inspect(w.scope, task.task_id);
        expect(snapshot).toMatchObject({
          state: 'active',
          attempt_count: 2,
          current_attempt_id: again.event.id,
        });
        expect((await w.store.settle(settleSuccess(again))).task_state).toBe('succeeded');
      });
    });

    describe('history (DESIGN §5 History)', () => {
      it('is gapless and ordered from 1, paged at most 100 after a sequence', async () => {
        const w = setup();
        const { task, session, assignment } = await w.submitAndClaim({
          retry: { max_attempts: 100, delay_ms: 0 },
        });
        // Each failed, dispatched attempt appends claimed, dispatch_authorized,
        // report_accepted and retry_scheduled: 1 + 26 × 4 = 105 events.
        let current = assignment;
        for (let cycle = 1; cycle <= 26; cycle += 1) {
          if (cycle > 1) current = assignmentOf(await w.poll(session, 0, cycle));
          await w.dispatch(current);
          await w.store.settle(settleApplicationError(current));
        }
        const first = await w.store.history(w.scope, task.task_id, 0);
        expect(first).toHaveLength(100);
        expect(first.map((e) => e.sequence)).toEqual(Array.from({ length: 100 }, (_, i) => i + 1));
        const second = await w.store.history(w.scope, task.task_id, 100);
        expect(second.map((e) => e.sequence)).toEqual([101, 102, 103, 104, 105]);
        expect(await w.store.history(w.scope, task.task_id, 105)).toEqual([]);
        const middle = await w.store.history(w.scope, task.task_id, 50);
        expect(middle).toHaveLength(55);
        expect(middle[0]?.sequence).toBe(51);
        const all = [...first, ...second];
        for (const [index, recorded] of all.entries()) {
          expect(recorded.event.task_id).toBe(task.task_id);
          // Payloads are never copied into history.
          expect(Object.keys(recorded.event).sort()).toEqual([
            'at',
            'attempt_id',
            'reason',
            'task_id',
          ]);
          if (index > 0)
            expect(recorded.event.at).toBeGreaterThanOrEqual(all[index - 1]?.event.at ?? 0);
        }
        expect(all[0]?.event.reason).toBe('submitted');
        expect(all.slice(1, 5).map((e) => e.event.reason)).toEqual([
          'claimed',
          'dispatch_authorized',
          'report_accepted',
          'retry_scheduled',
        ]);
      });

      it('heartbeats append no history', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        const before = await w.events(task.task_id);
        for (const sequence of [1, 2, 3]) {
          await w.store.renew(renewCommand(assignment, sequence));
        }
        expect(await w.events(task.task_id)).toEqual(before);
        await w.dispatch(assignment, 4);
        await w.store.renew(renewCommand(assignment, 5, 'dispatch'));
        await w.store.renew(renewCommand(assignment, 5, 'dispatch'));
        expect((await w.events(task.task_id)).length).toBe(before.length + 1);
      });

      it('takes any after_sequence in 0..2^53−1; one past the end reads an empty page', async () => {
        const w = setup();
        const task = await w.submit();
        expect((await w.store.history(w.scope, task.task_id, 0)).map((e) => e.sequence)).toEqual([
          1,
        ]);
        // Both sides of a 32-bit integer column's range, and the largest sequence the wire allows.
        for (const after of [2 ** 31 - 1, 2 ** 31, Number.MAX_SAFE_INTEGER]) {
          expect(await w.store.history(w.scope, task.task_id, after)).toEqual([]);
        }
      });

      it('answers not_found for an unknown task or another scope', async () => {
        const w = setup();
        const task = await w.submit();
        await expectContractError(w.store.history(w.scope, `${task.task_id}x`, 0), 'not_found');
        await expectContractError(w.store.history(freshScope(), task.task_id, 0), 'not_found');
      });
    });

    describe('reads (status, result, inspect, inspectAttempt, listTasks)', () => {
      it('status carries scheduling metadata only; labels are omitted when there are none', async () => {
        const w = setup();
        const task = await w.submit({
          data: { secret: 'payload' },
          retry: { max_attempts: 7, delay_ms: 0 },
        });
        const status = await w.store.status(w.scope, task.task_id);
        expect(status).toEqual({
          task_id: task.task_id,
          run_id: task.run_id,
          queue: TEST_QUEUE,
          program: { name: 'echo' },
          state: 'queued',
          submitted_at: task.submitted_at,
          available_at: task.available_at,
          terminal_at: null,
          attempt_count: 0,
          max_attempts: 7,
          cancel_requested_at: null,
        });
        expect(JSON.stringify(status)).not.toContain('payload');
        expect((await w.store.result(w.scope, task.task_id)).status).toEqual(status);
      });

      it('inspectAttempt answers not_found for an unknown attempt, another task or scope', async () => {
        const w = setup();
        const { task, assignment } = await w.submitAndClaim();
        const other = await w.submit();
        const attemptId = assignment.event.id;
        await expectContractError(
          w.store.inspectAttempt(w.scope, task.task_id, `${attemptId}x`),
          'not_found',
        );
        await expectContractError(
          w.store.inspectAttempt(w.scope, other.task_id, attemptId),
          'not_found',
        );
        await expectContractError(
          w.store.inspectAttempt(freshScope(), task.task_id, attemptId),
          'not_found',
        );
      });

      it('every read of another scope or an unknown task is not_found', async () => {
        const w = setup();
        const task = await w.submit();
        const foreign = freshScope();
        const sibling = { ...w.scope, namespace: `${w.scope.namespace}x` };
        for (const [scope, taskId] of [
          [foreign, task.task_id],
          [sibling, task.task_id],
          [w.scope, `${task.task_id}x`],
        ] as const) {
          await expectContractError(w.store.status(scope, taskId), 'not_found');
          await expectContractError(w.store.result(scope, taskId), 'not_found');
          await expectContractError(w.store.inspect(scope, taskId), 'not_found');
        }
        expect((await w.store.listTasks(foreign, { filters: {} })).tasks).toEqual([]);
        expect((await w.store.listTasks(sibling, { filters: {} })).tasks).toEqual([]);
      });

      it('listTasks filters by state, queue, program, labels (AND) and submission time', async () => {
        const w = setup();
        const t1 = await w.submit({
          program: { name: 'alpha' },
          labels: { team: 'a', env: 'prod' },
        });
        await w.advance(10);
        const t2 = await w.submit({
          queue: 'other',
          program: { name: 'beta' },
          labels: { team: 'a', env: 'dev' },
        });
        await w.advance(10);
        const t3 = await w.submit({
          program: { name: 'beta' },
          labels: { team: 'b', env: 'prod' },
        });
        await w.store.cancel(w.scope, t3.task_id);
        expect(t1.submitted_at).toBeLessThan(t2.submitted_at);
        expect(t2.submitted_at).toBeLessThan(t3.submitted_at);
        const ids = async (filters: TaskFilters): Promise<string[]> =>
          (await w.store.listTasks(w.scope, { filters })).tasks.map((t) => t.task_id);
        expect(await ids({})).toEqual([t3.task_id, t2.task_id, t1.task_id]);
        expect(await ids({ state: 'cancelled' })).toEqual([t3.task_id]);
        expect(await ids({ state: 'queued' })).toEqual([t2.task_id, t1.task_id]);
        expect(await ids({ state: 'succeeded' })).toEqual([]);
        expect(await ids({ queue: 'other' })).toEqual([t2.task_id]);
        expect(await ids({ program: 'beta' })).toEqual([t3.task_id, t2.task_id]);
        expect(await ids({ labels: { team: 'a' } })).toEqual([t2.task_id, t1.task_id]);
        expect(await ids({ labels: { team: 'a', env: 'prod' } })).toEqual([t1.task_id]);
        expect(await ids({ labels: { team: 'b', env: 'dev' } })).toEqual([]);
        expect(await ids({ submitted_from: t2.submitted_at })).toEqual([t3.task_id, t2.task_id]);
        expect(await ids({ submitted_until: t2.submitted_at })).toEqual([t1.task_id]);
        expect(
          await ids({ submitted_from: t2.submitted_at, submitted_until: t3.submitted_at }),
        ).toEqual([t2.task_id]);
        expect(
          await ids({ submitted_from: t3.submitted_at, submitted_until: t1.submitted_at }),
        ).toEqual([]);
        expect(await ids({ queue: TEST_QUEUE, program: 'beta', state: 'cancelled' })).toEqual([
          t3.task_id,
        ]);
        // No task belongs to a workflow yet.
        expect(await ids({ workflow_id: 'wf_none' })).toEqual([]);
      });

      it('listTasks pages by keyset with no duplicates or gaps, even as tasks arrive', async () => {
        const w = setup();
        const commands = Array.from({ length: 7 }, (_, i) => submitCommand(w.scope, { data: i }));
        const submitted = await w.store.submitBatch(commands);
        expect(submitted.every((item) => item.ok)).toBe(true);
        const full = (await w.store.listTasks(w.scope, { filters: {}, limit: TASK_LIST_MAX_LIMIT }))
          .tasks;
        expect(full).toHaveLength(7);
        expect([...full].sort(listingOrder)).toEqual(full);
        const expected = full.map((t) => t.task_id);
        // A page that ends exactly at the last match is the last page: no cursor.
        const exact = await w.store.listTasks(w.scope, { filters: {}, limit: 7 });
        expect(exact.tasks.map((t) => t.task_id)).toEqual(expected);
        expect(exact.next_cursor).toBeUndefined();

        const page1 = await w.store.listTasks(w.scope, { filters: {}, limit: 3 });
        expect(page1.tasks.map((t) => t.task_id)).toEqual(expected.slice(0, 3));
        expect(page1.next_cursor).toBeDefined();
        // A task submitted between pages sorts first, so later pages are unaffected.
        await w.advance(5);
        await w.submit();
        const page2 = await w.store.listTasks(w.scope, {
          filters: {},
          limit: 3,
          cursor: page1.next_cursor,
        });
        expect(page2.tasks.map((t) => t.task_id)).toEqual(expected.slice(3, 6));
        expect(page2.next_cursor).toBeDefined();
        const page3 = await w.store.listTasks(w.scope, {
          filters: {},
          limit: 3,
          cursor: page2.next_cursor,
        });
        expect(page3.tasks.map((t) => t.task_id)).toEqual(expected.slice(6));
        expect(page3.next_cursor).toBeUndefined();
        // A cursor allows a new limit.
        const rest = await w.store.listTasks(w.scope, {
          filters: {},
          limit: 10,
          cursor: page1.next_cursor,
        });
        expect(rest.tasks.map((t) => t.task_id)).toEqual(expected.slice(3));
        expect(rest.next_cursor).toBeUndefined();
      });

      it('listTasks with filters pages within the filtered set', async () => {
        const w = setup();
        for (let i = 0; i < 5; i += 1) {
          await w.submit({ labels: { parity: i % 2 === 0 ? 'even' : 'odd' } });
        }
        const filters = { labels: { parity: 'even' } };
        const page1 = await w.store.listTasks(w.scope, { filters, limit: 2 });
        expect(page1.tasks).toHaveLength(2);
        const page2 = await w.store.listTasks(w.scope, {
          filters,
          limit: 2,
          cursor: page1.next_cursor,
        });
        expect(page2.tasks).toHaveLength(1);
        expect(page2.next_cursor).toBeUndefined();
        const seen = [...page1.tasks, ...page2.tasks];
        expect(new Set(seen.map((t) => t.task_id)).size).toBe(3);
        expect(seen.every((t) => t.labels?.parity === 'even')).toBe(true);
      });

      it('rejects a cursor replayed with other filters, in another scope, or forged (400)', async () => {
        const w = setup();
        await w.submit();
        await w.submit();
        const page = await w.store.listTasks(w.scope, { filters: { state: 'queued' }, limit: 1 });
        const cursor = page.next_cursor;
        expect(cursor).toBeDefined();
        await expectContractError(
          w.store.listTasks(w.scope, { filters: { state: 'active' }, limit: 1, cursor }),
          'invalid_input',
        );
        await expectContractError(
          w.store.listTasks(w.scope, { filters: {}, limit: 1, cursor }),
          'invalid_input',
        );
        await expectContractError(
          w.store.listTasks(freshScope(), { filters: { state: 'queued' }, limit: 1, cursor }),
          'invalid_input',
        );
        await expectContractError(
          w.store.listTasks(w.scope, { filters: { state: 'queued' }, cursor: 'bm90LWEtY3Vyc29y' }),
          'invalid_input',
        );
      });

      it('listTasks honours the limit, defaults to TASK_LIST_DEFAULT_LIMIT and rejects 0 or > max', async () => {
        const w = setup();
        const count = TASK_LIST_DEFAULT_LIMIT + 2;
        const items = await w.store.submitBatch(
          Array.from({ length: count }, () => submitCommand(w.scope)),
        );
        expect(items.every((item) => item.ok)).toBe(true);
        const byDefault = await w.store.listTasks(w.scope, { filters: {} });
        expect(byDefault.tasks).toHaveLength(TASK_LIST_DEFAULT_LIMIT);
        expect(byDefault.next_cursor).toBeDefined();
        const five = await w.store.listTasks(w.scope, { filters: {}, limit: 5 });
        expect(five.tasks).toHaveLength(5);
        const all = await w.store.listTasks(w.scope, { filters: {}, limit: TASK_LIST_MAX_LIMIT });
        expect(all.tasks).toHaveLength(count);
        expect(all.next_cursor).toBeUndefined();
        await expectContractError(
          w.store.listTasks(w.scope, { filters: {}, limit: 0 }),
          'invalid_input',
        );
        await expectContractError(
          w.store.listTasks(w.scope, { filters: {}, limit: TASK_LIST_MAX_LIMIT + 1 }),
          'invalid_input',
        );
      });
    });

    describe('list page size (DESIGN §12 TASK_PAGE_MAX_BYTES)', () => {
      it('listTasks ends a page before TASK_PAGE_MAX_BYTES; its cursors reach every task once', async () => {
        const w = setup();
        // Statuses as large as a submission may make them (~8 KiB): 300 of them, fewer than the
        // row limit, would make one page of about 2.3 MiB; size alone must cut it, twice.
        const count = 300;
        const items = await w.store.submitBatch(
          Array.from({ length: count }, () =>
            submitCommandWithStatusBytes(w.scope, TASK_STATUS_MAX_BYTES),
          ),
        );
        expect(items.every((item) => item.ok)).toBe(true);
        const pages: { tasks: TaskStatus[]; bytes: number; cursor?: string }[] = [];
        let cursor: string | undefined;
        do {
          const page = await w.store.listTasks(w.scope, {
            filters: {},
            limit: TASK_LIST_MAX_LIMIT,
            cursor,
          });
          // What the list route answers is this page as compact JSON.
          pages.push({
            tasks: page.tasks,
            bytes: utf8ByteLength(JSON.stringify(page)),
            cursor: page.next_cursor,
          });
          cursor = page.next_cursor;
        } while (cursor !== undefined && pages.length <= count);
        expect(pages.length).toBeGreaterThanOrEqual(3);
        for (const [index, page] of pages.entries()) {
          expect(page.bytes).toBeLessThanOrEqual(TASK_PAGE_MAX_BYTES);
          expect(page.tasks.length).toBeGreaterThan(0);
          const next = pages[index + 1]?.tasks[0];
          if (next !== undefined) {
            // Cut by size, not by the limit, and no earlier than it had to be: the next status
            // (and its comma) would not have fitted beside the longest cursor a page may carry.
            expect(page.tasks.length).toBeLessThan(TASK_LIST_MAX_LIMIT);
            expect(
              page.bytes -
                (page.cursor?.length ?? 0) +
                TASK_CURSOR_MAX_BYTES +
                1 +
                utf8ByteLength(JSON.stringify(next)),
            ).toBeGreaterThan(TASK_PAGE_MAX_BYTES);
          }
        }
        const listed = pages.flatMap((page) => page.tasks);
        expect(listed).toHaveLength(count);
        expect(new Set(listed.map((t) => t.task_id)).size).toBe(count);
        expect([...listed].sort(listingOrder)).toEqual(listed);
      });
    });

    describe('batches (each item answered on its own)', () => {
      it('submitBatch answers each item alone, like single submits', async () => {
        const w = setup();
        const existing = submitCommand(w.scope);
        await w.store.submit(existing);
        const a = submitCommand(w.scope);
        const b = submitCommand(w.scope);
        const clash = { ...existing, input: { ...existing.input, data: 'changed' } };
        const items = await w.store.submitBatch([a, clash, b, a]);
        expect(items).toHaveLength(4);
        const [first, second, third, fourth] = items;
        expect(first?.ok && first.value.created).toBe(true);
        expect(second?.ok).toBe(false);
        if (second?.ok === false) {
          expect(second.error).toBeInstanceOf(ContractError);
          expect(second.error.code).toBe('conflict');
        }
        expect(third?.ok && third.value.created).toBe(true);
        // A repeat within the batch is a replay of the first item.
        expect(fourth?.ok && fourth.value.created).toBe(false);
        if (first?.ok && fourth?.ok) expect(fourth.value.snapshot).toEqual(first.value.snapshot);
        const single = await w.store.submit(a);
        if (first?.ok) expect(single).toEqual({ created: false, snapshot: first.value.snapshot });
        expect(await w.store.submitBatch([])).toEqual([]);
      });

      it('acquireBatch answers each poll alone, like single polls', async () => {
        const w = setup();
        const high = await w.submit({ priority: 10 });
        const low = await w.submit();
        const session = await w.session({ concurrency: 3 });
        const c0 = acquireCommand(session, 0, 1);
        const badQueue = { ...acquireCommand(session, 1, 1), queue: 'another-queue' };
        const unknown = { ...acquireCommand(session, 1, 1), worker_session_id: `${session.id}x` };
        const gap = acquireCommand(session, 1, 2);
        const c2 = acquireCommand(session, 2, 1);
        const items = await w.store.acquireBatch([c0, badQueue, unknown, gap, c2], {
          recordEmpty: true,
        });
        expect(
          items.map((item) => (item.ok ? item.value.reply.disposition : item.error.code)),
        ).toEqual([
          'assigned',
          'invalid_input',
          'session_not_found',
          'sequence_conflict',
          'assigned',
        ]);
        const [first, , , , last] = items;
        if (!first?.ok || !last?.ok) throw new Error('expected two assignments');
        const a0 = assignmentOf(first.value.reply);
        const a2 = assignmentOf(last.value.reply);
        expect(a0.event.ldgtaskid).toBe(high.task_id);
        expect(a2.event.ldgtaskid).toBe(low.task_id);
        // Single replays give the same assignments.
        for (const [command, assignment] of [
          [c0, a0],
          [c2, a2],
        ] as const) {
          const single = assignmentOf(
            (await w.store.acquire(command, { recordEmpty: true })).reply,
          );
          expect(single.event).toEqual(assignment.event);
          expect(single.lease).toEqual(assignment.lease);
        }
        // The failed items consumed nothing: slot 1's first poll is still 1.
        expect((await w.poll(session, 1, 1)).disposition).toBe('empty');
        expect(await w.store.acquireBatch([], { recordEmpty: true })).toEqual([]);
      });

      it('acquireBatch honours recordEmpty: false per item', async () => {
        const w = setup();
        const session = await w.session({ concurrency: 2 });
        const items = await w.store.acquireBatch(
          [acquireCommand(session, 0, 1), acquireCommand(session, 1, 1)],
          { recordEmpty: false },
        );
        expect(items).toEqual([
          { ok: true, value: { reply: { disposition: 'empty', sequence: 1 }, recorded: false } },
          { ok: true, value: { reply: { disposition: 'empty', sequence: 1 }, recorded: false } },
        ]);
        await expectContractError(w.poll(session, 0, 2), 'sequence_conflict');
      });

      it('renewBatch answers each renewal alone, like single renewals', async () => {
        const w = setup();
        const one = await w.submitAndClaim();
        const two = await w.submitAndClaim();
        const stale = {
          ...renewCommand(one.assignment, 1),
          owner: { ...ownerOf(one.assignment), lease_id: 'lse_stale' },
        };
        const items = await w.store.renewBatch([
          renewCommand(one.assignment, 1, 'dispatch'),
          renewCommand(two.assignment, 2),
          stale,
          renewCommand(two.assignment, 1),
        ]);
        expect(items.map((item) => (item.ok ? 'ok' : item.error.code))).toEqual([
          'ok',
          'sequence_conflict',
          'ownership_lost',
          'ok',
        ]);
        const [first, , , last] = items;
        if (!first?.ok || !last?.ok) throw new Error('expected two renewals');
        expect(first.value.dispatch_allowed).toBe(true);
        const replayOne = await w.store.renew(renewCommand(one.assignment, 1, 'dispatch'));
        expect(replayOne.expires_at).toBe(first.value.expires_at);
        expect(replayOne.renew_sequence).toBe(1);
        const replayTwo = await w.store.renew(renewCommand(two.assignment, 1));
        expect(replayTwo.expires_at).toBe(last.value.expires_at);
        expect(replayTwo.dispatch_allowed).toBe(false);
        expect(await w.store.renewBatch([])).toEqual([]);
      });

      it('settleBatch answers each settlement alone, like single settlements', async () => {
        const w = setup();
        const one = await w.submitAndClaim();
        const two = await w.submitAndClaim();
        const three = await w.submitAndClaim();
        await w.dispatch(three.assignment);
        const good = settleSuccess(one.assignment, 1);
        const mismatched = structuredClone(settleSuccess(two.assignment, 2));
        if (mismatched.report.kind !== 'completed') throw new Error('unreachable');
        mismatched.report.report.context.identity.attempt_id = one.assignment.event.id;
        const failing = settleApplicationError(three.assignment, { retryable: false });
        const second = settleSuccess(one.assignment, 1);
        const items = await w.store.settleBatch([good, mismatched, failing, second]);
        expect(items.map((item) => (item.ok ? item.value.task_state : item.error.code))).toEqual([
          'succeeded',
          'invalid_input',
          'failed',
          'conflict',
        ]);
        const [first, , third] = items;
        if (!first?.ok || !third?.ok) throw new Error('expected two settlements');
        expect(await w.store.settle(good)).toEqual({ ...first.value, already_accepted: true });
        expect(await w.store.settle(failing)).toEqual({ ...third.value, already_accepted: true });
        // The rejected item changed nothing: its attempt settles normally.
        expect((await w.store.status(w.scope, two.task.task_id)).state).toBe('active');
        expect((await w.store.settle(settleSuccess(two.assignment, 2))).task_state).toBe(
          'succeeded',
        );
        expect(await w.store.settleBatch([])).toEqual([]);
      });

      it('handBackBatch gives back an attempt never renewed, and refuses one renewed since, writing nothing', async () => {
        const w = setup();
        const retry = { max_attempts: 1, delay_ms: 0 };
        const unrenewed = await w.submitAndClaim({ retry });
        const renewed = await w.submitAndClaim({ retry });
        // The worker of the second got its reply: it renewed and runs the task.
        await w.dispatch(renewed.assignment);
        const handBack = (assignment: Assignment) =>
          settleExecutionFailure(assignment, { kind: 'rejected', retryable: true });
        const items = await w.store.handBackBatch([
          handBack(unrenewed.assignment),
          handBack(renewed.assignment),
        ]);
        expect(items.map((item) => (item.ok ? item.value.task_state : item.error.code))).toEqual([
          'queued',
          'conflict',
        ]);
        // Given back before any dispatch, the first attempt does not count: the task runs again.
        expect(await w.store.status(w.scope, unrenewed.task.task_id)).toMatchObject({
          state: 'queued',
          attempt_count: 1,
        });
        // The refused item wrote nothing: the worker's own result is taken.
        expect((await w.store.settle(settleSuccess(renewed.assignment, 1))).task_state).toBe(
          'succeeded',
        );
        expect(await w.store.handBackBatch([])).toEqual([]);
      });
    });
  });
}
