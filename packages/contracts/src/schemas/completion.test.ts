import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import {
  COMPLETION_MAX_GENERATION,
  DESTINATION_ALIAS_MAX_BYTES,
  KEY_MAX_BYTES,
} from '../limits.js';
import {
  CompletionEventSchema,
  CompletionRetryCommandSchema,
  CompletionSubscribeCommandSchema,
  CompletionSubscriptionSchema,
} from './index.js';
import { completionEvent, completionSubscription } from './testdata/examples.js';

const ok = (schema: v.GenericSchema, value: unknown) => v.safeParse(schema, value).success;

describe('CompletionSubscribeCommand', () => {
  it('bounds the subscription key and the destination alias', () => {
    const key = 'k'.repeat(KEY_MAX_BYTES);
    const alias = 'd'.repeat(DESTINATION_ALIAS_MAX_BYTES);
    const subscribe = (subscription_key: string, destination: string) =>
      ok(CompletionSubscribeCommandSchema, { subscription_key, destination });
    expect(subscribe(key, alias)).toBe(true);
    expect(subscribe(`${key}k`, 'billing')).toBe(false);
    expect(subscribe('k', `${alias}d`)).toBe(false);
    expect(subscribe('k', '')).toBe(false);
  });

  it('never accepts a URL field', () => {
    expect(
      ok(CompletionSubscribeCommandSchema, {
        subscription_key: 'k',
        destination: 'billing',
        url: 'http://169.254.169.254/',
      }),
    ).toBe(false);
  });
});

describe('CompletionRetryCommand', () => {
  it('generation is 1..COMPLETION_MAX_GENERATION', () => {
    const retry = (generation: unknown) => ok(CompletionRetryCommandSchema, { generation });
    expect(retry(1)).toBe(true);
    expect(retry(COMPLETION_MAX_GENERATION)).toBe(true);
    expect(retry(0)).toBe(false);
    expect(retry(COMPLETION_MAX_GENERATION + 1)).toBe(false);
    expect(retry('1')).toBe(false);
  });
});

describe('CompletionSubscription', () => {
  it('optional delivery fields are omitted, never null', () => {
    for (const key of ['next_attempt_at', 'delivered_at', 'last_status_code', 'last_error']) {
      expect(
        ok(CompletionSubscriptionSchema, { ...completionSubscription, [key]: null }),
        key,
      ).toBe(false);
    }
  });

  it('last_status_code is a three-digit status', () => {
    const withStatus = (last_status_code: number) =>
      ok(CompletionSubscriptionSchema, { ...completionSubscription, last_status_code });
    expect(withStatus(100)).toBe(true);
    expect(withStatus(999)).toBe(true);
    expect(withStatus(99)).toBe(false);
    expect(withStatus(1000)).toBe(false);
  });
});

describe('CompletionEvent', () => {
  const event = (patch: Record<string, unknown>) => ({ ...completionEvent, ...patch });

  it('has the fixed completed type', () => {
    expect(ok(CompletionEventSchema, event({ type: 'dev.ledgence.task.attempt' }))).toBe(false);
  });

  it('subject must be the task id of its data', () => {
    expect(ok(CompletionEventSchema, event({ subject: 'tsk_other' }))).toBe(false);
  });

  it('reports a terminal state only, and no result copy', () => {
    const data = (patch: Record<string, unknown>) =>
      event({ data: { ...completionEvent.data, ...patch } });
    expect(ok(CompletionEventSchema, data({ state: 'failed' }))).toBe(true);
    expect(ok(CompletionEventSchema, data({ state: 'active' }))).toBe(false);
    expect(ok(CompletionEventSchema, data({ output: { secret: 1 } }))).toBe(false);
  });
});
