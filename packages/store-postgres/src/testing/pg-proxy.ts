/**
 * A TCP proxy in front of PostgreSQL for tests that need the wire to misbehave at one exact
 * point, with no failpoint armed (so the production code path runs):
 *
 * - {@link PgProxy.loseReplyCarrying}: the first server chunk carrying a command tag is dropped
 *   with both sockets. The server has done the work (a COMMIT or a lone statement it answered is
 *   durable); the client sees a lost connection — a faithful lost commit reply.
 * - {@link PgProxy.holdRequestCarrying}: the first client chunk carrying some text (and all that
 *   follows it on that connection) is held until released, to interleave another session's work
 *   between two statements deterministically.
 * - {@link PgProxy.failStatementCarrying}: the first client chunk carrying some text is answered
 *   by the proxy with an error, the connection left open (a server still in recovery refusing a
 *   LISTEN, say).
 * - {@link PgProxy.refuse}: the database is down as a client sees it: open connections are
 *   reset, and new ones reset at once (each attempt timed).
 * - {@link PgProxy.silenceOpen}: the connections open now go silent both ways, never closed (a
 *   peer gone without a FIN or a reset); new ones are forwarded.
 * - {@link PgProxy.takeCounts}: every statement and transaction the clients sent, read from the
 *   frontend protocol, so a test counts exactly what a process asks of the database
 *   (`pg_stat_database` lags by up to the statistics flush interval).
 */
import net from 'node:net';

/** The proxy: its URL (the database's, through it), the calls arming its faults, its counts. */
export interface PgProxy {
  /** The database's URL with the proxy's host and port: connect clients under test to it. */
  readonly url: string;
  /** Arms the next lost reply: the first server chunk carrying the command tag `tag`. */
  loseReplyCarrying(tag: string): void;
  /** How many replies were lost so far. */
  lostReplies(): number;
  /**
   * Arms a hold of the first client chunk carrying `text`; resolves once it is held, with the
   * function that sends it (and what followed it) on.
   */
  holdRequestCarrying(text: string): Promise<() => void>;
  /**
   * Arms an error reply to the first client chunk carrying `text` (a simple query): the proxy
   * answers it with an ErrorResponse of `sqlstate` and `message` and ReadyForQuery, and forwards
   * nothing of it; the connection stays open.
   */
  failStatementCarrying(text: string, sqlstate: string, message: string): void;
  /**
   * The connections open now drop everything from then on, both ways, and stay open: what a
   * client sees when the database's address moved at a failover, or a NAT or firewall forgot the
   * flow. Connections made later are forwarded as usual.
   */
  silenceOpen(): void;
  /** The statements and transactions sent since the last take (counting starts afresh). */
  takeCounts(): ProxyCounts;
  /** While `down`, connections are reset: the open ones at once, new ones as they come. */
  refuse(down: boolean): void;
  /** When (performance.now()) each connection refused so far was attempted. */
  readonly refusedAt: readonly number[];
  /** Destroys every proxied connection and stops listening. */
  close(): Promise<void>;
}

/** An ErrorResponse (severity ERROR) followed by ReadyForQuery (idle), as a server sends them. */
function errorReply(sqlstate: string, message: string): Buffer {
  const fields = Buffer.from(`SERROR\0VERROR\0C${sqlstate}\0M${message}\0\0`);
  const error = Buffer.alloc(5);
  error.write('E', 0);
  error.writeInt32BE(4 + fields.length, 1);
  const ready = Buffer.from([0x5a, 0, 0, 0, 5, 0x49]);
  return Buffer.concat([error, fields, ready]);
}

/** What the clients of a proxy sent: each statement's text, and the transactions. */
export interface ProxyCounts {
  /** Each statement's text, whitespace collapsed, in the order sent. */
  statements: string[];
  /** BEGIN … COMMIT/ROLLBACK, or a statement outside one. */
  transactions: number;
}

/**
 * Reads one connection's frontend messages as they pass: simple queries (Q) and executions (E)
 * of bound statements (P names a statement's text, B binds it) are statements.
 */
