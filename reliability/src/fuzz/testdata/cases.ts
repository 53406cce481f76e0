/**
 * Fuzz inputs for T5, per route: a route-independent corpus of malformed
 * JSON (JSONTestSuite-style), structural mutations of a near-valid body
 * synthesized from the route's OpenAPI request schema, and bodies generated
 * by fast-check from a fixed seed (so a failure replays). Nothing here is
 * meant to be accepted: `isPossiblyValid` lets the suite drop the rare
 * generated body that the contracts' schemas would accept.
 */
import fc from 'fast-check';
import type { JsonSchema } from './wire.js';

/** One fuzz body and what it is. */
export interface BodyCase {
  /** The family and variant, for reports (`corpus: trailing comma`). */
  name: string;
  bytes: Uint8Array;
}

const encoder = new TextEncoder();
const utf8 = (text: string): Uint8Array => encoder.encode(text);
const bytes = (...values: number[]): Uint8Array => Uint8Array.from(values);
const join = (...parts: (string | Uint8Array)[]): Uint8Array => {
  const chunks = parts.map((part) => (typeof part === 'string' ? utf8(part) : part));
  const out = new Uint8Array(chunks.reduce((sum, chunk) => sum + chunk.byteLength, 0));
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.byteLength;
  }
  return out;
};

/**
 * Malformed documents whatever the route: each breaks a rule of DESIGN §1.4 /
 * §4.1 (syntax, empty, BOM, UTF-8, surrogates, numbers, depth, duplicate and
 * reserved keys, non-object top levels). Written as rules, not as a copied
 * list: the contracts' own 173-case corpus lives in a test file of
 * `@ledgence/contracts` and the HTTP one in `@ledgence/http`, neither
 * importable from here (see the README).
 */
export function malformedCorpus(): BodyCase[] {
  const out: BodyCase[] = [];
  const add = (name: string, body: string | Uint8Array) =>
    out.push({ name: `corpus: ${name}`, bytes: typeof body === 'string' ? utf8(body) : body });

  // Syntax (JSONTestSuite n_* families).
  for (const text of [
    '{',
    '}',
    '{"a"',
    '{"a":',
    '{"a":1',
    '{"a":1,}',
    '{,"a":1}',
    '{"a" 1}',
    '{"a"::1}',
    '{a:1}',
    "{'a':1}",
    '{"a":\'b\'}',
    '{"a":1}}',
    '{"a":1} x',
    '{"a":1}{"b":2}',
    '[1,]',
    '[,1]',
    '[1 2]',
    '[',
    ']',
    '{"a":[}',
    '{"a":{]}',
    '{"a":tru}',
    '{"a":nul}',
    '{"a":True}',
    '{"a":undefined}',
    '{"a":NaN}',
    '{"a":Infinity}',
    '{"a":-Infinity}',
    '{"a":01}',
    '{"a":-01}',
    '{"a":1.}',
    '{"a":.5}',
    '{"a":1e}',
    '{"a":1e+}',
    '{"a":+1}',
    '{"a":0x10}',
    '{"a":1_000}',
    '{"a":"\\x41"}',
    '{"a":"\\u12"}',
    '{"a":"\\uZZZZ"}',
    '{"a":"\\"}',
    '{"a":"tab\there"}',
    '{"a":"new\nline"}',
    '{"a":"nul\u0000"}',
    '{"a":"unterminated}',
    '{"a":1 /* comment */}',
    '// comment\n{}',
    '{"a":1}\u0000',
    '\u00a0{}',
  ]) {
    add(`syntax ${JSON.stringify(text).slice(0, 40)}`, text);
  }
  // Empty, whitespace, byte order marks.
  add('empty object key only', '{""}');
  add('whitespace only', ' \t\r\n ');
  add('BOM before an object', '\ufeff{}');
  add('BOM bytes alone', bytes(0xef, 0xbb, 0xbf));
  // Invalid UTF-8 and lone surrogates.
  for (const [name, raw] of [
    ['byte 0xff', [0xff]],
    ['byte 0xfe in a string', [0x22, 0xfe, 0x22]],
    ['overlong slash', [0x22, 0xc0, 0xaf, 0x22]],
    ['overlong three-byte', [0x22, 0xe0, 0x80, 0xaf, 0x22]],
    ['encoded surrogate d800', [0x22, 0xed, 0xa0, 0x80, 0x22]],
    ['truncated two-byte', [0x22, 0xc3, 0x22]],
    ['truncated four-byte', [0x22, 0xf0, 0x9f, 0x98, 0x22]],
    ['lone continuation', [0x22, 0x80, 0x22]],
    ['beyond U+10FFFF', [0x22, 0xf4, 0x90, 0x80, 0x80, 0x22]],
    ['5-byte form', [0x22, 0xf8, 0x88, 0x80, 0x80, 0x80, 0x22]],
  ] as const) {
    add(`utf-8 ${name} as a key`, join('{', bytes(...raw), ':1}'));
    add(`utf-8 ${name} as a value`, join('{"a":', bytes(...raw), '}'));
  }
  for (const surrogate of ['\\ud800', '\\udfff', '\\ud800\\u0041', '\\udc00\\ud800']) {
    add(`lone surrogate ${surrogate}`, `{"a":"${surrogate}"}`);
    add(`lone surrogate key ${surrogate}`, `{"${surrogate}":1}`);
  }
  // Numbers beyond ±(2^53−1), integer or not.
  for (const number of [
    '9007199254740992',
    '-9007199254740992',
    '123456789012345678901234567890',
    '1e16',
    '1e300',
    '1e400',
    '-1e400',
    '1.7976931348623157e309',
    '9007199254740991.5e1',
  ]) {
    add(`number ${number}`, `{"a":${number}}`);
  }
  // Depth.
  add('deep arrays 100k', `${'['.repeat(100_000)}${']'.repeat(100_000)}`);
  add('deep objects 5k', `${'{"a":'.repeat(5_000)}1${'}'.repeat(5_000)}`);
  add('deep arrays 65', `{"a":${'['.repeat(65)}${']'.repeat(65)}}`);
  add('unclosed deep arrays', '['.repeat(50_000));
  // Duplicate and reserved keys.
  add('duplicate key', '{"a":1,"a":1}');
  add('duplicate key, other value', '{"a":1,"a":2}');
  add('duplicate nested key', '{"a":{"b":1,"b":1}}');
  add('__proto__ key', '{"__proto__":{"polluted":true}}');
  add('constructor.prototype key', '{"constructor":{"prototype":{"polluted":true}}}');
  // Top levels that are not objects.
  for (const text of ['null', 'true', '0', '-1', '"text"', '[]', '[{}]', '""']) {
    add(`top level ${text}`, text);
  }
  return out;
}

