/**
 * The compiled schemas agree with valibot in both directions: a value is accepted by the
 * compiled function exactly when valibot accepts it, and then with valibot's output — equal
 * deeply, in key order, with the same keys holding `undefined`. Checked on every exported
 * schema's examples and rejections, on thousands of mutations of them, and on synthetic
 * schemas for the compiler's branches the contracts do not use yet.
 */
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual } from 'node:util';
import fc from 'fast-check';
import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import { compiledOnReuse, compileSchema, REJECTED } from './compile.js';
import { parseWith } from './decode.js';
import { EXAMPLES } from './schemas/testdata/examples.js';

/** A value with object key order made visible: objects become `[key, value]` lists. */
function ordered(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(ordered);
  if (typeof value === 'object' && value !== null) {
    return { keys: Object.entries(value).map(([key, item]) => [key, ordered(item)]) };
  }
  return value;
}

type Verdict = 'accepted' | 'rejected';

/** Asserts the compiled schema answers `value` as valibot does; returns that answer. */
function expectAgreement(schema: v.GenericSchema, value: unknown): Verdict {
  const compiled = compileSchema(schema);
  if (compiled === undefined) throw new Error(`not compiled: ${schema.type}`);
  const actual = compiled(value);
  const expected = v.safeParse(schema, value, { abortEarly: true });
  if (!expected.success) {
    expect(actual, 'valibot rejects this value').toBe(REJECTED);
    return 'rejected';
  }
  expect(actual, 'valibot accepts this value').not.toBe(REJECTED);
  // isDeepStrictEqual tells -0 from 0 and an absent key from one holding undefined.
  expect(isDeepStrictEqual(ordered(actual), ordered(expected.output))).toBe(true);
  expect(actual === value).toBe(expected.output === value);
  return 'accepted';
}

// ---- Mutations of the examples ------------------------------------------------------------

/** Every value found anywhere in the examples, for swapping one field's value with another's. */
function harvest(value: unknown, into: unknown[]): void {
  into.push(value);
  if (typeof value === 'object' && value !== null) {
    for (const item of Object.values(value)) harvest(item, into);
  }
}

const POOL: unknown[] = [
  undefined,
  null,
  true,
  false,
  0,
  -0,
  1,
  -1,
  1.5,
  Number.NaN,
  Number.POSITIVE_INFINITY,
  2 ** 53,
  '',
  ' ',
  'x',
  ' x',
  'a\nb',
  '\u0000',
  '\ud800',
  'x'.repeat(300),
  [],
  {},
  [1],
  { x: 1 },
];
for (const row of EXAMPLES) harvest(row.example, POOL);
const KEYS = [
  ...new Set(
    POOL.flatMap((value) => (typeof value === 'object' && value ? Object.keys(value) : [])),
  ),
  'extra',
  '__proto__',
  'constructor',
];

type Path = readonly (string | number)[];

function paths(value: unknown, prefix: Path = [], into: Path[] = []): Path[] {
  into.push(prefix);
  if (typeof value === 'object' && value !== null) {
    for (const [key, item] of Object.entries(value)) {
      paths(item, [...prefix, Array.isArray(value) ? Number(key) : key], into);
    }
  }
  return into;
}

/** A mutation: where (a fraction picking one of the value's paths), what, and with what. */
const mutation = fc.record({
  at: fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
  op: fc.constantFrom('replace', 'replace', 'delete', 'add', 'undefined'),
  with: fc.nat(POOL.length - 1),
  key: fc.nat(KEYS.length - 1),
});

type Mutation = typeof mutation extends fc.Arbitrary<infer M> ? M : never;

function mutated(example: unknown, mutations: readonly Mutation[]): unknown {
  let value = structuredClone(example);
  for (const m of mutations) {
    const all = paths(value);
    const path = all[Math.floor(m.at * all.length)] as Path;
    const replacement = structuredClone(POOL[m.with]);
    if (path.length === 0) {
      if (m.op === 'replace') value = replacement;
      else if (m.op === 'undefined') value = undefined;
      continue;
    }
    type Container = Record<string | number, unknown> & unknown[];
    const parent = path
      .slice(0, -1)
      .reduce((node, key) => (node as Container)[key], value) as Container;
    const last = path[path.length - 1] as string | number;
    if (m.op === 'replace') parent[last] = replacement;
    else if (m.op === 'undefined') parent[last] = undefined;
    else if (m.op === 'delete') {
      if (Array.isArray(parent)) parent.splice(Number(last), 1);
      else delete parent[last];
    } else if (typeof parent === 'object' && parent !== null && !Array.isArray(parent)) {
      // JSON.parse makes "__proto__" an own key; so does defineProperty here.
      Object.defineProperty(parent, KEYS[m.key] as string, {
        value: replacement,
        enumerable: true,
        configurable: true,
        writable: true,
      });
    } else if (Array.isArray(parent)) parent.push(replacement);
  }
  return value;
}

