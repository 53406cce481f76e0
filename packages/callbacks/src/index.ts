/**
 * @module @ledgence/callbacks
 *
 * The completion-callback transport of Ledgence (DESIGN §8): operator
 * destinations (`LEDGENCE_CALLBACK_DESTINATIONS`), Standard Webhooks signing,
 * one delivery try of a compact CloudEvent with a connect timeout, a total
 * deadline, a bounded response read and no redirects, and the retry schedule
 * (capped exponential backoff with deterministic full jitter, `Retry-After`
 * as a floor, `exhausted` after COMPLETION_MAX_ATTEMPTS). Every try is a
 * plain {@link DeliveryOutcome} value, so the leasing loop records it without
 * catching anything.
 *
 * {@link createCompletionSender} is that loop: it leases due deliveries from
 * a `CompletionStore` (`@ledgence/core`), posts them concurrently, and
 * reports each outcome as soon as its try ends (tries that end together in
 * one store call) — never holding a transaction across network I/O. The example below makes one try by hand.
 *
 * @example
 * ```ts
 * import { createServer } from 'node:http';
 * import { buildCompletionEvent } from '@ledgence/contracts';
 * import { deliverEvent, encodeCompletionEvent, nextDeliveryState, parseDestinations }
 *   from '@ledgence/callbacks';
 *
 * const receiver = createServer((req, res) => req.resume().on('end', () => res.end()));
 * await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
 * const { port } = receiver.address() as { port: number };
 *
 * const destinations = parseDestinations(JSON.stringify({
 *   billing: { url: `http://127.0.0.1:${port}/hooks`,
 *              secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`, timeout_ms: 2000 },
 * }));
 * const event = encodeCompletionEvent(buildCompletionEvent({
 *   scope: { tenant_id: 'acme', namespace: 'prod' }, queue: 'email', task_id: 'tsk_1',
 *   run_id: 'run_1', state: 'succeeded', event_id: 'evt_1', time: Date.now() }));
 *
 * const outcome = await deliverEvent({ destination: destinations.get('billing')!, event });
 * console.log(outcome); // → { kind: 'delivered', status: 200 }
 * console.log(nextDeliveryState({ outcome, attempt: 1, eventId: event.id }));
 * // → { state: 'delivered' }
 * receiver.close();
 * ```
 */

export {
  isExhausted,
  type NextDeliveryDelayOptions,
  type NextDeliveryState,
  type NextDeliveryStateOptions,
  nextDeliveryDelayMs,
  nextDeliveryState,
} from './backoff.js';
export {
  CLOUDEVENTS_CONTENT_TYPE,
  DEFAULT_CONNECT_TIMEOUT_MS,
  type DeliverEventOptions,
  type DeliveredOutcome,
  type DeliveryOutcome,
  deliverEvent,
  type EncodedEvent,
  encodeCompletionEvent,
  type GoneOutcome,
  parseRetryAfterMs,
  type RetryOutcome,
  type RetryReason,
} from './deliver.js';
export {
  createDestination,
  DESTINATION_DEFAULT_TIMEOUT_MS,
  DESTINATION_MAX_TIMEOUT_MS,
  DESTINATION_MIN_TIMEOUT_MS,
  DESTINATION_URL_MAX_BYTES,
  type Destination,
  type DestinationOptions,
  type DestinationProblem,
  type Destinations,
  DestinationsError,
  type DestinationsErrorOptions,
  type ParseDestinationsOptions,
  parseDestinations,
  WEBHOOK_SECRET_MIN_BYTES,
  WEBHOOK_SECRET_PREFIX,
} from './destinations.js';
export {
  type CompletionSender,
  type CompletionSenderOptions,
  type CompletionSenderStopOptions,
  createCompletionSender,
  DEFAULT_IDLE_INTERVAL_MS,
  type DeliveryFailureReason,
  type DeliveryRecord,
  type DeliveryRecordOutcome,
  type LogFields,
  REPORT_MARGIN_MS,
  type SenderLogger,
  type SenderPassResult,
  UNCONFIGURED_GRACE_LEASES,
} from './sender.js';
export {
  type SignWebhookOptions,
  signWebhook,
  type WebhookHeaders,
  webhookHeaders,
} from './signature.js';
