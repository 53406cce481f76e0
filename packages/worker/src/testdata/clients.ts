/** The `Client` as the SDK's wire tests make it. */
import { Client, type ClientOptions } from '../client.js';
import { silentLogger } from '../logger.js';

/**
 * A `Client` of `url` for tenant `acme`, namespace `prod`, logging nothing and backing off 5–10 ms
 * between retries, so a test's retries take no time; `extra` replaces any of these.
 */
export function clientOf(url: string, extra: Partial<ClientOptions> = {}): Client {
  return new Client({
    url,
    tenant: 'acme',
    namespace: 'prod',
    logger: silentLogger,
    backoff: { baseMs: 5, maxMs: 10 },
    ...extra,
  });
}
