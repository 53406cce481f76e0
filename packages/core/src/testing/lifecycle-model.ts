/**
 * A model-based test of any {@link TaskStore}: fast-check generates random
 * command sequences (submits, polls, renewals, settlements, cancels, time
 * moving on, recovery), drives them through the store, and checks after every
 * step the invariants of DESIGN §5 against a small reference model.
 */
import {
  type AcquireCommand,
  type Assignment,
  ContractError,
  type RetryPolicy,
  type Scope,
  type SettleCommand,
  type TaskState,
} from '@ledgence/contracts';
import fc from 'fast-check';
import type { TaskStore } from '../ports.js';

/** What the model needs from the store under test. */
export interface LifecycleModelHarness {
  /** The store under test; each run uses a fresh scope of it. */
  store: TaskStore;
  /** Moves store time forward. */
  advance(ms: number): Promise<void>;
  /** Lease length of the store's configuration. */
  leaseDurationMs: number;
}

/** The arrows of DESIGN §5's diagram (a task may also stay where it is). */
const LEGAL: Record<TaskState, readonly TaskState[]> = {
  queued: ['queued', 'active', 'cancelled'],
  active: ['active', 'succeeded', 'failed', 'cancelled', 'queued'],
  succeeded: ['succeeded'],
  failed: ['failed'],
  cancelled: ['cancelled'],
};

type Step =
  | { kind: 'submit'; key: number; maxAttempts: number; priority: number }
  | { kind: 'poll'; slot: number; mode: 'next' | 'replay' | 'gap' }
  | { kind: 'renew'; slot: number; intent: 'dispatch' | 'keep_alive'; mode: 'next' | 'replay' }
  | {
      kind: 'settle';
      slot: number;
      outcome: 'success' | 'retryable' | 'fatal';
      quiescence: 'confirmed' | 'unconfirmed';
      op: 'fresh' | 'reuse';
    }
  | { kind: 'confirm'; slot: number }
  | { kind: 'cancel'; key: number }
  | { kind: 'advance'; fraction: number }
  | { kind: 'recover' };

const SLOTS = 3;

// Weighted towards the lifecycle path (submit → poll → renew → settle) so that
// sequences reach settlements, retries and expiries rather than idling.
const stepArbitrary: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant('submit' as const),
      key: fc.nat(5),
      maxAttempts: fc.integer({ min: 1, max: 3 }),
      priority: fc.integer({ min: -1, max: 1 }),
    }),
  },
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('poll' as const),
      slot: fc.nat(SLOTS - 1),
      mode: fc.constantFrom(
        'next' as const,
        'next' as const,
        'next' as const,
        'replay' as const,
        'gap' as const,
      ),
    }),
  },
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('renew' as const),
      slot: fc.nat(SLOTS - 1),
      intent: fc.constantFrom('dispatch' as const, 'dispatch' as const, 'keep_alive' as const),
      mode: fc.constantFrom('next' as const, 'next' as const, 'replay' as const),
    }),
  },
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('settle' as const),
      slot: fc.nat(SLOTS - 1),
      outcome: fc.constantFrom('success' as const, 'retryable' as const, 'fatal' as const),
      quiescence: fc.constantFrom('confirmed' as const, 'unconfirmed' as const),
      op: fc.constantFrom('fresh' as const, 'reuse' as const),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant('confirm' as const), slot: fc.nat(SLOTS - 1) }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('cancel' as const), key: fc.nat(5) }) },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('advance' as const),
      fraction: fc.double({ min: 0.1, max: 1.5, noNaN: true }),
    }),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('recover' as const) }) },
);

/** Codes a random but well-formed command may legitimately meet. */
const EXPECTED_REJECTIONS = new Set([
  'conflict',
  'sequence_conflict',
  'consumer_busy',
  'ownership_lost',
  'not_found',
]);

interface SlotState {
  sequence: number;
  assignment: Assignment | null;
  renewSequence: number;
  lastIntent: 'dispatch' | 'keep_alive';
  operation: number;
}

