import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import {
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  MAX_LABELS,
  MESSAGE_MAX_BYTES,
  NAME_MAX_BYTES,
  SCOPE_TEXT_MAX_BYTES,
} from '../limits.js';
import {
  CounterSchema,
  intRange,
  isRfc3339UtcTime,
  itemCount,
  LabelsSchema,
  messageField,
  NameSchema,
  ProgramDescriptorSchema,
  ScopeSchema,
  TimestampSchema,
  TraceContextSchema,
  textField,
} from './index.js';
import { trace } from './testdata/examples.js';

const ok = (schema: v.GenericSchema, value: unknown) => v.safeParse(schema, value).success;
const firstMessage = (schema: v.GenericSchema, value: unknown) =>
  v.safeParse(schema, value).issues?.[0]?.message;

describe('text(maxBytes)', () => {
  const name = textField(NAME_MAX_BYTES);

  it('accepts exactly the byte limit and rejects one byte more (ASCII)', () => {
    expect(ok(name, 'a'.repeat(NAME_MAX_BYTES))).toBe(true);
    expect(ok(name, 'a'.repeat(NAME_MAX_BYTES + 1))).toBe(false);
  });

  it('counts UTF-8 bytes, not UTF-16 units', () => {
    // 'é' is 2 bytes, '😀' is 4 bytes (2 UTF-16 units).
    expect(ok(name, 'é'.repeat(NAME_MAX_BYTES / 2))).toBe(true);
    expect(ok(name, `${'é'.repeat(NAME_MAX_BYTES / 2)}a`)).toBe(false);
    expect(ok(name, '😀'.repeat(NAME_MAX_BYTES / 4))).toBe(true);
    expect(ok(name, `${'😀'.repeat(NAME_MAX_BYTES / 4)}a`)).toBe(false);
  });

  it.each([
    ['empty', ''],
    ['leading space', ' email'],
    ['trailing space', 'email '],
    ['trailing no-break space', 'email\u00a0'],
    ['leading BOM', '\ufeffemail'],
    ['a newline', 'e\nmail'],
    ['a NUL', 'e\u0000mail'],
    ['a C1 control', 'e\u0085mail'],
    ['a lone surrogate', 'e\ud800mail'],
  ])('rejects %s', (_what, value) => {
    expect(ok(name, value)).toBe(false);
  });

  it('accepts inner spaces and any non-control Unicode', () => {
    expect(ok(name, 'send email — ünïcødé 😀')).toBe(true);
  });

  it('rejects non-strings with a message that names the type only', () => {
    expect(ok(name, 42)).toBe(false);
    expect(ok(name, null)).toBe(false);
  });

  it('reports the rule without echoing the value', () => {
    const message = firstMessage(name, ' secret-value ');
    expect(message).toBe('must not start or end with whitespace');
  });

  it('scope fields allow SCOPE_TEXT_MAX_BYTES', () => {
    const at = 't'.repeat(SCOPE_TEXT_MAX_BYTES);
    expect(ok(ScopeSchema, { tenant_id: at, namespace: at })).toBe(true);
    expect(ok(ScopeSchema, { tenant_id: `${at}t`, namespace: 'prod' })).toBe(false);
    expect(ok(ScopeSchema, { tenant_id: 'acme', namespace: `${at}n` })).toBe(false);
  });
});

describe('messageField', () => {
  const message = messageField(MESSAGE_MAX_BYTES);

  it('accepts newlines, tabs, edge whitespace and the empty string', () => {
    expect(ok(message, '')).toBe(true);
    expect(ok(message, '  line one\n\tline two\r\n')).toBe(true);
  });

  it('accepts exactly MESSAGE_MAX_BYTES and rejects one more', () => {
    expect(ok(message, 'é'.repeat(MESSAGE_MAX_BYTES / 2))).toBe(true);
    expect(ok(message, `${'é'.repeat(MESSAGE_MAX_BYTES / 2)}a`)).toBe(false);
  });

  it('rejects lone surrogates', () => {
    expect(ok(message, 'broken \udc00')).toBe(false);
  });
});

describe('numbers', () => {
  it('intRange accepts its inclusive bounds only, integers only', () => {
    const range = intRange(-3, 7);
    expect(ok(range, -3)).toBe(true);
    expect(ok(range, 7)).toBe(true);
    expect(ok(range, -4)).toBe(false);
    expect(ok(range, 8)).toBe(false);
    expect(ok(range, 1.5)).toBe(false);
    expect(ok(range, '1')).toBe(false);
    expect(firstMessage(range, 99)).toBe('must be an integer from -3 to 7');
  });

  it.each([CounterSchema, TimestampSchema])(
    'counters and timestamps are safe integers >= 0',
    (schema) => {
      expect(ok(schema, 0)).toBe(true);
      expect(ok(schema, Number.MAX_SAFE_INTEGER)).toBe(true);
      for (const bad of [
        -1,
        0.5,
        Number.MAX_SAFE_INTEGER + 1,
        Number.NaN,
        Number.POSITIVE_INFINITY,
      ]) {
        expect(ok(schema, bad)).toBe(false);
      }
    },
  );

  it('itemCount bounds array length', () => {
    const list = v.pipe(v.array(v.number()), itemCount(1, 2));
    expect(ok(list, [])).toBe(false);
    expect(ok(list, [1])).toBe(true);
    expect(ok(list, [1, 2])).toBe(true);
    expect(ok(list, [1, 2, 3])).toBe(false);
  });
});

