/**
 * The completion-callback destination of a chaos run: a local HTTP receiver that logs every POST
 * (webhook id, task, state) to JSONL and answers 200. Delivery is at-least-once, so a repeated
 * webhook id is counted, not refused.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { JsonlLog } from './jsonl.js';
import type { DeliveryRecord } from './model.js';

/** A running receiver. */
export interface Receiver {
  /** The URL to configure as the destination. */
  readonly url: string;
  /** Distinct webhook ids received so far. */
  readonly ids: Set<string>;
  close(): Promise<void>;
}

/** Starts a receiver logging to `logPath`. */
export async function startReceiver(logPath: string): Promise<Receiver> {
  const log = new JsonlLog(logPath);
  const ids = new Set<string>();
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('error', () => {});
    request.on('end', () => {
      const id = String(request.headers['webhook-id']);
      let event: { data?: { task_id?: string; state?: string } } = {};
      try {
        event = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        // Logged with empty fields: the checker then reports the delivery as unmatched.
      }
      log.append({
        webhook_id: id,
        task_id: event.data?.task_id ?? '',
        state: event.data?.state ?? '',
        at: Date.now(),
      } satisfies DeliveryRecord);
      ids.add(id);
      response.writeHead(200).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    ids,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