/** Resolves `$ref`s against `components.schemas`. */
function resolve(schema: JsonSchema, schemas: Record<string, JsonSchema>): JsonSchema {
  let current = schema;
  for (let hops = 0; typeof current.$ref === 'string' && hops < 16; hops++) {
    const name = (current.$ref as string).split('/').pop() ?? '';
    current = schemas[name] ?? {};
  }
  return current;
}

/**
 * Values the synthesized body gives fields by name, so that near-valid bodies
 * name the fuzzing key's own scope and pass the checks before decoding ends.
 */
export type KnownValues = Readonly<Record<string, unknown>>;

/**
 * A near-valid instance of `schema`: required properties only, the first
 * branch of a union, the smallest allowed number, `known` values by field
 * name. It need not be valid — mutations start from it, and the suite filters
 * anything valid out before sending.
 */
export function synthesize(
  schema: JsonSchema,
  schemas: Record<string, JsonSchema>,
  known: KnownValues,
  field = '',
  depth = 0,
): unknown {
  const s = resolve(schema, schemas);
  if (depth > 12) return null;
  if (field in known) return known[field];
  if ('const' in s) return s.const;
  if (Array.isArray(s.enum)) return s.enum[0];
  for (const union of ['oneOf', 'anyOf', 'allOf'] as const) {
    const branches = s[union];
    if (Array.isArray(branches) && branches.length > 0) {
      const usable = (branches as JsonSchema[]).find((b) => resolve(b, schemas).type !== 'null');
      return synthesize(usable ?? (branches[0] as JsonSchema), schemas, known, field, depth + 1);
    }
  }
  const type = Array.isArray(s.type) ? (s.type as string[]).find((t) => t !== 'null') : s.type;
  switch (type) {
    case 'object': {
      const properties = (s.properties ?? {}) as Record<string, JsonSchema>;
      const required = new Set((s.required ?? []) as string[]);
      const out: Record<string, unknown> = {};
      for (const [name, property] of Object.entries(properties)) {
        if (required.has(name)) out[name] = synthesize(property, schemas, known, name, depth + 1);
      }
      return out;
    }
    case 'array': {
      const items = (s.items ?? {}) as JsonSchema;
      const min = typeof s.minItems === 'number' ? s.minItems : 1;
      return Array.from({ length: Math.max(1, Math.min(min, 2)) }, () =>
        synthesize(items, schemas, known, field, depth + 1),
      );
    }
    case 'integer':
    case 'number':
      return typeof s.minimum === 'number' ? s.minimum : 1;
    case 'boolean':
      return false;
    case 'string':
      return 'fuzz';
    default:
      return { any: 'json' };
  }
}