/**
 * Runs `runs` random command sequences against fresh scopes of the harness's
 * store and throws (via fast-check) on the first broken invariant, shrunk to
 * a minimal sequence.
 */
export async function runLifecycleModel(
  harness: LifecycleModelHarness,
  options: { runs?: number; maxSteps?: number; seed?: number } = {},
): Promise<void> {
  let scopeCounter = 0;
  await fc.assert(
    fc.asyncProperty(
      fc.array(stepArbitrary, {
        minLength: 10,
        maxLength: options.maxSteps ?? 40,
        // fast-check keeps arrays around ten items by default; lifecycles need room.
        size: 'max',
      }),
      async (steps) => {
        scopeCounter += 1;
        const scope: Scope = {
          tenant_id: `model-${process.pid}-${Date.now()}-${scopeCounter}`,
          namespace: 'model',
        };
        await checkSequence(harness, scope, steps);
      },
    ),
    { numRuns: options.runs ?? 60, seed: options.seed },
  );
}

async function checkSequence(
  harness: LifecycleModelHarness,
  scope: Scope,
  steps: Step[],
): Promise<void> {
  const { store } = harness;
  const session = await store.openSession({ scope, queue: 'model', concurrency: SLOTS });
  const slots: SlotState[] = Array.from({ length: SLOTS }, () => ({
    sequence: 0,
    assignment: null,
    renewSequence: 0,
    lastIntent: 'keep_alive',
    operation: 0,
  }));
  const tasks = new Map<number, { taskId: string; maxAttempts: number; state: TaskState }>();
  const accepted = new Map<string, number>();

  const tolerate = async <T>(run: () => Promise<T>): Promise<T | undefined> => {
    try {
      return await run();
    } catch (error) {
      if (error instanceof ContractError && EXPECTED_REJECTIONS.has(error.code)) return undefined;
      throw error;
    }
  };

  for (const step of steps) {
    switch (step.kind) {
      case 'submit': {
        const retry: RetryPolicy = { max_attempts: step.maxAttempts, delay_ms: 0 };
        const outcome = await tolerate(() =>
          store.submit({
            idempotency_key: `key-${step.key}`,
            input: {
              tenant_id: scope.tenant_id,
              namespace: scope.namespace,
              queue: 'model',
              program: { name: 'noop' },
              data: { key: step.key },
              retry,
              priority: step.priority,
            },
          }),
        );
        if (outcome?.created) {
          tasks.set(step.key, {
            taskId: outcome.snapshot.task_id,
            maxAttempts: step.maxAttempts,
            state: 'queued',
          });
        }
        break;
      }
      case 'poll': {
        const slot = slots[step.slot] as SlotState;
        const sequence =
          step.mode === 'next'
            ? slot.sequence + 1
            : step.mode === 'replay'
              ? slot.sequence
              : slot.sequence + 2;
        if (sequence < 1) break;
        const command: AcquireCommand = {
          scope,
          queue: 'model',
          worker_session_id: session.id,
          consumer_id: step.slot,
          sequence,
        };
        const outcome = await tolerate(() => store.acquire(command, { recordEmpty: true }));
        if (step.mode === 'gap' && outcome !== undefined) {
          throw new Error(
            `a poll with a sequence gap was answered: ${JSON.stringify(outcome.reply)}`,
          );
        }
        if (outcome === undefined) break;
        slot.sequence = sequence;
        if (outcome.reply.disposition === 'assigned') {
          if (
            step.mode === 'next' ||
            slot.assignment?.lease.owner.attempt_id !==
              outcome.reply.assignment.lease.owner.attempt_id
          ) {
            slot.renewSequence = outcome.reply.assignment.authority.renew_sequence;
            slot.operation += 1;
          }
          slot.assignment = outcome.reply.assignment;
        } else if (step.mode === 'next') {
          slot.assignment = null;
        }
        break;
      }
      case 'renew': {
        const slot = slots[step.slot] as SlotState;
        if (slot.assignment === null) break;
        const sequence = step.mode === 'next' ? slot.renewSequence + 1 : slot.renewSequence;
        if (sequence < 1) break;
        const intent = step.mode === 'replay' ? slot.lastIntent : step.intent;
        const authority = await tolerate(() =>
          store.renew({
            owner: slot.assignment?.lease.owner as Assignment['lease']['owner'],
            sequence,
            intent,
          }),
        );
        if (authority !== undefined) {
          slot.renewSequence = sequence;
          slot.lastIntent = intent;
        }
        break;
      }
      case 'settle': {
        const slot = slots[step.slot] as SlotState;
        const assignment = slot.assignment;
        if (assignment === null) break;
        if (step.op === 'fresh') slot.operation += 1;
        const owner = assignment.lease.owner;
        const report: SettleCommand['report'] =
          step.outcome === 'success'
            ? {
                kind: 'completed',
                report: {
                  context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
                  outcome: { kind: 'success', output: { slot: step.slot } },
                },
              }
            : {
                kind: 'failed',
                report: {
                  kind: 'crashed',
                  message: 'model',
                  retryable: step.outcome === 'retryable',
                },
              };
        const reply = await tolerate(() =>
          store.settle({
            owner,
            operation_id: `op-${owner.attempt_id}-${slot.operation}`,
            report,
            quiescence: step.quiescence,
            processing_trace: null,
          }),
        );
        if (reply !== undefined && !reply.already_accepted) {
          const count = (accepted.get(owner.attempt_id) ?? 0) + 1;
          accepted.set(owner.attempt_id, count);
          if (count > 1)
            throw new Error(`attempt ${owner.attempt_id} accepted ${count} settlements`);
        }
        break;
      }
      case 'confirm': {
        const owner = slots[step.slot]?.assignment?.lease.owner;
        if (owner !== undefined) await tolerate(() => store.confirmQuiescence(owner));
        break;
      }
      case 'cancel': {
        const task = tasks.get(step.key);
        if (task !== undefined) await store.cancel(scope, task.taskId);
        break;
      }
      case 'advance':
        await harness.advance(Math.round(harness.leaseDurationMs * step.fraction));
        break;
      case 'recover':
        await store.recoverExpiredLeases(100);
        break;
    }
    await checkInvariants(store, scope, tasks);
  }
}

