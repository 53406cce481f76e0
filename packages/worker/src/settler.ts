/**
 * Sends settlements: batches every settlement ready at the same moment into
 * one `settle:batch` request, retries each one with jittered backoff until it
 * is accepted or definitively rejected (see settle.ts), and lets a stopping
 * worker abandon what is still unsent. Time and I/O are injected, so the
 * retry policy is tested without sockets.
 */
import { MAX_WORKER_BATCH, type SettleCommand, type SettleReply } from '@ledgence/contracts';
import { type BackoffPolicy, backoffDelay, DEFAULT_BACKOFF } from './backoff.js';
import { ProblemError } from './errors.js';
import { isProblem } from './http.js';
import { errorFields, type Logger } from './logger.js';
import { classifySettleError } from './settle.js';

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
  /** Largest JSON size of one request body (bytes, approximate). */
  maxBatchBytes?: number;
}

interface Item {
  command: SettleCommand;
  bytes: number;
  failures: number;
  notBefore: number;
  resolve: (result: SettleResult) => void;
}

/** Below the server's BATCH_MAX_BYTES (16 MiB), leaving room for the envelope. */
const DEFAULT_MAX_BATCH_BYTES = 15 * 1024 * 1024;

/** The settlement queue of one worker. */
export class Settler {
  readonly #options: Required<Omit<SettlerOptions, 'backoff' | 'random' | 'now'>>;
  readonly #backoff: BackoffPolicy;
  readonly #random: () => number;
  readonly #now: () => number;
  #queue: Item[] = [];
  #flushing = false;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #closed = false;

  constructor(options: SettlerOptions) {
    this.#options = {
      send: options.send,
      logger: options.logger,
      maxBatch: options.maxBatch ?? MAX_WORKER_BATCH,
      maxBatchBytes: options.maxBatchBytes ?? DEFAULT_MAX_BATCH_BYTES,
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
        bytes: JSON.stringify(command).length + 1,
        failures: 0,
        notBefore: 0,
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
    clearTimeout(this.#timer);
    const items = this.#queue;
    this.#queue = [];
    for (const item of items) item.resolve({ kind: 'abandoned' });
  }

  #schedule(delayMs: number): void {
    if (this.#closed || this.#flushing) return;
    clearTimeout(this.#timer);
    // A timer rather than an immediate call: settlements finishing in the
    // same tick share one request.
    this.#timer = setTimeout(
      () => {
        this.#timer = undefined;
        this.#flush().catch((error: unknown) =>
          this.#options.logger.error('settlement bookkeeping failed', errorFields(error)),
        );
      },
      Math.max(0, delayMs),
    );
  }

  async #flush(): Promise<void> {
    if (this.#flushing || this.#closed) return;
    this.#flushing = true;
    try {
      for (;;) {
        const batch = this.#takeReady();
        if (batch.length === 0) break;
        await this.#sendBatch(batch);
        if (this.#closed) return;
      }
    } finally {
      this.#flushing = false;
    }
    if (this.#queue.length > 0) {
      const next = Math.min(...this.#queue.map((item) => item.notBefore));
      this.#schedule(next - this.#now());
    }
  }

  /** The ready items that fit one request, oldest first; they stay queued while in flight. */
  #takeReady(): Item[] {
    const now = this.#now();
    const batch: Item[] = [];
    let bytes = 0;
    for (const item of this.#queue) {
      if (item.notBefore > now) continue;
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
      for (const item of batch) this.#failed(item, error);
      return;
    }
    batch.forEach((item, index) => {
      const result = results[index];
      if (isProblem(result)) this.#failed(item, new ProblemError(result));
      else this.#done(item, { kind: 'accepted', reply: result as SettleReply });
    });
  }

  #failed(item: Item, error: unknown): void {
    if (this.#closed) return;
    const attempt = item.command.owner.attempt_id;
    if (classifySettleError(error) === 'definitive') {
      this.#options.logger.warn('settlement rejected', {
        attempt_id: attempt,
        task_id: item.command.owner.task_id,
        ...errorFields(error),
      });
      this.#done(item, { kind: 'rejected', error });
      return;
    }
    item.failures += 1;
    const delay = backoffDelay(item.failures, this.#backoff, this.#random);
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
