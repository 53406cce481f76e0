/**
 * Sends settlements: batches every settlement ready at the same moment into
 * one `settle:batch` request (within a count and a UTF-8 byte budget), retries
 * each one with jittered backoff (lengthened, up to its `maxMs`, to a failed
 * reply's `Retry-After`) until it is accepted or definitively rejected
 * (see settle.ts), sends each settlement of a request refused as too large in a
 * request of its own, and lets a stopping worker abandon what is still unsent.
 * Time and I/O are injected, so the retry policy is tested without sockets.
 */
import { MAX_WORKER_BATCH, type SettleCommand, type SettleReply } from '@ledgence/contracts';
import { type BackoffPolicy, DEFAULT_BACKOFF, retryDelay } from './backoff.js';
import { ProblemError } from './errors.js';
import { isProblem } from './http.js';
import { errorFields, type Logger } from './logger.js';
import { classifySettleError } from './settle.js';
import { timerDelay } from './timers.js';

/** How a settlement ended. */
export type SettleResult =
  | { kind: 'accepted'; reply: SettleReply }
  | { kind: 'rejected'; error: unknown }
  | { kind: 'abandoned' };

/** Sends one batch; resolves with one item per command, or throws for the whole request. */
export type SendSettleBatch = (commands: SettleCommand[]) => Promise<(SettleReply | unknown)[]>;

/** Dependencies of a {@link Settler}. */
export interface SettlerOptions {
  send: SendSettleBatch;
  logger: Logger;
  backoff?: BackoffPolicy;
  random?: () => number;
  now?: () => number;
  /** Largest number of commands in one request. */
  maxBatch?: number;
  /** Largest UTF-8 size of the commands of one request (the body's envelope adds a few bytes). */
  maxBatchBytes?: number;
  /**
   * Requests in flight at once (1 by default). With one, settlements finishing while a request
   * is out wait and share the next one; with more, a worker of many slots keeps its server
   * busy while an answer is on its way (`requestLanes`, bench/README.md).
   */
  maxInFlight?: number;
}

interface Item {
  command: SettleCommand;
  bytes: number;
  failures: number;
  notBefore: number;
  /** In a request now: the next batches pass it over. */
  sending: boolean;
  /** Goes in a request of its own: a request it shared was refused as too large. */
  alone: boolean;
  resolve: (result: SettleResult) => void;
}

/** Below the server's BATCH_MAX_BYTES (16 MiB), leaving room for the envelope. */
const DEFAULT_MAX_BATCH_BYTES = 15 * 1024 * 1024;

/**
 * A count option: a positive integer, or `fallback` when absent. Anything else would not fail
 * loudly later — `NaN` in flight compares false both ways, so requests would go out unbounded.
 */
function countOption(name: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < 1) {
    throw new TypeError(`${name} must be a positive integer (got ${String(value)})`);
  }
  return value;
}

/** The settlement queue of one worker. */
export class Settler {
  readonly #options: Required<Omit<SettlerOptions, 'backoff' | 'random' | 'now'>>;
  readonly #backoff: BackoffPolicy;
  readonly #random: () => number;
  readonly #now: () => number;
  #queue: Item[] = [];
  #inFlight = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #immediate: ReturnType<typeof setImmediate> | undefined;
  #closed = false;

