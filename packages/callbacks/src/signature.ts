/**
 * Standard Webhooks signing (https://www.standardwebhooks.com): the receiver
 * checks `webhook-signature` = `v1,` + base64 HMAC-SHA256 over
 * `"{webhook-id}.{webhook-timestamp}.{body}"` with the shared key. The id is
 * the CloudEvent id, identical on every try, so receivers dedupe by it; the
 * timestamp is the time of each try, so receivers can refuse stale replays.
 */
import { createHmac } from 'node:crypto';

/** The three Standard Webhooks headers of one try. */
export interface WebhookHeaders {
  /** The event id: the CloudEvent `id`, identical on every try and redelivery. */
  'webhook-id': string;
  /** Unix seconds of this try, as decimal text. */
  'webhook-timestamp': string;
  /** `v1,<base64 HMAC-SHA256>` of `id.timestamp.body`. */
  'webhook-signature': string;
}

/** Options of {@link signWebhook} and {@link webhookHeaders}. */
export interface SignWebhookOptions {
  /** The webhook id (the CloudEvent id): visible ASCII, as it travels in a header. */
  id: string;
  /** Unix seconds of this try: a non-negative safe integer. */
  timestampSeconds: number;
  /** The exact body bytes sent (a string is taken as UTF-8). */
  body: Uint8Array | string;
  /** The signing key: the decoded bytes after `whsec_`, not the `whsec_…` text. */
  secret: Uint8Array;
}

// Header-safe and unambiguous: no spaces, controls or non-ASCII (Node would refuse them).
const HEADER_TOKEN = /^[\x21-\x7e]+$/;

/**
 * The `webhook-signature` value of one try: `v1,` + base64 of
 * HMAC-SHA256(secret, `id.timestamp.body`). Throws a `TypeError` for an id
 * that cannot travel in a header, a bad timestamp or an empty key — caller
 * bugs, not delivery conditions.
 *
 * @example
 * signWebhook({ id: 'evt_1', timestampSeconds: 1_700_000_000, body: '{}', secret: key });
 * // → 'v1,' followed by 44 base64 characters
 */
export function signWebhook(options: SignWebhookOptions): string {
  const { id, timestampSeconds, body, secret } = options;
  if (!HEADER_TOKEN.test(id)) {
    throw new TypeError('webhook id must be non-empty visible ASCII');
  }
  if (!Number.isSafeInteger(timestampSeconds) || timestampSeconds < 0) {
    throw new TypeError('webhook timestamp must be a non-negative integer of unix seconds');
  }
  if (secret.byteLength === 0) throw new TypeError('webhook signing key must not be empty');
  const mac = createHmac('sha256', secret);
  mac.update(`${id}.${timestampSeconds}.`, 'utf8');
  mac.update(typeof body === 'string' ? Buffer.from(body, 'utf8') : body);
  return `v1,${mac.digest('base64')}`;
}

/**
 * The three Standard Webhooks headers of one try, signed with
 * {@link signWebhook}.
 *
 * @example
 * const headers = webhookHeaders({ id: event.id, timestampSeconds: Math.floor(Date.now() / 1000),
 *                                  body, secret: destination.secret });
 */
export function webhookHeaders(options: SignWebhookOptions): WebhookHeaders {
  return {
    'webhook-id': options.id,
    'webhook-timestamp': String(options.timestampSeconds),
    'webhook-signature': signWebhook(options),
  };
}