/** A JSON path to one value inside a body. */
type Path = (string | number)[];

/** Every path of `value` (objects and arrays included), depth first. */
function paths(value: unknown, at: Path = [], out: Path[] = []): Path[] {
  out.push(at);
  if (Array.isArray(value)) {
    for (const [i, item] of value.entries()) paths(item, [...at, i], out);
  } else if (typeof value === 'object' && value !== null) {
    for (const [key, item] of Object.entries(value)) paths(item, [...at, key], out);
  }
  return out;
}

/**
 * `value` serialized with the value at `path` replaced by the raw JSON text
 * `raw` (so non-JSON numbers and invalid escapes can be placed anywhere).
 */
function replaceRaw(value: unknown, path: Path, raw: string): string {
  if (path.length === 0) return raw;
  const [head, ...rest] = path;
  if (Array.isArray(value)) {
    return `[${value.map((item, i) => (i === head ? replaceRaw(item, rest, raw) : JSON.stringify(item))).join(',')}]`;
  }
  const record = value as Record<string, unknown>;
  return `{${Object.entries(record)
    .map(
      ([key, item]) =>
        `${JSON.stringify(key)}:${key === head ? replaceRaw(item, rest, raw) : JSON.stringify(item)}`,
    )
    .join(',')}}`;
}

/** `value` serialized with `members` (raw `"key":value` text) added to the object at `path`. */
function addMembers(value: unknown, path: Path, members: string): string {
  const target = path.reduce<unknown>(
    (node, key) => (node as Record<string | number, unknown>)[key],
    value,
  );
  const existing = Object.entries(target as Record<string, unknown>).map(
    ([key, item]) => `${JSON.stringify(key)}:${JSON.stringify(item)}`,
  );
  return replaceRaw(value, path, `{${[members, ...existing].join(',')}}`);
}

/** `value` without the member at `path`. */
function without(value: unknown, path: Path): unknown {
  const copy = structuredClone(value);
  const parent = path
    .slice(0, -1)
    .reduce<unknown>((node, key) => (node as Record<string | number, unknown>)[key], copy);
  const last = path[path.length - 1];
  if (Array.isArray(parent)) parent.splice(last as number, 1);
  else delete (parent as Record<string, unknown>)[last as string];
  return copy;
}

// Values a field never accepts: types, ranges, text rules (DESIGN §3, §4.1).
const BAD_VALUES = [
  '9007199254740992',
  '1e400',
  '-1',
  '1.5',
  'true',
  'null',
  '[]',
  '{}',
  '""',
  '" padded "',
  '"\\ud800"',
  '"ctl\\u0007"',
  JSON.stringify('x'.repeat(300)),
  JSON.stringify('é'.repeat(200)),
];

/**
 * Structural mutations of `skeleton`: every value replaced by each bad value,
 * every required member removed, and every object given an unknown member, a
 * duplicate member (same and other value — scope fields included), and
 * `__proto__` / `constructor` members; plus the skeleton cut short.
 */
