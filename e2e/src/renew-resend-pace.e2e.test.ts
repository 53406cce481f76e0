/**
 * A dispatch renewal whose reply never comes — a server holding requests while its database is
 * down, or a reply black-holed on the way — is sent again at the heartbeat pace, not every
 * 50 ms. Past the lease's local expiry only the server's answer ends such a lease, and the
 * resend's due time (half the time left) was 0 from then on: each worker slot sent ~20 copies a
 * second, every one a new request held open until its timeout (review r35b).
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  client,
  type HttpProxy,
  RENEW_MS,
  Stack,
  shortWorker,
  sleep,
  startHttpProxy,
} from './test/harness.js';

const stack = new Stack('renew_resend');
let proxy: HttpProxy | undefined;
let release: () => void = () => {};
const held = new Promise<void>((resolve) => {
  release = resolve;
});

beforeAll(async () => {
  await stack.open();
});
afterAll(async () => {
  release();
  await proxy?.close();
  await stack.close();
});

it('resends an unanswered dispatch renewal once per heartbeat, past the lease expiry too', async () => {
  const server = await stack.start();
  const renewals: number[] = [];
  let open = 0;
  let maxOpen = 0;
  proxy = await startHttpProxy(server.url, {
    observe(request) {
      if (!request.path.startsWith('/v1/worker/renew')) return undefined;
      renewals.push(performance.now());
      open += 1;
      maxOpen = Math.max(maxOpen, open);
      return () => {
        open -= 1;
      };
    },
    hold: (request) => (request.path.startsWith('/v1/worker/renew') ? held : undefined),
  });
  const requestTimeoutMs = 5_000;
  const worker = shortWorker(proxy.url, 'resend', { requestTimeoutMs });
  let ran = 0;
  worker.register('job', async () => {
    ran += 1;
  });
  const running = worker.run();
  await client(server.url).submit({ queue: 'resend', program: 'job', data: null });
  await sleep(6_000);
  const first = renewals[0] ?? performance.now();
  // The 4 s from 1.5 s after the first send: the 1 s lease is past its local expiry throughout.
  const sentIn4s = renewals.filter((t) => t >= first + 1_500 && t < first + 5_500).length;
  release();
  await worker.stop({ graceMs: 0 });
  await running;
  expect(renewals.length).toBeGreaterThan(0);
  // No handler without a granted dispatch.
  expect(ran).toBe(0);
  // One copy per heartbeat (16 in 4 s), a couple more for timer drift; it was ~80.
  expect(sentIn4s).toBeLessThanOrEqual(4_000 / RENEW_MS + 3);
  // Open at once: the copies of one request timeout's span, plus the halving ones before the
  // expiry (about ten); it was ~100.
  expect(maxOpen).toBeLessThanOrEqual(requestTimeoutMs / RENEW_MS + 12);
});
