/**
 * Table-driven checks of every exported schema: its full valid example is
 * accepted (and parses to itself), each required field missing is rejected,
 * an unknown field is rejected; union variants are tested one by one. The
 * required keys come from the schema's own `entries`, so a new field is
 * covered without editing this file.
 */
import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import * as schemas from './index.js';
import { EXAMPLES, type SchemaExample } from './testdata/examples.js';

type Entries = Record<string, v.GenericSchema & { type: string }>;

const OPTIONAL_TYPES = new Set(['optional', 'exact_optional', 'nullish']);

interface ObjectLike {
  entries?: Entries;
  type: string;
  key?: string;
  options?: readonly ObjectLike[];
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The object entries an example is checked against: the schema's own, or for
 * a variant the option whose discriminator accepts the example's tag.
 */
function entriesFor(schema: ObjectLike, example: unknown): Entries | undefined {
  if (schema.entries !== undefined) return schema.entries;
  if (schema.type !== 'variant' || schema.key === undefined || !isRecord(example)) return undefined;
  const tag = example[schema.key];
  for (const option of schema.options ?? []) {
    const discriminator = option.entries?.[schema.key];
    if (discriminator !== undefined && v.safeParse(discriminator, tag).success) {
      return entriesFor(option, example);
    }
    if (option.type === 'variant') {
      const nested = entriesFor(option, example);
      if (nested !== undefined) return nested;
    }
  }
  return undefined;
}

function label(row: SchemaExample): string {
  return row.variant === undefined ? row.name : `${row.name} (${row.variant})`;
}

describe.each(EXAMPLES.map((row) => [label(row), row] as const))('%s', (_name, row) => {
  const { schema, example } = row;
  const entries = entriesFor(schema as unknown as ObjectLike, example);

  it('accepts its full valid example and parses it to an equal value', () => {
    const result = v.safeParse(schema, example);
    expect(result.issues).toBeUndefined();
    expect(result.output).toStrictEqual(example);
  });

  if (entries === undefined) {
    it.each((row.invalid ?? []).map((value, i) => [i, value] as const))(
      'rejects invalid value #%i',
      (_i, value) => {
        expect(v.safeParse(schema, value).success).toBe(false);
      },
    );
    it('is a non-object schema with invalid examples', () => {
      expect(row.invalid?.length ?? 0).toBeGreaterThan(0);
    });
    return;
  }

  const required = Object.keys(entries).filter(
    (key) => !OPTIONAL_TYPES.has(entries[key]?.type ?? ''),
  );
  const optional = Object.keys(entries).filter((key) => !required.includes(key));

  it('example holds every field except the ones it declares omitted', () => {
    const record = example as Record<string, unknown>;
    const missing = Object.keys(entries).filter((key) => !(key in record));
    expect(missing.sort()).toEqual([...(row.omitted ?? [])].sort());
  });

  it.each(required)('rejects the example without required field %s', (key) => {
    const copy: Record<string, unknown> = { ...(example as Record<string, unknown>) };
    delete copy[key];
    expect(v.safeParse(schema, copy).success).toBe(false);
  });

  if (optional.length > 0) {
    it.each(optional)('accepts the example without optional field %s', (key) => {
      const copy: Record<string, unknown> = { ...(example as Record<string, unknown>) };
      const group = row.coupled?.find((keys) => keys.includes(key)) ?? [key];
      for (const k of group) delete copy[k];
      const result = v.safeParse(schema, copy);
      expect(result.issues?.[0]?.message).toBeUndefined();
    });
  }

  it('rejects an unknown extra field', () => {
    const copy = { ...(example as Record<string, unknown>), unexpected_field: 1 };
    expect(v.safeParse(schema, copy).success).toBe(false);
  });

  it('rejects a non-object', () => {
    for (const value of [null, [], 'x', 1]) expect(v.safeParse(schema, value).success).toBe(false);
  });
});

describe('the valid-example table', () => {
  const exported = Object.entries(schemas).filter(
    ([name, value]) =>
      name.endsWith('Schema') &&
      typeof value === 'object' &&
      value !== null &&
      (value as { kind?: unknown }).kind === 'schema',
  );

  it('has an example for every exported *Schema of schemas/index.ts', () => {
    const covered = new Set(EXAMPLES.map((row) => row.name));
    const uncovered = exported.map(([name]) => name).filter((name) => !covered.has(name));
    expect(uncovered).toEqual([]);
    expect(exported.length).toBeGreaterThan(80);
  });

  it('names each schema by its export name', () => {
    const byName = new Map<string, unknown>(exported);
    for (const row of EXAMPLES) expect(byName.get(row.name), row.name).toBe(row.schema);
  });

  it('tests every variant of every tagged union', () => {
    for (const [name, value] of exported) {
      const schema = value as ObjectLike;
      if (schema.type !== 'variant') continue;
      const rows = EXAMPLES.filter((row) => row.name === name);
      const tags = new Set(
        rows.map((row) => (row.example as Record<string, unknown>)[schema.key ?? '']),
      );
      expect(tags.size, name).toBe(schema.options?.length);
    }
  });
});