  constructor(options: SettlerOptions) {
    this.#options = {
      send: options.send,
      logger: options.logger,
      maxBatch: countOption('maxBatch', options.maxBatch, MAX_WORKER_BATCH),
      maxBatchBytes: countOption('maxBatchBytes', options.maxBatchBytes, DEFAULT_MAX_BATCH_BYTES),
      maxInFlight: countOption('maxInFlight', options.maxInFlight, 1),
    };
    this.#backoff = options.backoff ?? DEFAULT_BACKOFF;
    this.#random = options.random ?? Math.random;
    this.#now = options.now ?? (() => performance.now());
  }

  /** Queues a settlement; resolves when it is accepted, rejected or abandoned. Never rejects. */
  settle(command: SettleCommand): Promise<SettleResult> {
    if (this.#closed) return Promise.resolve({ kind: 'abandoned' });
    return new Promise((resolve) => {
      this.#queue.push({
        command,
        // UTF-8 bytes, as the server counts its limit; one more for the comma between commands.
        bytes: Buffer.byteLength(JSON.stringify(command)) + 1,
        failures: 0,
        notBefore: 0,
        sending: false,
        alone: false,
        resolve,
      });
      this.#schedule(0);
    });
  }

  /** How many settlements are queued or in flight. */
  get size(): number {
    return this.#queue.length;
  }

  /** Gives up on everything not yet accepted: each resolves `abandoned`. Idempotent. */
  abandon(): void {
    this.#closed = true;
    this.#cancelWake();
    const items = this.#queue;
    this.#queue = [];
    for (const item of items) item.resolve({ kind: 'abandoned' });
  }

  #schedule(delayMs: number): void {
    if (this.#closed || this.#inFlight >= this.#options.maxInFlight) return;
    if (delayMs <= 0 && this.#immediate !== undefined) return;
    this.#cancelWake();
    const wake = () => {
      this.#cancelWake();
      this.#drive();
    };
    // Due now: at the end of this turn of the event loop, so settlements finishing in the same
    // tick share one request. A timer would do the same but add its 1 ms minimum to every
    // settlement (too small to show in the drains: bench/README.md "Request lanes"). Due
    // later (a backoff): a timer.
    if (delayMs <= 0) this.#immediate = setImmediate(wake);
    else this.#timer = setTimeout(wake, timerDelay(delayMs));
  }

  #cancelWake(): void {
    clearTimeout(this.#timer);
    clearImmediate(this.#immediate);
    this.#timer = undefined;
    this.#immediate = undefined;
  }

  /** Sends ready items, one batch per free request, until none is ready or none is free. */
  #pump(): void {
    while (!this.#closed && this.#inFlight < this.#options.maxInFlight) {
      const batch = this.#takeReady();
      if (batch.length === 0) break;
      for (const item of batch) item.sending = true;
      this.#inFlight += 1;
      this.#sendBatch(batch)
        .catch((error: unknown) =>
          this.#options.logger.error('settlement bookkeeping failed', errorFields(error)),
        )
        .finally(() => {
          for (const item of batch) item.sending = false;
          this.#inFlight -= 1;
          this.#drive();
        });
    }
  }

  /**
   * Ready items go now, the rest are woken for when their backoff ends (checked again on
   * every wake: a timer may fire a fraction of a millisecond before `now` reaches it).
   */
  #drive(): void {
    if (this.#closed) return;
    this.#pump();
    let next = Number.POSITIVE_INFINITY;
    for (const item of this.#queue) if (!item.sending) next = Math.min(next, item.notBefore);
    if (next !== Number.POSITIVE_INFINITY) this.#schedule(next - this.#now());
  }

  /** The ready items that fit one request, oldest first; they stay queued while in flight. */
  #takeReady(): Item[] {
    const now = this.#now();
    const batch: Item[] = [];
    let bytes = 0;
    for (const item of this.#queue) {
      if (item.sending || item.notBefore > now) continue;
      if (item.alone) {
        if (batch.length === 0) return [item];
        continue;
      }
      if (batch.length >= this.#options.maxBatch) break;
      if (batch.length > 0 && bytes + item.bytes > this.#options.maxBatchBytes) break;
      batch.push(item);
      bytes += item.bytes;
    }
    return batch;
  }

  async #sendBatch(batch: Item[]): Promise<void> {
    let results: unknown[];
    try {
      results = await this.#options.send(batch.map((item) => item.command));
    } catch (error) {
      for (const item of batch) this.#failed(item, error, batch.length);
      return;
    }
    batch.forEach((item, index) => {
      const result = results[index];
      if (isProblem(result)) this.#failed(item, new ProblemError(result));
      else this.#done(item, { kind: 'accepted', reply: result as SettleReply });
    });
  }

  /** `settlements`: how many the failed request carried (1 for a batch item's own problem). */
  #failed(item: Item, error: unknown, settlements = 1): void {
    if (this.#closed) return;
    const attempt = item.command.owner.attempt_id;
    const verdict = classifySettleError(error, settlements);
    if (verdict === 'split') {
      // Not the settlement's fault: it goes again at once, alone, and only a refusal of it alone
      // is definitive.
      item.alone = true;
      this.#options.logger.warn('settlement did not fit a shared request; sending it alone', {
        attempt_id: attempt,
        task_id: item.command.owner.task_id,
        ...errorFields(error),
      });
      return;
    }
    if (verdict === 'definitive') {
      this.#options.logger.warn('settlement rejected', {
        attempt_id: attempt,
        task_id: item.command.owner.task_id,
        ...errorFields(error),
      });
      this.#done(item, { kind: 'rejected', error });
      return;
    }
    item.failures += 1;
    const delay = retryDelay(item.failures, error, this.#backoff, this.#random);
    item.notBefore = this.#now() + delay;
    this.#options.logger.debug('settlement will be retried', {
      attempt_id: attempt,
      failures: item.failures,
      delay_ms: delay,
      ...errorFields(error),
    });
  }

  #done(item: Item, result: SettleResult): void {
    const index = this.#queue.indexOf(item);
    if (index >= 0) this.#queue.splice(index, 1);
    item.resolve(result);
  }
}
