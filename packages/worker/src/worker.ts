/**
 * The worker runtime: sessions, one long-polling acquire loop over all idle
 * slots, dispatch-intent renewals, batched heartbeats, cancellation and lease
 * loss through `AbortSignal`, settlement, and a draining `stop()`. The
 * protocol decisions live in the pure machines of slot.ts, lease.ts,
 * settle.ts and settler.ts; this file only performs their effects.
 */
import {
  type AcquireReply,
  type Assignment,
  type CloudEvent,
  CONTROL_REQUEST_TIMEOUT_MS,
  type FailureRun,
  failureRun,
  fitText,
  LedgenceError,
  LONG_POLL_WAIT_MS,
  MAX_SESSION_CONCURRENCY,
  MAX_WORKER_BATCH,
  NAME_MAX_BYTES,
  type ProgramDescriptor,
  type Quiescence,
  RENEW_INTERVAL_MS,
  SCOPE_TEXT_MAX_BYTES,
  type Scope,
  SESSION_VALIDITY_MS,
  type SettleCommand,
  type WorkerSession,
} from '@ledgence/contracts';
import { type SessionReply, WorkerApi } from './api.js';
import { type BackoffPolicy, backoffDelay, checkedBackoff, retryDelay } from './backoff.js';
import {
  ApplicationError,
  isRetryable,
  ProblemError,
  ProtocolError,
  problemCode,
} from './errors.js';
import { type HttpOptions, HttpTransport, isProblem, requiredText, wireWaitMs } from './http.js';
import { laneSlots, requestLanes } from './lanes.js';
import {
  awaitingDispatch,
  clockTick,
  dispatchDecision,
  initialLease,
  type LeaseState,
  type LeaseStep,
  maySettle,
  nextRenew,
  renewDueIn,
  renewFailed,
  renewReplied,
  renewResendDelay,
  renewRetryDelay,
} from './lease.js';
import {
  consoleLogger,
  errorFields,
  type LogFields,
  type Logger,
  logRecovered,
  logRetriedFailure,
  safeLogger,
} from './logger.js';
import { extensionDelayMs, shorterValidity, validityShownBy } from './session.js';
import {
  type AbortCause,
  failureReport,
  type HandlerOutcome,
  reportFor,
  settleCommandFor,
} from './settle.js';
import { type SettleResult, Settler } from './settler.js';
import {
  beginPoll,
  classifyPollError,
  initialSlot,
  type PollCommand,
  pollFailed,
  pollReplied,
  released,
  type SlotState,
  type SlotStep,
} from './slot.js';
import { issuePath, type StandardSchemaV1 } from './standard-schema.js';
import { perTurn, timerDelay } from './timers.js';

/**
 * Lease, backoff and deadline timing: a monotonic clock, so a wall-clock step (NTP) can neither
 * stretch a lease past the server's nor cut it short. `Date.now()` is kept for reported timestamps.
 */
const monotonicNow = (): number => performance.now();

/** Options of a {@link Worker}. */
export interface WorkerOptions extends HttpOptions {
  /** The tenant the worker serves. */
  tenant: string;
  /** The namespace the worker serves. */
  namespace: string;
  /** The queue it takes tasks from. */
  queue: string;
  /** How many tasks it runs at once (1..1000): one consumer slot each. */
  concurrency: number;
  /** Where the SDK logs; warnings and errors to the console by default. */
  logger?: Logger | undefined;
  /** Heartbeat period of held leases; RENEW_INTERVAL_MS (10 s) by default. */
  renewIntervalMs?: number | undefined;
  /** Long-poll wait of an acquire; LONG_POLL_WAIT_MS (20 s) by default. */
  pollWaitMs?: number | undefined;
  /** Default deadline of `stop()` for in-flight tasks; 30 s by default. */
  shutdownGraceMs?: number | undefined;
  /** After the shutdown deadline, how long aborted handlers get to return; 1 s by default. */
  abortGraceMs?: number | undefined;
  /**
   * Period of session extension; a third of SESSION_VALIDITY_MS by default. The worker extends
   * sooner when it learns that the server's sessions are shorter (`session.ts`).
   */
  sessionExtendIntervalMs?: number | undefined;
  /**
   * Backoff of retried session opens, polls, renewals, settlements and quiescence confirmations.
   * A failed reply's `Retry-After` lengthens the wait, up to `maxMs` (and, for a renewal, never
   * past the time its lease must be renewed by).
   */
  backoff?: BackoffPolicy | undefined;
}

/** Options of {@link Worker.stop}. */
export interface StopOptions {
  /**
   * How long in-flight tasks may run before their signal is aborted; the worker's
   * `shutdownGraceMs` by default. A later stop() with a shorter grace brings the deadline
   * forward. Negative is 0; `NaN` or a non-number is warned about and the default is used.
   */
  graceMs?: number;
}

/** What a handler learns about the attempt it runs. */
export interface TaskContext {
  /** The task's id. */
  readonly taskId: string;
  /** The run's id. */
  readonly runId: string;
  /** The attempt's id. */
  readonly attemptId: string;
  /**
   * The attempt's 1-based ordinal among the task's attempts so far. Attempts lost before their
   * dispatch was granted are numbered too but do not count against `max_attempts` (DESIGN §5), so
   * it can exceed `max_attempts`: it does not tell the last try.
   */
  readonly attempt: number;
  /** The program being run. */
  readonly program: ProgramDescriptor;
  /** The queue the task came from. */
  readonly queue: string;
  /** When the attempt's execution budget ends, in store-time UTC milliseconds. */
  readonly deadline: number;
  /**
   * Aborts when the task is cancelled, the lease is lost (the server says so,
   * or it expired locally before a renewal succeeded), the execution budget
   * runs out, or the worker shuts down past its grace period. The reason is a
   * {@link TaskAbortedError}.
   */
  readonly signal: AbortSignal;
  /** The immutable invocation event (CloudEvents 1.0). */
  readonly event: CloudEvent;
  /** The worker's logger. */
  readonly logger: Logger;
  /**
   * Renews the lease now rather than at the next heartbeat; resolves once a
   * renewal was answered (or the lease is gone). Never rejects: watch
   * `signal` for loss and cancellation.
   */
  heartbeat(): Promise<void>;
}

/**
 * A task handler: gets the task's data and a context, returns the output
 * (plain JSON; `undefined` is reported as `null`). Throw an
 * {@link ApplicationError} for an application error; any other throw is an
 * execution failure `crashed`, retried per the task's policy.
 */
export type TaskHandler<Data = unknown> = (data: Data, ctx: TaskContext) => unknown;

/** Options of {@link Worker.register}. */
export interface RegisterOptions<Schema extends StandardSchemaV1 = StandardSchemaV1> {
  /**
   * A Standard Schema (valibot, zod, arktype…) the data is validated with
   * before the handler runs; its output is what the handler receives.
   * Invalid data settles as application error `invalid_data`, not retryable.
   */
  schema?: Schema;
}

/** Why a task's signal was aborted; the `reason` of {@link TaskContext.signal}. */
export class TaskAbortedError extends LedgenceError {
  static override readonly brand: string = '@ledgence/worker/TaskAbortedError';

  /** Always `'task_aborted'`: a stable identifier, like every SDK error's; `why` says which abort. */
  readonly code = 'task_aborted' as const;
  /** `cancelled`, `lease_lost`, `timeout` or `shutdown`. */
  readonly why: AbortCause;

  constructor(why: AbortCause) {
    super(ABORT_MESSAGES[why]);
    this.why = why;
  }

  /** Errors are data: what the error says, without the stack (`JSON.stringify` drops `message`). */
  toJSON(): { name: string; code: 'task_aborted'; message: string; why: AbortCause } {
    return { name: this.name, code: this.code, message: this.message, why: this.why };
  }
}

/** The loops that retry through an outage, named as their log lines begin. */
type RetryingLoop = 'opening a session' | 'acquire' | 'renewal' | 'confirming quiescence';

const ABORT_MESSAGES: Record<AbortCause, string> = {
  cancelled: 'the task was cancelled',
  lease_lost: 'the lease on this attempt was lost',
  timeout: "the attempt's execution budget ran out",
  shutdown: 'the worker is shutting down',
};

interface Registration {
  handler: TaskHandler<unknown>;
  schema: StandardSchemaV1 | undefined;
}

