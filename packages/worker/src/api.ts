/**
 * The worker protocol routes (DESIGN §6), one function each, every reply
 * parsed strictly against its contract schema.
 */
import {
  type AcquireBatchReply,
  AcquireBatchReplySchema,
  type AcquireCommand,
  type LeaseOwner,
  type OpenSessionCommand,
  type RenewBatchReply,
  RenewBatchReplySchema,
  type RenewCommand,
  type Scope,
  type SettleBatchReply,
  SettleBatchReplySchema,
  type SettleCommand,
  type TaskStateReply,
  TaskStateReplySchema,
  type WorkerSession,
  WorkerSessionSchema,
} from '@ledgence/contracts';
import { ProtocolError } from './errors.js';
import { type HttpTransport, pathSegment, waitQuery } from './http.js';

/**
 * Byte limits of replies. The server's own limits bound what it can send
 * (an assignment carries ≤ 1 MiB of data, a worker batch ≤ 1 000 items);
 * these only stop a runaway or hostile reply from exhausting memory.
 */
export const REPLY_LIMITS = Object.freeze({
  control: 1024 * 1024,
  single: 8 * 1024 * 1024,
  batch: 512 * 1024 * 1024,
});

/** A session as a reply gave it, with the reply's `Date` (ms since the epoch) when it had one. */
export interface SessionReply {
  session: WorkerSession;
  date: number | null;
}

/** The worker routes over one transport. */
export class WorkerApi {
  readonly #http: HttpTransport;

  constructor(http: HttpTransport) {
    this.#http = http;
  }

  /** `POST /v1/worker/sessions`; `signal` aborts it (a stopping worker has no use for it). */
  async openSession(command: OpenSessionCommand, signal?: AbortSignal): Promise<SessionReply> {
    const reply = await this.#http.request({
      method: 'POST',
      path: '/v1/worker/sessions',
      body: command,
      schema: WorkerSessionSchema,
      maxBytes: REPLY_LIMITS.control,
      okStatus: [200, 201],
      signal,
    });
    return { session: reply.body, date: reply.date };
  }

  /**
   * `POST /v1/worker/sessions/{id}/extend` with body `{scope}`: the path names
   * no scope, and a key bound to several namespaces (or development mode)
   * cannot infer it. `signal` aborts it (a stopped worker has no use for it).
   */
  async extendSession(
    sessionId: string,
    scope: Scope,
    signal?: AbortSignal,
  ): Promise<SessionReply> {
    const reply = await this.#http.request({
      method: 'POST',
      path: `/v1/worker/sessions/${pathSegment(sessionId)}/extend`,
      body: { scope },
      schema: WorkerSessionSchema,
      maxBytes: REPLY_LIMITS.control,
      signal,
    });
    return { session: reply.body, date: reply.date };
  }

  /**
   * `POST /v1/worker/acquire:batch?wait_ms=`: one command per slot of one
   * session; the reply holds one item per command, in order. `waitMs` is a
   * wire value (see `wireWaitMs`).
   */
  async acquireBatch(
    commands: AcquireCommand[],
    waitMs: number,
    signal?: AbortSignal,
  ): Promise<AcquireBatchReply['replies']> {
    const reply = await this.#http.request({
      method: 'POST',
      path: '/v1/worker/acquire:batch',
      query: { wait_ms: waitQuery(waitMs) },
      body: { commands },
      schema: AcquireBatchReplySchema,
      maxBytes: REPLY_LIMITS.batch,
      extraTimeoutMs: waitMs,
      signal,
    });
    return sameLength(reply.body.replies, commands.length, 'acquire:batch');
  }

  /** `POST /v1/worker/renew:batch`. */
  async renewBatch(commands: RenewCommand[]): Promise<RenewBatchReply['results']> {
    const reply = await this.#http.request({
      method: 'POST',
      path: '/v1/worker/renew:batch',
      body: { commands },
      schema: RenewBatchReplySchema,
      maxBytes: REPLY_LIMITS.batch,
    });
    return sameLength(reply.body.results, commands.length, 'renew:batch');
  }

  /** `POST /v1/worker/settle:batch`. */
  async settleBatch(commands: SettleCommand[]): Promise<SettleBatchReply['results']> {
    const reply = await this.#http.request({
      method: 'POST',
      path: '/v1/worker/settle:batch',
      body: { commands },
      schema: SettleBatchReplySchema,
      maxBytes: REPLY_LIMITS.batch,
    });
    return sameLength(reply.body.results, commands.length, 'settle:batch');
  }

  /** `POST /v1/worker/quiescence`: the handler of an `unconfirmed` settlement has ended. */
  async confirmQuiescence(owner: LeaseOwner): Promise<TaskStateReply> {
    const reply = await this.#http.request({
      method: 'POST',
      path: '/v1/worker/quiescence',
      body: owner,
      schema: TaskStateReplySchema,
      maxBytes: REPLY_LIMITS.control,
    });
    return reply.body;
  }
}

/** A batch reply answers every command, in order; anything else breaks the contract. */
function sameLength<T>(items: T[], expected: number, route: string): T[] {
  if (items.length !== expected) {
    throw new ProtocolError(`${route} answered ${items.length} items for ${expected} commands`);
  }
  return items;
}
