/**
 * The client: submit tasks, read their status and results, list, cancel and
 * read history, and manage completion subscriptions. Every request is
 * replay-safe (submissions carry an idempotency key generated once per call),
 * so transport failures are retried with jittered backoff; every reply is
 * parsed strictly against its contract schema.
 */
import { randomUUID } from 'node:crypto';
import {
  type AttemptSnapshot,
  AttemptSnapshotSchema,
  type CompletionSubscription,
  type CompletionSubscriptionList,
  CompletionSubscriptionListSchema,
  CompletionSubscriptionSchema,
  ContractError,
  failureRun,
  HISTORY_PAGE_LIMIT,
  MAX_SUBMIT_BATCH,
  type Problem,
  type ProgramDescriptor,
  parseWith,
  type RecordedHistoryEvent,
  SCOPE_TEXT_MAX_BYTES,
  SubmitBatchReplySchema,
  type SubmitCommand,
  type SubmitTask,
  type TaskFilters,
  TaskFiltersSchema,
  TaskHistorySchema,
  type TaskPage,
  TaskPageSchema,
  type TaskResult,
  TaskResultSchema,
  type TaskSnapshot,
  TaskSnapshotSchema,
  type TaskState,
  TaskStateReplySchema,
  type TaskStatus,
  TaskStatusSchema,
  type TraceContext,
  validateSubmitCommand,
} from '@ledgence/contracts';
import { REPLY_LIMITS } from './api.js';
import { type BackoffPolicy, backoffDelay, checkedBackoff, retryDelay } from './backoff.js';
import { isRetryable, localProblem, ProblemError, ProtocolError } from './errors.js';
import {
  type HttpOptions,
  HttpTransport,
  isProblem,
  pathSegment,
  type ReplyOf,
  type ReplySchema,
  type RequestSpec,
  refuseIllFormedQuery,
  requiredText,
  waitQuery,
  wireWaitMs,
} from './http.js';
import {
  consoleLogger,
  errorFields,
  type Logger,
  logRecovered,
  logRetriedFailure,
  safeLogger,
} from './logger.js';
import { timerDelay } from './timers.js';

/** Options of a {@link Client}. */
export interface ClientOptions extends HttpOptions {
  /** The tenant every call is scoped to. */
  tenant: string;
  /** The namespace every call is scoped to. */
  namespace: string;
  /** Where the SDK logs; warnings and errors to the console by default. */
  logger?: Logger | undefined;
  /** Retries of a request after a transport failure or `unavailable`: an integer ≥ 0 (default 3). */
  retries?: number | undefined;
  /**
   * Backoff between retries: `baseMs` > 0, `maxMs` ≥ `baseMs`; DEFAULT_BACKOFF (100 ms to 5 s) by
   * default. A failed reply's `Retry-After` lengthens the wait before the next retry, up to `maxMs`.
   */
  backoff?: BackoffPolicy | undefined;
}

/**
 * A task to submit: the `SubmitTask` fields without the scope (the client's),
 * with `program` as a name or `{name, version}` and `data` defaulting to
 * `null`.
 */
export type SubmitInput = Omit<SubmitTask, 'tenant_id' | 'namespace' | 'program' | 'data'> & {
  /** The handler to run: a name, or `{name, version}`. */
  program: string | ProgramDescriptor;
  /** The task's input, any JSON; `null` when absent. */
  data?: unknown;
};

/** Options of {@link Client.submit}. */
export interface SubmitOptions {
  /** Makes the submission insert-or-return; a random UUID when absent (so retries stay safe). */
  idempotencyKey?: string | undefined;
  /** The W3C trace context the task was submitted from. */
  originTrace?: TraceContext | undefined;
  /** Aborts the request. */
  signal?: AbortSignal | undefined;
}

/** One entry of {@link Client.submitBatch}. */
export type SubmitBatchEntry = SubmitInput & {
  /** This entry's key; a random UUID when absent, as with {@link SubmitOptions}. */
  idempotencyKey?: string | undefined;
  /** The W3C trace context this task was submitted from. */
  originTrace?: TraceContext | undefined;
};

/** Listing filters, in the client's spelling; see `TaskFilters`. */
export interface ListOptions extends Omit<TaskFilters, 'labels'> {
  /** Exact label matches, combined with AND. */
  labels?: Record<string, string> | undefined;
  /** Page size (1..500). */
  limit?: number | undefined;
  /** Start after this cursor (from a previous page). */
  cursor?: string | undefined;
  /** Aborts the iteration's requests. */
  signal?: AbortSignal | undefined;
}