function frontendReader(counts: () => ProxyCounts): (chunk: Buffer) => void {
  let pending = Buffer.alloc(0);
  let startup = true;
  let inTransaction = false;
  const named = new Map<string, string>();
  let bound = '';
  const statement = (text: string) => {
    const into = counts();
    const word = text.trim().split(/\s+/)[0]?.toLowerCase() ?? '';
    into.statements.push(text.replace(/\s+/g, ' ').trim());
    if (word === 'begin') inTransaction = true;
    else if (word === 'commit' || word === 'rollback') {
      if (inTransaction) into.transactions += 1;
      inTransaction = false;
    } else if (!inTransaction) into.transactions += 1;
  };
  const cstring = (buf: Buffer, at: number): [string, number] => {
    const end = buf.indexOf(0, at);
    return [buf.toString('utf8', at, end), end + 1];
  };
  return (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    for (;;) {
      if (startup) {
        // StartupMessage, SSLRequest (80877103) or GSSENCRequest (80877104): no type byte.
        if (pending.length < 8) return;
        const len = pending.readInt32BE(0);
        if (pending.length < len) return;
        const code = pending.readInt32BE(4);
        pending = pending.subarray(len);
        if (code !== 80877103 && code !== 80877104) startup = false;
        continue;
      }
      if (pending.length < 5) return;
      const len = pending.readInt32BE(1);
      if (pending.length < 1 + len) return;
      const type = String.fromCharCode(pending[0] as number);
      const body = pending.subarray(5, 1 + len);
      pending = pending.subarray(1 + len);
      if (type === 'Q') statement(cstring(body, 0)[0]);
      else if (type === 'P') {
        const [name, at] = cstring(body, 0);
        named.set(name, cstring(body, at)[0]);
      } else if (type === 'B') {
        const [, at] = cstring(body, 0);
        bound = named.get(cstring(body, at)[0]) ?? '?';
      } else if (type === 'E') statement(bound);
    }
  };
}

/** Starts a proxy to the database at `databaseUrl` on a free loopback port. */
export async function startPgProxy(databaseUrl: string): Promise<PgProxy> {
  const target = new URL(databaseUrl);
  let lose: Buffer | null = null;
  let lost = 0;
  let hold: { text: Buffer; held: (release: () => void) => void } | null = null;
  let fail: { text: Buffer; reply: Buffer } | null = null;
  let down = false;
  const refusedAt: number[] = [];
  const sockets = new Set<net.Socket>();
  let counts: ProxyCounts = { statements: [], transactions: 0 };
  /** Silences each connection open now (see silenceOpen). */
  const silencers = new Set<() => void>();
  const server = net.createServer((client) => {
    if (down) {
      refusedAt.push(performance.now());
      client.on('error', () => {});
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    sockets.add(client);
    sockets.add(upstream);
    let queued: Buffer[] | null = null;
    let silent = false;
    const silence = () => {
      silent = true;
    };
    silencers.add(silence);
    const read = frontendReader(() => counts);
    client.on('data', (chunk: Buffer) => {
      if (silent) return;
      read(chunk);
      if (queued !== null) {
        queued.push(chunk);
        return;
      }
      if (fail !== null && chunk.includes(fail.text)) {
        client.write(fail.reply);
        fail = null;
        return;
      }
      if (hold !== null && chunk.includes(hold.text)) {
        const { held } = hold;
        hold = null;
        queued = [chunk];
        held(() => {
          for (const c of queued ?? []) upstream.write(c);
          queued = null;
        });
        return;
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (silent) return;
      if (lose !== null && chunk.includes(lose)) {
        lose = null;
        lost += 1;
        client.destroy();
        upstream.destroy();
        return;
      }
      client.write(chunk);
    });
    const end = () => {
      silencers.delete(silence);
      sockets.delete(client);
      sockets.delete(upstream);
      client.destroy();
      upstream.destroy();
    };
    for (const socket of [client, upstream]) {
      socket.on('error', end);
      socket.on('close', end);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(databaseUrl);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as net.AddressInfo).port);
  return {
    url: url.toString(),
    loseReplyCarrying(tag) {
      // A CommandComplete message ends its tag with a NUL.
      lose = Buffer.from(`${tag}\0`);
    },
    lostReplies: () => lost,
    holdRequestCarrying(text) {
      return new Promise((held) => {
        hold = { text: Buffer.from(text), held };
      });
    },
    failStatementCarrying(text, sqlstate, message) {
      fail = { text: Buffer.from(text), reply: errorReply(sqlstate, message) };
    },
    takeCounts() {
      const taken = counts;
      counts = { statements: [], transactions: 0 };
      return taken;
    },
    silenceOpen() {
      for (const silence of silencers) silence();
    },
    refuse(value) {
      down = value;
      if (value) for (const s of sockets) s.resetAndDestroy();
    },
    refusedAt,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