/** The runtime of one held assignment. */
interface Held {
  readonly consumerId: number;
  readonly assignment: Assignment;
  lease: LeaseState;
  /**
   * The sequence of the renewal in flight, `null` when none is. A reply of an earlier request
   * still out (sent again, see `#armResend`) is taken when it comes but blocks no later renewal.
   */
  inFlight: number | null;
  renewFailures: number;
  readonly abort: AbortController;
  abortCause: AbortCause | null;
  handlerRunning: boolean;
  /** Set once the settlement was handed to the settler. */
  settling: boolean;
  /** Set when the runtime asks for dispatch; before that no renewal is sent. */
  dispatchRequested: boolean;
  dispatchWaiters: (() => void)[];
  heartbeatWaiters: (() => void)[];
  /** Reports the handler as still running: past the end of its budget, or of the shutdown. */
  forceReport: (why: 'timeout' | 'shutdown') => void;
  readonly forced: Promise<'timeout' | 'shutdown'>;
  retryTimer: ReturnType<typeof setTimeout> | undefined;
  expiryTimer: ReturnType<typeof setTimeout> | undefined;
  /** Renews this lease early when it would expire before the next periodic heartbeat. */
  dueTimer: ReturnType<typeof setTimeout> | undefined;
  /** Re-sends an unanswered renewal whose request would outlast half the lease's time left. */
  resendTimer: ReturnType<typeof setTimeout> | undefined;
  budgetTimer: ReturnType<typeof setTimeout> | undefined;
}

type State = 'new' | 'running' | 'stopping' | 'stopped';

/**
 * Wakes the acquire loop when something changed (a slot freed, a poll ended,
 * a session retired, stop). A notification with no waiter is remembered, so
 * a change between the loop's check and its wait is never lost.
 */
class Notifier {
  #waiters: (() => void)[] = [];
  #signalled = false;

  notify(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    if (waiters.length === 0) this.#signalled = true;
    for (const waiter of waiters) waiter();
  }

  wait(ms?: number): Promise<void> {
    if (this.#signalled) {
      this.#signalled = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const done = () => {
        clearTimeout(timer);
        this.#waiters = this.#waiters.filter((w) => w !== done);
        resolve();
      };
      this.#waiters.push(done);
      if (ms !== undefined) timer = setTimeout(done, timerDelay(ms));
    });
  }
}

function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** Resolves after `promise` or `ms`, whichever is first; never rejects. */
async function within(promise: Promise<unknown>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([
    promise.then(
      () => {},
      () => {},
    ),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, timerDelay(ms));
    }),
  ]);
  clearTimeout(timer);
}

/**
 * Settles as `promise` does, or with `null` once `signal` aborts, whichever is first. The
 * listener goes when either happens: `signal` (the worker's, aborted at stop()) outlives many
 * such races, and must not keep one per race.
 */
function unlessAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T | null> {
  if (signal.aborted) return Promise.resolve(null);
  return new Promise<T | null>((resolve, reject) => {
    const onAbort = () => resolve(null);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(error);
      },
    );
  });
}

/** Resolves after `ms`, or at once when `signal` aborts; leaves no timer or listener behind. */
function pauseUnlessAborted(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, timerDelay(ms));
    signal.addEventListener('abort', done, { once: true });
  });
}

/**
 * The grace stop() was asked for, unchecked (`#graceOf` checks it): `options.graceMs`, or
 * `options` itself when it is not an object. A bare `stop(5000)` is how graphile-worker's and
 * Temporal's users, and plain JavaScript, write it; read as options, its grace would silently be
 * the default. A bare value that is not a number (`stop('5000')`) is thus warned about, as
 * `graceMs: '5000'` is. `null`, like `undefined`, asks for the default.
 */
function graceRequested(options: unknown): unknown {
  if (options === null || options === undefined) return undefined;
  if (typeof options === 'object') return (options as StopOptions).graceMs;
  return options;
}

function positive(name: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isFinite(value) || value < 0) throw new TypeError(`${name} must be a number ≥ 0`);
  return value;
}

/**
 * Runs registered handlers for the tasks of one queue. See the package
 * README for the protocol it follows.
 *
 * @example
 * const worker = new Worker({ url, tenant: 'acme', namespace: 'prod', queue: 'email', concurrency: 8 });
 * worker.register('send-email', async (data, ctx) => sendEmail(data, { signal: ctx.signal }));
 * process.once('SIGTERM', () => void worker.stop({ graceMs: 10_000 }));
 * await worker.run();
 */