/** A signal-only option bag. */
export interface CallOptions {
  /** Aborts the request. */
  signal?: AbortSignal | undefined;
}

/** Options of {@link Client.result}. */
export interface ResultOptions extends CallOptions {
  /**
   * Wait up to this long for a terminal state: a number ≥ 0, rounded up to whole milliseconds;
   * the server clamps it to its long-poll maximum (`Infinity` asks for that maximum). The wait
   * counts from the call: a read sent again after a lost reply asks only for what is left of it.
   */
  waitMs?: number | undefined;
}

/** Options of {@link Client.history}. */
export interface HistoryOptions extends CallOptions {
  /** Start after this history sequence (0: from the beginning). */
  afterSequence?: number | undefined;
}

/** Options of {@link Client.subscribe}. */
export interface SubscribeOptions extends CallOptions {
  /** The operator-configured destination alias. */
  destination: string;
  /** Makes subscribing idempotent; a random UUID when absent. */
  subscriptionKey?: string | undefined;
}

/**
 * A client of one tenant and namespace.
 *
 * @example
 * const client = new Client({ url: 'http://127.0.0.1:8080', tenant: 'acme', namespace: 'prod' });
 * const task = await client.submit({ queue: 'email', program: 'send-email', data: { to } });
 * const result = await client.result(task.task_id, { waitMs: 20_000 });
 */
export class Client {
  readonly #http: HttpTransport;
  readonly #tenant: string;
  readonly #namespace: string;
  readonly #scopePath: string;
  readonly #logger: Logger;
  /**
   * The run of retried failures across this client's calls: through an outage every call of a
   * busy producer fails, and a warning per retry was ~150 lines for a 5 s server restart. The
   * run's first is a warning, then one a minute (debug else), and the first success says so.
   */
  readonly #failures = failureRun();
  /**
   * The run of batch items answered `unavailable` and sent again: apart from the requests' own,
   * whose run a reply carrying such items ends (review r48a: a warning per retry before).
   */
  readonly #itemFailures = failureRun();
  readonly #retries: number;
  readonly #backoff: BackoffPolicy;

  constructor(options: ClientOptions) {
    for (const key of ['tenant', 'namespace'] as const) {
      requiredText(options, key, SCOPE_TEXT_MAX_BYTES);
    }
    this.#http = new HttpTransport(options);
    this.#tenant = options.tenant;
    this.#namespace = options.namespace;
    this.#scopePath = `/v1/tenants/${pathSegment(options.tenant)}/namespaces/${pathSegment(options.namespace)}`;
    this.#logger = safeLogger(options.logger ?? consoleLogger);
    const retries = options.retries ?? 3;
    // NaN or Infinity would retry forever: `failures >= NaN` is never true.
    if (!Number.isSafeInteger(retries) || retries < 0) {
      throw new TypeError('retries must be an integer ≥ 0');
    }
    this.#retries = retries;
    this.#backoff = checkedBackoff(options.backoff);
  }

