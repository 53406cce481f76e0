/**
 * Local `node:http` servers that stand in for the Ledgence server (or a gateway in front of it)
 * in the SDK's wire tests: each listens on 127.0.0.1 and is closed, its sockets destroyed, after
 * every test of the file that asked for them.
 */
import type { Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { afterEach } from 'vitest';

/** What {@link stubServers} gives a test file. */
export interface StubServers {
  /** Listens `server` on a free port of 127.0.0.1 and returns its base URL. */
  listen(server: Server): Promise<string>;
}

/**
 * Call at a test file's top level: registers the teardown. Its `afterEach` is registered then, so
 * a file's own later `afterEach` (stopping workers, say) runs before the servers close.
 */
export function stubServers(): StubServers {
  const servers: Server[] = [];
  const sockets = new Set<Socket>();
  afterEach(async () => {
    for (const socket of sockets) socket.destroy();
    sockets.clear();
    await Promise.all(
      servers.splice(0).map(
        (server) =>
          new Promise<void>((resolve) => {
            server.closeAllConnections();
            server.close(() => resolve());
          }),
      ),
    );
  });
  return {
    async listen(server) {
      server.on('connection', (socket) => {
        sockets.add(socket);
        socket.on('close', () => sockets.delete(socket));
      });
      servers.push(server);
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    },
  };
}
