/**
 * deliverEvent must never end the sender's process, whatever the receiver does with the
 * connection: a receiver's misbehaviour is a failed try at worst, never an uncaught exception.
 */
import { globalAgent } from 'node:http';
import { createServer, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { COMPLETION_EVENT_MAX_BYTES } from '@ledgence/contracts';
import { afterEach, describe, expect, it } from 'vitest';
import { deliverEvent, type EncodedEvent } from './deliver.js';
import { createDestination } from './destinations.js';

const OK = 'HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0)) cleanup();
});

describe('deliverEvent and a receiver that never reads', () => {
  it('raises no uncaught error when the receiver answers 2xx, leaves the bodies unread and closes', async () => {
    // A receiver answering 200 (keep-alive) without reading request bodies: on the reused
    // connection the unread bytes fill the buffers until a POST's write stays pending after its
    // 200 came. The receiver then closes (FIN, then a reset). The pending write's broken pipe
    // is reported after node:http freed the socket (taking its 'error' listener off) and the
    // global agent destroyed it, not writable, without adding one: an uncaught exception that
    // ended the server's process. Over a slow network a single event's write can stay pending.
    const sockets: Socket[] = [];
    const server = createServer((socket) => {
      sockets.push(socket);
      socket.setNoDelay(true);
      socket.on('error', () => {});
      let head = '';
      const onData = (chunk: Buffer) => {
        head += chunk.toString('latin1');
        if (!head.includes('\r\n\r\n')) return;
        // Never read again: every later request's bytes stay in the buffers.
        socket.off('data', onData);
        socket.pause();
        socket.write(OK);
      };
      socket.on('data', onData);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => {
      for (const socket of sockets) socket.destroy();
      server.close();
    });
    const port = (server.address() as { port: number }).port;
    const destination = createDestination({
      alias: 'unread',
      url: `http://127.0.0.1:${port}/events`,
      secret: Buffer.alloc(32, 0x5a),
      timeoutMs: 5_000,
    });
    // The largest event the sender posts: the fewest tries to fill the buffers.
    const body = Buffer.alloc(COMPLETION_EVENT_MAX_BYTES, 'x');
    const agentKey = globalAgent.getName({ host: '127.0.0.1', port });
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown) => uncaught.push(error);
    process.on('uncaughtException', onUncaught);
    try {
      let stuck = false;
      // The buffers hold a few MB on loopback (tcp_wmem's max); this bound is far beyond.
      for (let i = 0; i < 20_000 && !stuck; i++) {
        const event: EncodedEvent = { id: `evt_${i}`, body };
        const outcome = deliverEvent({ destination, event });
        if (i > 0) {
          // The connection is reused: the POST is on it after a turn; answer it unread.
          await new Promise(setImmediate);
          sockets[0]?.write(OK);
        }
        expect(await outcome).toEqual({ kind: 'delivered', status: 200 });
        await new Promise(setImmediate);
        // Answered, yet not back in the pool: its write is pending.
        stuck = (globalAgent.freeSockets[agentKey]?.length ?? 0) === 0;
      }
      expect(stuck).toBe(true);
      expect(sockets).toHaveLength(1);
      sockets[0]?.end();
      await sleep(20);
      sockets[0]?.resetAndDestroy();
      // The broken pipe is reported a few ticks after the reset.
      await sleep(100);
    } finally {
      process.off('uncaughtException', onUncaught);
    }
    expect(uncaught).toEqual([]);
  });
});
