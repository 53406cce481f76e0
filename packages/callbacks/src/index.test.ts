import { expect, it } from 'vitest';
import * as callbacks from './index.js';

it('exports exactly the public surface', () => {
  expect(Object.keys(callbacks).sort()).toEqual([
    'CLOUDEVENTS_CONTENT_TYPE',
    'DEFAULT_CONNECT_TIMEOUT_MS',
    'DEFAULT_IDLE_INTERVAL_MS',
    'DESTINATION_DEFAULT_TIMEOUT_MS',
    'DESTINATION_MAX_TIMEOUT_MS',
    'DESTINATION_MIN_TIMEOUT_MS',
    'DESTINATION_URL_MAX_BYTES',
    'DestinationsError',
    'REPORT_MARGIN_MS',
    'UNCONFIGURED_GRACE_LEASES',
    'WEBHOOK_SECRET_MIN_BYTES',
    'WEBHOOK_SECRET_PREFIX',
    'createCompletionSender',
    'createDestination',
    'deliverEvent',
    'encodeCompletionEvent',
    'isExhausted',
    'nextDeliveryDelayMs',
    'nextDeliveryState',
    'parseDestinations',
    'parseRetryAfterMs',
    'signWebhook',
    'webhookHeaders',
  ]);
});