describe('LabelsSchema', () => {
  const labelsOf = (count: number) =>
    Object.fromEntries(Array.from({ length: count }, (_, i) => [`k${i}`, `v${i}`]));

  it('accepts exactly MAX_LABELS pairs and rejects one more', () => {
    expect(ok(LabelsSchema, labelsOf(MAX_LABELS))).toBe(true);
    expect(ok(LabelsSchema, labelsOf(MAX_LABELS + 1))).toBe(false);
    expect(ok(LabelsSchema, {})).toBe(true);
  });

  it('bounds key and value bytes exactly', () => {
    const key = 'k'.repeat(LABEL_KEY_MAX_BYTES);
    const value = 'v'.repeat(LABEL_VALUE_MAX_BYTES);
    expect(ok(LabelsSchema, { [key]: value })).toBe(true);
    expect(ok(LabelsSchema, { [`${key}k`]: 'x' })).toBe(false);
    expect(ok(LabelsSchema, { k: `${value}v` })).toBe(false);
  });

  it('applies the text rule to keys and values', () => {
    expect(ok(LabelsSchema, { ' k': 'v' })).toBe(false);
    expect(ok(LabelsSchema, { k: 'v\n' })).toBe(false);
    expect(ok(LabelsSchema, { k: 1 })).toBe(false);
  });

  it('rejects the keys the strict JSON decoder rejects, instead of dropping them', () => {
    for (const key of ['__proto__', 'constructor', 'prototype']) {
      const labels = JSON.parse(`{"${key}": "x"}`) as unknown;
      expect(ok(LabelsSchema, labels), key).toBe(false);
    }
  });

  it('reports a bad value at its key and a bad key without echoing it', () => {
    const badValue = v.safeParse(LabelsSchema, { team: '' });
    expect(badValue.issues?.[0]?.path?.map((item) => item.key)).toEqual(['team']);
    const badKey = v.safeParse(LabelsSchema, { ' secret ': 'x' });
    expect(badKey.issues?.[0]?.path).toBeUndefined();
    expect(badKey.issues?.[0]?.message).not.toContain('secret');
  });

  it('returns a fresh object', () => {
    const input = { team: 'growth' };
    const output = v.parse(LabelsSchema, input);
    expect(output).toEqual(input);
    expect(output).not.toBe(input);
  });
});

describe('request objects normalise null optional fields to absent', () => {
  it('drops a null tracestate', () => {
    const output = v.parse(TraceContextSchema, {
      traceparent: trace.traceparent,
      tracestate: null,
    });
    expect(output).toStrictEqual({ traceparent: trace.traceparent });
    expect('tracestate' in output).toBe(false);
  });

  it('drops a null program version; a replay spelled either way is equal', () => {
    const a = v.parse(ProgramDescriptorSchema, { name: 'send-email', version: null });
    const b = v.parse(ProgramDescriptorSchema, { name: 'send-email' });
    expect(a).toStrictEqual(b);
  });

  it('rejects arrays and class instances where an object is expected', () => {
    expect(ok(ProgramDescriptorSchema, [])).toBe(false);
    expect(ok(ProgramDescriptorSchema, new Date())).toBe(false);
  });

  it('still rejects unknown fields', () => {
    expect(ok(ProgramDescriptorSchema, { name: 'x', extra: null })).toBe(false);
  });
});

describe('isRfc3339UtcTime', () => {
  it.each([
    '2024-05-01T12:00:00Z',
    '2024-05-01T12:00:00.000Z',
    '2024-05-01T12:00:00.123456789Z',
    '2000-02-29T00:00:00Z',
    '0000-02-29T00:00:00Z',
    '1970-01-01T00:00:00.000Z',
    '9999-12-31T23:59:59.999Z',
  ])('accepts %s', (value) => {
    expect(isRfc3339UtcTime(value)).toBe(true);
  });

  it.each([
    '1900-02-29T00:00:00Z',
    '2024-04-31T00:00:00Z',
    '2024-00-10T00:00:00Z',
    '2024-05-00T00:00:00Z',
    '2024-05-01t12:00:00Z',
    '2024-05-01T12:00:00z',
    '2024-05-01T12:00:00.1234567890Z',
    '2024-05-01T12:00Z',
    '2024-05-01T12:00:00',
    ' 2024-05-01T12:00:00Z',
  ])('rejects %s', (value) => {
    expect(isRfc3339UtcTime(value)).toBe(false);
  });

  it('round-trips every toISOString of a store timestamp', () => {
    for (const ms of [0, 1, 951_782_400_000, 1_714_564_800_123, 253_402_300_799_999]) {
      expect(isRfc3339UtcTime(new Date(ms).toISOString())).toBe(true);
    }
  });
});

describe('NameSchema', () => {
  it('is the NAME_MAX_BYTES text rule', () => {
    expect(ok(NameSchema, 'n'.repeat(NAME_MAX_BYTES))).toBe(true);
    expect(ok(NameSchema, 'n'.repeat(NAME_MAX_BYTES + 1))).toBe(false);
  });
});
