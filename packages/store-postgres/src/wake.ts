/**
 * Wake hints across replicas over PostgreSQL `LISTEN/NOTIFY` (DESIGN §1.7, §5 Acquire). The store
 * NOTIFYs `ledgence_wake` at commit with JSON arrays of hints; this source LISTENs on ONE
 * dedicated connection (`max: 1`) and wakes matching watches, keeping the hint for a watch whose
 * waiter is probing rather than parked. A hint is only a hint: waiters rescan, and a periodic
 * rescan stays necessary, because NOTIFYs sent while the connection was down are lost — so every
 * (re)connection wakes every watch.
 */
import type { WakeSource, WakeTopic, WakeWatch } from '@ledgence/core';
import postgres from 'postgres';
import { WAKE_CHANNEL } from './hot-sql.js';
import { reconnectBackoffSeconds } from './reconnect.js';

/** Options of {@link createPostgresWakeSource}. */
export interface PostgresWakeSourceOptions {
  /** postgres:// URL; the source opens its own single LISTEN connection. */
  url: string;
  /**
   * Most watches held at once (default 10 000). Beyond it a watch is not registered and its
   * `next` simply sleeps until its timeout: the caller's periodic rescan still finds work, and
   * memory stays bounded.
   */
  maxWaiters?: number;
  /**
   * How often the LISTEN connection is checked with a `select 1` (default 10 000 ms). One not
   * answered by the next check means the connection died without a word — the database's address
   * moved at a failover, a NAT or firewall forgot the flow — and it is replaced: TCP alone would
   * notice only after its keepalive probes give up (~10 min on Linux), and until then this
   * replica's waiters would see no hint, only the rescan.
   */
  pingIntervalMs?: number;
  /**
   * Told when the LISTEN stops being in place and when it is again, for the operator's log: while
   * it is not, this replica's parked polls see no hint and find new work only by their rescan.
   * Not called for the first LISTEN's success, nor once `close()` is called; an exception it
   * throws is ignored.
   */
  onListenState?: (state: WakeListenState) => void;
}

/**
 * A change of the LISTEN's state: `listening` once it is in place again; `lost` when its
 * connection closed (also each failed reconnect), the LISTEN failed on an open connection, or the
 * connection went silent and was replaced (`cause` says which).
 */
export type WakeListenState =
  | { listening: true }
  | { listening: false; cause: 'closed' | 'listen_failed' | 'silent'; error?: unknown };

/** A {@link WakeSource} on LISTEN/NOTIFY, with a way to close its connection. */
export interface PostgresWakeSource extends WakeSource {
  /** Resolves once the first LISTEN is in place (hints sent before it are not seen). */
  ready(): Promise<void>;
  /** Wakes every watch (each `next` then resolves at once) and closes the LISTEN connection. */
  close(): Promise<void>;
}

/**
 * A registered watch: `hinted` keeps a hint that came while no `next` was pending (the waiter
 * was probing), `wakeUp` ends the pending `next`, if any.
 */
interface Watcher {
  hinted: boolean;
  wakeUp: (() => void) | undefined;
}

function hint(watcher: Watcher): void {
  watcher.hinted = true;
  watcher.wakeUp?.();
}