async function checkInvariants(
  store: TaskStore,
  scope: Scope,
  tasks: Map<number, { taskId: string; maxAttempts: number; state: TaskState }>,
): Promise<void> {
  for (const task of tasks.values()) {
    const status = await store.status(scope, task.taskId);
    if (!LEGAL[task.state].includes(status.state)) {
      throw new Error(
        `task ${task.taskId} moved ${task.state} → ${status.state}, off DESIGN §5's arrows`,
      );
    }
    task.state = status.state;
    const history = await store.history(scope, task.taskId, 0);
    history.forEach((record, index) => {
      if (record.sequence !== index + 1) {
        throw new Error(
          `task ${task.taskId} history has a gap at ${index + 1}: ${record.sequence}`,
        );
      }
    });
    const dispatches = history.filter((r) => r.event.reason === 'dispatch_authorized').length;
    if (dispatches > task.maxAttempts) {
      throw new Error(
        `task ${task.taskId} was dispatched ${dispatches} times, max ${task.maxAttempts}`,
      );
    }
    // A task is only (re-)queued while its retry budget has room (DESIGN §4.1).
    if (status.state === 'queued' && dispatches >= task.maxAttempts) {
      throw new Error(
        `task ${task.taskId} is queued after ${dispatches} of ${task.maxAttempts} dispatches`,
      );
    }
    const terminal = ['succeeded', 'failed', 'cancelled'].includes(status.state);
    if (terminal !== (status.terminal_at !== null)) {
      throw new Error(
        `task ${task.taskId} is ${status.state} with terminal_at ${status.terminal_at}`,
      );
    }
  }
}