describe('compiled schemas agree with valibot on the contract schemas', () => {
  const counts: Record<Verdict, number> = { accepted: 0, rejected: 0 };

  it.each(EXAMPLES.map((row) => [row.variant ? `${row.name} (${row.variant})` : row.name, row]))(
    '%s: its example, its listed rejections and mutations of the example',
    (_name, row) => {
      expect(expectAgreement(row.schema, row.example)).toBe('accepted');
      for (const invalid of row.invalid ?? []) {
        expect(expectAgreement(row.schema, invalid)).toBe('rejected');
      }
      fc.assert(
        fc.property(fc.array(mutation, { minLength: 0, maxLength: 3 }), (mutations) => {
          counts[expectAgreement(row.schema, mutated(row.example, mutations))] += 1;
        }),
        { numRuns: 150 },
      );
    },
  );

  it('exercised both answers: mutations kept some examples valid and broke others', () => {
    // Runs after the table above (vitest runs a file's tests in order).
    expect(counts.accepted).toBeGreaterThan(3000);
    expect(counts.rejected).toBeGreaterThan(4000);
  });
});

// ---- Branches the contracts do not use (yet) ------------------------------------------

describe('compiled schemas agree with valibot on every compiled branch', () => {
  it('defaults: a wrapper default (value or function), and an object key missing with one', () => {
    const calls: unknown[][] = [];
    const schema = v.strictObject({
      a: v.optional(v.string(), 'fallback'),
      b: v.nullish(v.number(), (...args: unknown[]) => {
        calls.push(args);
        return 7;
      }),
      c: v.nullable(v.boolean(), false),
      d: v.optional(v.nullable(v.string()), null),
    });
    for (const value of [
      { c: null },
      { a: undefined, b: null, c: null },
      { a: 'x', b: 1, c: true, d: 'y' },
    ]) {
      expect(expectAgreement(schema, value)).toBe('accepted');
    }
    // `nullable` is not optional: its key must be present.
    expect(expectAgreement(schema, {})).toBe('rejected');
    expect(expectAgreement(schema, { c: 'no' })).toBe('rejected');
    // valibot calls a missing key's default without arguments, a wrapper's with its dataset.
    expect(calls.some((args) => args.length === 2 && args[0] === undefined)).toBe(true);
    expect(calls.some((args) => typeof args[0] === 'object' && args[0] !== null)).toBe(true);
  });

  it('fallbacks: stored unchecked for a missing key', () => {
    const schema = v.strictObject({ a: v.fallback(v.string(), 'fb') });
    expect(expectAgreement(schema, {})).toBe('accepted');
    expect(expectAgreement(schema, { a: 'x' })).toBe('accepted');
  });

  it('primitives: strings, numbers (NaN is not one), booleans, unknown, picklists', () => {
    const values = [undefined, null, 0, -0, Number.NaN, 1.5, '', 'a', true, false, [], {}, 1n];
    for (const schema of [
      v.string(),
      v.number(),
      v.boolean(),
      v.unknown(),
      v.picklist(['a', 0, 1n]),
      v.nullish(v.number()),
      v.optional(v.string()),
    ]) {
      for (const value of values) expectAgreement(schema, value);
    }
  });

  it('literals: NaN, -0 and a non-JSON literal compare by SameValueZero', () => {
    for (const [literal, values] of [
      [Number.NaN, [Number.NaN, 0, 'NaN']],
      [0, [-0, 0, '0']],
      [10n, [10n, 10, '10']],
      [Number.POSITIVE_INFINITY, [Number.POSITIVE_INFINITY, Number.MAX_VALUE]],
    ] as const) {
      for (const value of values) expectAgreement(v.literal(literal), value);
    }
  });

  it('regex: a schema holding a stateful (global or sticky) pattern is not compiled', () => {
    // Two runs of one value (compiled, then valibot's explanation) would test from two places.
    expect(compileSchema(v.pipe(v.string(), v.regex(/a/g)))).toBeUndefined();
    expect(compileSchema(v.strictObject({ a: v.pipe(v.string(), v.regex(/a/y)) }))).toBeUndefined();
    for (const value of ['a', 'b', 1]) expectAgreement(v.pipe(v.string(), v.regex(/a/)), value);
  });

  it('variants: nested variants, two options sharing a tag, non-literal tags', () => {
    const nested = v.variant('kind', [
      v.strictObject({ kind: v.literal('a'), x: v.number() }),
      v.variant('sub', [
        v.strictObject({ kind: v.literal('b'), sub: v.literal(1), y: v.string() }),
        v.strictObject({ kind: v.literal('b'), sub: v.picklist([2, 3]), z: v.boolean() }),
      ]),
    ]);
    for (const value of [
      { kind: 'a', x: 1 },
      { kind: 'b', sub: 1, y: 's' },
      { kind: 'b', sub: 3, z: true },
      { kind: 'b', sub: 4 },
      { kind: 'c' },
      { kind: 'a', x: 'no' },
      [],
      null,
    ]) {
      expectAgreement(nested, value);
    }
    // The first option matching `t: 'same'` rejects this value and the second accepts it.
    const shared = v.variant('t', [
      v.strictObject({ t: v.literal('same'), a: v.string() }),
      v.strictObject({ t: v.literal('same'), b: v.string() }),
    ]);
    expect(expectAgreement(shared, { t: 'same', b: 'x' })).toBe('accepted');
    expect(expectAgreement(shared, { t: 'same', a: 'x' })).toBe('accepted');
    expect(expectAgreement(shared, { t: 'same', c: 'x' })).toBe('rejected');
    const optionalTag = v.variant('t', [
      v.strictObject({ t: v.optional(v.literal('x')), a: v.string() }),
      v.strictObject({ t: v.literal('y') }),
    ]);
    for (const value of [{ a: 's' }, { t: 'y' }, {}, { t: 'x', a: 's' }]) {
      expectAgreement(optionalTag, value);
    }
    const stringTag = v.variant('t', [v.strictObject({ t: v.pipe(v.string(), v.minLength(2)) })]);
    for (const value of [{ t: 'ab' }, { t: 'a' }]) expectAgreement(stringTag, value);
  });

  it('unions: the first option that accepts gives the output', () => {
    const schema = v.union([
      v.pipe(
        v.string(),
        v.transform((s) => s.length),
      ),
      v.pipe(
        v.string(),
        v.transform((s) => s.toUpperCase()),
      ),
      v.number(),
    ]);
    for (const value of ['abc', 3, true]) expectAgreement(schema, value);
  });

  it('objects: inherited enumerable keys, arrays as objects, "__proto__" entries', () => {
    const allOptional = v.strictObject({ a: v.optional(v.string()) });
    const inherited = Object.create({ extra: 1 }) as Record<string, unknown>;
    inherited.a = 'x';
    for (const value of [inherited, [], [1], { a: 'x' }]) expectAgreement(allOptional, value);
    const empty = v.strictObject({});
    for (const value of [{}, { a: 1 }, [], 'x']) expectAgreement(empty, value);
    const proto = v.strictObject({ ['__proto__']: v.optional(v.string()) });
    for (const value of [{}, JSON.parse('{"__proto__": "x"}'), JSON.parse('{"__proto__": 1}')]) {
      expectAgreement(proto, value);
    }
  });

  it('kinds not compiled here (record, tuple, loose object, lazy) run through valibot', () => {
    const schema = v.strictObject({
      r: v.record(v.string(), v.number()),
      t: v.tuple([v.string(), v.number()]),
      l: v.looseObject({ a: v.string() }),
      z: v.lazy(() => v.string()),
    });
    const good = { r: { a: 1 }, t: ['x', 1], l: { a: 'x', b: 2 }, z: 's' };
    expect(expectAgreement(schema, good)).toBe('accepted');
    for (const broken of [
      { ...good, r: { a: 'x' } },
      { ...good, t: [1, 'x'] },
      { ...good, l: {} },
      { ...good, z: 1 },
    ]) {
      expect(expectAgreement(schema, broken)).toBe('rejected');
    }
  });

  it('checks run on their action, as valibot calls them', () => {
    const seen: unknown[] = [];
    const schema = v.pipe(
      v.custom(function (this: unknown, value) {
        seen.push(this);
        return typeof value === 'string';
      }),
      v.check(function (this: unknown) {
        seen.push(this);
        return true;
      }),
    );
    expect(expectAgreement(schema, 'x')).toBe('accepted');
    // Both runs (compiled, then valibot's) call each on its own node.
    const [custom, check] = schema.pipe;
    expect(seen).toEqual([custom, check, custom, check]);
    expect(seen[0]).toBe(custom);
    expect(seen[1]).toBe(check);
  });
});

