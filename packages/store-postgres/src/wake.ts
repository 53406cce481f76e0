/**
 * Wake hints across replicas over PostgreSQL `LISTEN/NOTIFY` (DESIGN §1.7, §5 Acquire). The store
 * NOTIFYs `ledgence_wake` at commit with JSON arrays of hints; this source LISTENs on ONE
 * dedicated connection (`max: 1`) and resolves matching waiters. A hint is only a hint: waiters
 * rescan, and a periodic rescan stays necessary, because NOTIFYs sent while the connection was
 * down are lost — so every (re)connection wakes every waiter.
 */
import type { WakeSource, WakeTopic } from '@ledgence/core';
import postgres from 'postgres';
import { WAKE_CHANNEL } from './hot-sql.js';

/** Options of {@link createPostgresWakeSource}. */
export interface PostgresWakeSourceOptions {
  /** postgres:// URL; the source opens its own single LISTEN connection. */
  url: string;
  /**
   * Most waiters held at once (default 10 000). Beyond it a waiter is not registered and simply
   * sleeps until its timeout: the caller's periodic rescan still finds work, and memory stays bounded.
   */
  maxWaiters?: number;
}

/** A {@link WakeSource} on LISTEN/NOTIFY, with a way to close its connection. */
export interface PostgresWakeSource extends WakeSource {
  /** Resolves once the first LISTEN is in place (hints sent before it are not seen). */
  ready(): Promise<void>;
  /** Resolves every waiter and closes the LISTEN connection. */
  close(): Promise<void>;
}

interface Waiter {
  resolve: () => void;
}

function topicKey(topic: WakeTopic): string {
  const { tenant_id, namespace } = topic.scope;
  return topic.kind === 'queue'
    ? `q\u0000${tenant_id}\u0000${namespace}\u0000${topic.queue}`
    : `t\u0000${tenant_id}\u0000${namespace}\u0000${topic.task_id}`;
}

function hintKey(hint: unknown): string | null {
  if (typeof hint !== 'object' || hint === null) return null;
  const h = hint as Record<string, unknown>;
  if (typeof h.tenant !== 'string' || typeof h.namespace !== 'string') return null;
  if (h.kind === 'queue' && typeof h.queue === 'string') {
    return `q\u0000${h.tenant}\u0000${h.namespace}\u0000${h.queue}`;
  }
  if (h.kind === 'task' && typeof h.task_id === 'string') {
    return `t\u0000${h.tenant}\u0000${h.namespace}\u0000${h.task_id}`;
  }
  return null;
}

/**
 * Creates a wake source listening on the store's wake channel.
 *
 * @example
 * ```ts
 * const wake = createPostgresWakeSource({ url });
 * await wake.wait({ kind: 'queue', scope, queue: 'email' }, 20_000, request.signal);
 * // then rescan: the hint says only that something may have changed
 * await wake.close();
 * ```
 */
export function createPostgresWakeSource(options: PostgresWakeSourceOptions): PostgresWakeSource {
  const maxWaiters = options.maxWaiters ?? 10_000;
  const interests = new Map<string, Set<Waiter>>();
  let size = 0;
  let closed = false;

  const wakeAll = () => {
    for (const set of interests.values()) for (const waiter of [...set]) waiter.resolve();
  };
  const onNotify = (payload: string) => {
    let hints: unknown;
    try {
      hints = JSON.parse(payload);
    } catch {
      return;
    }
    for (const hint of Array.isArray(hints) ? hints : [hints]) {
      const key = hintKey(hint);
      if (key === null) continue;
      const set = interests.get(key);
      if (set) for (const waiter of [...set]) waiter.resolve();
    }
  };

  const sql = postgres(options.url, {
    max: 1,
    onnotice: () => {},
    connect_timeout: 10,
    connection: { application_name: 'ledgence-wake' },
  });
  // onlisten runs on the first LISTEN and again after every reconnect: hints sent while we were
  // disconnected are lost, so every waiter rescans.
  const listening = sql
    .listen(WAKE_CHANNEL, onNotify, wakeAll)
    .then(() => {})
    .catch(() => {
      // Unreachable database: waiters fall back to their timeouts (the periodic rescan).
    });

  return {
    ready: () => listening,
    wait(topic: WakeTopic, timeoutMs: number, signal?: AbortSignal): Promise<void> {
      return new Promise<void>((resolve) => {
        if (closed || signal?.aborted) return resolve();
        let timer: NodeJS.Timeout | undefined;
        if (size >= maxWaiters) {
          timer = setTimeout(resolve, Math.max(0, timeoutMs));
          signal?.addEventListener(
            'abort',
            () => {
              clearTimeout(timer);
              resolve();
            },
            { once: true },
          );
          return;
        }
        const key = topicKey(topic);
        let set = interests.get(key);
        if (set === undefined) {
          set = new Set();
          interests.set(key, set);
        }
        const mine = set;
        const onAbort = () => waiter.resolve();
        const waiter: Waiter = {
          resolve: () => {
            if (!mine.delete(waiter)) return;
            size -= 1;
            if (mine.size === 0 && interests.get(key) === mine) interests.delete(key);
            clearTimeout(timer);
            signal?.removeEventListener('abort', onAbort);
            resolve();
          },
        };
        mine.add(waiter);
        size += 1;
        timer = setTimeout(waiter.resolve, Math.max(0, timeoutMs));
        signal?.addEventListener('abort', onAbort, { once: true });
      });
    },
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      wakeAll();
      await listening;
      await sql.end({ timeout: 5 });
    },
  };
}
