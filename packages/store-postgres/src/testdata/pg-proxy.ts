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
 */
import net from 'node:net';

/** The proxy: its URL (the database's, through the proxy) and its two arming calls. */
export interface PgProxy {
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
  close(): Promise<void>;
}

/** Starts a proxy to the database at `databaseUrl` on a free loopback port. */
export async function startPgProxy(databaseUrl: string): Promise<PgProxy> {
  const target = new URL(databaseUrl);
  let lose: Buffer | null = null;
  let lost = 0;
  let hold: { text: Buffer; held: (release: () => void) => void } | null = null;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    sockets.add(client);
    sockets.add(upstream);
    let queued: Buffer[] | null = null;
    client.on('data', (chunk: Buffer) => {
      if (queued !== null) {
        queued.push(chunk);
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
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