export function mutations(skeleton: unknown): BodyCase[] {
  const out: BodyCase[] = [];
  const add = (name: string, text: string) =>
    out.push({ name: `mutation: ${name}`, bytes: utf8(text) });
  const text = JSON.stringify(skeleton);
  for (const path of paths(skeleton)) {
    const where = `$${path.map((key) => (typeof key === 'number' ? `[${key}]` : `.${key}`)).join('')}`;
    const target = path.reduce<unknown>(
      (node, key) => (node as Record<string | number, unknown>)[key],
      skeleton,
    );
    if (path.length > 0) {
      for (const bad of BAD_VALUES)
        add(`${where} = ${bad.slice(0, 20)}`, replaceRaw(skeleton, path, bad));
      add(`${where} removed`, JSON.stringify(without(skeleton, path)));
    }
    if (typeof target === 'object' && target !== null && !Array.isArray(target)) {
      add(`${where} unknown member`, addMembers(skeleton, path, '"zz_unknown":1'));
      add(`${where} __proto__`, addMembers(skeleton, path, '"__proto__":{"polluted":true}'));
      add(`${where} constructor`, addMembers(skeleton, path, '"constructor":{"prototype":{}}'));
      for (const [key, item] of Object.entries(target)) {
        const same = `${JSON.stringify(key)}:${JSON.stringify(item)}`;
        add(`${where}.${key} duplicated`, addMembers(skeleton, path, same));
        add(
          `${where}.${key} duplicated, other value`,
          addMembers(skeleton, path, `${JSON.stringify(key)}:"other"`),
        );
      }
    }
  }
  for (const cut of [1, 2, 0.25, 0.5, 0.75]) {
    const at = cut < 1 ? Math.floor(text.length * cut) : text.length - cut;
    add(`cut at ${at} of ${text.length}`, text.slice(0, Math.max(1, at)));
  }
  return out;
}

/**
 * Bodies generated by fast-check from `seed`: arbitrary JSON documents,
 * the skeleton with one value replaced by arbitrary JSON, the skeleton with
 * a random member added, the skeleton's text with bytes flipped, inserted or
 * deleted, and random bytes.
 */
export function generated(skeleton: unknown, seed: number, perFamily: number): BodyCase[] {
  const all = paths(skeleton).filter((path) => path.length > 0);
  const objects = paths(skeleton).filter((path) => {
    const target = path.reduce<unknown>(
      (node, key) => (node as Record<string | number, unknown>)[key],
      skeleton,
    );
    return typeof target === 'object' && target !== null && !Array.isArray(target);
  });
  const text = utf8(JSON.stringify(skeleton));
  const sample = <T>(arb: fc.Arbitrary<T>, offset: number): T[] =>
    fc.sample(arb, { seed: seed + offset, numRuns: perFamily });
  const out: BodyCase[] = [];
  for (const value of sample(fc.jsonValue({ maxDepth: 4 }), 1)) {
    out.push({ name: 'generated: json value', bytes: utf8(JSON.stringify(value)) });
  }
  if (all.length > 0) {
    const replaced = fc.tuple(fc.constantFrom(...all), fc.jsonValue({ maxDepth: 3 }));
    for (const [path, value] of sample(replaced, 2)) {
      out.push({
        name: 'generated: value replaced',
        bytes: utf8(replaceRaw(skeleton, path, JSON.stringify(value) ?? 'null')),
      });
    }
  }
  if (objects.length > 0) {
    const added = fc.tuple(
      fc.constantFrom(...objects),
      fc.string({ maxLength: 12 }),
      fc.jsonValue({ maxDepth: 2 }),
    );
    for (const [path, key, value] of sample(added, 3)) {
      const member = `${JSON.stringify(key)}:${JSON.stringify(value) ?? 'null'}`;
      out.push({
        name: 'generated: member added',
        bytes: utf8(addMembers(skeleton, path, member)),
      });
    }
  }
  const edit = fc.tuple(
    fc.constantFrom('flip', 'insert', 'delete'),
    fc.nat({ max: Math.max(0, text.byteLength - 1) }),
    fc.integer({ min: 0, max: 255 }),
  );
  for (const [kind, at, byte] of sample(edit, 4)) {
    const before = text.subarray(0, at);
    const after = text.subarray(kind === 'insert' ? at : at + 1);
    const middle = kind === 'delete' ? new Uint8Array(0) : bytes(byte);
    out.push({ name: `generated: byte ${kind}`, bytes: join(before, middle, after) });
  }
  for (const random of sample(fc.uint8Array({ minLength: 1, maxLength: 64 }), 5)) {
    out.push({ name: 'generated: random bytes', bytes: random });
  }
  return out;
}