describe('without code generation', () => {
  it('parseWith answers as before: valibot parses everything', () => {
    // Node's flag makes `new Function` throw EvalError, as a content security policy does.
    const script = fileURLToPath(new URL('./testdata/no-codegen.ts', import.meta.url));
    const output = execFileSync(
      process.execPath,
      ['--disallow-code-generation-from-strings', '--import', 'tsx', script],
      { encoding: 'utf8' },
    );
    expect(JSON.parse(output)).toEqual({
      compiled: false,
      accepted: { queue: 'email', consumer_id: 3 },
      rejected: '$.queue must not start or end with whitespace',
    });
  });

  it('parseWith compiles a schema on its second use, not one made for a single parse', () => {
    const schema = v.strictObject({ a: v.string() });
    expect(compiledOnReuse(schema)).toBeUndefined();
    const compiled = compiledOnReuse(schema);
    expect(compiled).toBeTypeOf('function');
    expect(compiledOnReuse(schema)).toBe(compiled);
    expect(compileSchema(schema)).toBe(compiled);
    // A schema compiled first is reused at once.
    const other = v.strictObject({ b: v.number() });
    const direct = compileSchema(other);
    expect(compiledOnReuse(other)).toBe(direct);
    // Whichever path answers, parseWith's answers are the same.
    const fresh = v.strictObject({ a: v.string() });
    for (let use = 0; use < 3; use++) {
      expect(parseWith(fresh, { a: 'x' })).toEqual({ a: 'x' });
      expect(() => parseWith(fresh, { a: 1 })).toThrow('$.a must be a string');
    }
  });
});