export class Worker {
  readonly #scope: Scope;
  readonly #queue: string;
  readonly #concurrency: number;
  /** The most polls one acquire request carries (lanes.ts). */
  readonly #laneSlots: number;
  readonly #logger: Logger;
  readonly #api: WorkerApi;
  readonly #http: HttpTransport;
  readonly #renewIntervalMs: number;
  readonly #pollWaitMs: number;
  readonly #shutdownGraceMs: number;
  readonly #abortGraceMs: number;
  readonly #extendIntervalMs: number;
  readonly #backoff: BackoffPolicy;
  readonly #handlers = new Map<string, Registration>();
  readonly #notifier = new Notifier();
  readonly #settler: Settler;
  /**
   * The runs of failures of the loops that retry through an outage. Each failed try was a warning
   * (22 for one short outage, at the default backoff); now a run's first failure is a warning,
   * then one a minute with the count, and the first success says the loop works again — as the
   * server's loops log (`failureRun`).
   */
  readonly #failureRuns: Record<RetryingLoop, FailureRun> = {
    'opening a session': failureRun(),
    acquire: failureRun(),
    renewal: failureRun(),
    // Each unconfirmed task retries its own confirmation through an outage (review r48a: a
    // warning per retry and per task before).
    'confirming quiescence': failureRun(),
  };

  #state: State = 'new';
  #slots: SlotState[];
  #session: WorkerSession | null = null;
  /** Local monotonic time the request that set the current session's expiry was sent. */
  #sessionRefreshSentAt = 0;
  /** The longest the server's sessions may last, as far as the worker has learned (session.ts). */
  #sessionValidityMs: number | null = null;
  #sessionOpening: Promise<WorkerSession | null> | null = null;
  #pollNotBefore = 0;
  /**
   * Per slot, the local monotonic time before which it may not poll again: a failed poll backs
   * off the slots it carried, not the worker (a slot refused as `consumer_busy`, e.g. while the
   * server holds its attempt for quiescence, must not pause the polls of the others).
   */
  #slotNotBefore: number[];
  /**
   * Per slot, the local monotonic time a quiescence confirmation of its attempt was last
   * answered: the server held the slot until then (`consumer_busy`), and a refusal of a poll sent
   * before it says nothing about the slot now.
   */
  #slotFreedAt: number[];
  /** Polls in a row answered all `empty` well before their wait (see {@link #paceEmptyPolls}). */
  #earlyEmpties = 0;
  readonly #pollAborts = new Set<AbortController>();
  readonly #polls = new Set<Promise<void>>();
  readonly #executions = new Set<Promise<void>>();
  /** Quiescence confirmations under way (sent, or waiting to be sent again). */
  readonly #confirmations = new Set<Promise<void>>();
  readonly #held = new Map<string, Held>();
  readonly #renewThisTurn = perTurn<Held>((helds) => this.#renew(helds));
  readonly #resendThisTurn = perTurn<Held>((helds) => this.#resend(helds));
  #renewTimer: ReturnType<typeof setInterval> | undefined;
  #extendTimer: ReturnType<typeof setTimeout> | undefined;
  #fatal: unknown;
  /**
   * Local monotonic time at which stop()'s grace ends; set by the first stop(), brought forward
   * by a later stop() with a shorter grace (a second SIGTERM), never pushed back.
   */
  #graceDeadline = Number.POSITIVE_INFINITY;
  /** Resolved (and replaced) whenever a later stop() brings the grace deadline forward. */
  #graceShortened = deferred();
  /**
   * Aborted at stop(): a session open in flight (the stopping worker takes no task with it), the
   * wait for it, and an open's backoff.
   */
  readonly #openAbort = new AbortController();
  /**
   * Aborts a session extension in flight when the drain ends: left running, it would hold a
   * socket and a timer of the request timeout after run() resolved (with a `fetch` of the
   * caller's, which `closeIdle` does not reach).
   */
  readonly #stoppedAbort = new AbortController();
  /** Set when stop() came before run(): the one run() that follows resolves at once. */
  #stoppedBeforeRun = false;
  /** Set when stop()'s grace period has passed: from then on no handler may start. */
  #graceOver = false;
  readonly #stopRequested = deferred();
  readonly #stopped = deferred();

  constructor(options: WorkerOptions) {
    for (const key of ['tenant', 'namespace'] as const) {
      requiredText(options, key, SCOPE_TEXT_MAX_BYTES);
    }
    requiredText(options, 'queue', NAME_MAX_BYTES);
    if (
      !Number.isInteger(options.concurrency) ||
      options.concurrency < 1 ||
      options.concurrency > MAX_SESSION_CONCURRENCY
    ) {
      throw new TypeError(`concurrency must be an integer from 1 to ${MAX_SESSION_CONCURRENCY}`);
    }
    this.#scope = { tenant_id: options.tenant, namespace: options.namespace };
    this.#queue = options.queue;
    this.#concurrency = options.concurrency;
    this.#laneSlots = laneSlots(options.concurrency);
    this.#logger = safeLogger(options.logger ?? consoleLogger);
    this.#http = new HttpTransport(options);
    this.#api = new WorkerApi(this.#http);
    this.#renewIntervalMs = positive('renewIntervalMs', options.renewIntervalMs, RENEW_INTERVAL_MS);
    if (this.#renewIntervalMs === 0) throw new TypeError('renewIntervalMs must be positive');
    this.#pollWaitMs = wireWaitMs('pollWaitMs', options.pollWaitMs ?? LONG_POLL_WAIT_MS);
    this.#shutdownGraceMs = positive('shutdownGraceMs', options.shutdownGraceMs, 30_000);
    this.#abortGraceMs = positive('abortGraceMs', options.abortGraceMs, 1_000);
    this.#extendIntervalMs = positive(
      'sessionExtendIntervalMs',
      options.sessionExtendIntervalMs,
      Math.floor(SESSION_VALIDITY_MS / 3),
    );
    if (this.#extendIntervalMs === 0)
      throw new TypeError('sessionExtendIntervalMs must be positive');
    this.#backoff = checkedBackoff(options.backoff);
    this.#slots = Array.from({ length: this.#concurrency }, (_, i) => initialSlot(i));
    this.#slotNotBefore = Array.from({ length: this.#concurrency }, () => 0);
    this.#slotFreedAt = Array.from({ length: this.#concurrency }, () => 0);
    this.#settler = new Settler({
      send: (commands) => this.#api.settleBatch(commands),
      logger: this.#logger,
      backoff: this.#backoff,
      maxBatch: MAX_WORKER_BATCH,
      maxInFlight: requestLanes(options.concurrency),
    });
  }

  /**
   * Registers the handler of a program (by name). With a `schema`, the task's
   * data is validated first and the handler receives the schema's output.
   * Returns the worker, for chaining. Register before `run()`.
   */
  register<Schema extends StandardSchemaV1>(
    program: string,
    handler: TaskHandler<StandardSchemaV1.InferOutput<Schema>>,
    options: RegisterOptions<Schema> & { schema: Schema },
  ): this;
  /**
   * Registers the handler of a program (by name), untyped: the handler
   * receives `unknown` (the task's data, or the output of `options.schema`
   * when one is given). Returns the worker, for chaining. Register before `run()`.
   */
  register(program: string, handler: TaskHandler<unknown>, options?: RegisterOptions): this;
  register(program: string, handler: TaskHandler<never>, options?: RegisterOptions): this {
    // A name no task can carry (a line break from an env file, say) would leave every task of
    // the real program failing `rejected` ("no handler registered"): refused here, as the queue is.
    requiredText({ program }, 'program', NAME_MAX_BYTES);
    if (typeof handler !== 'function') throw new TypeError('handler must be a function');
    if (options?.schema !== undefined && !isStandardSchema(options.schema)) {
      // Found here rather than by every task, each failing inside the SDK and retried.
      throw new TypeError(
        'schema must implement Standard Schema v1 (a "~standard" property with a validate ' +
          'function): valibot ≥ 1, zod ≥ 3.24, arktype ≥ 2',
      );
    }
    if (this.#handlers.has(program))
      throw new TypeError(`program "${program}" is already registered`);
    this.#handlers.set(program, {
      handler: handler as TaskHandler<unknown>,
      schema: options?.schema,
    });
    return this;
  }

  /**
   * Opens a session and processes tasks until {@link Worker.stop} is called
   * (or an unrecoverable error occurs: a rejected key, a server breaking the
   * contract), then drains and resolves (or rejects with that error). After
   * a stop() that came before it, resolves at once without contacting the
   * server. A second run() is a `TypeError`.
   */
  async run(): Promise<void> {
    if (this.#stoppedBeforeRun) {
      // stop() came first (a SIGTERM before run() was reached): there is nothing to run or
      // drain, and it is not an error — run() resolves, as it does after a stop.
      this.#stoppedBeforeRun = false;
      this.#logger.info('worker stopped before run(); not starting', {});
      return;
    }
    if (this.#state !== 'new') throw new TypeError('run() can be called once per Worker');
    if (this.#handlers.size === 0)
      throw new TypeError('register at least one handler before run()');
    this.#state = 'running';
    this.#logger.info('worker starting', {
      queue: this.#queue,
      concurrency: this.#concurrency,
    });
    this.#renewTimer = setInterval(
      () => this.#renew([...this.#held.values()]),
      timerDelay(this.#renewIntervalMs),
    );
    const loop = this.#acquireLoop().catch((error: unknown) => this.#fail(error));
    await this.#stopRequested.promise;
    await this.#drain(loop);
    if (this.#fatal !== undefined) throw this.#fatal;
  }

  /**
   * Stops taking tasks, lets in-flight tasks finish within `graceMs`, then
   * aborts their signals, reports those still running as `cancelled`
   * (retryable), and resolves once every settlement is accepted, rejected or
   * given up. No handler starts after `graceMs`: a task whose dispatch is
   * answered later is handed back without running. Never rejects or throws;
   * safe to call more than once: a later call with a shorter `graceMs` (a
   * second SIGTERM) brings the deadline forward, a longer one never extends it.
   * A negative `graceMs` is 0; one that is not a number (`NaN`, a string) is
   * logged as a warning and the worker's `shutdownGraceMs` is used instead.
   * The grace may also be given bare: `stop(10_000)` is `stop({ graceMs: 10_000 })`.
   *
   * @param options - `{ graceMs }`, or the grace in milliseconds itself.
   */
  stop(options: StopOptions | number = {}): Promise<void> {
    if (this.#state === 'new') {
      this.#state = 'stopped';
      this.#stoppedBeforeRun = true;
      this.#stopped.resolve();
      return this.#stopped.promise;
    }
    if (this.#state === 'stopped') return this.#stopped.promise;
    const requested = graceRequested(options);
    if (this.#state === 'running') {
      this.#graceDeadline = monotonicNow() + this.#graceOf(requested);
      this.#state = 'stopping';
      this.#logger.info('worker stopping', { in_flight: this.#held.size });
      this.#openAbort.abort(new TaskAbortedError('shutdown'));
      for (const controller of this.#pollAborts) controller.abort();
      this.#stopRequested.resolve();
      this.#notifier.notify();
    } else if (requested !== undefined) {
      // Stopping already: only an explicit, shorter grace changes anything (a second SIGTERM
      // asking to be quick). The default grace, or an internal stop on an error, changes nothing.
      const deadline = monotonicNow() + this.#graceOf(requested);
      if (deadline < this.#graceDeadline) {
        this.#graceDeadline = deadline;
        this.#logger.info('shutdown grace shortened', {
          grace_ms_left: Math.max(0, deadline - monotonicNow()),
        });
        const shortened = this.#graceShortened;
        this.#graceShortened = deferred();
        shortened.resolve();
      }
    }
    return this.#stopped.promise;
  }

  /**
   * stop()'s `graceMs` as a number of milliseconds ≥ 0. stop() cannot throw (it is called from
   * signal handlers, where a throw ends the process with nothing drained), so a grace that is not
   * a number — `NaN` from `Number()` of an unset variable, a string passed from `process.env` as
   * is, which would otherwise be concatenated into the deadline and make it a grace of ~0 — is
   * replaced by the worker's `shutdownGraceMs`, with a warning. A negative grace is "no time
   * left": 0. `Infinity` waits as long as a timer holds.
   */
  #graceOf(graceMs: unknown): number {
    if (graceMs === undefined) return this.#shutdownGraceMs;
    if (typeof graceMs === 'number' && !Number.isNaN(graceMs)) return Math.max(0, graceMs);
    this.#logger.warn('stop() graceMs must be a number ≥ 0; using shutdownGraceMs instead', {
      grace_ms: typeof graceMs === 'string' ? graceMs : String(graceMs),
      shutdown_grace_ms: this.#shutdownGraceMs,
    });
    return this.#shutdownGraceMs;
  }

  /**
   * Resolves once `promise` settles or stop()'s grace deadline passes, following the deadline
   * when a later stop() brings it forward. Never rejects.
   */
  async #withinGrace(promise: Promise<unknown>): Promise<void> {
    let done = false;
    const settled = promise.then(
      () => {
        done = true;
      },
      () => {
        done = true;
      },
    );
    while (!done) {
      const shortened = this.#graceShortened.promise;
      let moved = false;
      const left = this.#graceDeadline - monotonicNow();
      if (left <= 0) return;
      await within(Promise.race([settled, shortened.then(() => (moved = true))]), left);
      if (!moved) return;
    }
  }

  /** The number of tasks this worker holds right now. */
  get inFlight(): number {
    return this.#held.size;
  }

  // ---- Sessions -------------------------------------------------------------

  async #ensureSession(): Promise<WorkerSession | null> {
    if (this.#session !== null) return this.#session;
    if (this.#sessionOpening === null) {
      this.#sessionOpening = this.#openSession().finally(() => {
        this.#sessionOpening = null;
      });
    }
    return this.#sessionOpening;
  }

  async #openSession(): Promise<WorkerSession | null> {
    let failures = 0;
    while (this.#state === 'running') {
      try {
        const sentAt = monotonicNow();
        const reply = await this.#api.openSession(
          {
            scope: this.#scope,
            queue: this.#queue,
            concurrency: this.#concurrency,
          },
          this.#openAbort.signal,
        );
        const { session } = reply;
        this.#sessionRefreshed(reply, sentAt);
        this.#loopSucceeded('opening a session');
        this.#logger.info('session opened', { session_id: session.id });
        this.#notifier.notify();
        return session;
      } catch (error) {
        // Aborted by stop(), or failed once stop() had come: nothing waits for this session.
        if (this.#state !== 'running') return null;
        if (!isRetryable(error)) {
          this.#fail(error);
          return null;
        }
        failures += 1;
        const delay = retryDelay(failures, error, this.#backoff);
        this.#loopFailed('opening a session', { delay_ms: delay, ...errorFields(error) });
        // Only stop cuts the backoff short: other wake-ups must not hammer the server. Not a
        // reaction on the stop promise: one per failed open would stay for the worker's life.
        await pauseUnlessAborted(delay, this.#openAbort.signal);
      }
    }
    return null;
  }

  /** Takes a session reply as current and schedules its next extension. */
  #sessionRefreshed(reply: SessionReply, sentAt: number): void {
    if (this.#state === 'stopped') return;
    this.#session = reply.session;
    this.#sessionRefreshSentAt = sentAt;
    this.#sessionValidityMs = shorterValidity(
      this.#sessionValidityMs,
      validityShownBy(reply.session.expires_at, reply.date),
    );
    this.#scheduleExtension();
  }

  #scheduleExtension(): void {
    clearTimeout(this.#extendTimer);
    // A stopped worker extends nothing: an extension failing after stop() would otherwise arm
    // a referenced timer of a whole period, keeping the process alive after run() resolved. Nor
    // does a drain that has aborted extensions: the one it cut fails while the drain still waits
    // for quiescence confirmations, and each re-armed extension would fail at once, until the
    // last one's timer outlived run().
    if (this.#state === 'stopped' || this.#stoppedAbort.signal.aborted) return;
    const delay = extensionDelayMs(this.#extendIntervalMs, this.#sessionValidityMs);
    this.#extendTimer = setTimeout(() => this.#extendSession(), timerDelay(delay));
  }

  #extendSession(): void {
    const session = this.#session;
    if (session === null || this.#state === 'stopped') return;
    const sentAt = monotonicNow();
    this.#api.extendSession(session.id, this.#scope, this.#stoppedAbort.signal).then(
      (reply) => {
        if (this.#session?.id === reply.session.id) this.#sessionRefreshed(reply, sentAt);
      },
      (error: unknown) => {
        const code = problemCode(error);
        if (code === 'session_expired' || code === 'session_not_found') {
          this.#logger.warn('session lost; opening a new one', { session_id: session.id });
          this.#retireSession(session.id, code);
        } else {
          this.#logger.warn('extending the session failed', {
            session_id: session.id,
            ...errorFields(error),
          });
          // Tried again at the next period, whatever a `Retry-After` asked: the period is at most
          // a third of the session's validity, the margin that keeps the session alive through a
          // failed extension, and a later try could let it expire, and every slot's cursor with it.
          if (this.#session?.id === session.id) this.#scheduleExtension();
        }
      },
    );
  }

  /**
   * Forgets a session that is gone. One found expired proves the server's validity is at most
   * the time since its expiry was last set: extensions come sooner from then on.
   */
  #retireSession(sessionId: string, code: string | undefined): void {
    if (this.#session?.id !== sessionId) {
      this.#notifier.notify();
      return;
    }
    if (code === 'session_expired') {
      const bound = monotonicNow() - this.#sessionRefreshSentAt;
      if (this.#sessionValidityMs === null || bound < this.#sessionValidityMs) {
        this.#sessionValidityMs = bound;
        this.#logger.warn('the server lets sessions expire sooner than this worker extends them', {
          session_validity_ms_at_most: bound,
          extend_every_ms: extensionDelayMs(this.#extendIntervalMs, bound),
        });
      }
    }
    this.#session = null;
    clearTimeout(this.#extendTimer);
    this.#notifier.notify();
  }

  // ---- Acquisition ----------------------------------------------------------

  async #acquireLoop(): Promise<void> {
    while (this.#state === 'running') {
      // A session open is not waited for past stop(): it may take its whole request timeout
      // (a server that does not answer), and a stopping worker has no use for it; its reply,
      // if any, comes to a stopping or stopped worker, which takes no task with it. Raced with
      // the signal stop() aborts, whose listener goes once the open ends: a reaction on the
      // stop promise would stay, with the session it raced, for the worker's life, one more at
      // every session lost and re-opened.
      const session =
        this.#session ?? (await unlessAborted(this.#ensureSession(), this.#openAbort.signal));
      if (session === null || this.#state !== 'running') break;
      const wait = this.#pollNotBefore - monotonicNow();
      if (wait > 0) {
        await this.#notifier.wait(wait);
        continue;
      }
      // Let slots freed in the same tick join one request.
      await new Promise((resolve) => setImmediate(resolve));
      if (this.#state !== 'running') break;
      // One clock reading for both: a backoff ending between two readings would make the first
      // skip the slot and the second see no backoff left, and the loop would wait for a
      // notification that never comes (no poll in flight, nothing held) — a worker that never
      // polls again, seen on a loaded machine.
      const now = monotonicNow();
      const commands = this.#startPolls(this.#session?.id ?? null, now);
      if (commands.length === 0) {
        await this.#notifier.wait(this.#nextSlotDueIn(now));
        continue;
      }
      this.#sendPolls(commands, this.#pollWaitMs);
    }
  }

  /**
   * Starts a poll on every idle slot that can poll (at `now`, past its backoff; without `now`,
   * whatever its backoff: the drain's replay); returns their commands.
   */
  #startPolls(sessionId: string | null, now?: number): PollCommand[] {
    const commands: PollCommand[] = [];
    this.#slots = this.#slots.map((slot) => {
      if (now !== undefined && (this.#slotNotBefore[slot.consumerId] ?? 0) > now) return slot;
      const started = beginPoll(slot, sessionId);
      if (started === null) return slot;
      commands.push(started.command);
      return started.slot;
    });
    return commands;
  }

  /**
   * How long after `now` the first idle slot's backoff ends; `undefined` when none is backing
   * off at `now` (the same reading `#startPolls` skipped slots by).
   */
  #nextSlotDueIn(now: number): number | undefined {
    let next = Number.POSITIVE_INFINITY;
    for (const slot of this.#slots) {
      const notBefore = this.#slotNotBefore[slot.consumerId] ?? 0;
      if (slot.phase === 'idle' && notBefore > now) next = Math.min(next, notBefore);
    }
    return next === Number.POSITIVE_INFINITY ? undefined : next - now;
  }

  /**
   * Sends polls grouped by session (one batch per session, as the route requires), each group
   * in requests of at most a lane's slots.
   */
  #sendPolls(commands: PollCommand[], waitMs: number): void {
    const bySession = new Map<string, PollCommand[]>();
    for (const command of commands) {
      const group = bySession.get(command.sessionId) ?? [];
      group.push(command);
      bySession.set(command.sessionId, group);
    }
    for (const group of bySession.values()) {
      // A wave of polls larger than a lane goes as several requests (lanes.ts).
      for (let start = 0; start < group.length; start += this.#laneSlots) {
        const poll = this.#poll(group.slice(start, start + this.#laneSlots), waitMs).finally(() => {
          this.#polls.delete(poll);
          this.#notifier.notify();
        });
        this.#polls.add(poll);
      }
    }
  }

  async #poll(commands: PollCommand[], waitMs: number): Promise<void> {
    const controller = new AbortController();
    this.#pollAborts.add(controller);
    const sentAt = monotonicNow();
    try {
      const replies = await this.#api.acquireBatch(
        commands.map((command) => ({
          scope: this.#scope,
          queue: this.#queue,
          worker_session_id: command.sessionId,
          consumer_id: command.consumerId,
          sequence: command.sequence,
        })),
        waitMs,
        controller.signal,
      );
      this.#loopSucceeded('acquire');
      this.#paceEmptyPolls(replies, waitMs, sentAt);
      replies.forEach((item, index) => {
        const command = commands[index] as PollCommand;
        const slot = this.#slots[command.consumerId] as SlotState;
        if (isProblem(item)) {
          const error = new ProblemError(item);
          this.#applySlot(pollFailed(slot, classifyPollError(error), item.detail), sentAt, error);
        } else {
          this.#applySlot(pollReplied(slot, item), sentAt);
        }
      });
    } catch (error) {
      const aborted = controller.signal.aborted;
      if (!aborted) this.#loopFailed('acquire', { slots: commands.length, ...errorFields(error) });
      for (const command of commands) {
        const slot = this.#slots[command.consumerId] as SlotState;
        const message = error instanceof Error ? error.message : String(error);
        this.#applySlot(
          pollFailed(slot, classifyPollError(error, aborted), message),
          sentAt,
          error,
        );
      }
      // One request failed, so its slots wait out one backoff and poll again together: each
      // slot's own jittered delay would scatter a batch into a request per slot after an outage.
      const until = Math.max(...commands.map((c) => this.#slotNotBefore[c.consumerId] ?? 0));
      for (const command of commands) this.#slotNotBefore[command.consumerId] = until;
    } finally {
      this.#pollAborts.delete(controller);
    }
  }

  /**
   * An idle queue must not turn into a poll per round trip. A server may park a poll for less
   * than asked (its LEDGENCE_LONG_POLL_WAIT_MS may be 0) and the worker may ask for no wait at
   * all; either way every `empty` comes back at once. From the third such batch in a row the
   * next poll starts no sooner than 100 ms, doubling to 1 s, after the last one started, until a
   * poll finds work or parks as asked. A single early `empty` (a wake whose task another worker
   * took) costs nothing. Counted from the last poll's start, not its answer: a poll the server
   * parked for 1 s (a maximum below the worker's wait: early, yet no hot loop) is followed by
   * the next at once, instead of by a pause in which no poll is parked to take a task.
   */
  #paceEmptyPolls(replies: readonly unknown[], waitMs: number, sentAt: number): void {
    const allEmpty = replies.every(
      (item) => !isProblem(item) && (item as AcquireReply).disposition === 'empty',
    );
    const early = monotonicNow() - sentAt < waitMs / 2 || waitMs === 0;
    if (!allEmpty || !early) {
      this.#earlyEmpties = 0;
      return;
    }
    this.#earlyEmpties += 1;
    if (this.#earlyEmpties < 3) return;
    const delay = backoffDelay(this.#earlyEmpties - 2, EMPTY_POLL_PACING);
    this.#pollNotBefore = Math.max(this.#pollNotBefore, sentAt + delay);
  }

  #applySlot(step: SlotStep, sentAt: number, cause?: unknown): void {
    this.#slots[step.slot.consumerId] = step.slot;
    const effect = step.effect;
    switch (effect.kind) {
      case 'run': {
        const execution = this.#execute(step.slot.consumerId, effect.assignment, sentAt).finally(
          () => {
            this.#executions.delete(execution);
          },
        );
        this.#executions.add(execution);
        break;
      }
      case 'lost':
        this.#logger.info('a replayed poll found its attempt no longer owned', {
          task_id: effect.attempt.task_id,
          attempt_id: effect.attempt.attempt_id,
        });
        break;
      case 'backoff': {
        // Refused as busy, but sent before the confirmation that freed the slot was answered:
        // the refusal is older than the news, and backing off would idle a free slot.
        const stale =
          problemCode(cause) === 'consumer_busy' &&
          sentAt < (this.#slotFreedAt[step.slot.consumerId] ?? 0);
        this.#slotNotBefore[step.slot.consumerId] = stale
          ? 0
          : monotonicNow() + retryDelay(effect.failures, cause, this.#backoff);
        break;
      }
      case 'new_session':
        this.#logger.warn('slot cursor lost; moving to a new session', {
          consumer_id: step.slot.consumerId,
          session_id: effect.staleSessionId,
          ...(cause === undefined ? {} : errorFields(cause)),
        });
        // The first loss moves over at once (a session that expired, during an outage too: its
        // failed polls are not losses). A slot losing session after session without one
        // completed poll (a balancer sending polls to a deployment that never heard of them)
        // backs off: each move opens a session on the server.
        if (effect.losses > 1) {
          this.#slotNotBefore[step.slot.consumerId] =
            monotonicNow() + backoffDelay(effect.losses - 1, this.#backoff);
        }
        this.#retireSession(effect.staleSessionId, problemCode(cause));
        break;
      case 'fatal':
        this.#fail(
          cause instanceof Error && !(cause instanceof ProblemError && cause.retryable)
            ? cause
            : new ProtocolError(effect.message),
        );
        break;
      default:
        break;
    }
  }

  // ---- Execution ------------------------------------------------------------

  async #execute(consumerId: number, assignment: Assignment, sentAt: number): Promise<void> {
    const held = this.#hold(consumerId, assignment, sentAt);
    const owner = held.lease.owner;
    const fields = { task_id: owner.task_id, attempt_id: owner.attempt_id };
    // A handler abandoned while it still runs, that the server no longer holds a slot for.
    let stillRunning: Promise<unknown> | undefined;
    try {
      if (this.#state !== 'running') {
        // Taken while stopping (a poll answered after stop, or a drain
        // replay): hand it back without asking for dispatch, so the attempt
        // does not count against the task's retries.
        await this.#handBack(held);
        return;
      }
      await this.#dispatch(held);
      // An answer held in transit may come after the lease it extended ran out: the expiry
      // timer it re-armed has not fired yet, so the clock is read before the lease is trusted.
      const expired = clockTick(held.lease, monotonicNow());
      if (expired.effect.kind === 'lost') this.#applyLease(held, expired);
      if (!maySettle(held.lease)) {
        this.#logger.warn('lease lost before dispatch', fields);
        return;
      }
      if (held.lease.lost !== null) {
        // Lost locally after the dispatch answer, before user code started: never start it on
        // a lease this worker no longer trusts; hand the attempt back while it may still count.
        this.#logger.warn('lease lost before the handler started', {
          ...fields,
          why: held.lease.lost,
        });
        await this.#settle(
          held,
          failureReport('rejected', 'the lease was lost before the handler started', true),
          'confirmed',
        );
        return;
      }
      const decision = dispatchDecision(held.lease);
      const registration = this.#handlers.get(assignment.descriptor.name);
      if (!held.lease.dispatchAnswered || decision.kind === 'refuse') {
        // Unanswered first: without an answer `dispatchAllowed` is merely unknown, and
        // reporting it as a budget refusal would misstate what the server said.
        const refusal =
          decision.kind === 'refuse' && held.lease.dispatchAnswered
            ? failureReport(decision.failure, decision.message, decision.retryable)
            : failureReport('rejected', 'the dispatch request was not answered', true);
        this.#logger.info('dispatch refused', { ...fields, report: refusal.report });
        await this.#settle(held, refusal, 'confirmed');
        return;
      }
      if (registration === undefined) {
        // Dispatch was asked first so that the attempt counts: a queue fed a
        // program no worker knows fails after max_attempts, not never.
        this.#logger.error('no handler registered for program', {
          ...fields,
          program: assignment.descriptor.name,
        });
        await this.#settle(
          held,
          failureReport(
            'rejected',
            `no handler for program "${assignment.descriptor.name}" is registered on this worker`,
            true,
          ),
          'confirmed',
        );
        return;
      }
      if (this.#graceOver || monotonicNow() >= this.#graceDeadline) {
        // The dispatch answer came after stop()'s grace period: the drain has already aborted
        // what was running, so a handler starting now would run with a signal nothing aborts,
        // on work the drain treats as abandoned. No user code ran yet: hand the task back —
        // an attempt that counts, as the server granted its dispatch (README, Shutdown). The
        // deadline itself is checked too: the drain marks the grace over only once the replays
        // of cut polls are answered, which may be well past it (review r51c).
        this.#logger.info(
          'dispatch answered after the shutdown grace; handing the task back',
          fields,
        );
        await this.#handBack(held);
        return;
      }
      const { outcome, startedAt, finished } = await this.#runHandler(held, registration);
      const report = reportFor(
        {
          taskId: owner.task_id,
          attemptId: owner.attempt_id,
          activationId: assignment.workflow_activation_id,
        },
        outcome,
        { startedAt, finishedAt: Date.now() },
      );
      if (!maySettle(held.lease)) {
        this.#logger.warn('lease lost; the outcome is not reported', fields);
        if (outcome.kind === 'abandoned') stillRunning = finished;
        return;
      }
      if (outcome.kind !== 'abandoned') {
        await this.#settle(held, report, 'confirmed');
        return;
      }
      const settled = await this.#settle(held, report, 'unconfirmed');
      // Reported as `unconfirmed`: the code may still run. Quiescence is confirmed when it ends
      // (if this process is still alive by then), and only once the report is in: a
      // confirmation reaching the server before it is refused for good (409 conflict), and the
      // task would be held to its authority deadline although the handler had ended. A report
      // abandoned at shutdown may have been taken all the same: confirming it costs one request.
      if (settled.kind !== 'rejected') void finished.then(() => this.#confirmQuiescence(held));
      else stillRunning = finished;
    } catch (error) {
      // Defensive: every step above handles its own errors.
      this.#logger.error('task execution failed unexpectedly', {
        ...fields,
        ...errorFields(error),
      });
    } finally {
      this.#drop(held);
      // `concurrency` bounds the handlers running at once, deaf ones included (README). The
      // server holds an `unconfirmed` attempt's slot itself (`consumer_busy`); a lost lease or a
      // refused report leaves it nothing to hold, and the slot's next poll could take the retry
      // of this very task beside its deaf handler: the slot stays taken until the handler ends.
      const release = () => {
        const slot = this.#slots[consumerId];
        if (slot !== undefined) this.#slots[consumerId] = released(slot);
        this.#notifier.notify();
      };
      if (stillRunning === undefined) release();
      else {
        this.#logger.warn(
          'the abandoned handler still runs; its slot waits for it to return',
          fields,
        );
        void stillRunning.then(release, release);
      }
    }
  }

  /** Hands an assignment back at shutdown, before any user code ran: retryable, quiescent. */
  #handBack(held: Held): Promise<SettleResult> {
    return this.#settle(
      held,
      failureReport('rejected', 'the worker is shutting down', true),
      'confirmed',
    );
  }

  #hold(consumerId: number, assignment: Assignment, sentAt: number): Held {
    const forced = deferred<'timeout' | 'shutdown'>();
    const held: Held = {
      consumerId,
      assignment,
      lease: initialLease(assignment, sentAt),
      inFlight: null,
      renewFailures: 0,
      abort: new AbortController(),
      abortCause: null,
      handlerRunning: false,
      settling: false,
      dispatchRequested: false,
      dispatchWaiters: [],
      heartbeatWaiters: [],
      forceReport: forced.resolve,
      forced: forced.promise,
      retryTimer: undefined,
      expiryTimer: undefined,
      dueTimer: undefined,
      resendTimer: undefined,
      budgetTimer: undefined,
    };
    this.#held.set(assignment.authority.owner.attempt_id, held);
    this.#armExpiry(held);
    return held;
  }

  #drop(held: Held): void {
    clearTimeout(held.retryTimer);
    clearTimeout(held.expiryTimer);
    clearTimeout(held.dueTimer);
    clearTimeout(held.resendTimer);
    clearTimeout(held.budgetTimer);
    this.#held.delete(held.lease.owner.attempt_id);
    this.#flushWaiters(held);
  }

  /** Asks for dispatch (renew sequence 1, intent `dispatch`) and waits for its answer or loss. */
  async #dispatch(held: Held): Promise<void> {
    held.dispatchRequested = true;
    if (held.lease.dispatchAnswered) return;
    const answered = new Promise<void>((resolve) => held.dispatchWaiters.push(resolve));
    this.#renewSoon(held);
    await answered;
  }

  async #runHandler(
    held: Held,
    registration: Registration,
  ): Promise<{ outcome: HandlerOutcome; startedAt: number; finished: Promise<unknown> }> {
    const assignment = held.assignment;
    const startedAt = Date.now();
    held.budgetTimer = setTimeout(
      () => this.#abortHeld(held, 'timeout'),
      timerDelay(held.lease.executionEndsAtLocal - monotonicNow()),
    );
    const ctx = this.#context(held);
    held.handlerRunning = true;
    const running = (async () => {
      let data: unknown = assignment.event.data;
      if (registration.schema !== undefined) data = await validateData(registration.schema, data);
      return registration.handler(data, ctx);
    })();
    const finished: Promise<HandlerOutcome> = running.then(
      (value): HandlerOutcome => ({ kind: 'returned', value }),
      (error: unknown): HandlerOutcome => ({
        kind: 'threw',
        error,
        aborted: held.abortCause,
        ownAbort: held.abort.signal.aborted && error === held.abort.signal.reason,
      }),
    );
    const outcome = await Promise.race([
      finished,
      held.forced.then(
        (why): HandlerOutcome => ({
          kind: 'abandoned',
          // Past its budget: timed out, or cancelled when a cancel came first (and went
          // unheeded). At shutdown: the shutdown, unless its budget had already run out.
          aborted:
            why === 'timeout'
              ? held.abortCause === 'cancelled'
                ? 'cancelled'
                : 'timeout'
              : held.abortCause === 'timeout'
                ? 'timeout'
                : 'shutdown',
        }),
      ),
    ]);
    held.handlerRunning = false;
    clearTimeout(held.budgetTimer);
    return { outcome, startedAt, finished };
  }

  /**
   * Tells the server an abandoned handler has ended, retrying what may succeed later (a
   * transport failure, `unavailable`): until it is told, the server holds the task until its
   * authority deadline (DESIGN §5), hours for a long timeout. Sent only once the `unconfirmed`
   * report is in (see `#execute`). Runs on after `stop()`, like the handler it reports on; the
   * drain waits for one under way before it closes the connections (`#drain`). An answer that
   * cannot change (`ownership_lost`: the deadline passed) ends it.
   */
  #confirmQuiescence(held: Held): Promise<void> {
    const confirming = this.#confirmUntilAnswered(held).finally(() => {
      this.#confirmations.delete(confirming);
      this.#slotFreed(held.consumerId);
    });
    this.#confirmations.add(confirming);
    return confirming;
  }

  /**
   * The server no longer holds the slot's attempt (its confirmation was answered: taken, or past
   * the authority deadline, when recovery releases it): the slot polls now. Its polls were
   * refused as `consumer_busy` meanwhile and backed off, up to the backoff's maximum (5 s by
   * default), which a free slot must not wait out.
   */
  #slotFreed(consumerId: number): void {
    this.#slotFreedAt[consumerId] = monotonicNow();
    this.#slotNotBefore[consumerId] = 0;
    this.#notifier.notify();
  }

  async #confirmUntilAnswered(held: Held): Promise<void> {
    for (let failures = 1; ; failures += 1) {
      try {
        await this.#api.confirmQuiescence(held.lease.owner);
        this.#loopSucceeded('confirming quiescence');
        return;
      } catch (error) {
        const fields = { attempt_id: held.lease.owner.attempt_id, ...errorFields(error) };
        if (!isRetryable(error)) {
          this.#logger.warn('confirming quiescence failed', fields);
          return;
        }
        this.#loopFailed('confirming quiescence', fields);
        // Unreferenced: a stopped worker's process may exit meanwhile; the server then releases
        // the task at its authority deadline, as if the process had died.
        const delay = retryDelay(failures, error, this.#backoff);
        await new Promise((resolve) => setTimeout(resolve, delay).unref());
      }
    }
  }

  #loopFailed(loop: RetryingLoop, fields: LogFields): void {
    logRetriedFailure(this.#logger, this.#failureRuns[loop], `${loop} failed; retrying`, fields);
  }

  #loopSucceeded(loop: RetryingLoop): void {
    logRecovered(this.#logger, this.#failureRuns[loop], `${loop} works again`);
  }

  #context(held: Held): TaskContext {
    const event = held.assignment.event;
    return Object.freeze({
      taskId: event.ldgtaskid,
      runId: event.ldgrunid,
      attemptId: event.ldgattemptid,
      attempt: event.ldgattempt,
      program: held.assignment.descriptor,
      queue: event.ldgqueue,
      deadline: held.assignment.attempt_deadline,
      signal: held.abort.signal,
      event,
      logger: this.#logger,
      heartbeat: () =>
        new Promise<void>((resolve) => {
          if (held.lease.lost !== null || !this.#held.has(held.lease.owner.attempt_id)) {
            resolve();
            return;
          }
          held.heartbeatWaiters.push(resolve);
          this.#renewSoon(held);
        }),
    });
  }

  #abortHeld(held: Held, cause: AbortCause): void {
    if (cause === 'timeout') this.#boundByBudget(held);
    if (held.abort.signal.aborted) return;
    held.abortCause = cause;
    this.#logger.info('aborting task', {
      task_id: held.lease.owner.task_id,
      attempt_id: held.lease.owner.attempt_id,
      cause,
    });
    held.abort.abort(new TaskAbortedError(cause));
  }

  /**
   * A handler that ignores the end of its budget is reported as timed out once the abort
   * grace is over (`unconfirmed`: it may still run; quiescence is confirmed when it
   * returns). Unreported, its attempt would sit until the authority deadline and end as
   * `lease_expired`, as if the worker had died, and its late settlement would be refused.
   * Armed whatever aborted the signal first: a handler deaf to a cancel (or to a lease lost
   * locally) is past its budget all the same, and unreported it would hold its slot for as
   * long as it runs, for ever if it never returns. A cancel alone arms nothing: the handler
   * still runs, and reporting it would not free its slot anyway (the server holds an
   * `unconfirmed` attempt's slot until confirmation or the authority deadline, DESIGN §5), so
   * the slot stays what bounds the running handlers to `concurrency` until its budget ends.
   */
  #boundByBudget(held: Held): void {
    const grace = setTimeout(() => {
      if (held.handlerRunning) held.forceReport('timeout');
    }, timerDelay(this.#abortGraceMs));
    grace.unref();
  }

  async #settle(
    held: Held,
    report: Parameters<typeof settleCommandFor>[1],
    quiescence: Quiescence,
  ): Promise<SettleResult> {
    const command = settleCommandFor(held.lease.owner, report, quiescence);
    held.settling = true;
    const result = await this.#settler.settle(command);
    const fields = {
      task_id: command.owner.task_id,
      attempt_id: command.owner.attempt_id,
      report: command.report.kind,
    };
    if (result.kind === 'accepted') {
      this.#logger.debug('settled', {
        ...fields,
        task_state: result.reply.task_state,
        already_accepted: result.reply.already_accepted,
      });
      this.#logFailure(command.report, { ...fields, task_state: result.reply.task_state });
    } else if (result.kind === 'abandoned') {
      this.#logger.warn('settlement abandoned at shutdown; lease expiry will recover it', fields);
    }
    return result;
  }

  /**
   * A handler's failure as the worker's operator needs to see it: its crash or timeout at
   * `warn` (at `debug`, the only line it had, a throwing handler — or one whose output cannot be
   * sent — was invisible with the default logger), an `ApplicationError` it chose at `info`.
   * Refusals and hand-backs are logged where they are decided.
   */
  #logFailure(report: SettleCommand['report'], fields: LogFields): void {
    if (report.kind === 'failed') {
      const failure = report.report;
      if (failure.kind !== 'crashed' && failure.kind !== 'timed_out') return;
      this.#logger.warn(
        failure.kind === 'crashed' ? 'task handler failed' : 'task handler timed out',
        { ...fields, message: failure.message, retryable: failure.retryable },
      );
    } else if (report.report.outcome.kind === 'application_error') {
      const { code, message, retryable } = report.report.outcome.error;
      this.#logger.info('task handler returned an application error', {
        ...fields,
        code,
        message,
        retryable,
      });
    }
  }

  // ---- Renewal --------------------------------------------------------------

  /**
   * Renews a lease at the end of this turn of the event loop, together with
   * every other lease asking in the same turn (assignments from one poll ask
   * for dispatch together: one request, not one each).
   */
  #renewSoon(held: Held): void {
    this.#renewThisTurn(held);
  }

  /** Renews the given leases in one batch (skipping those with a renewal in flight). */
  #renew(helds: Held[]): void {
    const sending: Held[] = [];
    const commands = [];
    for (const held of helds) {
      // A held assignment renews only once it asked for dispatch: one taken
      // while stopping is handed back without a dispatch renew ever being
      // sent, so it does not count against the task's retries.
      if (!held.dispatchRequested || held.inFlight !== null) continue;
      if (!this.#held.has(held.lease.owner.attempt_id)) continue;
      const next = nextRenew(held.lease, held.lease.dispatchAnswered ? 'keep_alive' : 'dispatch');
      if (next === null) continue;
      held.lease = next.lease;
      held.inFlight = next.command.sequence;
      clearTimeout(held.retryTimer);
      this.#armResend(held);
      sending.push(held);
      commands.push(next.command);
    }
    for (let start = 0; start < commands.length; start += MAX_WORKER_BATCH) {
      const group = sending.slice(start, start + MAX_WORKER_BATCH);
      this.#sendRenewals(group, commands.slice(start, start + MAX_WORKER_BATCH)).catch(
        (error: unknown) => this.#logger.error('renewal bookkeeping failed', errorFields(error)),
      );
    }
  }

  /**
   * A renewal's reply can be lost without its request failing before the request timeout,
   * which may be longer than the lease has left (a server of short leases): waiting for it
   * would lose a lease that the server extended. Halfway through the time the lease has left,
   * an unanswered renewal is sent again, verbatim — the server replays it, so it never extends
   * twice (DESIGN §5 Renew) — and whichever reply comes first is taken.
   */
  #armResend(held: Held): void {
    clearTimeout(held.resendTimer);
    const delay = renewResendDelay(
      held.lease,
      monotonicNow(),
      this.#renewIntervalMs,
      MIN_RESEND_DELAY_MS,
    );
    // The request's own timeout comes first: its failure path retries (renewRetryDelay).
    if (delay >= this.#http.requestTimeoutMs) return;
    held.resendTimer = setTimeout(() => {
      // Leases due together (one batch renewed them) are sent again together.
      this.#resendThisTurn(held);
    }, timerDelay(delay));
  }

  /** Sends again, in batches, the renewals of `helds` still unanswered. */
  #resend(helds: Held[]): void {
    const sending: Held[] = [];
    const commands = [];
    for (const held of helds) {
      const pending = held.lease.pending;
      if (pending === null || held.inFlight !== pending.sequence) continue;
      if (!this.#held.has(held.lease.owner.attempt_id)) continue;
      const again = nextRenew(held.lease, pending.intent);
      if (again === null) continue;
      held.lease = again.lease;
      this.#armResend(held);
      sending.push(held);
      commands.push(again.command);
    }
    for (let start = 0; start < commands.length; start += MAX_WORKER_BATCH) {
      this.#sendRenewals(
        sending.slice(start, start + MAX_WORKER_BATCH),
        commands.slice(start, start + MAX_WORKER_BATCH),
      ).catch((error: unknown) =>
        this.#logger.error('renewal bookkeeping failed', errorFields(error)),
      );
    }
  }

  async #sendRenewals(
    helds: Held[],
    commands: Parameters<WorkerApi['renewBatch']>[0],
  ): Promise<void> {
    const sentAt = monotonicNow();
    let results: unknown[] | undefined;
    let failure: unknown;
    try {
      results = await this.#api.renewBatch(commands);
      this.#loopSucceeded('renewal');
    } catch (error) {
      failure = error;
      this.#loopFailed('renewal', { leases: helds.length, ...errorFields(error) });
    }
    helds.forEach((held, index) => {
      if (held.inFlight === commands[index]?.sequence) {
        held.inFlight = null;
        clearTimeout(held.resendTimer);
      }
      if (!this.#held.has(held.lease.owner.attempt_id)) return;
      // A copy of a renewal another copy's reply already acknowledged (see `#armResend`): only
      // its authority is news. Its failure says nothing — it may even have reached the server
      // after a later renewal and been refused as `sequence_conflict` — unless the lease is gone.
      const stale = (commands[index]?.sequence ?? 0) <= held.lease.acknowledged;
      let step: LeaseStep;
      if (results === undefined) {
        if (stale) return;
        // A whole-request failure leaves every renewal pending: it is re-sent
        // verbatim, and the local expiry decides if the lease is lost.
        step = { lease: held.lease, effect: { kind: 'retry' } };
      } else {
        const item = results[index];
        if (isProblem(item)) {
          const error = new ProblemError(item);
          if (stale && error.code !== 'ownership_lost' && error.code !== 'not_found') return;
          this.#applyLease(held, renewFailed(held.lease, error), error);
          return;
        }
        step = renewReplied(held.lease, item as Parameters<typeof renewReplied>[1], sentAt);
      }
      this.#applyLease(held, step, failure);
    });
  }

  #applyLease(held: Held, step: LeaseStep, cause?: unknown): void {
    held.lease = step.lease;
    const effect = step.effect;
    if (effect.kind === 'retry') {
      held.renewFailures += 1;
      // A `Retry-After` lengthens the backoff, and `renewRetryDelay` then cuts the whole wait to
      // the lease's due time (half what it has left): honouring a rate limiter must not lose a
      // lease the server would still extend. The periodic heartbeat and the due timer may also
      // renew sooner; they keep the lease, which outweighs the limiter's ask.
      const delay = renewRetryDelay(
        retryDelay(held.renewFailures, cause, this.#backoff),
        this.#renewIntervalMs,
        held.lease,
        monotonicNow(),
      );
      clearTimeout(held.retryTimer);
      held.retryTimer = setTimeout(() => this.#renew([held]), timerDelay(delay));
      // Heartbeat waiters stay: `heartbeat()` resolves once a renewal was answered or the
      // lease is gone (its local expiry ends a failing run of renewals), never on a failure.
      return;
    }
    if (effect.kind === 'lost') {
      // Once the settlement is sent, a lost lease is expected: an accepted
      // settlement (whose reply may not have arrived yet) ends the lease.
      const log = held.settling ? this.#logger.debug : this.#logger.warn;
      log(held.settling ? 'lease ended while settling' : 'lease lost', {
        task_id: held.lease.owner.task_id,
        attempt_id: held.lease.owner.attempt_id,
        why: effect.why,
        ...(cause === undefined ? {} : errorFields(cause)),
      });
      this.#abortHeld(held, 'lease_lost');
      this.#flushWaiters(held);
      return;
    }
    held.renewFailures = 0;
    if (effect.kind === 'cancel') this.#abortHeld(held, 'cancelled');
    if (held.lease.lost !== null) {
      // A reply that came after the lease was given up (a late renewal): nothing is renewed or
      // expires any more. Re-arming the expiry would fire at once, and again, every millisecond.
      this.#flushWaiters(held);
      return;
    }
    this.#armExpiry(held);
    if (held.lease.dispatchAnswered) this.#flushWaiters(held);
  }

  #armExpiry(held: Held): void {
    const now = monotonicNow();
    clearTimeout(held.expiryTimer);
    held.expiryTimer = setTimeout(
      () => {
        // Past the local expiry with the dispatch renew unanswered the lease is still held
        // (lease.ts): re-arming here would fire again at once, and again, each time asking
        // for a renewal due now. The dispatch answer, or its retry, re-arms the timers.
        if (awaitingDispatch(held.lease)) return;
        this.#applyLease(held, clockTick(held.lease, monotonicNow()));
      },
      timerDelay(Math.max(0, held.lease.expiresAtLocal - now) + 1),
    );
    // The periodic heartbeat renews first whenever its period is shorter than
    // half the lease (the usual case, and this timer is then re-armed before it
    // fires); a server granting shorter leases than the period still gets
    // every lease renewed in time.
    clearTimeout(held.dueTimer);
    held.dueTimer = setTimeout(
      () => this.#renewSoon(held),
      timerDelay(renewDueIn(held.lease, now)),
    );
  }

  #flushWaiters(held: Held): void {
    const waiters = [...held.dispatchWaiters, ...held.heartbeatWaiters];
    held.dispatchWaiters = [];
    held.heartbeatWaiters = [];
    for (const waiter of waiters) waiter();
  }

  // ---- Shutdown -------------------------------------------------------------

  #fail(error: unknown): void {
    if (this.#fatal === undefined) {
      this.#fatal = error;
      this.#logger.error('worker stopping after an unrecoverable error', errorFields(error));
    }
    void this.stop();
  }

  async #drain(loop: Promise<void>): Promise<void> {
    await loop;
    await Promise.allSettled([...this.#polls]);
    // Polls cut short may have claimed a task whose reply never came: replay
    // each once without waiting, and hand back what it held. The replies are
    // waited for even past the grace (a hand-back runs no user code): a replay
    // given up on (its socket destroyed below) would leave its task leased until
    // its lease expires instead of claimable now. Past the grace, for at most a
    // control request's timeout: a server that does not answer cannot hold a
    // stop({ graceMs: 0 }) for a long requestTimeoutMs.
    const replays = this.#startPolls(null);
    if (replays.length > 0) {
      this.#sendPolls(replays, 0);
      const replied = Promise.allSettled([...this.#polls]);
      await within(replied, Math.min(this.#http.requestTimeoutMs, CONTROL_REQUEST_TIMEOUT_MS));
      await this.#withinGrace(replied);
    }
    await this.#withinGrace(Promise.allSettled([...this.#executions]));
    if (this.#executions.size > 0) {
      this.#graceOver = true;
      this.#logger.info('shutdown grace period over; aborting running handlers', {
        in_flight: this.#held.size,
      });
      for (const held of this.#held.values()) {
        if (held.handlerRunning) this.#abortHeld(held, 'shutdown');
      }
      await within(Promise.allSettled([...this.#executions]), this.#abortGraceMs);
      for (const held of this.#held.values()) held.forceReport('shutdown');
      await within(Promise.allSettled([...this.#executions]), this.#http.requestTimeoutMs);
      this.#settler.abandon();
      // Everything left is now settling to `abandoned` or finishing a renewal.
      await within(Promise.allSettled([...this.#executions]), this.#http.requestTimeoutMs);
    }
    this.#settler.abandon();
    clearInterval(this.#renewTimer);
    clearTimeout(this.#extendTimer);
    this.#stoppedAbort.abort(new TaskAbortedError('shutdown'));
    for (const held of this.#held.values()) this.#drop(held);
    // closeIdle destroys requests in flight: a quiescence confirmation on the wire would be cut
    // and left to a retry on an unreferenced timer, lost when the process then exits (the task
    // held to its authority deadline although its handler had ended). Like the hand-backs, it
    // runs no user code: it is waited for, within a control request's timeout, also past the
    // grace (those begun meanwhile too: a handler may end while another is answered).
    const confirmEnd =
      monotonicNow() + Math.min(this.#http.requestTimeoutMs, CONTROL_REQUEST_TIMEOUT_MS);
    while (this.#confirmations.size > 0 && monotonicNow() < confirmEnd) {
      await within(Promise.allSettled([...this.#confirmations]), confirmEnd - monotonicNow());
    }
    this.#http.closeIdle();
    this.#state = 'stopped';
    this.#logger.info('worker stopped', {});
    this.#stopped.resolve();
  }
}

/** The shortest delay before an unanswered renewal is sent again: no resend storm near expiry. */
const MIN_RESEND_DELAY_MS = 50;

/** The pacing of polls that find nothing at once (see `Worker.#paceEmptyPolls`). */
const EMPTY_POLL_PACING = { baseMs: 100, maxMs: 1_000 };

/** An issue message's share of the `invalid_data` details (at most 20 issues are sent). */
const ISSUE_MESSAGE_MAX_BYTES = 500;
/**
 * An issue path's share: a path names keys of the data, which may be long, and 20 issues under
 * one long key must not make details larger than the server takes (the report would then be a
 * crash, not `invalid_data`).
 */
const ISSUE_PATH_MAX_BYTES = 500;

/** Whether `schema` has the Standard Schema v1 interface (arktype's schemas are functions). */
function isStandardSchema(schema: unknown): boolean {
  if ((typeof schema !== 'object' && typeof schema !== 'function') || schema === null) return false;
  const props: unknown = (schema as { '~standard'?: unknown })['~standard'];
  return (
    typeof props === 'object' &&
    props !== null &&
    typeof (props as { validate?: unknown }).validate === 'function'
  );
}

/** Validates task data with a Standard Schema; invalid data is an `invalid_data` application error. */
async function validateData(schema: StandardSchemaV1, data: unknown): Promise<unknown> {
  const result = await schema['~standard'].validate(data);
  if (result.issues === undefined) return result.value;
  const issues = result.issues.slice(0, 20).map((issue) => ({
    path: fitText(issuePath(issue), ISSUE_PATH_MAX_BYTES),
    message: fitText(String(issue.message), ISSUE_MESSAGE_MAX_BYTES),
  }));
  const first = issues[0];
  throw new ApplicationError(
    'invalid_data',
    first === undefined
      ? 'the task data is invalid'
      : `the task data is invalid: ${first.path} ${first.message}`,
    { retryable: false, details: { issues } },
  );
}
