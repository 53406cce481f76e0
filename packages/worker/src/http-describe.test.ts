/**
 * The message of a TransportError says why the request failed. Node 20
 * connects with `autoSelectFamily`: a host that resolves to several addresses (`localhost` to
 * both ::1 and 127.0.0.1 on most machines) fails with an `AggregateError` whose own message is
 * empty, the reasons being in its `errors` — as `node:http` reports it, or wrapped by `fetch`.
 */
import { WorkerSessionSchema } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { TransportError } from './errors.js';
import { type FetchLike, HttpTransport } from './http.js';

function refused(): AggregateError {
  const errors = ['127.0.0.1', '::1'].map((address) =>
    Object.assign(new Error(`connect ECONNREFUSED ${address}:8080`), { code: 'ECONNREFUSED' }),
  );
  return Object.assign(new AggregateError(errors), { code: 'ECONNREFUSED' });
}

async function failure(fetch: FetchLike): Promise<unknown> {
  const http = new HttpTransport({ url: 'http://localhost:8080', fetch, requestTimeoutMs: 1_000 });
  return http
    .request({ method: 'GET', path: '/x', schema: WorkerSessionSchema, maxBytes: 1_000 })
    .catch((e: unknown) => e);
}

describe('TransportError messages', () => {
  it('name the reason of a connection refused on every address of the host', async () => {
    const bare = await failure(async () => {
      throw refused();
    });
    expect(bare).toBeInstanceOf(TransportError);
    expect((bare as Error).message).toMatch(/failed: .*ECONNREFUSED/);
    const wrapped = await failure(async () => {
      throw new TypeError('fetch failed', { cause: refused() });
    });
    expect(wrapped).toBeInstanceOf(TransportError);
    expect((wrapped as Error).message).toMatch(/fetch failed \(.*ECONNREFUSED.*\)/);
  });
});