/** A `next` that ends on its timeout, an abort, or `wakeUp`, and consumes the kept hint. */
function nextOf(watcher: Watcher | undefined, isClosed: () => boolean): WakeWatch['next'] {
  return (timeoutMs, signal) =>
    new Promise<void>((resolve) => {
      if (watcher?.hinted || isClosed() || signal?.aborted || timeoutMs <= 0) {
        if (watcher) watcher.hinted = false;
        return resolve();
      }
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        if (watcher) {
          watcher.wakeUp = undefined;
          watcher.hinted = false;
        }
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      signal?.addEventListener('abort', done, { once: true });
      if (watcher) watcher.wakeUp = done;
    });
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

/** The topic-key prefix of a namespace's queues, for a `scope` hint; else null. */
function scopePrefix(hint: unknown): string | null {
  if (typeof hint !== 'object' || hint === null) return null;
  const h = hint as Record<string, unknown>;
  if (h.kind !== 'scope' || typeof h.tenant !== 'string' || typeof h.namespace !== 'string') {
    return null;
  }
  return `q\u0000${h.tenant}\u0000${h.namespace}\u0000`;
}

/**
 * Creates a wake source listening on the store's wake channel.
 *
 * @example
 * ```ts
 * const wake = createPostgresWakeSource({ url });
 * const watch = wake.watch({ kind: 'queue', scope, queue: 'email' }); // before looking
 * // probe the store; if it has nothing yet:
 * await watch.next(1_000, request.signal);
 * // then probe again: the hint says only that something may have changed
 * watch.close();
 * await wake.close();
 * ```
 */
export function createPostgresWakeSource(options: PostgresWakeSourceOptions): PostgresWakeSource {
  const maxWaiters = options.maxWaiters ?? 10_000;
  const interests = new Map<string, Set<Watcher>>();
  let size = 0;
  let closed = false;

  // Whether a loss was reported since the LISTEN was last in place: its return is then news.
  let lossReported = false;
  const report = (state: WakeListenState) => {
    if (closed || options.onListenState === undefined) return;
    if (state.listening) {
      if (!lossReported) return;
      lossReported = false;
    } else lossReported = true;
    try {
      options.onListenState(state);
    } catch {
      // Reporting must not change what the source does.
    }
  };
  const wakeAll = () => {
    for (const set of interests.values()) for (const watcher of set) hint(watcher);
  };
  const onNotify = (payload: string) => {
    let hints: unknown;
    try {
      hints = JSON.parse(payload);
    } catch {
      return;
    }
    for (const item of Array.isArray(hints) ? hints : [hints]) {
      const prefix = scopePrefix(item);
      if (prefix !== null) {
        // Every queue of a namespace: a freed concurrency slot may unblock any of them.
        for (const [key, set] of interests) {
          if (key.startsWith(prefix)) for (const watcher of set) hint(watcher);
        }
        continue;
      }
      const key = hintKey(item);
      if (key === null) continue;
      const set = interests.get(key);
      if (set) for (const watcher of set) hint(watcher);
    }
  };

  // The LISTEN is issued here, not through postgres.js's `sql.listen`: that one re-listens only
  // when its connection closes, so a LISTEN that fails on a connection that stays open (a server
  // still in recovery answers "cannot execute LISTEN during recovery" after a failover) was
  // never tried again and this replica's waiters saw no hint for the life of the connection.
  // Here any failed LISTEN is retried, and every close of the connection issues a new one.
  let attempt = 0;
  let inFlight = false;
  let retry: NodeJS.Timeout | undefined;
  let firstTry: (() => void) | undefined;
  const listening = new Promise<void>((resolve) => {
    firstTry = resolve;
  });
  const tried = () => {
    firstTry?.();
    firstTry = undefined;
  };
  // postgres.js hands every NotificationResponse to this option (its own `listen` uses it), which
  // its type declarations leave out.
  const notifications = {
    onnotify: (channel: string, payload: string) => {
      if (channel === WAKE_CHANNEL) onNotify(payload);
    },
  } as object;
  /** A client of one connection; only the current one's close issues the next LISTEN. */
  const connect = (): postgres.Sql => {
    const client = postgres(options.url, {
      max: 1,
      onnotice: () => {},
      connect_timeout: 10,
      // The store pool's reconnect schedule: the LISTEN connection reconnects on its own schedule
      // (nothing else asks it to), and postgres.js's would leave this replica's waiters without a
      // hint for up to 20 s after a restart.
      backoff: reconnectBackoffSeconds,
      // One long-lived connection: never closed for being idle or old.
      idle_timeout: 0,
      max_lifetime: null,
      fetch_types: false,
      connection: { application_name: 'ledgence-wake' },
      ...notifications,
      // The connection is gone, and its LISTEN with it (a failed connect attempt comes here too).
      onclose: () => {
        if (client !== sql) return;
        report({ listening: false, cause: 'closed' });
        listen();
      },
    });
    return client;
  };
  let sql = connect();
  /**
   * Issues the LISTEN unless one is in flight or a retry is pending. Once it is in place, every
   * waiter rescans: hints sent while no LISTEN was in place are lost. A failure is retried after
   * the backoff; meanwhile waiters fall back to their timeouts (the periodic rescan). The outcome
   * of a LISTEN sent on a client since replaced is ignored.
   */
  function listen(): void {
    if (closed || inFlight || retry !== undefined) return;
    inFlight = true;
    const client = sql;
    client.unsafe(`listen "${WAKE_CHANNEL.replace(/"/g, '""')}"`).then(
      () => {
        if (client !== sql) return;
        inFlight = false;
        attempt = 0;
        wakeAll();
        tried();
        report({ listening: true });
      },
      (error: unknown) => {
        if (client !== sql) return;
        inFlight = false;
        tried();
        if (closed) return;
        report({ listening: false, cause: 'listen_failed', error });
        retry = setTimeout(() => {
          retry = undefined;
          listen();
        }, reconnectBackoffSeconds(attempt++) * 1000);
        retry.unref();
      },
    );
  }
  listen();

  // The connection is checked every `pingIntervalMs`: a `select 1` that has not come back when
  // the next check is due, or a LISTEN still unanswered at two checks in a row, means it died
  // without a word, and a new client takes its place (postgres.js cannot drop one connection of
  // a client); the old one is ended without waiting, failing what it still holds.
  let pinging = false;
  let listenStalled = false;
  const replace = () => {
    report({ listening: false, cause: 'silent' });
    const dead = sql;
    sql = connect();
    inFlight = false;
    pinging = false;
    listenStalled = false;
    dead.end({ timeout: 0 }).catch(() => {});
    listen();
  };
  const ping = setInterval(() => {
    if (closed || retry !== undefined) return;
    if (inFlight) {
      if (listenStalled) replace();
      else listenStalled = true;
      return;
    }
    listenStalled = false;
    if (pinging) return replace();
    pinging = true;
    const client = sql;
    client`select 1`.then(
      () => {
        if (client === sql) pinging = false;
      },
      () => {
        // A check failed by a close: the close issues the next LISTEN.
        if (client === sql) pinging = false;
      },
    );
  }, options.pingIntervalMs ?? 10_000);
  ping.unref();

  return {
    ready: () => listening,
    watch(topic: WakeTopic): WakeWatch {
      const isClosed = () => closed;
      if (closed || size >= maxWaiters) return { next: nextOf(undefined, isClosed), close() {} };
      const key = topicKey(topic);
      let set = interests.get(key);
      if (set === undefined) {
        set = new Set();
        interests.set(key, set);
      }
      const mine = set;
      const watcher: Watcher = { hinted: false, wakeUp: undefined };
      mine.add(watcher);
      size += 1;
      return {
        next: nextOf(watcher, isClosed),
        close() {
          if (!mine.delete(watcher)) return;
          size -= 1;
          if (mine.size === 0 && interests.get(key) === mine) interests.delete(key);
          watcher.wakeUp?.();
        },
      };
    },
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      clearTimeout(retry);
      clearInterval(ping);
      wakeAll();
      // Not waiting for the first LISTEN: with the checks stopped, nothing would replace a
      // connection whose LISTEN the database never answers, and close() would wait for TCP to
      // give up (~10 min). Ending the client fails whatever it still holds; ready() resolves.
      tried();
      // Nothing to drain on this connection: a LISTEN still waiting for a connect is dropped.
      await sql.end({ timeout: 0 });
    },
  };
}