  /**
   * Submits one task; returns its snapshot (the existing task when the
   * idempotency key was used before with the same command). The command is
   * validated locally first, with the server's rules: a command they refuse rejects with the
   * {@link ProblemError} the server would answer, as the server's own refusals and
   * {@link Client.submitBatch}'s slots do, and is not sent.
   */
  async submit(input: SubmitInput, options: SubmitOptions = {}): Promise<TaskSnapshot> {
    let command: SubmitCommand;
    try {
      command = this.#submitCommand(input, options.idempotencyKey, options.originTrace);
    } catch (error) {
      throw error instanceof ContractError ? localProblem(error) : error;
    }
    return this.#call({
      method: 'POST',
      path: `${this.#scopePath}/tasks`,
      body: command,
      schema: TaskSnapshotSchema,
      maxBytes: REPLY_LIMITS.single,
      okStatus: [200, 201],
      signal: options.signal,
    });
  }

  /**
   * Submits up to 1 000 tasks in one request; each is answered on its own, in
   * order: its snapshot, or a {@link ProblemError} for that item alone. An
   * entry the local validation refuses is answered with the problem the
   * server would give it (path `$.commands[i]…`, `i` its index in `entries`)
   * and is not sent; its neighbours are. If none is valid, nothing is sent. Items answered
   * `unavailable` (their commit outcome unknown) are sent again with their keys, `retries` times
   * with backoff, like a failed request; what is still unavailable then is answered as such.
   */
  async submitBatch(
    entries: SubmitBatchEntry[],
    options: CallOptions = {},
  ): Promise<(TaskSnapshot | ProblemError)[]> {
    if (entries.length < 1 || entries.length > MAX_SUBMIT_BATCH) {
      throw new TypeError(`a batch holds 1 to ${MAX_SUBMIT_BATCH} tasks`);
    }
    const answers: (TaskSnapshot | ProblemError)[] = new Array(entries.length);
    const commands: SubmitCommand[] = [];
    /** The index in `entries` of each command sent. */
    const sent: number[] = [];
    for (const [index, { idempotencyKey, originTrace, ...task }] of entries.entries()) {
      try {
        commands.push(
          this.#submitCommand(task, idempotencyKey, originTrace, `$.commands[${index}]`),
        );
        sent.push(index);
      } catch (error) {
        if (!(error instanceof ContractError)) throw error;
        answers[index] = localProblem(error);
      }
    }
    if (commands.length === 0) return answers;
    // Positions in `commands` still to send. An item answered `unavailable` (the server could
    // not tell whether its commit happened) is sent again with its key, like a whole request
    // that failed: the caller never saw a generated key, so only this call can retry it safely.
    let pending = commands.map((_, k) => k);
    // Each command encoded once, so the items sent again carry the bytes of their first send
    // (see `#call`); an array's JSON is its elements' joined by commas.
    const texts = commands.map((command) => JSON.stringify(command));
    for (let failures = 0; ; failures++) {
      const sending = pending;
      const request = this.#call({
        method: 'POST',
        path: `${this.#scopePath}/tasks:batch`,
        bodyText: `{"commands":[${sending.map((k) => texts[k]).join(',')}]}`,
        schema: SubmitBatchReplySchema,
        maxBytes: REPLY_LIMITS.batch,
        signal: options.signal,
      }).then((reply) => {
        // An answer per command, or the reply breaks the contract (a retry's too: review r54b).
        if (reply.results.length !== sending.length) {
          throw new ProtocolError(
            `tasks:batch answered ${reply.results.length} items for ${sending.length} commands`,
          );
        }
        return reply;
      });
      // Once a reply came, a failed or aborted retry of its unavailable items still returns
      // what that reply said: the tasks it created are not hidden behind the retry's error.
      const reply =
        failures === 0
          ? await request
          : await request.catch((error: unknown) => {
              this.#logger.warn('retrying unavailable batch items failed', errorFields(error));
              return undefined;
            });
      if (reply === undefined) return answers;
      const again: number[] = [];
      for (const [at, item] of reply.results.entries()) {
        const k = pending[at] as number;
        const index = sent[k] as number;
        if (isProblem(item)) {
          const error = new ProblemError(renumbered(item, at, index));
          answers[index] = error;
          if (error.retryable) again.push(k);
        } else {
          answers[index] = item as TaskSnapshot;
        }
      }
      if (again.length === 0)
        logRecovered(this.#logger, this.#itemFailures, 'batch items work again');
      if (again.length === 0 || failures >= this.#retries || options.signal?.aborted) {
        return answers;
      }
      const delay = backoffDelay(failures + 1, this.#backoff);
      logRetriedFailure(
        this.#logger,
        this.#itemFailures,
        'batch items unavailable; retrying them',
        {
          path: `${this.#scopePath}/tasks:batch`,
          items: again.length,
          delay_ms: delay,
        },
      );
      const slept = await sleep(delay, options.signal).then(
        () => true,
        () => false,
      );
      if (!slept) return answers;
      pending = again;
    }
  }

  /** The task's status (no application data). */
  async status(taskId: string, options: CallOptions = {}): Promise<TaskStatus> {
    return this.#call({
      method: 'GET',
      path: `${this.#scopePath}/tasks/${pathSegment(taskId)}`,
      schema: TaskStatusSchema,
      maxBytes: REPLY_LIMITS.control,
      signal: options.signal,
    });
  }

  /**
   * The task's result: its status and terminal outcome, or `{state:
   * 'pending'}`. With `waitMs`, the server holds the request until the task
   * is terminal or the wait ends — or ends it early, `pending`, at its
   * long-poll maximum or when it stops (README: to wait longer, loop).
   */
  async result(taskId: string, options: ResultOptions = {}): Promise<TaskResult> {
    const waitMs = options.waitMs === undefined ? undefined : wireWaitMs('waitMs', options.waitMs);
    // The wait bounds the whole call: a read sent again after a lost reply (a retry, or a resend
    // on a fresh connection) asks only for what is left of it, so a flaky network never
    // stretches the call to several full waits.
    const started = performance.now();
    const left = (): number | undefined =>
      waitMs === undefined
        ? undefined
        : Math.max(0, Math.ceil(waitMs - (performance.now() - started)));
    return this.#call({
      method: 'GET',
      path: `${this.#scopePath}/tasks/${pathSegment(taskId)}/result`,
      query: () => ({ wait_ms: waitQuery(left()) }),
      schema: TaskResultSchema,
      maxBytes: REPLY_LIMITS.single,
      extraTimeoutMs: waitMs ?? 0,
      signal: options.signal,
    });
  }

  /** The task's full snapshot (inspection: includes its input). */
  async snapshot(taskId: string, options: CallOptions = {}): Promise<TaskSnapshot> {
    return this.#call({
      method: 'GET',
      path: `${this.#scopePath}/tasks/${pathSegment(taskId)}/snapshot`,
      schema: TaskSnapshotSchema,
      maxBytes: REPLY_LIMITS.single,
      signal: options.signal,
    });
  }

  /** One attempt of a task as recorded. */
  async attempt(
    taskId: string,
    attemptId: string,
    options: CallOptions = {},
  ): Promise<AttemptSnapshot> {
    return this.#call({
      method: 'GET',
      path: `${this.#scopePath}/tasks/${pathSegment(taskId)}/attempts/${pathSegment(attemptId)}`,
      schema: AttemptSnapshotSchema,
      maxBytes: REPLY_LIMITS.single,
      signal: options.signal,
    });
  }

  /**
   * Lists tasks matching the filters, newest first, one page per iteration,
   * following `next_cursor` until the last page.
   *
   * @example
   * for await (const page of client.list({ state: 'failed', queue: 'email' })) {
   *   for (const task of page.tasks) console.log(task.task_id);
   * }
   */
  async *list(options: ListOptions = {}): AsyncGenerator<TaskPage, void, undefined> {
    const { labels, limit, signal, cursor: start, ...given } = options;
    // Read once: a cursor is bound to the filters of its walk, so a labels object the caller
    // changes meanwhile must not reach the next page's query (it would be invalid_cursor). And
    // read with the server's rules, which take a `null` filter for none (DESIGN §4.1): sent as
    // is, `queue: null` became a filter for a queue named "null".
    let filters: TaskFilters;
    try {
      filters = parseWith(TaskFiltersSchema, { ...given, labels }, '$');
    } catch (error) {
      throw error instanceof ContractError ? localProblem(error) : error;
    }
    const query: Record<string, string | number | undefined> = {
      state: filters.state,
      queue: filters.queue,
      program: filters.program,
      submitted_from: filters.submitted_from,
      submitted_until: filters.submitted_until,
      workflow_id: filters.workflow_id,
      limit,
    };
    for (const [key, value] of Object.entries(filters.labels ?? {})) query[`label.${key}`] = value;
    let cursor = start;
    for (;;) {
      query.cursor = cursor;
      refuseIllFormedQuery(query);
      const page = await this.#call({
        method: 'GET',
        path: `${this.#scopePath}/tasks`,
        query,
        schema: TaskPageSchema,
        maxBytes: REPLY_LIMITS.single,
        signal,
      });
      yield page;
      if (page.next_cursor === undefined) return;
      cursor = page.next_cursor;
    }
  }

  /**
   * Requests cancellation: a queued task is cancelled at once, an active one
   * when its worker sees the request (or its lease expires). Returns the
   * task's state afterwards; cancelling a terminal task changes nothing.
   */
  async cancel(taskId: string, options: CallOptions = {}): Promise<TaskState> {
    const reply = await this.#call({
      method: 'POST',
      path: `${this.#scopePath}/tasks/${pathSegment(taskId)}/cancel`,
      schema: TaskStateReplySchema,
      maxBytes: REPLY_LIMITS.control,
      signal: options.signal,
    });
    return reply.task_state;
  }

  /**
   * The task's history, one page (≤ 100 records, in order) per iteration,
   * until a page comes back short.
   */
  async *history(
    taskId: string,
    options: HistoryOptions = {},
  ): AsyncGenerator<RecordedHistoryEvent[], void, undefined> {
    let after = options.afterSequence ?? 0;
    for (;;) {
      const page = await this.#call({
        method: 'GET',
        path: `${this.#scopePath}/tasks/${pathSegment(taskId)}/history`,
        query: { after_sequence: after },
        schema: TaskHistorySchema,
        maxBytes: REPLY_LIMITS.single,
        signal: options.signal,
      });
      if (page.length > 0) yield page;
      const last = page[page.length - 1];
      if (page.length < HISTORY_PAGE_LIMIT || last === undefined) return;
      after = last.sequence;
    }
  }

  /** Subscribes the task to a completion destination (idempotent by subscription key). */
  async subscribe(taskId: string, options: SubscribeOptions): Promise<CompletionSubscription> {
    return this.#call({
      method: 'POST',
      path: `${this.#scopePath}/tasks/${pathSegment(taskId)}/completion-subscriptions`,
      body: {
        subscription_key: options.subscriptionKey ?? randomUUID(),
        destination: options.destination,
      },
      schema: CompletionSubscriptionSchema,
      maxBytes: REPLY_LIMITS.control,
      okStatus: [200, 201],
      signal: options.signal,
    });
  }

  /** The task's completion subscriptions with their delivery state. */
  async subscriptions(
    taskId: string,
    options: CallOptions = {},
  ): Promise<CompletionSubscriptionList> {
    return this.#call({
      method: 'GET',
      path: `${this.#scopePath}/tasks/${pathSegment(taskId)}/completion-subscriptions`,
      schema: CompletionSubscriptionListSchema,
      maxBytes: REPLY_LIMITS.control,
      signal: options.signal,
    });
  }

  /** Redelivers a subscription's event, naming the generation being retried. */
  async redeliver(
    subscriptionId: string,
    generation: number,
    options: CallOptions = {},
  ): Promise<CompletionSubscription> {
    return this.#call({
      method: 'POST',
      path: `${this.#scopePath}/completion-subscriptions/${pathSegment(subscriptionId)}/redeliver`,
      body: { generation },
      schema: CompletionSubscriptionSchema,
      maxBytes: REPLY_LIMITS.control,
      signal: options.signal,
    });
  }

  #submitCommand(
    input: SubmitInput,
    idempotencyKey: string | undefined,
    originTrace: TraceContext | undefined,
    path = '$',
  ): SubmitCommand {
    // The spread last: a property an object literal adds after a spread is V8's slow path (~1 µs
    // each on Node 20; bench/README.md, "Objects built by spread"). An untyped caller's
    // `tenant_id`/`namespace` are taken out, so the scope stays the client's.
    const {
      program,
      data,
      tenant_id: _tenant,
      namespace: _namespace,
      ...rest
    } = input as SubmitInput & { tenant_id?: unknown; namespace?: unknown };
    const command: Record<string, unknown> = {
      idempotency_key: idempotencyKey ?? randomUUID(),
      input: {
        tenant_id: this.#tenant,
        namespace: this.#namespace,
        program: typeof program === 'string' ? { name: program } : program,
        data: data === undefined ? null : data,
        ...rest,
      },
    };
    if (originTrace !== undefined) command.origin_trace = originTrace;
    return validateSubmitCommand(command, path);
  }

  /**
   * One request, retried on transport failures and `unavailable`, each retry after a backoff that
   * a reply's `Retry-After` raises (up to the backoff's `maxMs`; the caller's signal cuts any wait
   * short). Its body is encoded once, at the call: a retry sends the first send's bytes even if
   * the caller changed its objects (a submission's `data`) meanwhile, since other bytes under the
   * same idempotency key are a `409 conflict`, or a task with data the caller never submitted.
   */
  async #call<S extends ReplySchema>(spec: RequestSpec<S>): Promise<ReplyOf<S>> {
    const request: RequestSpec<S> =
      spec.body === undefined ? spec : { bodyText: JSON.stringify(spec.body), ...spec };
    for (let failures = 0; ; failures++) {
      try {
        const { body } = await this.#http.request(request);
        logRecovered(this.#logger, this.#failures, 'requests work again');
        return body;
      } catch (error) {
        if (failures >= this.#retries || !isRetryable(error) || spec.signal?.aborted) throw error;
        const delay = retryDelay(failures + 1, error, this.#backoff);
        logRetriedFailure(this.#logger, this.#failures, 'request failed; retrying', {
          method: spec.method,
          path: spec.path,
          delay_ms: delay,
          ...errorFields(error),
        });
        await sleep(delay, spec.signal);
      }
    }
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, timerDelay(ms));
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * A batch item's problem with its path renumbered from the item's index in the request sent
 * (`$.commands[at]…`) to its index in the caller's entries, which differ once refused entries
 * were left out.
 */
function renumbered(problem: Problem, at: number, index: number): Problem {
  const prefix = `$.commands[${at}]`;
  if (at === index || problem.path === undefined || !problem.path.startsWith(prefix)) {
    return problem;
  }
  return { ...problem, path: `$.commands[${index}]${problem.path.slice(prefix.length)}` };
}
