import {
  buildCompletionEvent,
  COMPLETION_MAX_RETRY_DELAY_MS,
  type CompletionEvent,
  ContractError,
  canonicalJson,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { encodeCompletionEvent, parseRetryAfterMs } from './deliver.js';

const event: CompletionEvent = buildCompletionEvent({
  scope: { tenant_id: 'acme', namespace: 'prod' },
  queue: 'email',
  task_id: 'tsk_1',
  run_id: 'run_1',
  state: 'failed',
  event_id: 'evt_1',
  time: Date.UTC(2026, 10, 29),
});

describe('encodeCompletionEvent', () => {
  it('is the compact canonical JSON, the same bytes every time and from any key order', () => {
    const encoded = encodeCompletionEvent(event);
    expect(encoded.id).toBe('evt_1');
    expect(encoded.body.toString('utf8')).toBe(canonicalJson(event));
    expect(encoded.body.toString('utf8')).not.toMatch(/\s/);
    const reordered = Object.fromEntries(Object.entries(event).reverse()) as CompletionEvent;
    expect(encodeCompletionEvent(reordered).body.equals(encoded.body)).toBe(true);
    expect(JSON.parse(encoded.body.toString('utf8'))).toEqual(event);
  });

  it('refuses an event that breaks the schema', () => {
    const bad = { ...event, data: { ...event.data, output: { copy: 1 } } } as CompletionEvent;
    expect(() => encodeCompletionEvent(bad)).toThrow(ContractError);
  });
});

describe('parseRetryAfterMs', () => {
  const now = Date.UTC(2015, 9, 21, 7, 27, 0);

  it('reads delay-seconds', () => {
    expect(parseRetryAfterMs('7', now)).toBe(7_000);
    expect(parseRetryAfterMs(' 0 ', now)).toBe(0);
    expect(parseRetryAfterMs('120', now)).toBe(120_000);
  });

  it('reads the three HTTP-date forms', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:28:00 GMT', now)).toBe(60_000);
    expect(parseRetryAfterMs('Wednesday, 21-Oct-15 07:28:00 GMT', now)).toBe(60_000);
    // asctime() carries no zone but means GMT, whatever the local time zone is.
    expect(parseRetryAfterMs('Wed Oct 21 07:28:00 2015', now)).toBe(60_000);
    expect(parseRetryAfterMs('Wed Oct  1 07:28:00 2015', Date.UTC(2015, 9, 1, 7, 27))).toBe(60_000);
  });

  it('gives 0 for a date in the past and caps long delays', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:00:00 GMT', now)).toBe(0);
    expect(parseRetryAfterMs('999999', now)).toBe(COMPLETION_MAX_RETRY_DELAY_MS);
    expect(parseRetryAfterMs('9'.repeat(400), now)).toBe(COMPLETION_MAX_RETRY_DELAY_MS);
    expect(parseRetryAfterMs('Fri, 31 Dec 9999 23:59:59 GMT', now)).toBe(
      COMPLETION_MAX_RETRY_DELAY_MS,
    );
  });

  it('ignores what is absent or malformed, falling back to the backoff', () => {
    for (const value of [undefined, '', 'soon', '-5', '7.5', '1e3', '0x10', 'Wed, 99 Foo 2015']) {
      expect(parseRetryAfterMs(value, now)).toBeUndefined();
    }
  });
});
